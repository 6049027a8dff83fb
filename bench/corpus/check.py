#!/usr/bin/env python3
"""Checks the corpus's session scripts against the real projects before they are recorded.

For each script: copy the project's pristine tree (bench/corpus/fetch.sh made it), apply the
script's patch, make it a git repository when the script says `"git": true` (one commit of
the patched tree, so `git diff` shows the session's own changes), then run every step of every
turn in order: edits and writes are applied as the agent's tools apply them (`old_string` must
occur exactly `expected_replacements` times), reads, lists, globs and greps must find what they
name, shell commands run with the network off (`unshare -n`, loopback up) and must exit with the step's
`check.exit` (default 0) and print every string in `check.output`; a grep step that is meant
to find nothing says `check.no_match`. (`check` is read by this checker only.) web_fetch / web_search are not run: they are the network boundary.
`speculation_steps` (what the model does when it speculates on an ignored suggestion) are
checked the same way on a separate copy of the tree as it was before the next turn.

Usage: bench/corpus/check.py [--keep] [--markdown FILE] [SCRIPT.json ...]
Prints a table, one row per script; exits 1 if any step failed.
"""

import argparse
import fnmatch
import glob as globmod
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = Path(os.environ.get("SHADE_CORPUS", "/var/tmp/shade-corpus"))


def load_projects():
    with open(HERE / "projects.toml", "rb") as f:
        return tomllib.load(f)["projects"]


def run(cmd, cwd, timeout=600):
    t = time.monotonic()
    p = subprocess.run(
        # A new network namespace with only loopback up, as `shade run --no-network` gives
        # (cargo fix talks to its lock server over loopback).
        ["unshare", "-n", "bash", "-c", 'ip link set lo up && exec bash -c "$0"', cmd],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=timeout,
    )
    return p.returncode, p.stdout.decode(errors="replace"), time.monotonic() - t


class Failure(Exception):
    pass


def resolve(root, path):
    p = (root / (path or ".")).resolve()
    if root.resolve() not in [p, *p.parents]:
        raise Failure(f"path outside the project: {path}")
    return p


def step_check(step, root, log):
    """Runs one step against the tree at root; raises Failure if it does not hold."""
    if "text" in step:
        return
    tool, args = step["tool"], step.get("args", {})
    if tool == "read_file":
        p = resolve(root, args["path"])
        if not p.is_file():
            raise Failure(f"read_file: no file {args['path']}")
        lines = p.read_text(errors="replace").splitlines()
        if args.get("offset", 1) > max(len(lines), 1):
            raise Failure(f"read_file: offset {args['offset']} past {len(lines)} lines")
    elif tool == "write_file":
        p = resolve(root, args["path"])
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(args["content"])
    elif tool == "edit":
        p = resolve(root, args["path"])
        old, new = args["old_string"], args["new_string"]
        if old == "":
            if p.exists():
                raise Failure(f"edit: empty old_string but {args['path']} exists")
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(new)
            return
        if not p.is_file():
            raise Failure(f"edit: no file {args['path']}")
        text = p.read_text()
        n = text.count(old)
        want = args.get("expected_replacements", 1)
        if n != want:
            raise Failure(f"edit {args['path']}: old_string occurs {n} times, expected {want}: {old[:60]!r}")
        p.write_text(text.replace(old, new))
    elif tool == "ls":
        if not resolve(root, args.get("path")).is_dir():
            raise Failure(f"ls: no directory {args.get('path')}")
    elif tool == "glob":
        base = resolve(root, args.get("path"))
        if not globmod.glob(args["pattern"], root_dir=base, recursive=True):
            raise Failure(f"glob: nothing matches {args['pattern']}")
    elif tool == "grep":
        base = resolve(root, args.get("path"))
        flags = re.I if args.get("case_insensitive") else 0
        rx = re.compile(args["pattern"], flags)
        files = [base] if base.is_file() else [
            Path(d) / f for d, ds, fs in os.walk(base)
            for f in fs
            if not any(x in Path(d).parts for x in (".git", "target", "node_modules"))
        ]
        inc = args.get("include")
        hits = 0
        for f in files:
            rel = str(f.relative_to(root))
            if inc and not (fnmatch.fnmatch(rel, inc) or fnmatch.fnmatch(f.name, inc)):
                continue
            try:
                hits += sum(1 for line in f.read_text().splitlines() if rx.search(line))
            except (UnicodeDecodeError, OSError):
                pass
        if hits == 0 and not step.get("check", {}).get("no_match"):
            raise Failure(f"grep: no match for {args['pattern']!r}")
    elif tool == "shell":
        rc, out, secs = run(args["command"], root)
        want = step.get("check", {}).get("exit", 0)
        log.append((args["command"], rc, secs, out))
        if rc != want:
            tail = "\n".join(out.splitlines()[-15:])
            raise Failure(f"shell `{args['command']}` exited {rc}, expected {want}:\n{tail}")
        for needle in step.get("check", {}).get("output", []):
            if needle not in out:
                tail = "\n".join(out.splitlines()[-15:])
                raise Failure(f"shell `{args['command']}`: output lacks {needle!r}:\n{tail}")
    elif tool in ("web_fetch", "web_search"):
        pass  # the network boundary: never run
    else:
        raise Failure(f"unknown tool {tool}")


def prepare(script, script_path, projects, work):
    if "project" not in script:
        # An inline project (the benchmark's two toy sessions): its files are in the script.
        root = work / "inline"
        for rel, text in script.get("files", {}).items():
            f = root / rel
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(text)
        for rel in script.get("executable", []):
            (root / rel).chmod(0o755)
        return root
    name = script["project"]
    if name not in projects:
        raise Failure(f"project {name} is not in projects.toml")
    src = CORPUS / "projects" / name
    if not src.is_dir():
        raise Failure(f"{src} missing: run bench/corpus/fetch.sh")
    root = work / name
    subprocess.run(["cp", "-a", str(src), str(root)], check=True)
    if script.get("patch"):
        patch = (script_path.parent / script["patch"]).resolve()
        p = subprocess.run(["patch", "-p1", "--quiet", "--forward", "-i", str(patch)], cwd=root,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if p.returncode:
            raise Failure(f"patch {script['patch']} does not apply:\n{p.stdout.decode()}")
    if script.get("git"):
        for cmd in (["git", "init", "-q", "-b", "main"],
                    ["git", "add", "-A"],
                    ["git", "-c", "user.name=corpus", "-c", "user.email=corpus@localhost",
                     "commit", "-q", "-m", "initial"]):
            subprocess.run(cmd, cwd=root, check=True)
    return root


def check_script(script_path, projects, keep):
    script = json.loads(script_path.read_text())
    work = Path(tempfile.mkdtemp(prefix="corpus-check-"))
    log = []
    row = {"name": script["name"], "project": script.get("project", "inline"), "kind": script.get("kind", ""),
           "turns": len(script["turns"]), "steps": 0, "shell": 0, "accepted": 0, "ignored": 0,
           "spec_steps": 0, "error": None, "secs": 0.0}
    t0 = time.monotonic()
    try:
        turns = script["turns"]
        users = [t["user"] for t in turns]
        if len(set(users)) != len(users):
            # The recorder's scripted model finds a turn by what the user typed.
            raise Failure("two turns have the same user input")
        root = prepare(script, script_path, projects, work)
        for i, turn in enumerate(turns):
            nxt = turns[i + 1]["user"] if i + 1 < len(turns) else None
            if nxt is not None:
                if nxt == turn["suggestion"]:
                    row["accepted"] += 1
                    if turn.get("speculation_steps"):
                        raise Failure(f"turn {i}: speculation_steps but the suggestion is accepted")
                else:
                    row["ignored"] += 1
                    spec = turn.get("speculation_steps")
                    if not spec:
                        raise Failure(f"turn {i}: suggestion ignored but no speculation_steps")
                    # The speculation starts from the tree as this turn left it: check it now,
                    # on a copy, before the next turn changes the tree.
            for j, step in enumerate(turn["steps"]):
                try:
                    step_check(step, root, log)
                except Failure as e:
                    raise Failure(f"turn {i} step {j}: {e}")
                row["steps"] += 1
            if turn["steps"] and "text" not in turn["steps"][-1]:
                raise Failure(f"turn {i}: the last step is not a final text")
            if nxt is not None and nxt != turn["suggestion"]:
                spec_root = work / "speculation"
                shutil.rmtree(spec_root, ignore_errors=True)
                subprocess.run(["cp", "-a", str(root), str(spec_root)], check=True)
                for j, step in enumerate(turn["speculation_steps"]):
                    try:
                        step_check(step, spec_root, log)
                    except Failure as e:
                        raise Failure(f"turn {i} speculation step {j}: {e}")
                    row["spec_steps"] += 1
                shutil.rmtree(spec_root, ignore_errors=True)
        row["shell"] = len(log)
    except Failure as e:
        row["error"] = str(e)
    except subprocess.TimeoutExpired as e:
        row["error"] = f"timeout: {e}"
    row["secs"] = time.monotonic() - t0
    row["commands"] = log
    if keep:
        row["work"] = str(work)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", action="store_true", help="keep the work trees")
    ap.add_argument("--markdown", help="also write the table here")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every shell command's time and exit code")
    ap.add_argument("--outputs", help="write every shell step's output to DIR/<script>.log")
    ap.add_argument("scripts", nargs="*")
    a = ap.parse_args()
    # By default the corpus: the scripts over projects.toml's projects (the two inline toy
    # sessions, with no project, are checked only when named).
    scripts = [Path(s) for s in a.scripts] or [
        p for p in sorted((HERE / "scripts").glob("*.json")) if "project" in json.loads(p.read_text())
    ]
    projects = load_projects()
    lines = ["| script | project | kind | turns | steps | shell | accepted / ignored | speculation steps | result | s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    bad = 0
    for s in scripts:
        r = check_script(s, projects, a.keep)
        ok = "ok" if r["error"] is None else "FAIL"
        bad += r["error"] is not None
        lines.append(f"| {r['name']} | {r['project']} | {r['kind']} | {r['turns']} | {r['steps']} | {r['shell']} | "
                     f"{r['accepted']} / {r['ignored']} | {r['spec_steps']} | {ok} | {r['secs']:.1f} |")
        print(lines[-1], flush=True)
        if a.verbose:
            for cmd, rc, secs, _ in r["commands"]:
                print(f"    {secs:6.1f}s exit {rc}: {cmd}")
        if a.outputs:
            Path(a.outputs).mkdir(parents=True, exist_ok=True)
            with open(Path(a.outputs) / f"{r['name']}.log", "w") as f:
                for cmd, rc, secs, out in r["commands"]:
                    f.write(f"$ {cmd}\n{out}[exit {rc}, {secs:.1f}s]\n\n")
        if r["error"]:
            print("    " + r["error"].replace("\n", "\n    "), flush=True)
        if a.keep:
            print(f"    work tree: {r['work']}")
    print("\n".join(lines))
    if a.markdown:
        Path(a.markdown).write_text("\n".join(lines) + "\n")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
