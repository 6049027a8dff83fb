#!/usr/bin/env python3
"""Fails when modules of one crate import each other in a circle.

For every crate (a directory with Cargo.toml and src/lib.rs or src/main.rs) it reads each
module's `crate::`, `super::`, `self::` and child-module paths (comments stripped), turns
each into an edge between the two sibling modules where the paths part (`tools::shell` ->
`shadow::X` is the edge tools -> shadow under the crate root; `followup::controller` ->
`followup::telemetry::Y` is controller -> telemetry under followup), and looks for cycles
among siblings. Crate-level circles are impossible (Cargo refuses them).

It also builds the graph between files (each module's file -> the files whose items it
names, leaving out a module's own ancestors) and fails on a circle there, which the sibling
view misses when the circle passes through a child of one module and the parent of another.

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
# The same between files: a circle through files of different modules (`a/x.rs` -> `b.rs` ->
# `a/mod.rs`) is invisible among siblings when each module only reaches into the other's
# children. Keyed by crate dir; modules named by their path (`chat::commands`).
KNOWN_FILES = {
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


# Comments, (raw, byte) strings and char literals, matched left to right so that a quote
# inside one of them does not start another (`'"'`, `"it's"`).
TOKEN = re.compile(
    r"//[^\n]*|/\*.*?\*/"
    r'|b?r(#*)".*?"\1'
    r'|b?"(?:\\.|[^"\\])*"'
    r"|b?'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^'\\\n])'",
    re.S,
)


def strip(text):
    """The text with comments, strings and char literals blanked, and inline modules'
    (`mod tests { use super::*; }`) `super::` read as the file's own module."""
    text = TOKEN.sub(lambda m: " " if m.group(0).startswith("/") else '""', text)
    out, i = [], 0
    for m in re.finditer(r"\bmod\s+%s\s*\{" % IDENT, text):
        if m.start() < i:
            continue
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        body = re.sub(
            r"(?<![\w:])super::((?:super::)*)",
            lambda s: s.group(1)[len("super::") :] if s.group(1) else "self::",
            text[m.end() : j],
        )
        out += [text[i : m.end()], body]
        i = j
    out.append(text[i:])
    return "".join(out)


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


def file_edges(mods):
    """File -> the files it names items of. A path into a module's own ancestors (`super::X`,
    `crate::X` defined in lib.rs or a parent mod.rs) is not an edge: a module's parent is its
    namespace, and a parent reaching into its children is how Rust modules are built."""
    out = {}
    for here, file in mods.items():
        is_dir = file.endswith("mod.rs") or file.endswith("lib.rs") or file.endswith("main.rs")
        for p in use_paths(strip(open(file, encoding="utf-8").read())):
            target = resolve(here, is_dir, p, mods)
            if target is None:
                continue
            while target not in mods:
                target = target[:-1]
            if target != here[: len(target)]:
                out.setdefault(here, set()).add(target)
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
        files = file_edges(modules(os.path.join(crate, "src")))
        for comp in cycles(files):
            names = ["::".join(m) or "(root)" for m in comp]
            if names in KNOWN_FILES.get(name, []):
                continue
            bad += 1
            print(f"file import circle in {name}: {' <-> '.join(names)}", file=sys.stderr)
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
