#!/usr/bin/env bash
# Ticket to pull request on the TaskMaster fixture: builds the ferrograph CLI for this
# machine's CPU, writes the fixture (a git repository and its tickets) into ./taskmaster on
# first use, and runs the bug ticket TASK-101 on the local SmolLM2 model up to the review
# gate. It prints the proposed diff and the commands that approve, reject or send feedback.
# Extra arguments replace the defaults: scripts/ticket-to-pr.sh --ticket KEY --tickets DIR --repo DIR
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="${RUSTFLAGS:--C target-cpu=native}"
cargo build --release -p ferrograph-cli
bin="${CARGO_TARGET_DIR:-target}/release/ferrograph"
if [ "$#" -eq 0 ]; then
  if [ ! -d taskmaster/repo ]; then
    "$bin" tickets fixture taskmaster
  fi
  set -- --ticket TASK-101 --tickets taskmaster/tickets --repo taskmaster/repo
fi
exec "$bin" run ticket-to-pr "$@"
