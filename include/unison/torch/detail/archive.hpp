#pragma once

/// \file
/// `torch::fsdp::save_full`'s writer: LibTorch's Module::save format, written from
/// full values that live outside the module.

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/serialize/output-archive.h>

#include <string>
#include <unordered_map>

namespace unison::torch::detail {

/// Module::save's format with `full` (full name -> host tensor) for the parameters
/// and host copies of the buffers, so that the file holds host tensors whatever
/// device the module is on: each module's own parameters and buffers, then each
/// serializable child as a nested archive.
inline void write_module(::torch::serialize::OutputArchive& archive, const ::torch::nn::Module& m,
                         const std::string& prefix,
                         const std::unordered_map<std::string, at::Tensor>& full) {
    for (const auto& item : m.named_parameters(/*recurse=*/false)) {
        archive.write(item.key(), full.at(prefix + item.key()));
    }
    for (const auto& item : m.named_buffers(/*recurse=*/false)) {
        archive.write(item.key(), item.value().detach().to(at::kCPU), /*is_buffer=*/true);
    }
    for (const auto& child : m.named_children()) {
        if (child.value()->is_serializable()) {
            ::torch::serialize::OutputArchive nested(archive.compilation_unit());
            write_module(nested, *child.value(), prefix + child.key() + ".", full);
            archive.write(child.key(), nested);
        }
    }
}

} // namespace unison::torch::detail
