#!/usr/bin/env bash
# Long crash test: kills the crash worker with SIGKILL at random points at least 200 times
# (FERROGRAPH_CRASH_TRIALS, default 200) and checks that resumed threads neither lose committed
# checkpoints nor re-run tasks whose output was saved, and end in the uninterrupted state.
# See tests/tests/crash.rs for the checks. Extra arguments go to the test binary.
#   scripts/crash-long.sh
#   FERROGRAPH_CRASH_TRIALS=1000 scripts/crash-long.sh
#   FERROGRAPH_CRASH_SEED=123 scripts/crash-long.sh     # replay a sequence of kill delays
set -euo pipefail
cd "$(dirname "$0")/.."
export FERROGRAPH_CRASH_TRIALS="${FERROGRAPH_CRASH_TRIALS:-200}"
exec cargo test -p ferrograph-tests --test crash -- \
    killed_workers_resume_without_losing_or_repeating_work --nocapture --exact "$@"
