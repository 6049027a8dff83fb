#!/usr/bin/env bash
# Installs what shade's tests, conformance suites and benchmarks need on a fresh Debian
# machine that has only the Rust toolchain. Idempotent and quiet: it prints only what it
# installs, runs `apt-get update` only when an apt package is missing, and never prompts
# (CI runs it as root with no stdin).
#
# Usage: scripts/setup.sh
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive

# apt package -> a file or command that shows it is installed. Checking a file rather than
# `dpkg -s` keeps the common "already set up" path fast and works for -dev packages.
declare -A APT_PROBE=(
    [fuse3]=fusermount3               # fusermount3: unprivileged mount/unmount of FUSE
    [libacl1-dev]=/usr/include/sys/acl.h  # build dependency of the pjdfstest crate
    [fuse-overlayfs]=fuse-overlayfs   # peer overlay for comparison benchmarks and script checks
    [stress-ng]=stress-ng             # filesystem stress class with --verify
    [git]=git                         # git inside branches (tests)
    [procps]=ps                       # ps/pgrep for leftover-process checks
    [iproute2]=ip                     # network-namespace checks
    [attr]=setfattr                   # xattr tests
    [python3]=python3                 # fidelity tests: xattrs and a unix socket from a script
    [util-linux]=setpriv              # pjdfstest.sh checks access as other users; setsid in tests
    [hyperfine]=hyperfine             # benchmarks
    [ripgrep]=rg                      # benchmark: `rg` over the tree (agent workloads)
    [tmux]=tmux                       # interactive tests drive `shade chat` in a real terminal
    [bubblewrap]=bwrap                # the sandbox every command in a branch runs in
)

have() {
    local probe=$1
    if [[ $probe == /* ]]; then
        [[ -e $probe ]]
    else
        command -v "$probe" >/dev/null 2>&1
    fi
}

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
    SUDO=(sudo -n)
fi

missing=()
for pkg in "${!APT_PROBE[@]}"; do
    have "${APT_PROBE[$pkg]}" || missing+=("$pkg")
done

if ((${#missing[@]})); then
    echo "setup: installing apt packages: ${missing[*]}"
    "${SUDO[@]}" apt-get update -qq </dev/null >/dev/null
    # debconf's "delaying package configuration" notice is noise on minimal images.
    "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null \
        >/dev/null 2> >(grep -v '^debconf: delaying package configuration' >&2)
fi

# The isolation tests (tests/isolation.rs) run every escape attempt as root and as this plain
# user too; it needs /dev/fuse to mount its branches (0666 on desktop distributions).
if [[ $(id -u) -eq 0 ]]; then
    if ! id shadetest >/dev/null 2>&1; then
        echo "setup: creating the plain test user shadetest"
        useradd --create-home --shell /bin/sh shadetest
    fi
    if [[ -e /dev/fuse && $(stat -c %a /dev/fuse) != 666 ]]; then
        echo "setup: chmod 0666 /dev/fuse (plain users mount branches)"
        chmod 0666 /dev/fuse
    fi
fi

# Rust tools from crates.io, installed into cargo's bin dir (on PATH with rustup).
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
for tool in pjdfstest fsx; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "setup: cargo install --locked $tool"
        # Its own target dir so it never shares a lock with a workspace build.
        CARGO_TARGET_DIR="${TMPDIR:-/tmp}/shade-setup-target" \
            cargo install --locked --quiet "$tool" </dev/null
    fi
done

# Checkers for `shade lint` tests: ruff (a batch linter with JSON output, and `ruff server`,
# the language server the warm-checker tests drive), pinned so its messages stay the same.
RUFF_VERSION=0.17.6
if [[ "$(ruff --version 2>/dev/null)" != "ruff $RUFF_VERSION" ]]; then
    echo "setup: pip install ruff==$RUFF_VERSION"
    python3 -m pip install --quiet --disable-pip-version-check "ruff==$RUFF_VERSION" </dev/null \
        2> >(grep -v 'Running pip as the .root. user' >&2)
    command -v pyenv >/dev/null 2>&1 && pyenv rehash
fi
# The lint tests' example crate checks offline: fetch its dependency while the registry is
# reachable (a no-op when it is already in cargo's cache).
cargo fetch --locked --quiet --manifest-path "$(dirname "$0")/../examples/lint-demo/Cargo.toml" </dev/null

# The benchmark's npm workload installs bench/npm's lock file with `npm ci --offline`:
# fill npm's cache once per lock file (needs the npm registry; skipped without npm).
if command -v npm >/dev/null 2>&1; then
    repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    lock=$repo/bench/npm/package-lock.json
    stamp="$HOME/.npm/shade-bench-$(sha256sum "$lock" | cut -c1-16)"
    if [[ ! -e $stamp ]]; then
        echo "setup: filling the npm cache for the benchmark (bench/npm)"
        tmp=$(mktemp -d)
        cp "$repo/bench/npm/package.json" "$lock" "$tmp/"
        # Not fatal: only the benchmark needs it, and it reports the row as skipped.
        if (cd "$tmp" && npm ci --prefer-offline --ignore-scripts --no-audit --no-fund \
            --loglevel=error </dev/null >/dev/null); then
            touch "$stamp"
        else
            echo "setup: npm cache not filled; the benchmark will skip its npm row" >&2
        fi
        rm -rf "$tmp"
    fi
fi
