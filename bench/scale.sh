#!/usr/bin/env bash
# Issue 31, scale: one process holds 1 → MAX live branches of one project (a 200-file git
# repository), each with a small change and detached while idle (Branch::detach: no FUSE
# connection, thread or descriptor of its own). At each checkpoint: creation p50/p99 of the
# branches made since the last one, the holder's RSS, threads and fds, the kernel's slab +
# shmem delta (/proc/meminfo, machine-wide, so noisy), and CONCURRENT of the branches
# attached again and running `git status` at once (wall time, errors).
# Writes bench/results/<date>-scale.md and .svg.
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
timeout 1200 "$here/target/release/scale" "$proj" "$out" "$max" "$concurrent"
left=$(grep -c " $SHADE_STATE_DIR" /proc/self/mountinfo || true)
echo "mounts left under the state dir: $left" >&2
echo "written: $out.md $out.svg" >&2
