#!/usr/bin/env bash
# UNISON_LOG, as a user sees it on stderr (include/unison/core/log.hpp):
#   unset or off   no line of unison's
#   info           communicators made, the DDP bucket plan, the sharding layout,
#                  each line prefixed "unison[rank R] info: " by the rank that wrote it
#   debug          every collective call too (and under MPI the algorithm each runs)
#   anything else  refused when the first communicator is made, naming UNISON_LOG
# Usage: log_levels.sh DDP_MLP ZERO_ADAMW [MPIEXEC_SH]
set -uo pipefail
ddp=$1
zero=$2
mpiexec=${3:-}
err=$(mktemp)
out=$(mktemp)
trap 'rm -f "$err" "$out"' EXIT
failed=0
fail() {
    echo "log_levels.sh: $*" >&2
    echo "  stderr: $(head -c 1500 "$err")" >&2
    failed=1
}
has() { grep -qE "$1" "$err" || fail "no line matching '$1'"; }
# Runs an example for two steps; it ran when it printed its closing loss line (two
# steps are too few for its own check that the loss halves, so its status is not it).
trains() {
    timeout 120 "$@" --steps 2 >"$out" 2>"$err"
    grep -q ': loss .* -> ' "$out"
}

trains "$ddp" -t 2 || fail "ddp_mlp failed without UNISON_LOG"
grep -q '^unison\[' "$err" && fail "lines of unison's without UNISON_LOG"
UNISON_LOG=off trains "$ddp" -t 2 || fail "UNISON_LOG=off failed"
grep -q '^unison\[' "$err" && fail "lines of unison's with UNISON_LOG=off"

UNISON_LOG=info trains "$ddp" -t 2 || fail "UNISON_LOG=info failed"
has '^unison\[rank 0\] info: thread_communicator made: rank 0 of 2, '
has '^unison\[rank 1\] info: thread_communicator made: rank 1 of 2, '
has '^unison\[rank [01]\] info: bucketed_reducer: [0-9]+ buckets for [0-9]+ gradients on the [a-z_]+ path \(first bucket [0-9]+ B, then [0-9]+ B\): [0-9]+ x float = [0-9]+ B'
grep -q ' debug: ' "$err" && fail "debug lines at info"

UNISON_LOG=DEBUG trains "$ddp" -t 2 || fail "UNISON_LOG=DEBUG failed"
has '^unison\[rank 1\] debug: all_reduce (\(async\) )?[0-9]+ x float, (sum|avg), .*2 ranks, on host'
# every line is whole: prefix, level, text
bad=$(grep -v '^unison\[rank [0-9]\+\] \(info\|debug\|warn\): ' "$err" | grep -c 'unison\[')
[[ $bad == 0 ]] || fail "$bad lines of unison's cut or interleaved"

UNISON_LOG=info trains "$zero" -t 2 || fail "zero_adamw failed"
has '^unison\[rank [01]\] info: .* started: layout zero[0-3], [0-9]+ units of [0-9]+ parameters, shard group of 2 ranks'

UNISON_LOG=verbose trains "$ddp" -t 2 && fail "UNISON_LOG=verbose accepted"
has "UNISON_LOG.*'verbose' is not a log level: off, warn, info or debug"

if [[ -n $mpiexec ]]; then
    # Under mpiexec a process that exits non-zero gets the others killed, maybe before
    # they print: enough steps for the loss to halve, and the status checked.
    UNISON_LOG=debug timeout 120 bash "$mpiexec" -n 2 "$ddp" --steps 20 >"$out" 2>"$err" ||
        fail "ddp_mlp under mpiexec failed: $(tail -3 "$out")"
    has '^unison\[rank 1\] info: mpi_communicator made: rank 1 of 2, [0-9]+ ranks per node'
    has '^unison\[rank 0\] debug: all_reduce #[0-9]+ runs [a-z_]+$'
fi
[[ $failed == 0 ]] && echo "log_levels.sh: off, info, debug and a malformed UNISON_LOG behave"
exit $failed
