#!/usr/bin/env bash
# The test command: installs what it needs, checks formatting, builds everything
# (thread, MPI, Gloo, and NCCL where the CUDA toolkit is found; tests, benchmarks,
# examples) but the thread-backend tests and runs every test, then the MPI tests,
# examples and benchmark again built against MPICH, then the thread-backend tests
# (unison-tests) under AddressSanitizer+UndefinedBehaviorSanitizer and under
# ThreadSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh

jobs=$(nproc)
echo "== format check (.clang-format)"
git ls-files '*.hpp' '*.cpp' '*.cuh' '*.cu' | xargs clang-format --dry-run -Werror

# Compile time is most of this script's time on a 2-core machine, so the main build
# differs from a default Release build (-O3 everywhere, every test) in three ways:
# - C++ at -O1: the test suites instantiate every engine on every backend, and
#   compile in four fifths of -O2's time and two thirds of -O3's; the thread-backend
#   tests run under the sanitizers below at -O1 too. scripts/bench.sh measures speed
#   in a -O3 build of its own.
# - The host half of the .cu tests and benchmarks at -O0: without a GPU they only
#   compile here. nvcc's -O sets the host compiler's level only; device code is
#   optimized (ptxas -O3) either way.
# - Without unison-tests (unit, thread and rendezvous tests): the two sanitizer
#   builds below build and run it, and would otherwise be its second and third build.
#   And the GPU suites without the device-only thread fixture, which NCCL's covers
#   where the GPU tests only compile; and the Gloo tests without the sharded suites
#   that check only the engines' own logic (tests/CMakeLists.txt).
echo "== build: Release (-O1; .cu host code -O0), every backend found on this machine"
cmake -S . -B build/test -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" \
    -DCMAKE_CUDA_FLAGS_RELEASE="-Xcompiler=-O0 -DNDEBUG" -DUNISON_TEST_THREAD=OFF \
    -DUNISON_TEST_GPU_DEVICE_ONLY=OFF -DUNISON_TEST_GLOO_ENGINE_LOGIC=OFF
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
# The DDP and sharded suites are left out: the engines are the same code over either
# MPI, and ran on Open MPI above.
cmake -S . -B build/mpich -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" \
    -DUNISON_TEST_MPI_ENGINES=OFF \
    -DMPI_CXX_COMPILER=/usr/bin/mpicxx.mpich -DMPI_C_COMPILER=/usr/bin/mpicc.mpich \
    -DMPIEXEC_EXECUTABLE=/usr/bin/mpiexec.mpich \
    -DUNISON_ENABLE_CUDA=OFF -DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON >/dev/null
cmake --build build/mpich -j "$jobs" \
    --target unison-mpi-tests unison-mpi-dead-peer unison-mpi-failed-call unison-mpi-unwinding \
    ddp_mlp zero_adamw unison-bench
ctest --test-dir build/mpich --output-on-failure --timeout 900 \
    -R '^(mpi_np|fault_mpi_|example_(ddp_mlp|zero_adamw)_mpi$|example_ddp_mlp_torchrun|bench_.*_mpi)'

# The sanitizer builds with line tables only (-g1): their reports name files and
# lines as with -g, and the compile takes a tenth less time. ASan+UBSan through
# Clang, which instruments the test suites in three fifths of GCC's time, and so
# the thread-backend tests run compiled by a second compiler; without LibTorch,
# whose 1.13 headers Clang 14 rejects in C++20 (std::vector of an incomplete
# c10::IValue). TSan through GCC, with the LibTorch adapter's unit test. Each suite's
# bound is UNISON_TEST_TIMEOUT (a test's TIMEOUT property wins over ctest --timeout):
# 20 minutes, about four times what either takes on a 2-core machine.
echo "== thread backend under ASan+UBSan (Clang), the timeline check, an MPI fault job"
cmake --preset asan -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
    -DUNISON_TEST_TIMEOUT=1200 -DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON >/dev/null
cmake --build --preset asan -j "$jobs" --target unison-tests unison-mpi-failed-call
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build/asan --output-on-failure -L '^(thread|timeline)$'
# The MPI job whose calls fail mid-collective: a failed call freed while MPI still
# receives into it is a heap-use-after-free that only ASan sees (the ranks inherit
# ASAN_OPTIONS from mpiexec). No leak check: Open MPI leaks by design, and the
# failed calls are leaked on purpose.
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build/asan --output-on-failure -R '^fault_mpi_failed_call_np'

echo "== thread backend under TSan (GCC)"
cmake --preset tsan -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DUNISON_TEST_TIMEOUT=1200 >/dev/null
cmake --build --preset tsan -j "$jobs" --target unison-tests
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    ctest --test-dir build/tsan --output-on-failure -L thread
