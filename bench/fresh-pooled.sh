#!/usr/bin/env bash
# Issue 31: the first command in a new branch of a warm 10k-file git repository — a fresh
# branch (new mount), a pooled one (a connection earlier branches used, reset), native —
# interleaved rounds; then the creation times and the FUSE request counts of each.
# Each pooled branch's predecessor ran the previous command and wrote one file.
# "served": the same first command inside a new `shade run` branch from the branch server
# (timed inside the sandbox; the server's previous branch ran the previous command), and
# "run": the same in an in-process `shade run` (SHADE_BRANCH_SERVER=0, a fresh mount).
# Then `shade run -- true` wall time, served against in-process.
# Usage: bench/fresh-pooled.sh ROUNDS   (as root; cargo build --release -p shade-fusefs
#        --example pooled && cargo build --release -p shade)
set -euo pipefail
rounds=${1:-5}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
POOLED=${POOLED:-$here/target/release/examples/pooled}
SHADE=${SHADE:-$here/target/release/shade}
base=${BASE:-/var/tmp/shade-fresh-pooled}
proj=$base/repo
source "$here/bench/fresh-lib.sh"
ten_k_repo "$proj"
export SHADE_STATE_DIR=$base/state
# No background `git gc --auto` racing the measured commands.
git -C $proj config gc.auto 0
mountpoint -q /sys/kernel/tracing || mount -t tracefs tracefs /sys/kernel/tracing
declare -A C=([status]="git status --porcelain" [diff]="git diff --stat" [rg]="rg --no-ignore -c 'fn '" [find]="find . -type f")
coproc P { exec $POOLED $proj 2>/dev/null; }
new() { echo "$1" >&"${P[1]}"; read -t 60 -r mp us reused drop_us <&"${P[0]}" || { echo "the pooled example did not answer" >&2; exit 1; }; echo "$1 $us $reused $drop_us" >> $base/create.log; }
: > $base/create.log; : > $base/rounds.log
echo "files $(find $proj -type f -not -path '*/.git/*' | wc -l), load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq $rounds); do
  for k in status diff rg find; do
    native=$(cd $proj && ms "${C[$k]}")
    # Alternate which of the two goes first.
    if (( r % 2 )); then order="fresh pooled"; else order="pooled fresh"; fi
    declare -A t=()
    for kind in $order; do new $kind; t[$kind]=$(cd $mp && ms "${C[$k]}"); done
    # Timed inside the branch: the command alone, not the sandbox around it.
    inner="t0=\$(date +%s%N); ${C[$k]} >/dev/null; echo \$(( (\$(date +%s%N) - t0) / 1000000 ))"
    if (( r % 2 )); then order="served run"; else order="run served"; fi
    for kind in $order; do
      if [[ $kind == run ]]; then srv=0; else srv=1; fi
      t[$kind]=$(cd $proj && SHADE_BRANCH_SERVER=$srv $SHADE run -- sh -c "$inner" 2>/dev/null | tail -1)
    done
    echo "round $r $k native ${native} fresh ${t[fresh]} pooled ${t[pooled]} served ${t[served]} run ${t[run]} ms" | tee -a $base/rounds.log
  done
done
echo "load $(cut -d' ' -f1-3 /proc/loadavg)"
# Medians (min-max) per command, and the ratio of the medians to native.
python3 - "$base/rounds.log" <<'PY'
import statistics as st, sys
rows = [l.split() for l in open(sys.argv[1])]
for k in ("status", "diff", "rg", "find"):
    r = [x for x in rows if x[2] == k]
    if not r:
        continue
    col = {s: [int(x[i]) for x in r] for s, i in (("native", 4), ("fresh", 6), ("pooled", 8), ("served", 10), ("run", 12))}
    n = st.median(col["native"])
    print(f"median {k} ({len(r)} rounds): " + ", ".join(
        f"{s} {st.median(v):.0f} ms ({min(v)}-{max(v)}) {st.median(v) / n:.2f}x" for s, v in col.items()))
PY
# Requests: a fresh branch; a pooled one whose connection's last branch ran the same
# command (the steady state of a process that runs it again and again).
for k in status diff rg find; do
  new fresh
  echo "requests $k fresh: $(fuse_requests $mp sh -c "cd $mp && ${C[$k]}")"
  new pooled; (cd $mp && eval "${C[$k]}" >/dev/null)
  new pooled
  echo "requests $k pooled: $(fuse_requests $mp sh -c "cd $mp && ${C[$k]}")"
done
# Threads and fds of the process per connection: one branch of each kind live.
echo "threads $(ls /proc/$P_PID/task | wc -l), fds $(ls /proc/$P_PID/fd | wc -l) with 2 connections"
for i in $(seq 20); do new fresh; new pooled; done
echo "create fresh us: $(awk '$1=="fresh"{print $2}' $base/create.log | sort -n | tr '\n' ' ')"
echo "create pooled us (reused): $(awk '$1=="pooled" && $3==1 {print $2}' $base/create.log | sort -n | tr '\n' ' ')"
echo "drop fresh us (unmount): $(awk '$1=="fresh" && $4>0 {print $4}' $base/create.log | sort -n | tr '\n' ' ')"
echo "drop pooled us (reset): $(awk '$1=="pooled" && $4>0 {print $4}' $base/create.log | sort -n | tr '\n' ' ')"
exec {P[1]}>&-; wait $P_PID 2>/dev/null || true
# Requests in a served branch whose previous branch ran the same command (the server's
# connection, traced from outside through the mount point its debug line names).
for k in status diff rg find; do
  (cd $proj && $SHADE run -- sh -c "${C[$k]} >/dev/null" 2>/dev/null)
  smp=$(cd $proj && SHADE_LOG=shade_fusefs::served=debug NO_COLOR=1 $SHADE run -- sh -c "sleep 0.3; ${C[$k]} >/dev/null; sleep 0.3" 2>&1 >/dev/null \
    | grep -o 'mountpoint=[^ ]*' | head -1 | cut -d= -f2) || true
  # The traced run: its branch takes the connection the previous one let go.
  (cd $proj && $SHADE run -- sh -c "${C[$k]} >/dev/null" 2>/dev/null)
  echo "requests $k served: $(fuse_requests $smp sh -c "cd $proj && $SHADE run -- sh -c '${C[$k]} >/dev/null' 2>/dev/null")"
done
# `shade run -- true`: served against in-process, interleaved.
: > $base/true.log
for r in $(seq $(( rounds * 2 ))); do
  for srv in 1 0; do echo "$srv $(cd $proj && ms "SHADE_BRANCH_SERVER=$srv $SHADE run -- true")" >> $base/true.log; done
done
python3 - "$base/true.log" <<'PY'
import statistics as st, sys
rows = [l.split() for l in open(sys.argv[1])]
for srv, name in (("1", "served"), ("0", "in-process")):
    v = [int(x[1]) for x in rows if x[0] == srv]
    print(f"shade run -- true {name}: median {st.median(v):.0f} ms ({min(v)}-{max(v)}, {len(v)} runs)")
PY
# The served branches' server ends with its socket (it would anyway when idle).
rm -f $SHADE_STATE_DIR/servers/*.sock
