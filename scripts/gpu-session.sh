#!/usr/bin/env bash
# One device call's worth of GPU checks, each stage bounded, logs under $OUT/logs
# (at most 8 files come back from a lent machine). Run from the project's root on
# the GPU machine, after building here:
#
#   bash ../shared/gpu/bundle.sh && bash scripts/gpu-torch-bundle.sh
#   bash scripts/gpu-nccl-bench-bundle.sh        # optional: unison-bench -B nccl
#   (device) bash scripts/gpu-session.sh [stage...]
#
# Stages, in this order unless named: tests torch bench nccl-bench memcheck
# racecheck. Each has its own time bound, so that a slow sanitizer cannot starve the
# stages after it; the bounds add up to 540 s, so that every stage fits one device
# call of 600 s. memcheck runs unison's GPU tests with every CUDA API error
# reported, except the NCCL cases: NCCL probes kernels that a system NCCL may not
# carry for this GPU (cudaFuncGetAttributes: "no kernel image"), which is NCCL's own
# and handled there; those run under memcheck with API errors off. memcheck leaves
# out the suites' training, accumulation and loss normalization cases: they take
# the device paths the other cases take, for 20 steps each, which under the
# sanitizer would not fit a lent machine's time.
# Prints a summary last (a lent machine's reply carries only the end of the output).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${OUT:-/tmp/gpu-session}
export LOGS=$out/logs
mkdir -p "$LOGS"
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(tests torch bench nccl-bench memcheck racecheck)
summary=()
note() { summary+=("$*"); }

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -1

# bounded seconds name command...: runs it for at most `seconds`, notes its exit.
# The stages that run.sh drives write their own logs; the others are teed into
# $LOGS/<name>.log.
bounded() {
    local limit=$1 name=$2; shift 2
    local t0=$SECONDS rc
    case $name in
        tests|bench) timeout -k 5 "$limit" "$@"; rc=$? ;;
        *) timeout -k 5 "$limit" "$@" 2>&1 | tee "$LOGS/$name.log"; rc=${PIPESTATUS[0]} ;;
    esac
    note "$name: exit $rc in $((SECONDS - t0)) s$([ "$rc" -eq 124 ] && echo " (timed out at $limit s)")"
}
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
tests_bin=.gpu/bin/unison-cuda-tests

for s in "${stages[@]}"; do
    case $s in
        tests) bounded 150 tests bash .gpu/run.sh tests --duration=true ;;
        torch)
            if [ -f .gpu/torch/run.sh ]; then
                bounded 60 torch-tests bash .gpu/torch/run.sh --duration=true
            else note "torch: not bundled (scripts/gpu-torch-bundle.sh)"; fi ;;
        bench) bounded 80 bench bash .gpu/run.sh bench ;;
        nccl-bench)
            if [ -f .gpu/nccl-bench/run.sh ]; then
                bounded 30 nccl-bench bash .gpu/nccl-bench/run.sh
            else note "nccl-bench: not bundled (scripts/gpu-nccl-bench-bundle.sh)"; fi ;;
        memcheck)
            export LD_LIBRARY_PATH=$root/.gpu/lib:/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
            bounded 100 memcheck "$san" --tool memcheck --leak-check full \
                --error-exitcode 1 "$tests_bin" -tce='*NCCL*,*training*,*accumulation*,*normalization*'
            bounded 30 memcheck-nccl "$san" --tool memcheck \
                --report-api-errors no --error-exitcode 1 "$tests_bin" -tc='*NCCL*' \
                -tce='*training*,*accumulation*,*normalization*' ;;
        racecheck)
            export LD_LIBRARY_PATH=$root/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
            bounded 90 racecheck "$san" --tool racecheck --error-exitcode 1 \
                "$tests_bin" -tc='kernels*' ;;
        *) note "unknown stage $s" ;;
    esac
done

echo "=================== summary"
for f in "$LOGS"/*.log; do
    echo "--- $(basename "$f")"
    grep -E '^\[doctest\] (test cases|assertions)|ERROR SUMMARY|RACECHECK SUMMARY|SKIPPED|FAILED|ERROR:|error:|Error' "$f" | head -12
done
printf '%s\n' "${summary[@]}"
# At most 8 files come back from a lent machine: the logs travel as one archive
# (left as files if the call is cut off before this line).
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$LOGS"
