#!/usr/bin/env bash
# Issue 31: what a `shade run` sandbox costs a syscall-bound command, part by part.
# 1. CPU ns per system call (bench/sandbox-cost/sysbench.c): native, plain bwrap, bwrap
#    with the seccomp programs of a live `shade run` sandbox (dumped with
#    PTRACE_SECCOMP_GET_FILTER: exactly what the kernel runs), each program alone, and
#    inside `shade run` (its `/` is an idmapped overlay).
# 2. `find /usr/lib /usr/share -type f` and, in a served branch of a warm 10k-file git
#    repository, `git status --porcelain`, `rg --no-ignore -c fn` and `find . -type f`: wall and CPU ms (user+sys of
#    the command, bench/sandbox-cost/tm.c), interleaved rounds; inside `shade run` the
#    command's first run in its sandbox and the same command again (warm).
# CPU time is the figure to compare on a shared machine: wall time there is mostly the
# other load (and `shade run`'s nice 5 / SCHED_BATCH).
# Usage: bench/sandbox-cost.sh SHADE [ROUNDS]   (as root; runs itself in a private mount
# namespace so other sessions' sandboxes hold no copy of the served branch's mount, which
# would keep its connection from being reused)
set -euo pipefail
shade=$(realpath "${1:?usage: sandbox-cost.sh SHADE [ROUNDS]}")
rounds=${2:-5}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
base=${BASE:-/var/tmp/shade-sandbox-cost}
[[ $(id -u) == 0 ]] || { echo "run as root" >&2; exit 2; }
if [[ ${SANDBOX_COST_PRIVATE:-} != 1 ]]; then
  SANDBOX_COST_PRIVATE=1 exec unshare -m --propagation private "$0" "$@"
fi
mkdir -p $base/bin
cc -O2 -o $base/bin/sysbench $here/sandbox-cost/sysbench.c
cc -O2 -o $base/bin/tm $here/sandbox-cost/tm.c
proj=$base/repo
source "$here/fresh-lib.sh"
ten_k_repo "$proj"
export SHADE_STATE_DIR=$base/state
SB=$base/bin/sysbench TM=$base/bin/tm
cd $proj
echo "shade $(sha256sum "$shade" | cut -c1-12), files $(git ls-files | wc -l), load $(cut -d' ' -f1-3 /proc/loadavg)"
# The programs a command really gets.
(exec "$shade" run -- sleep 5.4321 >/dev/null 2>&1) &
pid=
for _ in $(seq 100); do
  pid=$(pgrep -f '^sleep 5.4321$' | head -1 || true)
  [[ -n $pid ]] && grep -q '^Seccomp_filters:.*[1-9]' /proc/$pid/status 2>/dev/null && break
  pid=; sleep 0.1
done
[[ -n $pid ]] || { echo "no sandboxed sleep found" >&2; exit 1; }
echo "sandboxed command: $(grep -E '^(Seccomp|Seccomp_filters|NoNewPrivs):' /proc/$pid/status | tr -s '\t\n' ' ')"
python3 $here/sandbox-cost/dumpfilt.py $pid $base/filter
wait
nf=$(ls $base/filter.* | wc -l)
bw=(bwrap --die-with-parent --unshare-pid --unshare-ipc --unshare-net --ro-bind / / --ro-bind /sys /sys --proc /proc --dev /dev --chdir $proj)
with_filters() { # program indexes, then the command
  local idx=$1; shift; local a=() f
  for f in $idx; do a+=(--add-seccomp-fd $((10 + f))); done
  eval "exec $(for f in $idx; do printf '%d<%q ' $((10 + f)) $base/filter.$f; done)" '"${bw[@]}" "${a[@]}" -- "$@"'
}
echo "## CPU ns per system call"
for r in $(seq 3); do
  echo "native         $($SB)"
  echo "bwrap          $("${bw[@]}" -- $SB)"
  echo "bwrap+filters  $( (with_filters "$(seq -s' ' 0 $((nf - 1)))" $SB) )"
  for i in $(seq 0 $((nf - 1))); do
    echo "bwrap+filter.$i $( (with_filters "$i" $SB) ) ($(( $(stat -c %s $base/filter.$i) / 8 )) instructions)"
  done
  echo "shade run      $("$shade" run -- $SB 2>/dev/null)"
done
echo "## wall and CPU ms: native, then in shade run first / again"
declare -A C=([usr]="find /usr/lib /usr/share -type f" [status]="git status --porcelain" [rg]="rg --no-ignore -c fn" [find]="find . -type f")
# Per command, so each served branch's connection last served the same command (round 0,
# after another command, is not counted).
for k in usr status rg find; do
  for r in $(seq 0 $rounds); do
    n=$($TM ${C[$k]} 2>/dev/null)
    s=$("$shade" run -- sh -c "$TM ${C[$k]} 2>/dev/null; $TM ${C[$k]} 2>/dev/null" 2>/dev/null | tr '\n' ' ')
    (( r > 0 )) && echo "round $r $k native $n shade $s"
  done
done | tee $base/rounds.log
echo "load $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - $base/rounds.log <<'PY'
import statistics as st, sys
rows = [l.split() for l in open(sys.argv[1])]
for k in ("usr", "status", "rg", "find"):
    r = [x for x in rows if x[2] == k]
    cols = {"native": (4, 5), "first": (7, 8), "again": (9, 10)}
    nw = st.median(float(x[4]) for x in r); nc = st.median(float(x[5]) for x in r)
    out = []
    for name, (w, c) in cols.items():
        ws = [float(x[w]) for x in r]; cs = [float(x[c]) for x in r]
        out.append(f"{name} wall {st.median(ws):.0f} ({min(ws):.0f}-{max(ws):.0f}) {st.median(ws)/nw:.2f}x, "
                   f"cpu {st.median(cs):.0f} ({min(cs):.0f}-{max(cs):.0f}) {st.median(cs)/nc:.2f}x")
    print(f"median {k} ({len(r)} rounds): " + "; ".join(out))
PY
rm -f $SHADE_STATE_DIR/servers/*.sock
