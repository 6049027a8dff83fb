//! Fidelity (issue 13): a branch, and a branch after accept, must be what a real directory
//! is. Each test runs the same shell script on a plain copy of the project and through
//! `shade run` on the project, and compares what the two show.
#![allow(clippy::unwrap_used)]

mod common;

use common::describe as out;

use common::Fixture;
use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A fixture whose project (and its parents) other users can reach, like a checkout.
/// This file's tests one at a time: some make mount namespaces or watch the pool, and a
/// namespace made by one test (an `unshare`, an unconfined or plain user's command) copies
/// every branch mounted then, the other tests' too; the pool rightly refuses to hand a
/// connection on while such a copy exists.
static NAMESPACES: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn namespaces_alone() -> std::sync::MutexGuard<'static, ()> {
    NAMESPACES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn open_fixture() -> Fixture {
    let fx = Fixture::new();
    for p in [fx.tmp.path(), &fx.project] {
        fs::set_permissions(p, fs::Permissions::from_mode(0o755)).unwrap();
    }
    fx
}

/// A plain copy of the project (mtimes, modes, owners, xattrs and hard links kept).
fn plain_copy(fx: &Fixture) -> PathBuf {
    let plain = fx.tmp.path().join("plain");
    let o = Command::new("cp")
        .arg("-a")
        .arg(&fx.project)
        .arg(&plain)
        .output()
        .unwrap();
    assert!(o.status.success(), "cp -a: {}", out(&o));
    plain
}

fn sh_in(dir: &Path, script: &str) -> Output {
    Command::new("sh")
        .args(["-c", script])
        .current_dir(dir)
        .output()
        .unwrap()
}

fn shade_run(fx: &Fixture, extra: &[&str], script: &str) -> Output {
    let mut args = vec!["run"];
    args.extend_from_slice(extra);
    args.extend(["--", "sh", "-c", script]);
    fx.shade().args(&args).output().unwrap()
}

/// Run `script` on a plain copy and in a branch (dropped); both outputs must be equal.
fn same_output(fx: &Fixture, script: &str) -> String {
    same_output_with(fx, &[], script)
}

/// [`same_output`] with extra `shade run` flags.
fn same_output_with(fx: &Fixture, extra: &[&str], script: &str) -> String {
    let plain = plain_copy(fx);
    let p = sh_in(&plain, script);
    let b = shade_run(fx, extra, script);
    assert!(p.status.success(), "plain run failed: {}", out(&p));
    assert_eq!(
        String::from_utf8_lossy(&b.stdout),
        String::from_utf8_lossy(&p.stdout),
        "the branch differs from a plain directory.\nbranch: {}\nplain: {}",
        out(&b),
        out(&p)
    );
    String::from_utf8_lossy(&p.stdout).into_owned()
}

/// `as USER CMD`: the shell snippet that runs CMD as another user.
const AS_NOBODY: &str = "setpriv --reuid=nobody --regid=nogroup --clear-groups";

#[test]
fn other_users_in_the_command_get_what_a_real_directory_gives() {
    let _alone = namespaces_alone();
    let fx = open_fixture();
    fx.write("pub.txt", "public\n");
    fx.write("secret.txt", "secret\n");
    fx.write("shared/open.txt", "o\n");
    fs::set_permissions(
        fx.project.join("secret.txt"),
        fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    fs::set_permissions(fx.project.join("shared"), fs::Permissions::from_mode(0o777)).unwrap();
    let script = format!(
        "{AS_NOBODY} cat pub.txt; \
         {AS_NOBODY} cat secret.txt 2>/dev/null || echo secret denied; \
         {AS_NOBODY} sh -c 'echo mine > shared/nobody.txt' && stat -c '%U %a' shared/nobody.txt; \
         {AS_NOBODY} sh -c 'echo x >> pub.txt' 2>/dev/null || echo write denied; \
         {AS_NOBODY} ls shared | sort; \
         setpriv --reuid=daemon --regid=daemon --clear-groups mkdir shared/d 2>/dev/null && stat -c '%U %G' shared/d"
    );
    let shown = same_output(&fx, &script);
    assert!(
        shown.starts_with("public\nsecret denied\nnobody "),
        "{shown}"
    );
    println!("fidelity: other uids inside the branch see what a plain directory gives:\n{shown}");
}

#[test]
fn users_outside_the_command_cannot_reach_the_branch() {
    let _alone = namespaces_alone();
    let fx = open_fixture();
    fx.write("pub.txt", "public\n");
    let mut child = fx
        .shade()
        .args(["run", "--", "sleep", "3"])
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mnt = loop {
        let found = fs::read_dir(fx.state.branches())
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path().join("mnt"))
            .find(|m| m.join("pub.txt").exists());
        if let Some(m) = found {
            break m;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no branch mount appeared"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mode = fs::metadata(mnt.parent().unwrap()).unwrap().mode() & 0o7777;
    let o = Command::new("sh")
        .args(["-c", &format!("{AS_NOBODY} cat {}/pub.txt", mnt.display())])
        .output()
        .unwrap();
    child.wait().unwrap();
    assert_eq!(mode, 0o700, "the mount point's parent is not private");
    assert!(!o.status.success(), "nobody read the branch from outside");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("Permission denied"), "{}", out(&o));
    println!("isolation: nobody outside the command -> {}", err.trim());
}

#[test]
fn setuid_and_setgid_are_dropped_as_a_local_file_system_drops_them() {
    let _alone = namespaces_alone();
    let fx = open_fixture();
    for f in [
        "low-write",
        "low-trunc",
        "low-root",
        "low-chown",
        "low-lock",
    ] {
        fx.write(f, "lower\n");
    }
    for (f, m) in [
        ("low-write", 0o6777),
        ("low-trunc", 0o6777),
        ("low-root", 0o6777),
        ("low-chown", 0o6755),
        ("low-lock", 0o2767),
    ] {
        fs::set_permissions(fx.project.join(f), fs::Permissions::from_mode(m)).unwrap();
    }
    // Lower files (copied up by the change) and files made in the branch, each changed by
    // nobody (no CAP_FSETID), by root, by chown, by truncate and by an O_TRUNC open.
    let script = format!(
        "for f in new-write new-trunc new-otrunc new-root; do echo new > $f; chmod 6777 $f; done; \
         echo new > new-chown; chmod 6755 new-chown; \
         {AS_NOBODY} sh -c 'echo more >> low-write; echo more >> new-write'; \
         {AS_NOBODY} truncate -s 2 low-trunc new-trunc; \
         {AS_NOBODY} sh -c ': > new-otrunc'; \
         echo root >> low-root; echo root >> new-root; \
         chown daemon low-chown new-chown; \
         {AS_NOBODY} sh -c 'echo more >> low-lock'; \
         echo new > new-quick; chmod 4777 new-quick; cat new-quick >/dev/null; \
         {AS_NOBODY} sh -c 'echo more >> new-quick'; stat -c '%n %a' new-quick; \
         stat -c '%n %a %s' low-* new-*"
    );
    // The file system's rules, with the privileges of real root: in the sandbox root holds
    // CAP_FSETID only inside its user namespace, and the kernel, which asks the initial
    // namespace, drops the bits on its writes as on any user namespace's (the README says so).
    let shown = same_output_with(&fx, &["--unconfined"], &script);
    assert!(shown.contains("low-write 777 "), "{shown}");
    assert!(shown.contains("low-root 6777 "), "{shown}");
    println!("fidelity: setuid/setgid after writes, truncates and chowns:\n{shown}");
}

#[test]
fn hole_punching_frees_a_range_and_keeps_the_size() {
    let _alone = namespaces_alone();
    let fx = open_fixture();
    fs::write(fx.project.join("low.bin"), "abcdefgh".repeat(4096)).unwrap();
    let script = "yes 0123456789 | head -c 40000 > new.bin; \
         fallocate -p -o 4096 -l 8192 new.bin; fallocate -p -o 100 -l 5000 low.bin; \
         fallocate -p -o 30000 -l 50000 new.bin; \
         for f in new.bin low.bin; do stat -c '%n %s' $f; od -An -c $f | md5sum; done";
    let shown = same_output(&fx, script);
    assert!(shown.contains("new.bin 40000"), "{shown}");
    println!("fidelity: fallocate -p in a branch:\n{shown}");
}

/// A mount namespace made while a branch is mounted (a concurrent `shade run`, a linter's
/// sandbox) keeps a copy of the branch mount. Unmounting the branch must still finish, the
/// copy must not serve the dropped branch (dead, or showing only the unchanged project of
/// a parked connection), and no later branch may be served where the copy reaches it.
#[test]
fn a_branch_unmounts_while_another_namespace_holds_a_copy() {
    let _alone = namespaces_alone();
    let fx = open_fixture();
    fx.write("f.txt", "f\n");
    let b = fx.branch();
    let mnt = b.mountpoint().to_path_buf();
    fs::write(mnt.join("mine.txt"), "the branch's\n").unwrap();
    let mut holder = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sleep", "60"])
        .spawn()
        .unwrap();
    let pid = holder.id().to_string();
    let seen = |what: &str| {
        Command::new("nsenter")
            .args(["-t", &pid, "-m", "cat"])
            .arg(mnt.join(what))
            .output()
            .unwrap()
    };
    // The copy is there (retried: unshare needs a moment to make its namespace).
    let mut copy = seen("f.txt");
    for _ in 0..100 {
        if copy.status.success() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        copy = seen("f.txt");
    }
    assert_eq!(copy.stdout, b"f\n", "no copy of the mount: {}", out(&copy));
    // Before the fix this drop never returned (the FUSE threads waited for the copy).
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(b);
        let _ = tx.send(());
    });
    let done = rx.recv_timeout(std::time::Duration::from_secs(120));
    let after = seen("mine.txt");
    // The next branch, while the copy lives: never on the connection the copy reaches.
    let b2 = fx.branch();
    fs::write(b2.mountpoint().join("next.txt"), "the next branch's\n").unwrap();
    let next = seen("next.txt");
    let reused = b2.reused_connection();
    drop(b2);
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert!(done.is_ok(), "unmounting the branch hung behind the copy");
    assert!(
        !after.status.success(),
        "the copy still serves the branch: {}",
        out(&after)
    );
    assert!(
        !next.status.success(),
        "the copy serves the next branch: {}",
        out(&next)
    );
    assert!(
        !reused,
        "the next branch took the connection a copy reaches"
    );
    println!(
        "unmount with a copy in another namespace: done; the copy says {}",
        String::from_utf8_lossy(&after.stderr).trim()
    );
}
/// A mount namespace made while a branch is mounted and then kept by a bind mount of its
/// nsfs file, with no process in it (red team round 3): the pool's copy check looked only
/// at processes' namespaces, handed the connection to the next branch, and `nsenter
/// --mount=FILE` read that branch's files through the copy. Root only (binding an nsfs
/// file needs it); the check now asks the kernel's list of namespaces.
#[test]
fn a_namespace_kept_without_a_process_never_sees_the_next_branch() {
    let _alone = namespaces_alone();
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test binds an nsfs file: run it as root"
    );
    let fx = open_fixture();
    fx.write("f.txt", "f\n");
    let b1 = fx.branch();
    let mnt1 = b1.mountpoint().to_path_buf();
    let nsf = fx.tmp.path().join("ns");
    fs::write(&nsf, "").unwrap();
    let made = Command::new("unshare")
        .args(["-m", "--propagation", "private"])
        .arg(format!("--mount={}", nsf.display()))
        .arg("true")
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", out(&made));
    let through_copy = |p: &Path| {
        Command::new("nsenter")
            .arg(format!("--mount={}", nsf.display()))
            .arg("cat")
            .arg(p)
            .output()
            .unwrap()
    };
    assert_eq!(
        through_copy(&mnt1.join("f.txt")).stdout,
        b"f\n",
        "no copy was made"
    );
    drop(b1);
    let b2 = fx.branch();
    fs::write(b2.mountpoint().join("s.txt"), "b2-secret\n").unwrap();
    let seen = [mnt1.join("s.txt"), b2.mountpoint().join("s.txt")].map(|p| through_copy(&p));
    drop(b2);
    let _ = Command::new("umount").arg(&nsf).status();
    for o in seen {
        assert!(
            !String::from_utf8_lossy(&o.stdout).contains("b2-secret"),
            "the kept namespace reads the next branch: {}",
            out(&o)
        );
    }
}

/// A sandboxed command's stage (a mount namespace made while other branches were mounted)
/// keeps no copy of their mounts: the pool hands a branch's connection on while another
/// command runs. Before, every root command's stage held copies of every branch mounted
/// when it started, and no connection mounted then was reused until it ended.
#[test]
fn a_running_command_does_not_keep_other_branches_from_the_pool() {
    let _alone = namespaces_alone();
    assert!(nix::unistd::geteuid().is_root(), "run this test as root");
    let fx = open_fixture();
    fx.write("f.txt", "f\n");
    let b1 = fx.branch();
    let flag = fx.tmp.path().join("started");
    let mut cmd = fx
        .shade()
        .current_dir(&fx.project)
        .args(["run", "--", "sh", "-c"])
        .arg(format!("touch {}; sleep 30", flag.display()))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    common::wait_until("the command to start", 60, || flag.exists());
    drop(b1);
    let b2 = fx.branch();
    let reused = b2.reused_connection();
    drop(b2);
    let _ = cmd.kill();
    let _ = cmd.wait();
    assert!(
        reused,
        "the running command's stage kept the first branch's connection from the pool"
    );
}

/// Everything `ls -l`, `stat` and `getfattr` show of a tree, by path.
#[derive(Debug, PartialEq, Eq, Clone)]
struct Seen {
    kind: u32,
    mode: u32,
    nlink: u64,
    uid: u32,
    gid: u32,
    /// The first path (in walk order) of the same inode: hard links name the same file.
    same_as: PathBuf,
    mtime: Option<(i64, i64)>,
    target: Option<PathBuf>,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    content: Option<Vec<u8>>,
}

fn xattrs_of(p: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let mut names = vec![0u8; 65536];
    // SAFETY: the buffers are valid for their given lengths.
    let n = unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    assert!(n >= 0, "llistxattr {}", p.display());
    let mut out = BTreeMap::new();
    for name in names[..n as usize]
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty())
    {
        let cn = CString::new(name).unwrap();
        let mut v = vec![0u8; 65536];
        // SAFETY: as above.
        let m = unsafe { libc::lgetxattr(c.as_ptr(), cn.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
        assert!(m >= 0, "lgetxattr {}", p.display());
        out.insert(name.to_vec(), v[..m as usize].to_vec());
    }
    out
}

/// The whole tree under `root`; `mtimes` says whose mtimes to keep (by relative path).
fn seen(root: &Path, mtimes: &dyn Fn(&Path, u32) -> bool) -> BTreeMap<PathBuf, Seen> {
    let mut out = BTreeMap::new();
    let mut first: BTreeMap<(u64, u64), PathBuf> = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    let mut all = Vec::new();
    while let Some(d) = stack.pop() {
        let mut names: Vec<_> = fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        for p in names {
            let m = fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                stack.push(p.clone());
            }
            all.push((p, m));
        }
    }
    all.sort_by(|a, b| a.0.cmp(&b.0));
    for (p, m) in all {
        let rel = p.strip_prefix(root).unwrap().to_path_buf();
        let same_as = first
            .entry((m.dev(), m.ino()))
            .or_insert_with(|| rel.clone())
            .clone();
        let kind = m.mode() & libc::S_IFMT;
        out.insert(
            rel.clone(),
            Seen {
                kind,
                mode: m.mode() & 0o7777,
                nlink: if m.is_dir() { 0 } else { m.nlink() },
                uid: m.uid(),
                gid: m.gid(),
                same_as,
                mtime: mtimes(&rel, kind).then(|| (m.mtime(), m.mtime_nsec())),
                target: m
                    .file_type()
                    .is_symlink()
                    .then(|| fs::read_link(&p).unwrap()),
                xattrs: xattrs_of(&p),
                content: m.is_file().then(|| fs::read(&p).unwrap()),
            },
        );
    }
    out
}

/// The differences between two tree views, one line each.
fn differences(a: &BTreeMap<PathBuf, Seen>, b: &BTreeMap<PathBuf, Seen>) -> Vec<String> {
    let mut d = Vec::new();
    for (p, x) in a {
        match b.get(p) {
            None => d.push(format!("{}: only in the first", p.display())),
            Some(y) if x != y => d.push(format!("{}: {x:?} != {y:?}", p.display())),
            _ => {}
        }
    }
    for p in b.keys().filter(|p| !a.contains_key(*p)) {
        d.push(format!("{}: only in the second", p.display()));
    }
    d
}

/// Accept must carry what the branch did. The script sets times explicitly (so the plain
/// run and the branch agree on them), makes hard links, sets and removes xattrs, changes
/// directory modes and creates a fifo and a socket.
#[test]
fn accept_gives_the_tree_the_command_gives_a_plain_directory() {
    let _alone = namespaces_alone();
    let fx = open_fixture();
    fx.write("a.txt", "a\n");
    fx.write("keep.txt", "k\n");
    fx.write("touched.txt", "t\n");
    fx.write("attrs.txt", "x\n");
    fx.write("dir/inner.txt", "i\n");
    fx.write("srcdir/f1", "1\n");
    fx.write("srcdir/sub/f2", "2\n");
    fx.write("tight/f", "f\n");
    let set = |p: &str, k: &str, v: &str| {
        let c = CString::new(fx.project.join(p).as_os_str().as_bytes()).unwrap();
        let k = CString::new(k).unwrap();
        // SAFETY: valid C strings and buffer.
        let r = unsafe { libc::setxattr(c.as_ptr(), k.as_ptr(), v.as_ptr().cast(), v.len(), 0) };
        assert_eq!(r, 0, "setxattr");
    };
    set("attrs.txt", "user.drop", "1");
    set("attrs.txt", "user.change", "old");
    set("dir", "user.dir", "d");
    let o = Command::new("touch")
        .args(["-d", "2010-01-01 00:00:00"])
        .arg(fx.project.join("touched.txt"))
        .arg(fx.project.join("srcdir/f1"))
        .arg(fx.project.join("srcdir/sub/f2"))
        .output()
        .unwrap();
    assert!(o.status.success());
    // The archive the script extracts: entries with their own old times.
    let o = sh_in(
        fx.tmp.path(),
        "mkdir -p arc/pkg/deep && echo one > arc/pkg/one && echo two > arc/pkg/deep/two && \
         touch -d '2005-05-05 05:05:05' arc/pkg/one arc/pkg/deep/two arc/pkg/deep arc/pkg && \
         tar -C arc -cf arc.tar pkg",
    );
    assert!(o.status.success(), "{}", out(&o));
    let tar = fx.tmp.path().join("arc.tar");
    let script = format!(
        "set -e; \
         ln a.txt a-link.txt; echo made > new.txt; ln new.txt new-link.txt; \
         mkdir linked && ln new.txt linked/third.txt; \
         echo more >> a.txt; \
         touch -d '2001-02-03 04:05:06.5' touched.txt keep.txt; \
         cp -p srcdir/f1 copied-p.txt; cp -rp srcdir copied-dir; \
         touch -d '2002-02-02 02:02:02' copied-dir; \
         tar -xf {tar}; \
         python3 -c \"import os; os.setxattr('attrs.txt','user.new',b'n'); \
os.setxattr('attrs.txt','user.change',b'new'); os.removexattr('attrs.txt','user.drop'); \
os.setxattr('dir','user.dir',b'changed'); os.setxattr('dir/inner.txt','user.i',b'i')\"; \
         chmod 700 tight; chmod 1777 dir; mkdir -m 2750 made; \
         mkfifo -m 640 pipe; \
         python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); s.bind('sock')\"",
        tar = tar.display()
    );
    let plain = plain_copy(&fx);
    let p = sh_in(&plain, &script);
    assert!(p.status.success(), "plain run: {}", out(&p));
    // In the branch: the same script, then what the branch shows, for the mtimes check.
    let shown_at = fx.tmp.path().join("branch-view");
    let b = shade_run(
        &fx,
        &["--accept"],
        &format!(
            "{script}; cp -a --no-preserve=links . {v} 2>/dev/null || true; \
             find . -printf '%P %T@ %y\\n' | sort > {v}.times",
            v = shown_at.display()
        ),
    );
    assert!(b.status.success(), "branch run: {}", out(&b));

    // Times the script set explicitly agree with the plain run; every other time is now.
    let explicit = |rel: &Path, kind: u32| {
        let s = rel.to_string_lossy();
        kind != libc::S_IFLNK
            && (s == "touched.txt"
                || s == "keep.txt"
                || s == "copied-p.txt"
                || s.starts_with("copied-dir")
                || s.starts_with("pkg"))
    };
    let want = seen(&plain, &explicit);
    let got = seen(&fx.project, &explicit);
    let diff = differences(&want, &got);
    assert!(
        diff.is_empty(),
        "after accept, the real tree differs from the plain run:\n{}",
        diff.join("\n")
    );

    // And every mtime the branch showed (files and directories) is what accept left.
    let times = fs::read_to_string(format!("{}.times", shown_at.display())).unwrap();
    let now = String::from_utf8(
        Command::new("find")
            .args([".", "-printf", "%P %T@ %y\\n"])
            .current_dir(&fx.project)
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let mut now: Vec<&str> = now.lines().collect();
    now.sort();
    let shown: Vec<&str> = times.lines().collect();
    let wrong: Vec<String> = shown
        .iter()
        .zip(&now)
        .filter(|(a, b)| a != b && !a.starts_with(' ') && !a.ends_with(" l"))
        .map(|(a, b)| format!("branch showed {a}, accept left {b}"))
        .collect();
    assert_eq!(shown.len(), now.len(), "{times}\n---\n{}", now.join("\n"));
    assert!(
        wrong.is_empty(),
        "mtimes not carried:\n{}",
        wrong.join("\n")
    );
    println!(
        "fidelity: accept == plain run over {} paths (names, types, modes, owners, links, targets, xattrs, contents, explicit mtimes); all {} branch mtimes carried",
        want.len(),
        shown.len()
    );
}

/// Inside a directory the branch renamed, an entry replaced by another kind (a file by a
/// symlink or a directory), also after a second rename: accept gives what a plain run
/// gives. The accept's pre-check simulated the plan and forgot a delete made while the
/// directory sat at its temporary name, then found "nothing instead of a file" where the
/// symlink went, and set the symlink aside (red team round 7).
#[test]
fn entries_replaced_inside_a_renamed_directory_accept_as_a_plain_run() {
    let _alone = namespaces_alone();
    for script in [
        "mv d d2; rm d2/f; ln -s g d2/f",
        "mv d d2; rm d2/f; mkdir d2/f; echo in > d2/f/x",
        "mv d d2; mv d2 d3; rm d3/f; ln -s g d3/f; rm d3/g; echo new > d3/g",
    ] {
        let fx = open_fixture();
        fx.write("d/f", "f\n");
        fx.write("d/g", "g\n");
        let plain = plain_copy(&fx);
        let p = sh_in(&plain, script);
        assert!(p.status.success(), "plain run: {}", out(&p));
        let b = shade_run(&fx, &["--accept"], script);
        assert!(b.status.success(), "{script}: {}", out(&b));
        let no_times = |_: &Path, _: u32| false;
        let diff = differences(&seen(&plain, &no_times), &seen(&fx.project, &no_times));
        assert!(diff.is_empty(), "{script}:\n{}", diff.join("\n"));
    }
}

/// Poll `f` for up to 3 s: lower changes reach the kernel's caches asynchronously
/// (inotify), within milliseconds; a stale cache entry would live 30 s.
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while !f() {
        assert!(std::time::Instant::now() < end, "stale after 3 s: {what}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Entries under a directory renamed in the branch read their lower originals; when the
/// user changes those, the branch must show it as it does for unrenamed paths.
#[test]
fn lower_changes_show_through_a_directory_renamed_in_the_branch() {
    let _alone = namespaces_alone();
    let fx = open_fixture();
    fx.write("d2/f", "v1");
    fx.write("d2/gone", "g");
    fx.write("d2/sub/deep", "d1");
    let b = fx.branch();
    let m = b.mountpoint();
    fs::rename(m.join("d2"), m.join("d3")).unwrap();
    // Let the kernel cache all of it: contents, sizes, listings, a negative entry.
    assert_eq!(fs::read_to_string(m.join("d3/f")).unwrap(), "v1");
    assert_eq!(fs::read_to_string(m.join("d3/sub/deep")).unwrap(), "d1");
    assert_eq!(fs::read_dir(m.join("d3")).unwrap().count(), 3);
    assert!(!m.join("d3/appeared").exists());
    fx.write("d2/f", "v2, longer");
    fx.write("d2/sub/deep", "d2, longer");
    fx.write("d2/appeared", "new");
    fs::remove_file(fx.project.join("d2/gone")).unwrap();
    eventually("new size of a file under the renamed directory", || {
        fs::metadata(m.join("d3/f")).unwrap().len() == 10
    });
    assert_eq!(fs::read_to_string(m.join("d3/f")).unwrap(), "v2, longer");
    eventually("a file two levels under the renamed directory", || {
        fs::read_to_string(m.join("d3/sub/deep")).unwrap() == "d2, longer"
    });
    eventually("a file created in lower", || m.join("d3/appeared").exists());
    eventually("a file deleted in lower", || !m.join("d3/gone").exists());
    eventually("the listing", || {
        let mut names: Vec<_> = fs::read_dir(m.join("d3"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names == ["appeared", "f", "sub"]
    });
    assert!(
        !m.join("d2").exists(),
        "the old name stays gone in the branch"
    );
    println!("fidelity: lower changes under a directory renamed in the branch show through");
}

/// A user (no mount(2)) gets a branch through the setuid fusermount3, as libfuse does; where
/// /dev/fuse is root-only, fusermount3 cannot help (it opens the device with the user's
/// rights) and shade says so in one line. The test gives /dev/fuse each mode in a private
/// mount namespace, whatever the machine's own, and runs shade there as nobody.
#[test]
fn a_user_mounts_through_fusermount3() {
    let _alone = namespaces_alone();
    let fx = open_fixture();
    fx.write("f.txt", "from lower\n");
    let home = fx.tmp.path().join("home");
    fs::create_dir(&home).unwrap();
    let bin = fx.tmp.path().join("shade");
    fs::copy(env!("CARGO_BIN_EXE_shade"), &bin).unwrap();
    fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).unwrap();
    for p in [&fx.project, &fx.project.join("f.txt"), &home] {
        std::os::unix::fs::chown(p, Some(65534), Some(65534)).unwrap();
    }
    let dev = fx.tmp.path().join("devs");
    let run = |mode: &str, cmd: &str| {
        let script = format!(
            "set -e; mkdir -p {dev}; mount -t tmpfs -o mode=755 devs {dev}; \
             mknod -m {mode} {dev}/fuse c 10 229; mount --bind {dev}/fuse /dev/fuse; \
             exec setpriv --reuid=nobody --regid=nogroup --clear-groups -- \
             env HOME={home} SHADE_STATE_DIR={home}/state {bin} run --accept -C {proj} -- \
             sh -c '{cmd}'",
            dev = dev.display(),
            home = home.display(),
            bin = bin.display(),
            proj = fx.project.display()
        );
        Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c", &script])
            .output()
            .unwrap()
    };
    let o = run("666", "cat f.txt; echo made > g.txt");
    assert!(o.status.success(), "{}", out(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "from lower\n",
        "{}",
        out(&o)
    );
    assert_eq!(fx.read("g.txt"), "made\n");
    let denied = run("600", "echo never > h.txt");
    let err = String::from_utf8_lossy(&denied.stderr);
    assert_eq!(denied.status.code(), Some(125), "{}", out(&denied));
    assert!(err.contains("cannot open /dev/fuse"), "{}", out(&denied));
    assert_eq!(err.lines().count(), 1, "{}", out(&denied));
    assert!(!fx.project.join("h.txt").exists());
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&*home.to_string_lossy()),
        "a mount was left behind"
    );
    println!(
        "non-root: /dev/fuse 0666 -> mounted through fusermount3, accepted ({}); 0600 -> {}",
        String::from_utf8_lossy(&o.stderr)
            .trim()
            .replace('\n', " | "),
        err.trim()
    );
}
