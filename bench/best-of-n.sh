#!/usr/bin/env bash
# Best of N: the time and memory of N attempts at a task in shade branches
# (`shade exec --attempts N --check CMD`), against a `git worktree` per attempt and a copy
# (`cp -a`) per attempt, each running the project's test in its workspace, N at once.
#
# The model is a stand-in answering every call at once with "done" (no edit), so what is
# measured is what the workspaces cost: making them, the check in each (a warm build in a
# branch, which sees the project's target/; a cold one in a worktree, which has none), and
# dropping them. Memory: the peak of a memory cgroup (v1) around the whole run, page cache
# included (a copy's files are in it); disk: what the workspaces held at the end of the
# check, before being dropped.
#
# Usage: bench/best-of-n.sh [PROJECT] [CHECK]   (as root; default: the corpus's strsim at
#   ${SHADE_CORPUS:-/var/tmp/shade-corpus}/projects/strsim with `cargo test --offline`, or
#   a small generated crate if the corpus was not fetched). N: ${NS:-1 2 4 8}.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
shade=${SHADE:-$here/target/release/shade}
[ -x "$shade" ] || shade=$here/target/debug/shade
[ -x "$shade" ] || { echo "build shade first (cargo build --release)" >&2; exit 1; }
corpus=${SHADE_CORPUS:-/var/tmp/shade-corpus}
check=${2:-cargo test --offline -q}
ns=${NS:-1 2 4 8}
work=$(mktemp -d /var/tmp/shade-bon.XXXXXX)
model_pid=
cleanup() {
    [ -n "$model_pid" ] && kill "$model_pid" 2>/dev/null || true
    for g in /sys/fs/cgroup/memory/shade-bon-*; do
        [ -d "$g" ] && rmdir "$g" 2>/dev/null || true
    done
    git -C "$work/project" worktree prune 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

if [ -n "${1:-}" ]; then
    cp -a "$1" "$work/project"
elif [ -d "$corpus/projects/strsim" ]; then
    cp -a "$corpus/projects/strsim" "$work/project"
else
    mkdir -p "$work/project/src"
    cat > "$work/project/Cargo.toml" <<'EOF'
[package]
name = "bon"
version = "0.1.0"
edition = "2021"
EOF
    {
        echo 'pub fn add(a: i64, b: i64) -> i64 { a - b }'
        for i in $(seq 1 300); do echo "pub fn f$i(x: i64) -> i64 { x * $i + add($i, x) }"; done
        echo '#[cfg(test)] mod tests { #[test] fn adds() { assert_eq!(super::add(2, 2), 4); } }'
    } > "$work/project/src/lib.rs"
fi
project=$work/project
# A failing test, a warm build (as a developer's checkout has), and git for the worktrees.
(cd "$project" && timeout 900 cargo test --offline -q --no-run >/dev/null 2>&1 || true)
if [ ! -d "$project/.git" ]; then
    (cd "$project" && git init -q && printf 'target/\n' >> .gitignore && git add -A &&
        git -c user.email=b@b -c user.name=b commit -qm base)
fi

# The stand-in model: every request answered with "done", streamed.
cat > "$work/model.py" <<'EOF'
import http.server, json, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        chunk = lambda d, f=None: "data: " + json.dumps({"id": "x", "object": "chat.completion.chunk", "model": "m",
            "choices": [{"index": 0, "delta": d, "finish_reason": f}]}) + "\n\n"
        body = (chunk({"content": "done"}) + chunk({}, "stop") + "data: " + json.dumps({"id": "x", "object": "chat.completion.chunk",
            "model": "m", "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 1}}) + "\n\ndata: [DONE]\n\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
EOF
python3 "$work/model.py" > "$work/port" &
model_pid=$!
for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.1; done
port=$(cat "$work/port")

# Runs "$@" in a fresh memory cgroup; prints "SECONDS PEAK_MIB".
measure() {
    local g=/sys/fs/cgroup/memory/shade-bon-$$-$RANDOM
    mkdir "$g"
    sync; echo 3 > /proc/sys/vm/drop_caches || true
    local t0 t1
    t0=$(date +%s.%N)
    sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' sh "$g" "$@" >/dev/null 2>"$work/err" || {
        echo "failed: $* (see below)" >&2; tail -5 "$work/err" >&2; }
    t1=$(date +%s.%N)
    local peak
    peak=$(cat "$g/memory.max_usage_in_bytes")
    rmdir "$g" 2>/dev/null || true
    echo "$(echo "$t1 - $t0" | bc) $((peak / 1048576))"
}

# Each method as a script of its own: N workspaces, the check in each at once, dropped.
cat > "$work/worktree.sh" <<'EOF'
n=$1; project=$2; check=$3; out=$4
for i in $(seq "$n"); do git -C "$project" worktree add -q --detach "$out/wt$i"; done
for i in $(seq "$n"); do (cd "$out/wt$i" && timeout 1800 sh -c "$check" || true) & done; wait
du -sk "$out"/wt* | awk '{s+=$1} END {print s}' > "$out/disk"
for i in $(seq "$n"); do git -C "$project" worktree remove --force "$out/wt$i"; done
EOF
cat > "$work/copy.sh" <<'EOF'
n=$1; project=$2; check=$3; out=$4
for i in $(seq "$n"); do cp -a "$project" "$out/cp$i"; done
for i in $(seq "$n"); do (cd "$out/cp$i" && timeout 1800 sh -c "$check" || true) & done; wait
du -sk "$out"/cp* | awk '{s+=$1} END {print s}' > "$out/disk"
rm -rf "$out"/cp*
EOF
cat > "$work/shade.sh" <<'EOF'
n=$1; project=$2; check=$3; out=$4; shade=$5
cd "$project" && timeout 3600 "$shade" exec --approval yolo --attempts "$n" --jobs "$n" \
    --check "$check" --json "fix the failing test" > "$out/json"
status=$?
# 1: no attempt passed (the stand-in fixes nothing, the test still fails): as expected.
grep -o '"check":{"exit":[0-9a-z]*' "$out/json" | sort | uniq -c | tr -s ' ' > "$out/checks"
[ "$status" = 0 ] || [ "$status" = 1 ]
EOF

echo "project: $project ($(du -sh "$project" | cut -f1) with target/), check: $check, $(nproc) CPUs"
printf '%-10s %3s %10s %10s %10s\n' method N seconds peak_MiB disk_MiB
for n in $ns; do
    for method in shade worktree copy; do
        out=$work/out-$method-$n
        mkdir -p "$out"
        state=$work/state-$n
        r=$(SHADE_STATE_DIR=$state OPENAI_BASE_URL=http://127.0.0.1:$port/v1 OPENAI_API_KEY=x \
            SHADE_MODEL=m XDG_CONFIG_HOME=$work measure sh "$work/$method.sh" "$n" "$project" "$check" "$out" "$shade")
        disk=-
        [ -s "$out/disk" ] && disk=$(( $(cat "$out/disk") / 1024 ))
        # A branch holds only what the attempt and its check wrote, dropped with it.
        note=
        if [ "$method" = shade ]; then
            disk="-"
            note="checks:$(tr '\n' ' ' < "$out/checks")"
        fi
        printf '%-10s %3s %10.2f %10s %10s  %s\n' "$method" "$n" $r "$disk" "$note"
    done
done
