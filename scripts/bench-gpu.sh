#!/usr/bin/env bash
# The GPU benchmarks, for a machine with a CUDA GPU (docs/performance.md, "CUDA
# kernels"): builds for this machine's GPU, prints the GPU, runs the kernel suite
# (each kernel's bytes/s over a copy kernel's in the same run, and NCCL's per-call
# overhead against raw ncclAllReduce at one rank), the all-reduce sweep on the NCCL
# backend with its baseline, and the PyTorch peer when torch with CUDA is importable.
#   UNISON_CUDA_ARCH   CMAKE_CUDA_ARCHITECTURES to build for (default: native)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh

if ! nvidia-smi -L; then
    echo "bench-gpu: no CUDA GPU is visible (nvidia-smi failed)" >&2
    exit 1
fi
arch=${UNISON_CUDA_ARCH:-native}
cmake -S . -B build/gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" \
      -DUNISON_BUILD_TESTS=OFF -DUNISON_BUILD_EXAMPLES=OFF >/dev/null
cmake --build build/gpu -j "$(nproc)" --target unison-kernels-gbench unison-bench

nvidia-smi --query-gpu=name,memory.total,clocks.max.memory,driver_version --format=csv
echo "== kernels vs a copy kernel (CUDA events), NCCL per-call overhead at 1 rank"
build/gpu/bench/unison-kernels-gbench --benchmark_counters_tabular=true --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true
echo "== all_reduce, NCCL backend, 1 GPU"
bash scripts/mpiexec.sh -n 1 build/gpu/bench/unison-bench -B nccl -b 8 -e 256M -f 2
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "== PyTorch peer: AdamW(fused=True), foreach, copy"
    python3 bench/peers/torch_kernels.py
else
    echo "(torch with CUDA is not importable here: bench/peers/torch_kernels.py skipped)"
fi
