#!/usr/bin/env bash
# Create the Python environment used by the peer (LangGraph) benchmarks.
#
# Creates benches/peers/.venv (if missing) and installs the exact versions
# pinned in benches/peers/requirements.txt. A stamp file inside the venv records
# the hash of the requirements file and the interpreter version, so re-running
# when nothing changed is a no-op that takes a fraction of a second.
#
# Usage: scripts/setup-peers.sh            (PYTHON=python3.12 to pick another interpreter)
#        FORCE=1 scripts/setup-peers.sh     (reinstall even if the stamp matches)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
peers_dir="$repo_root/benches/peers"
venv="$peers_dir/.venv"
requirements="$peers_dir/requirements.txt"
stamp="$venv/.requirements.stamp"
python="${PYTHON:-python3}"

if ! command -v "$python" >/dev/null 2>&1; then
    echo "setup-peers: '$python' not found; set PYTHON to a Python >= 3.10 interpreter" >&2
    exit 1
fi

want="$(sha256sum "$requirements" | cut -d' ' -f1) $("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"

if [[ "${FORCE:-0}" != 1 && -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "setup-peers: $venv is up to date" >&2
    exit 0
fi

if [[ ! -x "$venv/bin/python" ]]; then
    echo "setup-peers: creating $venv" >&2
    "$python" -m venv "$venv"
fi

echo "setup-peers: installing $(grep -Ev '^\s*(#|$)' "$requirements" | tr '\n' ' ')" >&2
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
printf '%s\n' "$want" >"$stamp"
echo "setup-peers: done ($("$venv/bin/python" -c 'import importlib.metadata as m; print("langgraph", m.version("langgraph"))'))" >&2
