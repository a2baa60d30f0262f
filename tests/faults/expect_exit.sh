#!/usr/bin/env bash
# Runs a job that must end by itself with a given exit status, within a time limit,
# printing every given pattern (extended regular expressions):
#   expect_exit.sh STATUS SECONDS PATTERN... -- COMMAND...
# It kills the job (and fails) at the limit, so a hang costs SECONDS, not CI's time.
set -u
want=$1
limit=$2
shift 2
patterns=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    patterns+=("$1")
    shift
done
shift # the --
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$(date +%s%N)
timeout --kill-after=5 "$limit" "$@" >"$log" 2>&1
status=$?
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
cat "$log"
echo "expect_exit: status $status after ${elapsed_ms} ms (expected $want within $limit s)"
failed=0
if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
    echo "expect_exit: FAILED: the job did not end within $limit s"
    failed=1
elif [ "$status" -ne "$want" ]; then
    echo "expect_exit: FAILED: exit status $status, expected $want"
    failed=1
fi
for p in "${patterns[@]}"; do
    if ! grep -Eq -- "$p" "$log"; then
        echo "expect_exit: FAILED: the output lacks /$p/"
        failed=1
    fi
done
exit $failed
