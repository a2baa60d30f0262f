#pragma once

/// \file
/// A sharded parameter outside its unit: the engine has released its values, and
/// any computation on it must fail there, naming it, instead of computing on an
/// empty tensor (a weight penalty of 0) and failing later in backward with a shape
/// error that names nothing.
///
/// A released parameter keeps its shape, holds no memory (a null data pointer),
/// and its dispatch key is the private-use backend `PrivateUse3` (its device stays
/// the real one, so that its options and the engine's bookkeeping are unchanged).
/// It keeps its shape because LibTorch's composite kernels check shapes before
/// they reach a backend kernel: an empty tensor would fail there first, with a
/// shape error that names nothing. unison registers a boxed
/// fallback kernel for that key: every operator that reaches it (any computation;
/// views made of the parameter carry the key too) throws an argument_error naming
/// the parameter, its unit, the rank and the operator. Queries that do not
/// dispatch (sizes, numel, dtype, device, requires_grad) still answer. A program that
/// registers its own fallback for PrivateUse3 keeps it: the released parameters
/// are then plain empty tensors, as before.

#include "unison/core/error.hpp"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/StorageImpl.h>
#include <torch/library.h>

#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

namespace unison::torch::detail {

/// The dispatch key of released parameters.
inline constexpr c10::DispatchKey released_key = c10::DispatchKey::PrivateUse3;

/// What each released parameter is (by its storage, which its views share), and
/// the registration of the kernel that refuses their use.
class released_parameters {
public:
    struct entry {
        int rank = -1;
        std::string what; ///< "parameter 'blocks.0.fc1.weight' of unit #0 (ffn)"
    };

    static released_parameters& instance() {
        static released_parameters r;
        return r;
    }

    /// Whether uses of released parameters raise errors (the fallback is ours).
    bool enabled() const noexcept { return library_ != nullptr; }

    void add(const c10::StorageImpl* storage, entry e) {
        const std::lock_guard<std::mutex> lock(mutex_);
        entries_[storage] = std::move(e);
    }
    void remove(const c10::StorageImpl* storage) noexcept {
        const std::lock_guard<std::mutex> lock(mutex_);
        entries_.erase(storage);
    }
    std::optional<entry> find(const c10::StorageImpl* storage) {
        const std::lock_guard<std::mutex> lock(mutex_);
        const auto it = entries_.find(storage);
        return it == entries_.end() ? std::nullopt : std::optional<entry>(it->second);
    }

private:
    released_parameters() {
        try {
            auto library = std::make_unique<::torch::Library>(::torch::Library::IMPL, "_",
                                                              released_key, __FILE__, __LINE__);
            library->fallback(::torch::CppFunction::makeFromBoxedFunction<&refuse>());
            // copy_ has a CompositeExplicitAutograd kernel, which the dispatcher
            // prefers to a backend fallback, and which reads and writes the data
            // itself: clone(), to(), copy_ and torch::load would reach the null data
            // pointer. The key's own kernel for it comes first.
            auto aten = std::make_unique<::torch::Library>(::torch::Library::IMPL, "aten",
                                                           released_key, __FILE__, __LINE__);
            aten->impl("copy_", ::torch::CppFunction::makeFromBoxedFunction<&refuse>());
            aten_ = std::move(aten);
            library_ = std::move(library);
        } catch (const std::exception&) { // the program has a fallback of its own there
        }
    }

    /// The fallback: an operator reached a released parameter.
    static void refuse(const c10::OperatorHandle& op, c10::DispatchKeySet,
                       ::torch::jit::Stack* stack) {
        const std::string name = op.operator_name().name;
        std::optional<entry> found;
        const auto look = [&](const at::Tensor& t) {
            if (!found && t.defined() && t.key_set().has(released_key) && t.has_storage()) {
                found = instance().find(t.storage().unsafeGetStorageImpl());
            }
        };
        for (const c10::IValue& v : *stack) {
            if (v.isTensor()) {
                look(v.toTensor());
            } else if (v.isTensorList()) {
                for (const at::Tensor& t : v.toTensorVector()) {
                    look(t);
                }
            }
        }
        if (!found) {
            throw argument_error(-1, "torch::fsdp",
                                 name + " used a parameter that a torch::fsdp engine released "
                                        "(its values are sharded outside its unit)");
        }
        throw argument_error(found->rank, "torch::fsdp",
                             found->what + " was used by " + name +
                                 " outside its unit's forward and backward, where its values are "
                                 "sharded and released: use it only inside that unit (through "
                                 "unit_forward; a parameter two units share belongs in their "
                                 "common parent), or read its values with full_state_dict()");
    }

    std::mutex mutex_;
    std::unordered_map<const c10::StorageImpl*, entry> entries_;
    std::unique_ptr<::torch::Library> library_;
    std::unique_ptr<::torch::Library> aten_;
};

} // namespace unison::torch::detail
