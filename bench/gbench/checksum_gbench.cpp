/// \file
/// Google Benchmark of the checksums of checkpoint files (`checkpoint::checksum`):
/// FNV-1a 64 (format version 1) and XXH3-64 (version 2) over 256 MiB, against
/// `memcpy` of the same bytes in the same run.
///
///     unison-checksum-gbench
///
/// `bytes_per_second` counts the bytes hashed (memcpy's: the bytes copied, so a
/// hash at memory speed reads about twice memcpy's figure).

#include "gbench_main.hpp"

#include <unison/checkpoint/metadata.hpp>

#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr std::size_t bytes = std::size_t{256} << 20;

std::vector<std::byte> random_bytes() {
    std::vector<std::byte> v(bytes);
    std::uint64_t x = 0x9e3779b97f4a7c15ull;
    for (std::byte& b : v) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b = static_cast<std::byte>(x);
    }
    return v;
}

void checksum(benchmark::State& state, std::uint32_t version) {
    const std::vector<std::byte> data = random_bytes();
    for (auto _ : state) {
        benchmark::DoNotOptimize(unison::checkpoint::checksum(version, data.data(), data.size()));
    }
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
}

void fnv1a64_v1(benchmark::State& s) {
    checksum(s, 1);
}
void xxh3_64_v2(benchmark::State& s) {
    checksum(s, 2);
}

void copy(benchmark::State& state) {
    const std::vector<std::byte> src = random_bytes();
    std::vector<std::byte> dst(bytes);
    for (auto _ : state) {
        std::memcpy(dst.data(), src.data(), bytes);
        benchmark::DoNotOptimize(dst.data());
        benchmark::ClobberMemory();
    }
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
}

} // namespace

BENCHMARK(fnv1a64_v1)->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(xxh3_64_v2)->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(copy)->Unit(benchmark::kMillisecond)->MinTime(1.0);

int main(int argc, char** argv) {
    return unison::bench::gbench_main(argc, argv, "unison-checksum-gbench");
}
