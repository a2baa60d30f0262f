#!/usr/bin/env bash
# The LibTorch GPU tests (tests/torch/cuda.cpp: unison::torch::ddp and ::fsdp of
# modules on a GPU) need a LibTorch built with CUDA, which Debian does not ship.
# PyTorch's wheels carry one, and the GPU machine has PyTorch. So: build the tests
# here against the LibTorch of a PyTorch wheel, and run them there against the same
# version of PyTorch (the runner checks it is the same).
#
#   bash scripts/gpu-torch-bundle.sh        # here, after ../shared/gpu/bundle.sh
#   bash .gpu/torch/run.sh                  # on the GPU machine, after .gpu/run.sh
#
# The wheel comes from TORCH_PYTHON, a python whose torch has CUDA (default: a
# virtual environment in build/torch-venv, made with `pip install torch` when it is
# missing; about 5 GB). The GPU machine's torch version must match the one printed
# here; install that one into the venv otherwise (pip install torch==X).
# Environment: UNISON_CUDA_ARCH (default 90), BUILD (default build/gpu-torch),
# JOBS (default nproc).
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
arch=${UNISON_CUDA_ARCH:-90}
build=${BUILD:-build/gpu-torch}
jobs=${JOBS:-$(nproc)}
out=.gpu/torch

python=${TORCH_PYTHON:-build/torch-venv/bin/python}
if [ -z "${TORCH_PYTHON:-}" ] && [ ! -x "$python" ]; then
    echo "gpu-torch-bundle: making build/torch-venv with PyTorch from PyPI"
    python3 -m venv build/torch-venv
    build/torch-venv/bin/pip install -q torch
fi
read -r version cuda prefix < <("$python" -c \
    'import torch, torch.utils; print(torch.__version__, torch.version.cuda, torch.utils.cmake_prefix_path)')
[ "$cuda" != None ] || { echo "gpu-torch-bundle: torch $version from $python has no CUDA" >&2; exit 1; }
echo "gpu-torch-bundle: LibTorch $version (CUDA $cuda) from $prefix, sm_$arch"

command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
# The wheel's libtorch_cuda needs a newer NCCL than the toolkit's, which unison is
# compiled and linked against here; at run time the wheel's own NCCL is loaded
# (run.sh), so the link may leave those symbols to it.
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" \
    -DUNISON_BUILD_EXAMPLES=OFF -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined >/dev/null
cmake --build "$build" -j "$jobs" --target unison-torch-cuda-tests

rm -rf "$out" && mkdir -p "$out"
cp "$build/tests/unison-torch-cuda-tests" "$out/"
strip --strip-unneeded "$out/unison-torch-cuda-tests" 2>/dev/null || true
echo "$version" >"$out/torch-version"
cat >"$out/run.sh" <<'EOF'
#!/usr/bin/env bash
# Runs the LibTorch GPU tests against this machine's PyTorch (the version they were
# built against). Arguments go to the test binary (doctest filters).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
want=$(cat "$here/torch-version")
read -r have lib site < <(python3 -c 'import os, torch, site
print(torch.__version__, os.path.join(os.path.dirname(torch.__file__), "lib"), os.path.dirname(os.path.dirname(torch.__file__)))') || {
    echo "torch-gpu-tests: python3 has no torch"; exit 1; }
if [ "$have" != "$want" ]; then
    echo "torch-gpu-tests: built against torch $want, this machine has $have: rebuild with pip install torch==$have"
    exit 1
fi
# LibTorch, then the CUDA runtime and NCCL of the same wheels (before anything else,
# so that one libcudart.so.13 serves both LibTorch and unison).
paths=$lib
for d in "$site"/nvidia/cu13/lib "$site"/nvidia/*/lib; do
    [ -d "$d" ] && paths=$paths:$d
done
export LD_LIBRARY_PATH=$paths${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
echo "== torch-gpu-tests (torch $have)"
"$here/unison-torch-cuda-tests" "$@"
rc=$?
echo "== torch-gpu-tests: exit $rc"
exit $rc
EOF
chmod +x "$out/run.sh"
du -sh "$out"
echo "gpu-torch-bundle: $out ready; on the GPU machine run: bash $out/run.sh"
