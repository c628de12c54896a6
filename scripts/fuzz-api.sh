#!/usr/bin/env bash
# Fuzzes the HTTP API with schemathesis against its own OpenAPI document: starts the test
# server (the console_server example of ferrograph-server, over a sled store in a temporary
# directory) and fails if any generated request gets a 5xx, or a response that does not match
# the document (status code, content type, body schema).
#
# schemathesis is installed from PyPI into target/fuzz-venv (pinned; reused when present).
set -euo pipefail
cd "$(dirname "$0")/.."

SCHEMATHESIS_VERSION="4.32.5"
target_dir="${CARGO_TARGET_DIR:-target}"
venv="$target_dir/fuzz-venv"
max_examples="${FUZZ_MAX_EXAMPLES:-30}"

if [ ! -x "$venv/bin/schemathesis" ] \
    || [ "$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("schemathesis"))' 2>/dev/null)" != "$SCHEMATHESIS_VERSION" ]; then
    echo "== installing schemathesis $SCHEMATHESIS_VERSION into $venv"
    if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' >/dev/null 2>&1; then
        SUDO=""
        if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
        export DEBIAN_FRONTEND=noninteractive
        $SUDO apt-get update -qq
        $SUDO apt-get install -y -qq --no-install-recommends python3 python3-venv >/dev/null
    fi
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "schemathesis==$SCHEMATHESIS_VERSION"
fi

echo "== building the test server"
# As scripts/test.sh builds it (see scripts/browser-test.sh).
cargo build -q --workspace --all-targets
bin="$target_dir/debug/examples/console_server"

work="$(mktemp -d /tmp/ferrograph-fuzz.XXXXXX)"
log="$work/server.log"
"$bin" --port 0 --data-dir "$work/data" >"$log" 2>&1 &
pid=$!
cleanup() {
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

url=""
for _ in $(seq 1 300); do
    url="$(sed -n 's/^listening on //p' "$log" | head -n1)"
    [ -n "$url" ] && break
    if ! kill -0 "$pid" 2>/dev/null; then
        echo "the test server exited:" >&2
        cat "$log" >&2
        exit 1
    fi
    sleep 0.1
done
if [ -z "$url" ]; then
    echo "the test server did not start:" >&2
    cat "$log" >&2
    exit 1
fi

# GET /threads/{id}/events is an endless live stream (it stays open until the client leaves), so
# it is left out here; tests/tests/server_api.rs covers it.
echo "== schemathesis against $url/openapi.json (max $max_examples examples per operation)"
status=0
"$venv/bin/schemathesis" run "$url/openapi.json" \
    --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance \
    --max-examples "$max_examples" \
    --seed 8 \
    --request-timeout 5 \
    --exclude-operation-id threadEvents \
    --generation-database none \
    --no-color \
    || status=$?
# How far the generated requests got: runs by outcome, and supersteps executed.
python3 - "$url/metrics" <<'PY' || true
import sys, urllib.request
runs, steps = {}, 0
for line in urllib.request.urlopen(sys.argv[1], timeout=5).read().decode().splitlines():
    if line.startswith("ferrograph_runs_total{"):
        status = line.split('status="', 1)[1].split('"', 1)[0]
        runs[status] = runs.get(status, 0) + int(float(line.rsplit(" ", 1)[1]))
    elif line.startswith("ferrograph_steps_total{"):
        steps += int(float(line.rsplit(" ", 1)[1]))
total = sum(runs.values())
detail = ", ".join(f"{n} {s}" for s, n in sorted(runs.items()))
print(f"generated requests reached {total} runs ({detail or 'none'}), {steps} supersteps executed")
PY
if ! kill -0 "$pid" 2>/dev/null; then
    echo "the server died during fuzzing:" >&2
    tail -n 50 "$log" >&2
    exit 1
fi
if [ "$status" != 0 ]; then
    echo "schemathesis reported failures (exit $status)" >&2
    exit "$status"
fi
echo "fuzzing passed: no 5xx, every response matches the OpenAPI document"
