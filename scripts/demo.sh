#!/usr/bin/env bash
# shade's main job on a real project: an "agent" edits, builds and tests a Rust crate in
# a branch while the real project stays untouched; then the same edit is accepted.
# Usage: scripts/demo.sh   (as root: shade mounts FUSE and uses mount namespaces)
#
# It installs only what it uses (`scripts/setup.sh demo`: FUSE, git, tmux) and builds only
# the shade binary, in the dev profile: on 2 cores that is minutes sooner than a release
# build, and the demo's own steps are as quick either way (README, "Set-up").
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
if [[ ! -e /dev/fuse ]]; then
    echo "demo.sh: /dev/fuse is missing (modprobe fuse, or give the container --device /dev/fuse)" >&2
    exit 1
fi
scripts/setup.sh demo
target_dir=$(realpath -m "${CARGO_TARGET_DIR:-$repo/target}")
if [[ ! -x $target_dir/debug/shade ]]; then
    echo "demo: building the shade binary (the first time takes a few minutes on 2 cores)"
fi
cargo build --locked -q -p shade --bin shade
shade=$target_dir/debug/shade

work=$(mktemp -d /var/tmp/shade-demo.XXXXXX)
trap 'rm -rf "$work"' EXIT
cp -r examples/hello "$work/hello"
cd "$work/hello"
git init -q && git add -A && git -c user.name=demo -c user.email=demo@example.com commit -qm "demo project"

edit='sed -i "s/\"world\"/\"shade\"/" src/main.rs'
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "1. Edit, build and run in a branch (the project at $PWD is not touched)"
"$shade" run --diff -- sh -c "$edit && cargo run --offline -q"
step "   git status of the real project afterwards (empty: nothing changed, no target/):"
git status --short --ignored
step "2. The same, accepted because the tests pass"
"$shade" run --accept -- sh -c "$edit && cargo test --offline -q 2>&1 | tail -1"
step "   git status of the real project now:"
git status --short
grep -n '"shade"' src/main.rs

# 3. The interactive agent, replayed offline from a recorded cassette: the answer, the next
#    input suggested as ghost text, its speculation (an edit and `cargo run` in a branch of
#    the project), accepted with Enter, and the next suggestion shown at once. It runs in a
#    real terminal (tmux), so you see what a user sees.
step "3. shade chat, replayed from examples/cassettes/chat.jsonl (no model needed)"
git checkout -q -- src/main.rs
chat_home=$(mktemp -d /var/tmp/shade-demo-chat.XXXXXX)
sock="shade-demo-$$"
cleanup_chat() { tmux -L "$sock" kill-server 2>/dev/null || true; rm -rf "$chat_home"; }
trap 'cleanup_chat; rm -rf "$work"' EXIT
tmux -L "$sock" -f /dev/null new-session -d -x 110 -y 30 -c "$PWD" \
    -e XDG_CONFIG_HOME="$chat_home/config" -e SHADE_STATE_DIR="$chat_home/state" \
    -e TERM=xterm-256color \
    -- "$shade" chat --approval yolo --llm "replay:$repo/examples/cassettes/chat.jsonl"
screen() { tmux -L "$sock" capture-pane -p -t 0 | sed -e :a -e '/^\n*$/{$d;N;ba' -e '}'; }
wait_for() { # TEXT SECONDS
    for _ in $(seq $(( $2 * 10 ))); do screen | grep -qF -- "$1" && return 0; sleep 0.1; done
    echo "demo: timed out waiting for: $1"; screen; exit 1
}
wait_for "/help for commands" 20
tmux -L "$sock" send-keys -t 0 -l "what does this program print?"
tmux -L "$sock" send-keys -t 0 Enter
wait_for "Tip: change it to greet shade" 30
sleep 1   # the suggestion appears 300 ms after it arrives
step "   the answer, and the suggested next input as ghost text (dim on a terminal):"
screen
sleep 8   # meanwhile the suggestion runs in a branch: the edit, then cargo run
tmux -L "$sock" send-keys -t 0 Enter
wait_for "speculated ahead" 60
wait_for "commit this" 30
step "   Enter accepted it: the turn was already done in its branch, now written into the project:"
screen
tmux -L "$sock" send-keys -t 0 C-d
sleep 1
step "   git diff of the real project (the edit landed; cargo's target/ stayed in the branch):"
git --no-pager diff --stat
git status --short --ignored
