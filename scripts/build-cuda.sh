#!/usr/bin/env bash
# Builds a runnable `ferrograph` with `--features cuda` on a machine without a GPU or a
# system CUDA toolkit, for copying to a machine that has both a GPU and an NVIDIA driver.
#
# The CUDA compiler and the libraries candle links against (cuBLAS, cuBLASLt, cuRAND, NVRTC)
# come from PyPI wheels in a virtual environment, as in scripts/check-cuda.sh. The driver
# library (libcuda) is not on PyPI: the link is made against a stub generated here that
# defines the driver functions cudarc declares and carries the driver's soname
# (`libcuda.so.1`), the way the CUDA toolkit's own `lib/stubs/libcuda.so` does. At run time
# the real driver is loaded instead.
#
# On the GPU machine the binary needs the driver and the same major CUDA release's cuBLAS,
# cuRAND, NVRTC and the CUDA runtime on the loader's path (LD_LIBRARY_PATH); the versions must be at most the
# driver's CUDA release (the default, 13.0, runs on driver 580 and later).
#
# Usage: scripts/build-cuda.sh           → target/cuda-release/release/ferrograph
#        scripts/build-cuda.sh --check   `cargo check` only (what scripts/check-cuda.sh runs
#                                        in CI), into target/cuda
# Env:   CUDA_COMPUTE_CAP (default 90, Hopper), CUDA_PIP_VERSION (default 13.0.*),
#        CUDA_VENV, CARGO_TARGET_DIR, FERROGRAPH_CPU (default x86-64-v3: runs on any
#        AVX2 machine; our kernels pick wider SIMD at run time)
set -euo pipefail
cd "$(dirname "$0")/.."

check=0
[ "${1:-}" = "--check" ] && check=1
venv="${CUDA_VENV:-target/cuda-venv}"
version="${CUDA_PIP_VERSION:-13.0.*}"
if [ "$check" = 1 ]; then
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/cuda}"
else
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/cuda-release}"
    export RUSTFLAGS="-C target-cpu=${FERROGRAPH_CPU:-x86-64-v3}"
fi
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"

if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
toolkit="$site/nvidia/cu13"
# The compiler (and the runtime and headers candle's kernels build against); a build that
# links also needs the libraries candle calls.
wheels=("nvidia-cuda-nvcc==$version" "nvidia-cuda-crt==$version" "nvidia-nvvm==$version"
    "nvidia-cuda-runtime==$version" "nvidia-cuda-cccl>=13,<14")
have="$toolkit/bin/nvcc"
what="compiler"
if [ "$check" = 0 ]; then
    what="compiler and libraries"
    wheels+=("nvidia-cuda-nvrtc==$version" "nvidia-cublas==$version" "nvidia-curand")
    have="$toolkit/lib/libcublas.so.13"
fi
if [ ! -e "$have" ] || [ ! -x "$toolkit/bin/nvcc" ]; then
    echo "== installing the CUDA $what from PyPI ($version)"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "${wheels[@]}"
fi

if [ "$check" = 0 ]; then
    # Unversioned names for the linker, and the driver stub.
    for lib in cublas cublasLt nvrtc curand cudart; do
        real="$(ls "$toolkit/lib/lib$lib.so."* | grep -v builtins | grep -v '\.alt\.' | head -n 1)"
        ln -sf "$(basename "$real")" "$toolkit/lib/lib$lib.so"
    done
    mkdir -p "$toolkit/lib/stubs"
    if [ ! -e "$toolkit/lib/stubs/libcuda.so" ]; then
        cudarc="$(cargo metadata --format-version 1 --locked --features ferrograph-cli/cuda 2>/dev/null |
            "$venv/bin/python" -c 'import json,sys; m=json.load(sys.stdin); print(next(p["manifest_path"] for p in m["packages"] if p["name"]=="cudarc"))')"
        sys_rs="$(dirname "$cudarc")/src/driver/sys/mod.rs"
        stub_c="$CARGO_TARGET_DIR/libcuda-stub.c"
        mkdir -p "$CARGO_TARGET_DIR"
        sed -n 's/^pub unsafe fn \(cu[A-Za-z0-9_]*\)(.*/void \1(void) {}/p' "$sys_rs" | sort -u >"$stub_c"
        echo "== driver stub: $(wc -l <"$stub_c") functions from $sys_rs"
        cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$toolkit/lib/stubs/libcuda.so" "$stub_c"
    fi
fi

export CUDA_HOME="$toolkit" CUDA_PATH="$toolkit" CUDA_ROOT="$toolkit" NVCC="$toolkit/bin/nvcc"
export PATH="$toolkit/bin:$toolkit/nvvm/bin:$PATH"
release="$(nvcc --version | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/\1 \2/p')"
read -r major minor <<<"$release"
export CUDARC_CUDA_VERSION="${CUDARC_CUDA_VERSION:-${major}0${minor}0}"
echo "== nvcc $major.$minor from $toolkit (sm_$CUDA_COMPUTE_CAP, cudarc $CUDARC_CUDA_VERSION, ${RUSTFLAGS:-})"

start=$(date +%s)
if [ "$check" = 1 ]; then
    cargo check -p ferrograph-cli --features cuda
    echo "== cargo check --features cuda passed in $(($(date +%s) - start)) s"
else
    cargo build --release --locked -p ferrograph-cli --features cuda
    echo "== built $CARGO_TARGET_DIR/release/ferrograph in $(($(date +%s) - start)) s"
fi
