//! Accept failures tell the truth and never cost the user an edit (issue 19): a full file
//! system mid-accept, a directory swapped for a symlink while accept runs, a failure after
//! the commit point — each followed by a user edit and a later, unrelated shade command that
//! recovers journals. The real binary, real mounts; the fault-injection hooks of the accept
//! engine (`SHADE_FAULT_*_AT_STEP`) place a concurrent change or a failure at an exact step.
#![allow(clippy::unwrap_used)]

mod common;

use common::describe as text;

use common::Fixture;
use std::path::{Path, PathBuf};
use std::process::Output;

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Names at the project root that belong to accept itself.
fn scratch(root: &Path) -> Vec<String> {
    std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".shade-"))
        .collect()
}

fn journals(fx: &Fixture) -> usize {
    std::fs::read_dir(fx.state.journals())
        .map(|d| d.count())
        .unwrap_or(0)
}

/// A later, unrelated shade command (in another directory): it recovers journals first.
fn unrelated_run(fx: &Fixture) -> Output {
    let elsewhere = fx.tmp.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    fx.shade()
        .current_dir(&elsewhere)
        .args(["run", "--", "true"])
        .output()
        .unwrap()
}

struct Tmpfs(PathBuf);

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

#[test]
fn out_of_inodes_mid_accept_leaves_the_project_unchanged_and_the_users_next_edit_kept() {
    let fx = Fixture::new();
    // The project is a file system with 12 inodes: room for the branch's new files, not
    // for them and their directories at once.
    nix::mount::mount(
        Some("tmpfs"),
        &fx.project,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("nr_inodes=12,size=4m"),
    )
    .unwrap();
    let _umount = Tmpfs(fx.project.clone());
    fx.write("file", "old\n");
    let o = fx
        .shade()
        .args(["run", "--accept", "--", "sh", "-c"])
        .arg("echo new > file; for d in d1 d2 d3 d4 d5 d6; do mkdir $d; echo x > $d/x; done")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(125), "{}", text(&o));
    assert!(err(&o).contains("the project is unchanged"), "{}", text(&o));
    // What it said is true: nothing of the branch, nothing of accept's own.
    let names: Vec<String> = std::fs::read_dir(&fx.project)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["file".to_string()], "{}", text(&o));
    assert_eq!(fx.read("file"), "old\n");
    assert_eq!(journals(&fx), 0, "a journal was left");
    // Told nothing changed, the user edits; a later shade command must not undo that.
    fx.write("file", "USER EDIT\n");
    let later = unrelated_run(&fx);
    assert_eq!(later.status.code(), Some(0), "{}", text(&later));
    assert_eq!(fx.read("file"), "USER EDIT\n", "{}", text(&later));
}

/// The project for the two tests below: `d1/a` and `top`, both changed by the branch.
fn two_file_project() -> Fixture {
    let fx = Fixture::new();
    fx.write("d1/a", "old a\n");
    fx.write("top", "old top\n");
    fx
}

const BRANCH: &str = "echo 'new a' > d1/a; echo 'new top' > top";

// Steps of that accept (`accept/fault.rs`): 1 journal, 2 staging dir, 3-4 stage the two
// files, 5 commit, 6 place d1/a, 7 place top.

#[test]
fn a_directory_swapped_for_a_symlink_during_accept_is_left_alone_and_reported() {
    let fx = two_file_project();
    let o = fx
        .shade()
        .args(["run", "--accept", "--", "sh", "-c", BRANCH])
        // The user swaps d1 for a symlink after the conflict check, at the commit point.
        .env(
            "SHADE_FAULT_RUN_AT_STEP",
            "5:mv d1 d1.real && ln -s d1.real d1",
        )
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(125), "{}", text(&o));
    let e = err(&o);
    assert!(
        e.contains("accepted all but 1 of 2 changes"),
        "{}",
        text(&o)
    );
    assert!(
        e.contains("d1/a: a parent directory was replaced"),
        "{}",
        text(&o)
    );
    assert!(!e.contains("unchanged"), "{}", text(&o));
    // Exactly what it said: top is new, d1 is the user's symlink, its file untouched, and
    // the branch's version of d1/a kept where the message says.
    assert_eq!(fx.read("top"), "new top\n");
    assert!(std::fs::symlink_metadata(fx.project.join("d1"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(fx.read("d1.real/a"), "old a\n");
    let kept = scratch(&fx.project);
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert!(kept[0].starts_with(".shade-rescued-"), "{kept:?}");
    let rescued = fx.project.join(&kept[0]);
    let contents: Vec<String> = std::fs::read_dir(&rescued)
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect();
    assert_eq!(contents, vec!["new a\n".to_string()]);
    assert!(e.contains(&rescued.display().to_string()), "{}", text(&o));
    assert_eq!(journals(&fx), 0);
    // The user goes on editing; a later shade command leaves everything as it is.
    fx.write("d1.real/a", "USER EDIT a\n");
    fx.write("top", "USER EDIT top\n");
    let later = unrelated_run(&fx);
    assert_eq!(later.status.code(), Some(0), "{}", text(&later));
    assert_eq!(fx.read("d1.real/a"), "USER EDIT a\n");
    assert_eq!(fx.read("top"), "USER EDIT top\n");
}

#[test]
fn a_failure_after_the_commit_point_says_so_and_recovery_keeps_the_users_newer_edit() {
    for errno in ["ENOSPC", "EDQUOT", "EMFILE", "EIO"] {
        let fx = two_file_project();
        let o = fx
            .shade()
            .args(["run", "--accept", "--", "sh", "-c", BRANCH])
            .env("SHADE_FAULT_FAIL_AT_STEP", format!("7:{errno}"))
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(125), "{errno}: {}", text(&o));
        let e = err(&o);
        assert!(
            e.contains("accept not finished: 1 of 2 steps were applied"),
            "{errno}: {}",
            text(&o)
        );
        assert!(e.contains("shade recover"), "{errno}: {}", text(&o));
        assert!(!e.contains("unchanged"), "{errno}: {}", text(&o));
        // True: d1/a is new, top still old, the journal kept.
        assert_eq!(fx.read("d1/a"), "new a\n");
        assert_eq!(fx.read("top"), "old top\n");
        assert_eq!(journals(&fx), 1);
        // The user edits top before anything finishes the accept; a later, unrelated shade
        // command finishes it without overwriting that edit, and says what it left out.
        fx.write("top", "USER EDIT\n");
        let later = unrelated_run(&fx);
        assert_eq!(later.status.code(), Some(0), "{}", text(&later));
        let le = err(&later);
        assert!(
            le.contains("finished an interrupted accept"),
            "{}",
            text(&later)
        );
        assert!(le.contains("left out (changed since)"), "{}", text(&later));
        assert!(le.contains("top: a file changed since"), "{}", text(&later));
        assert_eq!(fx.read("top"), "USER EDIT\n");
        assert_eq!(fx.read("d1/a"), "new a\n");
        assert_eq!(journals(&fx), 0);
        let kept = scratch(&fx.project);
        assert_eq!(kept.len(), 1, "{kept:?}");
        assert!(kept[0].starts_with(".shade-rescued-"), "{kept:?}");
    }
}

#[test]
fn a_journal_whose_project_vanished_is_dropped_once_and_recover_can_drop_any() {
    let fx = two_file_project();
    let o = fx
        .shade()
        .args(["run", "--accept", "--", "sh", "-c", BRANCH])
        .env("SHADE_FAULT_FAIL_AT_STEP", "7:EIO")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(125), "{}", text(&o));
    assert_eq!(journals(&fx), 1);
    // `shade recover --drop ID` gives up on a journal.
    let id = std::fs::read_dir(fx.state.journals())
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .file_name()
        .to_string_lossy()
        .trim_end_matches(".json")
        .to_string();
    let copy = fx.tmp.path().join("journal.json");
    std::fs::copy(fx.state.journals().join(format!("{id}.json")), &copy).unwrap();
    let d = fx
        .shade()
        .args(["recover", "--drop", &id])
        .output()
        .unwrap();
    assert_eq!(d.status.code(), Some(0), "{}", text(&d));
    assert_eq!(journals(&fx), 0);
    // A journal whose project is gone is dropped by the next start, said in one line, and
    // never mentioned again.
    std::fs::copy(&copy, fx.state.journals().join(format!("{id}.json"))).unwrap();
    std::fs::remove_dir_all(&fx.project).unwrap();
    let first = unrelated_run(&fx);
    assert_eq!(first.status.code(), Some(0), "{}", text(&first));
    assert!(
        err(&first).contains("which no longer exists"),
        "{}",
        text(&first)
    );
    assert_eq!(journals(&fx), 0);
    let second = unrelated_run(&fx);
    assert!(err(&second).is_empty(), "{}", text(&second));
}
