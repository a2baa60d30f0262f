#!/usr/bin/env bash
# The benchmark programs' command lines, as CI sees them: one case per CTest test
# (bench/CMakeLists.txt registers each as bench_<case>).
# Usage: bench_checks.sh CASE PROGRAM [ARGS...]
#   PROGRAM  the unison-bench binary (for gbench_unknown_flag: any Google
#            Benchmark program; for simulation: bench/simulation/simulate.sh)
#   ARGS     mpi cases: scripts/mpiexec.sh; gloo_torchrun: torchrun;
#            simulation: its build directory and bench/training/cost_model.py
# Exits 0 when the case holds, 1 (saying what) when not, 77 when skipped.
set -uo pipefail
case_name=$1
prog=$2
shift 2

# Rows of a results table: lines starting with a size.
rows() { grep -c '^ *[0-9]' <<<"$1"; }

# --min-busbw (and nccl-tests' NCCL_TESTS_MIN_BW): a run under the bound exits 1 and
# says FAILED; over it, 0 and OK.
min_busbw_fails() {
    local out rc
    out=$("$prog" -t 2 -b 64K -e 64K --min-busbw 1e9); rc=$?
    echo "$out"
    [ $rc -eq 1 ] && grep -q 'Avg bus bandwidth.*FAILED' <<<"$out"
}
nccl_tests_min_bw_passes() {
    local out rc
    out=$(NCCL_TESTS_MIN_BW=0.000001 "$prog" -t 2 -b 64K -e 64K -a 3); rc=$?
    echo "$out"
    [ $rc -eq 0 ] && grep -q 'Avg bus bandwidth.*OK' <<<"$out"
}

# nccl-tests' -i (linear steps), -c <count> and -T.
nccl_tests_flags() {
    local out rc
    out=$("$prog" -t 2 -b 1M -e 3M -i 1M -c 5 -T 30); rc=$?
    echo "$out"
    [ $rc -eq 0 ] && grep -q 'step: 1048576(bytes)' <<<"$out" && [ "$(rows "$out")" -eq 3 ]
}

# nccl-tests' header lines, line for line where they mean something here.
nccl_tests_header() {
    local out line
    out=$("$prog" -t 2 -b 1K -e 4K) || return 1
    echo "$out"
    for line in '# nccl-tests version unison-[0-9]+\.[0-9]+\.[0-9]+ nccl-headers=[0-9]+ nccl-library=[0-9]+$' \
        '# Collective test starting: unison-bench$' \
        '# nThread 2 nGpus 0 minBytes 1024 maxBytes 4096 step: 1048576\(bytes\) warmup iters: 1 iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0$' \
        '# Using devices$' '#  Rank  1 Group  0 Pid +[0-9]+ on +[^ ]+ device  - \[host\] thread 1$' \
        '#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong $' \
        '# Out of bounds values : 0 OK$' '# Avg bus bandwidth    : [0-9.e+-]+ $' \
        '# Collective test concluded: unison-bench$'; do
        grep -Eq "^$line" <<<"$out" || { echo "missing: $line"; return 1; }
    done
}

# -J: nccl-tests' JSON file besides the text on stdout, one result per size.
json_file() {
    local dir out err
    dir=$(mktemp -d) && trap 'rm -rf "$dir"' EXIT
    out=$("$prog" -t 2 -b 1K -e 64K -f 4 --baseline -J "$dir/run.json") || return 1
    echo "$out"
    grep -q "^# Writing JSON output to $dir/run.json$" <<<"$out" || return 1
    err=$("$prog" -t 2 -J "$dir/none/run.json" 2>&1) && return 1
    grep -q "^unison-bench: -J: cannot create '$dir/none/run.json'" <<<"$err" || return 1
    python3 - "$dir/run.json" "$(rows "$out")" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
rows = int(sys.argv[2])
for key in ("version", "start_time", "args", "env", "nccl_version", "config", "results",
            "out_of_bounds", "average_bus_bandwidth", "errors", "end_time", "unison_baselines"):
    assert key in d, key
assert d["version"] == 3
for key in ("nthreads", "ngpus", "minimum_bytes", "maximum_bytes", "step_factor", "warmup_iters",
            "iterations", "aggregated_iterations", "validation", "graph",
            "blocking_collectives", "per_iter_timing", "per_iter_skip", "parallel_init", "devices"):
    assert key in d["config"], key
assert d["config"]["nthreads"] == 2 and len(d["config"]["devices"]) == 2
assert len(d["results"]) == rows == 4, (len(d["results"]), rows)
for r in d["results"]:
    assert [k for k in r] == ["size", "count", "type", "redop", "root", "out_of_place",
                              "in_place", "actual_iterations", "experiment_name"], list(r)
    for side in (r["out_of_place"], r["in_place"]):
        assert list(side) == ["time", "alg_bw", "bus_bw", "nwrong"], list(side)
        assert side["nwrong"] == 0 and side["bus_bw"] > 0
assert d["out_of_bounds"] == {"count": 0, "okay": "true"}
assert d["average_bus_bandwidth"]["okay"] == "unchecked"
base = {b["name"]: b for b in d["unison_baselines"]}
assert "skipped" in base["raw-mpi"] and len(base["local-add"]["results"]) == rows
print("JSON file OK:", len(d["results"]), "rows")
PY
}

# nccl-tests' choice of collective by program name: the all_gather_perf link times
# all_gather; nccl-tests' other binaries' names are refused.
program_name() {
    local out err rc dir
    out=$("$(dirname "$prog")/all_gather_perf" -t 2 -b 64K -e 64K) || return 1
    echo "$out"
    grep -q '^# Collective test starting: all_gather_perf$' <<<"$out" &&
        grep -q '^# unison-bench: all_gather, backend thread' <<<"$out" &&
        grep -Eq '^ +65536 +8192 +float +none +-1 ' <<<"$out" || return 1
    dir=$(mktemp -d) && trap 'rm -rf "$dir"' EXIT
    ln -s "$prog" "$dir/reduce_perf"
    err=$("$dir/reduce_perf" -t 2 2>&1); rc=$?
    echo "$err"
    [ $rc -eq 2 ] && grep -q "started as 'reduce_perf', which names no collective" <<<"$err"
}

# nccl-tests' -C (report_cputime): accepted as 0 or 1; the collective moved to
# --collective.
report_cputime() {
    local out err rc
    out=$("$prog" -t 2 -b 64K -e 64K -C 1 --collective reduce_scatter) || return 1
    echo "$out"
    grep -Eq '^#  +size +count +type +redop +root +cputime +algbw +busbw +#wrong +cputime ' <<<"$out" &&
        grep -q '^# unison-bench: reduce_scatter' <<<"$out" || return 1
    "$prog" -t 2 -b 64K -e 64K -C 0 >/dev/null || return 1
    err=$("$prog" -C all_gather 2>&1); rc=$?
    echo "$err"
    [ $rc -eq 2 ] && grep -q "the collective is --collective all_gather" <<<"$err"
}

# --rounds: every size timed n times, the header says so, the rows are the medians
# (one row per size still); 0 rounds is refused.
rounds() {
    local out err rc
    out=$("$prog" -t 2 -b 64K -e 256K -f 2 --rounds 3) || return 1
    echo "$out"
    grep -q '^# unison-bench: all_reduce, backend thread, 2 ranks, .*, 3 rounds (rows: the medians)$' <<<"$out" &&
        [ "$(rows "$out")" -eq 3 ] || return 1
    err=$("$prog" -t 2 --rounds 0 2>&1); rc=$?
    echo "$err"
    [ $rc -eq 2 ] && grep -q "option --rounds: '0' is not a round count in \[1, 1000\]" <<<"$err"
}

# Under torchrun without MPI: the Gloo backend, two processes, every size right.
# ARGS: torchrun.
gloo_torchrun() {
    local out rc
    out=$("$1" --nproc_per_node=2 --master_port=29538 -r 2 -t 2 --no_python "$prog" \
        -b 8 -e 4M -f 8 -n 5 -w 1 -c 1 2>&1); rc=$?
    echo "$out"
    [ $rc -eq 0 ] && grep -q 'backend gloo, 2 ranks' <<<"$out" &&
        grep -q '^# Out of bounds values : 0 OK' <<<"$out"
}

# -J under mpiexec: rank 0 writes the file, with the raw-MPI baseline's rows.
# ARGS: scripts/mpiexec.sh.
json_file_mpi() {
    local dir
    dir=$(mktemp -d) && trap 'rm -rf "$dir"' EXIT
    bash "$1" -n 2 "$prog" -b 1K -e 16K -f 4 --baseline --rounds 3 -J "$dir/run.json" || return 1
    python3 - "$dir/run.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["unison"]["backend"] == "mpi" and d["unison"]["ranks"] == 2
assert d["unison"]["rounds"] == 3
assert d["config"]["nthreads"] == 1 and len(d["config"]["devices"]) == 2
assert len(d["results"]) == 3
raw = [b for b in d["unison_baselines"] if b["name"] == "raw-mpi"][0]
assert len(raw["results"]) == 3 and raw["results"][0]["out_of_place"]["ratio"] > 0
print("JSON file OK")
PY
}

# scripts/tuning-rules.py: made-up measurements give the rules they must (a winner
# over the built-in choice by more than the margin, consecutive sizes merged, the
# built-in choice kept where it holds); a real sweep at 2 ranks gives rules that
# unison-bench then follows under UNISON_TUNING_FILE at every size; input that is
# not a sweep is refused, and so is a malformed rules file.
# ARGS: scripts/mpiexec.sh, scripts/tuning-rules.py.
tuning_rules_mpi() {
    local mpiexec=$1 script=$2 dir out
    dir=$(mktemp -d) || return 1
    trap 'rm -rf "$dir"' RETURN
    python3 - "$dir/made_up.csv" <<'PY' || return 1
import sys
head = ("table,backend,collective,ranks,dtype,op,size,oop_time_us,oop_wrong,ip_time_us,ip_wrong,"
        "algorithm,requested")
rows = [head]
# 2 ranks: the built-in recursive doubling at 1-4K, the ring from 16K; rabenseifner
# beats the ring by 20% at 16K and 64K, and recursive doubling by 2% (under the
# margin) at 4K; 256K measured with the ring alone.
times = {1024: {"recursive_doubling": 5, "rabenseifner": 9},
         4096: {"recursive_doubling": 10, "rabenseifner": 9.8},
         16384: {"ring": 30, "rabenseifner": 25},
         65536: {"ring": 60, "rabenseifner": 50},
         262144: {"ring": 100}}
for size, by in times.items():
    auto = "recursive_doubling" if size < 16384 else "ring"
    for alg, t in by.items():
        for req in (["automatic", alg] if alg == auto else [alg]):
            rows.append(f"unison,mpi,all_reduce,2,float,sum,{size},{t},0,{t},0,{alg},{req}")
# Left out: a baseline, another backend, another dtype.
rows.append("raw-mpi,mpi,all_reduce,2,float,sum,1024,1,,1,,,")
rows.append("unison,thread,all_reduce,2,float,sum,1024,1,0,1,0,rank_ordered,rank_ordered")
rows.append("unison,mpi,all_reduce,2,double,sum,1024,1,0,1,0,ring,ring")
# An all_gather (op none): ring over the built-in recursive doubling at 64K.
for req in ("automatic", "recursive_doubling"):
    rows.append(f"unison,mpi,all_gather,2,float,none,65536,10,0,10,0,recursive_doubling,{req}")
rows.append("unison,mpi,all_gather,2,float,none,65536,5,0,5,0,ring,ring")
open(sys.argv[1], "w").write("\n".join(rows) + "\n")
PY
    # One run of each: no rule unless --min-runs allows it.
    out=$(python3 "$script" --node-ranks 2 "$dir/made_up.csv") || return 1
    grep -q '^mpi' <<<"$out" && return 1
    grep -q 'fewer than 3 measurements' <<<"$out" || return 1
    out=$(python3 "$script" --min-runs 1 --node-ranks 2 "$dir/made_up.csv") || return 1
    echo "$out"
    [ "$(grep -c '^mpi' <<<"$out")" -eq 2 ] || return 1
    grep -Eq '^mpi +all_gather +2 +2 +64K +ring +# 2.00x faster' <<<"$out" || return 1
    grep -Eq '^mpi +all_reduce +2 +2 +16K-256K +rabenseifner +# 1.20x faster' <<<"$out" || return 1
    # A margin of 0: the 2% at 4K is a win too, merged with the sizes after it.
    python3 "$script" --min-runs 1 --margin 0 "$dir/made_up.csv" | grep -Eq '^mpi +all_reduce +2 +\* +4K-256K +rabenseifner +# 1.02-1.20x' ||
        return 1
    # A real sweep, its rules, and unison-bench following them.
    bash "$mpiexec" -n 2 "$prog" -B mpi -b 1K -e 64K -f 4 -n 2 -w 1 --algorithm all --format csv \
        >"$dir/sweep.csv" || return 1
    python3 "$script" --min-runs 1 --margin 0 --node-ranks 2 -o "$dir/cluster.rules" "$dir/sweep.csv" ||
        return 1
    cat "$dir/cluster.rules"
    out=$(UNISON_TUNING_FILE="$dir/cluster.rules" bash "$mpiexec" -n 2 "$prog" -B mpi -b 1K -e 64K \
        -f 4 -n 2 -w 1 --format csv) || return 1
    python3 - "$dir/cluster.rules" "$out" <<'PY' || return 1
import csv, io, sys
units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
def size(s):
    return int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s)
rules = []
for line in open(sys.argv[1]):
    f = line.split("#")[0].split()
    if f and f[1] == "all_reduce":
        lo, _, hi = f[4].partition("-")
        rules.append((size(lo), size(hi) if hi else size(lo) + 1, f[5]))
rows = [r for r in csv.DictReader(io.StringIO(sys.argv[2])) if r["table"] == "unison"]
assert len(rows) == 4, len(rows)
for r in rows:
    b = int(r["size"])
    want = [a for lo, hi, a in rules if lo <= b < hi]
    assert r["requested"] == "automatic+rules" and r["oop_wrong"] == "0" and r["ip_wrong"] == "0", r
    assert not want or r["algorithm"] == want[0], (b, r["algorithm"], want)
print("rules followed:", [(r["size"], r["algorithm"]) for r in rows])
PY
    # Not a sweep: no MPI rows (1), a wrong result or rules loaded while measuring (2);
    # a malformed rules file.
    head -1 "$dir/made_up.csv" >"$dir/empty.csv"
    python3 "$script" "$dir/empty.csv"
    [ $? -eq 1 ] || return 1
    sed 's/^\(unison,mpi,all_reduce,2,float,sum,1024,5\),0,/\1,3,/' "$dir/made_up.csv" >"$dir/wrong.csv"
    python3 "$script" "$dir/wrong.csv"
    [ $? -eq 2 ] || return 1
    sed 's/,automatic$/,automatic+rules/' "$dir/made_up.csv" >"$dir/ruled.csv"
    python3 "$script" "$dir/ruled.csv"
    [ $? -eq 2 ] || return 1
    echo "mpi all_reduce 2 2 64K rings" >"$dir/bad.rules"
    out=$(UNISON_TUNING_FILE="$dir/bad.rules" bash "$mpiexec" -n 2 "$prog" -B mpi -b 1K -e 1K 2>&1)
    grep -q "bad.rules:1: algorithm 'rings'" <<<"$out"
}

# --algorithm all: a run per algorithm, each row naming the one that ran (the forced
# one, or the tuning's pick for automatic), every result checked; a name that is
# none, and the option on the thread backend, are usage errors.
# ARGS: scripts/mpiexec.sh.
algorithm_sweep_mpi() {
    local out
    out=$(bash "$1" -n 2 "$prog" -B mpi -b 1K -e 64K -f 8 -n 2 -w 1 --algorithm all \
        --format csv) || return 1
    python3 - "$out" <<'PY' || return 1
import csv, io, sys
rows = [r for r in csv.DictReader(io.StringIO(sys.argv[1])) if r["table"] == "unison"]
names = ["automatic", "recursive_doubling", "two_level", "rabenseifner", "ring", "native",
         "rank_ordered", "neighbour_exchange"]
assert len(rows) == 3 * len(names), len(rows)
for k, name in enumerate(names):
    ran = [r["algorithm"] for r in rows[3 * k:3 * k + 3]]
    assert name == "automatic" or ran == [name] * 3, (name, ran)
    assert all(r["oop_wrong"] == "0" and r["ip_wrong"] == "0" for r in rows[3 * k:3 * k + 3])
print("sweep OK:", [r["algorithm"] for r in rows[:3]], "for automatic")
PY
    bash "$1" -n 2 "$prog" -B mpi --algorithm butterfly
    [ $? -eq 2 ] || return 1
    out=$("$prog" -B thread --algorithm ring 2>&1)
    grep -q 'needs -B mpi' <<<"$out"
}

# The simulation harness (bench/simulation/simulate.sh) at a small scale: every
# all-reduce algorithm on a flat and a two-level cluster, at 3, 4, 5 and 10 ranks
# (groups of three and five: 10 ranks halve within each fifth first), the
# reduce_scatter and all_gather at 4, 5 and 10, the engines' driver (engine_sim) at
# 3, node_probe on one node (with and without --node-link), and the tuning's choice
# on nodes of 3 ranks at 4, 6 and 7, each result checked,
# and cost_model.py's mirror of the tuning against every choice; skipped (77,
# simulate.sh says why) where SimGrid is not installed. ARGS: build directory,
# cost_model.py.
simulation() {
    local build=$1 cost_model=$2 out more nodes rows c
    out=$(UNISON_SIM_BUILD="$build" bash "$prog" -p "flat two_level" -n "3 4 5 10" -t 300 -- \
        -a all -b 8 -e 1M -f 16 -n 1 -w 0) || return $?
    echo "$out"
    rows=$(grep -c ',ok$' <<<"$out")
    # 2 platforms x 4 rank counts x 5 sizes x (8 algorithms + MPI, then MPI under mpich)
    ! grep -q ',wrong$' <<<"$out" && [ "$rows" -eq 400 ] || return 1
    # The reduce_scatter and the all_gather, checked the same way: 2 platforms x 3 rank
    # counts x 4 sizes x (the tuning's choice + MPI, then MPI under mpich) each.
    for c in reduce_scatter all_gather; do
        more=$(UNISON_SIM_BUILD="$build" bash "$prog" -p "flat two_level" -n "4 5 10" -t 300 -- \
            -c "$c" -b 64 -e 1M -f 16 -n 1 -w 0) || return $?
        echo "$more"
        ! grep -q ',wrong$' <<<"$more" && [ "$(grep -c ',ok$' <<<"$more")" -eq 72 ] || return 1
    done
    # The engines: ddp's and fsdp's start and step, 4 rows, every one checked.
    more=$(UNISON_SIM_BUILD="$build" bash "$prog" -d engine_sim -p flat -n 3 -t 300 -- \
        -s 2 -w 1) || return $?
    echo "$more"
    ! grep -q ',wrong$' <<<"$more" && [ "$(grep -c ',ok$' <<<"$more")" -eq 4 ] || return 1
    # node_probe (MPI alone): one node of two_level as the file has it and with
    # --node-link's slower memory, 11 rows each (10 message sizes and the poll); the
    # 2 MiB message must take longer on the slower node, and a --node-link that is
    # not LATENCY,BANDWIDTH is a usage error.
    local probe slow
    probe=$(UNISON_SIM_BUILD="$build" bash "$prog" -d node_probe -p two_level -n 2 -t 120) || return $?
    slow=$(UNISON_SIM_BUILD="$build" bash "$prog" -d node_probe -p two_level -n 2 -t 120 \
        --node-link 0.135us,8.5GBps) || return $?
    echo "$probe"
    echo "$slow"
    [ "$(grep -c ',one_way,\|,test_pending,' <<<"$probe")" -eq 11 ] &&
        [ "$(grep -c ',one_way,\|,test_pending,' <<<"$slow")" -eq 11 ] || return 1
    awk -F, -v a="$(grep ',one_way,2097152,' <<<"$probe" | cut -d, -f6)" \
        -v b="$(grep ',one_way,2097152,' <<<"$slow" | cut -d, -f6)" \
        'BEGIN { exit !(a > 0 && b > 5 * a) }' || { echo "--node-link did not slow the node"; return 1; }
    UNISON_SIM_BUILD="$build" bash "$prog" -d node_probe -p two_level -n 2 --node-link 8.5GBps \
        >/dev/null 2>&1 && { echo "--node-link 8.5GBps was taken"; return 1; }
    [ $? -eq 2 ] || { echo "--node-link 8.5GBps: not a usage error (2)"; return 1; }
    # Nodes of 3 ranks (--node-ranks): the all-reduce's rules for nodes not all full
    # and for a few ranks over small nodes. 3 rank counts x 4 sizes x (the tuning's
    # choice + MPI, then MPI under mpich).
    nodes=$(UNISON_SIM_BUILD="$build" bash "$prog" -p two_level --node-ranks 3 -n "4 6 7" \
        -t 300 -- -b 64K -e 4M -f 4 -n 1 -w 0) || return $?
    echo "$nodes"
    ! grep -q ',wrong$' <<<"$nodes" && [ "$(grep -c ',ok$' <<<"$nodes")" -eq 36 ] || return 1
    # bench/training/cost_model.py mirrors the tuning's rules: the algorithms it would pick are
    # the ones the C++ tuning ran.
    if command -v python3 >/dev/null; then
        echo "$out" >"$build/rows.csv"
        python3 "$cost_model" --scale --check "$build/rows.csv" --drift-only || return 1
        echo "$nodes" >"$build/nodes.csv"
        python3 "$cost_model" --scale --check "$build/nodes.csv" --drift-only --node-ranks 3
    fi
}

# bench/bandwidth/plot_busbw.py: tests/cli/plot_busbw_check.py checks the PNG, its title, the
# median and band of several runs, --log-y and its input errors; skipped (77) where
# no python3 on the way has matplotlib (scripts/install-deps.sh installs Debian's).
# ARGS: plot_busbw_check.py, plot_busbw.py.
plot_busbw() {
    local p
    for p in python3 /usr/bin/python3; do
        command -v "$p" >/dev/null && {
            "$p" "$1" "$prog" "$2"
            return $?
        }
    done
    echo "no python3: skipped"
    return 77
}

# -B nccl where no GPU is visible (CUDA_VISIBLE_DEVICES= hides them on any machine):
# a usage error (2) that says so, not an MPI abort.
nccl_without_a_gpu() {
    local out rc
    out=$(CUDA_VISIBLE_DEVICES= "$prog" -B nccl -b 8 -e 8 2>&1); rc=$?
    echo "$out"
    [ $rc -eq 2 ] || { echo "exit $rc, not 2"; return 1; }
    grep -q -- '-B nccl needs a GPU per rank, and rank 0 sees none (cudaError' <<<"$out" &&
        ! grep -q MPI_ABORT <<<"$out"
}

# A Google Benchmark program names an unknown flag and exits 2.
gbench_unknown_flag() {
    local err rc
    err=$("$prog" --no-such-flag 2>&1 >/dev/null); rc=$?
    echo "$err"
    [ $rc -eq 2 ] && grep -q 'unrecognized command-line flag: --no-such-flag' <<<"$err"
}

case $case_name in
min_busbw_fails | nccl_tests_min_bw_passes | nccl_tests_flags | nccl_tests_header | json_file | \
    program_name | report_cputime | rounds | gloo_torchrun | json_file_mpi | \
    algorithm_sweep_mpi | tuning_rules_mpi | simulation | plot_busbw | nccl_without_a_gpu | \
    gbench_unknown_flag)
    "$case_name" "$@"
    status=$?
    ;;
*)
    echo "bench_checks.sh: no case '$case_name'" >&2
    exit 2
    ;;
esac
[ $status -eq 0 ] || [ $status -eq 77 ] || echo "bench_checks.sh: $case_name failed" >&2
exit $status
