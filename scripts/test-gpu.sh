#!/usr/bin/env bash
# The GPU suite, for a machine with a CUDA GPU: builds the CUDA and NCCL tests for
# this machine's GPU, runs them (here a missing GPU is an error, not a skip), then
# runs the GPU tests again under compute-sanitizer: memcheck over everything and
# racecheck over the kernels (the block reductions use shared memory).
# CI compiles the same tests through scripts/test.sh and skips them without a GPU.
#   UNISON_CUDA_ARCH   CMAKE_CUDA_ARCHITECTURES to build for (default: native)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh

if ! nvidia-smi -L; then
    echo "test-gpu: no CUDA GPU is visible (nvidia-smi failed); run scripts/test.sh instead" >&2
    exit 1
fi

arch=${UNISON_CUDA_ARCH:-native}
cmake -S . -B build/gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" \
      -DUNISON_BUILD_EXAMPLES=OFF -DUNISON_BUILD_BENCH=OFF >/dev/null
cmake --build build/gpu -j "$(nproc)" --target unison-cuda-tests unison-nccl-tests

tests=build/gpu/tests/unison-cuda-tests
echo "== GPU tests"
"$tests"
echo "== NCCL backend tests"
build/gpu/tests/unison-nccl-tests

sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
# NCCL probes, inside ncclCommInitAll, kernels it carries only for other GPUs
# (cudaFuncGetAttributes: "no kernel image"), and handles the errors itself; the
# NCCL case runs with API errors unreported so that those do not fail the check.
echo "== compute-sanitizer memcheck (every GPU test)"
"$sanitizer" --tool memcheck --leak-check full --error-exitcode 1 "$tests" -tce='*NCCL*'
"$sanitizer" --tool memcheck --report-api-errors no --error-exitcode 1 "$tests" -tc='*NCCL*'
echo "== compute-sanitizer racecheck (the kernels)"
"$sanitizer" --tool racecheck --error-exitcode 1 "$tests" -tc='kernels*'
echo "test-gpu: all passed"
