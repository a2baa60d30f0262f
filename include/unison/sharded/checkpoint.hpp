#pragma once

/// \file
/// Sharded checkpoints of a `sharded_parameters` and its `partitioned_optimizer`.
///
/// `save_checkpoint(dir, params, optimizer)`: every rank that holds a distinct shard
/// (all ranks; with hybrid sharding the first replica group) writes the elements it
/// owns of every parameter ("param": the master weights when there are any, so
/// nothing is lost to the 16-bit copy) and of every optimizer state slot to
/// `dir/rank-R-of-W.bin`, fsyncs it and renames it into place; rank 0 then writes
/// `dir/metadata` (tensor names, global element offsets, dtypes, file sizes and
/// checksums, step counters, loss scale) the same way, last. A crash at any point
/// leaves either no metadata or a metadata whose files all verify.
///
/// `load_checkpoint(dir, params, optimizer)` reads it back at any world size and any
/// stage: each rank reads exactly the elements it holds in its own layout, from
/// whichever files hold them, checking every file's size and checksum and the
/// metadata against the model (names, sizes, optimizer). Everything is read into
/// staging memory first and the ranks agree that all of them succeeded before any
/// state is overwritten: a bad checkpoint changes nothing and every rank throws.
///
/// Both are collective over params.communicator(). Use a fresh directory per
/// checkpoint (or remove the old metadata first). Shards on a device
/// (unison::cuda::use_device) are copied through host memory; the files are the
/// same wherever the shards lived, so a checkpoint written from the GPU loads on the
/// host and the other way round.

#include "unison/checkpoint/error.hpp"
#include "unison/checkpoint/format.hpp"
#include "unison/checkpoint/io.hpp"
#include "unison/comm/collectives.hpp"
#include "unison/core/detail/convert.hpp"
#include "unison/parallel/detail/control.hpp"
#include "unison/sharded/fsdp.hpp"
#include "unison/sharded/partitioned_optimizer.hpp"
#include "unison/sharded/sharded_parameters.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace unison {

namespace checkpoint {

/// The name of writer `w`'s data file among `writers`.
inline std::string data_file_name(int w, int writers) {
    return "rank-" + std::to_string(w) + "-of-" + std::to_string(writers) + ".bin";
}

/// Reads a checkpoint directory: the metadata on construction, data files on demand
/// (each verified against its size and checksum once). Usable on its own to pull
/// full parameters into any framework.
class reader {
public:
    explicit reader(std::filesystem::path dir) : dir_(std::move(dir)) {
        const std::filesystem::path meta = dir_ / "metadata";
        const std::vector<std::byte> bytes = read_file(meta);
        meta_ = parse(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
                      meta.string());
        for (std::size_t t = 0; t < meta_.tensors.size(); ++t) {
            tensor_index_.emplace(meta_.tensors[t].name, t);
        }
        by_pair_.resize(meta_.tensors.size() * meta_.kinds.size());
        for (std::size_t r = 0; r < meta_.ranges.size(); ++r) {
            const range_entry& e = meta_.ranges[r];
            by_pair_[e.tensor * meta_.kinds.size() + e.kind].push_back(r);
        }
        for (auto& list : by_pair_) {
            std::sort(list.begin(), list.end(), [&](std::size_t a, std::size_t b) {
                return meta_.ranges[a].offset < meta_.ranges[b].offset;
            });
        }
        files_.resize(meta_.files.size());
    }

    const metadata& meta() const noexcept { return meta_; }
    std::string metadata_path() const { return (dir_ / "metadata").string(); }

    /// Index of tensor `name`, or -1.
    std::ptrdiff_t tensor(std::string_view name) const {
        const auto it = tensor_index_.find(std::string(name));
        return it == tensor_index_.end() ? -1 : static_cast<std::ptrdiff_t>(it->second);
    }
    /// Index of kind `name`, or -1.
    std::ptrdiff_t kind(std::string_view name) const {
        for (std::size_t k = 0; k < meta_.kinds.size(); ++k) {
            if (meta_.kinds[k] == name) {
                return static_cast<std::ptrdiff_t>(k);
            }
        }
        return -1;
    }

    /// Elements [offset, offset + count) of `kind` of tensor `name`, converted to
    /// `type`, into `dst`.
    void read(std::string_view name, std::string_view kind_name, std::size_t offset,
              std::size_t count, void* dst, dtype type) {
        const std::ptrdiff_t t = tensor(name);
        const std::ptrdiff_t k = kind(kind_name);
        if (t < 0 || k < 0) {
            throw checkpoint_error(metadata_path(), "has no " + std::string(kind_name) +
                                                        " of tensor '" + std::string(name) + "'");
        }
        const tensor_entry& te = meta_.tensors[static_cast<std::size_t>(t)];
        if (offset + count > te.numel || offset + count < offset) {
            throw checkpoint_error(metadata_path(),
                                   "tensor '" + te.name + "' has " + std::to_string(te.numel) +
                                       " elements; elements [" + std::to_string(offset) + ", " +
                                       std::to_string(offset + count) + ") were asked for");
        }
        const std::size_t end = offset + count;
        auto* out = static_cast<std::byte*>(dst);
        for (std::size_t r : by_pair_[static_cast<std::size_t>(t) * meta_.kinds.size() +
                                      static_cast<std::size_t>(k)]) {
            const range_entry& e = meta_.ranges[r];
            const std::size_t b = std::max<std::size_t>(offset, e.offset);
            const std::size_t x = std::min<std::size_t>(end, e.offset + e.count);
            if (b >= x) {
                continue;
            }
            const std::vector<std::byte>& file = data(e.file);
            detail::convert_scale(out + (b - offset) * size_of(type), type,
                                  file.data() + e.file_offset + (b - e.offset) * size_of(e.type),
                                  e.type, x - b);
        }
    }

    /// The whole of tensor `name`'s `kind` (default: the parameter values) into any
    /// writable host tensor of the right size.
    template <writable_tensor T>
    void read_tensor(std::string_view name, T&& out, std::string_view kind_name = "param") {
        const buffer b = as_buffer(out);
        const std::ptrdiff_t t = tensor(name);
        if (t >= 0 && meta_.tensors[static_cast<std::size_t>(t)].numel != b.count) {
            throw checkpoint_error(
                metadata_path(),
                "tensor '" + std::string(name) + "' has " +
                    std::to_string(meta_.tensors[static_cast<std::size_t>(t)].numel) +
                    " elements, the destination " + std::to_string(b.count));
        }
        read(name, kind_name, 0, b.count, b.data, b.type);
    }

private:
    const std::vector<std::byte>& data(std::size_t f) {
        if (!files_[f]) {
            const file_entry& fe = meta_.files[f];
            files_[f] = read_verified(dir_ / fe.name, fe.bytes, fe.checksum, meta_.version);
        }
        return *files_[f];
    }

    std::filesystem::path dir_;
    metadata meta_;
    std::map<std::string, std::size_t> tensor_index_;
    std::vector<std::vector<std::size_t>> by_pair_;
    std::vector<std::optional<std::vector<std::byte>>> files_;
};

} // namespace checkpoint

namespace detail {

/// One piece a writer stores: `count` elements of parameter `id`, from element
/// `offset` of the parameter, which sit at element `at` of the unit.
struct checkpoint_piece {
    std::size_t id, offset, count, at;
};

/// The pieces of the shard writer `w` owns, in file order (unit by unit, parameter
/// by parameter): the same list on every rank, so rank 0 can describe every file.
template <class SP>
std::vector<checkpoint_piece> owned_pieces(const SP& sp, int w) {
    std::vector<checkpoint_piece> out;
    for (std::size_t k = 0; k < sp.unit_count(); ++k) {
        const element_range owned = sp.owned_range(k, w);
        const std::size_t lo = owned.begin, hi = owned.end;
        const auto [first, last] = sp.parameters_of(k);
        for (std::size_t id = first; id < last; ++id) {
            const std::size_t off = sp.offset_of(id), end = off + sp.numel(id);
            const std::size_t b = std::max(lo, off), e = std::min(hi, end);
            if (b < e) {
                out.push_back({id, b - off, e - b, b});
            }
        }
    }
    return out;
}

/// Runs `work` on every rank; if it failed anywhere, every rank throws (the failing
/// ranks their own error, the others one naming the lowest failing rank).
/// The vote is a bookkeeping collective, staged through `place` where the
/// communicator moves device memory only.
template <communicator C, class F>
void agree(C& comm, const placement& place, const std::string& what, F&& work) {
    std::exception_ptr mine;
    try {
        work();
    } catch (...) {
        mine = std::current_exception();
    }
    std::int64_t lowest[1] = {mine ? comm.rank() : comm.size()};
    control_all_reduce(comm, place, std::span<std::int64_t>(lowest), reduce_op::min);
    if (mine) {
        std::rethrow_exception(mine);
    }
    if (lowest[0] < comm.size()) {
        throw checkpoint_error(what, "failed on rank " + std::to_string(lowest[0]) +
                                         " (see that rank's error); nothing was changed here");
    }
}

template <class SP, class Opt>
void save_checkpoint_impl(const std::filesystem::path& dir, SP& sp, Opt* opt) {
    auto& comm = sp.communicator();
    const placement& place = sp.placement(); // device shards are staged through the host
    const int writers = sp.shard_size();
    const bool writer = sp.replica_index() == 0;
    constexpr dtype value_type = SP::has_master ? SP::master_dtype : SP::param_dtype;
    std::size_t slots = 0;
    if constexpr (!std::is_same_v<Opt, void>) {
        slots = Opt::optimizer_type::slots;
    }

    // Each writer's data file: for every piece, the values, then each state slot.
    std::uint64_t checksum = 0, bytes = 0;
    agree(comm, place, (dir / "rank files").string(), [&] {
        if (!writer) {
            return;
        }
        std::filesystem::create_directories(dir);
        std::vector<std::byte> data;
        const auto pieces = owned_pieces(sp, sp.shard_rank());
        place.synchronize(); // the last step's kernels wrote what is saved
        auto append = [&](const std::byte* src, std::size_t n) {
            const std::size_t at = data.size();
            data.resize(at + n);
            place.copy_to_host(data.data() + at, src, n);
        };
        for (const checkpoint_piece& p : pieces) {
            const std::size_t unit = sp.unit_of(p.id);
            auto part = sp.partition_of(unit);
            const std::size_t rel = p.at - part.range.begin;
            const std::byte* values =
                static_cast<const std::byte*>(SP::has_master ? part.master : part.param) +
                rel * size_of(value_type);
            append(values, p.count * size_of(value_type));
            if constexpr (!std::is_same_v<Opt, void>) {
                for (std::size_t s = 0; s < slots; ++s) {
                    append(opt->state(unit, s) + rel * size_of(Opt::state_dtype),
                           p.count * size_of(Opt::state_dtype));
                }
            }
        }
        checkpoint::write_file_durably(dir / checkpoint::data_file_name(sp.shard_rank(), writers),
                                       data);
        bytes = data.size();
        checksum = checkpoint::checksum(checkpoint::format_version, data.data(), data.size());
    });

    const std::int64_t mine[2] = {static_cast<std::int64_t>(bytes),
                                  static_cast<std::int64_t>(checksum)};
    std::vector<std::int64_t> all(2 * static_cast<std::size_t>(comm.size()));
    control_all_gather(comm, place, std::span<const std::int64_t>(mine), std::span(all));

    agree(comm, place, (dir / "metadata").string(), [&] {
        if (comm.rank() != 0) {
            return;
        }
        checkpoint::metadata m;
        m.world_size = static_cast<std::uint32_t>(writers);
        m.layout = std::string(SP::strategy::layout_name);
        m.kinds.push_back("param");
        if constexpr (!std::is_same_v<Opt, void>) {
            m.optimizer = std::string(Opt::optimizer_type::name);
            for (std::string_view s : Opt::optimizer_type::slot_names) {
                m.kinds.emplace_back(s);
            }
            m.step = opt->steps();
            m.loss_scale = opt->loss_scale();
            m.good_steps = opt->good_steps();
        } else {
            m.optimizer = "none";
        }
        for (std::size_t id = 0; id < sp.parameter_count(); ++id) {
            m.tensors.push_back({sp.name(id), sp.numel(id)});
            if constexpr (!std::is_same_v<Opt, void>) {
                if (opt->steps_of(id) != opt->steps()) { // it sat some steps out
                    m.tensor_steps.push_back({static_cast<std::uint32_t>(id), opt->steps_of(id)});
                }
            }
        }
        for (int w = 0; w < writers; ++w) {
            // Writers are the ranks of replica 0: world ranks 0 .. writers-1.
            const auto i = 2 * static_cast<std::size_t>(w);
            m.files.push_back({checkpoint::data_file_name(w, writers),
                               static_cast<std::uint64_t>(all[i]),
                               static_cast<std::uint64_t>(all[i + 1])});
            std::uint64_t at = 0;
            for (const checkpoint_piece& p : owned_pieces(sp, w)) {
                const dtype types[] = {value_type, SP::master_dtype};
                for (std::size_t kind = 0; kind <= slots; ++kind) {
                    const dtype t = types[kind == 0 ? 0 : 1];
                    m.ranges.push_back(
                        {static_cast<std::uint32_t>(w), static_cast<std::uint32_t>(p.id),
                         static_cast<std::uint32_t>(kind), p.offset, p.count, t, at});
                    at += p.count * size_of(t);
                }
            }
        }
        const std::string text = checkpoint::serialize(m);
        checkpoint::validate(checkpoint::parse(text, (dir / "metadata").string()),
                             (dir / "metadata").string());
        checkpoint::write_file_durably(
            dir / "metadata", std::span<const std::byte>(
                                  reinterpret_cast<const std::byte*>(text.data()), text.size()));
    });
}

template <class SP, class Opt>
void load_checkpoint_impl(const std::filesystem::path& dir, SP& sp, Opt* opt) {
    auto& comm = sp.communicator();
    const placement& place = sp.placement(); // device shards are staged through the host
    struct staged {
        std::byte* dst;
        std::vector<std::byte> bytes;
    };
    std::vector<staged> stage;
    checkpoint::metadata meta;
    std::vector<std::pair<std::size_t, std::uint64_t>> fewer_steps; // (id, steps)
    agree(comm, place, (dir / "metadata").string(), [&] {
        checkpoint::reader rd(dir);
        meta = rd.meta();
        const std::string where = rd.metadata_path();
        // The checkpoint must describe exactly this model (and optimizer).
        if (meta.tensors.size() != sp.parameter_count()) {
            throw checkpoint_error(where, "holds " + std::to_string(meta.tensors.size()) +
                                              " tensors, the model has " +
                                              std::to_string(sp.parameter_count()) + " parameters");
        }
        std::vector<std::optional<std::uint64_t>> fewer_of(meta.tensors.size()); // by tensor
        for (const checkpoint::tensor_step_entry& e : meta.tensor_steps) {
            fewer_of[e.tensor] = e.steps;
        }
        for (std::size_t id = 0; id < sp.parameter_count(); ++id) {
            const std::ptrdiff_t t = rd.tensor(sp.name(id));
            if (t < 0) {
                throw checkpoint_error(where, "has no parameter '" + sp.name(id) + "'");
            }
            if (meta.tensors[static_cast<std::size_t>(t)].numel != sp.numel(id)) {
                throw checkpoint_error(
                    where, "parameter '" + sp.name(id) + "' has " +
                               std::to_string(meta.tensors[static_cast<std::size_t>(t)].numel) +
                               " elements, the model's " + std::to_string(sp.numel(id)));
            }
            if (const auto steps = fewer_of[static_cast<std::size_t>(t)]) {
                fewer_steps.emplace_back(id, *steps);
            }
        }
        if (rd.kind("param") < 0) {
            throw checkpoint_error(where, "holds no parameter values (kind 'param')");
        }
        std::size_t slots = 0;
        if constexpr (!std::is_same_v<Opt, void>) {
            slots = Opt::optimizer_type::slots;
            if (meta.optimizer != Opt::optimizer_type::name) {
                throw checkpoint_error(where, "holds the state of optimizer '" + meta.optimizer +
                                                  "', loading into '" +
                                                  std::string(Opt::optimizer_type::name) + "'");
            }
        }
        auto read = [&](std::size_t id, std::string_view kind, std::size_t offset,
                        std::size_t count, std::byte* dst, dtype type) {
            staged s{dst, std::vector<std::byte>(count * size_of(type))};
            rd.read(sp.name(id), kind, offset, count, s.bytes.data(), type);
            stage.push_back(std::move(s));
        };
        for (std::size_t k = 0; k < sp.unit_count(); ++k) {
            auto part = sp.partition_of(k);
            const element_range held = sp.held_range(k); // the resident parameters
            auto* param_base = static_cast<std::byte*>(part.param) -
                               (part.range.begin - held.begin) * size_of(SP::param_dtype);
            const auto [first, last] = sp.parameters_of(k);
            for (std::size_t id = first; id < last; ++id) {
                const std::size_t off = sp.offset_of(id), end = off + sp.numel(id);
                auto each = [&](element_range r, auto&& fn) {
                    const std::size_t b = std::max(r.begin, off), e = std::min(r.end, end);
                    if (b < e) {
                        fn(b, e);
                    }
                };
                each(held, [&](std::size_t b, std::size_t e) {
                    read(id, "param", b - off, e - b,
                         param_base + (b - held.begin) * size_of(SP::param_dtype), SP::param_dtype);
                });
                each(part.range, [&](std::size_t b, std::size_t e) {
                    const std::size_t rel = b - part.range.begin;
                    if constexpr (SP::has_master) {
                        read(id, "param", b - off, e - b,
                             static_cast<std::byte*>(part.master) + rel * size_of(SP::master_dtype),
                             SP::master_dtype);
                    }
                    if constexpr (!std::is_same_v<Opt, void>) {
                        for (std::size_t s = 0; s < slots; ++s) {
                            read(id, Opt::optimizer_type::slot_names[s], b - off, e - b,
                                 opt->state(k, s) + rel * size_of(Opt::state_dtype),
                                 Opt::state_dtype);
                        }
                    }
                });
            }
        }
    });
    // Every rank read everything it needs: commit.
    place.synchronize(); // nothing in flight still writes the shards overwritten here
    for (const staged& s : stage) {
        place.copy_from_host(s.dst, s.bytes.data(), s.bytes.size());
    }
    if constexpr (!std::is_same_v<Opt, void>) {
        opt->restore_counters(meta.step, meta.loss_scale, meta.good_steps,
                              std::span<const std::pair<std::size_t, std::uint64_t>>(fewer_steps));
    }
}

} // namespace detail

/// Saves `params` and `optimizer` to directory `dir` (created if needed). Collective.
template <class SP, class O>
void save_checkpoint(const std::filesystem::path& dir, SP& params,
                     partitioned_optimizer<SP, O>& optimizer) {
    detail::save_checkpoint_impl(dir, params, &optimizer);
}
/// Saves the parameters only (optimizer "none").
template <class SP>
void save_checkpoint(const std::filesystem::path& dir, SP& params) {
    detail::save_checkpoint_impl<SP, void>(dir, params, nullptr);
}

/// Loads `params` and `optimizer` from `dir`, whatever world size and stage wrote
/// it. On any problem every rank throws (checkpoint_error naming the file) and
/// nothing is changed. Collective.
template <class SP, class O>
void load_checkpoint(const std::filesystem::path& dir, SP& params,
                     partitioned_optimizer<SP, O>& optimizer) {
    detail::load_checkpoint_impl(dir, params, &optimizer);
}
/// Loads the parameters only (any optimizer state in the checkpoint is ignored).
template <class SP>
void load_checkpoint(const std::filesystem::path& dir, SP& params) {
    detail::load_checkpoint_impl<SP, void>(dir, params, nullptr);
}

namespace detail {
/// A checkpoint carries no gradients: inside an accumulation window (the same on
/// every rank) the micro-batches accumulated so far would be lost, so it is refused.
template <class Engine>
void refuse_mid_window(Engine& engine, const char* operation) {
    if (engine.accumulating()) {
        throw argument_error(engine.communicator().rank(), operation,
                             "the fsdp engine is inside an accumulation window (" +
                                 std::to_string(engine.micro_batch()) +
                                 " micro-batch(es) ended by step(), or a no_sync scope open): "
                                 "checkpoints carry no gradients; save or load after the "
                                 "window's last step()");
    }
}
} // namespace detail

/// Saves an fsdp engine's parameters and optimizer state (after start()). Collective.
template <communicator C, class... Ps>
void save_checkpoint(const std::filesystem::path& dir, fsdp<C, Ps...>& engine) {
    detail::refuse_mid_window(engine, "save_checkpoint");
    detail::save_checkpoint_impl(dir, engine.parameters(), &engine.optimizer());
}
/// Loads an fsdp engine's parameters and optimizer state (after start()), whatever
/// world size and strategy wrote them; on any problem every rank throws and nothing
/// is changed. Collective.
template <communicator C, class... Ps>
void load_checkpoint(const std::filesystem::path& dir, fsdp<C, Ps...>& engine) {
    detail::refuse_mid_window(engine, "load_checkpoint");
    detail::load_checkpoint_impl(dir, engine.parameters(), &engine.optimizer());
}

} // namespace unison
