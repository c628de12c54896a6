#!/usr/bin/env bash
# Long crash test, at least 200 SIGKILLs of each kind:
#   - the crash worker (graph semantics) killed at random points (FERROGRAPH_CRASH_TRIALS, 200):
#     resumed threads neither lose committed checkpoints nor re-run tasks whose output was saved,
#     and end in the uninterrupted state (tests/tests/crash.rs);
#   - the fraud investigation and the triage (no model) killed at their five kill points,
#     FERROGRAPH_KILL_ROUNDS rounds (40: 200 kills each), every resumed run ending as an
#     uninterrupted one (crates/ferrograph-cli/tests/{fraud,triage}_cli.rs);
#   - the server killed with resumes, first inputs and creates in flight FERROGRAPH_SERVER_KILLS
#     times (200), every acknowledged thread present and taken to done (tests/tests/server_crash.rs).
#   scripts/crash-long.sh
#   FERROGRAPH_CRASH_TRIALS=1000 scripts/crash-long.sh
#   FERROGRAPH_CRASH_SEED=123 scripts/crash-long.sh     # replay a sequence of kill delays
set -euo pipefail
cd "$(dirname "$0")/.."
export FERROGRAPH_CRASH_TRIALS="${FERROGRAPH_CRASH_TRIALS:-200}"
export FERROGRAPH_KILL_ROUNDS="${FERROGRAPH_KILL_ROUNDS:-40}"
export FERROGRAPH_SERVER_KILLS="${FERROGRAPH_SERVER_KILLS:-200}"

echo "== graph semantics: $FERROGRAPH_CRASH_TRIALS kills of the crash worker"
cargo test --workspace --test crash -- \
    killed_workers_resume_without_losing_or_repeating_work --nocapture --exact "$@"

echo "== fraud and triage: $FERROGRAPH_KILL_ROUNDS rounds of five kill points each"
cargo test --workspace --test fraud_cli -- \
    killed_after_each_of_five_tools_every_investigation_resumes_to_the_same_end --exact
cargo test --workspace --test triage_cli -- \
    killed_at_five_points_without_a_model_every_triage_resumes_to_the_uninterrupted_report --exact

echo "== server: $FERROGRAPH_SERVER_KILLS kills with work in flight"
log="$(mktemp)"
if ! cargo test --workspace --test server_crash -- \
    a_sigkill_with_resumes_in_flight_leaves_every_thread_answerable --nocapture --exact >"$log" 2>&1; then
    tail -n 60 "$log"
    exit 1
fi
# (Clients cut off by a kill print connection-reset panics, caught by the test: expected.)
grep -E "^after|test result" "$log"
rm -f "$log"
