#!/usr/bin/env bash
# Runs the shade benchmark (issue 4): installs its system tools, builds shade-bench in
# release mode and runs it as root. Arguments go to shade-bench, e.g.
#   bench/run.sh --quick                     # CI smoke run, < 2 minutes
#   bench/run.sh --json bench/results/x.json --markdown bench/results/x.md
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
    SUDO=(sudo -n)
fi

if [[ -x $repo/scripts/setup.sh ]]; then
    "$repo/scripts/setup.sh" bench
elif ! command -v fuse-overlayfs >/dev/null 2>&1; then
    # The peer overlay the benchmark compares against.
    "${SUDO[@]}" apt-get update -qq </dev/null >/dev/null
    DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq fuse-overlayfs </dev/null >/dev/null
fi

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$repo/target-bench}
cargo build --release --quiet -p shade-bench --manifest-path "$repo/Cargo.toml"
# Root: the benchmark mounts a tmpfs and overlays and drops the page cache.
exec "${SUDO[@]}" "$CARGO_TARGET_DIR/release/shade-bench" "$@"
