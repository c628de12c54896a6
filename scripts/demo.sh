#!/usr/bin/env bash
# Builds the ferrograph CLI for this machine's CPU and runs the demo workflow with streaming.
# Extra arguments are passed to `ferrograph run demo` (e.g. --input FILE).
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="${RUSTFLAGS:--C target-cpu=native}"
cargo build --release -p ferrograph-cli
exec "${CARGO_TARGET_DIR:-target}/release/ferrograph" run demo --stream "$@"
