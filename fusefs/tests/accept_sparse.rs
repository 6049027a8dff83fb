//! Accept against a hostile branch's files: a sparse file is written with its holes (a
//! 256 MiB hole costs the project nothing, as it cost the branch nothing), files that need
//! more room than the project's file system has are refused before anything is written,
//! and a termination signal before the commit point cancels the accept with the project
//! unchanged. Needs root (a small tmpfs) and fails loudly without.
#![allow(clippy::unwrap_used)]

mod accept_common;

use accept_common::{perms, Env};
use shade_fusefs::accept::{apply, AcceptOptions};
use shade_fusefs::{Base, PlanOp};
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, MetadataExt};

fn opts(env: &Env) -> AcceptOptions {
    AcceptOptions {
        force: false,
        state: env.state.clone(),
        reads: Vec::new(),
        own: None,
    }
}

/// A content file of `len` bytes holding only `data` at `at` (the rest a hole).
fn sparse(env: &Env, name: &str, len: u64, at: &[(u64, &[u8])]) -> std::fs::File {
    let p = env.dir.join(name);
    let mut f = std::fs::File::create(&p).unwrap();
    for (off, data) in at {
        f.seek(SeekFrom::Start(*off)).unwrap();
        f.write_all(data).unwrap();
    }
    f.set_len(len).unwrap();
    std::fs::File::open(&p).unwrap()
}

fn write_op(path: &str, content: std::fs::File) -> PlanOp {
    PlanOp::WriteFile {
        path: path.into(),
        content,
        perms: perms(0o644),
        base: Base::Absent,
        base_at: None,
    }
}

#[test]
fn a_sparse_file_is_accepted_with_its_holes() {
    let env = Env::new();
    const LEN: u64 = 256 << 20;
    let content = sparse(
        &env,
        "holey",
        LEN,
        &[(0, b"head"), (LEN / 2, b"middle"), (LEN - 4, b"tail")],
    );
    apply(&env.root, vec![write_op("hole", content)], &opts(&env)).unwrap();
    let f = std::fs::File::open(env.root.join("hole")).unwrap();
    let m = f.metadata().unwrap();
    assert_eq!(m.len(), LEN);
    let allocated = m.blocks() * 512;
    assert!(
        allocated < 4 << 20,
        "{allocated} bytes allocated for {LEN} bytes holding 14"
    );
    let at = |off: u64, n: usize| {
        let mut b = vec![0u8; n];
        f.read_exact_at(&mut b, off).unwrap();
        b
    };
    assert_eq!(at(0, 4), b"head");
    assert_eq!(at(LEN / 2, 6), b"middle");
    assert_eq!(at(LEN - 4, 4), b"tail");
    assert_eq!(at(4096, 8), [0u8; 8]);
    env.assert_clean();
}

#[test]
fn files_needing_more_room_than_is_free_are_refused_before_writing() {
    assert!(
        unsafe { libc::geteuid() } == 0,
        "this test mounts a tmpfs: run it as root"
    );
    let env = Env::new();
    let small = env.dir.join("small");
    std::fs::create_dir(&small).unwrap();
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "shade-test-small"])
        .arg(&small)
        .status()
        .unwrap();
    assert!(ok.success(), "mounting a tmpfs failed");
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(small.clone());
    let project = small.join("project");
    std::fs::create_dir(&project).unwrap();
    std::fs::write(project.join("keep"), "keep\n").unwrap();
    // 4 MiB of data (not holes) for a 1 MiB file system.
    let big = vec![7u8; 4 << 20];
    let content = sparse(&env, "big", 4 << 20, &[(0, &big)]);
    let small_content = sparse(&env, "ten", 10, &[(0, b"0123456789")]);
    let e = apply(
        &project,
        vec![write_op("a", small_content), write_op("big", content)],
        &opts(&env),
    )
    .unwrap_err();
    let text = e.to_string();
    assert!(text.contains("need") && text.contains("free"), "{text}");
    let left: Vec<_> = std::fs::read_dir(&project)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["keep"], "the project changed");
}

/// Bytes this thread has read so far (`rchar`): the work done, counted by the kernel.
fn thread_read() -> u64 {
    let io = std::fs::read_to_string("/proc/thread-self/io").unwrap();
    let line = io.lines().find(|l| l.starts_with("rchar:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// History hashes and stores a sparse file by its data: replacing a 1 GiB sparse file
/// with another reads a few blocks (each was read whole, holes and all: 2 GiB), the
/// stored before-content is as sparse, and undo puts it back exactly.
#[test]
fn history_of_a_sparse_file_costs_its_data_not_its_size() {
    const LEN: u64 = 1 << 30;
    let env = Env::new();
    {
        let mut f = std::fs::File::create(env.root.join("big")).unwrap();
        f.write_all(b"old").unwrap();
        f.seek(SeekFrom::Start(LEN / 2)).unwrap();
        f.write_all(b"tail").unwrap();
        f.set_len(LEN).unwrap();
    }
    let base = Base::observe(&env.root.join("big")).unwrap();
    let content = sparse(&env, "new", LEN, &[(0, b"new")]);
    let plan = vec![PlanOp::WriteFile {
        path: "big".into(),
        content,
        perms: perms(0o644),
        base,
        base_at: None,
    }];
    let before = thread_read();
    apply(&env.root, plan, &opts(&env)).unwrap();
    let read = thread_read() - before;
    eprintln!("accept over a {LEN}-byte sparse file read {read} bytes");
    assert!(read < 32 << 20, "accept read {read} bytes");
    let objects = env.state.history();
    let stored: u64 = walkdir(&objects);
    assert!(stored < 16 << 20, "history holds {stored} bytes of blocks");
    let before = thread_read();
    shade_fusefs::undo::undo(
        &env.state,
        &env.root,
        None,
        &shade_fusefs::undo::UndoOptions::default(),
    )
    .unwrap();
    let read = thread_read() - before;
    eprintln!("its undo read {read} bytes");
    assert!(read < 32 << 20, "undo read {read} bytes");
    let f = std::fs::File::open(env.root.join("big")).unwrap();
    assert_eq!(f.metadata().unwrap().len(), LEN);
    assert!(f.metadata().unwrap().blocks() * 512 < 4 << 20);
    let mut b = [0u8; 4];
    f.read_exact_at(&mut b[..3], 0).unwrap();
    assert_eq!(&b[..3], b"old");
    f.read_exact_at(&mut b, LEN / 2).unwrap();
    assert_eq!(&b, b"tail");
    env.assert_clean();
}

/// Bytes allocated (blocks) under `dir`.
fn walkdir(dir: &std::path::Path) -> u64 {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let m = e.metadata().unwrap();
        n += if m.is_dir() {
            walkdir(&e.path())
        } else {
            m.blocks() * 512
        };
    }
    n
}
