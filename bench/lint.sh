#!/usr/bin/env bash
# Lint latency of a one-line edit on a real crate (issue 11): the shade workspace itself at
# HEAD (4 crates, ~200 dependencies), with the user's build warm, an edit of one line of
# the top crate (`src/cmd_lint.rs`), checked by
#   native    `cargo check` in place (in a copy of the project, so the others' baseline
#             stays valid): the floor
#   cold      `shade lint --cold`: a fresh branch in-process, cached baseline
#   warm      `shade lint`: the per-project daemon's long-lived branch
#   cp        `cp -r` of the project (with target/) + `cargo check` in the copy
#   worktree  `git worktree add` + `cargo check` there (no target/: a full check)
# Rounds are interleaved with the order rotating; medians and ratios to native are from
# the same run. Usage: bench/lint.sh [ROUNDS] (default 5; worktree runs once: it is a full
# build). Needs root and /dev/fuse. The report goes to bench/results/<time>-lint.md.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
rounds=${1:-5}

"$repo/scripts/setup.sh"
CARGO_TARGET_DIR=$repo/target-bench cargo build --release --quiet -p shade \
    --manifest-path "$repo/Cargo.toml"
shade=$repo/target-bench/release/shade
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

# The project: shade's sources at HEAD, a git repository, built once (the user's warm cache).
mkdir -p "$work/proj"
git -C "$repo" archive HEAD | tar -x -C "$work/proj"
(
    cd "$work/proj"
    git init -q && git add -A && git -c user.name=b -c user.email=b@b commit -qm base
    log "warming the project's target/ (cargo check --workspace)"
    check
)
cp -r "$work/proj" "$work/native"

# The edit: one string literal of the top crate.
file=src/cmd_lint.rs
sed 's/the lint daemon answered nothing/the lint daemon gave no answer/' \
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
run_cp() {
    local t0; t0=$(date +%s%N)
    cp -r "$work/proj" "$work/copy"
    (cd "$work/copy" && patch -s -p1 <"$work/edit.patch" && check)
    ms "$t0"
    rm -rf "$work/copy"
}
run_worktree() {
    local t0; t0=$(date +%s%N)
    git -C "$work/proj" worktree add -q "$work/wt" HEAD
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
systems=(native cold warm cp)
for ((r = 0; r < rounds; r++)); do
    for ((k = 0; k < ${#systems[@]}; k++)); do
        s=${systems[$(((k + r) % ${#systems[@]}))]}
        t=$("run_$s")
        times[$s]+="$t "
        log "round $((r + 1)) $s ${t} ms"
    done
done
log "worktree (full check, once)"
times[worktree]=$(run_worktree)
log "worktree ${times[worktree]} ms"

median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : int((a[NR/2]+a[NR/2+1])/2)}'; }
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
native=$(echo "${times[native]}" | median)
out=$repo/bench/results/$(date -u +%Y-%m-%dT%H%M)-lint.md
{
    echo "# shade lint: one-line edit on the shade workspace"
    echo
    echo "Commit $commit, $(nproc) cores, load average $load_start at the start and $load_end"
    echo "at the end (other sessions share this machine). $rounds interleaved rounds (worktree:"
    echo "one run, a full check without target/). Edit: one string literal in \`$file\`"
    echo "(the \`shade\` crate, on top of shade-agent and shade-fusefs); the user's target/ is"
    echo "warm. Times are wall-clock ms of the whole command; ratio = median / native median."
    echo
    echo "| system | median ms | ratio | runs (ms) |"
    echo "|---|---:|---:|---|"
    for s in native cold warm cp worktree; do
        m=$(echo "${times[$s]}" | median)
        ratio=$(awk -v a="$m" -v b="$native" 'BEGIN {printf "%.2f", a / b}')
        echo "| $s | $m | $ratio | ${times[$s]% } |"
    done
} >"$out"
cat "$out"
log "report: $out"
