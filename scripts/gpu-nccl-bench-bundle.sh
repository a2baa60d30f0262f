#!/usr/bin/env bash
# unison-bench -B nccl for a GPU machine that has no MPI: built here against
# MPICH (whose MPI_Init runs as a singleton without a launcher, so one process
# drives one GPU) and collected with MPICH's libraries into .gpu/nccl-bench/.
#
#   bash scripts/gpu-nccl-bench-bundle.sh   # here, after ../shared/gpu/bundle.sh
#   bash .gpu/nccl-bench/run.sh             # on the GPU machine
#
# Environment: UNISON_CUDA_ARCH (default 90), BUILD (default build/gpu-mpich),
# JOBS (default nproc).
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
arch=${UNISON_CUDA_ARCH:-90}
build=${BUILD:-build/gpu-mpich}
jobs=${JOBS:-$(nproc)}
out=.gpu/nccl-bench

command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" \
    -DUNISON_BUILD_EXAMPLES=OFF -DUNISON_BUILD_TESTS=OFF -DUNISON_ENABLE_GLOO=OFF \
    -DMPI_CXX_COMPILER=/usr/bin/mpicxx.mpich -DMPI_C_COMPILER=/usr/bin/mpicc.mpich >/dev/null
cmake --build "$build" -j "$jobs" --target unison-bench

rm -rf "$out" && mkdir -p "$out/lib"
cp "$build/bench/unison-bench" "$out/"
strip --strip-unneeded "$out/unison-bench" 2>/dev/null || true
ldd "$out/unison-bench" | awk '/=> \//{print $1, $3}' | while read -r name path; do
    case "$name" in
        libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|ld-linux*|libgcc_s.so*|libstdc++.so*) ;;
        libcuda.so*|libnccl.so*|libnvidia*) ;;
        *) cp -L "$path" "$out/lib/" ;;
    esac
done
cat >"$out/run.sh" <<'EOF'
#!/usr/bin/env bash
# unison-bench -B nccl on one GPU (an MPICH singleton), all-reduce 8 B to 1 GiB,
# nccl-tests' defaults otherwise, with the data checked (-c 1).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
nccl=$(python3 -c 'import glob, os, site
for p in site.getsitepackages():
    for h in glob.glob(os.path.join(p, "nvidia", "nccl", "lib", "libnccl.so*")):
        print(os.path.dirname(h)); raise SystemExit' 2>/dev/null)
export LD_LIBRARY_PATH="$here/lib${nccl:+:$nccl}:$(dirname "$here")/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export UCX_TLS=self,sm,tcp UCX_WARN_UNUSED_ENV_VARS=n
"$here/unison-bench" -B nccl -b 8 -e 1G -f 4 -c 1 -n 50 -w 5 "$@"
EOF
strip --strip-unneeded "$out"/lib/*.so* 2>/dev/null || true
chmod +x "$out/run.sh"
du -sh "$out"
echo "gpu-nccl-bench-bundle: $out ready; on the GPU machine run: bash $out/run.sh"
