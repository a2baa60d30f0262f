#!/usr/bin/env bash
# UNISON_TIMELINE over sharding on the thread backend: the sharded suite's
# accounting cases (every strategy; shard::hybrid in two shard groups at 2 and 4
# ranks, where a rank's place in its shard group differs from its rank) write one
# trace per rank, and each passes scripts/timeline.py check: every span a rank
# begins ends on that rank's own timeline.
#
# Usage: sharded_timeline.sh UNISON_TESTS TIMELINE_PY
set -euo pipefail
tests=$1
tool=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

if ! UNISON_TIMELINE="$dir/trace" "$tests" -tc='sharded: memory and traffic*<thread>' \
    >"$dir/out.txt" 2>&1; then
    cat "$dir/out.txt"
    exit 1
fi
files=("$dir"/trace.*.json)
if [ "${#files[@]}" -ne 4 ]; then
    echo "expected one trace for each of ranks 0-3, found ${#files[@]}: ${files[*]}"
    exit 1
fi
python3 "$tool" check "${files[@]}"
