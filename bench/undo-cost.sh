#!/usr/bin/env bash
# What the undo history costs (issue 30): accept time with the history on and off — 1 to
# 2,000 changed files and a one-line edit, runs interleaved on/off, ratios with their
# spread — the bytes it stores per accept, and a live chat session's tool-call accept
# (accept + the next branch). Release build, as root (shade-bench's `accept` section).
#   bench/undo-cost.sh            # 7 runs; writes bench/results/<date>-undo-cost.{md,json}
#   bench/undo-cost.sh --runs 5   # more arguments go to shade-bench
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
stamp=$(date -u +%Y-%m-%dT%H%M)
out="$here/results/$stamp-undo-cost"
runs=(--runs 7)
for a in "$@"; do [[ $a == --runs ]] && runs=(); done
exec "$here/run.sh" --quick --only accept "${runs[@]}" \
    --markdown "$out.md" --json "$out.json" "$@"
