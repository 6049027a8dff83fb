#!/usr/bin/env bash
# Issue 31: what `shade run -- true` costs from start to end (branch, sandbox, result), as
# root and as the plain test user, against the bare process start it wraps. Interleaved
# rounds, then median (min-max, p90) per kind and the ratio of medians; then, for one run of
# each, the system calls that make the cost (counts from `perf trace -s`, which unlike
# strace keeps fusermount3 setuid).
# Usage: bench/start-cost.sh [ROUNDS]   (as root; cargo build --release -p shade --bin shade;
# SHADE=path/to/shade to measure another build; USER_NAME=shadetest)
set -euo pipefail
rounds=${1:-20}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SHADE=${SHADE:-$here/target/release/shade}
user=${USER_NAME:-shadetest}
base=${BASE:-/var/tmp/shade-start-cost}
[[ $(id -u) == 0 ]] || { echo "run as root (it also runs as $user)" >&2; exit 2; }
id "$user" >/dev/null || { echo "no user $user (scripts/setup.sh makes it)" >&2; exit 2; }
# The binary where the plain user can run it.
mkdir -p $base; install -m 755 "$SHADE" $base/shade
for who in root user; do
  if [[ ! -d $base/$who/proj ]]; then
    mkdir -p $base/$who; cp -r "$here/bench/npm" $base/$who/proj
  fi
done
chown -R "$user": $base/user
log=$base/rounds.log; : > $log
us() { local t0=$(date +%s%N); "$@" >/dev/null 2>&1 || { echo "failed: $*" >&2; exit 1; }; echo $(( ($(date +%s%N) - t0) / 1000 )); }
echo "shade $($base/shade --version 2>/dev/null || true), load $(cut -d' ' -f1-3 /proc/loadavg), $rounds rounds"
for r in $(seq $rounds); do
  n=$(cd $base/root/proj && us true)
  nu=$(cd $base/user/proj && us runuser -u "$user" -- true)
  s=$(cd $base/root/proj && us timeout -s KILL 60 $base/shade run -- true)
  su=$(cd $base/user/proj && us timeout -s KILL 60 runuser -u "$user" -- $base/shade run -- true)
  echo "$r native $n runuser $nu root $s user $su" >> $log
done
echo "load $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$log" <<'PY'
import statistics as st, sys
rows = [l.split() for l in open(sys.argv[1])]
col = {k: [int(r[i]) for r in rows] for k, i in (("native", 2), ("runuser", 4), ("root", 6), ("user", 8))}
def q(v, p): v = sorted(v); return v[min(len(v) - 1, int(p * len(v)))]
for k, v in col.items():
    print(f"{k:8} median {st.median(v)/1000:7.1f} ms  (min {min(v)/1000:.1f}, p90 {q(v, .9)/1000:.1f}, max {max(v)/1000:.1f})")
print(f"root  shade run -- true minus native  : {(st.median(col['root']) - st.median(col['native']))/1000:.1f} ms")
print(f"user  shade run -- true minus runuser : {(st.median(col['user']) - st.median(col['runuser']))/1000:.1f} ms")
PY
if command -v perf >/dev/null; then
  for who in root user; do
    run=( $base/shade run -- true ); [[ $who == user ]] && run=( runuser -u "$user" -- "${run[@]}" )
    (cd $base/$who/proj && timeout -s KILL 120 perf trace -s -o $base/trace-$who.txt -- "${run[@]}" >/dev/null 2>&1) || true
    echo "-- $who: system calls of one run (all processes), by count"
    python3 - $base/trace-$who.txt <<'PY'
import re, sys, collections
c = collections.Counter(); ms = collections.Counter(); procs = 0
for l in open(sys.argv[1]):
    if re.match(r"^ \S.*\(\d+\), \d+ events", l): procs += 1
    m = re.match(r"^\s+(\w+)\s+(\d+)\s+\d+\s+([\d.]+)", l)
    if m and m.group(1) not in ("wait4", "poll", "futex", "ppoll", "epoll_wait", "waitid", "read", "recvfrom", "restart_syscall", "clock_nanosleep"):
        c[m.group(1)] += int(m.group(2)); ms[m.group(1)] += float(m.group(3))
print(f"processes/threads {procs}; calls (ms in them, traced), waits left out:")
print("  " + ", ".join(f"{k} {c[k]} ({ms[k]:.1f})" for k, _ in ms.most_common(14)))
PY
  done
fi
