#!/usr/bin/env python3
"""Fails when modules of one crate import each other in a circle.

For every crate (a directory with Cargo.toml and src/lib.rs or src/main.rs) it reads each
module's `crate::`, `super::`, `self::` and child-module paths (comments stripped), turns
each into an edge between the two sibling modules where the paths part (`tools::shell` ->
`shadow::X` is the edge tools -> shadow under the crate root; `followup::controller` ->
`followup::telemetry::Y` is controller -> telemetry under followup), and looks for cycles
among siblings. Crate-level circles are impossible (Cargo refuses them).

Usage: scripts/module-cycles.py [--graph] [CRATE_DIR...]   (default: every crate here)
"""
import os
import re
import sys

# Circles known and left for later, as "crate dir:scope" -> the exact set of modules. One
# that grows, shrinks or appears elsewhere fails the check; remove an entry once it is gone.
KNOWN = {
    # Accept planning: the tree holds the branch's reads, reads/changeset/select plan from
    # the overlay's tree, and changeset plans only what select keeps.
    "fusefs": [["changeset", "overlay", "reads", "select", "tree"]],
}

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def modules(src):
    """module path (tuple) -> file, for the files under src."""
    out = {}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), src)[:-3].split(os.sep)
            if rel in (["lib"], ["main"]):
                path = ()
            elif rel[-1] == "mod":
                path = tuple(rel[:-1])
            else:
                path = tuple(rel)
            if rel[0] == "bin":
                continue
            out[path] = os.path.join(dirpath, f)
    return out


def strip(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    return re.sub(r"//[^\n]*", "", text)


def use_paths(text):
    """Every path a `use` item names (groups expanded), and every other `a::b` path."""
    paths = []
    for m in re.finditer(r"\buse\s+([^;]+);", text):
        paths += expand(m.group(1).replace(" ", "").replace("\n", ""))
    rest = re.sub(r"\buse\s+[^;]+;", "", text)
    for m in re.finditer(r"(?<![A-Za-z0-9_:])((?:%s::)+%s)" % (IDENT, IDENT), rest):
        paths.append(m.group(1).split("::"))
    return paths


def expand(tree):
    """`a::{b,c::{d}}` -> [[a,b],[a,c,d]]."""
    out = []
    depth, start, prefix = 0, None, []
    i = tree.find("{")
    if i < 0:
        return [[p.split(" as ")[0] for p in tree.split("::") if p]]
    head = [p for p in tree[:i].split("::") if p]
    body = tree[i + 1 : tree.rfind("}")]
    parts, cur = [], ""
    for ch in body:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    for p in parts:
        if p and p != "self":
            out += [head + sub for sub in expand(p)]
        elif p == "self":
            out.append(head)
    return out


def resolve(here, is_dir, path, mods):
    """The absolute module path a path points into, or None (external, std, an item)."""
    base = here if is_dir else here[:-1]  # the module a `super` is relative to
    if path[0] == "crate":
        return tuple(path[1:])
    if path[0] == "self":
        return here + tuple(path[1:])
    if path[0] == "super":
        cur = here
        while path and path[0] == "super":
            cur = cur[:-1]
            path = path[1:]
        return cur + tuple(path)
    if here + (path[0],) in mods:  # a child module
        return here + tuple(path)
    return None


def edges(mods):
    out = {}
    for here, file in mods.items():
        is_dir = file.endswith("mod.rs") or file.endswith("lib.rs") or file.endswith("main.rs")
        for p in use_paths(strip(open(file, encoding="utf-8").read())):
            target = resolve(here, is_dir, p, mods)
            if target is None:
                continue
            n = 0
            while n < len(here) and n < len(target) and here[n] == target[n]:
                n += 1
            if n >= len(here) or n >= len(target):
                continue  # parent <-> child: not an edge between siblings
            scope = here[:n]
            a, b = here[n], target[n]
            if scope + (b,) not in mods:
                continue  # an item of the parent, not a sibling module
            out.setdefault(scope, {}).setdefault(a, set()).add(b)
    return out


def cycles(graph):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def crates(args):
    if args:
        return [os.path.abspath(a) for a in args]
    out = []
    for dirpath, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in ("target", ".git", "tests", "examples")]
        if "Cargo.toml" in files and os.path.isdir(os.path.join(dirpath, "src")):
            out.append(dirpath)
    return sorted(out)


def main():
    args = sys.argv[1:]
    show = "--graph" in args
    args = [a for a in args if a != "--graph"]
    bad = 0
    for crate in crates(args):
        graph = edges(modules(os.path.join(crate, "src")))
        name = os.path.relpath(crate, ROOT)
        for scope, g in sorted(graph.items()):
            where = name + (":" + "::".join(scope) if scope else "")
            if show:
                for a in sorted(g):
                    print(f"{where}: {a} -> {' '.join(sorted(g[a]))}")
            for comp in cycles(g):
                if comp in KNOWN.get(where, []):
                    continue
                bad += 1
                print(f"import circle in {where}: {' <-> '.join(comp)}", file=sys.stderr)
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
