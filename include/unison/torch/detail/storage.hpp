#pragma once

/// \file
/// How `torch::fsdp` points a parameter at the engine's memory: the parameter's
/// storage is one that owns nothing, its data pointer moved to the engine's
/// gathered values (or to nothing when they are released), and the parameter's
/// TensorImpl made to show a tensor on it. Views taken in forward and saved for
/// backward share that storage, so they see a regather into new memory.

#include "unison/torch/detail/released.hpp"

#include <ATen/core/Tensor.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/Storage.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>

#include <cstddef>
#include <utility>

namespace unison::torch::detail {

/// Points storage `s` at `bytes` bytes from `p` (nothing: nullptr, 0) on its device.
inline void point(c10::Storage& s, void* p, std::size_t bytes) {
    c10::StorageImpl* impl = s.unsafeGetStorageImpl();
    impl->set_data_ptr_noswap(c10::DataPtr(p, s.device()));
    impl->set_nbytes(bytes);
}

/// A storage on device `d` that owns nothing; point() moves it.
inline c10::Storage unowned_storage(c10::Device d) {
    return c10::Storage(c10::Storage::use_byte_size_t(), std::size_t{0}, c10::DataPtr(nullptr, d),
                        nullptr, false);
}

/// A contiguous tensor of `shape` and `type` on storage `s`, dispatched as `s`'s
/// device (CPU or CUDA) or, with `released`, to the kernel that refuses released
/// parameters (torch/detail/released.hpp).
inline at::Tensor tensor_on(const c10::Storage& s, c10::IntArrayRef shape, caffe2::TypeMeta type,
                            bool released = false) {
    const c10::DispatchKey key = released               ? released_key
                                 : s.device().is_cuda() ? c10::DispatchKey::CUDA
                                                        : c10::DispatchKey::CPU;
    auto impl =
        c10::make_intrusive<c10::TensorImpl>(c10::Storage(s), c10::DispatchKeySet(key), type);
    impl->set_sizes_contiguous(shape);
    return at::Tensor(std::move(impl));
}

/// Makes parameter `param` show `t` (its shape, storage and dispatch keys) and keeps
/// everything autograd knows of it. Variable::set_data does the same but refuses a
/// change of dispatch backend, which releasing a parameter is.
inline void show_as(const at::Tensor& param, const at::Tensor& t) {
    param.unsafeGetTensorImpl()->shallow_copy_from(t.getIntrusivePtr());
}

} // namespace unison::torch::detail
