#!/usr/bin/env bash
# Issue 31: the first command of `shade exec --shadow` in a warm 10k-file git repository,
# its branch made in-process (SHADE_BRANCH_SERVER=0: a fresh mount, warmed by
# `Branch::warm_up` while the model answers) against served by the branch server (a
# connection the server's previous branch used, reset). The model is a fake (python, the
# OpenAI streaming API) whose one answer is a shell call timing the command inside the
# sandbox; `--json` carries the tool result back. Interleaved rounds, native alongside.
# Usage: bench/exec-shadow-served.sh ROUNDS   (as root, in a private mount namespace:
#        unshare -m --propagation private; cargo build --release -p shade)
set -euo pipefail
rounds=${1:-5}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SHADE=${SHADE:-$here/target/release/shade}
base=${BASE:-/var/tmp/shade-exec-served}
proj=$base/repo
source "$here/bench/fresh-lib.sh"
ten_k_repo "$proj"
export SHADE_STATE_DIR=$base/state XDG_CONFIG_HOME=$base/config
mkdir -p $XDG_CONFIG_HOME
git -C $proj config gc.auto 0
declare -A C=([status]="git status --porcelain" [diff]="git diff --stat" [rg]="rg --no-ignore -c 'fn '" [find]="find . -type f")
# The fake model: its first answer runs $CMD timed, its second ends the turn.
port_file=$base/port; rm -f $port_file
python3 - "$port_file" <<'PY' &
import http.server, json, os, sys
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers['Content-Length'])))
        msgs = body.get('messages', [])
        user = next(m['content'] for m in msgs if m['role'] == 'user')
        if isinstance(user, list): user = ''.join(p.get('text', '') for p in user)
        done = any(m['role'] == 'tool' for m in msgs)
        self.send_response(200); self.send_header('Content-Type', 'text/event-stream'); self.end_headers()
        def send(delta, finish=None):
            c = {"id": "x", "object": "chat.completion.chunk", "model": "fake",
                 "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            self.wfile.write(f"data: {json.dumps(c)}\n\n".encode()); self.wfile.flush()
        if done:
            send({"content": "Done."}); send({}, "stop")
        else:
            cmd = "t0=$(date +%s%N); " + user + " >/dev/null; echo \"ms=$(( ($(date +%s%N) - t0) / 1000000 ))\""
            send({"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                  "function": {"name": "shell", "arguments": json.dumps({"command": cmd})}}]})
            send({}, "tool_calls")
        self.wfile.write(b"data: [DONE]\n\n"); self.wfile.flush()
s = http.server.ThreadingHTTPServer(('127.0.0.1', 0), H)
open(sys.argv[1], 'w').write(str(s.server_address[1]))
s.serve_forever()
PY
fake=$!
trap 'kill $fake 2>/dev/null || true' EXIT
for _ in $(seq 50); do [[ -s $port_file ]] && break; sleep 0.1; done
export OPENAI_BASE_URL=http://127.0.0.1:$(cat $port_file) SHADE_MODEL=fake OPENAI_API_KEY=x
# exec --shadow whose agent runs CMD: the ms the command took inside the sandbox, with
# "r" appended when the branch was served on a reused connection ("n": served, new).
shadow_ms() { # server(0|1) CMD
  local ms
  ms=$( (cd $proj && SHADE_BRANCH_SERVER=$1 SHADE_LOG=shade_fusefs::served=debug NO_COLOR=1 \
      $SHADE exec --shadow --json --approval yolo "$2" 2>$base/exec.err) \
    | grep -o "ms=[0-9][0-9]*" | head -1 | cut -d= -f2)
  if grep -q "reused_connection=true" $base/exec.err; then echo "${ms}r"
  elif grep -q "branch served" $base/exec.err; then echo "${ms}n"
  else echo "$ms"; fi
}
echo "files $(find $proj -type f -not -path '*/.git/*' | wc -l), load $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
shadow_ms 1 true >/dev/null  # start the server
for r in $(seq $rounds); do
  for k in status diff rg find; do
    native=$(cd $proj && ms "${C[$k]}")
    # The server's previous branch ran the same command (as an agent's session would have).
    shadow_ms 1 "${C[$k]}" >/dev/null
    if (( r % 2 )); then
      inproc=$(shadow_ms 0 "${C[$k]}"); served=$(shadow_ms 1 "${C[$k]}")
    else
      served=$(shadow_ms 1 "${C[$k]}"); inproc=$(shadow_ms 0 "${C[$k]}")
    fi
    echo "round $r $k native $native in-process $inproc served $served ms"
  done
done
