#!/usr/bin/env bash
# The main job: builds unison-bench and the ddp_mlp example, then runs the
# all-reduce bandwidth benchmark (8 B to 64 MB) on the thread backend with 2 ranks
# and on the MPI backend with 2 processes, each with its baselines, one DDP gradient
# synchronization of a 200-tensor model on both, and DDP training of the example
# MLP on 4 threads and on 2 MPI processes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh

cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release -DUNISON_BUILD_TESTS=OFF >/dev/null
cmake --build build/release -j "$(nproc)" --target unison-bench unison-ddp-bench ddp_mlp

bench=build/release/bench/unison-bench
ddp_bench=build/release/bench/unison-ddp-bench
example=build/release/examples/ddp_mlp/ddp_mlp

echo "== all_reduce, thread backend, 2 ranks"
"$bench" -B thread -t 2 -b 8 -e 64M -f 2 --baseline
echo
echo "== all_reduce, MPI backend, 2 processes"
bash scripts/mpiexec.sh -n 2 "$bench" -B mpi -b 8 -e 64M -f 2 --baseline
echo
echo "== one DDP gradient synchronization (200 tensors, 25.9 M floats), thread backend, 2 ranks"
"$ddp_bench" -B thread -m bucketed,bucketed-view,per-tensor,flat -n 10 -w 3
echo
echo "== the same, MPI backend, 2 processes"
bash scripts/mpiexec.sh -n 2 "$ddp_bench" -B mpi -m bucketed,bucketed-view,per-tensor,flat -n 10 -w 3
echo
echo "== example: ddp_mlp, 4 threads"
"$example" -t 4 --steps 100 --log-every 10
echo
echo "== example: ddp_mlp, 2 MPI processes"
bash scripts/mpiexec.sh -n 2 "$example" --steps 100 --log-every 10
