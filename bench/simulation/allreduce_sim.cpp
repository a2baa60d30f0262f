// Times unison's all-reduce (or reduce_scatter, or all_gather) on the MPI backend
// against the MPI's own call on the same buffers, size by size: the program
// bench/simulation/simulate.sh builds with SimGrid's smpicxx and runs under
// smpirun on simulated clusters (it builds and runs under a real MPI too).
//
//   allreduce_sim [-c collective] [-b bytes] [-e bytes] [-f factor] [-n iters]
//                 [-i bytes] [-w warmup] [-a algorithm,...] [--shared] [--no-check]
//
// -c all_reduce (default), reduce_scatter or all_gather; a size is the whole
// buffer, as nccl-tests count it: a reduce_scatter's input and an all_gather's
// output, each rank's block being size / ranks (MPI_Reduce_scatter_block and
// MPI_Allgather the MPI's calls). A forced algorithm reaches the reduce_scatter
// and the all_gather as comm_options::all_reduce_algorithm does (those each
// takes, mpi/tuning.hpp: rabenseifner, native and rank_ordered for the
// reduce_scatter, recursive_doubling, two_level, ring, neighbour_exchange and
// native for the all_gather; the rest leave the tuning's choice).
//
// For each size, each of unison's algorithms named by -a (automatic, the tuning's
// choice, by default; `all` for every one, `none` for MPI's alone) and then
// MPI_Allreduce run `warmup` untimed float sums, then min(iters, -i bytes / size)
// timed ones back to back (default 20 and 4 MiB); a row is the slowest rank's mean
// time. The result is checked against a serial double-precision sum of every
// rank's input, whose small integer values sum exactly in float, unless --no-check
// or --shared: with --shared, SimGrid's shared allocations back the buffers, so
// that thousands of simulated ranks fit in memory, and their contents are
// meaningless.
//
// Output, one CSV row per size and algorithm (rank 0):
//   ranks,bytes,algorithm,chosen,us,correct
// where `chosen` is the algorithm that ran (automatic's pick, or the tuning's
// where a forced one does not apply), and `us` for the row algorithm "mpi" is the
// MPI call's time.

#include "../common/bench_config.hpp"

#include <unison/comm/collectives.hpp>
#include <unison/mpi/mpi_communicator.hpp>
#include <unison/mpi/tuning.hpp>

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace {

enum class collective { all_reduce, reduce_scatter, all_gather };

struct options {
    collective op = collective::all_reduce;
    std::size_t min_bytes = 8;
    std::size_t max_bytes = 16u << 20;
    double factor = 8;
    int iters = 20;
    std::size_t iter_bytes = 4u << 20; ///< a size runs min(iters, iter_bytes / size) times
    int warmup = 1;
    std::vector<unison::algorithm> algorithms{unison::algorithm::automatic};
    bool shared = false;
    bool check = true;
};

/// A size as unison-bench (and nccl-tests) read one: "64K", "1.5M", "8".
std::size_t parse_bytes(const char* s) {
    const auto bytes = unison::bench::detail::parse_bytes(s);
    if (!bytes) {
        throw std::invalid_argument(std::string("bad size '") + s + "'");
    }
    return *bytes;
}

/// -a's list (comm/algorithm.hpp's syntax), or "none": MPI's rows alone.
std::vector<unison::algorithm> parse_algorithms(std::string_view list) {
    if (list == "none") {
        return {};
    }
    const auto named = unison::algorithms_from_string(list);
    if (!named) {
        throw std::invalid_argument("'" + std::string(list) + "' is not a list of algorithms");
    }
    return *named;
}

options parse(int argc, char** argv) {
    options o;
    for (int i = 1; i < argc; ++i) {
        const std::string_view a = argv[i];
        const auto value = [&]() -> const char* {
            if (i + 1 >= argc) {
                throw std::invalid_argument(std::string(a) + " needs a value");
            }
            return argv[++i];
        };
        if (a == "-c") {
            const std::string_view c = value();
            if (c == "all_reduce") {
                o.op = collective::all_reduce;
            } else if (c == "reduce_scatter") {
                o.op = collective::reduce_scatter;
            } else if (c == "all_gather") {
                o.op = collective::all_gather;
            } else {
                throw std::invalid_argument(
                    "-c takes all_reduce, reduce_scatter or all_gather, not '" + std::string(c) +
                    "'");
            }
        } else if (a == "-b") {
            o.min_bytes = parse_bytes(value());
        } else if (a == "-e") {
            o.max_bytes = parse_bytes(value());
        } else if (a == "-f") {
            o.factor = std::strtod(value(), nullptr);
        } else if (a == "-n") {
            o.iters = std::atoi(value());
        } else if (a == "-i") {
            o.iter_bytes = parse_bytes(value());
        } else if (a == "-w") {
            o.warmup = std::atoi(value());
        } else if (a == "-a") {
            o.algorithms = parse_algorithms(value());
        } else if (a == "--shared") {
            o.shared = true;
            o.check = false;
        } else if (a == "--no-check") {
            o.check = false;
        } else {
            throw std::invalid_argument("unknown option '" + std::string(a) + "'");
        }
    }
    if (o.factor <= 1 || o.iters < 1 || o.warmup < 0 || o.min_bytes < 4 ||
        o.max_bytes < o.min_bytes) {
        throw std::invalid_argument("need -f > 1, -n >= 1, -w >= 0, 4 <= -b <= -e");
    }
    return o;
}

/// A float buffer, from SimGrid's shared allocations when asked (and available).
class buffer {
public:
    buffer(std::size_t count, bool shared) : count_(count) {
#ifdef SMPI_SHARED_MALLOC
        if (shared) {
            data_ = static_cast<float*>(SMPI_SHARED_MALLOC(count * sizeof(float)));
            shared_ = true;
            return;
        }
#else
        (void)shared;
#endif
        data_ = static_cast<float*>(std::malloc(count * sizeof(float)));
        if (data_ == nullptr) {
            throw std::bad_alloc();
        }
    }
    buffer(const buffer&) = delete;
    buffer& operator=(const buffer&) = delete;
    ~buffer() {
#ifdef SMPI_SHARED_FREE
        if (shared_) {
            SMPI_SHARED_FREE(data_);
            return;
        }
#endif
        std::free(data_);
    }
    float* data() noexcept {
        return data_;
    }
    std::size_t size() const noexcept {
        return count_;
    }
    std::span<float> span() noexcept {
        return {data_, count_};
    }

private:
    float* data_ = nullptr;
    std::size_t count_ = 0;
    bool shared_ = false;
};

/// Rank r's input: small integers, so every partial sum is exact in float.
float input_value(int rank, std::size_t i) {
    return static_cast<float>(static_cast<int>((i * 7 + static_cast<std::size_t>(rank) * 13) % 17) -
                              8);
}

/// Whether `out` holds rank `rank`'s result of `op` over `ranks` ranks: the sums
/// of every rank's input (at this rank's block, for a reduce_scatter), or every
/// rank's block in rank order (an all_gather).
bool check(collective op, buffer& out, int rank, int ranks) {
    const float* o = out.data();
    const std::size_t block = out.size() / static_cast<std::size_t>(ranks);
    for (std::size_t i = 0; i < out.size(); ++i) {
        double expect = 0;
        if (op == collective::all_gather) {
            expect = input_value(static_cast<int>(i / block), i % block);
        } else {
            const std::size_t at = op == collective::reduce_scatter
                                       ? static_cast<std::size_t>(rank) * out.size() + i
                                       : i;
            for (int r = 0; r < ranks; ++r) {
                expect += input_value(r, at);
            }
        }
        if (static_cast<double>(o[i]) != expect) {
            return false;
        }
    }
    return true;
}

} // namespace

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    int rank = 0, ranks = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    int rc = 0;
    try {
        const options o = parse(argc, argv);
        if (rank == 0) {
            std::printf("ranks,bytes,algorithm,chosen,us,correct\n");
        }
        for (double b = static_cast<double>(o.min_bytes); b <= static_cast<double>(o.max_bytes);
             b *= o.factor) {
            // A reduce_scatter's or all_gather's size is whole blocks of ranks.
            const std::size_t n = static_cast<std::size_t>(ranks);
            const std::size_t whole = static_cast<std::size_t>(b) / sizeof(float);
            const std::size_t count = o.op == collective::all_reduce ? whole : whole / n * n;
            if (count == 0) {
                continue;
            }
            const std::size_t bytes = count * sizeof(float), block = count / n;
            const std::size_t in_count = o.op == collective::all_gather ? block : count;
            const std::size_t out_count = o.op == collective::reduce_scatter ? block : count;
            buffer in(in_count, o.shared), out(out_count, o.shared);
            if (!o.shared) {
                for (std::size_t i = 0; i < in_count; ++i) {
                    in.data()[i] = input_value(rank, i);
                }
            }
            // Back-to-back calls, so that how unevenly ranks leave the barrier (which
            // differs between MPI's algorithm selectors) weighs 1/iters; fewer for
            // large sizes, where it weighs nothing anyway.
            const int iters = static_cast<int>(
                std::clamp<std::size_t>(o.iter_bytes / std::max<std::size_t>(bytes, 1), 1,
                                        static_cast<std::size_t>(o.iters)));
            const auto time = [&](auto&& call) {
                for (int i = 0; i < o.warmup; ++i) {
                    call();
                }
                if (o.check) {
                    std::memset(out.data(), 0, out_count * sizeof(float));
                }
                MPI_Barrier(MPI_COMM_WORLD);
                const double t0 = MPI_Wtime();
                for (int i = 0; i < iters; ++i) {
                    call();
                }
                const double total = MPI_Wtime() - t0;
                const bool ok = !o.check || check(o.op, out, rank, ranks);
                double mean = total / iters, slowest = 0;
                int ok_all = ok ? 1 : 0, ok_min = 0;
                MPI_Reduce(&mean, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
                MPI_Reduce(&ok_all, &ok_min, 1, MPI_INT, MPI_MIN, 0, MPI_COMM_WORLD);
                return std::pair(slowest * 1e6, ok_min == 1);
            };
            const char* verdict[] = {"wrong", "ok"};
            for (unison::algorithm a : o.algorithms) {
                unison::comm_options co = unison::comm_options::from_env();
                co.all_reduce_algorithm = a;
                unison::mpi_communicator comm(MPI_COMM_WORLD, co);
                const std::span<const float> input(in.data(), in_count);
                const auto [us, ok] = time([&] {
                    if (o.op == collective::all_reduce) {
                        unison::all_reduce(comm, input, out.span());
                    } else if (o.op == collective::reduce_scatter) {
                        unison::reduce_scatter(comm, input, out.span());
                    } else {
                        unison::all_gather(comm, input, out.span());
                    }
                });
                if (rank == 0) {
                    const auto chosen =
                        o.op == collective::all_reduce       ? comm.all_reduce_algorithm(bytes)
                        : o.op == collective::reduce_scatter ? comm.reduce_scatter_algorithm(bytes)
                                                             : comm.all_gather_algorithm(bytes);
                    std::printf("%d,%zu,%s,%s,%.3f,%s\n", ranks, bytes,
                                std::string(unison::to_string(a)).c_str(),
                                std::string(unison::to_string(chosen)).c_str(), us,
                                o.check ? verdict[ok] : "unchecked");
                }
            }
            const auto [us, ok] = time([&] {
                if (o.op == collective::all_reduce) {
                    MPI_Allreduce(in.data(), out.data(), static_cast<int>(count), MPI_FLOAT,
                                  MPI_SUM, MPI_COMM_WORLD);
                } else if (o.op == collective::reduce_scatter) {
                    MPI_Reduce_scatter_block(in.data(), out.data(), static_cast<int>(block),
                                             MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
                } else {
                    MPI_Allgather(in.data(), static_cast<int>(block), MPI_FLOAT, out.data(),
                                  static_cast<int>(block), MPI_FLOAT, MPI_COMM_WORLD);
                }
            });
            if (rank == 0) {
                std::printf("%d,%zu,mpi,mpi,%.3f,%s\n", ranks, bytes, us,
                            o.check ? verdict[ok] : "unchecked");
                std::fflush(stdout);
            }
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "allreduce_sim: rank %d: %s\n", rank, e.what());
        rc = 1;
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Finalize();
    return rc;
}
