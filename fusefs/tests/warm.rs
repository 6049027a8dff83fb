//! `Branch::warm_up` (issue 20) on a real mount: the background walk finishes, changes
//! nothing, records none of its listings as the branch's reads (a listing by any other
//! process is recorded: the control), leaves what commands see intact, and a branch dropped
//! in the middle of a walk unmounts cleanly.
#![allow(clippy::unwrap_used)]

use shade_fusefs::{Branch, BranchOptions, StateDir};
use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn branch(project: &Path, state: &Path) -> Branch {
    Branch::create(
        project,
        &BranchOptions {
            state: StateDir::at(state.to_path_buf()),
            memory_budget: 1 << 20,
            allow_other: false,
            threads: 2,
            ..BranchOptions::default()
        },
    )
    .unwrap()
}

fn tree(project: &Path, dirs: usize) {
    for d in 0..dirs {
        let dir = project.join(format!("d{}/e{d}", d % 7));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..5 {
            fs::write(dir.join(format!("f{f}.txt")), format!("{d} {f}\n")).unwrap();
        }
    }
    fs::create_dir_all(project.join("target/debug")).unwrap();
    fs::write(project.join("target/debug/out"), "built\n").unwrap();
    fs::write(project.join(".gitignore"), "target/\n").unwrap();
}

fn wait_warmed(b: &Branch) {
    let start = Instant::now();
    while !b.warmed() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the warm-up walk did not finish"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn warm_up_changes_nothing_and_records_no_reads() {
    let tmp = tempfile::tempdir().unwrap();
    let project = tmp.path().join("project");
    tree(&project, 200);
    let b = branch(&project, &tmp.path().join("state"));
    let m = b.mountpoint().to_path_buf();
    b.warm_up().unwrap();
    wait_warmed(&b);
    assert_eq!(b.reads_recorded(), 0, "the walk's listings are not reads");
    assert!(b.changeset(false).changes.is_empty());
    // What commands see is unchanged by the walk.
    assert_eq!(fs::read_to_string(m.join("d3/e3/f4.txt")).unwrap(), "3 4\n");
    let out = Command::new("find")
        .arg(&m)
        .arg("-type")
        .arg("f")
        .output()
        .unwrap();
    assert!(out.status.success());
    let files = String::from_utf8_lossy(&out.stdout).lines().count();
    assert_eq!(files, 200 * 5 + 2, "every file is listed");
    // The control: another process's listings are the branch's reads.
    assert!(b.reads_recorded() > 0, "a command's listings are recorded");
}

#[test]
fn a_branch_dropped_during_its_walk_unmounts() {
    let tmp = tempfile::tempdir().unwrap();
    let project = tmp.path().join("project");
    tree(&project, 2000);
    let b = branch(&project, &tmp.path().join("state"));
    let m = b.mountpoint().to_path_buf();
    b.warm_up().unwrap();
    drop(b);
    // The connection may wait in the pool of warm connections: emptied, it unmounts too
    // (the walk holds nothing of it).
    shade_fusefs::drain_branch_pool();
    let mounts = fs::read_to_string("/proc/mounts").unwrap();
    assert!(
        !mounts.contains(m.to_str().unwrap()),
        "{} still mounted",
        m.display()
    );
}
