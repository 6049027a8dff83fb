//! FUSE passthrough of unchanged files opened for reading (`SHADE_FUSE_PASSTHROUGH=1`,
//! issue 20), on a real mount: the bytes are right; a write open while a passed-through
//! reader is open is refused with ETXTBSY (the kernel allows no other open mode then — and
//! the refusal shows passthrough was engaged); once the reader closed, copy-up isolates
//! the branch (the project is untouched, new opens see the branch's data).
//! Needs root (CAP_SYS_ADMIN registers backing files): fails loudly without it.
#![allow(clippy::unwrap_used)]

use shade_fusefs::{Branch, BranchOptions, StateDir};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;

fn branch(project: &std::path::Path, state: &std::path::Path) -> Branch {
    assert!(
        nix::unistd::geteuid().is_root(),
        "FUSE passthrough needs CAP_SYS_ADMIN: run this test as root"
    );
    // Read when the branch is created; every test here wants it.
    std::env::set_var("SHADE_FUSE_PASSTHROUGH", "1");
    Branch::create(
        project,
        &BranchOptions {
            state: StateDir::at(state.to_path_buf()),
            memory_budget: 1 << 20,
            allow_other: false,
            threads: 2,
            id_shift: None,
        },
    )
    .unwrap()
}

#[test]
fn passthrough_reads_are_right_and_copy_up_still_isolates() {
    let tmp = tempfile::tempdir().unwrap();
    let project = tmp.path().join("project");
    fs::create_dir_all(project.join("sub")).unwrap();
    // Big enough for several reads, with content that shows any misplaced byte.
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    fs::write(project.join("sub/big.bin"), &big).unwrap();
    fs::write(project.join("small.txt"), "lower\n").unwrap();
    let b = branch(&project, &tmp.path().join("state"));
    let m = b.mountpoint().to_path_buf();

    assert_eq!(fs::read(m.join("sub/big.bin")).unwrap(), big);
    let f = File::open(m.join("sub/big.bin")).unwrap();
    let mut part = vec![0; 4096];
    f.read_exact_at(&mut part, 1_234_567).unwrap();
    assert_eq!(part, big[1_234_567..1_234_567 + 4096]);
    // Two readers share one backing file.
    let g = File::open(m.join("sub/big.bin")).unwrap();
    let mut all = Vec::new();
    (&g).read_to_end(&mut all).unwrap();
    assert_eq!(all, big);
    drop((f, g));

    // A reader holds the unchanged file open, passed through to the project's file: the
    // kernel lets no other kind of open in, so a writer is refused until it closes (which
    // also shows passthrough was engaged: served by inode, the write open would succeed).
    let reader = File::open(m.join("small.txt")).unwrap();
    let refused = OpenOptions::new().write(true).open(m.join("small.txt"));
    assert_eq!(
        refused.as_ref().map_err(std::io::Error::raw_os_error).err(),
        Some(Some(libc::ETXTBSY)),
        "a write open while a passed-through reader is open: {refused:?}"
    );
    let mut old = String::new();
    (&reader).read_to_string(&mut old).unwrap();
    assert_eq!(old, "lower\n");
    drop(reader);
    // With the reader closed, the write copies the file up into the branch only.
    let mut w = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(m.join("small.txt"))
        .expect("a write open once the reader closed");
    w.write_all(b"branch\n").unwrap();
    drop(w);
    assert_eq!(fs::read_to_string(m.join("small.txt")).unwrap(), "branch\n");
    assert_eq!(
        fs::read_to_string(project.join("small.txt")).unwrap(),
        "lower\n",
        "the project is untouched"
    );
    let cs = b.changeset(false);
    assert_eq!(cs.changes.len(), 1, "{:?}", cs.changes);
}

#[test]
fn a_reader_after_a_branch_write_sees_the_branch() {
    let tmp = tempfile::tempdir().unwrap();
    let project = tmp.path().join("project");
    fs::create_dir_all(&project).unwrap();
    fs::write(project.join("a.txt"), "lower\n").unwrap();
    let b = branch(&project, &tmp.path().join("state"));
    let m = b.mountpoint().to_path_buf();
    assert_eq!(fs::read_to_string(m.join("a.txt")).unwrap(), "lower\n");
    // A writer open first (cached mode), then a read-only open while it is live: served
    // by inode, so it sees the writer's bytes.
    let mut w = OpenOptions::new()
        .write(true)
        .open(m.join("a.txt"))
        .unwrap();
    w.write_all(b"BRANCH\n").unwrap();
    let r = fs::read_to_string(m.join("a.txt")).unwrap();
    drop(w);
    assert_eq!(r, "BRANCH\n");
    assert_eq!(
        fs::read_to_string(project.join("a.txt")).unwrap(),
        "lower\n"
    );
}
