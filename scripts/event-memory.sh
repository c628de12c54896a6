#!/usr/bin/env bash
# How much memory `ferrograph serve` holds after many Agent Server API runs whose events
# nobody reads: N stateless `demo` runs of STEPS commits each (every commit is a task, so
# each run makes thousands of events), then the server's resident set size.
#
#   scripts/event-memory.sh [RUNS] [STEPS] [extra serve flags...]
#   scripts/event-memory.sh 100 2000 --keep-events-mib 64
#
# ON_COMPLETION=delete makes the runs' threads go afterwards (the default keeps them).
# Uses target/release/ferrograph when built, else target/debug/ferrograph.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-100}
steps=${2:-2000}
shift $(( $# > 2 ? 2 : $# ))
bin=target/release/ferrograph
[ -x "$bin" ] || bin=target/debug/ferrograph
[ -x "$bin" ] || { echo "build ferrograph first: cargo build --release -p ferrograph-cli" >&2; exit 2; }
data=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$bin" --data-dir "$data" serve --bind "127.0.0.1:$port" "$@" >"$data/serve.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$data"' EXIT
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.1; done
rss() { awk '/VmRSS/ {print int($2/1024)}' "/proc/$pid/status"; }
body=$(python3 -c "import json,sys; print(json.dumps({'assistant_id':'demo','input':{'commits':['feat: change %d' % i for i in range(int(sys.argv[1]))]},'on_completion':sys.argv[2]}))" "$steps" "${ON_COMPLETION:-keep}")
echo "binary $bin; $runs runs of $steps tasks; serve flags: ${*:-(defaults)}"
echo "rss at start: $(rss) MiB"
start=$(date +%s)
for i in $(seq "$runs"); do
  curl -sf -X POST "http://127.0.0.1:$port/runs/wait" -H 'content-type: application/json' -d "$body" >/dev/null
  if (( i % 25 == 0 )); then echo "after $i runs: rss $(rss) MiB"; fi
done
echo "rss after $runs runs: $(rss) MiB ($(( $(date +%s) - start )) s)"
