/// \file
/// unison-kernels-gbench: Google Benchmark suite of unison's CUDA kernels, timed
/// with CUDA events on a dedicated stream, against a plain copy kernel measured in
/// the same process.
///
///     unison-kernels-gbench                                   # every benchmark, GPU 0
///     unison-kernels-gbench --benchmark_filter='adamw|copy'   # the usual gbench flags
///     unison-kernels-gbench --elements=268435456              # another array size
///     CUDA_VISIBLE_DEVICES=3 unison-kernels-gbench            # another GPU
///
/// Without a visible CUDA device it prints a SKIPPED line and exits 0.
///
/// Working set. Every array holds `elements` elements, chosen at startup so that
/// the smallest array (a bf16 one) is at least max(4 x L2, 256 MiB): the data
/// never fits in L2 and every benchmark measures DRAM traffic. `--elements=N`
/// overrides it (rounded up to a multiple of 256). Four f32 arrays of that many
/// elements are allocated once and shared: the benchmarks that need bf16 arrays use
/// an f32 array's memory, and each benchmark refills the arrays it uses with
/// random non-zero values (a device-side hash) before it starts, so neither NaN
/// nor denormal paths, nor the values an earlier benchmark left, play a part.
///
/// Timing. Each benchmark makes a few untimed launches, then times batches of
/// back-to-back launches between two CUDA events on one non-blocking stream
/// (UseManualTime); a reported time is per call. The NCCL benchmarks are the
/// exception: what they measure is the host's cost of a blocking call, so they
/// time batches of calls with the host's steady clock.
///
/// Counters (bandwidth benchmarks):
///   bytes     bytes one call must move between the kernel and DRAM, counted from
///             what the operation reads and writes (not what a particular kernel
///             happens to load): pack, unpack, cast = src + dst bytes (+ dst again
///             when accumulating); multi_norm = input bytes; the optimizer steps
///             = every array read once and every array written once (see each).
///   GB/s      bytes / mean time per call, in 1e9 bytes per second.
///   vs_copy   GB/s divided by the plain copy kernel's GB/s, measured at startup
///             on two f32 arrays of `elements` elements (context: copy_GBps). A
///             kernel that only reads (multi_norm) can exceed 1.
///   elements  elements per call (per array).
///
/// Counters (NCCL, one rank, built with unison::nccl):
///   us_per_call      microseconds per call of what the benchmark names.
///   raw_us_per_call  ncclAllReduce + cudaStreamSynchronize on the same stream and
///                    buffer, timed in the same iteration, interleaved.
///   overhead_us      us_per_call - raw_us_per_call.

#include "gbench_main.hpp"

#include <unison/core.hpp>
#include <unison/cuda/device_buffer.hpp>
#include <unison/cuda/stream.hpp>
#include <unison/kernels/multi_tensor.cuh>
#include <unison/kernels/norm.cuh>
#include <unison/kernels/optimizer.cuh>
#include <unison/optim.hpp>

#if UNISON_HAS_NCCL()
#include <unison/comm.hpp>
#include <unison/nccl.hpp>

#include <nccl.h>
#endif

#include <benchmark/benchmark.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace unison::bench {
namespace {

constexpr std::size_t mib = std::size_t{1} << 20;

/// Launches before timing starts (clocks ramp up, lazy module loading, caches).
constexpr int warmup_launches = 3;
/// Launches between two events: the host's launch latency before the first one is
/// spread over the batch, and the ones after it queue behind the first.
constexpr int launches_per_batch = 5;

// ------------------------------------------------------------ device helpers

/// A well-mixed 32-bit hash of element index `i` and `seed` (murmur3's finalizer).
__device__ inline std::uint32_t hash32(std::uint64_t i, std::uint32_t seed) {
    std::uint32_t x = static_cast<std::uint32_t>(i) ^
                      (static_cast<std::uint32_t>(i >> 32) * 0x9e3779b9u) ^ (seed * 0x85ebca6bu);
    x ^= x >> 16;
    x *= 0x85ebca6bu;
    x ^= x >> 13;
    x *= 0xc2b2ae35u;
    x ^= x >> 16;
    return x;
}

/// p[i] = +-scale * [0.5, 1.5), never zero, denormal or NaN; positive only with
/// `positive` (second moments).
template <class T>
__global__ void fill_random_kernel(T* p, std::size_t n, std::uint32_t seed, float scale,
                                   bool positive) {
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        const std::uint32_t h = hash32(i, seed);
        float v = (0.5f + static_cast<float>(h >> 8) * (1.0f / 16777216.0f)) * scale;
        if (!positive && (h & 1u) != 0u) {
            v = -v;
        }
        p[i] = static_cast<T>(v);
    }
}

/// The bandwidth reference: a grid-stride copy, one 16-byte load and store per step.
__global__ void __launch_bounds__(256)
    copy_float4_kernel(float4* __restrict__ dst, const float4* __restrict__ src, std::size_t n) {
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        dst[i] = src[i];
    }
}

void check_cuda(cudaError_t rc, const char* what) {
    if (rc != cudaSuccess) {
        throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(rc) + ": " +
                                 cudaGetErrorString(rc));
    }
}

template <class T>
void fill_random(T* p, std::size_t n, std::uint32_t seed, cudaStream_t stream, float scale = 1.0f,
                 bool positive = false) {
    int sms = 0;
    int dev = 0;
    check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev),
               "cudaDeviceGetAttribute");
    fill_random_kernel<T>
        <<<static_cast<unsigned>(sms * 8), 256, 0, stream>>>(p, n, seed, scale, positive);
    check_cuda(cudaGetLastError(), "fill_random_kernel");
}

// ------------------------------------------------------------ the model layout

/// The gradients the pack, unpack and norm benchmarks move: the parameters of
/// `layers` GPT-style transformer layers of hidden size `hidden`, in registration
/// order. bench/peers/torch_kernels.py builds the same list with the same rule.
struct model_layout {
    std::size_t hidden = 0;
    std::size_t layers = 0;
    std::vector<std::size_t> sizes; ///< elements of each tensor
    std::size_t total = 0;
};

/// One layer with hidden size d: q, k, v and out projections (d x d and d each),
/// layer norm (d, d), fc1 (4d x d, 4d), fc2 (d x 4d, d), layer norm (d, d):
/// 12 d^2 + 13 d elements in 16 tensors.
std::vector<std::size_t> layer_sizes(std::size_t d) {
    std::vector<std::size_t> s;
    for (int proj = 0; proj < 4; ++proj) { // q, k, v, out
        s.push_back(d * d);
        s.push_back(d);
    }
    s.insert(s.end(), {d, d});             // ln1
    s.insert(s.end(), {4 * d * d, 4 * d}); // fc1
    s.insert(s.end(), {d * 4 * d, d});     // fc2
    s.insert(s.end(), {d, d});             // ln2
    return s;
}

/// As many whole layers of hidden size 1024 as fit in `budget` elements (hidden
/// halved, down to 64, until at least two layers fit).
model_layout transformer_layout(std::size_t budget) {
    std::size_t d = 1024;
    const auto per_layer = [](std::size_t h) { return 12 * h * h + 13 * h; };
    while (d > 64 && 2 * per_layer(d) > budget) {
        d /= 2;
    }
    model_layout m;
    m.hidden = d;
    m.layers = std::max<std::size_t>(1, budget / per_layer(d));
    const std::vector<std::size_t> one = layer_sizes(d);
    for (std::size_t l = 0; l < m.layers; ++l) {
        m.sizes.insert(m.sizes.end(), one.begin(), one.end());
    }
    for (std::size_t s : m.sizes) {
        m.total += s;
    }
    return m;
}

// ------------------------------------------------------------ the workspace

/// What every benchmark shares: the device, the arrays, the stream, the layout and
/// the copy reference.
struct workspace {
    int device = 0;
    std::string gpu_name;
    std::size_t l2_bytes = 0;
    std::size_t elements = 0;
    model_layout layout;
    std::vector<cuda::device_buffer<float>> arrays; // four of `elements` floats
    std::unique_ptr<cuda::stream> stream;
    double copy_bytes_per_second = 0;

    float* f32(int k) { return arrays[static_cast<std::size_t>(k)].data(); }
    /// Array `k` seen as bf16 elements: `elements` of them from element `first`
    /// (the f32 array holds 2 x elements bf16).
    unison::bf16* bf16_at(int k, std::size_t first = 0) {
        return reinterpret_cast<unison::bf16*>(f32(k)) + first;
    }
    void sync() { stream->synchronize(); }
};

workspace* ws = nullptr;

/// Launches `launch()` warmup_launches times untimed, then times batches of
/// launches_per_batch between two events for as long as the benchmark runs.
/// Returns the total timed seconds.
template <class Launch>
double time_launches(benchmark::State& state, cudaStream_t stream, Launch&& launch) {
    for (int i = 0; i < warmup_launches; ++i) {
        launch();
    }
    check_cuda(cudaStreamSynchronize(stream), "warm-up");
    cuda::event start(true);
    cuda::event stop(true);
    double total = 0;
    while (state.KeepRunningBatch(launches_per_batch)) {
        start.record(stream);
        for (int i = 0; i < launches_per_batch; ++i) {
            launch();
        }
        stop.record(stream);
        check_cuda(cudaEventSynchronize(stop.get()), "cudaEventSynchronize");
        float ms = 0;
        check_cuda(cudaEventElapsedTime(&ms, start.get(), stop.get()), "cudaEventElapsedTime");
        const double s = static_cast<double>(ms) * 1e-3;
        state.SetIterationTime(s);
        total += s;
    }
    return total;
}

/// Mean seconds per launch of `launch()` over `batches` event-timed batches (the
/// copy reference, measured once, outside Google Benchmark).
template <class Launch>
double mean_seconds(cudaStream_t stream, int batches, Launch&& launch) {
    for (int i = 0; i < warmup_launches; ++i) {
        launch();
    }
    check_cuda(cudaStreamSynchronize(stream), "warm-up");
    cuda::event start(true);
    cuda::event stop(true);
    double total = 0;
    for (int b = 0; b < batches; ++b) {
        start.record(stream);
        for (int i = 0; i < launches_per_batch; ++i) {
            launch();
        }
        stop.record(stream);
        check_cuda(cudaEventSynchronize(stop.get()), "cudaEventSynchronize");
        float ms = 0;
        check_cuda(cudaEventElapsedTime(&ms, start.get(), stop.get()), "cudaEventElapsedTime");
        total += static_cast<double>(ms) * 1e-3;
    }
    return total / (static_cast<double>(batches) * launches_per_batch);
}

void set_bandwidth_counters(benchmark::State& state, double bytes_per_call, std::size_t elements,
                            double total_seconds) {
    state.counters["bytes"] = bytes_per_call;
    state.counters["elements"] = static_cast<double>(elements);
    if (state.iterations() == 0 || total_seconds <= 0) {
        return;
    }
    const double bps = bytes_per_call * static_cast<double>(state.iterations()) / total_seconds;
    state.counters["GB/s"] = bps * 1e-9;
    state.counters["vs_copy"] = ws->copy_bytes_per_second > 0 ? bps / ws->copy_bytes_per_second : 0;
}

/// Runs `body()`, turning an exception into a skipped benchmark.
template <class Body>
void guarded(benchmark::State& state, Body&& body) {
    try {
        body();
    } catch (const std::exception& e) {
        state.SkipWithError(e.what());
    }
}

unsigned copy_blocks(std::size_t n4) {
    int per_sm = 0;
    check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, copy_float4_kernel, 256, 0),
               "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    int sms = 0;
    check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ws->device),
               "cudaDeviceGetAttribute");
    const std::size_t resident =
        static_cast<std::size_t>(std::max(per_sm, 1)) * static_cast<std::size_t>(sms);
    return static_cast<unsigned>(std::max<std::size_t>(1, std::min(resident, (n4 + 255) / 256)));
}

/// One launch of the reference copy: `n` floats (a multiple of 4) from `src` to `dst`.
void launch_copy(float* dst, const float* src, std::size_t n, unsigned blocks,
                 cudaStream_t stream) {
    copy_float4_kernel<<<blocks, 256, 0, stream>>>(reinterpret_cast<float4*>(dst),
                                                   reinterpret_cast<const float4*>(src), n / 4);
    check_cuda(cudaGetLastError(), "copy_float4_kernel");
}

/// Measures the copy kernel on arrays 0 -> 1 and records its bytes per second.
void measure_copy_reference() {
    const std::size_t n = ws->elements;
    cudaStream_t s = *ws->stream;
    fill_random(ws->f32(0), n, 1, s);
    ws->sync();
    const unsigned blocks = copy_blocks(n / 4);
    const double seconds =
        mean_seconds(s, 20, [&] { launch_copy(ws->f32(1), ws->f32(0), n, blocks, s); });
    ws->copy_bytes_per_second = 2.0 * static_cast<double>(n * sizeof(float)) / seconds;
}

/// multi_tensor_plan uploads its tables with a plain cudaMemcpy from pageable
/// memory, which may return before the DMA lands; the launches run on a
/// non-blocking stream that does not wait for the legacy stream. Waiting here keeps
/// the first (untimed) launch from racing the upload.
void plan_uploaded() {
    check_cuda(cudaDeviceSynchronize(), "multi_tensor_plan upload");
}

// ------------------------------------------------------------ copies

void bm_copy_float4(benchmark::State& state) {
    guarded(state, [&] {
        const std::size_t n = ws->elements;
        cudaStream_t s = *ws->stream;
        fill_random(ws->f32(0), n, 11, s);
        const unsigned blocks = copy_blocks(n / 4);
        const double t =
            time_launches(state, s, [&] { launch_copy(ws->f32(1), ws->f32(0), n, blocks, s); });
        set_bandwidth_counters(state, 2.0 * static_cast<double>(n * sizeof(float)), n, t);
    });
}

void bm_memcpy_d2d(benchmark::State& state) {
    guarded(state, [&] {
        const std::size_t n = ws->elements;
        cudaStream_t s = *ws->stream;
        fill_random(ws->f32(0), n, 12, s);
        const double t = time_launches(state, s, [&] {
            check_cuda(cudaMemcpyAsync(ws->f32(1), ws->f32(0), n * sizeof(float),
                                       cudaMemcpyDeviceToDevice, s),
                       "cudaMemcpyAsync");
        });
        set_bandwidth_counters(state, 2.0 * static_cast<double>(n * sizeof(float)), n, t);
    });
}

// ------------------------------------------------------------ pack and unpack

/// The layout's gradients, back to back in f32 array `k` (every tensor's size is a
/// multiple of 64 elements, so each starts 256-byte aligned, as an allocation would).
std::vector<float*> gradient_tensors(int k) {
    std::vector<float*> g;
    std::size_t offset = 0;
    for (std::size_t n : ws->layout.sizes) {
        g.push_back(ws->f32(k) + offset);
        offset += n;
    }
    return g;
}

/// pack: the gradients (f32, array 0) scaled and cast into one bucket (array 1) of
/// dtype `bucket`. bytes = gradient bytes read + bucket bytes written.
void bm_pack(benchmark::State& state, dtype bucket, double scale) {
    guarded(state, [&] {
        const model_layout& m = ws->layout;
        cudaStream_t s = *ws->stream;
        fill_random(ws->f32(0), m.total, 21, s);
        const std::vector<float*> grads = gradient_tensors(0);
        std::vector<kernels::copy_piece> pieces;
        std::size_t offset = 0;
        for (std::size_t t = 0; t < grads.size(); ++t) {
            void* dst =
                static_cast<std::byte*>(static_cast<void*>(ws->f32(1))) + offset * size_of(bucket);
            pieces.push_back({grads[t], dst, m.sizes[t]});
            offset += m.sizes[t];
        }
        const kernels::multi_tensor_plan plan(pieces);
        plan_uploaded();
        const double t = time_launches(state, s, [&] {
            kernels::multi_scale_cast(plan, bucket, dtype::f32, scale, false, s);
        });
        state.counters["tensors"] = static_cast<double>(plan.piece_count());
        set_bandwidth_counters(
            state, static_cast<double>(m.total * (sizeof(float) + size_of(bucket))), m.total, t);
    });
}

/// unpack: one bucket (array 1, dtype `bucket`) cast back into the gradients (f32,
/// array 0), optionally accumulated. bytes = bucket read + gradients written
/// (+ gradients read when accumulating).
void bm_unpack(benchmark::State& state, dtype bucket, bool accumulate) {
    guarded(state, [&] {
        const model_layout& m = ws->layout;
        cudaStream_t s = *ws->stream;
        if (bucket == dtype::bf16) {
            fill_random(ws->bf16_at(1), m.total, 31, s);
        } else {
            fill_random(ws->f32(1), m.total, 31, s);
        }
        fill_random(ws->f32(0), m.total, 32, s);
        const std::vector<float*> grads = gradient_tensors(0);
        std::vector<kernels::copy_piece> pieces;
        std::size_t offset = 0;
        for (std::size_t t = 0; t < grads.size(); ++t) {
            const void* src = static_cast<const std::byte*>(static_cast<const void*>(ws->f32(1))) +
                              offset * size_of(bucket);
            pieces.push_back({src, grads[t], m.sizes[t]});
            offset += m.sizes[t];
        }
        const kernels::multi_tensor_plan plan(pieces);
        plan_uploaded();
        // Accumulating 1/8 of a +-[0.5, 1.5) value per call keeps the f32 gradients
        // far from overflow for any run length gbench picks.
        const double t = time_launches(state, s, [&] {
            kernels::multi_scale_cast(plan, dtype::f32, bucket, 0.125, accumulate, s);
        });
        const std::size_t per_element =
            size_of(bucket) + sizeof(float) + (accumulate ? sizeof(float) : 0);
        state.counters["tensors"] = static_cast<double>(plan.piece_count());
        set_bandwidth_counters(state, static_cast<double>(m.total * per_element), m.total, t);
    });
}

/// average_cast f32 -> bf16 over one flat tensor (8 ranks: scale 1/8).
/// bytes = 4 read + 2 written per element.
void bm_average_cast(benchmark::State& state) {
    guarded(state, [&] {
        const std::size_t n = ws->elements;
        cudaStream_t s = *ws->stream;
        fill_random(ws->f32(0), n, 41, s);
        const double t = time_launches(state, s, [&] {
            kernels::average_cast(ws->bf16_at(1), dtype::bf16, ws->f32(0), dtype::f32, n, 8, s);
        });
        set_bandwidth_counters(state, static_cast<double>(n * (sizeof(float) + 2)), n, t);
    });
}

/// multi_norm over the layout's gradients (f32). bytes = input bytes; the partials
/// (one norm_stats per 8192 elements) and the finish kernel are not counted.
void bm_multi_norm(benchmark::State& state) {
    guarded(state, [&] {
        const model_layout& m = ws->layout;
        cudaStream_t s = *ws->stream;
        fill_random(ws->f32(0), m.total, 51, s);
        const std::vector<float*> grads = gradient_tensors(0);
        std::vector<kernels::read_piece> pieces;
        for (std::size_t t = 0; t < grads.size(); ++t) {
            pieces.push_back({grads[t], m.sizes[t]});
        }
        const kernels::multi_tensor_plan plan(pieces);
        plan_uploaded();
        cuda::device_buffer<double> out(2); // one norm_stats
        auto* stats = reinterpret_cast<kernels::norm_stats*>(out.data());
        const double t =
            time_launches(state, s, [&] { kernels::multi_norm(plan, dtype::f32, stats, s); });
        state.counters["tensors"] = static_cast<double>(plan.piece_count());
        set_bandwidth_counters(state, static_cast<double>(m.total * sizeof(float)), m.total, t);
    });
}

// ------------------------------------------------------------ optimizer steps

/// AdamW on f32 parameters, no master copy: p (array 0), g (1), m (2), v (3).
/// bytes = read p, g, m, v (16) + write p, m, v (12) = 28 per parameter.
void bm_adamw_f32(benchmark::State& state) {
    guarded(state, [&] {
        const std::size_t n = ws->elements;
        cudaStream_t s = *ws->stream;
        fill_random(ws->f32(0), n, 61, s);
        fill_random(ws->f32(1), n, 62, s, 1e-2f);
        fill_random(ws->f32(2), n, 63, s, 1e-3f);
        fill_random(ws->f32(3), n, 64, s, 1e-5f, true);
        kernels::shard_ref<float, float, float, 2> shard;
        shard.param = ws->f32(0);
        shard.grad = ws->f32(1);
        shard.master = nullptr;
        shard.state[0] = ws->f32(2);
        shard.state[1] = ws->f32(3);
        shard.count = n;
        const optim::adamw opt{};
        std::uint64_t step = 1;
        const double t = time_launches(state, s, [&] {
            kernels::optimizer_step<optim::adamw>(opt.prepare<float>(step++), shard, 1.0f, nullptr,
                                                  s);
        });
        set_bandwidth_counters(state, 28.0 * static_cast<double>(n), n, t);
    });
}

/// AdamW on bf16 parameters and gradients with f32 master weights: master (array
/// 0), m (1), v (2), param and grad (the two halves of array 3, as bf16).
/// bytes = read master 4 + grad 2 + m 4 + v 4, write master 4 + m 4 + v 4 +
/// param 2 = 28 per parameter: the bf16 parameter is only written, the master is
/// the value stepped.
void bm_adamw_bf16_master(benchmark::State& state) {
    guarded(state, [&] {
        const std::size_t n = ws->elements;
        cudaStream_t s = *ws->stream;
        fill_random(ws->f32(0), n, 71, s);
        fill_random(ws->f32(1), n, 73, s, 1e-3f);
        fill_random(ws->f32(2), n, 74, s, 1e-5f, true);
        fill_random(ws->bf16_at(3), n, 75, s);
        fill_random(ws->bf16_at(3, n), n, 72, s, 1e-2f);
        kernels::shard_ref<unison::bf16, unison::bf16, float, 2> shard;
        shard.param = ws->bf16_at(3);
        shard.grad = ws->bf16_at(3, n);
        shard.master = ws->f32(0);
        shard.state[0] = ws->f32(1);
        shard.state[1] = ws->f32(2);
        shard.count = n;
        const optim::adamw opt{};
        std::uint64_t step = 1;
        const double t = time_launches(state, s, [&] {
            kernels::optimizer_step<optim::adamw>(opt.prepare<float>(step++), shard, 1.0f, nullptr,
                                                  s);
        });
        set_bandwidth_counters(state, 28.0 * static_cast<double>(n), n, t);
    });
}

/// SGD with momentum 0.9 on f32 parameters: p (array 0), g (1), momentum (2).
/// bytes = read p, g, buf (12) + write p, buf (8) = 20 per parameter.
void bm_sgd_momentum_f32(benchmark::State& state) {
    guarded(state, [&] {
        const std::size_t n = ws->elements;
        cudaStream_t s = *ws->stream;
        fill_random(ws->f32(0), n, 81, s);
        fill_random(ws->f32(1), n, 82, s, 1e-2f);
        fill_random(ws->f32(2), n, 83, s, 1e-2f);
        kernels::shard_ref<float, float, float, 1> shard;
        shard.param = ws->f32(0);
        shard.grad = ws->f32(1);
        shard.master = nullptr;
        shard.state[0] = ws->f32(2);
        shard.count = n;
        optim::sgd opt;
        opt.lr = 1e-2;
        opt.momentum = 0.9;
        const auto c = opt.prepare<float>(1);
        const double t = time_launches(
            state, s, [&] { kernels::optimizer_step<optim::sgd>(c, shard, 1.0f, nullptr, s); });
        set_bandwidth_counters(state, 20.0 * static_cast<double>(n), n, t);
    });
}

// ------------------------------------------------------------ NCCL, one rank

#if UNISON_HAS_NCCL()

using bench_clock = std::chrono::steady_clock;

/// Calls per timed batch of the NCCL benchmarks.
constexpr int nccl_batch = 100;

/// The one-rank NCCL communicator (ncclCommInitAll over this device), made on first
/// use and destroyed by main after the benchmarks.
ncclComm_t one_rank_comm = nullptr;

ncclComm_t nccl_comm() {
    if (one_rank_comm == nullptr) {
        int dev = ws->device;
        UNISON_CHECK_NCCL(ncclCommInitAll(&one_rank_comm, 1, &dev), 0, "ncclCommInitAll");
    }
    return one_rank_comm;
}

void destroy_nccl_comm() {
    if (one_rank_comm != nullptr) {
        ncclCommDestroy(one_rank_comm);
        one_rank_comm = nullptr;
    }
}

/// The raw call: in-place ncclAllReduce of `count` floats, then a stream sync.
void raw_all_reduce(ncclComm_t comm, float* buf, std::size_t count, cudaStream_t s) {
    UNISON_CHECK_NCCL(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, s), 0,
                      "ncclAllReduce");
    check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

/// Seconds for `calls` calls of `call()`, by the host's clock.
template <class Call>
double wall_seconds(int calls, Call&& call) {
    const auto start = bench_clock::now();
    for (int i = 0; i < calls; ++i) {
        call();
    }
    return std::chrono::duration<double>(bench_clock::now() - start).count();
}

struct nccl_fixture {
    std::size_t count;
    cuda::device_buffer<float> buf;
    explicit nccl_fixture(std::size_t bytes)
        : count(std::max<std::size_t>(1, bytes / sizeof(float))), buf(count, ws->device) {
        fill_random(buf.data(), count, 91, *ws->stream);
        ws->sync();
    }
};

/// ncclAllReduce + cudaStreamSynchronize. Args: {bytes}.
void bm_nccl_raw(benchmark::State& state) {
    guarded(state, [&] {
        nccl_fixture f(static_cast<std::size_t>(state.range(0)));
        ncclComm_t comm = nccl_comm();
        cudaStream_t s = *ws->stream;
        const auto call = [&] { raw_all_reduce(comm, f.buf.data(), f.count, s); };
        wall_seconds(20, call); // warm-up
        double total = 0;
        while (state.KeepRunningBatch(nccl_batch)) {
            const double t = wall_seconds(nccl_batch, call);
            state.SetIterationTime(t);
            total += t;
        }
        state.counters["bytes"] = static_cast<double>(f.count * sizeof(float));
        if (state.iterations() > 0) {
            state.counters["us_per_call"] = total / static_cast<double>(state.iterations()) * 1e6;
        }
    });
}

/// unison's all_reduce through nccl_communicator over the same comm, stream and
/// buffer: blocking (`async` false: unison::all_reduce) or unison::all_reduce_async
/// then wait(). Each batch of unison calls follows a batch of raw calls, so both
/// are measured under the same conditions. Args: {bytes, check_matching}.
void bm_nccl_unison(benchmark::State& state, bool async) {
    guarded(state, [&] {
        nccl_fixture f(static_cast<std::size_t>(state.range(0)));
        ncclComm_t raw = nccl_comm();
        cudaStream_t s = *ws->stream;
        comm_options options{}; // the defaults, not the environment's
        options.check_matching = state.range(1) != 0;
        nccl_communicator comm(raw, s, ws->device, options);
        view<float> v = cuda::device_view(f.buf.data(), f.count, ws->device);
        const auto raw_call = [&] { raw_all_reduce(raw, f.buf.data(), f.count, s); };
        const auto unison_call = [&] {
            if (async) {
                nccl_request r = unison::all_reduce_async(comm, v);
                r.wait();
            } else {
                unison::all_reduce(comm, v);
            }
        };
        wall_seconds(20, raw_call); // warm-up
        wall_seconds(20, unison_call);
        double total = 0;
        double raw_total = 0;
        while (state.KeepRunningBatch(nccl_batch)) {
            raw_total += wall_seconds(nccl_batch, raw_call);
            const double t = wall_seconds(nccl_batch, unison_call);
            state.SetIterationTime(t);
            total += t;
        }
        state.counters["bytes"] = static_cast<double>(f.count * sizeof(float));
        if (state.iterations() > 0) {
            const double calls = static_cast<double>(state.iterations());
            state.counters["us_per_call"] = total / calls * 1e6;
            state.counters["raw_us_per_call"] = raw_total / calls * 1e6;
            state.counters["overhead_us"] = (total - raw_total) / calls * 1e6;
        }
    });
}

void register_nccl_benchmarks() {
    const std::vector<std::int64_t> sizes = {4, 4 << 10, 1 << 20};
    auto* raw = benchmark::RegisterBenchmark("nccl_1rank/raw_all_reduce", bm_nccl_raw);
    for (std::int64_t b : sizes) {
        raw->Arg(b);
    }
    raw->ArgName("bytes")->UseManualTime()->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark("nccl_1rank/unison_all_reduce", bm_nccl_unison, false)
        ->ArgsProduct({sizes, {0, 1}})
        ->ArgNames({"bytes", "check_matching"})
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark("nccl_1rank/unison_all_reduce_async_wait", bm_nccl_unison, true)
        ->ArgsProduct({sizes, {0, 1}})
        ->ArgNames({"bytes", "check_matching"})
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
}

#endif // UNISON_HAS_NCCL()

// ------------------------------------------------------------ registration and main

void register_kernel_benchmarks() {
    const auto reg = [](const char* name, auto fn, auto... args) {
        benchmark::RegisterBenchmark(name, fn, args...)
            ->UseManualTime()
            ->Unit(benchmark::kMillisecond);
    };
    reg("copy/float4_kernel", bm_copy_float4);
    reg("copy/cudaMemcpyAsync_d2d", bm_memcpy_d2d);
    reg("pack/f32_to_bf16/scale:0.125", bm_pack, dtype::bf16, 0.125);
    reg("pack/f32_to_f32/scale:0.125", bm_pack, dtype::f32, 0.125);
    reg("unpack/bf16_to_f32", bm_unpack, dtype::bf16, false);
    reg("unpack/bf16_to_f32/accumulate", bm_unpack, dtype::bf16, true);
    reg("unpack/f32_to_f32", bm_unpack, dtype::f32, false);
    reg("average_cast/f32_to_bf16", bm_average_cast);
    reg("multi_norm/f32", bm_multi_norm);
    reg("adamw/f32", bm_adamw_f32);
    reg("adamw/bf16_param_f32_master", bm_adamw_bf16_master);
    reg("sgd_momentum/f32", bm_sgd_momentum_f32);
}

/// Removes `--elements=N` from the arguments; returns N, or 0 when absent.
std::size_t take_elements_flag(std::vector<char*>& args) {
    std::size_t n = 0;
    for (auto it = args.begin(); it != args.end();) {
        const std::string_view a = *it;
        if (a.starts_with("--elements=")) {
            const std::string value(a.substr(std::string_view("--elements=").size()));
            char* end = nullptr;
            const unsigned long long v = std::strtoull(value.c_str(), &end, 10);
            if (end == value.c_str() || *end != '\0' || v == 0) {
                throw std::invalid_argument("--elements wants a positive integer, not '" + value +
                                            "'");
            }
            n = static_cast<std::size_t>(v);
            it = args.erase(it);
        } else {
            ++it;
        }
    }
    return n;
}

/// Google Benchmark's arguments with this suite's default minimum time (0.2 s per
/// benchmark) unless the command line sets one.
void add_default_min_time(std::vector<char*>& args) {
    static char default_min_time[] = "--benchmark_min_time=0.2";
    for (char* a : args) {
        if (std::string_view(a).starts_with("--benchmark_min_time")) {
            return;
        }
    }
    args.insert(args.begin() + 1, default_min_time);
}

std::size_t round_up(std::size_t n, std::size_t multiple) {
    return (n + multiple - 1) / multiple * multiple;
}

void add_context() {
    const auto mib_string = [](std::size_t bytes) {
        char b[64];
        std::snprintf(b, sizeof b, "%.1f MiB", static_cast<double>(bytes) / mib);
        return std::string(b);
    };
    int runtime = 0;
    int driver = 0;
    cudaRuntimeGetVersion(&runtime);
    cudaDriverGetVersion(&driver);
    benchmark::AddCustomContext("unison_version", unison::version_string);
    benchmark::AddCustomContext("gpu", "cuda:" + std::to_string(ws->device) + " " + ws->gpu_name);
    benchmark::AddCustomContext("cuda_runtime_driver",
                                std::to_string(runtime) + " / " + std::to_string(driver));
    benchmark::AddCustomContext("l2_cache", std::to_string(ws->l2_bytes) + " bytes (" +
                                                mib_string(ws->l2_bytes) + ")");
    benchmark::AddCustomContext("elements", std::to_string(ws->elements) + " per array (f32 " +
                                                mib_string(ws->elements * sizeof(float)) +
                                                ", bf16 " + mib_string(ws->elements * 2) + ")");
    const model_layout& m = ws->layout;
    benchmark::AddCustomContext(
        "pack_layout", std::to_string(m.layers) + " transformer layers, hidden " +
                           std::to_string(m.hidden) + ": " + std::to_string(m.sizes.size()) +
                           " tensors, " + std::to_string(m.total) + " elements");
    char copy[64];
    std::snprintf(copy, sizeof copy, "%.1f", ws->copy_bytes_per_second * 1e-9);
    benchmark::AddCustomContext("copy_GBps", std::string(copy) +
                                                 " (float4 copy kernel, f32 arrays of `elements`; "
                                                 "the denominator of vs_copy)");
    benchmark::AddCustomContext("counters",
                                "bytes: bytes per call the operation must move; GB/s: 1e9 B/s "
                                "from the mean event-timed call; vs_copy: GB/s / copy_GBps");
#if UNISON_HAS_NCCL()
    int nccl_version = 0;
    ncclGetVersion(&nccl_version);
    benchmark::AddCustomContext("nccl_version", std::to_string(nccl_version));
    benchmark::AddCustomContext("nccl_counters",
                                "host wall clock: us_per_call, raw_us_per_call (ncclAllReduce + "
                                "cudaStreamSynchronize), overhead_us = their difference");
#endif
}

int run(std::vector<char*> args) {
    int devices = 0;
    const cudaError_t rc = cudaGetDeviceCount(&devices);
    if (rc != cudaSuccess || devices == 0) {
        std::printf("SKIPPED: no CUDA device is visible; unison-kernels-gbench was compiled but "
                    "not run\n");
        if (rc != cudaSuccess) {
            std::fprintf(stderr, "(cudaGetDeviceCount: %s: %s)\n", cudaGetErrorName(rc),
                         cudaGetErrorString(rc));
        }
        return 0;
    }

    const std::size_t requested = take_elements_flag(args);
    workspace w;
    ws = &w;
    check_cuda(cudaGetDevice(&w.device), "cudaGetDevice");
    cudaDeviceProp prop{};
    check_cuda(cudaGetDeviceProperties(&prop, w.device), "cudaGetDeviceProperties");
    w.gpu_name = prop.name;
    int l2 = 0;
    check_cuda(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, w.device),
               "cudaDeviceGetAttribute(L2)");
    w.l2_bytes = static_cast<std::size_t>(l2);
    if (requested != 0) {
        w.elements = round_up(requested, 256);
    } else {
        // The smallest array is bf16: 2 bytes per element.
        const std::size_t min_bytes = std::max(4 * w.l2_bytes, 256 * mib);
        w.elements = round_up((min_bytes + 1) / 2, std::size_t{1} << 16);
    }
    w.layout = transformer_layout(w.elements);
    if (w.layout.total > w.elements) {
        throw std::invalid_argument("--elements=" + std::to_string(w.elements) +
                                    " is too small for one transformer layer (" +
                                    std::to_string(w.layout.total) + " elements)");
    }
    w.stream = std::make_unique<cuda::stream>();
    for (int k = 0; k < 4; ++k) {
        w.arrays.emplace_back(w.elements, w.device);
    }
    measure_copy_reference();

    add_context();
    register_kernel_benchmarks();
#if UNISON_HAS_NCCL()
    register_nccl_benchmarks();
#endif

    add_default_min_time(args);
    args.push_back(nullptr);
    int n = static_cast<int>(args.size()) - 1;
    benchmark::Initialize(&n, args.data());
    if (benchmark::ReportUnrecognizedArguments(n, args.data())) {
        return 2;
    }
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
#if UNISON_HAS_NCCL()
    destroy_nccl_comm();
#endif
    w.sync();
    ws = nullptr;
    return 0;
}

} // namespace
} // namespace unison::bench

int main(int argc, char** argv) {
    if (unison::bench::version_asked(argc, argv, "unison-kernels-gbench")) {
        return 0;
    }
    try {
        return unison::bench::run(std::vector<char*>(argv, argv + argc));
    } catch (const std::exception& e) {
        std::fprintf(stderr, "unison-kernels-gbench: %s\n", e.what());
        return 1;
    }
}
