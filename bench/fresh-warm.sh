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
T=/sys/kernel/tracing/instances/fresh-warm
count() {
  local mp=$1; shift
  local dev=$(stat -c %d "$mp"); local kdev=$(( ($(( dev >> 8 & 0xfff )) << 20) | (dev & 0xff) ))
  mkdir -p $T; echo 16384 > $T/buffer_size_kb
  echo "connection == $kdev" > $T/events/fuse/fuse_request_send/filter
  echo > $T/trace; echo 1 > $T/events/fuse/fuse_request_send/enable
  "$@" >/dev/null
  echo 0 > $T/events/fuse/fuse_request_send/enable
  echo "$(grep -c FUSE_ $T/trace) total: $(grep -o '(FUSE_[A-Z]*)' $T/trace | sort | uniq -c | sort -rn | head -4 | tr -s ' \n' ' ')"
  rmdir $T
}
declare -A C=([status]="git status --porcelain" [rg]="rg --no-ignore -c 'fn '" [find]="find . -type f")
echo "load $(cut -d' ' -f1-3 /proc/loadavg)"
ms() { local t0=$(date +%s%N); eval "$1" >/dev/null; echo $(( ($(date +%s%N) - t0) / 1000000 )); }
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
