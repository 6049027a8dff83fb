#!/usr/bin/env bash
# Integrity and fault suite (issue 3): other people's file system exercisers run inside a
# branch through `shade run`, then our own fault-injection tests, each printing its figure.
#
# Usage: scripts/integrity.sh [all|fsx|stress|tests]...      (default: all)
#   fsx     fsx (fsx-rs) on a new file, on a file copied up from lower, and on a file
#           spilled to the disk store (SHADE_MEMORY_BUDGET=0); FSX_N ops each (default
#           50000, ~20 s each here; FSX_N=150000 for the ~1 minute long run), fixed seeds.
#   stress  stress-ng's filesystem class, --verify, 2 s per stressor, in a branch.
#   tests   the Rust integrity tests (tests/integrity_*.rs) with their figures shown.
# Needs root and /dev/fuse, like scripts/test.sh. Exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"

scripts/setup.sh test
FSX_N=${FSX_N:-50000}
STRESS_T=${STRESS_T:-2}

cargo build --locked -q -p shade
shade_bin=${CARGO_TARGET_DIR:-target}/debug/shade
shade_bin=$(realpath "$shade_bin")

work=$(mktemp -d /var/tmp/shade-integrity.XXXXXX)
chmod 755 "$work"
export SHADE_STATE_DIR=$work/state
# `shade run` starts a branch server that keeps warm connections mounted until it idles out:
# removing its socket ends it (it unmounts them and exits); wait, bounded, for the mounts.
end_servers() {
    rm -f "$SHADE_STATE_DIR"/servers/*.sock
    for _ in $(seq 200); do
        grep -q " $work/" /proc/mounts || return 0
        sleep 0.1
    done
    echo "integrity: mounts still below $work:" >&2
    grep " $work/" /proc/mounts >&2 || true
}
# Logs stay for a look when something failed.
trap 'rc=$?; end_servers; if ((rc)); then echo "integrity: logs kept in $work" >&2; else rm -rf "$work"; fi' EXIT

# fsx's operation mix: everything fsx-rs can do, hole punching and posix_fallocate
# included. fsx-rs 0.3.2 draws operation sizes from `opsize.min` (default 0) up, and a
# 0-byte posix_fallocate is EINVAL on every Linux file system (seed 3 failed so at op 68949
# on plain ext4), so sizes start at 1.
write_fsx_conf() {
    cat >"$1" <<'EOF'
flen = 1048576
[opsize]
min = 1
[weights]
close_open = 2
read = 10
write = 10
mapread = 10
mapwrite = 10
invalidate = 1
truncate = 5
fsync = 1
fdatasync = 1
posix_fallocate = 2
punch_hole = 2
sendfile = 1
posix_fadvise = 1
copy_file_range = 1
EOF
}

# Block mode keeps the file's size, so the file stays the copied-up lower file (fsx-rs
# refuses posix_fallocate in block mode; hole punching keeps the size).
write_fsx_block_conf() {
    cat >"$1" <<'EOF'
blockmode = true
nosizechecks = true
[opsize]
min = 1
[weights]
close_open = 0
read = 10
write = 10
mapread = 10
mapwrite = 10
invalidate = 1
truncate = 0
fsync = 1
fdatasync = 1
posix_fallocate = 0
punch_hole = 2
sendfile = 1
posix_fadvise = 1
copy_file_range = 1
EOF
}

# run_fsx NAME SEED CONF FILE [env...]: fsx in a fresh branch of $work/NAME; the real
# project must be byte-identical afterwards (the branch is dropped).
run_fsx() {
    local name=$1 seed=$2 conf=$3 file=$4
    shift 4
    local proj=$work/$name
    local before after start
    before=$(cd "$proj" && find . -type f -exec sha256sum {} + | sort)
    start=$SECONDS
    mkdir -p "$work/artifacts-$name"
    if ! env "$@" "$shade_bin" run -C "$proj" -- \
        fsx -q -f "$conf" -N "$FSX_N" -S "$seed" -P "$work/artifacts-$name" "$proj/$file" \
        >"$work/fsx-$name.log" 2>&1; then
        echo "integrity: fsx $name FAILED (seed $seed, N $FSX_N):" >&2
        grep -v '^ *[0-9]*: \|^ *at ' "$work/fsx-$name.log" | tail -30 >&2
        exit 1
    fi
    grep -q 'All operations completed A-OK' "$work/fsx-$name.log" || {
        echo "integrity: fsx $name did not report A-OK" >&2
        tail -20 "$work/fsx-$name.log" >&2
        exit 1
    }
    after=$(cd "$proj" && find . -type f -exec sha256sum {} + | sort)
    [[ $before == "$after" ]] || {
        echo "integrity: fsx $name changed the real project" >&2
        exit 1
    }
    echo "fsx $name: N=$FSX_N seed=$seed A-OK in $((SECONDS - start)) s, real tree untouched"
}

part_fsx() {
    echo "== fsx in a branch"
    write_fsx_conf "$work/fsx.toml"
    write_fsx_block_conf "$work/fsx-block.toml"
    mkdir -p "$work/new" "$work/lower" "$work/spill" "$work/spill-lower"
    # new: a file created in the branch.
    run_fsx new 1 "$work/fsx.toml" f
    # lower: a 1 MiB random file in the project, opened without truncation, so every
    # operation works on the copied-up lower file.
    head -c 1048576 /dev/urandom >"$work/lower/f"
    run_fsx lower 2 "$work/fsx-block.toml" f
    # spill: memory budget 0, so the content lives in the disk store from the start;
    # spill-lower: the same for a copied-up lower file, so the copy-up goes to disk.
    head -c 1048576 /dev/urandom >"$work/spill-lower/f"
    run_fsx spill 3 "$work/fsx.toml" f SHADE_MEMORY_BUDGET=0
    run_fsx spill-lower 4 "$work/fsx-block.toml" f SHADE_MEMORY_BUDGET=0
}

part_stress() {
    echo "== stress-ng --class filesystem --verify in a branch"
    local proj=$work/stress start
    mkdir -p "$proj"
    start=$SECONDS
    # --seq 1 runs every stressor of the class in turn, STRESS_T s each. Excluded:
    # binderfs (mounts its own binderfs, nothing of ours; absent here, and its skip makes
    # stress-ng exit 3). fiemap and verity skip themselves on FUSE (not supported).
    if ! "$shade_bin" run -C "$proj" -- sh -c "mkdir d && exec stress-ng --class filesystem \
            --exclude binderfs --seq 1 -t $STRESS_T --verify --temp-path $proj/d --metrics-brief" \
        >"$work/stress.log" 2>&1; then
        echo "integrity: stress-ng FAILED:" >&2
        grep -E '^stress-ng: (fail|error)|unsuccessful' "$work/stress.log" | head -40 >&2
        exit 1
    fi
    grep -q 'successful run completed' "$work/stress.log" || {
        echo "integrity: stress-ng did not complete successfully" >&2
        tail -20 "$work/stress.log" >&2
        exit 1
    }
    local n
    n=$(grep -o 'dispatching hogs: .*' "$work/stress.log" | tr ',' '\n' | grep -c . || true)
    [[ -z $(ls -A "$proj") ]] || {
        echo "integrity: stress-ng left files in the real project" >&2
        exit 1
    }
    echo "stress-ng filesystem class: $n stressors x ${STRESS_T}s, --verify, 0 failures, $((SECONDS - start)) s"
}

part_tests() {
    echo "== Rust integrity tests"
    cargo test --locked -q -p shade --test integrity_data --test integrity_faults \
        -- --nocapture --test-threads=1 2>&1 | grep -v '^$'
}

parts=("$@")
((${#parts[@]})) || parts=(all)
for p in "${parts[@]}"; do
    case $p in
    all)
        part_fsx
        part_stress
        part_tests
        ;;
    fsx) part_fsx ;;
    stress) part_stress ;;
    tests) part_tests ;;
    *)
        echo "usage: $0 [all|fsx|stress|tests]..." >&2
        exit 2
        ;;
    esac
done
