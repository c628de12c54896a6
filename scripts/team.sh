#!/usr/bin/env bash
# The eight-agent team (seed 003) on the fixture brief: builds the ferrograph CLI for this
# machine's CPU, writes the fixture briefs into ./teamwork on first use, and runs the
# word-statistics brief on the local SmolLM2 model up to the stories gate. It prints the
# stories and the commands that approve or reject them.
# Extra arguments replace the defaults: scripts/team.sh --brief DIR_OR_FILE [--deploy-to DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="${RUSTFLAGS:--C target-cpu=native}"
cargo build --release -p ferrograph-cli
bin="${CARGO_TARGET_DIR:-target}/release/ferrograph"
if [ "$#" -eq 0 ]; then
  if [ ! -d teamwork/wordstats ]; then
    "$bin" team fixture teamwork
  fi
  set -- --brief teamwork/wordstats
fi
exec "$bin" run team "$@"
