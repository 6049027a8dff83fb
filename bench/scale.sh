#!/usr/bin/env bash
# Issue 31, scale: one process holds 1 → MAX live branches of one project (a 200-file git
# repository), each with a small change and detached while idle (Branch::detach: no FUSE
# connection, thread or descriptor of its own). At each checkpoint: creation p50/p99 of the
# branches made since the last one, the holder's RSS, threads and fds, the kernel's slab +
# shmem delta (/proc/meminfo, machine-wide, so noisy), and CONCURRENT of the branches
# attached again and running `git status` at once (wall time, errors).
# Writes bench/results/<date>-scale.md and .svg.
# The holder runs in a mount namespace of its own (SCALE_SHARED_NS=1: in the host's): every
# namespace another process makes (any sandbox, `unshare -m`, a container) copies the mounts
# that exist at that moment, and the pool rightly never reuses a connection with a copy —
# on this shared machine (other sandboxed test suites running) that made every attach a new
# mount and every detach an unmount (~25–50 ms instead of ~0.6 ms). In a private namespace
# no one else's copies reach the holder's connections.
# Small changes live on the heap (content.rs), so fds stay flat too.
# Usage: bench/scale.sh [MAX] [CONCURRENT]   (as root; builds shade-bench's `scale` in release)
set -euo pipefail
max=${1:-10000}
concurrent=${2:-100}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
base=${BASE:-/var/tmp/shade-scale}
proj=$base/repo
[[ $(id -u) == 0 ]] || { echo "run as root" >&2; exit 1; }
timeout 900 cargo build --release -q -p shade-bench --bin scale --manifest-path "$here/Cargo.toml"
if [[ ! -d $proj/.git ]]; then
  mkdir -p $proj/src
  for i in $(seq 200); do printf 'fn f%d() {}\n' $i > $proj/src/f$i.rs; done
  (cd $proj && git init -q && git config gc.auto 0 && git add -A && git -c user.name=b -c user.email=b@l commit -q -m t)
  sleep 1.1; (cd $proj && git update-index -q --refresh && git status --porcelain >/dev/null)
fi
export SHADE_STATE_DIR=$base/state
rm -rf "$SHADE_STATE_DIR"
ulimit -n 1048576 2>/dev/null || true
out=$here/bench/results/$(date -u +%Y-%m-%dT%H%M)-scale
echo "load $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores, pid_max $(cat /proc/sys/kernel/pid_max)" >&2
if [[ ${SCALE_SHARED_NS:-0} == 1 ]]; then
  timeout 1200 "$here/target/release/scale" "$proj" "$out" "$max" "$concurrent"
else
  timeout 1200 unshare -m --propagation private "$here/target/release/scale" "$proj" "$out" "$max" "$concurrent"
fi
left=$(grep -c " $SHADE_STATE_DIR" /proc/self/mountinfo || true)
echo "mounts left under the state dir: $left" >&2
echo "written: $out.md $out.svg" >&2
