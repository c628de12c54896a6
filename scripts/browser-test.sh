#!/usr/bin/env bash
# Browser end-to-end test of the web console: starts the test server (the console_server
# example of ferrograph-server, over a sled store in a temporary directory), then drives the
# console in headless Chromium (tests/browser/test.mjs): start a `review` run, wait for the
# interrupt, approve it, see the thread reach `done`. Runs twice: without a token (EventSource)
# and against a server that requires one (the console asks for it). Then the chat page
# (tests/browser/chat.mjs) against the tutor: a streamed answer, a two-question quiz answered
# with its buttons, a reload. Then ticket-to-pr's review gate (tests/browser/ticket.mjs): the
# unified diff rendered with coloured code, approved to a pull request. Screenshots go to /tmp.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup-browser.sh

echo "== building the test server"
# The whole workspace's targets, as scripts/test.sh builds them (nothing to do after it): a
# build of this package alone would resolve features differently and rebuild the workspace.
cargo build -q --workspace --all-targets
target_dir="${CARGO_TARGET_DIR:-target}"
bin="$target_dir/debug/examples/console_server"

work="$(mktemp -d /tmp/ferrograph-browser.XXXXXX)"
pids=()
cleanup() {
    for p in "${pids[@]}"; do
        kill "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    rm -rf "$work"
}
trap cleanup EXIT

# start_server NAME [ARGS...]: starts a server, sets $url.
start_server() {
    local name="$1"
    shift
    local log="$work/$name.log"
    "$bin" --port 0 --data-dir "$work/$name" "$@" >"$log" 2>&1 &
    local pid=$!
    pids+=("$pid")
    url=""
    for _ in $(seq 1 300); do
        url="$(sed -n 's/^listening on //p' "$log" | head -n1)"
        [ -n "$url" ] && return 0
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "the test server exited:" >&2
            cat "$log" >&2
            exit 1
        fi
        sleep 0.1
    done
    echo "the test server did not start:" >&2
    cat "$log" >&2
    exit 1
}

export SCREENSHOT_DIR="${SCREENSHOT_DIR:-/tmp}"
start_server open --tutor
echo "== console test against $url"
node tests/browser/test.mjs "$url"
echo "== chat page test against $url"
node tests/browser/chat.mjs "$url"

start_server tickets --ticket-pr
echo "== ticket-to-pr review gate (diff) against $url"
node tests/browser/ticket.mjs "$url" "$work/tickets/fx"

start_server team --team
echo "== team gates (stories, deployment) against $url"
node tests/browser/team.mjs "$url" "$work/team/teamfx/wordstats"

token="browser-test-$RANDOM$RANDOM"
start_server guarded --token "$token"
echo "== console test against $url (bearer token required)"
node tests/browser/test.mjs "$url" --token "$token"
