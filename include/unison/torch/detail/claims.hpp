#pragma once

/// \file
/// One engine per parameter. Each wrapper claims every parameter of the module it
/// drives when it is constructed, before anything moves (every rank learns whether
/// any rank's claim failed, so all refuse together: torch/detail/prologue.hpp),
/// and gives them back when it is destroyed. Two engines on one parameter would
/// both point its gradient at memory of their own (DDP's buckets, the sharding
/// engine's flat buffers) and reduce it twice or write freed memory.

#include "unison/core/error.hpp"

#include <c10/core/TensorImpl.h>
#include <torch/nn/module.h>

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace unison::torch::detail {

/// Which engine holds each parameter, process-wide (the thread backend's ranks
/// each claim their own module's parameters).
class parameter_claims {
public:
    static parameter_claims& instance() {
        static parameter_claims c;
        return c;
    }

    /// Claims every parameter of `m` for an engine called `engine` ("torch::ddp"),
    /// all or none: returns "" and fills `claimed`, or says which parameter another
    /// engine holds already.
    std::string claim(const ::torch::nn::Module& m, const char* engine,
                      std::vector<const c10::TensorImpl*>& claimed) {
        std::vector<const c10::TensorImpl*> mine;
        std::unordered_set<const c10::TensorImpl*> seen;
        const std::lock_guard<std::mutex> lock(mutex_);
        for (const auto& item : m.named_parameters(/*recurse=*/true)) {
            const c10::TensorImpl* p = item.value().unsafeGetTensorImpl();
            if (!seen.insert(p).second) {
                continue; // the same tensor under two names: the engine says what it makes of it
            }
            if (const auto it = owners_.find(p); it != owners_.end()) {
                return "parameter '" + item.key() + "' is driven by " +
                       (std::string(it->second) == engine ? "another " : "a ") + it->second +
                       " already: one engine per module (a second one would take its gradients "
                       "too); destroy the other engine first, or give this one another module";
            }
            mine.push_back(p);
        }
        for (const c10::TensorImpl* p : mine) {
            owners_.emplace(p, engine);
        }
        claimed = std::move(mine);
        return {};
    }

    void release(const std::vector<const c10::TensorImpl*>& claimed) noexcept {
        const std::lock_guard<std::mutex> lock(mutex_);
        for (const c10::TensorImpl* p : claimed) {
            owners_.erase(p);
        }
    }

private:
    std::mutex mutex_;
    std::unordered_map<const c10::TensorImpl*, const char*> owners_;
};

/// An engine's claim on its module's parameters, held for the engine's lifetime.
/// The module must outlive it (the engines keep their module alive).
class module_claim {
public:
    /// Claims every parameter of `m` for an engine called `engine`, or remembers
    /// why it cannot (see check()). Claims nothing for a null module (the engine
    /// refuses it).
    module_claim(const std::shared_ptr<::torch::nn::Module>& m, const char* engine)
        : engine_(engine) {
        if (m) {
            why_ = parameter_claims::instance().claim(*m, engine, claimed_);
        }
    }
    module_claim(const module_claim&) = delete;
    module_claim& operator=(const module_claim&) = delete;
    ~module_claim() { parameter_claims::instance().release(claimed_); }

    /// Throws argument_error (from rank `rank`) when the claim failed: one of this
    /// rank's local checks (torch/detail/prologue.hpp), which every rank hears of
    /// before any collective moves data.
    void check(int rank) const {
        if (!why_.empty()) {
            throw argument_error(rank, engine_, why_);
        }
    }

private:
    const char* engine_;
    std::string why_;
    std::vector<const c10::TensorImpl*> claimed_;
};

} // namespace unison::torch::detail
