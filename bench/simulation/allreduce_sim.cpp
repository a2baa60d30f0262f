// Times unison's all-reduce on the MPI backend against the MPI's own MPI_Allreduce
// on the same buffers, size by size: the program bench/simulation/simulate.sh
// builds with SimGrid's smpicxx and runs under smpirun on simulated clusters (it
// builds and runs under a real MPI too).
//
//   allreduce_sim [-b bytes] [-e bytes] [-f factor] [-n iters] [-i bytes] [-w warmup]
//                 [-a algorithm,...] [--shared] [--no-check]
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
// where `chosen` is the algorithm that ran (automatic's pick), and `us` for the row
// algorithm "mpi" is MPI_Allreduce's time.

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
#include <string>
#include <string_view>
#include <vector>

namespace {

struct options {
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

std::size_t parse_bytes(const char* s) {
    char* end = nullptr;
    const double v = std::strtod(s, &end);
    double scale = 1;
    if (end != nullptr && *end != '\0') {
        switch (*end) {
        case 'K':
        case 'k':
            scale = 1024.0;
            break;
        case 'M':
        case 'm':
            scale = 1024.0 * 1024.0;
            break;
        case 'G':
        case 'g':
            scale = 1024.0 * 1024.0 * 1024.0;
            break;
        default:
            throw std::invalid_argument(std::string("bad size '") + s + "'");
        }
    }
    if (end == s || v < 0) {
        throw std::invalid_argument(std::string("bad size '") + s + "'");
    }
    return static_cast<std::size_t>(v * scale);
}

std::vector<unison::algorithm> parse_algorithms(std::string_view list) {
    std::vector<unison::algorithm> out;
    while (!list.empty()) {
        const auto comma = list.find(',');
        const std::string_view name = list.substr(0, comma);
        if (name == "none") {
            out.clear();
        } else if (name == "all") {
            out.assign(unison::all_algorithms.begin(), unison::all_algorithms.end());
        } else if (const auto a = unison::algorithm_from_string(name)) {
            out.push_back(*a);
        } else {
            throw std::invalid_argument("no algorithm named '" + std::string(name) + "'");
        }
        list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
    }
    return out;
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
        if (a == "-b") {
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

/// Whether `out` holds the sum over `ranks` ranks (the inputs repeat every 17
/// elements, so the serial sums are 17 values).
bool check(buffer& out, int ranks) {
    double expect[17] = {};
    for (std::size_t i = 0; i < 17; ++i) {
        for (int r = 0; r < ranks; ++r) {
            expect[i] += input_value(r, i);
        }
    }
    const float* o = out.data();
    for (std::size_t i = 0; i < out.size(); ++i) {
        if (static_cast<double>(o[i]) != expect[i % 17]) {
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
            const std::size_t count = static_cast<std::size_t>(b) / sizeof(float);
            const std::size_t bytes = count * sizeof(float);
            buffer in(count, o.shared), out(count, o.shared);
            if (!o.shared) {
                for (std::size_t i = 0; i < count; ++i) {
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
                    std::memset(out.data(), 0, bytes);
                }
                MPI_Barrier(MPI_COMM_WORLD);
                const double t0 = MPI_Wtime();
                for (int i = 0; i < iters; ++i) {
                    call();
                }
                const double total = MPI_Wtime() - t0;
                const bool ok = !o.check || check(out, ranks);
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
                const auto [us, ok] = time([&] {
                    unison::all_reduce(comm, std::span<const float>(in.data(), count), out.span());
                });
                if (rank == 0) {
                    const auto chosen = comm.all_reduce_algorithm(bytes);
                    std::printf("%d,%zu,%s,%s,%.3f,%s\n", ranks, bytes,
                                std::string(unison::to_string(a)).c_str(),
                                std::string(unison::to_string(chosen)).c_str(), us,
                                o.check ? verdict[ok] : "unchecked");
                }
            }
            const auto [us, ok] = time([&] {
                MPI_Allreduce(in.data(), out.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                              MPI_COMM_WORLD);
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
