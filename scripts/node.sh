#!/usr/bin/env bash
# A cluster node: builds the ferrograph CLI for this machine's CPU (the same build as
# scripts/triage.sh) and runs `ferrograph node` with the arguments given, for example
#   FERROGRAPH_CLUSTER_COOKIE=… scripts/node.sh --name models --listen 127.0.0.1:7400 --serve-model default
# See the README's "Clusters" section.
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="${RUSTFLAGS:--C target-cpu=native}"
cargo build --release -p ferrograph-cli
exec "${CARGO_TARGET_DIR:-target}/release/ferrograph" node "$@"
