#!/usr/bin/env bash
# Fetches the speculation benchmark's corpus (bench/corpus/projects.toml) into
# ${SHADE_CORPUS:-/var/tmp/shade-corpus}: each project's archive is downloaded with its
# registry's own client (cargo, pip, npm), checked against the pinned sha256, unpacked into
# projects/<name>/ and prepared with its `setup` command (dependencies fetched, tests built),
# so that its test command passes with the network off.
#
# Idempotent: a project whose stamp matches its pinned hash is left alone. A project whose
# archive does not match its hash fails the script (nothing is unpacked from it).
# Usage: bench/corpus/fetch.sh [NAME...]      (default: every project)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=${SHADE_CORPUS:-/var/tmp/shade-corpus}
mkdir -p "$root/archives" "$root/projects" "$root/stamps"

# name source package version sha256, one project a line (python3's tomllib reads the pins).
projects=$(python3 - "$here/projects.toml" "$@" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    projects = tomllib.load(f)["projects"]
wanted = sys.argv[2:] or list(projects)
for name in wanted:
    p = projects[name]
    print(name, p["source"], p["package"], p["version"], p["sha256"])
PY
)
field() { # field NAME KEY: one string field of a project
    python3 - "$here/projects.toml" "$1" "$2" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    print(tomllib.load(f)["projects"][sys.argv[2]].get(sys.argv[3], ""))
PY
}

# Downloads NAME's archive into archives/ (if not there) and prints its path.
download() {
    local name=$1 source=$2 package=$3 version=$4 out
    case $source in
        crates.io)
            out=$root/archives/$package-$version.crate
            if [[ ! -e $out ]]; then
                # cargo has no "download one crate": a throwaway package that depends on it
                # makes `cargo fetch` put the .crate into cargo's cache, whose file we copy.
                local tmp
                tmp=$(mktemp -d)
                mkdir "$tmp/src" && : >"$tmp/src/lib.rs"
                printf '[package]\nname = "corpus-fetch"\nversion = "0.0.0"\nedition = "2021"\n[dependencies]\n%s = "=%s"\n' \
                    "$package" "$version" >"$tmp/Cargo.toml"
                (cd "$tmp" && cargo fetch --quiet </dev/null)
                local cached
                cached=$(ls "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/"$package-$version.crate" | head -n1)
                cp "$cached" "$out.part" && mv "$out.part" "$out"
                rm -rf "$tmp"
            fi ;;
        pypi)
            out=$(ls "$root/archives/$package-$version.tar.gz" "$root/archives/${package//-/_}-$version.tar.gz" 2>/dev/null | head -n1 || true)
            if [[ -z $out ]]; then
                python3 -m pip download --quiet --disable-pip-version-check --no-deps \
                    --no-binary :all: -d "$root/archives" "$package==$version" </dev/null \
                    2> >(grep -v 'Running pip as the .root. user' >&2)
                out=$(ls "$root/archives/$package-$version.tar.gz" "$root/archives/${package//-/_}-$version.tar.gz" 2>/dev/null | head -n1)
            fi ;;
        npm)
            out=$root/archives/$package-$version.tgz
            if [[ ! -e $out ]]; then
                (cd "$root/archives" && npm pack --quiet --loglevel=error "$package@$version" </dev/null >/dev/null)
            fi ;;
        *) echo "fetch: $name: unknown source $source" >&2; return 1 ;;
    esac
    printf '%s\n' "$out"
}

while read -r name source package version sha; do
    [[ -n $name ]] || continue
    stamp=$root/stamps/$name
    dest=$root/projects/$name
    if [[ -e $stamp && $(cat "$stamp") == "$sha" && -d $dest ]]; then
        continue
    fi
    echo "fetch: $name ($source $package $version)"
    archive=$(download "$name" "$source" "$package" "$version")
    got=$(sha256sum "$archive" | cut -d' ' -f1)
    if [[ $got != "$sha" ]]; then
        echo "fetch: $name: $archive has sha256 $got, projects.toml pins $sha" >&2
        exit 1
    fi
    rm -rf "$dest" "$dest.part" "$stamp"
    mkdir -p "$dest.part"
    # Every archive holds one top directory (package-version/ or package/): strip it.
    tar -xzf "$archive" -C "$dest.part" --strip-components=1 --no-same-owner
    setup=$(field "$name" setup)
    if [[ -n $setup ]]; then
        # The project's own path from the start: setup may record it (cargo's target dir).
        mv "$dest.part" "$dest"
        (cd "$dest" && bash -c "$setup" </dev/null) || { echo "fetch: $name: setup failed: $setup" >&2; rm -rf "$dest"; exit 1; }
    else
        mv "$dest.part" "$dest"
    fi
    printf '%s\n' "$sha" >"$stamp"
done <<<"$projects"
