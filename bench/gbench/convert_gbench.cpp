/// \file
/// Google Benchmark of the host scale-and-cast copies that pack and unpack DDP
/// buckets and cast the sharding engine's flat buffers (`detail::convert_scale`):
/// float to and from half and bfloat16, plain and accumulating, against `memcpy`
/// of the same bytes in the same run.
///
///     unison-convert-gbench                    # every pair, 64 MiB of floats
///     unison-convert-gbench --benchmark_filter=bf16
///
/// `bytes_per_second` counts what the copy must move: the source read and the
/// destination written (and read, when accumulating). Arrays are 16 Mi elements,
/// past every cache of the machines this runs on.

#include "gbench_main.hpp"

#include <unison/core.hpp>
#include <unison/core/detail/convert.hpp>

#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstring>
#include <vector>

namespace {

constexpr std::size_t elements = std::size_t{16} << 20;

template <class D, class S>
void convert(benchmark::State& state, bool accumulate) {
    std::vector<S> src(elements, S(0.75f));
    std::vector<D> dst(elements, D(0.25f));
    for (auto _ : state) {
        unison::detail::convert_scale(dst.data(), unison::dtype_of<D>, src.data(),
                                      unison::dtype_of<S>, elements, 0.5, accumulate);
        benchmark::DoNotOptimize(dst.data());
        benchmark::ClobberMemory();
    }
    const std::size_t bytes = elements * (sizeof(S) + sizeof(D) * (accumulate ? 2 : 1));
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
}

void copy(benchmark::State& state) {
    std::vector<float> src(elements, 0.75f), dst(elements, 0.25f);
    for (auto _ : state) {
        std::memcpy(dst.data(), src.data(), elements * sizeof(float));
        benchmark::DoNotOptimize(dst.data());
        benchmark::ClobberMemory();
    }
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * elements * 8));
}

using unison::bf16;
using unison::half;

void float_to_bf16(benchmark::State& s) {
    convert<bf16, float>(s, false);
}
void float_to_half(benchmark::State& s) {
    convert<half, float>(s, false);
}
void bf16_to_float(benchmark::State& s) {
    convert<float, bf16>(s, false);
}
void half_to_float(benchmark::State& s) {
    convert<float, half>(s, false);
}
void bf16_to_float_accumulate(benchmark::State& s) {
    convert<float, bf16>(s, true);
}
void half_to_float_accumulate(benchmark::State& s) {
    convert<float, half>(s, true);
}
void float_to_float_scaled(benchmark::State& s) {
    convert<float, float>(s, false);
}

BENCHMARK(copy)->Name("memcpy_float")->Unit(benchmark::kMillisecond);
BENCHMARK(float_to_float_scaled)->Unit(benchmark::kMillisecond);
BENCHMARK(float_to_bf16)->Unit(benchmark::kMillisecond);
BENCHMARK(float_to_half)->Unit(benchmark::kMillisecond);
BENCHMARK(bf16_to_float)->Unit(benchmark::kMillisecond);
BENCHMARK(half_to_float)->Unit(benchmark::kMillisecond);
BENCHMARK(bf16_to_float_accumulate)->Unit(benchmark::kMillisecond);
BENCHMARK(half_to_float_accumulate)->Unit(benchmark::kMillisecond);

} // namespace

int main(int argc, char** argv) {
    return unison::bench::gbench_main(argc, argv, "unison-convert-gbench");
}
