#pragma once

/// \file
/// The Google Benchmark programs' command line: `--version` ("NAME (unison
/// X.Y.Z)" on stdout, as every other program of unison answers), which Google
/// Benchmark's flag parser does not know, and an unknown flag named with exit
/// status 2.

#include "launch_rank.hpp"

#include <unison/version.hpp>

#include <benchmark/benchmark.h>

#include <cstdio>
#include <string_view>

namespace unison::bench {

/// True, after printing the version (on the first rank of a launch), when the
/// command line asks for it; the program then exits 0.
inline bool version_asked(int argc, char** argv, const char* name) {
    for (int i = 1; i < argc; ++i) {
        if (argv[i] != nullptr && std::string_view(argv[i]) == "--version") {
            if (launch_rank() == 0) {
                std::printf("%s (unison %s)\n", name, unison::version_string);
            }
            return true;
        }
    }
    return false;
}

/// A main for the registered benchmarks: --version, Google Benchmark's flags, an
/// unknown flag refused (exit 2), the run.
inline int gbench_main(int argc, char** argv, const char* name) {
    if (version_asked(argc, argv, name)) {
        return 0;
    }
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) {
        return 2;
    }
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}

} // namespace unison::bench
