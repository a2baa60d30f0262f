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

echo "== build: Release, every backend found on this machine"
cmake -S . -B build/test -DCMAKE_BUILD_TYPE=Release
cmake --build build/test -j "$jobs"
ctest --test-dir build/test --output-on-failure --timeout 900

echo "== MPI backend under MPICH: its suites, fault tests, examples and benchmark"
# Open MPI stays the default MPI (build/test above); MPICH gets a build of its own,
# with its compiler wrapper and its mpiexec (Hydra), and without the GPU and
# LibTorch parts, which do not depend on the MPI.
cmake -S . -B build/mpich -DCMAKE_BUILD_TYPE=Release \
    -DMPI_CXX_COMPILER=/usr/bin/mpicxx.mpich -DMPI_C_COMPILER=/usr/bin/mpicc.mpich \
    -DMPIEXEC_EXECUTABLE=/usr/bin/mpiexec.mpich \
    -DUNISON_ENABLE_CUDA=OFF -DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON >/dev/null
cmake --build build/mpich -j "$jobs" \
    --target unison-mpi-tests unison-mpi-dead-peer ddp_mlp zero_adamw unison-bench
ctest --test-dir build/mpich --output-on-failure --timeout 900 \
    -R '^(mpi_np|fault_mpi_|example_(ddp_mlp|zero_adamw)_mpi$|example_ddp_mlp_torchrun|bench_.*_mpi)'

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
