#![allow(clippy::unwrap_used)]

use super::journal::{JPath, Journal, Phase};
use super::safe_path::{invalid_reason, observe, Seen};
use crate::fingerprint::Base;
use std::ffi::OsStr;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

#[test]
fn path_validation() {
    for bad in [
        "",
        "/etc/passwd",
        "../x",
        "a/../b",
        "./a",
        "a/./b",
        ".shade-accept-1/x",
        "a/.shade-trash-x",
    ] {
        assert!(invalid_reason(Path::new(bad)).is_some(), "{bad:?} accepted");
    }
    for good in ["a", "a/b/c", ".git/config", "a..b", "..a"] {
        assert!(
            invalid_reason(Path::new(good)).is_none(),
            "{good:?} refused"
        );
    }
}

#[test]
fn journal_round_trips_non_utf8_paths() {
    let d = tempfile::tempdir().unwrap();
    let name = OsStr::from_bytes(b"caf\xe9\nx");
    let j = Journal {
        version: 1,
        id: "t".into(),
        root: JPath::new(Path::new(name)),
        staging: "s".into(),
        phase: Phase::Committed,
        ops: vec![],
    };
    j.store(d.path()).unwrap();
    let back = Journal::load(&d.path().join("t.json")).unwrap();
    assert_eq!(back.root.path().as_os_str(), name);
    assert_eq!(back.phase, Phase::Committed);
    j.remove(d.path()).unwrap();
    assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
}

#[test]
fn observe_never_follows_a_symlinked_parent() {
    let d = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("x"), "outside").unwrap();
    std::os::unix::fs::symlink(outside.path(), d.path().join("dir")).unwrap();
    let root = super::sys::open_dir_path(d.path()).unwrap();
    match observe(root.as_raw_fd(), Path::new("dir/x")).unwrap() {
        Seen::Blocked { at } => assert_eq!(at.mode & libc::S_IFMT, libc::S_IFLNK),
        other => panic!("followed the symlink: {other:?}"),
    }
    assert_eq!(
        observe(root.as_raw_fd(), Path::new("nope/x"))
            .unwrap()
            .base(),
        Base::Absent
    );
}
