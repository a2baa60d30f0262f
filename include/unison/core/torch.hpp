#pragma once

/// \file
/// Optional adapter: LibTorch tensors as unison tensors. Link `unison::torch`
/// (which brings LibTorch) and include this header; then a `torch::Tensor` goes
/// straight into the collectives and the DDP reducer:
///
///     torch::Tensor grad = torch::randn({256, 128});
///     unison::all_reduce(comm, grad, unison::reduce_op::avg);
///
/// A tensor is its `numel()` elements from `data_ptr()` on, so it must be strided
/// and contiguous (`t.is_contiguous()`); a contiguous view into a larger tensor
/// (`t.narrow(0, ...)`, `t[i]`) is fine and the collective writes through it. Using a
/// transposed, sliced-with-step or otherwise non-contiguous tensor, one of a dtype
/// unison has no counterpart for (bool, int16, complex, ...) or an undefined tensor
/// throws `unison::argument_error` naming the problem, before any data moved: call
/// `.contiguous()` (and copy the result back) or `.to(...)` first.
///
/// | torch dtype          | unison dtype |     | torch device | unison device       |
/// |----------------------|--------------|-----|--------------|---------------------|
/// | kDouble, kFloat      | f64, f32     |     | kCPU         | `device::host()`    |
/// | kHalf, kBFloat16     | f16, bf16    |     | kCUDA:i      | `device::cuda(i)`   |
/// | kLong, kInt          | i64, i32     |     |              |                     |
/// | kChar, kByte         | i8, u8       |     |              |                     |
/// | kUInt32, kUInt64     | u32, u64     |     |              |                     |
///
/// LibTorch has UInt32 and UInt64 from version 2.3 on (`UNISON_TORCH_HAS_UINT32_64()`);
/// before, no tensor has them and `torch_dtype` gives `Undefined` for u32 and u64.
///
/// Like every adapter, a `const torch::Tensor` is read-only to unison (an input),
/// a non-const one writable; `p.grad()` returns a const reference, so pass
/// `p.mutable_grad()` where unison writes gradients. Writes go through the raw data
/// pointer, which autograd does not see: do not modify a tensor saved for backward.
/// `nccl_communicator` reads and writes CUDA tensors on its own stream, so make that
/// stream wait for PyTorch's current one (or synchronize) before a collective.

#include "unison/core/error.hpp"
#include "unison/core/tensor.hpp"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Layout.h>
#include <c10/core/ScalarType.h>
#include <c10/util/StringUtil.h>
#include <torch/version.h>

#include <cstddef>
#include <optional>
#include <string>

/// 1 where LibTorch has the 32- and 64-bit unsigned scalar types (UInt32, UInt64:
/// LibTorch 2.3 and later), else 0.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define UNISON_TORCH_HAS_UINT32_64() 1
#else
#define UNISON_TORCH_HAS_UINT32_64() 0
#endif

namespace unison {

/// The unison dtype of torch scalar type `t`, or nothing when unison has none.
constexpr std::optional<dtype> dtype_from_torch(c10::ScalarType t) noexcept {
    switch (t) {
    case c10::ScalarType::Double:
        return dtype::f64;
    case c10::ScalarType::Float:
        return dtype::f32;
    case c10::ScalarType::Half:
        return dtype::f16;
    case c10::ScalarType::BFloat16:
        return dtype::bf16;
    case c10::ScalarType::Long:
        return dtype::i64;
    case c10::ScalarType::Int:
        return dtype::i32;
    case c10::ScalarType::Char:
        return dtype::i8;
    case c10::ScalarType::Byte:
        return dtype::u8;
#if UNISON_TORCH_HAS_UINT32_64()
    case c10::ScalarType::UInt32:
        return dtype::u32;
    case c10::ScalarType::UInt64:
        return dtype::u64;
#endif
    default:
        return std::nullopt;
    }
}

/// The torch scalar type of unison dtype `t` (for `torch::empty(..., torch_dtype(t))`);
/// `Undefined` for u32 and u64 where this LibTorch has no such scalar type.
constexpr c10::ScalarType torch_dtype(dtype t) noexcept {
    switch (t) {
    case dtype::f64:
        return c10::ScalarType::Double;
    case dtype::f32:
        return c10::ScalarType::Float;
    case dtype::f16:
        return c10::ScalarType::Half;
    case dtype::bf16:
        return c10::ScalarType::BFloat16;
    case dtype::i64:
        return c10::ScalarType::Long;
    case dtype::i32:
        return c10::ScalarType::Int;
    case dtype::i8:
        return c10::ScalarType::Char;
    case dtype::u8:
        return c10::ScalarType::Byte;
#if UNISON_TORCH_HAS_UINT32_64()
    case dtype::u32:
        return c10::ScalarType::UInt32;
    case dtype::u64:
        return c10::ScalarType::UInt64;
#else
    case dtype::u32:
    case dtype::u64:
        return c10::ScalarType::Undefined;
#endif
    }
    return c10::ScalarType::Undefined;
}

/// The torch device of unison device `d` (`kCPU` for host, `kCUDA:i` for `cuda(i)`).
inline c10::Device torch_device(device d) {
    return d.is_host() ? c10::Device(c10::DeviceType::CPU)
                       : c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(d.index));
}

namespace detail {

/// The torch scalar types unison moves, for error messages.
#if UNISON_TORCH_HAS_UINT32_64()
inline constexpr const char* torch_dtype_names =
    "Double, Float, Half, BFloat16, Long, Int, Char, Byte, UInt32 and UInt64";
#else
inline constexpr const char* torch_dtype_names =
    "Double, Float, Half, BFloat16, Long, Int, Char and Byte";
#endif

[[noreturn]] inline void torch_tensor_error(const std::string& detail) {
    throw argument_error(-1, "tensor_traits<torch::Tensor>", detail);
}

/// The unison dtype of `t`; throws for a dtype unison has no counterpart for.
inline dtype torch_tensor_dtype(const at::Tensor& t) {
    const std::optional<dtype> d = dtype_from_torch(t.scalar_type());
    if (!d) {
        torch_tensor_error(std::string("unsupported dtype ") + c10::toString(t.scalar_type()) +
                           "; unison moves " + torch_dtype_names +
                           " tensors (convert with .to(...) first)");
    }
    return *d;
}

/// The unison device of `t`; throws for a device other than CPU and CUDA.
inline device torch_tensor_device(const at::Tensor& t) {
    const c10::Device d = t.device();
    if (d.is_cpu()) {
        return device::host();
    }
    if (d.is_cuda()) {
        return device::cuda(d.has_index() ? static_cast<int>(d.index()) : 0);
    }
    torch_tensor_error("unsupported device " + d.str() + "; unison moves CPU and CUDA tensors");
}

/// Everything a collective needs of `t`, checked where the data pointer is taken
/// (every use of a tensor asks for it): defined, strided, contiguous, no lazy
/// negation, a supported dtype and device.
inline void check_torch_tensor(const at::Tensor& t) {
    if (!t.defined()) {
        torch_tensor_error("undefined tensor (a default-constructed torch::Tensor, or a "
                           "gradient before the first backward)");
    }
    if (t.layout() != c10::kStrided) {
        torch_tensor_error(std::string("tensor has layout ") + c10::str(t.layout()) +
                           "; unison moves dense (strided) tensors (call .to_dense() first)");
    }
    if (!t.is_contiguous()) {
        torch_tensor_error("non-contiguous tensor (sizes " + c10::str(t.sizes()) + ", strides " +
                           c10::str(t.strides()) +
                           "); collectives need contiguous memory: call .contiguous() and "
                           "copy the result back if it is an output");
    }
    if (t.is_neg()) {
        torch_tensor_error("tensor is a lazy negation view (is_neg()); call .resolve_neg() first");
    }
    (void)torch_tensor_dtype(t);
    (void)torch_tensor_device(t);
}

} // namespace detail

/// `torch::Tensor` (= `at::Tensor`): contiguous, strided CPU or CUDA tensors of the
/// dtypes in the table above. `data` checks the tensor and throws
/// `argument_error` naming what is wrong with it.
template <>
struct tensor_traits<at::Tensor> {
    static void* data(at::Tensor& t) {
        detail::check_torch_tensor(t);
        return t.data_ptr();
    }
    static const void* data(const at::Tensor& t) {
        detail::check_torch_tensor(t);
        return t.data_ptr();
    }
    static std::size_t size(const at::Tensor& t) {
        return t.defined() ? static_cast<std::size_t>(t.numel()) : 0;
    }
    static dtype type(const at::Tensor& t) {
        if (!t.defined()) {
            detail::torch_tensor_error("undefined tensor");
        }
        return detail::torch_tensor_dtype(t);
    }
    static device location(const at::Tensor& t) {
        if (!t.defined()) {
            detail::torch_tensor_error("undefined tensor");
        }
        return detail::torch_tensor_device(t);
    }
};

static_assert(writable_tensor<at::Tensor&> && writable_tensor<at::Tensor>);
static_assert(tensor<const at::Tensor&> && !writable_tensor<const at::Tensor&>);

} // namespace unison
