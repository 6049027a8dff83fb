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
declare -A C=([status]="git status --porcelain" [diff]="git diff --stat" [rg]="rg --no-ignore -c 'fn '" [find]="find . -type f")
source "$here/bench/fresh-lib.sh"
count() { fuse_requests "$@"; }
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
