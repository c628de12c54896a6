#!/usr/bin/env bash
# ferrograph against llama.cpp's own llama-bench and llama-server at every shape
# (`ferrograph bench llm --peer llama-cpp`), for each model and thread count given, then the
# plots (docs/bench/llm-vs-llama-cpp.png and .svg) and the JSON next to them.
#
# Builds what it needs: the release CLI (target-cpu=native), llama.cpp's tools
# (scripts/setup-llama-cpp.sh), matplotlib in .peers/plot-venv. Takes README figures only
# with nothing else running on the machine.
#
# Usage: scripts/bench-llm-peers.sh [--rounds N] [MODEL[:THREADS] ...]
#        (default: smollm2-135m-instruct-q4_1:2, 2 rounds; MODEL is a manifest name or a path)
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
rounds=2
if [[ "${1:-}" == --rounds ]]; then rounds="$2"; shift 2; fi
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=("smollm2-135m-instruct-q4_1:2")

RUSTFLAGS="-C target-cpu=native" cargo build --release -p ferrograph-cli
scripts/setup-llama-cpp.sh
if [[ ! -x .peers/plot-venv/bin/python ]] || ! .peers/plot-venv/bin/python -c 'import matplotlib' 2>/dev/null; then
    python3 -m venv .peers/plot-venv
    .peers/plot-venv/bin/python -m pip install --quiet matplotlib
fi
out=docs/bench
mkdir -p "$out"
jsons=()
for t in "${targets[@]}"; do
    model="${t%%:*}"; threads=2
    [[ "$t" == *:* ]] && threads="${t##*:}"
    name="$(basename "$model" .gguf)-t$threads"
    echo "== $model, $threads thread(s), $rounds rounds" >&2
    target/release/ferrograph bench llm --model "$model" --threads "$threads" \
        --peer llama-cpp --rounds "$rounds" --json >"$out/$name.json"
    .peers/plot-venv/bin/python - "$out/$name.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{r['model']} ({r['architecture']}), {r['threads']} thread(s), llama.cpp {r['llama_cpp_build']}")
for row in r["rows"]:
    print(f"  {row['shape']:<10} {row['at']:>5}: ours {row['ours']:8.1f}  llama.cpp {row['llama_cpp']:8.1f}  "
          f"ratio {row['ratio']['median']:.2f} ({row['ratio']['min']:.2f}-{row['ratio']['max']:.2f})")
print(f"  peak RSS ratio {r['rss_ratio']['median']:.2f}")
PY
    jsons+=("$out/$name.json")
done
.peers/plot-venv/bin/python scripts/plot-llm-bench.py "${jsons[@]}" "$out"
