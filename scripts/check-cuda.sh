#!/usr/bin/env bash
# Proves that the ferrograph CLI (with ferrograph-llm and ferrograph-index) compiles with
# `--features cuda` on a machine without a GPU or a system CUDA toolkit: the CUDA 13 compiler
# and libraries come from PyPI wheels in a virtual environment (see scripts/build-cuda.sh,
# which this runs with --check), then `cargo check -p ferrograph-cli --features cuda` runs
# with them.
#
# candle-kernels' build script compiles every CUDA kernel with nvcc during the check (PTX for
# the element-wise kernels, a static library for the quantized matmul and MoE kernels), so
# this is slow: about 15 minutes from scratch on 2 cores. scripts/test.sh runs it last, so CI
# proves the CUDA build on every run.
#
# Usage: scripts/check-cuda.sh            (venv in target/cuda-venv, cargo target in target/cuda)
# Env:   CUDA_VENV, CARGO_TARGET_DIR, CUDA_COMPUTE_CAP (default 80), CUDA_PIP_VERSION (13.0.*)
set -euo pipefail
cd "$(dirname "$0")/.."
# No GPU to ask: compile the kernels for Ampere (sm_80) unless told otherwise.
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-80}"
exec bash scripts/build-cuda.sh --check
