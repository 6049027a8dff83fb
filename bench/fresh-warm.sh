#!/usr/bin/env bash
# Upper bound of sharing kernel caches across branches: the same command first and again
# in one fresh branch (the second run finds dentries, attributes and pages cached), with
# the request counts of each, and after a `find .` walk (what Branch::warm_up does).
# Needs bench/fresh-passthrough.sh's project (run it first). Usage: bench/fresh-warm.sh ROUNDS
set -euo pipefail
rounds=${1:-5}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MOUNT=${MOUNT:-$here/target/release/examples/mount}  # cargo build --release -p shade-fusefs --example mount
base=/var/tmp/fresh-pt; proj=$base/proj
export SHADE_STATE_DIR=$base/state
if [[ ! -d $proj/tree/.git ]]; then
  (cd $proj/tree && git init -q && git add -A -f && git -c user.name=b -c user.email=b@l commit -q -m t && sleep 1.1 && git update-index -q --refresh && git status --porcelain >/dev/null)
fi
source "$here/bench/fresh-lib.sh"
count() { fuse_requests "$@"; }
declare -A C=([status]="git status --porcelain" [rg]="rg --no-ignore -c 'fn '" [find]="find . -type f")
echo "load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq $rounds); do
  for k in status rg find; do
    native=$(cd $proj/tree && ms "${C[$k]}")
    coproc M { exec $MOUNT $proj 2>/dev/null; }
    read -r mp <&"${M[0]}"
    first=$(cd $mp/tree && ms "${C[$k]}")
    second=$(cd $mp/tree && ms "${C[$k]}")
    exec {M[1]}>&-; wait $M_PID 2>/dev/null || true
    coproc M { exec $MOUNT $proj 2>/dev/null; }
    read -r mp <&"${M[0]}"
    walk=$(cd $mp/tree && ms "find . >/dev/null")
    after=$(cd $mp/tree && ms "${C[$k]}")
    exec {M[1]}>&-; wait $M_PID 2>/dev/null || true
    echo "$k native $native ms, first $first ms, second $second ms, prewalk $walk ms then $after ms"
  done
done
echo "load $(cut -d' ' -f1-3 /proc/loadavg)"
for k in status rg find; do
  coproc M { exec $MOUNT $proj 2>/dev/null; }
  read -r mp <&"${M[0]}"
  echo "requests $k first: $(count $mp sh -c "cd $mp/tree && ${C[$k]}")"
  echo "requests $k second: $(count $mp sh -c "cd $mp/tree && ${C[$k]}")"
  exec {M[1]}>&-; wait $M_PID 2>/dev/null || true
  coproc M { exec $MOUNT $proj 2>/dev/null; }
  read -r mp <&"${M[0]}"
  echo "requests $k prewalk: $(count $mp sh -c "cd $mp/tree && find . >/dev/null")"
  echo "requests $k after prewalk: $(count $mp sh -c "cd $mp/tree && ${C[$k]}")"
  exec {M[1]}>&-; wait $M_PID 2>/dev/null || true
done
