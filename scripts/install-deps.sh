#!/usr/bin/env bash
# Installs, from Debian's packages, what unison's build, tests and benchmarks need.
# Packages already present are left alone; nothing is downloaded then.
set -euo pipefail

packages=(cmake g++ make git pkg-config clang-format
          clang libclang-rt-14-dev # the ASan+UBSan build of the tests (scripts/test.sh)
          libc++-dev libc++abi-dev # every header through LLVM's libc++ (tests/CMakeLists.txt)
          openmpi-bin libopenmpi-dev
          mpich libmpich-dev # the MPI backend under MPICH too (Open MPI stays the default)
          libgloo-dev # the Gloo backend (CPU jobs without MPI)
          doctest-dev libbenchmark-dev libeigen3-dev libxxhash-dev
          libtorch-dev python3-torch python3-matplotlib # bench/bandwidth/plot_busbw.py
          libopenblas0-pthread # LibTorch's matrix products: ~20x the reference BLAS
          libsimgrid-dev) # bench/simulation: the MPI backend on simulated clusters

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
