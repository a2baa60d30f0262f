#pragma once

// Sharded checkpoints: round trips and resharding across stages and world sizes are
// bit-exact (checked through checkpoint::reader, a single-process view of every
// tensor and state slot); truncated, corrupted, incomplete and mismatched
// checkpoints are rejected on every rank with an error naming the file, and leave
// the loading model untouched.

#include "accounting.hpp"

#include <unison/sharded.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

namespace unison::test {

/// A directory under the system's temp dir, the same on every rank (rank 0 picks
/// the name, broadcast through `Space`), removed on destruction by rank 0.
template <communicator C, class Space = host_space>
class shared_temp_dir {
public:
    shared_temp_dir(C& comm, const std::string& tag) : rank_(comm.rank()) {
        std::int64_t id = static_cast<std::int64_t>(std::random_device{}() & 0x7fffffff);
        host_buffer values(dtype::i64, 1);
        std::memcpy(values.bytes.data(), &id, sizeof id);
        auto t = Space::make(comm, std::move(values));
        broadcast(comm, t.view(), 0);
        const host_buffer& chosen = Space::read(comm, t);
        std::memcpy(&id, chosen.bytes.data(), sizeof id);
        path_ = std::filesystem::temp_directory_path() /
                ("unison-" + tag + "-" + std::to_string(comm.size()) + "-" + std::to_string(id));
    }
    ~shared_temp_dir() {
        if (rank_ == 0) {
            std::error_code ec;
            std::filesystem::remove_all(path_, ec);
        }
    }
    const std::filesystem::path& path() const { return path_; }

private:
    int rank_;
    std::filesystem::path path_;
};

/// Every tensor's every kind, as bytes of doubles, read single-process.
inline std::vector<std::vector<double>> checkpoint_contents(const std::filesystem::path& dir) {
    checkpoint::reader rd(dir);
    std::vector<std::vector<double>> out;
    for (const auto& t : rd.meta().tensors) {
        for (const auto& k : rd.meta().kinds) {
            std::vector<double> v(t.numel);
            rd.read(t.name, k, 0, v.size(), v.data(), dtype::f64);
            out.push_back(std::move(v));
        }
    }
    return out;
}

/// Trains `Sharding` with AdamW for `steps` synthetic steps in `Space` and saves to
/// `dir`.
template <class Sharding, class Precision, class Space = host_space, communicator C>
void train_and_save(C& comm, const std::filesystem::path& dir, int steps) {
    using sp_type = sharded_parameters<C, Sharding, Precision>;
    sp_type sp(comm, {.shard_group_size = hybrid_group(comm.size())});
    Space::attach(comm, sp);
    add_accounting_units(sp);
    sp.start();
    partitioned_optimizer<sp_type, optim::adamw> opt(sp, optim::adamw{});
    Space::attach(comm, opt);
    for (int s = 0; s < steps; ++s) {
        synthetic_backward<std::conditional_t<Precision::param == dtype::bf16, bf16, float>, Space>(
            sp, 40 + static_cast<std::uint64_t>(s), 1.0);
        opt.step();
        sp.zero_grad();
    }
    save_checkpoint(dir, sp, opt);
}

/// Loads `from` into `Sharding` in `Space` at this world size and saves it again to
/// `to`.
template <class Sharding, class Space = host_space, communicator C>
std::uint64_t load_and_resave(C& comm, const std::filesystem::path& from,
                              const std::filesystem::path& to) {
    using sp_type = sharded_parameters<C, Sharding>;
    sp_type sp(comm, {.shard_group_size = hybrid_group(comm.size())});
    Space::attach(comm, sp);
    add_accounting_units(sp);
    sp.start();
    partitioned_optimizer<sp_type, optim::adamw> opt(sp, optim::adamw{});
    Space::attach(comm, opt);
    load_checkpoint(from, sp, opt);
    save_checkpoint(to, sp, opt);
    return opt.steps();
}

/// Rejections at this world size (zero<3>, AdamW): each corruption is made by rank 0
/// on a fresh copy of a good checkpoint; every rank must throw a checkpoint_error
/// (the ranks that found the problem naming the file and the problem) and keep its
/// state bit for bit.
template <class Space, communicator C>
void checkpoint_rejection_cases(C& comm) {
    using namespace unison::policy;
    using sp_type = sharded_parameters<C, zero<3>>;
    shared_temp_dir<C, Space> tmp(comm, "ckpt-bad");
    const auto good = tmp.path() / "good";
    train_and_save<zero<3>, mixed_precision<dtype::f32>, Space>(comm, good, 2);

    sp_type sp(comm);
    Space::attach(comm, sp);
    add_accounting_units(sp);
    sp.start();
    partitioned_optimizer<sp_type, optim::adamw> opt(sp, optim::adamw{});
    Space::attach(comm, opt);
    synthetic_backward<float, Space>(sp, 99, 1.0);
    opt.step();
    const auto before = optimizer_bytes<Space>(opt);

    const std::string file0 = checkpoint::data_file_name(0, comm.size());
    struct corruption {
        std::string name;
        std::function<void(const std::filesystem::path&)> apply;
        std::string expect; ///< in what() on the ranks that see the problem
    };
    const std::vector<corruption> cases = {
        {"flipped byte in a data file",
         [&](const std::filesystem::path& d) {
             std::fstream f(d / file0, std::ios::in | std::ios::out | std::ios::binary);
             f.seekg(17);
             char c = 0;
             f.read(&c, 1);
             c = static_cast<char>(c ^ 0x20);
             f.seekp(17);
             f.write(&c, 1);
         },
         "checksum"},
        {"truncated data file",
         [&](const std::filesystem::path& d) {
             std::filesystem::resize_file(d / file0, std::filesystem::file_size(d / file0) - 5);
         },
         "truncated"},
        {"missing data file",
         [&](const std::filesystem::path& d) { std::filesystem::remove(d / file0); }, "missing"},
        {"missing metadata (an interrupted save)",
         [&](const std::filesystem::path& d) { std::filesystem::remove(d / "metadata"); },
         "missing"},
        {"edited metadata",
         [&](const std::filesystem::path& d) {
             std::string text;
             {
                 std::ifstream in(d / "metadata", std::ios::binary);
                 text.assign(std::istreambuf_iterator<char>(in), {});
             }
             const auto at = text.find("step ");
             text[at + 5] = text[at + 5] == '7' ? '8' : '7';
             std::ofstream(d / "metadata", std::ios::binary | std::ios::trunc) << text;
         },
         "checksum"},
    };
    outcome o;
    int index = 0;
    for (const corruption& c : cases) {
        const auto dir = tmp.path() / ("bad" + std::to_string(index++));
        if (comm.rank() == 0) {
            std::filesystem::copy(good, dir);
            c.apply(dir);
        }
        barrier(comm);
        try {
            load_checkpoint(dir, sp, opt);
            o.expect(false, c.name + ": loaded without an error");
        } catch (const checkpoint_error& e) {
            const std::string what = e.what();
            const bool named = what.find(c.expect) != std::string::npos &&
                               what.find(dir.filename().string()) != std::string::npos;
            const bool other = what.find("failed on rank") != std::string::npos;
            o.expect(named || other, c.name + ": unexpected message: " + what);
        }
        o.expect(optimizer_bytes<Space>(opt) == before,
                 c.name + ": a rejected load changed the state");
    }

    // A checkpoint of another model or optimizer.
    {
        using other_type = sharded_parameters<C, zero<3>>;
        other_type other(comm);
        Space::attach(comm, other);
        other.add_unit({{"embed", 1200}, {"embed.bias", 240}});
        other.add_unit({{"block.w", 3601}});
        other.start();
        try {
            load_checkpoint(good, other);
            o.expect(false, "a checkpoint of another model loaded");
        } catch (const checkpoint_error& e) {
            const std::string what = e.what();
            o.expect(what.find("metadata") != std::string::npos &&
                         (what.find("tensors") != std::string::npos ||
                          what.find("block.w") != std::string::npos ||
                          what.find("failed on rank") != std::string::npos),
                     std::string("another model: unexpected message: ") + what);
        }
        partitioned_optimizer<sp_type, optim::sgd> sgd(sp, optim::sgd{});
        Space::attach(comm, sgd);
        try {
            load_checkpoint(good, sp, sgd);
            o.expect(false, "AdamW state loaded into SGD");
        } catch (const checkpoint_error& e) {
            o.expect(std::string(e.what()).find("adamw") != std::string::npos,
                     std::string("optimizer mismatch: unexpected message: ") + e.what());
        }
        o.expect(optimizer_bytes<Space>(opt) == before, "a rejected load changed the state");
    }
    UNISON_CHECK_CASE(comm, "checkpoint rejections", o);
}

/// Same world size, different stage: save zero<3>, load zero<1>, zero<2> and
/// shard::hybrid, save again; every file set reads back bit for bit. In a device
/// space every save copies the shards off the GPU and every load onto it.
template <class Space, communicator C>
void checkpoint_restage_cases(C& comm) {
    using namespace unison::policy;
    shared_temp_dir<C, Space> tmp(comm, "ckpt-restage");
    train_and_save<zero<3>, mixed_precision<dtype::f32>, Space>(comm, tmp.path() / "z3", 3);
    load_and_resave<zero<1>, Space>(comm, tmp.path() / "z3", tmp.path() / "z1");
    load_and_resave<zero<2>, Space>(comm, tmp.path() / "z1", tmp.path() / "z2");
    const auto steps =
        load_and_resave<shard::hybrid, Space>(comm, tmp.path() / "z2", tmp.path() / "hy");
    outcome o;
    o.expect(steps == 3, "the step counter came back as " + std::to_string(steps));
    if (comm.rank() == 0) {
        const auto ref = checkpoint_contents(tmp.path() / "z3");
        for (const char* d : {"z1", "z2", "hy"}) {
            o.expect(checkpoint_contents(tmp.path() / d) == ref,
                     std::string("resaved through ") + d + " differs from the original");
        }
    }
    barrier(comm);
    UNISON_CHECK_CASE(comm, "checkpoint restaging", o);
}

} // namespace unison::test
