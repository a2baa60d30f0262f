#!/usr/bin/env bash
# The test command: installs what it needs, checks formatting, builds everything
# (thread, MPI, and NCCL where the CUDA toolkit is found; tests, benchmarks,
# examples) and runs every test, then the MPI tests, examples and benchmark again
# built against MPICH, then the thread-backend tests again under
# AddressSanitizer+UndefinedBehaviorSanitizer and under ThreadSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh

jobs=$(nproc)
echo "== format check (.clang-format)"
git ls-files '*.hpp' '*.cpp' '*.cuh' '*.cu' | xargs clang-format --dry-run -Werror

# Compile time is most of this script's time on a 2-core machine, so two flags differ
# from a default Release build (-O3 everywhere):
# - C++ at -O2, the level most distributions and RelWithDebInfo builds use: a fifth
#   less compile time for the test suites, which instantiate every engine per backend.
#   scripts/bench.sh measures speed in a -O3 build of its own.
# - The host half of the .cu tests and benchmarks at -O1: without a GPU they only
#   compile here, in a third of -O3's time. nvcc's -O sets the host compiler's level
#   only; device code is optimized (ptxas -O3) either way.
echo "== build: Release (-O2; .cu host code -O1), every backend found on this machine"
cmake -S . -B build/test -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" \
    -DCMAKE_CUDA_FLAGS_RELEASE="-Xcompiler=-O1 -DNDEBUG"
cmake --build build/test -j "$jobs"
# The tests that are builds of their own (the packaging consumers, the examples copied
# alone, the compile-fail cases, the other compilers) run one compiler each: they go
# side by side, one per core. The rest run one at a time, since the MPI, Gloo and
# thread tests each use every core and some of them time calls.
builds='^(packaging|compile_fail|compilers)$'
ctest --test-dir build/test --output-on-failure --timeout 900 -j "$jobs" -L "$builds"
ctest --test-dir build/test --output-on-failure --timeout 900 -LE "$builds"

echo "== MPI backend under MPICH: its suites, fault tests, examples and benchmark"
# Open MPI stays the default MPI (build/test above); MPICH gets a build of its own,
# with its compiler wrapper and its mpiexec (Hydra), and without the GPU and
# LibTorch parts, which do not depend on the MPI.
cmake -S . -B build/mpich -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" \
    -DMPI_CXX_COMPILER=/usr/bin/mpicxx.mpich -DMPI_C_COMPILER=/usr/bin/mpicc.mpich \
    -DMPIEXEC_EXECUTABLE=/usr/bin/mpiexec.mpich \
    -DUNISON_ENABLE_CUDA=OFF -DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON >/dev/null
cmake --build build/mpich -j "$jobs" \
    --target unison-mpi-tests unison-mpi-dead-peer ddp_mlp zero_adamw unison-bench
ctest --test-dir build/mpich --output-on-failure --timeout 900 \
    -R '^(mpi_np|fault_mpi_|example_(ddp_mlp|zero_adamw)_mpi$|example_ddp_mlp_torchrun|bench_.*_mpi)'

# The sanitizer builds with line tables only (-g1): their reports name files and
# lines as with -g, and the compile takes a tenth less time.
echo "== thread backend under ASan+UBSan"
cmake --preset asan -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" >/dev/null
cmake --build --preset asan -j "$jobs" --target unison-tests
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build/asan --output-on-failure -L thread --timeout 900

echo "== thread backend under TSan"
cmake --preset tsan -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" >/dev/null
cmake --build --preset tsan -j "$jobs" --target unison-tests
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    ctest --test-dir build/tsan --output-on-failure -L thread --timeout 1500
