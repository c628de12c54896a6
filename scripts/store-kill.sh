#!/usr/bin/env bash
# The long-term store's kill test at length: a worker puts and deletes items in a semantic
# store and is killed with SIGKILL N times (default 200); after every kill, every acknowledged
# put is there, no acknowledged delete is undone, and every item present has its vector.
# CI runs 6 trials as part of the test suite.
#   scripts/store-kill.sh [TRIALS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
FERROGRAPH_STORE_KILL_TRIALS="${1:-200}" \
    cargo test -q -p ferrograph-tests --test store_crash -- --nocapture
