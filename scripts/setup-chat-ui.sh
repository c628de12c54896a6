#!/usr/bin/env bash
# Builds LangGraph's agent chat UI for the chat-UI test (tests/chat-ui/turn.mjs).
#
# The UI is not published on npm as a package of its own; it ships as the templates of
# `create-agent-chat-app`. This fetches that package (0.1.6, sha256-checked) with `npm pack`,
# takes its Vite template's source unchanged, installs the template's dependencies at the
# versions pinned in tests/chat-ui/package-lock.json (the packages that run LangGraph's own
# server are left out: our server takes their place), and builds it with Vite into
# target/chat-ui/dist. Idempotent: does nothing when the build is newer than the lock file.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION="0.1.6"
SHA256="233d24e6d2a69d5941282b25fb3da9939ff4e1cab286b212e7f202ad260bca5c"
root="${CARGO_TARGET_DIR:-target}/chat-ui"
app="$root/app"

if [ -f "$root/dist/index.html" ] && [ "$root/dist/index.html" -nt tests/chat-ui/package-lock.json ]; then
    exit 0
fi
mkdir -p "$root"
tgz="$root/create-agent-chat-app-$VERSION.tgz"
if [ ! -f "$tgz" ] || ! echo "$SHA256  $tgz" | sha256sum -c --quiet - 2>/dev/null; then
    echo "== npm pack create-agent-chat-app@$VERSION"
    (cd "$root" && npm pack "create-agent-chat-app@$VERSION" --silent >/dev/null)
    echo "$SHA256  $tgz" | sha256sum -c --quiet - || { echo "create-agent-chat-app $VERSION: sha256 mismatch" >&2; exit 1; }
fi
rm -rf "$app" "$root/package"
tar -C "$root" -xzf "$tgz" package/templates/vite
mv "$root/package/templates/vite" "$app"
rm -rf "$root/package"
cp tests/chat-ui/package.json tests/chat-ui/package-lock.json "$app/"
echo "== npm ci (the chat UI's dependencies)"
(cd "$app" && npm ci --no-audit --no-fund --loglevel=error)
echo "== vite build"
rm -rf "$root/dist"
(cd "$app" && npx vite build --logLevel error --outDir "$(cd .. && pwd)/dist")
test -f "$root/dist/index.html"
