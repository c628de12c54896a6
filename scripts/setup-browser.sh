#!/usr/bin/env bash
# Installs what the browser test needs: Debian's chromium (apt, as root) and the Node packages of
# tests/browser (playwright-core only; it never downloads a browser). Idempotent: does nothing
# that is already done.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x /usr/bin/chromium ]; then
    echo "== installing chromium (apt)"
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
fi
/usr/bin/chromium --version 2>/dev/null

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "== installing nodejs and npm (apt)"
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi

cd tests/browser
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
if [ ! -f node_modules/playwright-core/package.json ] \
    || [ package-lock.json -nt node_modules/.package-lock.json ]; then
    echo "== npm ci (tests/browser)"
    npm ci --no-audit --no-fund --loglevel=error
fi
