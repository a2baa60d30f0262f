#!/usr/bin/env bash
# mpiexec with the flags a single machine needs: --oversubscribe (more ranks than
# cores is fine for tests), shared-memory transport only, and --allow-run-as-root
# when running as root (containers, CI). Usage: scripts/mpiexec.sh -n 2 ./program ...
set -euo pipefail
flags=(--oversubscribe --mca btl self,vader)
[ "$(id -u)" -eq 0 ] && flags+=(--allow-run-as-root)
exec mpiexec "${flags[@]}" "$@"
