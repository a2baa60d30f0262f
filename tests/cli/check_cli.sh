#!/usr/bin/env bash
# What every program of unison (examples, benchmarks) answers on its command line:
#   PROGRAM --version      exit 0, "NAME (unison X.Y.Z)" on stdout
#   PROGRAM -h, --help     exit 0, a usage line on stdout
#   PROGRAM --no-such-flag exit 2, stderr names '--no-such-flag'
# Usage: check_cli.sh NAME PROGRAM [ARGS...]  (ARGS go before each flag: a launcher's)
set -uo pipefail
name=$1
shift
out=$(mktemp)
err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT
failed=0
fail() {
    echo "check_cli.sh: $name: $*" >&2
    echo "  stdout: $(head -c 600 "$out")" >&2
    echo "  stderr: $(head -c 600 "$err")" >&2
    failed=1
}
run() { # expected-status args...
    local expected=$1
    shift
    timeout 60 "$@" >"$out" 2>"$err"
    local status=$?
    [[ $status == "$expected" ]] || fail "'${*: -1}' exited $status, not $expected"
}

run 0 "$@" --version
grep -qE "^$name \(unison [0-9]+\.[0-9]+\.[0-9]+\)$" "$out" ||
    fail "--version printed no '$name (unison X.Y.Z)' line"
for help in -h --help; do
    run 0 "$@" "$help"
    grep -q "usage: " "$out" || fail "$help printed no usage on stdout"
done
run 2 "$@" --no-such-flag
grep -q -- "'--no-such-flag'" "$err" || fail "the refusal of --no-such-flag does not name it"
[[ $failed == 0 ]] && echo "check_cli.sh: $name: --version, -h, --help and an unknown flag ok"
exit $failed
