#!/usr/bin/env bash
# The unit tests (tests/unit/*.cpp but LibTorch's and Eigen's) built against LLVM's
# libc++ and run: the standard library of macOS and of LLVM toolchains, which lacks
# parts of C++20 that libstdc++ has (before LLVM 20, std::from_chars for floating
# types), so that unison takes other paths there (checkpoint_parse_double_portable)
# that only this run executes. CTest's other_standard_library_units.
# Usage: libcxx_units.sh CLANG++ PROJECT_VERSION BUILD_DIRECTORY
set -euo pipefail
cxx=$1 version=$2 out=$3
tests=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
flags=(-std=c++20 -stdlib=libc++ -O1 -Wall -Wextra -I "$tests/../include" -I "$tests"
       -I "$tests/../examples/common" "-DUNISON_TEST_DATA_DIR=\"$tests/data\""
       "-DUNISON_TEST_PROJECT_VERSION=\"$version\"")
mkdir -p "$out"
objects=()
for source in "$tests"/main.cpp "$tests"/unit/*.cpp; do
    name=$(basename "$source" .cpp)
    case $name in torch | eigen) continue ;; esac
    "$cxx" "${flags[@]}" -c "$source" -o "$out/$name.o"
    objects+=("$out/$name.o")
done
"$cxx" -stdlib=libc++ "${objects[@]}" -pthread -o "$out/unison-unit-tests-libcxx"
"$out/unison-unit-tests-libcxx"
