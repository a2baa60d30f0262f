#!/usr/bin/env bash
# examples/fsdp_transformer against PyTorch FSDP2 (and optionally against another
# build of the example), run alternately on 2 ranks; prints each run's time per
# step after the first and each rank's peak resident memory, then the medians.
#
#   bash bench/peers/fsdp_transformer_vs_fsdp2.sh BUILD/examples/fsdp_transformer/fsdp_transformer
#   ROUNDS=3 PYTHON=venv/bin/python OTHER=path/to/older/fsdp_transformer \
#       bash bench/peers/fsdp_transformer_vs_fsdp2.sh BUILD/.../fsdp_transformer
#
# PYTHON must have torch 2.x (FSDP2's fully_shard; not needed by unison itself):
#   python3 -m venv venv && venv/bin/pip install torch
# Every run: 2 ranks, one LibTorch thread each, the example's default model
# (10.7 M parameters) and batch, STEPS steps (21). Also runs each side's compute
# alone on one rank's share of the batch: the example on 1 rank (unison's engine
# at world size 1 moves nothing) and the PyTorch model without FSDP (--plain).
set -euo pipefail

unison_binary=${1:?usage: fsdp_transformer_vs_fsdp2.sh PATH/TO/fsdp_transformer}
other=${OTHER:-}
python=${PYTHON:-python3}
rounds=${ROUNDS:-3}
steps=${STEPS:-21}
here=$(cd "$(dirname "$0")" && pwd)
launch=(mpiexec --oversubscribe)
if [[ $(id -u) == 0 ]]; then
    launch+=(--allow-run-as-root)
fi
if [[ ! -x $unison_binary ]]; then
    echo "fsdp_transformer_vs_fsdp2.sh: $unison_binary is not an executable (build the" \
        "fsdp_transformer example first)" >&2
    exit 2
fi
if ! "$python" -c 'from torch.distributed.fsdp import fully_shard' >/dev/null 2>&1; then
    echo "fsdp_transformer_vs_fsdp2.sh: $python has no torch 2 with FSDP2" \
        "(torch.distributed.fsdp.fully_shard), which the PyTorch side needs." >&2
    echo "  python3 -m venv venv && venv/bin/pip install torch" >&2
    echo "  PYTHON=venv/bin/python bash $0 $unison_binary" >&2
    exit 2
fi
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT

# One run of a C++ build: "s/step rss_rank0_MiB rss_rank1_MiB".
run_cpp() { # name ranks batch binary [options]
    local out="$log/$1.$RANDOM"
    OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader} "${launch[@]}" -n "$2" \
        /usr/bin/time -f 'peak_rss_kib %M' "$4" --steps "$steps" --sample 1 \
        --batch "$3" "${@:5}" \
        >"$out" 2>&1 || true # (a short run may fail the example's loss check)
    grep -q '^time:' "$out" || { cat "$out" >&2; return 1; }
    awk '/^time:/ {t = $2} /^peak_rss_kib/ {r = r " " $2 / 1024} END {print t r}' "$out"
}
run_torch() { # name [--plain]
    local out="$log/$1.$RANDOM"
    "$python" "$here/torch_fsdp_transformer.py" --steps "$steps" "${@:2}" >"$out" 2>&1 ||
        { cat "$out" >&2; return 1; }
    awk '/^rank [0-9]+: time/ {if (t == "") t = $4; r = r " " $13} END {print t r}' "$out"
    # each process's resident memory before the model: PyTorch's own floor
    awk '/^rank [0-9]+: time/ {f = $18} END {print "torch-floor 0 " f}' \
        "$out" >>"$log/floors"
}

results="$log/results"
# One row of results: "name fields..."; a run that failed stops the script.
row() { # name command...
    local got
    got=$("${@:2}") || { echo "fsdp_transformer_vs_fsdp2.sh: the $1 run failed" >&2; exit 1; }
    echo "$1 $got" | tee -a "$results"
}
for ((round = 1; round <= rounds; ++round)); do
    row unison run_cpp unison 2 32 "$unison_binary"
    if [[ -n $other ]]; then
        row other run_cpp other 2 32 "$other"
    fi
    row fsdp2 run_torch fsdp2
    row unison-1-rank run_cpp unison1 1 16 "$unison_binary"
    row torch-plain run_torch plain --plain
done
# The process's own floor (LibTorch, MPI, the example's text): a model of 30 k
# parameters; PyTorch's floor is what each of its processes held before the model.
steps=2 row unison-floor run_cpp floor 2 2 "$unison_binary" --layers 1 --d-model 32 --heads 2
cat "$log/floors" >>"$results"

echo
echo "medians over $rounds rounds ($steps steps each; time: s/step after the first, rank 0;"
echo "peak RSS: MiB, the larger of the ranks)"
python3 - "$results" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, *vals = line.split()
    rows.setdefault(name, []).append((float(vals[0]), max(map(float, vals[1:]))))
for name, runs in rows.items():
    t = statistics.median(r[0] for r in runs)
    m = statistics.median(r[1] for r in runs)
    print(f"{name:14s} {t:7.3f} s/step   peak RSS {m:7.1f} MiB   ({len(runs)} runs)")
EOF
