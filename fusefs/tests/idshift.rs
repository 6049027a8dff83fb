//! The FUSE id shift (issue 28, item 1) on a real mount: a branch created with
//! `BranchOptions::id_shift` is used by root of a user namespace that maps `0..65536` to
//! `BASE..`, as a confined command of root is. Inside, chown, chmod, create, rename, stat,
//! sticky directories, setgid inheritance and setuid dropping behave as on a local file
//! system; outside, the kernel sees the shifted ids; the branch stores the real ones.
//! Needs root (the test fails, loudly, without it).
#![allow(clippy::unwrap_used)]

use shade_fusefs::{Branch, BranchOptions, ChangeKind, IdShift, StateDir};
use std::ffi::CString;
use std::fs;
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

/// Host id of the namespace's root: far from any id the test machine uses.
const BASE: u32 = 1 << 30;

fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the id shift test must run as root (it makes a user namespace with a mapped range)"
    );
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: fds is valid for two ints.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both fds were just made and are owned here only.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// Wait up to `limit` for `fd` to be readable.
fn readable(fd: &OwnedFd, limit: Duration) -> bool {
    use std::os::fd::AsRawFd;
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, limit.as_millis() as i32) == 1 }
}

/// Run `script` with `sh -c` in `dir` as root of a new user namespace mapping ids
/// `0..65536` to `BASE..`: the exit status and what it printed (stdout and stderr).
/// Bounded: killed (its whole process group) after two minutes.
fn as_ns_root(dir: &Path, script: &str) -> (i32, String) {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    let cdir = CString::new(dir.as_os_str().as_bytes()).unwrap();
    let sh = CString::new("/bin/sh").unwrap();
    let args = [
        CString::new("sh").unwrap(),
        CString::new("-c").unwrap(),
        CString::new(script).unwrap(),
    ];
    let argv: Vec<*const libc::c_char> = args
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let (ready_r, ready_w) = pipe();
    let (go_r, go_w) = pipe();
    let (out_r, out_w) = pipe();
    // SAFETY: the child calls only async-signal-safe functions until exec or _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: raw syscalls on prepared buffers; no allocation, no locks.
        unsafe {
            libc::setpgid(0, 0);
            if libc::chdir(cdir.as_ptr()) != 0 {
                libc::_exit(90);
            }
            if libc::unshare(libc::CLONE_NEWUSER) != 0 {
                libc::_exit(91);
            }
            if libc::write(ready_w.as_raw_fd(), b"r".as_ptr().cast(), 1) != 1 {
                libc::_exit(92);
            }
            let mut b = 0u8;
            if libc::read(go_r.as_raw_fd(), (&mut b as *mut u8).cast(), 1) != 1 {
                libc::_exit(93);
            }
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setresgid(0, 0, 0) != 0
                || libc::setresuid(0, 0, 0) != 0
            {
                libc::_exit(94);
            }
            libc::dup2(out_w.as_raw_fd(), 1);
            libc::dup2(out_w.as_raw_fd(), 2);
            libc::execv(sh.as_ptr(), argv.as_ptr());
            libc::_exit(95);
        }
    }
    drop((ready_w, go_r, out_w));
    let kill = || {
        // SAFETY: signals to the child we made and its process group.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
            libc::kill(pid, libc::SIGKILL);
        }
    };
    let reap = |limit: Duration| -> Option<i32> {
        let end = Instant::now() + limit;
        loop {
            let mut status = 0;
            // SAFETY: waiting on our own child.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r == pid {
                return Some(if libc::WIFEXITED(status) {
                    libc::WEXITSTATUS(status)
                } else {
                    128 + libc::WTERMSIG(status)
                });
            }
            if Instant::now() > end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    if !readable(&ready_r, Duration::from_secs(30)) {
        kill();
        let code = reap(Duration::from_secs(10));
        panic!("the child never made its user namespace (exit {code:?})");
    }
    let map = format!("0 {BASE} 65536\n");
    let maps = fs::write(format!("/proc/{pid}/uid_map"), &map)
        .and_then(|()| fs::write(format!("/proc/{pid}/gid_map"), &map));
    if let Err(e) = maps {
        kill();
        reap(Duration::from_secs(10));
        panic!("writing the child's id maps failed: {e}");
    }
    let mut go = fs::File::from(go_w);
    std::io::Write::write_all(&mut go, b"g").unwrap();
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        let _ = fs::File::from(out_r).read_to_string(&mut out);
        out
    });
    let code = reap(Duration::from_secs(120));
    // Whatever it left behind goes too, so the reader sees the end of its output.
    kill();
    let code = code.unwrap_or_else(|| {
        reap(Duration::from_secs(10));
        panic!("the script in the user namespace did not finish in 2 minutes");
    });
    (code, reader.join().unwrap())
}

#[test]
fn a_shifted_branch_is_a_local_file_system_inside_and_stores_real_ids() {
    require_root();
    let top = tempfile::Builder::new()
        .prefix("shade-idshift-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let project = top.path().join("project");
    fs::create_dir(&project).unwrap();
    fs::set_permissions(&project, fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(project.join("lower.txt"), "lower\n").unwrap();
    fs::set_permissions(project.join("lower.txt"), fs::Permissions::from_mode(0o644)).unwrap();
    let branch = Branch::create(
        &project,
        &BranchOptions {
            state: StateDir::at(top.path().join("state")),
            memory_budget: 1 << 20,
            allow_other: true,
            threads: 2,
            id_shift: Some(IdShift { base: BASE }),
        },
    )
    .unwrap();
    let mnt = branch.mountpoint().to_path_buf();

    // The kernel sees the shift: root's file is the namespace root's.
    let m = fs::metadata(mnt.join("lower.txt")).unwrap();
    assert_eq!((m.uid(), m.gid()), (BASE, BASE));

    let script = r#"
        set -e
        stat -c 'lower %u:%g' lower.txt
        echo new > new.txt
        stat -c 'new %u:%g' new.txt
        chown 4242:4243 new.txt
        chmod 640 new.txt
        mkdir d
        chown 7:8 d
        mv new.txt d/moved.txt
        stat -c 'moved %u:%g %a' d/moved.txt
        chown 55:56 lower.txt
        stat -c 'chowned %u:%g' lower.txt
        if chown 70000 lower.txt 2>/dev/null; then echo unmapped-chown-passed; fi
        mkdir t
        chmod 1777 t
        setpriv --reuid=4242 --regid=4243 --clear-groups sh -c 'echo x > t/by4242'
        stat -c 'by %u:%g' t/by4242
        if setpriv --reuid=4244 --regid=4244 --clear-groups rm -f t/by4242 2>/dev/null; then
            echo sticky-bypassed
        fi
        if setpriv --reuid=4244 --regid=4244 --clear-groups sh -c 'echo y > d/moved.txt' 2>/dev/null; then
            echo mode-bypassed
        fi
        mkdir g
        chown 0:77 g
        chmod 2775 g
        touch g/f
        stat -c 'setgid %g' g/f
        echo z > s
        chmod 4777 s
        setpriv --reuid=4244 --regid=4244 --clear-groups sh -c 'echo z >> s'
        stat -c 'suid %a' s
        echo done
    "#;
    let (code, out) = as_ns_root(&mnt, script);
    assert_eq!(code, 0, "the script failed:\n{out}");
    for want in [
        "lower 0:0",
        "new 0:0",
        "moved 4242:4243 640",
        "chowned 55:56",
        "by 4242:4243",
        "setgid 77",
        "suid 777",
        "done",
    ] {
        assert!(
            out.lines().any(|l| l == want),
            "missing {want:?} in:\n{out}"
        );
    }
    for bad in ["unmapped-chown-passed", "sticky-bypassed", "mode-bypassed"] {
        assert!(!out.contains(bad), "{bad}:\n{out}");
    }

    // Outside, the same files show shifted.
    let m = fs::metadata(mnt.join("d/moved.txt")).unwrap();
    assert_eq!((m.uid(), m.gid()), (BASE + 4242, BASE + 4243));
    let m = fs::metadata(mnt.join("lower.txt")).unwrap();
    assert_eq!((m.uid(), m.gid()), (BASE + 55, BASE + 56));

    // A caller the shift does not map (root outside) creates nothing: no id to own it by.
    let e = fs::write(mnt.join("host.txt"), "x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EOVERFLOW), "{e}");
    // system.* attributes are not the branch's to keep.
    let path = CString::new(mnt.join("lower.txt").as_os_str().to_str().unwrap()).unwrap();
    let name = CString::new("system.shade_test").unwrap();
    // SAFETY: valid C strings and a one-byte value.
    let r = unsafe { libc::setxattr(path.as_ptr(), name.as_ptr(), b"1".as_ptr().cast(), 1, 0) };
    assert_eq!(r, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EOPNOTSUPP)
    );

    // What the branch stores is real: the changeset says lower.txt went from 0:0 to 55:56.
    let changes = branch.changeset(false);
    let lower = changes
        .changes
        .iter()
        .find(|c| c.path == Path::new("lower.txt"))
        .unwrap();
    assert_eq!(lower.kind, ChangeKind::Modified);
    assert_eq!(lower.owner, Some(((0, 0), (55, 56))));
    drop(branch);
}
