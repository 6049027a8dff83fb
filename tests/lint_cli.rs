//! `shade lint` end to end: the real binary, real branches, real checkers (cargo on a
//! crate with a registry dependency, ruff, the `ruff server` language server).
#![allow(clippy::unwrap_used)]

mod common;

use common::describe as out;

use common::cmd::run_with_input;
use common::{assert_no_shade_mounts, snapshot, Fixture};
use std::io::Write;
use std::path::Path;
use std::process::{Output, Stdio};

/// Copy a directory tree (the example crate, without its build output).
fn copy_tree(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let name = e.file_name();
        if name == "target" {
            continue;
        }
        let dst = to.join(&name);
        if e.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&dst).unwrap();
            copy_tree(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), &dst).unwrap();
        }
    }
}

/// `shade lint` with `args`, the patch on stdin.
fn lint(fx: &Fixture, args: &[&str], patch: &str) -> Output {
    lint_idle(fx, args, patch, 30)
}

/// A config file setting the daemon's idle time, written once (concurrent callers must not
/// see it half-written).
fn config(fx: &Fixture, idle_secs: u32) -> std::path::PathBuf {
    let path = fx.tmp.path().join(format!("config-{idle_secs}.toml"));
    if !path.exists() {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, format!("[lint]\nidle_secs = {idle_secs}\n")).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }
    path
}

/// [`lint`] with the daemon's idle time (a daemon a failed test leaves behind goes away
/// soon by itself).
fn lint_idle(fx: &Fixture, args: &[&str], patch: &str, idle_secs: u32) -> Output {
    lint_config(fx, args, patch, &config(fx, idle_secs))
}

/// [`lint`] with the config file `config`.
fn lint_config(fx: &Fixture, args: &[&str], patch: &str, config: &Path) -> Output {
    let mut child = fx
        .shade()
        .arg("lint")
        .args(args)
        .env_remove("CARGO_TARGET_DIR")
        .env("SHADE_CONFIG", config)
        // Only shade's own error lines: main's branch unmount currently logs a warning
        // on every drop ("unmounting …: Invalid argument"), which is not lint's to judge.
        .env("SHADE_LOG", "error")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A shade that refuses its arguments exits without reading stdin: a broken pipe then
    // is the expected end of the write, not a failure of the test.
    if let Err(e) = child.stdin.take().unwrap().write_all(patch.as_bytes()) {
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{e}");
    }
    child.wait_with_output().unwrap()
}

/// Stop the fixture's warm daemons (any checker choice) and check nothing is left.
fn stop_daemons(fx: &Fixture, checkers: &[Option<&str>]) {
    for c in checkers {
        let mut cmd = fx.shade();
        cmd.args(["lint", "--stop"]);
        if let Some(c) = c {
            cmd.args(["--checker", c]);
        }
        let o = cmd.output().unwrap();
        assert!(o.status.success(), "{}", out(&o));
    }
    // The daemon unmounts its branch on its way out.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        if !mounts.contains(&*fx.state.root().to_string_lossy()) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_no_shade_mounts(&fx.state);
}

fn lines(o: &Output) -> Vec<String> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// The README's example: an unused variable and a type error.
const RUST_PATCH: &str = include_str!("../examples/lint-demo/edit.patch");

fn rust_fixture() -> Fixture {
    let fx = Fixture::new();
    copy_tree(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/lint-demo"),
        &fx.project,
    );
    fx
}

#[test]
fn cargo_reports_exactly_the_errors_the_patch_added() {
    let fx = rust_fixture();
    let before = snapshot(&fx.project);
    for mode in [&["--cold"][..], &[][..], &[][..]] {
        let o = lint(&fx, mode, RUST_PATCH);
        assert_eq!(o.status.code(), Some(1), "{}", out(&o));
        assert_eq!(
            lines(&o),
            [
                "src/stats.rs:5:9: warning: unused variable: `scratch` [unused_variables] (cargo)",
                "src/stats.rs:15:5: error: mismatched types [E0308] (cargo)",
            ],
            "mode {mode:?}: {}",
            out(&o)
        );
    }
    // The unedited project's result was computed once, by the first (cold) run, and
    // cached: the warm runs read it.
    let cached = baselines(&fx);
    assert_eq!(cached.len(), 1, "{cached:?}");
    // --all adds the warning the project already had, marked not new, in JSON.
    let o = lint(&fx, &["--all", "--json"], RUST_PATCH);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let error = v
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["severity"] == "error")
        .unwrap();
    assert_eq!(
        *error,
        serde_json::json!({
            "path": "src/stats.rs", "line": 15, "column": 5, "end_line": 15, "end_column": 11,
            "severity": "error", "code": "E0308", "message": "mismatched types",
            "checker": "cargo", "new": true
        }),
        "{}",
        out(&o)
    );
    let old: Vec<_> = v
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["new"] == false)
        .map(|d| (d["path"].clone(), d["line"].clone(), d["code"].clone()))
        .collect();
    assert_eq!(
        old,
        [("src/main.rs".into(), 6.into(), "unused_variables".into())],
        "{}",
        out(&o)
    );
    // No patch: the project as it is adds nothing.
    let o = lint(&fx, &[], "");
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    assert!(lines(&o).is_empty(), "{}", out(&o));
    stop_daemons(&fx, &[None]);
    assert_eq!(
        baselines(&fx),
        cached,
        "the baseline was not computed again"
    );
    // The real project was never written: no target/, no Cargo.lock change, no edit.
    assert_eq!(snapshot(&fx.project), before);
}

/// The cached baselines: (file, modification time).
fn baselines(fx: &Fixture) -> Vec<(std::ffi::OsString, std::time::SystemTime)> {
    let mut v: Vec<_> = std::fs::read_dir(fx.state.root().join("lint/baseline"))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name(), e.metadata().unwrap().modified().unwrap())
        })
        .collect();
    v.sort();
    v
}

#[test]
fn a_patch_that_does_not_apply_is_one_line_and_changes_nothing() {
    let fx = rust_fixture();
    let before = snapshot(&fx.project);
    let bad = RUST_PATCH.replace(" pub fn count_lines", " pub fn count_words");
    for mode in [&["--cold"][..], &[][..]] {
        let o = lint(&fx, mode, &bad);
        assert_eq!(o.status.code(), Some(125), "{}", out(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.lines().count(), 1, "{}", out(&o));
        assert!(
            err.starts_with("shade: patch does not apply: src/stats.rs: hunk 1"),
            "{}",
            out(&o)
        );
    }
    let o = lint(&fx, &["--cold"], "this is not a diff\n");
    assert_eq!(o.status.code(), Some(125), "{}", out(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a valid unified diff"));
    let escape = "--- a/../x\n+++ b/../x\n@@ -0,0 +1 @@\n+x\n";
    let o = lint(&fx, &["--cold"], escape);
    assert_eq!(o.status.code(), Some(125), "{}", out(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("leads outside the project"));
    // After a refused patch the warm branch still checks the next one correctly.
    let o = lint(&fx, &[], RUST_PATCH);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    assert_eq!(lines(&o).len(), 2, "{}", out(&o));
    stop_daemons(&fx, &[None]);
    assert_eq!(snapshot(&fx.project), before);
}

const PY: &str = "import os\n\n\ndef add(a, b):\n    return a + b\n";
const PY_PATCH: &str = "\
--- a/calc.py
+++ b/calc.py
@@ -1,5 +1,9 @@
 import os
+import sys
 
 
 def add(a, b):
     return a + b
+
+def total(xs):
+    return sum(xs) + missing
";

fn py_fixture() -> Fixture {
    let fx = Fixture::new();
    fx.write("calc.py", PY);
    fx.write(
        "pyproject.toml",
        "[project]\nname = \"calc\"\nversion = \"0.1\"\n",
    );
    fx
}

#[test]
fn ruff_reports_new_findings_and_not_the_old_unused_import() {
    let fx = py_fixture();
    let before = snapshot(&fx.project);
    let o = lint(&fx, &["--cold"], PY_PATCH);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    assert_eq!(
        lines(&o),
        [
            "calc.py:2:8: warning: `sys` imported but unused [F401] (ruff)",
            "calc.py:9:22: error: Undefined name `missing` [F821] (ruff)",
        ],
        "{}",
        out(&o)
    );
    // A line inserted above the old finding moves it to line 2: still not new, while the
    // same code on another name is.
    let above = "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,3 @@\n+import abc\n import os\n \n";
    let o = lint(&fx, &["--cold", "--all"], above);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    assert_eq!(
        lines(&o),
        [
            "calc.py:1:8: warning: `abc` imported but unused [F401] (ruff)",
            "calc.py:2:8: warning: `os` imported but unused [F401] (ruff)",
        ],
        "{}",
        out(&o)
    );
    let o = lint(&fx, &["--cold", "--json"], above);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 1, "{}", out(&o));
    assert_eq!(v[0]["line"], 1, "{}", out(&o));
    // A warning-only patch exits 0.
    let warn_only = "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,3 @@\n import os\n+import sys\n \n";
    let o = lint(&fx, &["--cold"], warn_only);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    assert_eq!(lines(&o).len(), 1, "{}", out(&o));
    assert_eq!(snapshot(&fx.project), before);
    assert_no_shade_mounts(&fx.state);
}

/// Pids of `ruff server` processes whose parent is `parent`.
fn servers_of(parent: u32) -> Vec<u32> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let ppid: u32 = stat
            .rsplit(')')
            .next()
            .and_then(|r| r.split_whitespace().nth(1))
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if ppid == parent && cmd.contains("server") {
            v.push(pid);
        }
    }
    v
}

/// Pid of the fixture's lint daemon (a `shade lint --serve` naming its project).
fn daemon_pid(fx: &Fixture) -> u32 {
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains("lint --serve") && cmd.contains(&*fx.project.to_string_lossy()) {
            return pid;
        }
    }
    panic!("no lint daemon for {}", fx.project.display());
}

#[test]
fn a_warm_language_server_serves_successive_edits() {
    let fx = py_fixture();
    let before = snapshot(&fx.project);
    let args = ["--checker", "ruff-server"];
    let o = lint(&fx, &args, PY_PATCH);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    assert_eq!(
        lines(&o),
        [
            "calc.py:2:8: warning: `sys` imported but unused [F401] (ruff-server)",
            "calc.py:9:22: error: Undefined name `missing` [F821] (ruff-server)",
        ],
        "{}",
        out(&o)
    );
    let daemon = daemon_pid(&fx);
    let servers = servers_of(daemon);
    assert_eq!(servers.len(), 1, "one language server under the daemon");
    // A second, different edit: the same server answers, the first edit is gone.
    let fix = "--- a/calc.py\n+++ b/calc.py\n@@ -4,2 +4,2 @@\n def add(a, b):\n-    return a + b\n+    return a + c\n";
    let o = lint(&fx, &args, fix);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    assert_eq!(
        lines(&o),
        ["calc.py:5:16: error: Undefined name `c` [F821] (ruff-server)"],
        "{}",
        out(&o)
    );
    // And an empty patch replays the unedited state: nothing new.
    let o = lint(&fx, &args, "");
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    assert_eq!(servers_of(daemon), servers, "the server was reused");
    stop_daemons(&fx, &[Some("ruff-server")]);
    assert!(servers_of(daemon).is_empty());
    assert_eq!(snapshot(&fx.project), before);
}

/// Every entry under `dir` (target/ included) with its size and modification time, in
/// nanoseconds: a build that wrote, touched or added anything changes it.
fn mtimes(dir: &Path) -> Vec<(std::path::PathBuf, u64, i128)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(std::path::PathBuf, u64, i128)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let m = e.path().symlink_metadata().unwrap();
            let t = m
                .modified()
                .unwrap()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as i128;
            let rel = e.path().strip_prefix(root).unwrap().to_path_buf();
            out.push((rel, m.len(), t));
            if m.is_dir() {
                walk(root, &e.path(), out);
            }
        }
    }
    let mut out = Vec::new();
    let m = dir.metadata().unwrap();
    out.push((
        ".".into(),
        0,
        m.modified()
            .unwrap()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i128,
    ));
    walk(dir, dir, &mut out);
    out.sort();
    out
}

#[test]
fn the_users_build_cache_reads_through_and_is_not_written() {
    let fx = rust_fixture();
    // The user has built: target/ is warm.
    let o = std::process::Command::new("cargo")
        .args(["check", "--offline", "--quiet"])
        .current_dir(&fx.project)
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", out(&o));
    assert!(fx.project.join("target/debug").is_dir());
    let before = snapshot(&fx.project);
    let times = mtimes(&fx.project);
    assert!(times.len() > 20, "a built target/: {times:?}");
    // Cold (a fresh branch) and warm (the daemon's branch, twice): the branch's cargo
    // rebuilds the edited crate and writes fingerprints, metadata and a new lock file,
    // all of it in the branch.
    for mode in [&["--cold"][..], &[][..], &[][..]] {
        let o = lint(&fx, mode, RUST_PATCH);
        assert_eq!(o.status.code(), Some(1), "{}", out(&o));
        assert_eq!(lines(&o).len(), 2, "{}", out(&o));
    }
    // As root the checker is the sandbox's unprivileged root (ids shifted by the branch),
    // which a kernel overlay of the real target/ could not give root's files to: the
    // checker wrote through the branch, and no overlay was made.
    let overlays = fx.state.root().join("lint/overlay");
    let made = std::fs::read_dir(&overlays)
        .map(|d| d.flatten().count())
        .unwrap_or(0);
    assert_eq!(made, 0, "no target/ overlay as root");
    stop_daemons(&fx, &[None]);
    assert_eq!(snapshot(&fx.project), before);
    // Not one file or directory of the project or its target/ was touched.
    assert_eq!(mtimes(&fx.project), times);
    // And the user's own build still considers itself fresh for the unedited sources.
    let o = std::process::Command::new("cargo")
        .args(["check", "--offline", "--message-format=json"])
        .current_dir(&fx.project)
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", out(&o));
    let fresh = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact")
        .all(|m| m["fresh"] == true);
    assert!(fresh, "the user's build was invalidated: {}", out(&o));
}

/// A configured command replaces the detected checker (here ruff), read in the
/// `file:line:col: severity: message [code]` format.
#[test]
fn a_configured_command_overrides_detection() {
    let fx = py_fixture();
    fx.write("calc.py", &format!("{PY}# TODO old\n"));
    fx.write(
        "todo_lint.py",
        "import pathlib\n\
         for p in sorted(pathlib.Path('.').glob('*.py')):\n\
         \x20   if p.name == 'todo_lint.py':\n\
         \x20       continue\n\
         \x20   for i, line in enumerate(p.read_text().splitlines(), 1):\n\
         \x20       for word, sev in (('TODO', 'warning'), ('FIXME', 'error')):\n\
         \x20           c = line.find(word)\n\
         \x20           if c >= 0:\n\
         \x20               print(f'{p}:{i}:{c + 1}: {sev}: {word} left [{word.lower()}]')\n",
    );
    let config = fx.tmp.path().join("command.toml");
    std::fs::write(
        &config,
        "[lint]\ncheckers = [\"command\"]\ncommand = [\"python3\", \"todo_lint.py\"]\n",
    )
    .unwrap();
    let before = snapshot(&fx.project);
    let patch =
        "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,4 @@\n import os\n+# FIXME new\n+# TODO new\n \n";
    let o = lint_config(&fx, &["--cold"], patch, &config);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    assert_eq!(
        lines(&o),
        [
            "calc.py:2:3: error: FIXME left [fixme] (command)",
            "calc.py:3:3: warning: TODO left [todo] (command)",
        ],
        "{}",
        out(&o)
    );
    // --all: the old TODO, moved from line 6 to 8, and no finding of ruff (which would
    // report the unused `os` import).
    let o = lint_config(&fx, &["--cold", "--all"], patch, &config);
    assert_eq!(
        lines(&o),
        [
            "calc.py:2:3: error: FIXME left [fixme] (command)",
            "calc.py:3:3: warning: TODO left [todo] (command)",
            "calc.py:8:3: warning: TODO left [todo] (command)",
        ],
        "{}",
        out(&o)
    );
    assert_eq!(snapshot(&fx.project), before);
    assert_no_shade_mounts(&fx.state);
}

/// `--timeout`: a checker still running then is killed, and that is shade's error (125).
#[test]
fn a_checker_past_the_timeout_is_killed_and_reported() {
    let fx = py_fixture();
    let config = fx.tmp.path().join("slow.toml");
    std::fs::write(
        &config,
        "[lint]\ncheckers = [\"command\"]\ncommand = [\"sleep\", \"1000.25\"]\n",
    )
    .unwrap();
    let before = snapshot(&fx.project);
    for mode in [&["--cold", "--timeout", "1"][..], &["--timeout", "1"][..]] {
        let o = lint_config(&fx, mode, PY_PATCH, &config);
        assert_eq!(o.status.code(), Some(125), "{}", out(&o));
        assert_eq!(
            String::from_utf8_lossy(&o.stderr),
            "shade: checker command did not finish in time\n",
            "{}",
            out(&o)
        );
        assert!(o.stdout.is_empty(), "{}", out(&o));
    }
    stop_daemons(&fx, &[None]);
    let left = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .is_ok_and(|c| c.windows(7).any(|w| w == b"1000.25"))
        })
        .count();
    assert_eq!(left, 0, "the timed-out checker is gone");
    assert_eq!(snapshot(&fx.project), before);
}

/// Pids of every lint daemon serving the fixture's project.
fn daemons(fx: &Fixture) -> Vec<u32> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains("lint --serve") && cmd.contains(&*fx.project.to_string_lossy()) {
            v.push(pid);
        }
    }
    v
}

#[test]
fn concurrent_first_calls_share_one_daemon_which_exits_when_idle() {
    let fx = py_fixture();
    let patches = [
        (
            "a + x",
            "calc.py:5:16: error: Undefined name `x` [F821] (ruff)",
        ),
        (
            "a + y",
            "calc.py:5:16: error: Undefined name `y` [F821] (ruff)",
        ),
        (
            "a + z",
            "calc.py:5:16: error: Undefined name `z` [F821] (ruff)",
        ),
    ];
    config(&fx, 2);
    std::thread::scope(|s| {
        let runs: Vec<_> = patches
            .iter()
            .map(|(new, want)| {
                let fx = &fx;
                s.spawn(move || {
                    let p = format!(
                        "--- a/calc.py\n+++ b/calc.py\n@@ -4,2 +4,2 @@\n def add(a, b):\n-    return a + b\n+    return {new}\n"
                    );
                    let o = lint_idle(fx, &[], &p, 2);
                    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
                    assert_eq!(lines(&o), [want.to_string()], "{}", out(&o));
                })
            })
            .collect();
        for r in runs {
            r.join().unwrap();
        }
    });
    // Daemons started by the losing clients found the socket taken and left at once.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while daemons(&fx).len() > 1 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(daemons(&fx).len() <= 1, "one daemon serves the project");
    // Idle for its 2 s: it unmounts its branch and exits by itself.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !daemons(&fx).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(daemons(&fx).is_empty(), "the idle daemon exited");
    assert_no_shade_mounts(&fx.state);
    assert_eq!(fx.read("calc.py"), PY);
}

/// A cargo workspace: a change in one member breaks another, and is found from the root; a
/// member alone is refused (cargo would build into the workspace's target/, outside the
/// branch); a target directory configured outside the project is moved into the branch.
#[test]
fn cargo_workspaces_are_checked_whole_and_never_build_outside_the_branch() {
    let fx = Fixture::new();
    fx.write(
        "Cargo.toml",
        "[workspace]\nmembers = [\"a\", \"b\"]\nresolver = \"2\"\n",
    );
    fx.write(
        "a/Cargo.toml",
        "[package]\nname = \"a\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
    );
    fx.write("a/src/lib.rs", "pub fn one() -> u32 {\n    1\n}\n");
    fx.write(
        "b/Cargo.toml",
        "[package]\nname = \"b\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\na = { path = \"../a\" }\n",
    );
    fx.write(
        "b/src/lib.rs",
        "pub fn two() -> u32 {\n    a::one() + 1\n}\n",
    );
    let o = std::process::Command::new("cargo")
        .args(["generate-lockfile", "--offline"])
        .current_dir(&fx.project)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", out(&o));
    let patch = "--- a/a/src/lib.rs\n+++ b/a/src/lib.rs\n@@ -1,3 +1,3 @@\n-pub fn one() -> u32 {\n+pub fn one() -> u64 {\n     1\n }\n";
    let before = snapshot(&fx.project);
    let o = lint(&fx, &["--cold"], patch);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    assert_eq!(
        lines(&o),
        ["b/src/lib.rs:2:5: error: mismatched types [E0308] (cargo)"],
        "{}",
        out(&o)
    );
    // One member alone: refused in one line, nothing built anywhere.
    let member = fx.project.join("b");
    let o = lint(&fx, &["--cold", "-C", member.to_str().unwrap()], "");
    assert_eq!(o.status.code(), Some(125), "{}", out(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{}", out(&o));
    assert!(
        err.contains("is a member of the cargo workspace at")
            && err.contains(&*fx.project.to_string_lossy()),
        "{}",
        out(&o)
    );
    assert_eq!(snapshot(&fx.project), before);
    // The user's cargo config sends build output elsewhere: the branch keeps it.
    let elsewhere = fx.tmp.path().join("elsewhere");
    fx.write(
        ".cargo/config.toml",
        &format!("[build]\ntarget-dir = \"{}\"\n", elsewhere.display()),
    );
    let before = snapshot(&fx.project);
    let o = lint(&fx, &["--cold"], patch);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    assert_eq!(lines(&o).len(), 1, "{}", out(&o));
    assert!(!elsewhere.exists(), "cargo built outside the branch");
    assert_eq!(snapshot(&fx.project), before);
    assert_no_shade_mounts(&fx.state);
}

/// Bad arguments: one line, exit 125, nothing started or changed; a daemon that cannot
/// start says why at once.
#[test]
fn bad_arguments_are_one_line_and_change_nothing() {
    let fx = py_fixture();
    let before = snapshot(&fx.project);
    let missing = fx.tmp.path().join("missing");
    let cases: [(&[&str], &str); 6] = [
        (&["--timeout=-1"], "`-1` is not a number of seconds"),
        (&["--timeout", "nan"], "`nan` is not a number of seconds"),
        (&["--timeout", "1e30"], "`1e30` is not a number of seconds"),
        (&["--bogus"], "unexpected argument '--bogus'"),
        (&["--checker", "nope"], "checker nope is unknown"),
        (
            &["-C", missing.to_str().unwrap()],
            "No such file or directory",
        ),
    ];
    for (args, want) in cases {
        let o = lint(&fx, args, PY_PATCH);
        assert_eq!(o.status.code(), Some(125), "{args:?}: {}", out(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.lines().count(), 1, "{args:?}: {}", out(&o));
        assert!(
            err.starts_with("shade: ") && err.contains(want),
            "{args:?}: {}",
            out(&o)
        );
        assert!(o.stdout.is_empty(), "{args:?}: {}", out(&o));
    }
    assert!(daemons(&fx).is_empty(), "a daemon was left behind");
    assert_no_shade_mounts(&fx.state);
    assert_eq!(snapshot(&fx.project), before);
}

/// `shade lint --stop` returns once the daemon is gone, so the next call starts a new one
/// (and is not turned away by the old one still unmounting its branch).
#[test]
fn stop_returns_when_the_daemon_is_gone() {
    let fx = py_fixture();
    let patch = "--- a/calc.py\n+++ b/calc.py\n@@ -4,2 +4,2 @@\n def add(a, b):\n-    return a + b\n+    return a + x\n";
    let want = ["calc.py:5:16: error: Undefined name `x` [F821] (ruff)"];
    for _ in 0..3 {
        let o = lint(&fx, &[], patch);
        assert_eq!(o.status.code(), Some(1), "{}", out(&o));
        assert_eq!(lines(&o), want, "{}", out(&o));
        let o = fx
            .shade()
            .args(["lint", "--stop"])
            .env("SHADE_LOG", "error")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", out(&o));
        assert!(
            daemons(&fx).is_empty(),
            "the daemon is gone when --stop returns"
        );
        assert_no_shade_mounts(&fx.state);
    }
}

#[test]
fn compile_commands_are_checked_with_syntax_only_compiles() {
    let fx = Fixture::new();
    let src = "#include <stdio.h>\nint main(void) {\n    int unused_old;\n    printf(\"hi\\n\");\n    return 0;\n}\n";
    fx.write("a.c", src);
    fx.write(
        "compile_commands.json",
        &format!(
            r#"[{{"directory":"{}","file":"a.c","arguments":["gcc","-Wall","-c","-o","a.o","a.c"]}}]"#,
            fx.project.display()
        ),
    );
    let before = snapshot(&fx.project);
    let patch = "--- a/a.c\n+++ b/a.c\n@@ -3,4 +3,5 @@\n     int unused_old;\n     printf(\"hi\\n\");\n-    return 0;\n+    int fresh;\n+    return nope;\n }\n";
    let o = run_with_input(
        fx.shade()
            .args(["lint", "--cold"])
            .env("LC_ALL", "C")
            .env("SHADE_LOG", "error")
            .env("SHADE_CONFIG", fx.tmp.path().join("none.toml")),
        patch.as_bytes(),
    );
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    let got = lines(&o);
    assert!(
        got.contains(
            &"a.c:5:9: warning: unused variable 'fresh' [unused-variable] (cc)".to_string()
        ) && got.contains(
            &"a.c:6:12: error: 'nope' undeclared (first use in this function) (cc)".to_string()
        ) && !got.iter().any(|l| l.contains("unused_old")),
        "{}",
        out(&o)
    );
    // gcc's -o a.o was dropped: nothing written, not even in the branch's view of the project.
    assert_eq!(snapshot(&fx.project), before);
    assert_no_shade_mounts(&fx.state);
}

/// A line-based checker for the served tests: `FIXME` is an error.
const FIXME_LINT: &str = "import pathlib\n\
for p in sorted(pathlib.Path('.').glob('*.py')):\n\
\x20   for i, line in enumerate(p.read_text().splitlines(), 1):\n\
\x20       c = line.find('FIXME')\n\
\x20       if c >= 0 and p.name != 'fixme_lint.py':\n\
\x20           print(f'{p}:{i}:{c + 1}: error: FIXME left [fixme]')\n";

/// `shade lint` with the branch server on (the fixture turns it off), its client's debug
/// lines on stderr.
fn served_lint(fx: &Fixture, plain: bool, args: &[&str], patch: &str, config: &Path) -> Output {
    let mut child = as_user(fx, plain)
        .arg("lint")
        .args(args)
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("SHADE_BRANCH_SERVER")
        .env("SHADE_CONFIG", config)
        .env("SHADE_LOG", "shade_fusefs::served=debug")
        .env("NO_COLOR", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(patch.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// `fx.shade()`, as the plain test user when `plain` (same environment and directory).
fn as_user(fx: &Fixture, plain: bool) -> std::process::Command {
    let c = fx.shade();
    if !plain {
        return c;
    }
    let argv = common::plain::argv(env!("CARGO_BIN_EXE_shade"));
    let mut out = std::process::Command::new(&argv[0]);
    out.args(&argv[1..]);
    for (k, v) in c.get_envs() {
        match v {
            Some(v) => out.env(k, v),
            None => out.env_remove(k),
        };
    }
    if let Some(d) = c.get_current_dir() {
        out.current_dir(d);
    }
    out
}

/// Text without terminal escapes.
fn no_escapes(s: &[u8]) -> String {
    let s = String::from_utf8_lossy(s);
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The served-branch debug line of `text`, if any.
fn served_line(text: &str) -> Option<String> {
    text.lines()
        .find(|l| l.contains("branch served by the branch server"))
        .map(str::to_string)
}

/// `shade lint` gets its branches from the project's branch server (issue 31), like `shade
/// run`: a cold check's branch is served, a later cold check gets the same warm connection
/// back (reset: the earlier patch is not in it), and the warm daemon's branch is served
/// too; the diagnostics are the same as in-process, the project is untouched, and nothing
/// is left mounted once the daemon and the server are gone. Fails where lint makes its
/// branches in-process. Run in a private mount namespace (`unshare -m --propagation
/// private`): elsewhere other sessions' sandboxes hold copies of the mounts and reuse is
/// (rightly) refused.
#[test]
fn lint_branches_are_served_by_the_branch_server() {
    lint_served(false);
}

/// The same as the plain test user, with a server of its own.
#[test]
fn lint_branches_are_served_by_the_branch_server_plain_user() {
    lint_served(true);
}

fn lint_served(plain: bool) {
    let fx = py_fixture();
    fx.write("fixme_lint.py", FIXME_LINT);
    if plain {
        common::plain::require_fuse();
        std::fs::create_dir_all(fx.state.root()).unwrap();
        common::plain::chown_tree(fx.tmp.path());
    }
    let config = fx.tmp.path().join("fixme.toml");
    std::fs::write(
        &config,
        "[lint]\nidle_secs = 30\ncheckers = [\"command\"]\ncommand = [\"python3\", \"fixme_lint.py\"]\n",
    )
    .unwrap();
    let before = snapshot(&fx.project);
    let patch = "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,3 @@\n import os\n+# FIXME new\n \n";
    let want = ["calc.py:2:3: error: FIXME left [fixme] (command)"];
    let o = served_lint(&fx, plain, &["--cold"], patch, &config);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    assert_eq!(lines(&o), want, "{}", out(&o));
    let first = served_line(&no_escapes(&o.stderr))
        .unwrap_or_else(|| panic!("the cold check's branch was not served:\n{}", out(&o)));
    assert!(first.contains("reused_connection=false"), "{first}");
    // The next cold check gets the connection back, reset (reuse may be refused for an
    // instant while the first check's sandbox is still going away: a few tries).
    let mut seen = Vec::new();
    let reused = (0..8).any(|_| {
        // No patch: the earlier one's line must not show in the reused branch.
        let o = served_lint(&fx, plain, &["--cold", "--all"], "", &config);
        assert_eq!(o.status.code(), Some(0), "{}", out(&o));
        assert!(lines(&o).is_empty(), "{}", out(&o));
        let line = served_line(&no_escapes(&o.stderr)).unwrap_or_default();
        seen.push(no_escapes(&o.stderr));
        std::thread::sleep(std::time::Duration::from_millis(300));
        line.contains("reused_connection=true")
    });
    assert!(reused, "no cold check reused a connection: {seen:#?}");
    // The warm daemon's session branch: served as well (its log is the daemon's stderr).
    let o = served_lint(&fx, plain, &[], patch, &config);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    assert_eq!(lines(&o), want, "{}", out(&o));
    let log = std::fs::read_to_string(fx.state.root().join("lint/daemon.log")).unwrap();
    assert!(
        served_line(&no_escapes(log.as_bytes())).is_some(),
        "the daemon's branch was not served:\n{log}"
    );
    let o = as_user(&fx, plain)
        .args(["lint", "--stop"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", out(&o));
    // The server's pooled connections go with it.
    assert_no_shade_mounts(&fx.state);
    assert_eq!(snapshot(&fx.project), before);
}
