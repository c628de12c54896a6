#!/usr/bin/env bash
# Proves that the ferrograph CLI (with ferrograph-llm and ferrograph-index) compiles with
# `--features cuda` on a machine without a GPU or a
# system CUDA toolkit: the CUDA 13 compiler comes from PyPI wheels (nvidia-cuda-nvcc,
# -crt, nvvm, -runtime, -cccl, which all unpack into one `nvidia/cu13` toolkit tree) in a
# virtual environment, then `cargo check -p ferrograph-cli --features cuda` runs with it.
#
# candle-kernels' build script compiles every CUDA kernel with nvcc during the check (PTX for
# the element-wise kernels, a static library for the quantized matmul and MoE kernels), so
# this is slow: about 15 minutes from scratch on 2 cores (16.5 min measured alongside other
# work). scripts/test.sh runs it last, so CI proves the CUDA build on every run.
#
# Usage: scripts/check-cuda.sh            (venv in target/cuda-venv, cargo target in target/cuda)
# Env:   CUDA_VENV, CARGO_TARGET_DIR, CUDA_COMPUTE_CAP (default 80), CUDA_PIP_VERSION (13.4.*)
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${CUDA_VENV:-target/cuda-venv}"
version="${CUDA_PIP_VERSION:-13.4.*}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/cuda}"
# No GPU to ask: compile the kernels for Ampere (sm_80) unless told otherwise.
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-80}"

if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
toolkit="$site/nvidia/cu13"
if [ ! -x "$toolkit/bin/nvcc" ]; then
    echo "== installing the CUDA compiler from PyPI ($version)"
    # cccl (CUB/Thrust/libcu++ headers) is versioned on its own; any 13.x works with nvcc 13.
    "$venv/bin/pip" install --quiet --disable-pip-version-check \
        "nvidia-cuda-nvcc==$version" "nvidia-cuda-crt==$version" "nvidia-nvvm==$version" \
        "nvidia-cuda-runtime==$version" "nvidia-cuda-cccl>=13,<14"
fi

export CUDA_HOME="$toolkit" CUDA_PATH="$toolkit" CUDA_ROOT="$toolkit" NVCC="$toolkit/bin/nvcc"
export PATH="$toolkit/bin:$toolkit/nvvm/bin:$PATH"
# cudarc asks nvcc for its version and knows releases up to 13.4; name the one installed.
release="$(nvcc --version | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/\1 \2/p')"
read -r major minor <<<"$release"
export CUDARC_CUDA_VERSION="${CUDARC_CUDA_VERSION:-${major}0${minor}0}"
echo "== nvcc $major.$minor from $toolkit (sm_$CUDA_COMPUTE_CAP, cudarc $CUDARC_CUDA_VERSION)"

start=$(date +%s)
cargo check -p ferrograph-cli --features cuda
echo "== cargo check --features cuda passed in $(($(date +%s) - start)) s"
