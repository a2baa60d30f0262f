#!/usr/bin/env bash
# The main job: builds unison-bench and the ddp_mlp example, then runs the
# all-reduce bandwidth benchmark (8 B to 64 MB) on the thread backend with 2 ranks
# and on the MPI backend with 2 processes, each with its baselines (the runs'
# nccl-tests JSON files and their bus bandwidth plot go to build/release/), one DDP
# gradient synchronization of a 200-tensor model on both, per-rank memory and
# traffic of every ZeRO/FSDP sharding of that model, DDP training of the example MLP
# on 4 threads and on 2 MPI processes, and ZeRO-3 training saved at 4 ranks and
# resumed at 2.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh

cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release -DUNISON_BUILD_TESTS=OFF >/dev/null
cmake --build build/release -j "$(nproc)" --target unison-bench unison-ddp-bench unison-zero-bench ddp_mlp zero_adamw

bench=build/release/bench/unison-bench
ddp_bench=build/release/bench/unison-ddp-bench
zero_bench=build/release/bench/unison-zero-bench
example=build/release/examples/ddp_mlp/ddp_mlp
zero_example=build/release/examples/zero_adamw/zero_adamw

# -J never overwrites a file (nccl-tests' rule), so the last run's files go first.
out=build/release
rm -f "$out"/busbw-thread.json* "$out"/busbw-mpi.json* "$out"/busbw-2-ranks.png
echo "== all_reduce, thread backend, 2 ranks"
"$bench" -B thread -t 2 -b 8 -e 64M -f 2 --baseline -J "$out/busbw-thread.json"
echo
echo "== all_reduce, MPI backend, 2 processes"
bash scripts/mpiexec.sh -n 2 "$bench" -B mpi -b 8 -e 64M -f 2 --baseline -J "$out/busbw-mpi.json"
echo
echo "== bus bandwidth plot of both runs and raw MPI: $out/busbw-2-ranks.png"
python=python3 # the one with Debian's python3-matplotlib where python3 is another
python3 -c 'import matplotlib' 2>/dev/null || python=/usr/bin/python3
"$python" bench/bandwidth/plot_busbw.py "$out/busbw-thread.json:unison, thread backend" \
    "$out/busbw-mpi.json:unison, MPI backend" --baseline raw-mpi -o "$out/busbw-2-ranks.png"
echo
echo "== one DDP gradient synchronization (200 tensors, 25.9 M floats), thread backend, 2 ranks"
"$ddp_bench" -B thread -m bucketed,bucketed-packing,bucketed-view,per-tensor,flat -n 10 -w 3
echo
echo "== the same, MPI backend, 2 processes"
bash scripts/mpiexec.sh -n 2 "$ddp_bench" -B mpi -m bucketed,bucketed-view,per-tensor,flat -n 10 -w 3
echo
echo "== ZeRO / FSDP: per-rank model state and per-step traffic of the same model, thread backend"
"$zero_bench" -r 2,4 -n 3
echo
echo "== example: ddp_mlp, 4 threads"
"$example" -t 4 --steps 100 --log-every 10
echo
echo "== example: ddp_mlp, 2 MPI processes"
bash scripts/mpiexec.sh -n 2 "$example" --steps 100 --log-every 10
echo
echo "== example: zero_adamw, ZeRO-3 on 4 threads, checkpoint, resumed on 2 MPI processes"
checkpoint=build/release/zero_adamw_checkpoint
rm -rf "$checkpoint"
"$zero_example" -t 4 --steps 60 --log-every 20 --save "$checkpoint"
bash scripts/mpiexec.sh -n 2 "$zero_example" --steps 120 --log-every 20 --resume "$checkpoint"
