//! `shade run` and writes outside the project: listed apart, in `--diff` and `--json`, kept
//! only with `--keep-outside` (or config `[outside] keep` with an accept), refused on a
//! conflict. The layer is the runner's; these tests write one by hand from an `--unconfined`
//! command (which can reach shade's state dir) in the agreed format, so that the listing and
//! keeping are tested through the real binary whatever the runner does. HOME is a temp dir.
#![allow(clippy::unwrap_used)]

mod common;

use common::describe as out;
use common::Fixture;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

/// A fixture with a temp home holding `.bashrc` and `.gitconfig`, made "before the command".
fn home(fx: &Fixture) -> PathBuf {
    let home = fx.tmp.path().join("home");
    fs::create_dir(&home).unwrap();
    fs::write(home.join(".bashrc"), "orig\n").unwrap();
    fs::write(home.join(".gitconfig"), "[core]\n").unwrap();
    home
}

/// Nanoseconds since the epoch, a few clock ticks after every write made so far (file times
/// come from a coarse clock).
fn layer_time() -> u64 {
    std::thread::sleep(std::time::Duration::from_millis(30));
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// A shell script that writes the branch's outside layer over `home` as the runner would:
/// `.bashrc` appended to, `.gitconfig` rewritten, `.claude/state.json` new, `.profile`
/// deleted; then runs `then` (on the host: the command is unconfined).
fn script(fx: &Fixture, home: &Path, created_ns: u64, then: &str) -> String {
    format!(
        r#"set -e
d=$(ls -d {state}/branches/*/ | head -n1)outside
mkdir -p "$d/u0/upper/.claude"
printf '{{"created_ns":{created_ns},"shift":0,"userxattr":false,"units":[{{"path":"{home}","dir":"u0"}}]}}' > "$d/layer.json"
printf 'orig\nx\n' > "$d/u0/upper/.bashrc"
printf '[core]\n[user]\n\tname = evil\n' > "$d/u0/upper/.gitconfig"
printf '{{}}' > "$d/u0/upper/.claude/state.json"
mknod "$d/u0/upper/.profile" c 0 0
{then}
"#,
        state = fx.state.root().display(),
        home = home.display(),
    )
}

fn run(fx: &Fixture, home: &Path, extra: &[&str], script: &str) -> Output {
    fx.shade()
        .args(["run", "--unconfined", "--timeout", "60"])
        .args(extra)
        .args(["--", "sh", "-c", script])
        .env("HOME", home)
        .env("SHADE_CONFIG", fx.tmp.path().join("config.toml"))
        .output()
        .unwrap()
}

fn home_unchanged(home: &Path) {
    assert_eq!(fs::read_to_string(home.join(".bashrc")).unwrap(), "orig\n");
    assert_eq!(
        fs::read_to_string(home.join(".gitconfig")).unwrap(),
        "[core]\n"
    );
    assert!(!home.join(".claude").exists());
    assert!(home.join(".profile").exists());
}

#[test]
fn outside_changes_are_listed_apart_and_the_host_is_untouched() {
    let fx = Fixture::new();
    let home = home(&fx);
    fs::write(home.join(".profile"), "p\n").unwrap();
    let t = layer_time();
    let o = run(
        &fx,
        &home,
        &["--diff", "--accept"],
        &script(&fx, &home, t, "echo p > in-project"),
    );
    assert!(o.status.success(), "{}", out(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    for want in [
        "outside the project:\n",
        "  M ~/.bashrc\n",
        "  M ~/.gitconfig\n",
        "  A ~/.claude/\n",
        "  A ~/.claude/state.json\n",
        "  D ~/.profile\n",
    ] {
        assert!(err.contains(want), "missing {want:?}: {}", out(&o));
    }
    let diff = String::from_utf8_lossy(&o.stdout);
    let project_diff = diff.find("b/in-project").unwrap();
    let outside_diff = diff.find("# outside the project").unwrap();
    assert!(project_diff < outside_diff, "{diff}");
    assert!(diff.contains("+\tname = evil"), "{diff}");
    // The project was accepted, nothing outside it kept.
    assert_eq!(
        fs::read_to_string(fx.project.join("in-project")).unwrap(),
        "p\n"
    );
    home_unchanged(&home);
}

#[test]
fn json_lists_outside_changes_with_kept_flags() {
    let fx = Fixture::new();
    let home = home(&fx);
    fs::write(home.join(".profile"), "p\n").unwrap();
    let t = layer_time();
    let o = run(
        &fx,
        &home,
        &["--json", "--keep-outside", "~/.gitconfig"],
        &script(&fx, &home, t, "true"),
    );
    assert!(o.status.success(), "{}", out(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let list = v["outside"].as_array().unwrap();
    let names: Vec<(&str, &str, bool)> = list
        .iter()
        .map(|c| {
            (
                c["path"].as_str().unwrap(),
                c["kind"].as_str().unwrap(),
                c["kept"].as_bool().unwrap(),
            )
        })
        .collect();
    let h = home.display().to_string();
    let p = |n: &str| format!("{h}/{n}");
    assert_eq!(
        names,
        vec![
            (p(".bashrc").as_str(), "modified", false),
            (p(".claude").as_str(), "added", false),
            (p(".claude/state.json").as_str(), "added", false),
            (p(".gitconfig").as_str(), "modified", true),
            (p(".profile").as_str(), "deleted", false),
        ],
        "{}",
        out(&o)
    );
    assert_eq!(v["accepted"], false);
}

#[test]
fn keep_outside_keeps_exactly_the_named_path() {
    let fx = Fixture::new();
    let home = home(&fx);
    fs::write(home.join(".profile"), "p\n").unwrap();
    let t = layer_time();
    let o = run(
        &fx,
        &home,
        &[
            "--keep-outside",
            "~/.gitconfig",
            "--keep-outside",
            "~/.nothing",
        ],
        &script(&fx, &home, t, "echo p > in-project"),
    );
    assert!(o.status.success(), "{}", out(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("kept 1 path outside the project: ~/.gitconfig"),
        "{}",
        out(&o)
    );
    assert!(
        err.contains("--keep-outside ~/.nothing: the command wrote nothing there"),
        "{}",
        out(&o)
    );
    assert_eq!(
        fs::read_to_string(home.join(".gitconfig")).unwrap(),
        "[core]\n[user]\n\tname = evil\n"
    );
    assert_eq!(fs::read_to_string(home.join(".bashrc")).unwrap(), "orig\n");
    assert!(!home.join(".claude").exists() && home.join(".profile").exists());
    // --keep-outside alone does not accept the project.
    assert!(!fx.project.join("in-project").exists());
    // No scratch left in the home, no journal in the state dir.
    let scratch: Vec<_> = fs::read_dir(&home)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".shade-"))
        .collect();
    assert!(scratch.is_empty(), "{scratch:?}");
    assert_eq!(
        fs::read_dir(fx.state.journals())
            .map(|d| d.count())
            .unwrap_or(0),
        0
    );
}

#[test]
fn config_keep_list_applies_with_an_accept_only() {
    let fx = Fixture::new();
    let home = home(&fx);
    fs::write(home.join(".profile"), "p\n").unwrap();
    fs::write(
        fx.tmp.path().join("config.toml"),
        "[outside]\nkeep = [\"~/.claude\"]\n",
    )
    .unwrap();
    let t = layer_time();
    let o = run(&fx, &home, &[], &script(&fx, &home, t, "true"));
    assert!(o.status.success(), "{}", out(&o));
    assert!(!home.join(".claude").exists(), "{}", out(&o));
    let t = layer_time();
    let o = run(&fx, &home, &["--accept"], &script(&fx, &home, t, "true"));
    assert!(o.status.success(), "{}", out(&o));
    assert_eq!(
        fs::read_to_string(home.join(".claude/state.json")).unwrap(),
        "{}",
        "{}",
        out(&o)
    );
    assert_eq!(fs::read_to_string(home.join(".bashrc")).unwrap(), "orig\n");
}

#[test]
fn a_kept_path_changed_on_the_host_meanwhile_is_refused_and_nothing_is_written() {
    let fx = Fixture::new();
    let home = home(&fx);
    fs::write(home.join(".profile"), "p\n").unwrap();
    let t = layer_time();
    // The user edits ~/.gitconfig while the command runs (after the layer was made).
    let then = format!(
        "sleep 0.05; printf 'mine\\n' > {}/.gitconfig; echo p > in-project",
        home.display()
    );
    let o = run(
        &fx,
        &home,
        &[
            "--accept",
            "--keep-outside",
            "~/.gitconfig",
            "--keep-outside",
            "~/.bashrc",
        ],
        &script(&fx, &home, t, &then),
    );
    assert_eq!(o.status.code(), Some(124), "{}", out(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("~/.gitconfig: changed on the host since the command started"),
        "{}",
        out(&o)
    );
    assert_eq!(
        fs::read_to_string(home.join(".gitconfig")).unwrap(),
        "mine\n"
    );
    assert_eq!(fs::read_to_string(home.join(".bashrc")).unwrap(), "orig\n");
    assert!(
        !fx.project.join("in-project").exists(),
        "a refused keep accepts nothing"
    );
}

#[test]
fn nothing_is_kept_when_the_command_fails() {
    let fx = Fixture::new();
    let home = home(&fx);
    fs::write(home.join(".profile"), "p\n").unwrap();
    let t = layer_time();
    let o = run(
        &fx,
        &home,
        &["--keep-outside", "~"],
        &script(&fx, &home, t, "exit 3"),
    );
    assert_eq!(o.status.code(), Some(3), "{}", out(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("nothing kept outside the project"));
    home_unchanged(&home);
}

#[test]
fn a_keep_cut_short_after_its_commit_point_is_finished_by_recover() {
    let fx = Fixture::new();
    let home = home(&fx);
    fs::write(home.join(".profile"), "p\n").unwrap();
    let t = layer_time();
    // Step 7 is placing the second file (after the journal, staging, the commit, the first).
    let mut c = fx.shade();
    c.args(["run", "--unconfined", "--timeout", "60"])
        .args([
            "--keep-outside",
            "~/.bashrc",
            "--keep-outside",
            "~/.gitconfig",
        ])
        .args(["--", "sh", "-c", &script(&fx, &home, t, "true")])
        .env("HOME", &home)
        .env("SHADE_CONFIG", fx.tmp.path().join("config.toml"))
        .env("SHADE_FAULT_FAIL_AT_STEP", "7:EIO");
    let o = c.output().unwrap();
    assert_eq!(o.status.code(), Some(125), "{}", out(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("shade recover"),
        "{}",
        out(&o)
    );
    assert_eq!(
        fs::read_to_string(home.join(".bashrc")).unwrap(),
        "orig\nx\n",
        "{}",
        out(&o)
    );
    assert_eq!(
        fs::read_to_string(home.join(".gitconfig")).unwrap(),
        "[core]\n"
    );
    let r = fx
        .shade()
        .arg("recover")
        .env("HOME", &home)
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", out(&r));
    assert_eq!(
        fs::read_to_string(home.join(".gitconfig")).unwrap(),
        "[core]\n[user]\n\tname = evil\n",
        "{}",
        out(&r)
    );
    assert_eq!(
        fs::read_dir(fx.state.journals())
            .map(|d| d.count())
            .unwrap_or(0),
        0
    );
    let scratch: Vec<_> = fs::read_dir(&home)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".shade-"))
        .collect();
    assert!(scratch.is_empty(), "{scratch:?}");
    assert!(!home.join(".claude").exists());
}

/// `--review` offers the outside changes after the project's, unpicked; picking one keeps it
/// (and only it) with the picked project changes.
#[test]
fn review_offers_outside_paths_unpicked_and_keeps_the_picked_one() {
    use common::tty::Tty;
    let fx = Fixture::new();
    let home = home(&fx);
    fs::write(home.join(".profile"), "p\n").unwrap();
    let t = layer_time();
    let file = fx.tmp.path().join("cmd.sh");
    fs::write(&file, script(&fx, &home, t, "echo p > in-project")).unwrap();
    let shell = format!(
        "{} run --unconfined --timeout 60 --review -- sh {}; echo exit=$?",
        env!("CARGO_BIN_EXE_shade"),
        file.display()
    );
    let tty = Tty::start(
        &["sh", "-c", &shell],
        &fx.project,
        &[
            ("SHADE_STATE_DIR", fx.state.root().display().to_string()),
            ("HOME", home.display().to_string()),
            (
                "SHADE_CONFIG",
                fx.tmp.path().join("config.toml").display().to_string(),
            ),
        ],
    );
    let s = tty.wait_text("[ ] outside: M ~/.gitconfig", 60);
    assert!(
        s.contains("[x] A in-project") && s.contains("[ ] outside: M ~/.bashrc"),
        "{s}"
    );
    assert!(s.contains("outside the project: 0 kept of 5"), "{s}");
    // Rows: in-project, ~/.bashrc, ~/.claude, ~/.claude/state.json, ~/.gitconfig, ~/.profile.
    tty.keys(&["j", "j", "j", "j"]);
    let s = tty.wait_text("name = evil", 10);
    assert!(s.contains("> [ ] outside: M ~/.gitconfig"), "{s}");
    tty.keys(&["Space"]);
    tty.wait_text("[x] outside: M ~/.gitconfig", 10);
    tty.keys(&["Enter"]);
    tty.wait_text("exit=", 60);
    let s = tty.history();
    assert!(s.contains("exit=0"), "{s}");
    assert!(
        s.contains("kept 1 path outside the project: ~/.gitconfig"),
        "{s}"
    );
    assert_eq!(
        fs::read_to_string(home.join(".gitconfig")).unwrap(),
        "[core]\n[user]\n\tname = evil\n"
    );
    assert_eq!(fs::read_to_string(home.join(".bashrc")).unwrap(), "orig\n");
    assert!(!home.join(".claude").exists() && home.join(".profile").exists());
    assert_eq!(
        fs::read_to_string(fx.project.join("in-project")).unwrap(),
        "p\n"
    );
}

#[test]
fn a_kept_path_the_branch_gave_another_owner_is_refused() {
    let fx = Fixture::new();
    let home = home(&fx);
    fs::write(home.join(".profile"), "p\n").unwrap();
    let t = layer_time();
    let then = r#"chown 4242:4242 "$d/u0/upper/.gitconfig""#;
    let o = run(
        &fx,
        &home,
        &["--keep-outside", "~/.gitconfig"],
        &script(&fx, &home, t, then),
    );
    assert_eq!(o.status.code(), Some(124), "{}", out(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("M ~/.gitconfig (owner 0:0 -> 4242:4242)"),
        "{}",
        out(&o)
    );
    assert!(
        err.contains("owner 4242:4242, which is neither"),
        "{}",
        out(&o)
    );
    assert!(
        err.contains("nothing kept; the host is unchanged"),
        "{}",
        out(&o)
    );
    home_unchanged(&home);
}
