//! `shade run --review` in a real terminal (tmux) with the real binary: the changeset and a
//! diff on screen, files picked with keys, and the real project checked after each choice.
#![allow(clippy::unwrap_used)]

mod common;

use common::tty::Tty;
use common::Fixture;

const SCRIPT: &str = "echo new > a; echo changed > b; rm c";

/// A project with `b` and `c`, and `shade run --review` of [`SCRIPT`] in a terminal; the
/// shell says shade's exit status and whether the terminal is back in canonical mode.
fn start() -> (Fixture, Tty) {
    let fx = Fixture::new();
    fx.write("b", "old\n");
    fx.write("c", "c\n");
    let shell = format!(
        "{} run --review -- sh -c '{SCRIPT}'; echo exit=$?; stty -a | tr ' ' '\\n' | grep -x -- '-\\?icanon'",
        env!("CARGO_BIN_EXE_shade")
    );
    let tty = Tty::start(
        &["sh", "-c", &shell],
        &fx.project,
        &[("SHADE_STATE_DIR", fx.state.root().display().to_string())],
    );
    tty.wait_text("[x] D c", 60);
    (fx, tty)
}

/// Everything on the terminal once the shell has said shade's exit status (the scrollback
/// too: the review's alternate screen is gone by then).
fn ended(tty: &Tty) -> String {
    tty.wait_text("exit=", 60);
    tty.wait_for("the terminal mode", 10, |_| {
        tty.history().contains("icanon")
    });
    tty.history()
}

fn exists(fx: &Fixture, rel: &str) -> bool {
    fx.project.join(rel).exists()
}

fn unchanged(fx: &Fixture) {
    assert!(!exists(fx, "a"), "a was written");
    assert_eq!(fx.read("b"), "old\n");
    assert_eq!(fx.read("c"), "c\n");
}

#[test]
fn pick_files_and_accept_them() {
    let (fx, tty) = start();
    let s = tty.screen();
    assert!(
        s.contains("[x] A a") && s.contains("[x] M b") && s.contains("3 picked of 3 changes"),
        "{s}"
    );
    // The first file's diff, coloured as the chat colours diffs.
    assert!(s.contains("+new"), "{s}");
    assert!(
        tty.screen_styled().contains("\x1b[32m+new"),
        "{}",
        tty.screen_styled()
    );
    unchanged(&fx);
    tty.keys(&["j"]);
    let s = tty.wait_text("-old", 10);
    assert!(s.contains("+changed"), "b's diff under the cursor: {s}");
    tty.keys(&["Space"]);
    tty.wait_text("[ ] M b", 10);
    tty.keys(&["Enter"]);
    let s = ended(&tty);
    assert!(s.contains("exit=0"), "{s}");
    assert!(
        s.contains("shade: accepted 2 of 3 changes; 1 dropped"),
        "{s}"
    );
    assert!(s.contains("\nicanon"), "the terminal is restored: {s}");
    assert_eq!(fx.read("a"), "new\n");
    assert_eq!(fx.read("b"), "old\n", "the unpicked edit is dropped");
    assert!(!exists(&fx, "c"), "the picked deletion is done");
}

#[test]
fn drop_asks_then_leaves_the_project_unchanged() {
    let (fx, tty) = start();
    tty.keys(&["d"]);
    tty.wait_text("drop all 3 changes?", 10);
    // Any other key goes back to the review.
    tty.keys(&["n"]);
    tty.wait_text("Enter accept picked", 10);
    tty.keys(&["d"]);
    tty.wait_text("drop all 3 changes?", 10);
    tty.keys(&["y"]);
    let s = ended(&tty);
    assert!(s.contains("exit=0"), "{s}");
    assert!(
        s.contains("shade: dropped 3 changes; the project is unchanged"),
        "{s}"
    );
    unchanged(&fx);
}

#[test]
fn ctrl_c_drops_and_restores_the_terminal() {
    let (fx, tty) = start();
    tty.keys(&["C-c"]);
    let s = ended(&tty);
    assert!(s.contains("shade: dropped 3 changes"), "{s}");
    assert!(s.contains("\nicanon"), "the terminal is restored: {s}");
    unchanged(&fx);
}

#[test]
fn a_conflicting_edit_is_refused_and_nothing_written() {
    let (fx, tty) = start();
    // The user edits b in the real project while the review is open.
    fx.write("b", "user\n");
    tty.keys(&["Enter"]);
    let s = tty.wait_text("changed in the project meanwhile", 30);
    assert!(s.contains("not accepted, nothing written"), "{s}");
    assert!(s.contains("M b  ! changed in the project meanwhile"), "{s}");
    assert!(!exists(&fx, "a") && exists(&fx, "c"), "nothing written");
    assert_eq!(fx.read("b"), "user\n");
    // Dropping now ends with the conflict's status, the path named.
    tty.keys(&["d"]);
    tty.wait_text("drop all 3 changes?", 10);
    tty.keys(&["y"]);
    let s = ended(&tty);
    assert!(s.contains("exit=124"), "{s}");
    assert!(s.contains("\n  b: changed meanwhile"), "{s}");
    assert!(!exists(&fx, "a") && exists(&fx, "c"));
    assert_eq!(fx.read("b"), "user\n");
}

#[test]
fn after_a_conflict_the_rest_can_be_accepted() {
    let (fx, tty) = start();
    fx.write("b", "user\n");
    tty.keys(&["a"]);
    tty.wait_text("changed in the project meanwhile", 30);
    tty.keys(&["j", "Space"]);
    tty.wait_text("[ ] M b", 10);
    tty.keys(&["Enter"]);
    let s = ended(&tty);
    assert!(s.contains("exit=0"), "{s}");
    assert!(s.contains("shade: accepted 2 of 3 changes"), "{s}");
    assert_eq!(fx.read("a"), "new\n");
    assert_eq!(fx.read("b"), "user\n", "the user's edit stays");
    assert!(!exists(&fx, "c"));
}

#[test]
fn without_a_terminal_review_refuses_in_one_line() {
    let fx = Fixture::new();
    let out = fx
        .shade()
        .args(["run", "--review", "--", "sh", "-c", "echo ran"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert_eq!(
        err.trim(),
        "shade: --review needs a terminal (stdin and stdout); use --diff to see the changes or --accept to take them"
    );
    assert!(out.stdout.is_empty(), "the command did not run");
}

#[test]
fn page_keys_scroll_a_long_diff() {
    let fx = Fixture::new();
    let shell = format!(
        "{} run --review -- sh -c 'seq 1 200 > long'; echo exit=$?",
        env!("CARGO_BIN_EXE_shade")
    );
    let tty = Tty::start(
        &["sh", "-c", &shell],
        &fx.project,
        &[("SHADE_STATE_DIR", fx.state.root().display().to_string())],
    );
    let s = tty.wait_text("[x] A long", 60);
    assert!(s.contains("+1\n") && !s.contains("+150\n"), "{s}");
    tty.keys(&[
        "PgDn", "PgDn", "PgDn", "PgDn", "PgDn", "PgDn", "PgDn", "PgDn",
    ]);
    let s = tty.wait_text("+200", 10);
    assert!(!s.contains("+1\n"), "{s}");
    assert!(s.contains("lines 168-203 of 203"), "where the diff is: {s}");
    tty.keys(&["PgUp"]);
    tty.wait_for("scrolled back", 10, |s| !s.contains("+200"));
    tty.keys(&["q"]);
    tty.wait_text("drop all 1 change?", 10);
    tty.keys(&["y"]);
    tty.wait_text("exit=0", 60);
    assert!(!fx.project.join("long").exists());
}

#[test]
fn a_closed_terminal_drops_the_branch_and_unmounts() {
    let (fx, tty) = start();
    let branch = std::fs::read_dir(fx.state.branches())
        .unwrap()
        .next()
        .expect("the review's branch")
        .unwrap()
        .path();
    let owner = std::fs::read_to_string(branch.join("owner")).unwrap();
    let pid: u32 = owner.lines().next().unwrap().parse().unwrap();
    // The terminal goes away under the review (its window closed, ssh dropped).
    drop(tty);
    let gone = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
            .unwrap_or(true)
    };
    common::wait_until("shade to end", 30, gone);
    common::assert_no_shade_mounts(&fx.state);
    assert!(!branch.exists(), "the branch's store is left behind");
    unchanged(&fx);
}
