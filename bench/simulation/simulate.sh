#!/usr/bin/env bash
# Runs unison's all-reduce (or, with "-- -c reduce_scatter" or "-- -c all_gather",
# those) against the simulated MPI's own call on simulated clusters: builds
# allreduce_sim.cpp with SimGrid's smpicxx and runs it under smpirun for each
# platform file, rank count and MPI algorithm selector asked for, printing the
# driver's CSV rows with the platform and selector in front
# (platform,selector,ranks,bytes,algorithm,chosen,us,correct) and, on stderr, how
# long each run took here.
#
#   bench/simulation/simulate.sh [-p "flat two_level fat_tree"] [-n "2 4 8"]
#       [-s "ompi mpich"] [-o out.csv] [-t seconds] [--shared-from N]
#       [--node-ranks N] [--node-link LATENCY,BANDWIDTH]
#       [-d allreduce_sim|engine_sim|node_probe] [-- driver options]
#
# --node-ranks places N ranks on each host of the two_level platform (default 8,
# its hosts' cores): nodes of 2, 4 or 16 ranks sharing the same links, to see a
# tuning bound on another node size (the other platforms keep a rank per host).
# --node-link gives two_level's nodes another memory system than the file's
# (0.3us,100GBps), in SimGrid's units, e.g. --node-link 0.135us,8.5GBps: the
# values that roughly fit this 2-core machine's shared memory from 32 KiB (-d
# node_probe, below; docs/measurements.md, "How far the simulated node is from a
# real one").
#
# -d engine_sim runs the other driver, engine_sim.cpp: the engines' start() and
# the fixed cost of a step of a tiny model (ddp and fsdp), under the first
# selector only (the engines call unison's collectives alone), printing
# platform,selector,ranks,engine,phase,us,calls,correct.
#
# -d node_probe runs node_probe.cpp, MPI alone: the one-way time of a message
# between ranks 0 and 1 from 8 B to 2 MiB and the cost of an MPI_Test that finds
# nothing, printing platform,selector,ranks,what,bytes,us. At 2 ranks on two_level
# the pair shares a node; on flat it crosses the network. The same program under
# a real MPI gives the figures to set against them.
#
# Unison's own rows do not depend on the selector (only the MPI's call does), so
# they run under the first selector only. From --shared-from ranks on (default
# 256) the driver backs its buffers with SimGrid's shared allocations, which keep
# memory flat at any rank count but leave the results unchecked. Every run is
# bounded by -t seconds (default 600). Needs libsimgrid-dev (smpicxx, smpirun):
# without it, exits 77 (CTest's skip) saying so.
#
# Simulation settings: compute time is not simulated (only communication is
# compared); MPI_Test and MPI_Iprobe cost 0.1 us each without growing (SimGrid's
# default is 100 us, growing while a poll finds nothing, which would charge any
# polling loop for the simulator's own shortcut); messages under 64 KiB are sent
# eagerly, without waiting for their receive (Open MPI's TCP eager limit; SimGrid's
# default makes every message wait for its receive, which real MPIs do only for
# large ones). SimGrid's default latency and bandwidth factors by message size
# (calibrated on a real cluster) stay. UNISON_SIM_CFG adds settings of your own,
# split at spaces, e.g. a cost for posting each message, which SMPI leaves at 0:
#   UNISON_SIM_CFG="--cfg=smpi/os:0:5e-7:0 --cfg=smpi/ois:0:5e-7:0 --cfg=smpi/or:0:5e-7:0"
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
platforms="flat two_level fat_tree"
ranks="2 4 8 16 32 64"
selectors="ompi mpich"
out= # standard output
limit=600
shared_from=256
node_ranks=8
node_link=
node_link_given=
driver_name=allreduce_sim
driver_args=()
while [ $# -gt 0 ]; do
    case "$1" in
    -p) platforms=$2; shift 2 ;;
    -n) ranks=$2; shift 2 ;;
    -s) selectors=$2; shift 2 ;;
    -o) out=$2; shift 2 ;;
    -t) limit=$2; shift 2 ;;
    --shared-from) shared_from=$2; shift 2 ;;
    --node-ranks) node_ranks=$2; shift 2 ;;
    --node-link) node_link=$2; node_link_given=1; shift 2 ;;
    -d) driver_name=$2; shift 2 ;;
    --) shift; driver_args=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "simulate.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
done
case "$node_ranks" in
'' | *[!0-9]* | 0) echo "simulate.sh: --node-ranks takes a positive whole number, not '$node_ranks'" >&2; exit 2 ;;
esac
node_lat=${node_link%%,*}
node_bw=${node_link#*,}
number='([0-9]+(\.[0-9]*)?|\.[0-9]+)'
if [ -n "$node_link_given" ] && ! [[ "$node_lat" =~ ^${number}(e-?[0-9]+)?(s|ms|us|ns)$ &&
    "$node_bw" =~ ^${number}(e[0-9]+)?(Bps|kBps|MBps|GBps|TBps)$ && "$node_link" == *,* ]]; then
    echo "simulate.sh: --node-link takes LATENCY,BANDWIDTH such as 0.135us,8.5GBps, not '$node_link'" >&2
    exit 2
fi
for tool in smpicxx smpirun; do
    command -v "$tool" >/dev/null || {
        echo "simulate.sh: $tool not found: install SimGrid (apt-get install libsimgrid-dev)" >&2
        exit 77
    }
done

case "$driver_name" in
allreduce_sim) header="platform,selector,ranks,bytes,algorithm,chosen,us,correct" ;;
engine_sim)
    header="platform,selector,ranks,engine,phase,us,calls,correct"
    selectors=${selectors%% *} # unison's calls alone: one selector is enough
    ;;
node_probe)
    header="platform,selector,ranks,what,bytes,us"
    selectors=${selectors%% *} # MPI's point-to-point calls alone
    ;;
*) echo "simulate.sh: -d takes allreduce_sim, engine_sim or node_probe, not '$driver_name'" >&2; exit 2 ;;
esac

build=${UNISON_SIM_BUILD:-$root/build/simulation}
mkdir -p "$build"
driver=$build/$driver_name
if [ ! -x "$driver" ] || [ -n "$(find "$here/$driver_name.cpp" "$root/include" -newer "$driver" -print -quit)" ]; then
    smpicxx -std=c++20 -O2 -DUNISON_WITH_MPI -I"$root/include" "$here/$driver_name.cpp" \
        -o "$driver" 2>"$build/build.log" || { cat "$build/build.log" >&2; exit 1; }
fi

# This invocation's own files: runs in parallel (another build directory's, or
# this one's) must not share a hostfile or a result file.
work=$(mktemp -d "$build/run.XXXXXX")
trap 'rm -rf "$work"' EXIT

# A hostfile of n ranks for platform $1: one rank per host, or --node-ranks (8)
# per host on two_level (whose hosts have 8 cores).
hostfile() {
    local per=1
    [ "$1" = two_level ] && per=$node_ranks
    awk -v n="$2" -v per="$per" 'BEGIN { for (r = 0; r < n; r++) print "node-" int(r / per) }' \
        >"$work/hosts"
    echo "$work/hosts"
}

# Rows go to -o's file (begun anew), or to standard output as it is: writing there
# through /dev/stdout would truncate a file it was redirected to (>>).
emit() { if [ -n "$out" ]; then cat >>"$out"; else cat; fi; }
[ -z "$out" ] || : >"$out"
echo "$header" | emit
for platform in $platforms; do
    xml=$here/platforms/$platform.xml
    [ -f "$xml" ] || { echo "simulate.sh: no platform file $xml" >&2; exit 2; }
    if [ -n "$node_link_given" ] && [ "$platform" = two_level ]; then
        sed -e "s/loopback_bw=\"[^\"]*\"/loopback_bw=\"$node_bw\"/" \
            -e "s/loopback_lat=\"[^\"]*\"/loopback_lat=\"$node_lat\"/" "$xml" >"$work/two_level.xml"
        grep -q "loopback_lat=\"$node_lat\"" "$work/two_level.xml" &&
            grep -q "loopback_bw=\"$node_bw\"" "$work/two_level.xml" || {
            echo "simulate.sh: $xml has no loopback_lat and loopback_bw for --node-link to set" >&2
            exit 2
        }
        xml=$work/two_level.xml
    fi
    for n in $ranks; do
        first=1
        for selector in $selectors; do
            args=("${driver_args[@]}")
            [ "$driver_name" = allreduce_sim ] && [ "$n" -ge "$shared_from" ] && args+=(--shared)
            [ $first -eq 0 ] && args+=(-a none)
            start=$(date +%s.%N)
            # UNISON_SIM_CFG unquoted on purpose: one word per setting.
            if ! timeout "$limit" smpirun -np "$n" -platform "$xml" -hostfile "$(hostfile "$platform" "$n")" \
                --cfg=smpi/coll-selector:"$selector" --cfg=smpi/simulate-computation:no \
                --cfg=smpi/test:1e-7 --cfg=smpi/iprobe:1e-7 --cfg=smpi/grow-injected-times:no \
                --cfg=smpi/async-small-thresh:65536 --cfg=smpi/send-is-detached-thresh:65536 \
                --log=root.thres:critical ${UNISON_SIM_CFG:-} "$driver" "${args[@]}" >"$work/run.csv" 2>"$work/run.err"; then
                echo "simulate.sh: $platform, $n ranks, $selector: failed or ran past ${limit}s" >&2
                grep -v "^  ->  " "$work/run.err" | tail -n 30 >&2 # SimGrid's backtrace lines left out
                exit 1
            fi
            end=$(date +%s.%N)
            tail -n +2 "$work/run.csv" | sed "s/^/$platform,$selector,/" | emit
            awk -v p="$platform" -v n="$n" -v s="$selector" -v a="$start" -v b="$end" \
                'BEGIN { printf "simulate.sh: %s, %d ranks, %s: %.1f s\n", p, n, s, b - a }' >&2
            first=0
        done
    done
done
