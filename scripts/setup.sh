#!/usr/bin/env bash
# Installs what shade needs on a fresh Debian machine that has only the Rust toolchain, in
# parts, so the demo does not wait for the test and benchmark tools:
#   demo    what shade itself and scripts/demo.sh use (FUSE, git, tmux): seconds
#   test    + the test suite's tools: pjdfstest and fsx (two `cargo install` builds), ruff,
#           stress-ng, … (scripts/test.sh, scripts/integrity.sh)
#   bench   + the benchmark's: fuse-overlayfs, hyperfine, ripgrep, the npm cache (bench/run.sh),
#           pytest and ruff, and the speculation corpus's projects (bench/corpus/fetch.sh)
# Every part includes `demo`. Idempotent and quiet: it prints only what it installs, runs
# `apt-get update` only when an apt package is missing, and never prompts (CI runs it as root
# with no stdin).
#
# Usage: scripts/setup.sh [demo|test|bench|all]...   (default: all)
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive

parts=("$@")
((${#parts[@]})) || parts=(all)
want_test=false want_bench=false
for part in "${parts[@]}"; do
    case $part in
        demo) ;;
        test) want_test=true ;;
        bench) want_bench=true ;;
        all) want_test=true want_bench=true ;;
        *) echo "usage: scripts/setup.sh [demo|test|bench|all]..." >&2; exit 2 ;;
    esac
done

# apt package -> a file or command that shows it is installed. Checking a file rather than
# `dpkg -s` keeps the common "already set up" path fast and works for -dev packages.
# shade itself and the demo (every part):
declare -A APT_PROBE=(
    [fuse3]=fusermount3               # fusermount3: unprivileged mount/unmount of FUSE
    [git]=git                         # the demo's project is a git repository; git in branches
    [tmux]=tmux                       # the demo and the interactive tests show `shade chat` in a real terminal
    [bubblewrap]=bwrap                # the sandbox every command in a branch runs in
)
# The test suite:
declare -A TEST_PROBE=(
    [libacl1-dev]=/usr/include/sys/acl.h  # build dependency of the pjdfstest crate
    [stress-ng]=stress-ng             # filesystem stress class with --verify
    [procps]=ps                       # ps/pgrep for leftover-process checks
    [iproute2]=ip                     # network-namespace checks
    [attr]=setfattr                   # xattr tests
    [python3]=python3                 # fidelity tests: xattrs and a unix socket from a script
    [util-linux]=setpriv              # pjdfstest.sh checks access as other users; setsid in tests
    [bsdutils]=script                 # exec_cli runs `shade exec` on a pseudo-terminal
)
# The benchmark:
declare -A BENCH_PROBE=(
    [fuse-overlayfs]=fuse-overlayfs   # peer overlay for comparison benchmarks
    [hyperfine]=hyperfine             # benchmarks
    [ripgrep]=rg                      # benchmark: `rg` over the tree (agent workloads)
    [libfuse3-dev]=/usr/include/fuse3/fuse.h  # builds BranchFS, a peer in the fresh-branch rows
    [python3-pytest]=/usr/lib/python3/dist-packages/pytest  # fresh-branch `pytest` row
    [pkg-config]=pkg-config           # BranchFS's build finds libfuse3 with it
    [python3]=python3                 # the corpus's Python projects; fetch.sh reads projects.toml
    [python3-pip]=pip3                # pip downloads the corpus's sdists, installs pytest and ruff
    [npm]=npm                         # the corpus's npm project (npm pulls in nodejs)
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
if $want_test; then
    for pkg in "${!TEST_PROBE[@]}"; do
        have "${TEST_PROBE[$pkg]}" || missing+=("$pkg")
    done
fi
if $want_bench; then
    for pkg in "${!BENCH_PROBE[@]}"; do
        have "${BENCH_PROBE[$pkg]}" || missing+=("$pkg")
    done
fi

if ((${#missing[@]})); then
    echo "setup: installing apt packages: ${missing[*]}"
    "${SUDO[@]}" apt-get update -qq </dev/null >/dev/null
    # debconf's "delaying package configuration" notice is noise on minimal images.
    "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null \
        >/dev/null 2> >(grep -v '^debconf: delaying package configuration' >&2)
fi

# Python tools: ruff for `shade lint` tests and the corpus's lint sessions, pytest for the
# corpus's Python projects; both pinned so their messages stay the same.
pip_pin() { # pip_pin COMMAND VERSION-LINE PACKAGE==VERSION
    if [[ "$($1 --version 2>/dev/null | head -n1)" != "$2" ]]; then
        echo "setup: pip install $3"
        python3 -m pip install --quiet --disable-pip-version-check "$3" </dev/null \
            2> >(grep -v 'Running pip as the .root. user' >&2)
        command -v pyenv >/dev/null 2>&1 && pyenv rehash
    fi
}
RUFF_VERSION=0.17.6
PYTEST_VERSION=8.3.3
if $want_test || $want_bench; then
    pip_pin ruff "ruff $RUFF_VERSION" "ruff==$RUFF_VERSION"
fi
if $want_bench; then
    pip_pin "python3 -m pytest" "pytest $PYTEST_VERSION" "pytest==$PYTEST_VERSION"
fi

if $want_test; then
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

    # The lint tests' example crate checks offline: fetch its dependency while the registry is
    # reachable (a no-op when it is already in cargo's cache).
    cargo fetch --locked --quiet --manifest-path "$(dirname "$0")/../examples/lint-demo/Cargo.toml" </dev/null
fi

if $want_bench; then
    export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
    # BranchFS (a FUSE branching filesystem), a peer in the fresh-branch rows (issue 20).
    if ! command -v branchfs >/dev/null 2>&1; then
        echo "setup: cargo install --locked branchfs"
        CARGO_TARGET_DIR="${TMPDIR:-/tmp}/shade-setup-target" \
            cargo install --locked --quiet branchfs </dev/null
    fi
    # Fresh-branch `cargo test` and `pytest` fixtures: a small crate with its dev-dependencies
    # and a small pure-Python package with its tests, fetched once so the benchmark runs
    # offline. The benchmark copies them into its own tree.
    fixtures=/var/tmp/shade-bench-fixtures
    SEMVER=1.0.28 MORE_ITERTOOLS=10.5.0
    if [[ ! -e $fixtures/semver-$SEMVER/Cargo.lock.fetched ]]; then
        echo "setup: fetching the bench fixture crate semver $SEMVER and its dev-dependencies"
        mkdir -p "$fixtures"
        tmp=$(mktemp -d)
        mkdir "$tmp/src" && touch "$tmp/src/lib.rs"
        printf '[package]\nname = "fetch"\nversion = "0.0.0"\nedition = "2021"\n[dependencies]\nsemver = "=%s"\n' \
            "$SEMVER" >"$tmp/Cargo.toml"
        cargo fetch --quiet --manifest-path "$tmp/Cargo.toml" </dev/null
        crate=$(ls "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/semver-$SEMVER.crate | head -1)
        rm -rf "$fixtures/semver-$SEMVER" "$tmp"
        tar xzf "$crate" -C "$fixtures"
        # Its shipped Cargo.lock pins the dev-dependencies; fetch them for `cargo test --offline`.
        cargo fetch --locked --quiet --manifest-path "$fixtures/semver-$SEMVER/Cargo.toml" </dev/null
        touch "$fixtures/semver-$SEMVER/Cargo.lock.fetched"
    fi
    if [[ ! -d $fixtures/more-itertools-$MORE_ITERTOOLS ]]; then
        echo "setup: fetching the bench fixture package more-itertools $MORE_ITERTOOLS (sdist)"
        mkdir -p "$fixtures"
        tmp=$(mktemp -d)
        python3 -m pip download --quiet --disable-pip-version-check --no-binary :all: \
            --no-deps "more-itertools==$MORE_ITERTOOLS" -d "$tmp" </dev/null
        tar xzf "$tmp/more-itertools-$MORE_ITERTOOLS.tar.gz" -C "$fixtures"
        rm -rf "$tmp"
    fi
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
    # The speculation benchmark's corpus: real crates, sdists and an npm package, pinned,
    # unpacked and prepared under /var/tmp/shade-corpus so their tests run offline.
    "$(dirname "${BASH_SOURCE[0]}")/../bench/corpus/fetch.sh"
fi

# A plain user for the tests that must hold without root (the isolation tests run every
# escape attempt as root and as this user). It mounts branches through /dev/fuse, which
# desktop distributions leave 0666; tests/plain_user.rs checks the 0600 message itself.
if $want_test && [[ $(id -u) -eq 0 ]]; then
    id shadetest >/dev/null 2>&1 || useradd --create-home --shell /bin/bash shadetest
    if [[ -e /dev/fuse && $(stat -c %a /dev/fuse) != 666 ]]; then
        echo "setup: chmod 0666 /dev/fuse (the plain test user mounts branches)"
        chmod 0666 /dev/fuse
    fi
fi
