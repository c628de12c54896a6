#!/usr/bin/env bash
# LangGraph's official clients, unpatched, against our server: the Python `langgraph-sdk`
# (PyPI, pinned, into target/sdk-venv) and the JavaScript `@langchain/langgraph-sdk` (npm,
# pinned by tests/sdk/js/package-lock.json) each run their script (tests/sdk/) against
# `ferrograph serve` started here on a fresh data folder (every built-in workflow; triage on
# the real SmolLM2 over the fixture repository). Then LangGraph's agent chat UI (built by
# scripts/setup-chat-ui.sh) holds one chat turn with `chatbot` in headless Chromium
# (tests/chat-ui/turn.mjs). Idempotent; needs python3 with venv, node, and npm.
set -euo pipefail
cd "$(dirname "$0")/.."

SDK_VERSION="0.4.14"
# The Prometheus project's Python client: its OpenMetrics parser checks our /metrics.
PROM_VERSION="0.21.1"
target_dir="${CARGO_TARGET_DIR:-target}"
venv="$target_dir/sdk-venv"
if [ ! -x "$venv/bin/python" ] \
    || [ "$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("langgraph-sdk"))' 2>/dev/null)" != "$SDK_VERSION" ]; then
    echo "== installing langgraph-sdk $SDK_VERSION into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "langgraph-sdk==$SDK_VERSION"
fi
if [ "$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("prometheus-client"))' 2>/dev/null)" != "$PROM_VERSION" ]; then
    "$venv/bin/pip" install -q --disable-pip-version-check "prometheus-client==$PROM_VERSION"
fi
if [ ! -f tests/sdk/js/node_modules/@langchain/langgraph-sdk/package.json ] \
    || [ tests/sdk/js/package-lock.json -nt tests/sdk/js/node_modules/.package-lock.json ]; then
    echo "== npm ci (tests/sdk/js)"
    (cd tests/sdk/js && npm ci --no-audit --no-fund --loglevel=error)
fi

bash scripts/setup-browser.sh >/dev/null
bash scripts/setup-chat-ui.sh

echo "== building ferrograph"
# As scripts/test.sh builds it (see scripts/browser-test.sh).
cargo build -q --workspace --all-targets
bin="$target_dir/debug/ferrograph"
# The triage run uses the real SmolLM2 (fetched into models/, sha256-checked).
bash scripts/fetch-models.sh >/dev/null

work="$(mktemp -d /tmp/ferrograph-sdk.XXXXXX)"
log="$work/server.log"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port="$(free_port)"
ui_port="$(free_port)"
ui="http://127.0.0.1:$ui_port"
fixture="$(pwd)/tests/fixtures/triage"
# The chat UI is served from its own origin, which the API lets call it (CORS).
python3 -m http.server --bind 127.0.0.1 "$ui_port" --directory "$target_dir/chat-ui/dist" >"$work/ui.log" 2>&1 &
ui_pid=$!
FERROGRAPH_DATA_DIR="$work/data" "$bin" serve --bind "127.0.0.1:$port" --workspace "$fixture" \
    --allow-origin "$ui" >"$log" 2>&1 &
pid=$!
cleanup() {
    kill "$pid" "$ui_pid" 2>/dev/null || true
    wait "$pid" "$ui_pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
url="http://127.0.0.1:$port"
# Python rather than curl, which a bare CI image may lack.
get() { python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' "$1"; }
for _ in $(seq 1 600); do
    get "$url/healthz" >/dev/null 2>&1 && break
    if ! kill -0 "$pid" 2>/dev/null; then
        echo "ferrograph serve exited:" >&2
        cat "$log" >&2
        exit 1
    fi
    sleep 0.1
done
get "$url/healthz" >/dev/null || { echo "ferrograph serve did not start:" >&2; cat "$log" >&2; exit 1; }

# Triage's input, from the fixture issue (the same fields `ferrograph run triage --issue …`
# makes); its output folder is taken from the server's data folder.
python3 - "$fixture" >"$work/triage.json" <<'PY'
import json, sys
root = sys.argv[1]
lines = open(f"{root}/issue.md").read().strip().splitlines()
title = lines[0].lstrip("#").strip()
print(json.dumps({"issue_title": title, "issue_body": "\n".join(lines[1:]).strip(),
                  "repository": f"{root}/repo", "docs_dir": f"{root}/docs"}))
PY

echo "== langgraph-sdk (Python) against ferrograph serve at $url"
"$venv/bin/python" tests/sdk/client.py "$url" --triage "$work/triage.json"
echo "== @langchain/langgraph-sdk (JavaScript) against ferrograph serve at $url"
(cd tests/sdk/js && node client.mjs "$url" --triage "$work/triage.json")

echo "== LangGraph's agent chat UI ($ui) against ferrograph serve: one turn with chatbot"
node tests/chat-ui/turn.mjs "$ui" "$url"

echo "== /metrics after those runs, through the Prometheus client's OpenMetrics parser"
get "$url/metrics" >"$work/metrics.txt"
"$venv/bin/python" - "$work/metrics.txt" <<'PY'
import sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
families = {f.name: f for f in text_string_to_metric_families(open(sys.argv[1]).read())}
runs = families["ferrograph_runs"]
assert runs.type == "counter", runs.type
done = sum(s.value for s in runs.samples if s.labels.get("status") == "done" and s.name.endswith("_total"))
assert done >= 4, f"expected the SDK runs among the done runs, got {done}"
assert families["ferrograph_node_duration_seconds"].type == "histogram"
assert "ticket_pr_runs" in families and "ops_agent_planner_decisions" in families, sorted(families)
print(f"ok: {len(families)} metric families parse as OpenMetrics; {int(done)} runs done")
PY
