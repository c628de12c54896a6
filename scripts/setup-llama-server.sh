#!/usr/bin/env bash
# Install llama-cpp-python's OpenAI-compatible server into .venv-llama, for the remote
# adapter's real-server test (crates/ferrograph-llm/tests/remote_llama_server.rs).
#
# - Idempotent: a stamp in the venv records the version and interpreter; re-running when
#   nothing changed takes a fraction of a second.
# - The llama-cpp-python wheel comes from $LLAMA_WHEEL_DIR when one is there, else from a wheel
#   this script built earlier for the same version and build flags (kept under
#   ~/.cache/ferrograph/llama-wheels/VERSION-FLAVOR, usable by any interpreter), else it is
#   built from the sdist: CPU-only, for this CPU (-DGGML_NATIVE=ON) but without AMX, without
#   llama.cpp's tests, examples, tools and server, on $CMAKE_BUILD_PARALLEL_LEVEL jobs
#   (default: all cores). pip's own cache is not used for it: it does not tell builds with
#   different flags apart.
# - Also fetches the SmolLM2 GGUF the test serves (scripts/fetch-models.sh) when missing.
#
# Usage: scripts/setup-llama-server.sh          (PYTHON=python3.12 to pick an interpreter)
#        FORCE=1 scripts/setup-llama-server.sh   (reinstall even if the stamp matches)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$repo_root/.venv-llama"
version="0.3.36"
stamp="$venv/.llama-server.stamp"
python="${PYTHON:-python3}"

if ! command -v "$python" >/dev/null 2>&1; then
    echo "setup-llama-server: '$python' not found; set PYTHON to a Python >= 3.9 interpreter" >&2
    exit 1
fi

# llama.cpp's AMX kernels are left out of x86-64 builds: on virtual machines whose CPU flags
# list AMX without the kernel granting the tile state, every quantized product crashes the
# process (SIGSEGV), which is what the servers and peers here would do.
no_amx=""
if [[ "$(uname -m)" == x86_64 ]]; then
    no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
fi
flavor="native-no-amx"
want="llama-cpp-python[server]==$version $("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])') $flavor"
wheel_cache="${XDG_CACHE_HOME:-$HOME/.cache}/ferrograph/llama-wheels/$version-$flavor"

if [[ "${FORCE:-0}" != 1 && -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "setup-llama-server: $venv is up to date" >&2
else
    if [[ ! -x "$venv/bin/python" ]]; then
        echo "setup-llama-server: creating $venv" >&2
        "$python" -m venv "$venv"
    fi
    find_links=()
    if [[ -n "${LLAMA_WHEEL_DIR:-}" && -d "$LLAMA_WHEEL_DIR" ]]; then
        find_links=(--find-links "$LLAMA_WHEEL_DIR")
    fi
    export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_BLAS=OFF -DGGML_OPENMP=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF -DCMAKE_C_FLAGS='$no_amx' -DCMAKE_CXX_FLAGS='$no_amx'}"
    export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || echo 2)}"
    start=$(date +%s)
    if compgen -G "$wheel_cache/llama_cpp_python-$version-*.whl" >/dev/null; then
        echo "setup-llama-server: reusing the wheel in $wheel_cache" >&2
    else
        echo "setup-llama-server: building llama-cpp-python $version (a build from source takes minutes)" >&2
        mkdir -p "$wheel_cache"
        "$venv/bin/python" -m pip wheel --quiet --disable-pip-version-check --no-deps \
            --no-cache-dir "${find_links[@]}" -w "$wheel_cache" "llama-cpp-python==$version"
    fi
    # A different stamp means a different build: drop the installed one so pip installs this.
    "$venv/bin/python" -m pip uninstall --quiet --yes llama-cpp-python >/dev/null 2>&1 || true
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        --find-links "$wheel_cache" "llama-cpp-python[server]==$version"
    printf '%s\n' "$want" >"$stamp"
    echo "setup-llama-server: installed in $(( $(date +%s) - start )) s" >&2
fi

"$venv/bin/python" -c 'import llama_cpp, llama_cpp.server; print("setup-llama-server: llama_cpp", llama_cpp.__version__)' >&2

model="$repo_root/models/smollm2-135m-instruct-q4_1/SmolLM2-135M-Instruct.Q4_1.gguf"
if [[ ! -f "$model" ]]; then
    echo "setup-llama-server: fetching the SmolLM2 model" >&2
    bash "$repo_root/scripts/fetch-models.sh" smollm2-135m-instruct-q4_1
fi
