#!/usr/bin/env bash
# Retrieval benches side by side with their peers, on this machine's CPU:
#   1. index: ferrograph-index (hnsw_rs) vs hnswlib vs exact search on the same generated
#      vectors, M and ef_construction: build time, one-thread QPS and recall@10 per ef;
#   2. embeddings: all-MiniLM-L6-v2 on our kernels and on candle vs sentence-transformers (torch
#      CPU) on the same model files and sentences (this repository's source chunks):
#      sentences/s and how close the vectors are, in ROUNDS alternating rounds (default 2).
# Sets up .venv-index (hnswlib, sentence-transformers, torch: bench-only, large) from
# benches/peers/requirements-index.txt. Builds the CLI in release for the host CPU.
#
# Usage: scripts/bench-index.sh [index|embed|all]   (N=100000 DIM=128 QUERIES=1000 M=16
#        EFC=200 EFS=16,32,64,128,256 SENTENCES=1000 BATCH=32 ROUNDS=2 to change the sizes)
set -euo pipefail
cd "$(dirname "$0")/.."
what="${1:-all}"
py="${PYTHON:-python3}"
venv=.venv-index
req=benches/peers/requirements-index.txt
stamp="$venv/.requirements.stamp"
want="$(sha256sum "$req" | cut -d' ' -f1)"
if [[ ! -x "$venv/bin/python" || ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
    echo "bench-index: installing $req into $venv (torch is large)" >&2
    [[ -x "$venv/bin/python" ]] || "$py" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
    echo "$want" >"$stamp"
fi
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}"
RUSTFLAGS="${RUSTFLAGS:--C target-cpu=native}" cargo build --release -q -p ferrograph-cli
bin="$CARGO_TARGET_DIR/release/ferrograph"
out="${OUT:-$CARGO_TARGET_DIR/bench-index}"
mkdir -p "$out"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)" >&2

if [[ "$what" == index || "$what" == all ]]; then
    "$bin" index bench-ann --n "${N:-100000}" --dim "${DIM:-128}" --queries "${QUERIES:-1000}" \
        --m "${M:-16}" --ef-construction "${EFC:-200}" --efs "${EFS:-16,32,64,128,256}" \
        --out "$out/ann" >"$out/ann-ferrograph.json"
    "$venv/bin/python" benches/peers/hnswlib_bench.py "$out/ann" >"$out/ann-hnswlib.json"
    "$venv/bin/python" - "$out/ann-ferrograph.json" "$out/ann-hnswlib.json" <<'PY'
import json, sys
f = json.load(open(sys.argv[1])); h = json.load(open(sys.argv[2])); o = f["options"]
print(f"\n### Index: n={o['n']} dim={o['dim']} queries={o['queries']} k={o['k']} M={o['m']} ef_construction={o['ef_construction']}\n")
print(f"build: ferrograph graph {f['build_graph_s']:.2f} s (with sled commits {f['build_total_s']:.2f} s), "
      f"hnswlib {h['build_s']:.2f} s, ratio (hnswlib/ferrograph graph) {h['build_s']/f['build_graph_s']:.2f}")
print(f"exact search (ferrograph, 1 thread): {f['exact_qps']:.0f} QPS, recall 1.0\n")
print("| ef | ferrograph QPS | recall@10 | hnswlib QPS (call per query) | recall@10 | hnswlib QPS (batched, 1 thread) | QPS ratio vs per-call | QPS ratio vs batched | ferrograph vs exact |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for a, b in zip(f["results"], h["results"]):
    print(f"| {a['ef']} | {a['qps']:.0f} | {a['recall']:.4f} | {b['qps']:.0f} | {b['recall']:.4f} | {b['qps_batched']:.0f} | "
          f"{a['qps']/b['qps']:.2f} | {a['qps']/b['qps_batched']:.2f} | {a['qps']/f['exact_qps']:.1f}x |")
PY
fi

if [[ "$what" == embed || "$what" == all ]]; then
    # Sentences: chunks of this repository's sources, one per line (newlines flattened).
    "$venv/bin/python" - "${SENTENCES:-1000}" >"$out/sentences.txt" <<'PY'
import pathlib, sys
n = int(sys.argv[1]); out = []
for p in sorted(pathlib.Path("crates").rglob("*.rs")):
    lines = p.read_text(errors="replace").splitlines()
    for i in range(0, len(lines), 12):
        s = " ".join(l.strip() for l in lines[i:i + 12] if l.strip())
        if s:
            out.append(s[:600])
    if len(out) >= n:
        break
print("\n".join(out[:n]))
PY
    for round in $(seq 1 "${ROUNDS:-2}"); do
        echo "embeddings: round $round" >&2
        "$bin" index bench-embed --sentences "$out/sentences.txt" --batch "${BATCH:-32}" --runs 2 \
            --vectors-out "$out/embed-ferrograph.f32" >"$out/embed-ferrograph.json"
        "$venv/bin/python" benches/peers/embed_bench.py models/all-minilm-l6-v2 "$out/sentences.txt" \
            "${BATCH:-32}" 2 "$out/embed-ferrograph.f32" >"$out/embed-st.json"
        "$venv/bin/python" - "$out/embed-ferrograph.json" "$out/embed-st.json" "$round" <<'PY'
import json, sys
f = json.load(open(sys.argv[1])); s = json.load(open(sys.argv[2])); r = f.get("reference")
st = s["sentences_per_s"]
print(f"\n### Embeddings: all-MiniLM-L6-v2, {f['sentences']} sentences, batch {f['batch_size']}, round {sys.argv[3]}\n")
print("| engine | sentences/s | ratio to sentence-transformers |")
print("|---|---:|---:|")
print(f"| ferrograph ({f['engine']}) | {f['sentences_per_s']:.1f} | {f['sentences_per_s']/st:.2f} |")
if r:
    print(f"| ferrograph ({r['engine']}, f32) | {r['sentences_per_s']:.1f} | {r['sentences_per_s']/st:.2f} |")
print(f"| sentence-transformers (torch {s['torch']}, {s['torch_threads']} threads) | {st:.1f} | 1.00 |")
print(f"\nvectors, ferrograph ({f['engine']}) against sentence-transformers: cosine mean "
      f"{s['cosine_vs_ferrograph_mean']:.6f}, min {s['cosine_vs_ferrograph_min']:.6f}")
if r:
    print(f"against candle's f32 BERT: cosine mean {r['cosine_mean']:.6f}, min {r['cosine_min']:.6f}")
PY
    done
fi
