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
        set_aside: vec![],
        written_ns: None,
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

#[test]
fn recover_drops_a_journal_into_a_dead_branch_and_keeps_a_live_ones() {
    use super::journal::JOp;
    let d = tempfile::tempdir().unwrap();
    let state = crate::state::StateDir::at(d.path().to_path_buf());
    // A process that has exited: its pid is (almost surely) unused now.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let journal = |id: &str, owner: u32| {
        let mnt = state.branches().join(id).join("mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        std::fs::write(
            state.branches().join(id).join("owner"),
            format!("{owner}\n/project\n"),
        )
        .unwrap();
        let j = Journal {
            version: 1,
            id: format!("j{id}"),
            root: JPath::new(&mnt),
            // As accept names it (recovery refuses any other staging name).
            staging: super::journal::staging_name(&format!("j{id}")),
            phase: Phase::Committed,
            ops: vec![JOp::Place {
                n: 0,
                path: JPath::new(Path::new("f.txt")),
                symlink: false,
                pre: None,
            }],
            set_aside: vec![],
            written_ns: None,
        };
        std::fs::create_dir_all(state.journals()).unwrap();
        j.store(&state.journals()).unwrap();
        mnt
    };
    let dead_mnt = journal("dead", dead);
    let r = super::recover(&state).unwrap();
    assert_eq!(r.dropped, vec![dead_mnt.clone()]);
    assert!(r.rolled_forward.is_empty() && r.rolled_back.is_empty());
    assert_eq!(std::fs::read_dir(state.journals()).unwrap().count(), 0);
    assert_eq!(
        std::fs::read_dir(&dead_mnt).unwrap().count(),
        0,
        "nothing written"
    );
    // A branch whose process lives is an ordinary target: recovery tries to finish it (here
    // it cannot, its staging is missing) and keeps the journal.
    journal("live", std::process::id());
    assert!(super::recover(&state).is_err());
    assert_eq!(std::fs::read_dir(state.journals()).unwrap().count(), 1);
}

#[test]
fn a_zombie_owner_counts_as_dead() {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id() as i32;
    // Not reaped yet: it turns into a zombie once it has exited.
    let start = std::time::Instant::now();
    while !super::sys::zombie(pid) {
        assert!(start.elapsed().as_secs() < 30, "the child never exited");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(!super::process_alive(pid));
    assert!(super::process_alive(std::process::id() as i32));
    child.wait().unwrap();
}

#[test]
fn a_version_1_journal_is_finished_without_overwriting_what_changed_after_it() {
    use std::os::unix::fs::MetadataExt;
    let d = tempfile::tempdir().unwrap();
    let state = crate::state::StateDir::at(d.path().join("state"));
    let root = d.path().join("project");
    std::fs::create_dir_all(root.join(".shade-accept-v1")).unwrap();
    std::fs::write(root.join("kept.txt"), "old kept\n").unwrap();
    std::fs::write(root.join("edited.txt"), "old edited\n").unwrap();
    std::fs::write(root.join(".shade-accept-v1/0"), "new kept\n").unwrap();
    std::fs::write(root.join(".shade-accept-v1/1"), "new edited\n").unwrap();
    // A journal as shade wrote it before pre-states were recorded.
    let place =
        |n: usize, p: &str| serde_json::json!({"Place": {"n": n, "path": p, "symlink": false}});
    let v1 = serde_json::json!({
        "version": 1, "id": "v1", "root": root.to_str().unwrap(),
        "staging": ".shade-accept-v1", "phase": "Committed",
        "ops": [place(0, "kept.txt"), place(1, "edited.txt")],
    });
    std::fs::create_dir_all(state.journals()).unwrap();
    let jp = state.journals().join("v1.json");
    std::fs::write(&jp, serde_json::to_vec(&v1).unwrap()).unwrap();
    // The user edits one of its files after the journal was written.
    let j = std::fs::metadata(&jp).unwrap();
    loop {
        std::fs::write(root.join("edited.txt"), "USER EDIT\n").unwrap();
        let m = std::fs::metadata(root.join("edited.txt")).unwrap();
        if (m.ctime(), m.ctime_nsec()) > (j.mtime(), j.mtime_nsec()) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let r = super::recover(&state).unwrap();
    assert_eq!(r.rolled_forward.len(), 1);
    assert_eq!(
        std::fs::read_to_string(root.join("kept.txt")).unwrap(),
        "new kept\n"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("edited.txt")).unwrap(),
        "USER EDIT\n"
    );
    assert_eq!(r.not_applied.len(), 1, "{:?}", r.not_applied);
    let kept = r.not_applied[0].1.kept_at.clone().unwrap();
    assert_eq!(std::fs::read_to_string(kept).unwrap(), "new edited\n");
    assert_eq!(std::fs::read_dir(state.journals()).unwrap().count(), 0);
}

/// The sparse content hash depends on the content only (holes or written zeros alike),
/// and a record made before it (plain SHA-256 of every byte) is still compared by its own
/// form, so an old history entry still sees an unchanged file as unchanged.
#[test]
fn content_hashes_are_by_content_and_old_records_still_compare() {
    use super::history::{self, Lookup, State};
    use sha2::{Digest, Sha256};
    use std::io::{Seek, SeekFrom, Write};
    let d = tempfile::tempdir().unwrap();
    let mut holey = std::fs::File::create(d.path().join("holey")).unwrap();
    holey.write_all(b"abc").unwrap();
    holey.seek(SeekFrom::Start(300_000)).unwrap();
    holey.write_all(b"xyz").unwrap();
    holey.set_len(1 << 20).unwrap();
    let mut flat = vec![0u8; 1 << 20];
    flat[..3].copy_from_slice(b"abc");
    flat[300_000..300_003].copy_from_slice(b"xyz");
    std::fs::write(d.path().join("flat"), &flat).unwrap();
    let hash = |name: &str| {
        let mut f = std::fs::File::open(d.path().join(name)).unwrap();
        history::hash_file(&mut f).unwrap()
    };
    assert_eq!(hash("holey"), hash("flat"));
    assert!(!history::plain_hash(&hash("holey").0));
    flat[5] = 1;
    std::fs::write(d.path().join("other"), &flat).unwrap();
    assert_ne!(hash("other").0, hash("flat").0);
    // A state as an old record has it: the plain SHA-256.
    let plain: String = Sha256::digest(std::fs::read(d.path().join("holey")).unwrap())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let root = history::open_root(d.path()).unwrap();
    let mut look = Lookup::new(root.as_raw_fd());
    let now = look.read_state(Path::new("holey"), None).unwrap();
    let State::File { sha256, .. } = &now else {
        panic!("{now:?}")
    };
    assert!(!history::plain_hash(sha256));
    let mut old = now.clone();
    if let State::File { sha256, .. } = &mut old {
        *sha256 = plain.clone();
    }
    assert!(!old.same_as(&now), "forms differ");
    let as_old = look.read_state_as(Path::new("holey"), &old).unwrap();
    assert!(old.same_as(&as_old), "{old:?} vs {as_old:?}");
    assert!(now.same_as(&look.read_state_as(Path::new("holey"), &now).unwrap()));
}
