#!/usr/bin/env bash
# Lint latency of a one-line edit on a real crate (issue 11): shade's own overlay crate
# (`fusefs/` at HEAD, made a standalone package: ~7k lines, ~40 dependencies from the
# registry, built offline), with the user's build warm, an edit of one line of it, checked by
#   native    `cargo check` in place (in a copy of the project, so the others' baseline
#             stays valid): the floor
#   cold      `shade lint --cold`: a fresh branch in-process, cached baseline
#   warm      `shade lint`: the per-project daemon's long-lived branch
#   first     `shade lint` with no daemon and no cached baseline (the daemon stopped and
#             the cache emptied, untimed): starts the daemon, checks the unedited
#             project, then the edit
#   cp        `cp -r` of the project (with target/) + `cargo check` in the copy
#   worktree  `git worktree add` + `cargo check` there (a new path without target/: every
#             dependency is checked again), then `git worktree remove`
# Rounds are interleaved with the order rotating; medians and ratios to native are from
# the same run. Usage: bench/lint.sh [ROUNDS] (default 3). Needs root and /dev/fuse. The
# report goes to bench/results/<time>-lint.md.
# SHADE_BIN=path uses that shade binary instead of building a release one.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
rounds=${1:-3}

"$repo/scripts/setup.sh" bench
if [[ -n ${SHADE_BIN:-} ]]; then
    shade=$SHADE_BIN
else
    CARGO_TARGET_DIR=$repo/target-bench cargo build --release --quiet -p shade \
        --manifest-path "$repo/Cargo.toml"
    shade=$repo/target-bench/release/shade
fi
unset CARGO_TARGET_DIR CARGO_BUILD_TARGET_DIR

work=$(mktemp -d /var/tmp/shade-lint-bench.XXXXXX)
export SHADE_STATE_DIR=$work/state
export SHADE_CONFIG=$work/config.toml
printf '[lint]\nidle_secs = 3600\n' >"$SHADE_CONFIG"
cleanup() {
    "$shade" lint --stop -C "$work/proj" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

log() { printf '%s\n' "$*" >&2; }
check() { cargo check --workspace --offline --message-format=json --quiet >/dev/null 2>&1 || true; }

commit=$(git -C "$repo" rev-parse --short HEAD)
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
log "lint bench at $commit, load $load_start, $rounds rounds, work dir $work"

# The project: the fusefs crate at HEAD as a package of its own (workspace-inherited fields
# and dependencies spelled out, the workspace's lock file), a git repository, built once
# (the user's warm cache).
mkdir -p "$work/proj"
git -C "$repo" archive HEAD fusefs Cargo.toml Cargo.lock | tar -x -C "$work"
python3 - "$work" <<'PY'
import sys, tomllib, pathlib
work = pathlib.Path(sys.argv[1])
root = tomllib.loads((work / "Cargo.toml").read_text())["workspace"]
deps = root["dependencies"]
def spell(v):
    if isinstance(v, str):
        return f'"{v}"'
    items = ", ".join(f"{k} = {spell(x) if not isinstance(x, list) else '[' + ', '.join(spell(y) for y in x) + ']'}" for k, x in v.items())
    return "{ " + items + " }"
out = []
for line in (work / "fusefs/Cargo.toml").read_text().splitlines():
    key = line.split(".workspace = true")[0].strip() if ".workspace = true" in line else None
    if key in ("edition", "license"):
        out.append(f'{key} = "{root["package"][key]}"')
    elif key:
        out.append(f"{key} = {spell(deps[key])}")
    elif line.strip() == "[lints]":
        out.append("[workspace]")
    elif line.strip() == "workspace = true":
        continue
    else:
        out.append(line)
(work / "proj/Cargo.toml").write_text("\n".join(out) + "\n")
PY
cp -r "$work/fusefs/src" "$work/proj/src"
cp "$work/Cargo.lock" "$work/proj/Cargo.lock"
printf '/target\n' >"$work/proj/.gitignore"
(
    cd "$work/proj"
    git init -q && git add -A && git -c user.name=b -c user.email=b@b commit -qm base
    log "warming the project's target/ (cargo check)"
    cargo check --offline --quiet
)
cp -r "$work/proj" "$work/native"

# The edit: one string literal.
file=src/branch.rs
sed 's/removing branch store {}: {e}/removing the store of branch {}: {e}/' \
    "$work/proj/$file" >"$work/edited"
diff -u --label "a/$file" --label "b/$file" "$work/proj/$file" "$work/edited" \
    >"$work/edit.patch" || true
[[ -s $work/edit.patch ]] || { log "the edit did not change $file"; exit 1; }

ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }

run_native() {
    cd "$work/native" && patch -s -p1 <"$work/edit.patch"
    local t0; t0=$(date +%s%N); check; ms "$t0"
    patch -s -R -p1 <"$work/edit.patch"
}
run_cold() {
    local t0; t0=$(date +%s%N)
    "$shade" lint --cold -C "$work/proj" --patch "$work/edit.patch" >/dev/null
    ms "$t0"
}
run_warm() {
    local t0; t0=$(date +%s%N)
    "$shade" lint -C "$work/proj" --patch "$work/edit.patch" >/dev/null
    ms "$t0"
}
run_first() {
    "$shade" lint --stop -C "$work/proj"
    rm -rf "$SHADE_STATE_DIR/lint/baseline"
    run_warm
}
run_cp() {
    local t0; t0=$(date +%s%N)
    cp -r "$work/proj" "$work/copy"
    (cd "$work/copy" && patch -s -p1 <"$work/edit.patch" && check)
    ms "$t0"
    rm -rf "$work/copy"
}
run_worktree() {
    local t0; t0=$(date +%s%N)
    git -C "$work/proj" worktree add -q --detach "$work/wt" HEAD
    (cd "$work/wt" && patch -s -p1 <"$work/edit.patch" && check)
    ms "$t0"
    git -C "$work/proj" worktree remove --force "$work/wt"
}

# Warm-up, untimed: the baseline (cached by fingerprint), the daemon and its branch's
# target/, the native copy. The edit adds no diagnostic: shade lint must say so (exit 0).
log "warm-up"
"$shade" lint --cold -C "$work/proj" --patch "$work/edit.patch"
"$shade" lint -C "$work/proj" --patch "$work/edit.patch"
run_native >/dev/null

declare -A times
systems=(native cold warm first cp worktree)
loads=()
for ((r = 0; r < rounds; r++)); do
    loads+=("$(cut -d' ' -f1 /proc/loadavg)")
    for ((k = 0; k < ${#systems[@]}; k++)); do
        s=${systems[$(((k + r) % ${#systems[@]}))]}
        t=$("run_$s")
        times[$s]+="$t "
        log "round $((r + 1)) $s ${t} ms"
    done
done

median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : int((a[NR/2]+a[NR/2+1])/2)}'; }
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
native=$(echo "${times[native]}" | median)
out=$repo/bench/results/$(date -u +%Y-%m-%dT%H%M)-lint.md
{
    echo "# shade lint: one-line edit on a real crate (shade-fusefs, standalone)"
    echo
    echo "Commit $commit, $(nproc) cores, load average $load_start at the start and $load_end"
    echo "at the end, ${loads[*]} (1-min) at the start of each round (other sessions share this"
    echo "machine). $rounds interleaved rounds, the order"
    echo "rotating. Edit: one string literal in \`$file\`"
    echo "(shade-fusefs as a package of its own, ~40 registry dependencies, offline); the user's"
    echo "target/ is warm. shade binary: \`${shade#$repo/}\`. Times are wall-clock ms of the whole"
    echo "command; ratio = median / native median."
    echo
    echo "| system | median ms | ratio | runs (ms) |"
    echo "|---|---:|---:|---|"
    for s in native cold warm first cp worktree; do
        m=$(echo "${times[$s]}" | median)
        ratio=$(awk -v a="$m" -v b="$native" 'BEGIN {printf "%.2f", a / b}')
        echo "| $s | $m | $ratio | ${times[$s]% } |"
    done
} >"$out"
cat "$out"
log "report: $out"
