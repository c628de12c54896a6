#!/usr/bin/env bash
# Runs the fraud workflow with the local model (planner and reasoner) on every pending case of
# the generated dataset and counts the planner's decisions: chosen by the model, forced by the
# safety rules (one legal step), or handed to the deterministic sequence (fallback).
# Usage: scripts/fraud-planner-eval.sh [DATA_DIR]   (default: a fresh temporary folder)
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="${RUSTFLAGS:--C target-cpu=native}"
cargo build --release -p ferrograph-cli
bin="${CARGO_TARGET_DIR:-target}/release/ferrograph"
data="${1:-$(mktemp -d)}"
export FERROGRAPH_DATA_DIR="$data"
"$bin" fraud gen-data >/dev/null
mapfile -t cases < <("$bin" fraud cases | awk '{print $1}')
for tx in "${cases[@]}"; do
    "$bin" run fraud --quiet --thread "eval-$tx" --transaction "$tx" >/dev/null
done
python3 - "$bin" "${cases[@]}" <<'EOF'
import json, subprocess, sys
bin, cases = sys.argv[1], sys.argv[2:]
model = forced = fallback = 0
for tx in cases:
    out = subprocess.run([bin, "threads", "show", f"eval-{tx}"], capture_output=True, text=True, check=True).stdout
    state = json.loads(out)["state"]
    state = state.get("values", state)
    for d in state["planner_decisions"]:
        if d.get("forced"):
            forced += 1
        elif d["used_fallback"]:
            fallback += 1
        else:
            model += 1
total = model + forced + fallback
print(f"{len(cases)} cases, {total} planner decisions: {model} chosen by the model, "
      f"{forced} forced by the rules, {fallback} fallbacks "
      f"({100.0 * fallback / max(1, total):.1f}% of all, "
      f"{100.0 * fallback / max(1, model + fallback):.1f}% of the decisions the model was asked for)")
EOF
