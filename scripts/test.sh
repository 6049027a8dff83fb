#!/usr/bin/env bash
# The full test suite. Needs root and /dev/fuse (tests mount branches for real and run
# commands in mount namespaces); it fails, never skips, where they are missing.
# Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $(id -u) -ne 0 ]]; then
    echo "test.sh: must run as root (the tests mount FUSE branches and use mount namespaces)" >&2
    exit 1
fi
if [[ ! -c /dev/fuse ]]; then
    echo "test.sh: /dev/fuse is missing (modprobe fuse, or give the container --device /dev/fuse)" >&2
    exit 1
fi
scripts/setup.sh test

# Every stage has a deadline: a hang fails CI with a picture of what hung (the processes and
# the branch mounts left), instead of running into CI's own limit with no output at all.
stage() {
    local name=$1 secs=$2
    shift 2
    local rc=0
    timeout --kill-after=30 "$secs" "$@" || rc=$?
    if ((rc == 124 || rc == 137)); then
        echo "test.sh: $name did not finish within $secs s; what was running:" >&2
        ps -eo pid,ppid,etimes,stat,args --forest | grep -v ' \[' | tail -80 >&2 || true
        grep -E '^shade:' /proc/mounts >&2 || true
    fi
    return "$rc"
}

echo "== unit and integration tests"
# The integrity tests run below, once, with their figures shown.
# --no-fail-fast: every failing test binary is reported, not only the first.
stage "cargo test" 2700 cargo test --workspace --locked --no-fail-fast -- --skip integrity::

echo "== POSIX conformance (pjdfstest) inside a branch, through shade run"
cargo build --locked -q -p shade
# A short base path: pjdfstest binds unix sockets several temp dirs deep, and a socket
# path longer than 108 bytes (sun_path) fails with ENAMETOOLONG on any file system.
proj=$(mktemp -d /var/tmp/pjd.XXXXXX)
trap 'rm -rf "$proj"' EXIT
chmod 755 "$proj"
# Default flags: every uid of the command gets what a real directory gives it.
# --unconfined: pjdfstest tests the file system, not the sandbox, and checks root's powers a
# user namespace takes away on purpose (mknod of devices, chown to unmapped ids, setuid).
stage pjdfstest 900 target/debug/shade run --unconfined -C "$proj" -- "$PWD/scripts/pjdfstest.sh" "$proj"

echo "== integrity and fault suite (fsx, stress-ng, crash, concurrent edits, bad input)"
stage integrity 1200 scripts/integrity.sh all
