//! Overlay semantics, exercised through a real FUSE mount of a branch.
#![allow(clippy::unwrap_used)]

mod common;

use common::Fixture;
use shade_fusefs::ChangeKind;
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn kinds(b: &shade_fusefs::Branch) -> Vec<String> {
    b.changeset(false)
        .changes
        .iter()
        .map(|c| c.to_string())
        .collect()
}

#[test]
fn reads_through_and_copies_up_on_write() {
    let fx = Fixture::new();
    fx.write("a.txt", "lower\n");
    fx.write("sub/b.txt", "bee\n");
    let b = fx.branch();
    let m = b.mountpoint();
    assert_eq!(fs::read_to_string(m.join("a.txt")).unwrap(), "lower\n");
    assert_eq!(fs::read_to_string(m.join("sub/b.txt")).unwrap(), "bee\n");
    assert!(kinds(&b).is_empty(), "reading changes nothing");
    let mut f = OpenOptions::new()
        .append(true)
        .open(m.join("a.txt"))
        .unwrap();
    f.write_all(b"branch\n").unwrap();
    drop(f);
    assert_eq!(
        fs::read_to_string(m.join("a.txt")).unwrap(),
        "lower\nbranch\n"
    );
    assert_eq!(fx.read("a.txt"), "lower\n", "the real file is untouched");
    assert_eq!(kinds(&b), vec!["M a.txt"]);
    let diff = b.diff(&b.changeset(false));
    assert!(diff.contains("+branch"), "{diff}");
}

#[test]
fn create_excl_truncate_and_append() {
    let fx = Fixture::new();
    fx.write("t.txt", "0123456789");
    let b = fx.branch();
    let m = b.mountpoint();
    fs::write(m.join("new.txt"), "x").unwrap();
    let e = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(m.join("new.txt"))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyExists);
    let e = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(m.join("t.txt"))
        .unwrap_err();
    assert_eq!(
        e.kind(),
        ErrorKind::AlreadyExists,
        "O_EXCL sees lower files too"
    );
    OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(m.join("t.txt"))
        .unwrap();
    assert_eq!(fs::metadata(m.join("t.txt")).unwrap().len(), 0);
    assert_eq!(fx.read("t.txt"), "0123456789");
    let f = OpenOptions::new()
        .write(true)
        .open(m.join("new.txt"))
        .unwrap();
    f.set_len(5).unwrap();
    assert_eq!(fs::read(m.join("new.txt")).unwrap(), b"x\0\0\0\0");
    let mut f = OpenOptions::new()
        .append(true)
        .open(m.join("new.txt"))
        .unwrap();
    f.write_all(b"end").unwrap();
    assert_eq!(fs::read(m.join("new.txt")).unwrap(), b"x\0\0\0\0end");
    // a sparse write far out and a read back through a second handle
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.join("new.txt"))
        .unwrap();
    f.seek(SeekFrom::Start(1 << 20)).unwrap();
    f.write_all(b"far").unwrap();
    let mut g = File::open(m.join("new.txt")).unwrap();
    g.seek(SeekFrom::Start(1 << 20)).unwrap();
    let mut s = String::new();
    g.read_to_string(&mut s).unwrap();
    assert_eq!(s, "far");
}

#[test]
fn unlink_rmdir_and_whiteouts() {
    let fx = Fixture::new();
    fx.write("d/one", "1");
    fx.write("d/two", "2");
    fx.write("e/keep", "k");
    let b = fx.branch();
    let m = b.mountpoint();
    fs::remove_file(m.join("d/one")).unwrap();
    assert!(!m.join("d/one").exists());
    let names: Vec<_> = fs::read_dir(m.join("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec!["two"]);
    assert_eq!(
        fs::remove_dir(m.join("d")).unwrap_err().raw_os_error(),
        Some(libc::ENOTEMPTY)
    );
    fs::remove_file(m.join("d/two")).unwrap();
    fs::remove_dir(m.join("d")).unwrap();
    assert!(!m.join("d").exists());
    // overlay-only entries also keep a directory non-empty
    fs::create_dir(m.join("n")).unwrap();
    fs::write(m.join("n/f"), "f").unwrap();
    assert_eq!(
        fs::remove_dir(m.join("n")).unwrap_err().raw_os_error(),
        Some(libc::ENOTEMPTY)
    );
    // re-creating a removed directory does not resurrect lower entries
    fs::create_dir(m.join("d")).unwrap();
    assert_eq!(fs::read_dir(m.join("d")).unwrap().count(), 0);
    assert_eq!(fx.read("d/one"), "1", "the real tree is untouched");
    assert_eq!(
        fs::remove_file(m.join("e")).unwrap_err().raw_os_error(),
        Some(libc::EISDIR)
    );
    assert_eq!(
        fs::remove_dir(m.join("e/keep")).unwrap_err().raw_os_error(),
        Some(libc::ENOTDIR)
    );
}

#[test]
fn renames_files_and_directories() {
    let fx = Fixture::new();
    fx.write("src/lib.rs", "lib");
    fx.write("src/deep/mod.rs", "deep");
    fx.write("f", "file");
    fx.write("g", "gee");
    let b = fx.branch();
    let m = b.mountpoint();
    fs::write(m.join("src/deep/extra.rs"), "extra").unwrap();
    fs::rename(m.join("src"), m.join("code")).unwrap();
    assert!(!m.join("src").exists());
    assert_eq!(fs::read_to_string(m.join("code/lib.rs")).unwrap(), "lib");
    assert_eq!(
        fs::read_to_string(m.join("code/deep/mod.rs")).unwrap(),
        "deep"
    );
    assert_eq!(
        fs::read_to_string(m.join("code/deep/extra.rs")).unwrap(),
        "extra"
    );
    fs::rename(m.join("f"), m.join("code/f2")).unwrap();
    assert_eq!(fs::read_to_string(m.join("code/f2")).unwrap(), "file");
    // rename over an existing file replaces it
    fs::rename(m.join("code/f2"), m.join("g")).unwrap();
    assert_eq!(fs::read_to_string(m.join("g")).unwrap(), "file");
    let cs = b.changeset(false);
    assert!(
        cs.changes
            .iter()
            .any(|c| c.kind == ChangeKind::Renamed && c.is_dir && c.path == Path::new("code")),
        "{cs:?}"
    );
    assert_eq!(fx.read("src/lib.rs"), "lib");
    assert_eq!(fx.read("f"), "file");
    // a directory cannot move into itself
    assert_eq!(
        fs::rename(m.join("code"), m.join("code/deep/x"))
            .unwrap_err()
            .raw_os_error(),
        Some(libc::EINVAL)
    );
}

#[test]
fn rename_noreplace_and_exchange() {
    let fx = Fixture::new();
    fx.write("a", "A");
    fx.write("b", "B");
    fx.write("da/x", "x");
    fx.write("db/y", "y");
    let b = fx.branch();
    let m = b.mountpoint();
    let r = |from: &str, to: &str, flags: u32| unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            cstr(&m.join(from)).as_ptr(),
            libc::AT_FDCWD,
            cstr(&m.join(to)).as_ptr(),
            flags,
        )
    };
    assert_eq!(r("a", "b", libc::RENAME_NOREPLACE), -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EEXIST)
    );
    assert_eq!(r("a", "b", libc::RENAME_EXCHANGE), 0);
    assert_eq!(fs::read_to_string(m.join("a")).unwrap(), "B");
    assert_eq!(fs::read_to_string(m.join("b")).unwrap(), "A");
    assert_eq!(r("da", "db", libc::RENAME_EXCHANGE), 0);
    assert_eq!(fs::read_to_string(m.join("da/y")).unwrap(), "y");
    assert_eq!(fs::read_to_string(m.join("db/x")).unwrap(), "x");
    assert!(!m.join("da/x").exists());
    assert_eq!(r("a", "c", libc::RENAME_NOREPLACE), 0);
    assert_eq!(fs::read_to_string(m.join("c")).unwrap(), "B");
}

#[test]
fn symlinks_and_hard_links() {
    let fx = Fixture::new();
    fx.write("target.txt", "t");
    std::os::unix::fs::symlink("target.txt", fx.project.join("lower-link")).unwrap();
    let b = fx.branch();
    let m = b.mountpoint();
    assert_eq!(
        fs::read_link(m.join("lower-link")).unwrap(),
        Path::new("target.txt")
    );
    std::os::unix::fs::symlink("../elsewhere", m.join("new-link")).unwrap();
    assert_eq!(
        fs::read_link(m.join("new-link")).unwrap(),
        Path::new("../elsewhere")
    );
    assert!(fs::symlink_metadata(m.join("new-link"))
        .unwrap()
        .file_type()
        .is_symlink());
    fs::hard_link(m.join("target.txt"), m.join("hard.txt")).unwrap();
    let (a, h) = (
        fs::metadata(m.join("target.txt")).unwrap(),
        fs::metadata(m.join("hard.txt")).unwrap(),
    );
    assert_eq!(a.ino(), h.ino());
    assert_eq!(a.nlink(), 2);
    fs::write(m.join("hard.txt"), "through the link").unwrap();
    assert_eq!(
        fs::read_to_string(m.join("target.txt")).unwrap(),
        "through the link"
    );
    fs::remove_file(m.join("target.txt")).unwrap();
    assert_eq!(fs::metadata(m.join("hard.txt")).unwrap().nlink(), 1);
    assert_eq!(fx.read("target.txt"), "t");
}

#[test]
fn metadata_xattrs_and_statfs() {
    let fx = Fixture::new();
    fx.write("f", "f");
    fx.write("d/x", "x");
    let b = fx.branch();
    let m = b.mountpoint();
    fs::set_permissions(m.join("f"), fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(fs::metadata(m.join("f")).unwrap().mode() & 0o7777, 0o600);
    assert_eq!(
        fs::metadata(fx.project.join("f")).unwrap().mode() & 0o7777,
        0o644
    );
    std::os::unix::fs::chown(m.join("f"), Some(65534), Some(65534)).unwrap();
    assert_eq!(fs::metadata(m.join("f")).unwrap().uid(), 65534);
    assert_eq!(fs::metadata(fx.project.join("f")).unwrap().uid(), 0);
    fs::set_permissions(m.join("d"), fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(fs::metadata(m.join("d")).unwrap().mode() & 0o7777, 0o700);
    assert_eq!(
        fs::read_to_string(m.join("d/x")).unwrap(),
        "x",
        "chmod of a dir keeps its lower entries"
    );
    let f = File::options().write(true).open(m.join("f")).unwrap();
    let t = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
    f.set_times(fs::FileTimes::new().set_modified(t)).unwrap();
    assert_eq!(fs::metadata(m.join("f")).unwrap().mtime(), 1_000_000_000);
    // xattrs
    let p = cstr(&m.join("f"));
    let name = c"user.shade";
    let rc = unsafe { libc::setxattr(p.as_ptr(), name.as_ptr(), b"v1".as_ptr().cast(), 2, 0) };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    let mut buf = [0u8; 16];
    let n = unsafe {
        libc::getxattr(
            p.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    assert_eq!(&buf[..n as usize], b"v1");
    let rc = unsafe {
        libc::setxattr(
            p.as_ptr(),
            name.as_ptr(),
            b"v2".as_ptr().cast(),
            2,
            libc::XATTR_CREATE,
        )
    };
    assert_eq!(rc, -1);
    assert_eq!(unsafe { libc::removexattr(p.as_ptr(), name.as_ptr()) }, 0);
    let n = unsafe {
        libc::getxattr(
            p.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    assert_eq!(n, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::ENODATA)
    );
    // statfs is the lower file system's
    let a = nix::sys::statvfs::statvfs(m).unwrap();
    let l = nix::sys::statvfs::statvfs(&fx.project).unwrap();
    assert_eq!(a.blocks(), l.blocks());
    assert_eq!(a.name_max(), 255);
}

#[test]
fn long_names_deep_paths_and_unlinked_open_files() {
    let fx = Fixture::new();
    let b = fx.branch();
    let m = b.mountpoint();
    let ok = "n".repeat(255);
    fs::write(m.join(&ok), "ok").unwrap();
    let long = "n".repeat(256);
    assert_eq!(
        fs::write(m.join(&long), "x").unwrap_err().raw_os_error(),
        Some(libc::ENAMETOOLONG)
    );
    assert_eq!(
        fs::metadata(m.join(&long)).unwrap_err().raw_os_error(),
        Some(libc::ENAMETOOLONG)
    );
    // a path near PATH_MAX, built with relative steps as a shell would
    let comp = "d".repeat(200);
    let mut dir = m.to_path_buf();
    let mut rel_len = 0;
    while rel_len + 201 < 3800 {
        dir.push(&comp);
        rel_len += 201;
        fs::create_dir(&dir).unwrap();
    }
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("cd {} && echo deep > f && cat f", dir.display()))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "deep\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // fstat of an open, unlinked file reports nlink 0
    fs::write(m.join("gone"), "data").unwrap();
    let f = File::open(m.join("gone")).unwrap();
    fs::remove_file(m.join("gone")).unwrap();
    assert_eq!(f.metadata().unwrap().nlink(), 0);
    let mut s = String::new();
    (&f).read_to_string(&mut s).unwrap();
    assert_eq!(s, "data");
    fx.write("lowergone", "lower data");
    let f = File::open(m.join("lowergone")).unwrap();
    fs::remove_file(m.join("lowergone")).unwrap();
    assert_eq!(f.metadata().unwrap().nlink(), 0);
}

#[test]
fn shared_writable_mmap_and_locks() {
    let fx = Fixture::new();
    fx.write("mapped", &"a".repeat(8192));
    let b = fx.branch();
    let m = b.mountpoint();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.join("mapped"))
        .unwrap();
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            8192,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(&f),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
        std::ptr::copy_nonoverlapping(b"mmap!".as_ptr(), p.cast::<u8>().add(4096), 5);
        assert_eq!(libc::msync(p, 8192, libc::MS_SYNC), 0);
        libc::munmap(p, 8192);
    }
    drop(f);
    let data = fs::read(m.join("mapped")).unwrap();
    assert_eq!(&data[4096..4101], b"mmap!");
    assert_eq!(&fx.read("mapped")[4096..4101], "aaaaa");
    // flock and POSIX record locks (git and cargo rely on them)
    let f = File::create(m.join("lock")).unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
    assert_eq!(unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) }, 0);
    let g = File::open(m.join("lock")).unwrap();
    assert_eq!(
        unsafe {
            libc::flock(
                std::os::fd::AsRawFd::as_raw_fd(&g),
                libc::LOCK_EX | libc::LOCK_NB,
            )
        },
        -1
    );
    let out = Command::new("flock")
        .args(["-n"])
        .arg(m.join("lock"))
        .arg("true")
        .status();
    if let Ok(s) = out {
        assert!(!s.success(), "a second process must not get the lock");
    }
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    assert_eq!(unsafe { libc::fcntl(fd, libc::F_SETLK, &fl) }, 0);
}

/// Poll `f` for up to 3 s: lower changes reach the kernel's caches asynchronously
/// (inotify), within milliseconds.
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while !f() {
        assert!(
            std::time::Instant::now() < end,
            "timed out waiting for: {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[test]
fn lower_changes_show_through_untouched_paths() {
    let fx = Fixture::new();
    fx.write("seen", "v1");
    fx.write("mine", "v1");
    fx.write("dir/x", "x");
    let b = fx.branch();
    let m = b.mountpoint();
    assert_eq!(fs::read_to_string(m.join("seen")).unwrap(), "v1");
    assert_eq!(fs::metadata(m.join("seen")).unwrap().len(), 2);
    assert!(
        !m.join("appeared").exists(),
        "a negative lookup the kernel may cache"
    );
    assert_eq!(fs::read_dir(m.join("dir")).unwrap().count(), 1);
    fs::write(m.join("mine"), "branch").unwrap();
    fx.write("seen", "v2, longer");
    fx.write("mine", "user");
    fx.write("appeared", "new");
    fx.write("dir/y", "y");
    eventually("new size of a lower file", || {
        fs::metadata(m.join("seen")).unwrap().len() == 10
    });
    assert_eq!(fs::read_to_string(m.join("seen")).unwrap(), "v2, longer");
    eventually("a file created in lower", || m.join("appeared").exists());
    assert_eq!(fs::read_to_string(m.join("appeared")).unwrap(), "new");
    eventually("a listing that gained an entry", || {
        fs::read_dir(m.join("dir")).unwrap().count() == 2
    });
    fs::remove_file(fx.project.join("dir/x")).unwrap();
    eventually("a file deleted in lower", || !m.join("dir/x").exists());
    assert_eq!(
        fs::read_to_string(m.join("mine")).unwrap(),
        "branch",
        "overridden paths keep the branch's content"
    );
}

#[test]
fn big_files_spill_to_disk_not_memory() {
    let fx = Fixture::new();
    let mut opts = fx.options();
    opts.memory_budget = 64 << 20;
    let b = shade_fusefs::Branch::create(&fx.project, &opts).unwrap();
    let m = b.mountpoint();
    let chunk = vec![7u8; 1 << 20];
    let mut f = File::create(m.join("big")).unwrap();
    for _ in 0..256 {
        f.write_all(&chunk).unwrap();
    }
    drop(f);
    assert_eq!(fs::metadata(m.join("big")).unwrap().len(), 256 << 20);
    assert!(
        b.memory_used() <= 64 << 20,
        "memory used {} over budget",
        b.memory_used()
    );
    let mut f = File::open(m.join("big")).unwrap();
    f.seek(SeekFrom::Start(200 << 20)).unwrap();
    let mut buf = vec![0u8; 4096];
    f.read_exact(&mut buf).unwrap();
    assert!(buf.iter().all(|&x| x == 7));
}

#[test]
fn ignored_build_output_is_kept_out_of_the_changeset() {
    let fx = Fixture::new();
    fx.write(".gitignore", "target/\n*.log\n");
    fx.write("target/old", "o");
    let b = fx.branch();
    let m = b.mountpoint();
    fs::write(m.join("target/new"), "n").unwrap();
    fs::write(m.join("run.log"), "l").unwrap();
    fs::write(m.join("src.rs"), "s").unwrap();
    assert_eq!(kinds(&b), vec!["A src.rs"]);
    let all: Vec<String> = b
        .changeset(true)
        .changes
        .iter()
        .map(|c| c.to_string())
        .collect();
    assert_eq!(all, vec!["A run.log", "A src.rs", "A target/new"]);
    assert_eq!(
        fs::read_to_string(m.join("target/old")).unwrap(),
        "o",
        "ignored paths still read through"
    );
}

#[test]
fn many_branches_of_one_project_at_once() {
    let fx = Fixture::new();
    fx.write("shared.txt", "base");
    // More than inotify's default 128 instances per user and 1024 fds per process.
    let branches: Vec<_> = (0..150).map(|_| fx.branch()).collect();
    for (i, b) in branches.iter().enumerate() {
        fs::write(b.mountpoint().join("shared.txt"), format!("branch {i}")).unwrap();
    }
    for (i, b) in branches.iter().enumerate() {
        assert_eq!(
            fs::read_to_string(b.mountpoint().join("shared.txt")).unwrap(),
            format!("branch {i}")
        );
    }
    assert_eq!(fx.read("shared.txt"), "base");
    let state = fx.state.clone();
    drop(branches);
    common::assert_no_shade_mounts(&state);
    assert_eq!(
        fs::read_dir(state.branches()).unwrap().count(),
        0,
        "abort leaves no store behind"
    );
}

#[test]
fn git_works_inside_a_branch() {
    let fx = Fixture::new();
    fx.write("README", "hello\n");
    let b = fx.branch();
    let m = b.mountpoint();
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "-c",
                "init.defaultBranch=main",
            ])
            .args(args)
            .current_dir(m)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    git(&["init", "-q"]);
    git(&["add", "README"]);
    git(&["commit", "-qm", "first"]);
    git(&["checkout", "-qb", "feature"]);
    fs::write(m.join("README"), "changed\n").unwrap();
    git(&["commit", "-qam", "second"]);
    git(&["checkout", "-q", "main"]);
    assert_eq!(fs::read_to_string(m.join("README")).unwrap(), "hello\n");
    assert!(git(&["log", "--oneline", "feature"]).contains("second"));
    git(&["gc", "-q"]);
    git(&["fsck", "--strict"]);
    assert!(
        !fx.project.join(".git").exists(),
        "git wrote only into the branch"
    );
}
