#pragma once

/// \file
/// Gloo's rendezvous store over unison's `tcp_store`: the ranks that met through
/// torchrun's or Kubernetes' variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
/// exchange their Gloo addresses through it, so those variables are all a Gloo job
/// needs. Every key is put under a prefix that names the communicator, so several
/// communicators (a world and its splits) share one store.

#include "unison/core/error.hpp"
#include "unison/rendezvous/tcp_store.hpp"

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace unison::detail {

class gloo_store_adapter final : public ::gloo::rendezvous::Store {
public:
    gloo_store_adapter(std::shared_ptr<tcp_store> store, std::string prefix)
        : store_(std::move(store)), prefix_(std::move(prefix)) {}

    void set(const std::string& key, const std::vector<char>& data) override {
        store_->set(prefix_ + key, std::as_bytes(std::span(data.data(), data.size())));
    }

    /// Waits up to the store's timeout (tcp_store::get), then throws timeout_error.
    std::vector<char> get(const std::string& key) override {
        const std::vector<std::byte> v = store_->get(prefix_ + key);
        const auto* p = reinterpret_cast<const char*>(v.data());
        return std::vector<char>(p, p + v.size());
    }

    void wait(const std::vector<std::string>& keys) override {
        for (const std::string& k : keys) {
            (void)store_->get(prefix_ + k);
        }
    }
    /// Bounded by the store's own timeout, which the communicator sets from its
    /// comm_options: Gloo's shorter default (30 s) is not used.
    void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override {
        wait(keys);
    }

private:
    std::shared_ptr<tcp_store> store_;
    std::string prefix_;
};

} // namespace unison::detail
