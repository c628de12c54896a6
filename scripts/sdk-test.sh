#!/usr/bin/env bash
# LangGraph's official clients, unpatched, against our server: the Python `langgraph-sdk`
# (PyPI, pinned, into target/sdk-venv) and the JavaScript `@langchain/langgraph-sdk` (npm,
# pinned by tests/sdk/js/package-lock.json) each run their script (tests/sdk/) against a test
# server started here (the server crate's console_server example: the built-in workflows over
# sled, with a long-term store). Idempotent; needs python3 with venv, node and npm.
set -euo pipefail
cd "$(dirname "$0")/.."

SDK_VERSION="0.4.14"
target_dir="${CARGO_TARGET_DIR:-target}"
venv="$target_dir/sdk-venv"
if [ ! -x "$venv/bin/python" ] \
    || [ "$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("langgraph-sdk"))' 2>/dev/null)" != "$SDK_VERSION" ]; then
    echo "== installing langgraph-sdk $SDK_VERSION into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "langgraph-sdk==$SDK_VERSION"
fi
if [ ! -f tests/sdk/js/node_modules/@langchain/langgraph-sdk/package.json ] \
    || [ tests/sdk/js/package-lock.json -nt tests/sdk/js/node_modules/.package-lock.json ]; then
    echo "== npm ci (tests/sdk/js)"
    (cd tests/sdk/js && npm ci --no-audit --no-fund --loglevel=error)
fi

echo "== building the test server"
cargo build -q -p ferrograph-server --example console_server
bin="$target_dir/debug/examples/console_server"

work="$(mktemp -d /tmp/ferrograph-sdk.XXXXXX)"
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

echo "== langgraph-sdk (Python) against $url"
"$venv/bin/python" tests/sdk/client.py "$url"
echo "== @langchain/langgraph-sdk (JavaScript) against $url"
(cd tests/sdk/js && node client.mjs "$url")
