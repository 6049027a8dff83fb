#!/usr/bin/env bash
# Issue 31: where `shade run -- true` spends its time, phase by phase (the `timing` marks,
# SHADE_LOG=timing=debug), for two shade builds in interleaved rounds, as root and as the
# plain test user; prints median wall time and median phase durations per build and the
# ratio after/before. Both builds keep their own branch server (a build's tag is its own).
# Usage: bench/run-latency.sh BEFORE AFTER [ROUNDS]   (as root; ROUNDS default 9;
# USER_NAME=shadetest; WHO="root user" to pick)
set -euo pipefail
before=${1:?usage: run-latency.sh BEFORE AFTER [ROUNDS]}
after=${2:?usage: run-latency.sh BEFORE AFTER [ROUNDS]}
rounds=${3:-9}
user=${USER_NAME:-shadetest}
who=${WHO:-root user}
base=${BASE:-/var/tmp/shade-run-latency}
[[ $(id -u) == 0 ]] || { echo "run as root (it also runs as $user)" >&2; exit 2; }
id "$user" >/dev/null || { echo "no user $user (scripts/setup.sh makes it)" >&2; exit 2; }
mkdir -p $base/bin $base/root/proj $base/user/proj
chmod 755 $base $base/bin
# The binaries where the plain user can run them (each its own file: its own server).
install -m 755 "$before" $base/bin/before
install -m 755 "$after" $base/bin/after
for d in root user; do
  [[ -e $base/$d/proj/a.txt ]] || { echo hello > $base/$d/proj/a.txt; mkdir -p $base/$d/proj/src; echo 'fn main() {}' > $base/$d/proj/src/main.rs; }
done
chown -R "$user": $base/user
raw=$base/raw.log; : > $raw
one() { # who build round
  local w=$1 b=$2 r=$3 t0 t1 out
  t0=$(date +%s%N)
  if [[ $w == root ]]; then
    out=$(cd $base/root/proj && NO_COLOR=1 SHADE_LOG=timing=debug $base/bin/$b run -- true 2>&1) || { echo "failed: $w $b: $out" >&2; exit 1; }
  else
    out=$(cd $base/user/proj && runuser -u "$user" -- env NO_COLOR=1 SHADE_LOG=timing=debug $base/bin/$b run -- true 2>&1) || { echo "failed: $w $b: $out" >&2; exit 1; }
  fi
  t1=$(date +%s%N)
  echo "$w $b $r wall=$(( (t1 - t0) / 1000 )) $(grep -o 'phase [a-z-]* at [0-9.]*' <<<"$out" | sed 's/phase //; s/ at /=/' | tr '\n' ' ')" >> $raw
}
echo "load $(cut -d' ' -f1-3 /proc/loadavg), $rounds rounds, before $(sha256sum "$before" | cut -c1-12), after $(sha256sum "$after" | cut -c1-12)"
# Round 0 starts each build's server and warms its pool; not counted.
for w in $who; do for b in before after; do one $w $b 0; one $w $b 0; done; done
for r in $(seq $rounds); do
  for w in $who; do
    if (( r % 2 )); then one $w before $r; one $w after $r; else one $w after $r; one $w before $r; fi
  done
done
echo "load after $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$raw" <<'PY'
import sys, statistics as st
# Phase durations: each mark minus the one before it (names say what ended there).
order = ["recovered", "branch", "probed", "confinement", "outside-planned", "bwrap-built",
         "bwrap-spawned", "sandbox-namespaces", "exited", "reaped", "limits-checked",
         "command-done", "changeset", "reported", "dropped", "exit"]
label = {"recovered": "start + recovery", "branch": "branch from server", "probed": "probe wait",
         "confinement": "confinement", "outside-planned": "outside layer planned",
         "bwrap-built": "bwrap args", "bwrap-spawned": "pre-exec stage (spawn)",
         "sandbox-namespaces": "namespaces up", "exited": "bwrap mounts + command",
         "reaped": "reap + sweep", "limits-checked": "limits + cgroup",
         "command-done": "", "changeset": "changeset", "reported": "report",
         "dropped": "drop (server reset)", "exit": "exit", "outside": "exec + exit of shade"}
rows = {}
for line in open(sys.argv[1]):
    f = line.split()
    w, b, r = f[0], f[1], int(f[2])
    if r == 0:
        continue
    kv = dict(x.split("=") for x in f[3:])
    marks = {k: float(v) for k, v in kv.items() if k != "wall"}
    wall = int(kv["wall"]) / 1000
    d = rows.setdefault((w, b), {"wall": []})
    d["wall"].append(wall)
    prev = 0.0
    for k in order:
        if k in marks:
            d.setdefault(k, []).append(marks[k] - prev)
            prev = marks[k]
    d.setdefault("outside", []).append(wall - prev)
med = lambda xs: st.median(xs) if xs else float("nan")
for w in sorted({k[0] for k in rows}):
    b, a = rows.get((w, "before"), {}), rows.get((w, "after"), {})
    if not b or not a:
        continue
    print(f"\n## {w}: {len(b['wall'])} rounds, medians in ms\n")
    print("| phase | before | after |\n|---|---|---|")
    for k in order + ["outside"]:
        if (k in b or k in a) and label.get(k):
            print(f"| {label[k]} | {med(b.get(k, [])):.1f} | {med(a.get(k, [])):.1f} |")
    wb, wa = med(b["wall"]), med(a["wall"])
    print(f"| **wall** | **{wb:.1f}** ({min(b['wall']):.0f}–{max(b['wall']):.0f}) | **{wa:.1f}** ({min(a['wall']):.0f}–{max(a['wall']):.0f}) |")
    print(f"\n{w}: after/before = {wa / wb:.2f} (wall medians {wb:.1f} → {wa:.1f} ms)")
PY
