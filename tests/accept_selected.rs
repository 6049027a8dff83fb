//! Accepting part of a branch (`shade run --review` picks files): the picked changes land in
//! the real project, the rest do not, and what comes only together (a directory and the files
//! in it, a rename's two sides, a removed directory and its entries) stays together.
#![allow(clippy::unwrap_used)]

mod common;

use common::Fixture;
use shade_fusefs::{AcceptError, AcceptFlags, Branch, Selection};
use std::fs;
use std::path::Path;

fn lines(sel: &Selection) -> Vec<String> {
    sel.changes().iter().map(|c| c.to_string()).collect()
}

fn index(sel: &Selection, line: &str) -> usize {
    lines(sel)
        .iter()
        .position(|l| l == line)
        .unwrap_or_else(|| panic!("no change {line:?} in {:?}", lines(sel)))
}

fn picked(sel: &Selection) -> Vec<String> {
    lines(sel)
        .into_iter()
        .enumerate()
        .filter(|(i, _)| sel.is_picked(*i))
        .map(|(_, l)| l)
        .collect()
}

fn selection(b: &Branch) -> Selection {
    b.selection(b.changeset(false))
}

fn exists(fx: &Fixture, rel: &str) -> bool {
    fx.project.join(rel).symlink_metadata().is_ok()
}

#[test]
fn picked_files_land_and_the_rest_do_not() {
    let fx = Fixture::new();
    fx.write("b", "old b\n");
    fx.write("c", "c\n");
    let b = fx.branch();
    let m = b.mountpoint().to_path_buf();
    fs::write(m.join("a"), "new\n").unwrap();
    fs::write(m.join("b"), "changed\n").unwrap();
    fs::remove_file(m.join("c")).unwrap();
    fs::create_dir_all(m.join("n/deep")).unwrap();
    fs::write(m.join("n/deep/x"), "x\n").unwrap();
    fs::write(m.join("n/y"), "y\n").unwrap();
    let mut sel = selection(&b);
    assert_eq!(
        lines(&sel),
        ["A a", "M b", "D c", "A n/deep/x", "A n/y"],
        "a new directory holding files is not listed itself"
    );
    assert!(sel.set(index(&sel, "M b"), false).is_empty());
    assert!(sel.set(index(&sel, "A n/y"), false).is_empty());
    assert_eq!(picked(&sel), ["A a", "D c", "A n/deep/x"]);
    let report = b.accept_selected(AcceptFlags::default(), &sel).unwrap();
    assert_eq!(report.written, 2, "{report:?}");
    assert_eq!(fx.read("a"), "new\n");
    assert_eq!(fx.read("b"), "old b\n", "an unpicked edit is dropped");
    assert!(!exists(&fx, "c"), "a picked deletion is done");
    assert_eq!(
        fx.read("n/deep/x"),
        "x\n",
        "a picked file brings its new directories"
    );
    assert!(!exists(&fx, "n/y"), "its unpicked neighbour does not come");
}

#[test]
fn a_moved_directory_and_what_changed_inside_it() {
    let fx = Fixture::new();
    fx.write("src/lib.rs", "lib\n");
    fx.write("src/main.rs", "main\n");
    let b = fx.branch();
    let m = b.mountpoint().to_path_buf();
    fs::rename(m.join("src"), m.join("code")).unwrap();
    fs::write(m.join("code/lib.rs"), "lib v2\n").unwrap();
    let mut sel = selection(&b);
    assert_eq!(lines(&sel), ["R src/ -> code/", "M code/lib.rs"]);
    let (r, edit) = (index(&sel, "R src/ -> code/"), index(&sel, "M code/lib.rs"));
    assert_eq!(sel.needs(edit), [r]);
    // Dropping the move drops the edit inside it; picking the edit brings the move back.
    assert_eq!(sel.set(r, false), [edit]);
    assert_eq!(sel.picked_count(), 0);
    assert_eq!(sel.set(edit, true), [r]);
    // The move alone: the tree moves, the file keeps its old content.
    sel.set(edit, false);
    assert_eq!(picked(&sel), ["R src/ -> code/"]);
    b.accept_selected(AcceptFlags::default(), &sel).unwrap();
    assert!(!exists(&fx, "src"));
    assert_eq!(fx.read("code/lib.rs"), "lib\n");
    assert_eq!(fx.read("code/main.rs"), "main\n");
}

#[test]
fn a_rename_carries_both_sides() {
    let fx = Fixture::new();
    fx.write("old.txt", "text\n");
    fx.write("keep", "k\n");
    let b = fx.branch();
    let m = b.mountpoint().to_path_buf();
    fs::rename(m.join("old.txt"), m.join("new.txt")).unwrap();
    fs::write(m.join("keep"), "k2\n").unwrap();
    let mut sel = selection(&b);
    assert_eq!(lines(&sel), ["M keep", "R old.txt -> new.txt"]);
    sel.set(index(&sel, "M keep"), false);
    b.accept_selected(AcceptFlags::default(), &sel).unwrap();
    assert!(!exists(&fx, "old.txt"), "the source goes with the rename");
    assert_eq!(fx.read("new.txt"), "text\n");
    assert_eq!(fx.read("keep"), "k\n");
}

#[test]
fn a_deleted_directory_is_one_change() {
    let fx = Fixture::new();
    fx.write("d/one", "1\n");
    fx.write("d/sub/two", "2\n");
    fx.write("x/f", "f\n");
    fx.write("x/g", "g\n");
    let b = fx.branch();
    let m = b.mountpoint().to_path_buf();
    fs::remove_dir_all(m.join("d")).unwrap();
    // A file moved out of a directory that is then deleted: a new file and a deletion.
    fs::rename(m.join("x/f"), m.join("f")).unwrap();
    fs::remove_dir_all(m.join("x")).unwrap();
    let mut sel = selection(&b);
    assert_eq!(lines(&sel), ["D d/", "A f", "D x/"]);
    assert!(sel.set(index(&sel, "D d/"), false).is_empty());
    b.accept_selected(AcceptFlags::default(), &sel).unwrap();
    assert_eq!(fx.read("d/one"), "1\n");
    assert_eq!(fx.read("d/sub/two"), "2\n");
    assert_eq!(fx.read("f"), "f\n");
    assert!(!exists(&fx, "x"));
}

#[test]
fn a_directory_removed_and_made_again_is_one_piece() {
    let fx = Fixture::new();
    fx.write("r/old1", "1\n");
    fx.write("r/old2", "2\n");
    fx.write("other", "o\n");
    let b = fx.branch();
    let m = b.mountpoint().to_path_buf();
    fs::remove_dir_all(m.join("r")).unwrap();
    fs::create_dir(m.join("r")).unwrap();
    fs::write(m.join("r/new"), "n\n").unwrap();
    fs::write(m.join("other"), "o2\n").unwrap();
    let mut sel = selection(&b);
    let all = lines(&sel);
    assert!(all.contains(&"D r/old1".to_string()), "{all:?}");
    let new = index(&sel, "A r/new");
    let gone = sel.set(new, false);
    assert_eq!(picked(&sel), ["M other"], "{all:?}: {gone:?}");
    sel.set(index(&sel, "D r/old2"), true);
    assert_eq!(sel.picked_count(), all.len(), "one piece comes back whole");
    sel.set(index(&sel, "M other"), false);
    b.accept_selected(AcceptFlags::default(), &sel).unwrap();
    assert!(!exists(&fx, "r/old1") && !exists(&fx, "r/old2"));
    assert_eq!(fx.read("r/new"), "n\n");
    assert_eq!(fx.read("other"), "o\n");
}

#[test]
fn only_picked_paths_are_checked_for_conflicts() {
    let fx = Fixture::new();
    fx.write("mine", "1\n");
    fx.write("theirs", "1\n");
    let b = fx.branch();
    let m = b.mountpoint().to_path_buf();
    fs::write(m.join("mine"), "2\n").unwrap();
    fs::write(m.join("theirs"), "2\n").unwrap();
    // The user edits one of them in the real project meanwhile.
    fs::write(fx.project.join("theirs"), "user\n").unwrap();
    let mut sel = selection(&b);
    match b.check_accept_selected(AcceptFlags::default(), &sel) {
        Err(AcceptError::Conflicts(list)) => {
            assert_eq!(list.len(), 1);
            assert_eq!(list[0].path, Path::new("theirs"));
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    sel.set(index(&sel, "M theirs"), false);
    b.check_accept_selected(AcceptFlags::default(), &sel)
        .unwrap();
    b.accept_selected(AcceptFlags::default(), &sel).unwrap();
    assert_eq!(fx.read("mine"), "2\n");
    assert_eq!(fx.read("theirs"), "user\n");
}

#[test]
fn a_file_turned_into_a_directory_comes_with_what_is_in_it() {
    let fx = Fixture::new();
    fx.write("f", "file\n");
    fx.write("d/inner", "i\n");
    let b = fx.branch();
    let m = b.mountpoint().to_path_buf();
    fs::remove_file(m.join("f")).unwrap();
    fs::create_dir(m.join("f")).unwrap();
    fs::write(m.join("f/x"), "x\n").unwrap();
    fs::remove_dir_all(m.join("d")).unwrap();
    fs::write(m.join("d"), "now a file\n").unwrap();
    let mut sel = selection(&b);
    let all = lines(&sel);
    let (dir, x) = (index(&sel, "M f/"), index(&sel, "A f/x"));
    assert_eq!(sel.needs(x), [dir], "{all:?}");
    assert_eq!(sel.set(dir, false), [x]);
    assert_eq!(sel.set(x, true), [dir]);
    // The directory turned into a file alone.
    sel.set(dir, false);
    assert_eq!(picked(&sel), ["M d"], "{all:?}");
    b.accept_selected(AcceptFlags::default(), &sel).unwrap();
    assert_eq!(fx.read("d"), "now a file\n");
    assert_eq!(fx.read("f"), "file\n");
}

#[test]
fn one_name_of_a_hard_link_is_written_as_a_file() {
    let fx = Fixture::new();
    let b = fx.branch();
    let m = b.mountpoint().to_path_buf();
    fs::write(m.join("x"), "shared\n").unwrap();
    fs::hard_link(m.join("x"), m.join("y")).unwrap();
    let mut sel = selection(&b);
    assert_eq!(lines(&sel), ["A x", "A y"]);
    sel.set(index(&sel, "A x"), false);
    b.accept_selected(AcceptFlags::default(), &sel).unwrap();
    assert!(!exists(&fx, "x"));
    assert_eq!(fx.read("y"), "shared\n");
}

#[test]
fn reads_are_checked_against_the_picked_changes_only() {
    let fx = Fixture::new();
    fx.write("r", "input\n");
    let b = fx.branch();
    let m = b.mountpoint().to_path_buf();
    fs::write(m.join("before"), "written before reading r\n").unwrap();
    assert_eq!(fs::read_to_string(m.join("r")).unwrap(), "input\n");
    fs::write(m.join("after"), "may derive from r\n").unwrap();
    // The user changes r meanwhile: what was written after reading it may be stale.
    fs::write(fx.project.join("r"), "the user's\n").unwrap();
    let mut sel = selection(&b);
    assert_eq!(lines(&sel), ["A after", "A before"]);
    assert!(
        matches!(
            b.check_accept_selected(AcceptFlags::default(), &sel),
            Err(AcceptError::Conflicts(_))
        ),
        "the whole branch read r before writing `after`"
    );
    sel.set(index(&sel, "A after"), false);
    b.accept_selected(AcceptFlags::default(), &sel).unwrap();
    assert_eq!(fx.read("before"), "written before reading r\n");
    assert!(!exists(&fx, "after"));
    assert_eq!(fx.read("r"), "the user's\n");
}
