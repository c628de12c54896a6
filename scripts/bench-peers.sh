#!/usr/bin/env bash
# Side-by-side graph-execution benchmark: ferrograph vs LangGraph.
#
# 1. scripts/setup-peers.sh    -- make sure the pinned LangGraph venv exists;
# 2. cargo build --release -p ferrograph-cli
#                               (RUSTFLAGS defaults to "-C target-cpu=native");
# 3. benches/peers/compare_graph.py -- run both engines, print a Markdown table.
#
# All arguments go to compare_graph.py, e.g.:
#   scripts/bench-peers.sh            # full run (~2-3 s per configuration and engine)
#   scripts/bench-peers.sh --quick    # short smoke run
#   scripts/bench-peers.sh --json     # merged results as JSON
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

"$repo_root/scripts/setup-peers.sh"

export RUSTFLAGS="${RUSTFLAGS--C target-cpu=native}"
echo "bench-peers: cargo build --release -p ferrograph-cli (RUSTFLAGS='$RUSTFLAGS')" >&2
cargo build --release -p ferrograph-cli

target_dir="${CARGO_TARGET_DIR:-$repo_root/target}"
ferrograph_bin="$(printf '%q' "$target_dir/release/ferrograph")"

# Our --ferrograph-cmd comes first so that one given on the command line wins.
exec python3 "$repo_root/benches/peers/compare_graph.py" \
    --ferrograph-cmd "$ferrograph_bin bench graph --json" "$@"
