#!/usr/bin/env bash
# Runs the whole ferrograph test suite: formatting, lints, unit tests, the semantics suite,
# checkpoint and crash tests, doc tests, and every bench once in test mode.
# Needs the Rust toolchain (cargo, rustfmt, clippy) and python3 with venv; the scripts fetch the
# rest (crates, pip packages for the peer server, browser and fuzz tests, the CUDA compiler).
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings

echo "== llama-cpp-python's OpenAI-compatible server, for the remote adapter's real-server test"
bash scripts/setup-llama-server.sh

echo "== cargo test"
cargo test --workspace --all-targets
cargo test --workspace --doc

echo "== browser test of the web console (headless chromium)"
bash scripts/browser-test.sh

echo "== API fuzzing (schemathesis against /openapi.json)"
bash scripts/fuzz-api.sh

echo "== CUDA build check (nvcc from PyPI; no GPU needed)"
bash scripts/check-cuda.sh
