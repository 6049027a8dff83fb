#!/usr/bin/env bash
# A command first in a fresh branch, cold and after Branch::warm_up finished (the mount
# example with SHADE_WARM_UP=1), against native; then the request counts of each.
# Needs bench/fresh-passthrough.sh's project and bench/fresh-warm.sh's git repository in it.
# Usage: bench/fresh-warmed.sh ROUNDS   (as root)
set -euo pipefail
rounds=${1:-3}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MOUNT=${MOUNT:-$here/target/release/examples/mount}  # cargo build --release -p shade-fusefs --example mount
proj=/var/tmp/fresh-pt/proj
export SHADE_STATE_DIR=/var/tmp/fresh-pt/state
T=/sys/kernel/tracing/instances/fresh-warmed
declare -A C=([status]="git status --porcelain" [diff]="git diff --stat" [rg]="rg --no-ignore -c 'fn '" [find]="find . -type f")
ms() { local t0=$(date +%s%N); eval "$1" >/dev/null; echo $(( ($(date +%s%N) - t0) / 1000000 )); }
count() {
  local mp=$1; shift
  local dev=$(stat -c %d "$mp"); local kdev=$(( ($(( dev >> 8 & 0xfff )) << 20) | (dev & 0xff) ))
  mkdir -p $T; echo 16384 > $T/buffer_size_kb
  echo "connection == $kdev" > $T/events/fuse/fuse_request_send/filter
  echo > $T/trace; echo 1 > $T/events/fuse/fuse_request_send/enable
  "$@" >/dev/null
  echo 0 > $T/events/fuse/fuse_request_send/enable
  echo "$(grep -c FUSE_ $T/trace) ($(grep -o '(FUSE_[A-Z]*)' $T/trace | sort | uniq -c | sort -rn | head -4 | tr -s ' \n' ' '))"
  rmdir $T
}
echo "load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq $rounds); do
  for k in status diff rg find; do
    native=$(cd $proj/tree && ms "${C[$k]}")
    line="$k native $native ms"
    for w in 0 1; do
      coproc M { SHADE_WARM_UP=$w exec $MOUNT $proj 2>/dev/null; }
      read -r mp <&"${M[0]}"
      line+=", warm=$w $(cd $mp/tree && ms "${C[$k]}") ms"
      exec {M[1]}>&-; wait $M_PID 2>/dev/null || true
    done
    echo "$line"
  done
done
echo "load $(cut -d' ' -f1-3 /proc/loadavg)"
for k in status diff rg find; do
  for w in 0 1; do
    coproc M { SHADE_WARM_UP=$w exec $MOUNT $proj 2>/dev/null; }
    read -r mp <&"${M[0]}"
    echo "requests $k warm=$w: $(count $mp sh -c "cd $mp/tree && ${C[$k]}")"
    exec {M[1]}>&-; wait $M_PID 2>/dev/null || true
  done
done
