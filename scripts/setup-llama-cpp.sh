#!/usr/bin/env bash
# Build llama.cpp's own `llama-bench` and `llama-server` from the llama.cpp sources vendored in
# the llama-cpp-python sdist on PyPI, for `ferrograph bench llm --peer llama-cpp` (prefill and
# decode at every prompt length and depth; concurrent decoding against `llama-server
# --parallel N`).
#
# - Output: .peers/llama.cpp/bin/{llama-bench,llama-server} (git-ignored).
# - Built for this CPU (GGML_NATIVE) without AMX (on VMs whose CPU flags list AMX without the
#   kernel granting the tile state, every quantized product crashes), with OpenMP, without
#   CURL, OpenSSL, the web UI, tests and examples. cmake comes from PyPI (a venv in
#   .peers/cmake-venv), the sdist from PyPI (pip download), so a fresh machine with a C++
#   compiler and PyPI needs nothing else.
# - Idempotent: a stamp records the version, the flags and the CPU; re-running when nothing
#   changed returns at once. FORCE=1 rebuilds. CMAKE_BUILD_PARALLEL_LEVEL sets the jobs
#   (default: all cores). The build takes about 10 minutes on 2 cores.
#
# Usage: scripts/setup-llama-cpp.sh
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version="0.3.36"
peers="$repo_root/.peers"
out="$peers/llama.cpp"
stamp="$out/.stamp"
python="${PYTHON:-python3}"

no_amx=""
if [[ "$(uname -m)" == x86_64 ]]; then
    no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
fi
# A native build is for this CPU: the stamp names it, so a .peers/ carried to another machine
# is rebuilt.
cpu="$(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | xargs || true)"
flags_sum="$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cksum | cut -d' ' -f1 || true)"
want="llama-cpp-python $version vendored llama.cpp; native, no AMX ($no_amx), openmp; cpu ${cpu:-unknown} (flags $flags_sum)"
if [[ "${FORCE:-0}" != 1 && -f "$stamp" && "$(cat "$stamp")" == "$want" \
      && -x "$out/bin/llama-bench" && -x "$out/bin/llama-server" ]]; then
    echo "setup-llama-cpp: $out is up to date" >&2
    exit 0
fi

for tool in "$python" c++ cc; do
    command -v "$tool" >/dev/null 2>&1 || { echo "setup-llama-cpp: '$tool' not found" >&2; exit 1; }
done

start=$(date +%s)
mkdir -p "$peers"
venv="$peers/cmake-venv"
if [[ ! -x "$venv/bin/cmake" ]]; then
    echo "setup-llama-cpp: installing cmake from PyPI into $venv" >&2
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check cmake
fi

src="$peers/llama_cpp_python-$version"
if [[ ! -f "$src/vendor/llama.cpp/CMakeLists.txt" ]]; then
    echo "setup-llama-cpp: fetching the llama-cpp-python $version sdist" >&2
    dl="$peers/download"
    rm -rf "$dl" && mkdir -p "$dl"
    "$venv/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps \
        --no-binary llama-cpp-python -d "$dl" "llama-cpp-python==$version"
    sdist="$(ls "$dl"/llama_cpp_python-"$version".tar.gz)"
    rm -rf "$src"
    tar -xzf "$sdist" -C "$peers"
    rm -rf "$dl"
fi

build="$peers/llama.cpp-build"
jobs="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || echo 2)}"
echo "setup-llama-cpp: building llama-bench and llama-server on $jobs jobs (minutes)" >&2
"$venv/bin/cmake" -S "$src/vendor/llama.cpp" -B "$build" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON -DGGML_OPENMP=ON -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_BLAS=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DBUILD_SHARED_LIBS=OFF \
    "-DCMAKE_C_FLAGS=$no_amx" "-DCMAKE_CXX_FLAGS=$no_amx" >"$peers/cmake-configure.log" 2>&1 \
    || { tail -30 "$peers/cmake-configure.log" >&2; exit 1; }
"$venv/bin/cmake" --build "$build" --target llama-bench llama-server -j "$jobs" \
    >"$peers/cmake-build.log" 2>&1 || { tail -30 "$peers/cmake-build.log" >&2; exit 1; }
mkdir -p "$out/bin"
cp "$build/bin/llama-bench" "$build/bin/llama-server" "$out/bin/"
printf '%s\n' "$want" >"$stamp"
echo "setup-llama-cpp: built in $(( $(date +%s) - start )) s: $out/bin/llama-bench, $out/bin/llama-server" >&2
