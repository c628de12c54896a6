#!/usr/bin/env bash
# Runs ferrograph's CUDA path on a machine with an NVIDIA GPU and writes what it saw.
#
# The GPU machine needs no Rust toolchain and no network: the binary is built elsewhere by
# scripts/build-cuda.sh and travels with the models in a bundle made by `pack`.
#
#   scripts/gpu-check.sh pack DIR [CHUNK]   (here) bundle target/cuda-release/release/ferrograph
#                                           (stripped, xz) and the default models into DIR,
#                                           in chunks of CHUNK bytes (default 58M) for
#                                           transports with a size limit
#   scripts/gpu-check.sh run DIR OUT        (there) reassemble the chunks found under DIR,
#                                           check their sha256, and run the checks below,
#                                           writing logs and JSON into OUT
#
# Checks: the GPU and the libraries the binary resolves; `ferrograph bench llm` on CUDA at
# 128, 512 and 2,048 prompt tokens, with the logits compared against the CPU's on the same
# tokens, and on the CPU for scale; the triage workflow end to end on the GPU (report
# judged: the planted file named, no empty sections); a MiniLM index built on the GPU and
# on the CPU, searched with the same queries.
set -uo pipefail
cd "$(dirname "$0")/.."

mode="${1:-}"
case "$mode" in
pack)
    dir="${2:?usage: pack DIR [CHUNK]}"
    chunk="${3:-58M}"
    bin="${CARGO_TARGET_DIR:-target/cuda-release}/release/ferrograph"
    [ -x "$bin" ] || { echo "no $bin: run scripts/build-cuda.sh first" >&2; exit 2; }
    rm -rf "$dir" && mkdir -p "$dir"
    tmp="$(mktemp -d)"
    mkdir -p "$tmp/bundle/models"
    strip -o "$tmp/bundle/ferrograph" "$bin"
    xz -T2 -6 "$tmp/bundle/ferrograph"
    cp models/models.toml "$tmp/bundle/models/"
    cp -r models/smollm2-135m-instruct-q4_1 models/all-minilm-l6-v2 "$tmp/bundle/models/"
    rm -f "$tmp/bundle/models/"*/.verified
    tar -C "$tmp" -cf "$tmp/bundle.tar" bundle
    sha256sum "$tmp/bundle.tar" | awk '{print $1}' >"$dir/bundle.sha256"
    split -b "$chunk" -d -a 2 "$tmp/bundle.tar" "$dir/bundle.part-"
    rm -rf "$tmp"
    ls -l "$dir"
    ;;
run)
    dir="${2:?usage: run DIR OUT}"
    out="${3:?usage: run DIR OUT}"
    mkdir -p "$out"
    work="$(mktemp -d)"
    # Chunks may have come in several transfers into sibling folders.
    mapfile -t parts < <(find "$dir" -name 'bundle.part-*' -printf '%f %p\n' | sort | awk '{print $2}')
    sum="$(find "$dir" -name bundle.sha256 | head -n 1)"
    echo "== ${#parts[@]} chunks"
    cat "${parts[@]}" >"$work/bundle.tar"
    echo "$(cat "$sum")  $work/bundle.tar" | sha256sum -c - || exit 3
    tar -C "$work" -xf "$work/bundle.tar" && rm "$work/bundle.tar"
    b="$work/bundle"
    xz -d "$b/ferrograph.xz" 2>/dev/null ||
        python3 -c 'import lzma,sys; open(sys.argv[2],"wb").write(lzma.open(sys.argv[1]).read())' \
            "$b/ferrograph.xz" "$b/ferrograph"
    chmod +x "$b/ferrograph"
    fg="$b/ferrograph"

    # The CUDA libraries: the driver from the system, cuBLAS/cuRAND/NVRTC from wherever the
    # machine keeps CUDA 13's (a toolkit or Python wheels).
    libs="$(find /usr/local /usr/lib /usr/lib64 /opt \( -name 'libcublas.so.13' -o -name 'libcublasLt.so.13' \
        -o -name 'libcurand.so.10' -o -name 'libnvrtc.so.13' -o -name 'libcudart.so.13' -o -name 'libcuda.so.1' \) 2>/dev/null |
        grep -v -e /compat/ -e /stubs/ | xargs -r -n1 dirname | sort -u | tr '\n' ':')"
    export LD_LIBRARY_PATH="${libs}${LD_LIBRARY_PATH:-}"
    export FERROGRAPH_MODELS_DIR="$b/models" FERROGRAPH_DATA_DIR="$work/data" NO_COLOR=1
    {
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
        echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
        ldd "$fg" | grep -E 'cuda|cublas|curand|nvrtc|not found'
        nproc
    } 2>&1 | tee "$out/env.txt"
    "$fg" models verify 2>&1 | tail -n 3

    step() { # name, timeout, command...
        local name="$1" limit="$2"
        shift 2
        echo "== $name"
        local start=$SECONDS
        timeout "$limit" "$@" >"$out/$name.out" 2>"$out/$name.err"
        local rc=$?
        echo "   rc $rc in $((SECONDS - start)) s"
        tail -n 4 "$out/$name.out"
        [ "$rc" -eq 0 ] || tail -n 15 "$out/$name.err"
    }
    for p in 128 512 2048; do
        step "llm-cuda-$p" 120 "$fg" bench llm --device cuda --prompt-tokens "$p" --gen-tokens 64
    done
    for p in 128 2048; do
        step "llm-cpu16-$p" 120 "$fg" bench llm --device cpu --threads 16 --prompt-tokens "$p" --gen-tokens 64
    done
    repo=tests/fixtures/triage
    FERROGRAPH_DEVICE=cuda step triage-cuda 240 "$fg" run triage --quiet \
        --issue "$repo/issue.md" --repo "$repo/repo" --docs "$repo/docs" --out "$work/report"
    if [ -d "$work/report" ]; then
        cp -r "$work/report" "$out/triage-report" 2>/dev/null
        grep -l "discounts.py" "$work/report"/* >/dev/null && echo "   report names ledgerlite/discounts.py" ||
            echo "   report does NOT name the planted file"
    fi
    step index-cuda 180 "$fg" index build crates --name src-cuda --device cuda --json
    step index-cpu 180 "$fg" index build crates --name src-cpu --device cpu --json
    for q in "checkpoint saver writes to sled" "attention kernel softmax" "server route for threads"; do
        for n in src-cuda src-cpu; do
            echo "-- $n: $q"
            FERROGRAPH_DEVICE=cpu "$fg" index search "$n" "$q" --k 3 2>&1 | head -n 3
        done
    done 2>&1 | tee "$out/search.txt"
    ;;
*)
    echo "usage: $0 pack DIR [CHUNK] | run DIR OUT" >&2
    exit 2
    ;;
esac
