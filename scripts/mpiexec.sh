#!/usr/bin/env bash
# mpiexec with the flags a single machine needs. Open MPI: --oversubscribe (more
# ranks than cores is fine for tests), shared-memory transport only, and
# --allow-run-as-root when running as root (containers, CI). MPICH's Hydra needs
# none of them. UNISON_MPIEXEC picks the launcher (default: mpiexec on the PATH).
# Usage: scripts/mpiexec.sh -n 2 ./program ...
set -euo pipefail
launcher=${UNISON_MPIEXEC:-mpiexec}
flags=()
version=$("$launcher" --version 2>/dev/null || true)
if grep -qE "Open MPI|OpenRTE" <<<"$version"; then
    flags=(--oversubscribe --mca btl self,vader)
    [ "$(id -u)" -eq 0 ] && flags+=(--allow-run-as-root)
fi
exec "$launcher" "${flags[@]}" "$@"
