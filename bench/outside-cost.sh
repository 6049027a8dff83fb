#!/usr/bin/env bash
# What the outside layer (issue 29) costs the commands users run: `cargo test`, `pytest` and
# `npm test` of real projects through `shade run`, with two shade binaries side by side —
# BEFORE (e.g. built from a commit before the layer) and AFTER — and natively, in the same
# run. Those commands read a lot outside the project (~/.cargo/registry and the toolchain,
# /usr/lib/python3, node_modules' tools and node itself), which the layer now serves through
# a kernel overlay where before they were read-only binds.
#
#   bench/outside-cost.sh BEFORE_SHADE AFTER_SHADE [ROUNDS]    (as root; default 5 rounds)
#
# A `true` row gives the fixed cost of a command (branch, sandbox, drop), which the short
# commands' ratios include. Projects: the speculation corpus's semver (cargo test --offline), more-itertools
# (python3 -m pytest -q) and minimist (npm run tests-only: tape under nyc), from
# `bench/corpus/fetch.sh` (`scripts/setup.sh bench`), copied to a scratch directory so the
# native runs do not change the corpus. Each command runs once untimed per system first (warm
# caches), then ROUNDS interleaved rounds, the order of the three systems rotating each
# round. Only the command is timed, end to end as a user gets it (`shade run` = branch,
# sandbox, command, drop). Reported: medians, min–max, and the median of the per-round
# AFTER/BEFORE ratios (paired, so machine load moving between rounds cancels out). The report
# goes to stdout and to bench/results/<time>-outside.md.
set -euo pipefail

if [[ $# -lt 2 ]]; then
    sed -n 2,20p "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
before=$(readlink -f "$1")
after=$(readlink -f "$2")
rounds=${3:-5}
[[ $(id -u) -eq 0 ]] || { echo "outside-cost: run as root" >&2; exit 2; }
for b in "$before" "$after"; do
    [[ -x $b ]] || { echo "outside-cost: $b is not an executable" >&2; exit 2; }
done

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
corpus=/var/tmp/shade-corpus/projects
scratch=$(mktemp -d /var/tmp/shade-outside-cost.XXXXXX)
state=$scratch/state
trap 'rm -rf "$scratch"' EXIT

declare -A cmds=(
    [true]="true"
    [semver]="cargo test --offline -q"
    [more-itertools]="python3 -m pytest -q -p no:cacheprovider"
    [minimist]="npm run tests-only"
)
names=(true semver more-itertools minimist)
for n in semver more-itertools minimist; do
    [[ -d $corpus/$n ]] || {
        echo "outside-cost: $corpus/$n is missing: run scripts/setup.sh bench" >&2
        exit 2
    }
    cp -a "$corpus/$n" "$scratch/$n"
done

ms() { # ms SYSTEM PROJECT: run the project's command on SYSTEM, print milliseconds
    local sys=$1 dir=$scratch/$2 cmd=${cmds[$2]} t0 t1 rc=0
    [[ $2 == true ]] && dir=$scratch/semver # the fixed cost: branch, sandbox, nothing read
    t0=$(date +%s%N)
    case $sys in
        native) (cd "$dir" && timeout 600 sh -c "$cmd") >/dev/null 2>&1 || rc=$? ;;
        before) (cd "$dir" && SHADE_STATE_DIR=$state timeout 600 "$before" run -- sh -c "$cmd") \
                    >/dev/null 2>&1 || rc=$? ;;
        after) (cd "$dir" && SHADE_STATE_DIR=$state timeout 600 "$after" run -- sh -c "$cmd") \
                    >/dev/null 2>&1 || rc=$? ;;
    esac
    t1=$(date +%s%N)
    if [[ $rc -ne 0 ]]; then
        echo "outside-cost: $2 on $sys exited $rc" >&2
        return 1
    fi
    echo $(((t1 - t0) / 1000000))
}

systems=(native before after)
declare -A times
for n in "${names[@]}"; do
    for s in "${systems[@]}"; do
        ms "$s" "$n" >/dev/null # untimed: warm caches
    done
done
loads=()
for ((r = 0; r < rounds; r++)); do
    loads+=("$(cut -d' ' -f1 /proc/loadavg)")
    for n in "${names[@]}"; do
        for ((k = 0; k < 3; k++)); do
            s=${systems[$(((r + k) % 3))]}
            times[$n.$s]+="$(ms "$s" "$n") "
        done
    done
    echo "outside-cost: round $((r + 1))/$rounds done (load ${loads[-1]})" >&2
done

report=$(python3 - "$rounds" "${loads[*]}" <<EOF
import statistics, sys
rounds = int(sys.argv[1])
loads = sys.argv[2]
t = {}
$(for k in "${!times[@]}"; do echo "t['$k'] = [int(x) for x in '${times[$k]}'.split()]"; done)
names = ["true", "semver", "more-itertools", "minimist"]
cmds = {"true": "true", "semver": "cargo test --offline -q", "more-itertools": "python3 -m pytest -q", "minimist": "npm run tests-only"}
print(f"| project: command | native ms | before ms (×native) | after ms (×native) | after/before, paired (min–max) |")
print("|---|---|---|---|---|")
for n in names:
    nat, bef, aft = t[n + ".native"], t[n + ".before"], t[n + ".after"]
    med = statistics.median
    pair = [a / b for a, b in zip(aft, bef)]
    print(f"| {n}: \`{cmds[n]}\` | {med(nat):.0f} ({min(nat)}–{max(nat)}) "
          f"| {med(bef):.0f} ({min(bef)}–{max(bef)}) ×{med(bef)/med(nat):.2f} "
          f"| {med(aft):.0f} ({min(aft)}–{max(aft)}) ×{med(aft)/med(nat):.2f} "
          f"| **{med(pair):.3f}** ({min(pair):.3f}–{max(pair):.3f}) |")
print()
print(f"{rounds} interleaved rounds after one untimed warm-up each; load (1 min) at each round: {loads}.")
EOF
)
{
    echo "# Outside layer cost — $(date -u +%Y-%m-%dT%H:%MZ)"
    echo
    echo "before: \`$before\` ($("$before" --version 2>/dev/null || echo '?'))  "
    echo "after: \`$after\` ($("$after" --version 2>/dev/null || echo '?'))  "
    echo "machine: $(nproc) cores, kernel $(uname -r)"
    echo
    echo "$report"
} | tee "$here/results/$(date -u +%Y-%m-%dT%H%M)-outside.md"
