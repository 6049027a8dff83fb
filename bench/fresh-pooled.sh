#!/usr/bin/env bash
# Issue 31: the first command in a new branch of a warm 10k-file git repository — a fresh
# branch (new mount), a pooled one (a connection earlier branches used, reset), native —
# interleaved rounds; then the creation times and the FUSE request counts of each.
# Each pooled branch's predecessor ran the previous command and wrote one file.
# Usage: bench/fresh-pooled.sh ROUNDS   (as root; cargo build --release -p shade-fusefs --example pooled)
set -euo pipefail
rounds=${1:-5}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
POOLED=${POOLED:-$here/target/release/examples/pooled}
base=${BASE:-/var/tmp/shade-fresh-pooled}
proj=$base/repo
if [[ ! -d $proj/.git ]]; then
  mkdir -p $proj
  for c in ~/.cargo/registry/src/*/*/; do
    cp -r "$c" $proj/; (( $(find $proj -type f | wc -l) >= 10000 )) && break
  done
  (cd $proj && git init -q && git config gc.auto 0 && git add -A -f && git -c user.name=b -c user.email=b@l commit -q -m t)
  sleep 1.1; (cd $proj && git update-index -q --refresh && git status --porcelain >/dev/null)
fi
export SHADE_STATE_DIR=$base/state
# No background `git gc --auto` racing the measured commands.
git -C $proj config gc.auto 0
mountpoint -q /sys/kernel/tracing || mount -t tracefs tracefs /sys/kernel/tracing
source "$here/bench/fresh-lib.sh"
declare -A C=([status]="git status --porcelain" [diff]="git diff --stat" [rg]="rg --no-ignore -c 'fn '" [find]="find . -type f")
coproc P { exec $POOLED $proj 2>/dev/null; }
new() { echo "$1" >&"${P[1]}"; read -t 60 -r mp us reused <&"${P[0]}" || { echo "the pooled example did not answer" >&2; exit 1; }; echo "$1 $us $reused" >> $base/create.log; }
: > $base/create.log; : > $base/rounds.log
echo "files $(find $proj -type f -not -path '*/.git/*' | wc -l), load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq $rounds); do
  for k in status diff rg find; do
    native=$(cd $proj && ms "${C[$k]}")
    # Alternate which of the two goes first.
    if (( r % 2 )); then order="fresh pooled"; else order="pooled fresh"; fi
    declare -A t=()
    for kind in $order; do new $kind; t[$kind]=$(cd $mp && ms "${C[$k]}"); done
    echo "round $r $k native ${native} fresh ${t[fresh]} pooled ${t[pooled]} ms" | tee -a $base/rounds.log
  done
done
echo "load $(cut -d' ' -f1-3 /proc/loadavg)"
# Medians (and min-max) per command; ratios to native of the medians.
for k in status diff rg find; do
  awk -v k=$k '$3==k {n[NR]=$5; f[NR]=$7; p[NR]=$9}
    function med(a,  v,i,c){c=0; for(i in a) v[++c]=a[i]; asort(v); return (c%2)? v[(c+1)/2] : (v[c/2]+v[c/2+1])/2}
    function lo(a,  v,i,c){c=0; for(i in a) v[++c]=a[i]; asort(v); return v[1]}
    function hi(a,  v,i,c){c=0; for(i in a) v[++c]=a[i]; asort(v); return v[c]}
    END {printf "median %s: native %d (%d-%d) fresh %d (%d-%d) %.2fx pooled %d (%d-%d) %.2fx ms\n", k,
      med(n),lo(n),hi(n), med(f),lo(f),hi(f), med(f)/med(n), med(p),lo(p),hi(p), med(p)/med(n)}' $base/rounds.log
done
for k in status diff rg find; do
  for kind in fresh pooled; do
    new $kind
    echo "requests $k $kind: $(fuse_requests $mp sh -c "cd $mp && ${C[$k]}")"
  done
done
for i in $(seq 20); do new fresh; new pooled; done
echo "create fresh us: $(awk '$1=="fresh"{print $2}' $base/create.log | sort -n | tr '\n' ' ')"
echo "create pooled us (reused): $(awk '$1=="pooled" && $3==1 {print $2}' $base/create.log | sort -n | tr '\n' ' ')"
exec {P[1]}>&-; wait $P_PID 2>/dev/null || true
