#!/usr/bin/env bash
# shade's main job on a real project: an "agent" edits, builds and tests a Rust crate in
# a branch while the real project stays untouched; then the same edit is accepted.
# Usage: scripts/demo.sh   (as root: shade mounts FUSE and uses mount namespaces)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
scripts/setup.sh
cargo build --release --locked -q -p shade
shade=$repo/target/release/shade

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
