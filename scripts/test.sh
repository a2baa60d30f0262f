#!/usr/bin/env bash
# The test command: installs what it needs, checks formatting, builds everything
# (thread, MPI, and NCCL where the CUDA toolkit is found; tests, benchmarks,
# examples) and runs every test, then runs the thread-backend tests again under
# AddressSanitizer+UndefinedBehaviorSanitizer and under ThreadSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh

jobs=$(nproc)
echo "== format check (.clang-format)"
git ls-files '*.hpp' '*.cpp' '*.cuh' '*.cu' | xargs clang-format --dry-run -Werror

echo "== build: Release, every backend found on this machine"
cmake -S . -B build/test -DCMAKE_BUILD_TYPE=Release
cmake --build build/test -j "$jobs"
ctest --test-dir build/test --output-on-failure --timeout 900

echo "== thread backend under ASan+UBSan"
cmake --preset asan >/dev/null
cmake --build --preset asan -j "$jobs" --target unison-tests
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build/asan --output-on-failure -L thread --timeout 900

echo "== thread backend under TSan"
cmake --preset tsan >/dev/null
cmake --build --preset tsan -j "$jobs" --target unison-tests
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    ctest --test-dir build/tsan --output-on-failure -L thread --timeout 1500
