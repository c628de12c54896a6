#!/usr/bin/env bash
# Offline proof: runs ferrograph inside a network namespace that has loopback only, traced
# with strace, and fails if any process tries to reach an address other than loopback (a
# connect or a datagram to any other IPv4/IPv6 address, DNS lookups included), even one whose
# failure the code would have absorbed.
#
#   scripts/offline-check.sh           the whole test suite and the main job (scripts/triage.sh)
#   scripts/offline-check.sh --smoke   the HTTP API tests, and the main job from a bundle (CI)
#
# Both modes make an air-gapped bundle outside the namespace (`ferrograph bundle create`: the
# CLI, release or debug, and the default models), and inside install it with `ferrograph bundle
# install` into a fresh folder and run the main job from the installed binary, from a folder
# outside the checkout with an empty home.
#
# What needs a registry happens before the namespace is entered and is named as it happens:
# building, fetching the default models, and (full run) the llama-cpp-python server and the
# evaluation's cached downloads. Where the kernel or container allows no network namespace,
# the script says so and exits 0 without checking anything.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=full
case "${1:-}" in
    "") ;;
    --smoke) mode=smoke ;;
    *) echo "usage: scripts/offline-check.sh [--smoke]" >&2; exit 2 ;;
esac
target_dir="${CARGO_TARGET_DIR:-target}"

if unshare -n true 2>/dev/null; then
    ns=(unshare -n)
elif unshare -rn true 2>/dev/null; then
    ns=(unshare -rn)
else
    echo "offline check SKIPPED: this kernel or container allows no network namespace (unshare -n and unshare -rn failed)"
    exit 0
fi

# strace and ip, installed where missing; a machine that cannot have them is skipped with the
# reason, like one without namespaces.
install() {
    local SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends "$@"; } >/dev/null 2>&1 || true
}
command -v strace >/dev/null 2>&1 || { echo "== installing strace"; install strace; }
command -v ip >/dev/null 2>&1 || { echo "== installing iproute2"; install iproute2; }
for tool in strace ip; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "offline check SKIPPED: $tool is missing and could not be installed"
        exit 0
    fi
done
if ! "${ns[@]}" strace -f --seccomp-bpf -qq -o /dev/null -e trace=connect true 2>/dev/null; then
    echo "offline check SKIPPED: strace cannot trace here (ptrace or seccomp refused inside the namespace)"
    exit 0
fi
if ! "${ns[@]}" ip link set lo up 2>/dev/null; then
    echo "offline check SKIPPED: the namespace's loopback cannot be brought up"
    exit 0
fi

work="$(mktemp -d /tmp/ferrograph-offline.XXXXXX)"
trap 'rm -rf "$work"' EXIT

# Lists traced attempts to reach a non-loopback address: connect/sendto/sendmsg with an
# AF_INET or AF_INET6 address other than 127.0.0.0/8, ::1 or ::ffff:127.x, or the unspecified
# address; and connections made to the host's name-resolution daemons over their local
# sockets (systemd-resolved, nscd), which would resolve names outside the namespace. glibc
# tries nscd's socket on every user or host lookup; where no daemon listens the connect fails
# (ENOENT, ECONNREFUSED) and reaches nothing, so only connects that succeeded count. (On a host
# that does run nscd, a user lookup through it is reported too: on the safe side.)
violations() {
    {
        grep -E 'sa_family=AF_INET6?' "$1" \
            | grep -vE 'inet_addr\("127\.[0-9.]+"\)|inet_pton\(AF_INET6, "::1"|inet_pton\(AF_INET6, "::ffff:127\.[0-9.]+"|inet_addr\("0\.0\.0\.0"\)|inet_pton\(AF_INET6, "::"\)'
        grep -E 'sun_path="(/run/systemd/resolve/|/var/run/nscd/|/run/nscd/)' "$1" \
            | grep -E '= 0$|<unfinished'
    } || true
}

# The traced, namespaced shell: loopback up, cargo offline, then the commands.
run_offline() {
    local trace="$1"
    shift
    "${ns[@]}" strace -f --seccomp-bpf -qq -o "$trace" \
        -e trace=connect,sendto,sendmsg -e signal=none \
        bash -c 'set -euo pipefail; ip link set lo up; export CARGO_NET_OFFLINE=true; '"$*"
}

echo "== offline check ($mode): the detector must see a deliberate attempt"
if run_offline "$work/canary.trace" \
    "python3 -c 'import socket; s = socket.socket(); s.settimeout(1); print(s.connect_ex((\"192.0.2.1\", 80)))'" >/dev/null; then
    :
fi
if [ -z "$(violations "$work/canary.trace")" ]; then
    echo "offline check FAILED: a connect to 192.0.2.1 inside the namespace was not detected" >&2
    cat "$work/canary.trace" >&2
    exit 1
fi

# The commands that install the bundle at $work/ferrograph.tar.gz with binary $1 and run the
# main job from the install: verify, install into $work/opt, check that the installed binary
# finds its models in the install (not in this checkout), triage the fixture copied elsewhere.
bundle_run() {
    local fixture="$PWD/tests/fixtures/triage" bin
    bin="$(realpath "$1")"
    # A subshell: the home and folder changes end with it (cargo and rustup need the real home).
    cat <<EOF
        (
        export HOME='$work/home'
        unset FERROGRAPH_HOME FERROGRAPH_MODELS_DIR FERROGRAPH_CACHE_DIR
        mkdir -p '$work/elsewhere' && cp -r '$fixture' '$work/elsewhere/'
        cd '$work/elsewhere'
        '$bin' bundle verify '$work/ferrograph.tar.gz'
        '$bin' bundle install '$work/ferrograph.tar.gz' --prefix '$work/opt'
        '$work/opt/bin/ferrograph' models verify smollm2-135m-instruct-q4_1 all-minilm-l6-v2 | tee '$work/verify.txt'
        grep -q '^smollm2-135m-instruct-q4_1 *ok *$work/opt/models/' '$work/verify.txt'
        '$work/opt/bin/ferrograph' --data-dir '$work/bundle-data' run triage --quiet \\
            --issue triage/issue.md --repo triage/repo --docs triage/docs --out '$work/bundle-report'
        test -s '$work/bundle-report/triage-report.md'
        echo 'bundle: installed and ran the main job offline from $work/opt'
        )
EOF
}

echo "== preparing outside the namespace (needs the registries)"
if [ "$mode" = smoke ]; then
    # The test build of scripts/test.sh (same features; it also builds the CLI binary), so
    # nothing is rebuilt after it.
    cargo test -q --workspace --all-targets --no-run
    bin="$target_dir/debug/ferrograph"
    "$bin" models fetch
    echo "== air-gapped bundle: the debug binary and the fast-tier models (CI keeps SmolLM2)"
    "$bin" bundle create --models smollm2-135m-instruct-q4_1,all-minilm-l6-v2 --out "$work/ferrograph.tar.gz"
    # The triage's chosen model is not in this bundle: the run names SmolLM2.
    export FERROGRAPH_TRIAGE_MODEL=smollm2-135m-instruct-q4_1
    # Inside: the bundle is installed and the main job runs from the installed binary, in a
    # folder outside the checkout, with a home of its own (nothing cached).
    inner="$(bundle_run "$bin")
        cargo test -q --workspace --test server_api
    "
else
    export RUSTFLAGS="${RUSTFLAGS:--C target-cpu=native}"
    cargo build --release -p ferrograph-cli
    RUSTFLAGS= cargo test --workspace --all-targets --no-run
    "$target_dir/release/ferrograph" models fetch --all
    bash scripts/setup-llama-server.sh
    # The evaluation's smoke cases download three packages on first use; fetch them now.
    RUSTFLAGS= cargo test -q -p ferrograph-cli --test eval_cli
    "$target_dir/release/ferrograph" bundle create --out "$work/ferrograph.tar.gz"
    # Two tests exist to reach the real registries (they skip themselves when unreachable, but
    # the attempt, a DNS query, is what this check forbids): left out here.
    inner="
        RUSTFLAGS= cargo test --workspace --all-targets -- \
            --skip real_pypi_wheel_and_sdist_of_six --skip real_crate_download_and_unpack
        bash scripts/triage.sh --issue tests/fixtures/triage/issue.md \
            --repo tests/fixtures/triage/repo --docs tests/fixtures/triage/docs --out '$work/report'
        test -s '$work/report/triage-report.md'
        $(bundle_run "$target_dir/release/ferrograph")
    "
fi

echo "== inside a network namespace with loopback only, traced"
started=$(date +%s)
run_offline "$work/run.trace" "$inner"
took=$(( $(date +%s) - started ))
found="$(violations "$work/run.trace")"
if [ -n "$found" ]; then
    echo "offline check FAILED: attempts to reach the network:" >&2
    echo "$found" | head -n 20 >&2
    exit 1
fi
echo "offline check passed ($mode, ${took}s): $(grep -c 'sa_family=AF_INET' "$work/run.trace" || true) loopback connections and datagrams traced, none to any other address"
