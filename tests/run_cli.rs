//! `shade run` end to end: the real binary, a real mount, real programs.
#![allow(clippy::unwrap_used)]

mod common;

use common::describe as out;

use common::{assert_no_shade_mounts, snapshot, Fixture};
use std::fs;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

fn sh(fx: &Fixture, extra: &[&str], script: &str) -> Output {
    fx.shade()
        .arg("run")
        .args(extra)
        .args(["--", "sh", "-c", script])
        // An exported CARGO_TARGET_DIR would send a build inside the branch elsewhere.
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .unwrap()
}

#[test]
fn runs_at_the_real_path_and_drops_the_branch() {
    let fx = Fixture::new();
    fx.write("a.txt", "real\n");
    let o = sh(
        &fx,
        &[],
        "pwd; cat a.txt; echo shadow > a.txt; echo new > b.txt; rm -f gone",
    );
    assert!(o.status.success(), "{}", out(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        stdout,
        format!("{}\nreal\n", fx.project.display()),
        "{}",
        out(&o)
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("M a.txt") && stderr.contains("A b.txt"),
        "{}",
        out(&o)
    );
    assert_eq!(
        fx.read("a.txt"),
        "real\n",
        "without --accept nothing reaches the project"
    );
    assert!(!fx.project.join("b.txt").exists());
    assert_no_shade_mounts(&fx.state);
}

#[test]
fn accept_reproduces_the_tree_the_command_made() {
    let fx = Fixture::new();
    fx.write("keep.txt", "keep\n");
    fx.write("edit.txt", "old\n");
    fx.write("del.txt", "bye\n");
    fx.write("dir/inner.txt", "inner\n");
    fx.write("mv/a.txt", "a\n");
    std::os::unix::fs::symlink("keep.txt", fx.project.join("link")).unwrap();
    let script = "echo new >> edit.txt && rm del.txt && mkdir -p n/m && echo deep > n/m/f && \
                  mv mv moved && echo b > moved/b.txt && chmod 755 keep.txt && ln -sf edit.txt link && \
                  rm -r dir && mkdir dir && echo fresh > dir/other.txt";
    // The tree the command makes, as a plain copy would show it.
    let expected_dir = fx.tmp.path().join("expected");
    Command::new("cp")
        .arg("-a")
        .arg(&fx.project)
        .arg(&expected_dir)
        .status()
        .unwrap();
    let st = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(&expected_dir)
        .status()
        .unwrap();
    assert!(st.success());
    let o = sh(&fx, &["--accept"], script);
    assert!(o.status.success(), "{}", out(&o));
    assert_eq!(
        snapshot(&fx.project),
        snapshot(&expected_dir),
        "{}",
        out(&o)
    );
    assert_no_shade_mounts(&fx.state);
    assert_eq!(fs::read_dir(fx.state.branches()).unwrap().count(), 0);
    let journals = fs::read_dir(fx.state.journals())
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(journals, 0, "no journal left after a finished accept");
}

#[test]
fn json_report_and_exit_status_passthrough() {
    let fx = Fixture::new();
    let o = sh(
        &fx,
        &["--json", "--diff"],
        "echo to-stdout; echo x > f; exit 3",
    );
    assert_eq!(o.status.code(), Some(3), "{}", out(&o));
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", out(&o)));
    assert_eq!(v["exit_code"], 3);
    assert_eq!(v["accepted"], false);
    assert_eq!(v["changes"][0]["path"], "f");
    assert_eq!(v["changes"][0]["kind"], "added");
    assert!(v["diff"].as_str().unwrap().contains("+x"));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("to-stdout"),
        "command stdout goes to stderr"
    );
    // a failing command is not accepted
    let o = sh(&fx, &["--accept"], "echo x > f; false");
    assert_eq!(o.status.code(), Some(1));
    assert!(!fx.project.join("f").exists());
}

#[test]
fn conflicting_user_edit_is_detected_and_nothing_clobbered() {
    let fx = Fixture::new();
    fx.write("shared.txt", "base\n");
    fx.write("other.txt", "other\n");
    let child = fx
        .shade()
        .args([
            "run",
            "--accept",
            "--json",
            "--",
            "sh",
            "-c",
            "echo branch > shared.txt; echo b > other.txt; sleep 1.5",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    fx.write("shared.txt", "user edit\n");
    let o = child.wait_with_output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(124),
        "conflict exit status: {}",
        out(&o)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["accepted"], false);
    assert_eq!(v["conflicts"][0]["path"], "shared.txt", "{}", out(&o));
    assert_eq!(
        fx.read("shared.txt"),
        "user edit\n",
        "the user's edit survives"
    );
    assert_eq!(
        fx.read("other.txt"),
        "other\n",
        "all or nothing: no other path was written"
    );
}

#[test]
fn cargo_builds_in_a_branch_and_leaves_no_target_behind() {
    let fx = Fixture::new();
    fx.write(
        "Cargo.toml",
        "[package]\nname = \"demo\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\n",
    );
    fx.write(
        "src/main.rs",
        "fn main() { println!(\"built in a branch\"); }\n",
    );
    fx.write(".gitignore", "/target\n");
    let o = sh(
        &fx,
        &[],
        "cargo build --offline -q && ./target/debug/demo && cargo test --offline -q 2>&1 | tail -1",
    );
    assert!(o.status.success(), "{}", out(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("built in a branch"),
        "{}",
        out(&o)
    );
    assert!(
        !fx.project.join("target").exists(),
        "the build output stayed in the branch"
    );
    assert!(!fx.project.join("Cargo.lock").exists());
}

#[test]
fn timeout_kills_the_command_and_its_children() {
    let fx = Fixture::new();
    let start = std::time::Instant::now();
    let o = sh(&fx, &["--timeout", "1"], "sleep 100 & sleep 100");
    assert_eq!(o.status.code(), Some(123), "{}", out(&o));
    assert!(start.elapsed() < Duration::from_secs(20));
    assert_no_shade_mounts(&fx.state);
}

#[test]
fn bad_project_dir_is_one_clear_error() {
    let fx = Fixture::new();
    let o = fx
        .shade()
        .args(["run", "-C", "/nonexistent/project", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(125));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("/nonexistent/project"), "{err}");
    let o = fx
        .shade()
        .args(["run", "-C", "Cargo.toml-does-not-exist", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(125));
    fx.write("file", "x");
    let o = fx
        .shade()
        .args(["run", "-C"])
        .arg(fx.project.join("file"))
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(125), "{}", out(&o));
}

#[test]
fn a_killed_shade_leaves_the_tree_untouched_and_is_cleaned_up() {
    let fx = Fixture::new();
    fx.write("a.txt", "real\n");
    let mut child = fx
        .shade()
        .args([
            "run",
            "--accept",
            "--",
            "sh",
            "-c",
            "echo changed > a.txt; sleep 30",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(fx.read("a.txt"), "real\n");
    // the next start recovers: no dead mount, no store
    let o = fx.shade().arg("recover").output().unwrap();
    assert!(o.status.success(), "{}", out(&o));
    assert_no_shade_mounts(&fx.state);
    assert_eq!(
        fs::read_dir(fx.state.branches()).unwrap().count(),
        0,
        "{}",
        out(&o)
    );
    let o = sh(&fx, &[], "cat a.txt");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "real\n");
}

/// Run `cmd`, but if it has not finished after `secs`, abort every FUSE connection mounted
/// under `state` (a deadlocked FUSE server leaves its callers unkillable otherwise) and fail.
fn output_within(mut cmd: Command, secs: u64, state: &std::path::Path) -> Output {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(o) => o.unwrap(),
        Err(_) => {
            let root = state.to_string_lossy().to_string();
            let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
            for l in mounts.lines().filter(|l| l.contains(&root)) {
                let dev = l.split(' ').nth(2).unwrap_or("");
                let minor = dev.split(':').nth(1).unwrap_or("");
                let _ = fs::write(format!("/sys/fs/fuse/connections/{minor}/abort"), "1");
                if let Some(point) = l.split(' ').nth(4) {
                    let _ = Command::new("umount").args(["-l", point]).status();
                }
            }
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("{cmd:?} did not finish in {secs} s (deadlocked on its own mount?)");
        }
    }
}

/// A project that contains shade's state directory (`cd ~ && shade run …` with the default
/// `~/.local/state/shade`): the branch does not show the state directory, so a command that
/// walks the whole project finishes instead of making the FUSE server read its own mount,
/// and the command cannot create it in the branch either. A project that is the state
/// directory or inside it is refused in one line.
#[test]
fn a_project_containing_the_state_dir_hides_it() {
    let fx = Fixture::new();
    fx.write("a.txt", "a\n");
    fx.write(".local/state/other", "o\n");
    let state = fx.project.join(".local/state/shade");
    let run = |args: &[&str]| {
        let mut c = fx.shade();
        c.env("SHADE_STATE_DIR", &state).arg("run").args(args);
        output_within(c, 120, &state)
    };

    let o = run(&["--", "find", "."]);
    assert!(o.status.success(), "{}", out(&o));
    let found = String::from_utf8_lossy(&o.stdout);
    assert!(found.lines().any(|l| l == "./a.txt"), "{found}");
    assert!(
        found.lines().any(|l| l == "./.local/state/other"),
        "{found}"
    );
    assert!(!found.contains("shade"), "{found}");

    let o = run(&[
        "--",
        "sh",
        "-c",
        "ls -la . .local/state; ls .local/state/shade || echo hidden; \
         mkdir .local/state/shade || echo refused",
    ]);
    assert!(o.status.success(), "{}", out(&o));
    let listed = String::from_utf8_lossy(&o.stdout);
    assert!(
        listed.contains("other") && listed.contains("a.txt"),
        "{listed}"
    );
    assert!(!listed.contains(" shade"), "{listed}");
    assert!(
        listed.contains("hidden") && listed.contains("refused"),
        "{listed}"
    );
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("A .local"),
        "{}",
        out(&o)
    );
    assert_no_shade_mounts(&shade_fusefs::StateDir::at(state.clone()));

    for project in [state.clone(), state.join("branches")] {
        let o = run(&["-C", project.to_str().unwrap(), "--", "true"]);
        assert_eq!(o.status.code(), Some(125), "{}", out(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("inside shade's state directory"), "{err}");
    }
}

/// File names a command makes are shown as git quotes them: one that carries an escape
/// sequence and a carriage return (which printed raw erase the line and show a harmless
/// `M README.md`) and one with a newline (which printed raw splits the changeset line) come
/// out quoted, and no raw control byte reaches stderr. `--json` names a name that is not
/// UTF-8 exactly, in `path_bytes`.
#[test]
fn names_with_control_characters_are_quoted_and_json_keeps_bytes() {
    let fx = Fixture::new();
    fx.write("README.md", "r\n");
    let o = fx
        .shade()
        .args(["run", "--diff", "--", "python3", "-c"])
        .arg(
            "open('evil\\x1b[2K\\rM README.md', 'w').write('x\\n'); \
             open('new\\nline', 'w').write('y\\n')",
        )
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", out(&o));
    assert!(
        !o.stderr.iter().any(|b| *b == 0x1b || *b == b'\r'),
        "{:?}",
        String::from_utf8_lossy(&o.stderr)
    );
    let err = String::from_utf8_lossy(&o.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert!(lines.contains(&"A \"evil\\033[2K\\rM README.md\""), "{err}");
    assert!(lines.contains(&"A \"new\\nline\""), "{err}");
    assert!(!lines.contains(&"M README.md"), "{err}");
    let diff = String::from_utf8_lossy(&o.stdout);
    assert!(diff.contains("+++ \"b/new\\nline\""), "{diff}");
    assert!(!o.stdout.contains(&0x1b), "{diff}");

    let o = fx
        .shade()
        .args(["run", "--json", "--", "python3", "-c"])
        .arg("import os; open(os.fsencode('caf') + b'\\xe9\\xff', 'w').write('z')")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", out(&o));
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", out(&o)));
    let change = &v["changes"][0];
    assert_eq!(change["path"], "caf\u{fffd}\u{fffd}", "{v}");
    let bytes: Vec<u64> = change["path_bytes"]
        .as_array()
        .unwrap_or_else(|| panic!("{v}"))
        .iter()
        .map(|b| b.as_u64().unwrap())
        .collect();
    assert_eq!(bytes, [b'c', b'a', b'f', 0xe9, 0xff].map(u64::from), "{v}");
    // UTF-8 names have no `path_bytes`.
    let o = sh(&fx, &["--json"], "echo x > plain");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["changes"][0].get("path_bytes").is_none(), "{v}");
}

/// Mounts coming and going elsewhere (other branches closing) while a sandbox starts: bwrap
/// remounts every mount it binds, and one gone meanwhile fails its set-up. That is tried
/// again — for the command, and for the one-time check that a sandbox can start at all,
/// which used to take the race for "no sandbox here" and refuse (exit 125).
#[test]
fn sandbox_start_survives_mounts_coming_and_going() {
    const MOUNTS: u64 = 200;
    let fx = Fixture::new();
    let churn = fx.tmp.path().join("churn");
    fs::create_dir(&churn).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churner = {
        let (churn, stop) = (churn.clone(), stop.clone());
        std::thread::spawn(move || {
            // Many mounts present at once (bwrap's remount pass over them takes a while),
            // each in turn unmounted and mounted again.
            let mount = |d: &std::path::Path| {
                nix::mount::mount(
                    Some("tmpfs"),
                    d,
                    Some("tmpfs"),
                    nix::mount::MsFlags::empty(),
                    Some("size=64k"),
                )
            };
            let dirs: Vec<_> = (0..MOUNTS).map(|n| churn.join(format!("m{n}"))).collect();
            for d in &dirs {
                fs::create_dir(d).unwrap();
                mount(d).unwrap();
            }
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                // As a branch closes: unmounted, its directory removed; then one made anew.
                let d = &dirs[(i % MOUNTS) as usize];
                let _ = nix::mount::umount2(d, nix::mount::MntFlags::MNT_DETACH);
                let _ = fs::remove_dir(d);
                let _ = fs::create_dir(d);
                let _ = mount(d);
                // A few hundred branches closing a second: far beyond a real session, with
                // room left between them for a set-up tried again to pass.
                std::thread::sleep(Duration::from_millis(2));
                i += 1;
            }
            for d in &dirs {
                let _ = nix::mount::umount2(d, nix::mount::MntFlags::MNT_DETACH);
            }
            i
        })
    };
    let mut failures = Vec::new();
    for _ in 0..30 {
        let o = sh(&fx, &[], "true");
        if !o.status.success() {
            failures.push(out(&o));
        }
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let cycles = churner.join().unwrap();
    assert!(cycles > 50, "the mounts hardly churned ({cycles} cycles)");
    assert!(
        failures.is_empty(),
        "{} of 30 runs failed while mounts churned ({cycles} cycles):\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_no_shade_mounts(&fx.state);
}
