//! Inode numbers in a branch (issue 20): unchanged entries show the project's own
//! `st_ino`, across kernel forgets and copy-up; what the branch creates never shares a
//! number with a project file; and so git, whose index records `st_ino`, finds a fresh
//! branch clean and never carries branch numbers into the project's index.
#![allow(clippy::unwrap_used)]

mod common;

use common::describe as show;

use common::Fixture;
use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirEntryExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Makes the kernel forget the mount's unused dentries and inodes (FUSE FORGET).
fn drop_caches() {
    let _ = Command::new("sync").status();
    fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
}

fn ino(p: &Path) -> u64 {
    fs::symlink_metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .ino()
}

/// Every path below `root` (directories included) by inode number.
fn by_ino(root: &Path) -> BTreeMap<u64, Vec<PathBuf>> {
    let mut out: BTreeMap<u64, Vec<PathBuf>> = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let m = fs::symlink_metadata(e.path()).unwrap();
            assert_eq!(e.ino(), m.ino(), "d_ino and st_ino of {:?}", e.path());
            if m.is_dir() {
                stack.push(e.path());
            }
            let rel = e.path().strip_prefix(root).unwrap().to_path_buf();
            out.entry(m.ino()).or_default().push(rel);
        }
    }
    out
}

#[test]
fn unchanged_entries_show_the_projects_inode_numbers() {
    let fx = Fixture::new();
    fx.write("a.txt", "a\n");
    fx.write("sub/b.txt", "b\n");
    fx.write("sub/deep/c.txt", "c\n");
    fx.write("h1", "linked\n");
    fs::hard_link(fx.project.join("h1"), fx.project.join("sub/h2")).unwrap();
    std::os::unix::fs::symlink("a.txt", fx.project.join("link")).unwrap();
    let b = fx.branch();
    let m = b.mountpoint().to_path_buf();
    let paths = [
        "a.txt",
        "sub",
        "sub/b.txt",
        "sub/deep",
        "sub/deep/c.txt",
        "h1",
        "sub/h2",
        "link",
    ];
    let check = |when: &str| {
        for p in paths {
            assert_eq!(
                ino(&m.join(p)),
                ino(&fx.project.join(p)),
                "{p}: st_ino {when}"
            );
        }
    };
    check("on first lookup");
    // Listings (readdir and readdirplus) agree with stat, hard links share a number.
    let seen = by_ino(&m);
    assert_eq!(seen, by_ino(&fx.project));
    drop_caches();
    check("after the kernel forgot the inodes");
    // Copy-up (a write, a chmod, a rename) keeps the file's number; directory metadata
    // changes keep the directory's.
    fs::OpenOptions::new()
        .append(true)
        .open(m.join("a.txt"))
        .unwrap()
        .write_all(b"more\n")
        .unwrap();
    let a = ino(&fx.project.join("a.txt"));
    assert_eq!(ino(&m.join("a.txt")), a, "written a.txt");
    fs::set_permissions(
        m.join("sub/b.txt"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    fs::write(m.join("sub/new.txt"), "new\n").unwrap();
    fs::rename(m.join("sub/deep/c.txt"), m.join("c-moved.txt")).unwrap();
    drop_caches();
    assert_eq!(ino(&m.join("a.txt")), a, "written a.txt, forgotten");
    assert_eq!(
        ino(&m.join("sub/b.txt")),
        ino(&fx.project.join("sub/b.txt"))
    );
    assert_eq!(ino(&m.join("sub")), ino(&fx.project.join("sub")));
    assert_eq!(
        ino(&m.join("c-moved.txt")),
        ino(&fx.project.join("sub/deep/c.txt"))
    );
    assert_eq!(fs::read_to_string(m.join("a.txt")).unwrap(), "a\nmore\n");
}

#[test]
fn branch_objects_never_share_a_number_with_project_objects() {
    let fx = Fixture::new();
    for i in 0..50 {
        fx.write(&format!("d{}/f{i}.txt", i % 5), "x\n");
    }
    fx.write("h1", "linked\n");
    fs::hard_link(fx.project.join("h1"), fx.project.join("h2")).unwrap();
    fs::hard_link(fx.project.join("h1"), fx.project.join("h3")).unwrap();
    let b = fx.branch();
    let m = b.mountpoint().to_path_buf();
    let project: BTreeMap<u64, Vec<PathBuf>> = by_ino(&fx.project);
    fs::create_dir(m.join("newdir")).unwrap();
    for i in 0..50 {
        fs::write(m.join(format!("newdir/n{i}")), "n\n").unwrap();
    }
    std::os::unix::fs::symlink("h1", m.join("newlink")).unwrap();
    // A write to one name of a hard-linked project file: the branch's copy keeps the
    // number; h2, which the kernel knew (by the same inode), stays a link of it, as
    // natively; h3, never looked up, stays the project's file with a number of its own.
    assert_eq!(ino(&m.join("h2")), ino(&fx.project.join("h1")));
    fs::write(m.join("h1"), "branch\n").unwrap();
    // Unlinking one name of a hard-linked project file leaves the other writable.
    fx.write("k1", "k\n");
    fs::hard_link(fx.project.join("k1"), fx.project.join("k2")).unwrap();
    assert_eq!(ino(&m.join("k1")), ino(&m.join("k2")));
    fs::remove_file(m.join("k1")).unwrap();
    fs::write(m.join("k2"), "k2 written\n").unwrap();
    assert_eq!(fs::read_to_string(m.join("k2")).unwrap(), "k2 written\n");
    fs::remove_file(m.join("d0/f0.txt")).unwrap();
    fs::write(m.join("d0/f0.txt"), "re-created\n").unwrap();
    drop_caches();
    assert_eq!(fs::read_to_string(m.join("h1")).unwrap(), "branch\n");
    assert_eq!(fs::read_to_string(m.join("h2")).unwrap(), "branch\n");
    assert_eq!(fs::read_to_string(m.join("h3")).unwrap(), "linked\n");
    assert_eq!(ino(&m.join("h1")), ino(&fx.project.join("h1")));
    assert_eq!(ino(&m.join("h2")), ino(&m.join("h1")));
    let seen = by_ino(&m);
    for (n, paths) in &seen {
        if paths.iter().any(|p| p == Path::new("h1")) {
            let mut names = paths.clone();
            names.sort();
            assert_eq!(names, [PathBuf::from("h1"), PathBuf::from("h2")]);
            continue;
        }
        assert_eq!(paths.len(), 1, "number {n} shared by {paths:?}");
        let p = &paths[0];
        let created = p.starts_with("newdir") || p == Path::new("newlink");
        let recreated = p == Path::new("d0/f0.txt");
        if created || recreated {
            assert!(
                !project.contains_key(n),
                "{p:?}, made in the branch, has project number {n} ({:?})",
                project.get(n)
            );
        }
    }
    assert_ne!(
        ino(&m.join("d0/f0.txt")),
        ino(&fx.project.join("d0/f0.txt"))
    );
}

// ----- git -------------------------------------------------------------------------

fn git(dir: &Path, args: &[&str]) -> Output {
    let o = Command::new("git")
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@localhost",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "git {args:?}: {}", show(&o));
    o
}

/// A committed repository of a few hundred files whose index is settled: no entry is
/// "racily clean" (written in the index's own second), so a native `git status` neither
/// re-hashes nor rewrites anything.
fn repo(fx: &Fixture) {
    for i in 0..300 {
        fx.write(
            &format!("src/m{}/f{i}.rs", i % 12),
            &format!("pub fn f{i}() -> u32 {{ {i} }}\n"),
        );
    }
    fx.write("a", "a\n");
    git(&fx.project, &["init", "-q"]);
    git(&fx.project, &["add", "-A"]);
    git(&fx.project, &["commit", "-q", "-m", "base"]);
    std::thread::sleep(std::time::Duration::from_millis(1100));
    git(&fx.project, &["update-index", "--refresh"]);
    git(&fx.project, &["status", "--porcelain"]);
}

/// `git ls-files --debug`: per path, the stat data the index holds (ctime, mtime, ino,
/// size).
fn index_stat(dir: &Path) -> BTreeMap<String, [u64; 5]> {
    let o = git(dir, &["ls-files", "--debug"]);
    let text = String::from_utf8(o.stdout).unwrap();
    let mut out = BTreeMap::new();
    let mut path = String::new();
    let mut vals = [0u64; 5];
    for line in text.lines() {
        let t = line.trim();
        let two = |s: &str| -> (u64, u64) {
            let (a, b) = s.split_once(':').unwrap();
            (a.trim().parse().unwrap(), b.trim().parse().unwrap())
        };
        if let Some(r) = t.strip_prefix("ctime: ") {
            (vals[0], vals[1]) = two(r);
        } else if let Some(r) = t.strip_prefix("mtime: ") {
            (vals[2], vals[3]) = two(r);
        } else if let Some((_, r)) = t.split_once("ino: ") {
            vals[4] = r.trim().parse().unwrap();
        } else if !line.starts_with(' ') {
            if !path.is_empty() {
                out.insert(std::mem::take(&mut path), vals);
            }
            path = line.to_string();
        }
    }
    if !path.is_empty() {
        out.insert(path, vals);
    }
    out
}

/// What the index should hold for `rel` if its stat data matches the file's.
fn native_stat(dir: &Path, rel: &str) -> [u64; 5] {
    let m = fs::symlink_metadata(dir.join(rel)).unwrap();
    [
        m.ctime() as u64,
        m.ctime_nsec() as u64,
        m.mtime() as u64,
        m.mtime_nsec() as u64,
        // The index keeps the low 32 bits.
        m.ino() & 0xffff_ffff,
    ]
}

fn run_json(fx: &Fixture, extra: &[&str], script: &str) -> serde_json::Value {
    let o = fx
        .shade()
        .arg("run")
        .arg("--json")
        .args(extra)
        .args(["--", "sh", "-c", script])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", show(&o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", show(&o)))
}

#[test]
fn read_only_git_leaves_a_fresh_branch_without_changes() {
    let fx = Fixture::new();
    repo(&fx);
    let before = fs::read(fx.project.join(".git/index")).unwrap();
    let v = run_json(
        &fx,
        &[],
        "git status --porcelain && git diff --stat && git log --oneline >/dev/null",
    );
    assert_eq!(
        v["changes"],
        serde_json::json!([]),
        "a read-only git left changes: {v:#}"
    );
    assert_eq!(fs::read(fx.project.join(".git/index")).unwrap(), before);
}

#[test]
fn accepted_git_index_matches_the_project_files() {
    let fx = Fixture::new();
    repo(&fx);
    // A status first: were the branch's numbers not the project's, it would rewrite every
    // entry's stat data in the branch's index, and the accept would carry them over.
    let v = run_json(
        &fx,
        &["--accept"],
        "git status --porcelain >/dev/null && echo x >> a && git add a",
    );
    assert_eq!(v["accepted"], true, "{v:#}");
    let index = index_stat(&fx.project);
    assert_eq!(index.len(), 301);
    let stale: Vec<&String> = index
        .iter()
        .filter(|(p, vals)| p.as_str() != "a" && **vals != native_stat(&fx.project, p))
        .map(|(p, _)| p)
        .collect();
    assert!(
        stale.is_empty(),
        "{} of 300 untouched entries have stat data other than the files': {:?}",
        stale.len(),
        &stale[..stale.len().min(5)]
    );
    let o = git(&fx.project, &["status", "--porcelain"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "M  a\n");
}
