//! The per-project branch server (`src/branch_server`), through the real binary: `shade
//! run`s share one server and its warm connections, a reused connection carries nothing of
//! the branch before, and the server's lifecycle (idle exit, `kill -9`, killed clients,
//! other builds) leaves nothing behind. Needs root and /dev/fuse (fails loudly without).
#![allow(clippy::unwrap_used)]

mod common;

use common::{stop_branch_servers, wait_until, Fixture};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// A fixture whose `shade run`s use the branch server (the common fixture turns it off),
/// ending its servers when dropped.
struct Served {
    fx: Fixture,
    /// Its `shade`s run as the plain test user (who owns the fixture then).
    plain: bool,
    /// One test of this file at a time: a command running in another test's sandbox holds
    /// copies of every mount that existed when it started (its stage's mount namespace), so
    /// the server rightly does not reuse a connection then — and these tests watch reuse.
    _serial: std::sync::MutexGuard<'static, ()>,
}

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Every process in a mount namespace other than ours, with its command line: a copy of a
/// connection's mount there keeps the server from reusing the connection.
fn other_mount_namespaces() -> String {
    let ours = std::fs::read_link("/proc/self/ns/mnt").ok();
    let mut out = String::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let p = e.path();
        let Ok(ns) = std::fs::read_link(p.join("ns/mnt")) else {
            continue;
        };
        if Some(&ns) != ours.as_ref() {
            if kernel_thread(&p) {
                // kdevtmpfs has a namespace of its own for good.
                continue;
            }
            // Empty for a process that is exiting (its memory already gone, its
            // namespaces not yet): it still counts.
            let cmd = std::fs::read(p.join("cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            out.push_str(&format!("{} {} {cmd}\n", p.display(), ns.display()));
        }
    }
    out
}

/// Whether `/proc/PID` is a kernel thread (`PF_KTHREAD` in its flags).
fn kernel_thread(proc_pid: &Path) -> bool {
    const PF_KTHREAD: u64 = 0x0020_0000;
    std::fs::read_to_string(proc_pid.join("stat"))
        .ok()
        .and_then(|s| {
            let rest = s.rsplit_once(") ")?.1;
            // Field 9 (flags) is the 7th after the state.
            rest.split(' ').nth(6)?.parse::<u64>().ok()
        })
        .is_some_and(|f| f & PF_KTHREAD != 0)
}

/// Wait (at most 10 s, then 200 ms more) until no process is in another mount namespace:
/// the last command's sandbox namespaces may still be going, and while they hold a copy of
/// its connection's mount the server rightly gives the next branch a fresh connection.
fn settle() {
    let start = std::time::Instant::now();
    while !other_mount_namespaces().is_empty() && start.elapsed().as_secs() < 10 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
}

/// What a run's debug log says of its branch.
#[derive(Debug, PartialEq)]
struct Via {
    server_pid: u32,
    reused: bool,
}

impl Served {
    fn new() -> Served {
        let serial = serial();
        Served {
            fx: Fixture::new(),
            plain: false,
            _serial: serial,
        }
    }

    /// A fixture of the plain test user's, whose `shade`s run as that user.
    fn plain() -> Served {
        let serial = serial();
        let fx = Fixture::new();
        common::plain::require_fuse();
        std::fs::create_dir_all(fx.state.root()).unwrap();
        common::plain::chown_tree(fx.tmp.path());
        Served {
            fx,
            plain: true,
            _serial: serial,
        }
    }

    fn state(&self) -> PathBuf {
        self.fx.state.root().to_path_buf()
    }

    fn shade_with(&self, bin: &Path) -> Command {
        let mut c = self.fx.shade();
        c.env_remove("SHADE_BRANCH_SERVER")
            .env(
                "SHADE_LOG",
                "shade::branch_server=debug,shade_fusefs::served=debug,shade_fusefs::pool=debug",
            )
            .env("NO_COLOR", "1");
        // Same environment and directory, another binary.
        let mut out = if self.plain {
            let argv = common::plain::argv(&bin.to_string_lossy());
            let mut c = Command::new(&argv[0]);
            c.args(&argv[1..]);
            c
        } else {
            Command::new(bin)
        };
        for (k, v) in c.get_envs() {
            match v {
                Some(v) => out.env(k, v),
                None => out.env_remove(k),
            };
        }
        out.current_dir(&self.fx.project).stdin(Stdio::null());
        out
    }

    fn shade(&self) -> Command {
        self.shade_with(Path::new(env!("CARGO_BIN_EXE_shade")))
    }

    /// `shade run -- sh -c script`, with how its branch was served.
    fn run(&self, script: &str) -> (Output, Via) {
        let o = self
            .shade()
            .args(["run", "--", "sh", "-c", script])
            .output()
            .unwrap();
        let via = via(&o);
        (o, via)
    }

    /// `run` of a read-only `script` until its branch is served by a reused connection (at
    /// most 5 runs): reuse is refused while anything may still hold the connection — an
    /// instant after a command ends, its stage's mount namespace (a copy of the mount) may
    /// still be going away. Panics when no run reused one.
    fn run_reused(&self, script: &str) -> (Output, Via) {
        let mut seen = Vec::new();
        for _ in 0..8 {
            let (o, v) = self.run(script);
            if v.reused {
                return (o, v);
            }
            let why: Vec<String> = plain(&o.stderr)
                .lines()
                .filter(|l| l.contains("not pooling") || l.contains("not to be reused"))
                .map(str::to_string)
                .collect();
            seen.push(format!("{v:?} {why:?}"));
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        panic!(
            "no run reused a connection: {seen:#?}\nthe servers' logs:\n{}\n\
             processes in other mount namespaces:\n{}",
            self.server_logs(),
            other_mount_namespaces()
        );
    }

    /// What the fixture's branch servers logged (why a connection was not pooled).
    fn server_logs(&self) -> String {
        let mut out = String::new();
        if let Ok(d) = std::fs::read_dir(self.state().join("servers")) {
            for e in d
                .flatten()
                .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
            {
                let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                out.push_str(&format!("== {}\n{text}", e.path().display()));
            }
        }
        out
    }

    /// The project's file systems entries (without .git), with mode, size and content.
    fn native(&self, script: &str) -> String {
        let o = Command::new("sh")
            .args(["-c", script])
            .current_dir(&self.fx.project)
            .output()
            .unwrap();
        assert!(o.status.success());
        String::from_utf8(o.stdout).unwrap()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        stop_branch_servers(&self.state());
    }
}

/// Text without terminal colour escapes.
fn plain(s: &[u8]) -> String {
    let s = String::from_utf8_lossy(s);
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The server pid and reuse from the client's debug line; panics when the branch was not
/// served (as on a build without the server).
fn via(o: &Output) -> Via {
    let err = plain(&o.stderr);
    let line = err
        .lines()
        .find(|l| l.contains("branch served by the branch server"))
        .unwrap_or_else(|| panic!("the branch was not served by a branch server:\n{err}"));
    let field = |name: &str| -> String {
        let at = line.find(&format!("{name}=")).unwrap() + name.len() + 1;
        line[at..]
            .chars()
            .take_while(|c| !c.is_whitespace())
            .collect()
    };
    Via {
        server_pid: field("server_pid").parse().unwrap(),
        reused: field("reused_connection") == "true",
    }
}

fn ok(o: &Output) {
    assert!(
        o.status.success(),
        "shade failed: {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        plain(&o.stderr)
    );
}

/// Alive and not a zombie.
/// Whether the process `pid` still holds anything: a zombie thread-group leader whose other
/// threads are still exiting still has its descriptors (the server's socket and lock), so
/// it counts as alive until it is the only task left.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let zombie = stat
                .rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('Z'));
            let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
                .map(|d| d.count())
                .unwrap_or(0);
            !zombie || tasks > 1
        }
        Err(_) => false,
    }
}

fn mounts_below(dir: &Path) -> Vec<String> {
    let root = dir.to_string_lossy().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains(&root))
        .map(str::to_string)
        .collect()
}

fn sockets(state: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(state.join("servers"))
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "sock"))
                .collect()
        })
        .unwrap_or_default()
}

fn kill9(pid: u32) {
    // SAFETY: kill(2) with a pid and a signal.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    wait_until("the killed server to be gone", 20, || !alive(pid));
}

#[test]
fn runs_share_a_server_and_a_warm_connection() {
    let s = Served::new();
    s.fx.write("file", "orig\n");
    let (o1, v1) = s.run("cat file");
    ok(&o1);
    assert!(
        !v1.reused,
        "the first branch has a fresh connection: {v1:?}"
    );
    let (o2, v2) = s.run_reused("cat file");
    ok(&o2);
    assert_eq!(v2.server_pid, v1.server_pid, "one server for both runs");
    assert!(
        v2.reused,
        "the second branch is served by the first one's connection"
    );
    assert_eq!(String::from_utf8_lossy(&o2.stdout), "orig\n");
    assert!(alive(v1.server_pid));
    // The server's socket is in the state directory, which the sandbox hides.
    let socket = sockets(&s.state()).pop().unwrap();
    let (o3, _) = s.run(&format!("test ! -e '{}'", socket.display()));
    ok(&o3);
}

#[test]
fn a_reused_connection_carries_nothing_of_the_branch_before() {
    let s = Served::new();
    s.fx.write("a.txt", "A\n");
    s.fx.write("b.txt", "B\n");
    s.fx.write("d/c.txt", "C\n");
    s.fx.write("e.txt", "E\n");
    s.fx.write("f.txt", "F\n");
    // Everything there is to see of the tree, one line per entry.
    let look = "for p in $(find . | sort); do stat -c '%n %F %a %s %h' \"$p\"; \
                if [ -f \"$p\" ]; then cat \"$p\"; fi; done; ls ghost 2>&1; true";
    let (o1, v1) = s.run(
        "echo changed > a.txt && rm b.txt && mv d d2 && chmod 600 e.txt && mkdir new && \
         echo n > new/n.txt && cat f.txt d2/c.txt >/dev/null && \
         ! stat ghost 2>/dev/null && ls -la . d2 >/dev/null && echo more >> f.txt && \
         cat f.txt >/dev/null",
    );
    ok(&o1);
    assert!(!v1.reused);
    // Between the runs the user changes a file the branch read (and cached) and creates
    // the name the branch found missing.
    s.fx.write("e.txt", "E, edited by the user\n");
    s.fx.write("ghost", "now here\n");
    settle();
    let (o2, v2) = s.run(look);
    ok(&o2);
    assert!(
        v2.reused,
        "the second branch must reuse the connection: {v2:?}\nthe servers' logs:\n{}\n\
         processes in other mount namespaces:\n{}",
        s.server_logs(),
        other_mount_namespaces()
    );
    assert_eq!(
        String::from_utf8_lossy(&o2.stdout),
        s.native(look),
        "the reused connection shows something else than the project"
    );
    assert!(
        !plain(&o2.stderr).lines().any(|l| l.starts_with("M ")
            || l.starts_with("A ")
            || l.starts_with("D ")
            || l.starts_with("R ")),
        "a reading command changed nothing:\n{}",
        plain(&o2.stderr)
    );
}

#[test]
fn kill_9_of_the_server_leaves_nothing_run_and_recover_do_not_clean() {
    let s = Served::new();
    s.fx.write("file", "orig\n");
    let (o1, v1) = s.run("echo x > file");
    ok(&o1);
    assert!(!mounts_below(&s.state()).is_empty(), "a pooled connection");
    kill9(v1.server_pid);
    // The next run cleans up what the dead server left and gets a new one.
    let (o2, v2) = s.run("cat file");
    ok(&o2);
    assert_ne!(v2.server_pid, v1.server_pid);
    assert!(!v2.reused, "nothing of the dead server is reused");
    assert_eq!(String::from_utf8_lossy(&o2.stdout), "orig\n");
    let left: Vec<String> = mounts_below(&s.state())
        .into_iter()
        .filter(|l| l.contains(&format!("shade:{}-", v1.server_pid)))
        .collect();
    assert!(left.is_empty(), "the dead server's mounts stay: {left:#?}");
    kill9(v2.server_pid);
    // Its listening socket goes with the last of its descriptors, not with its pid.
    wait_until("the dead server's socket to refuse connections", 20, || {
        sockets(&s.state()).iter().all(|p| {
            matches!(std::os::unix::net::UnixStream::connect(p),
                Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED))
        })
    });
    let r = s.shade().arg("recover").output().unwrap();
    ok(&r);
    assert_eq!(mounts_below(&s.state()), Vec::<String>::new());
    assert_eq!(
        std::fs::read_dir(s.fx.state.branches()).unwrap().count(),
        0,
        "branch directories left"
    );
    assert_eq!(sockets(&s.state()), Vec::<PathBuf>::new());
    assert_eq!(s.fx.read("file"), "orig\n");
}

#[test]
fn the_server_exits_when_idle() {
    let s = Served::new();
    s.fx.write("file", "orig\n");
    let o = s
        .shade()
        .env("SHADE_BRANCH_SERVER_IDLE", "1")
        .args(["run", "--", "cat", "file"])
        .output()
        .unwrap();
    ok(&o);
    let v = via(&o);
    wait_until("the idle server to exit", 60, || !alive(v.server_pid));
    assert_eq!(mounts_below(&s.state()), Vec::<String>::new());
    assert_eq!(sockets(&s.state()), Vec::<PathBuf>::new());
    assert_eq!(
        std::fs::read_dir(s.fx.state.branches()).unwrap().count(),
        0,
        "the pool's connections went with it"
    );
}

#[test]
fn a_killed_client_leaves_the_project_and_the_server_alone() {
    let s = Served::new();
    s.fx.write("file", "orig\n");
    s.fx.write("other", "other\n");
    let ready = s.fx.tmp.path().join("ready");
    let mut child = s
        .shade()
        .args(["run", "--accept", "--", "sh", "-c"])
        .arg(format!(
            "echo x > file; rm other; echo up > {}; sleep 100",
            ready.display()
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("the command to start", 30, || ready.exists());
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(s.fx.read("file"), "orig\n");
    assert_eq!(s.fx.read("other"), "other\n");
    let v1 = via(&out);
    assert!(alive(v1.server_pid), "the server survives its client");
    // Its branch is aborted, not pooled: a process of the command that outlived the client
    // must not see the next branch through it.
    wait_until("the killed client's branch to be unmounted", 20, || {
        mounts_below(&s.state()).is_empty()
    });
    let (o2, v2) = s.run("cat file other");
    ok(&o2);
    assert_eq!(v2.server_pid, v1.server_pid, "the same server serves on");
    assert_eq!(String::from_utf8_lossy(&o2.stdout), "orig\nother\n");
    assert_eq!(s.fx.read("file"), "orig\n");
}

#[test]
fn another_build_gets_its_own_server() {
    let s = Served::new();
    s.fx.write("file", "orig\n");
    let dir = s.fx.tmp.path().join("other-build");
    std::fs::create_dir(&dir).unwrap();
    let other = dir.join("shade");
    std::fs::copy(env!("CARGO_BIN_EXE_shade"), &other).unwrap();
    std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Another modification time: what a rebuild of the same version gives.
    let t = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&other)
        .unwrap()
        .set_modified(t)
        .unwrap();
    let (o1, v1) = s.run("cat file");
    ok(&o1);
    let o2 = s
        .shade_with(&other)
        .args(["run", "--", "cat", "file"])
        .output()
        .unwrap();
    ok(&o2);
    let v2 = via(&o2);
    assert_ne!(
        v1.server_pid, v2.server_pid,
        "each build has its own server"
    );
    assert!(!v2.reused);
    assert_eq!(sockets(&s.state()).len(), 2);
    let (o3, v3) = s.run("cat file");
    ok(&o3);
    assert_eq!(v3.server_pid, v1.server_pid);
}

#[test]
fn a_client_in_another_mount_namespace_gets_its_own_server() {
    let s = Served::new();
    s.fx.write("file", "orig\n");
    let (o1, v1) = s.run("cat file");
    ok(&o1);
    // The first server's mounts are in its namespace; a client in another one could not
    // bind them (it would bind an empty directory over the project).
    let c = s.shade();
    let o2 = Command::new("unshare")
        .args(["-m", "--propagation", "private", "--"])
        .arg(c.get_program())
        .args(["run", "--", "sh", "-c", "cat file; echo new > made"])
        .envs(c.get_envs().filter_map(|(k, v)| v.map(|v| (k, v))))
        .current_dir(&s.fx.project)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    ok(&o2);
    let v2 = via(&o2);
    assert_ne!(
        v2.server_pid, v1.server_pid,
        "another namespace, another server"
    );
    assert_eq!(String::from_utf8_lossy(&o2.stdout), "orig\n");
    assert!(
        plain(&o2.stderr).contains("A made"),
        "{}",
        plain(&o2.stderr)
    );
}

#[test]
fn a_server_that_cannot_start_leaves_the_branch_in_process() {
    let s = Served::new();
    s.fx.write("file", "orig\n");
    // Where the servers' directory should be, a file: no server can start.
    std::fs::create_dir_all(s.state()).unwrap();
    std::fs::write(s.state().join("servers"), "not a directory").unwrap();
    let o = s
        .shade()
        .args(["run", "--", "sh", "-c", "cat file; echo new > made"])
        .output()
        .unwrap();
    ok(&o);
    let err = plain(&o.stderr);
    assert!(!err.contains("branch served by the branch server"), "{err}");
    assert!(err.contains("branch server unavailable"), "{err}");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "orig\n");
    assert!(err.contains("A made"), "{err}");
    assert_eq!(mounts_below(&s.state()), Vec::<String>::new());
}

/// What opening `name` beneath `dir` gives a process of the fixture's user (a user's
/// mount is not root's to enter): "open", or the errno's name.
fn open_beneath_as(s: &Served, dir: &std::os::fd::OwnedFd, name: &str) -> String {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let mut c = Command::new("/usr/bin/python3");
    c.args([
        "-c",
        &format!(
            "import os, errno\ntry:\n    os.open({name:?}, os.O_RDONLY, dir_fd=3)\n    \
             print('open')\nexcept OSError as e:\n    print(errno.errorcode[e.errno])\n"
        ),
    ]);
    if s.plain {
        let (uid, gid) = common::plain::ids();
        c.uid(uid).gid(gid);
    }
    let raw = dir.as_raw_fd();
    // SAFETY: only dup2 and fcntl between fork and exec.
    unsafe {
        c.pre_exec(move || {
            if raw == 3 {
                libc::fcntl(3, libc::F_SETFD, 0);
            } else if libc::dup2(raw, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let o = c.output().unwrap();
    assert!(o.status.success(), "{}", plain(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Stands for the host socket's path in a case's flags.
const HOST_SOCKET: &str = "@HOST_SOCKET@";

/// One descriptor received over `s` (SCM_RIGHTS).
fn recv_fd(s: &std::os::unix::net::UnixStream) -> std::os::fd::OwnedFd {
    use std::os::fd::{AsRawFd, FromRawFd};
    let mut buf = [0u8; 16];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control = [0u64; 8];
    // SAFETY: a zeroed msghdr pointing at buffers that outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: recvmsg into the buffers above.
    let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    assert!(n > 0, "recvmsg: {}", std::io::Error::last_os_error());
    // SAFETY: the control buffer recvmsg filled.
    let c = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    assert!(!c.is_null(), "no descriptor came");
    // SAFETY: an SCM_RIGHTS message holds at least one int, a descriptor now ours.
    unsafe {
        assert_eq!((*c).cmsg_type, libc::SCM_RIGHTS);
        std::os::fd::OwnedFd::from_raw_fd(std::ptr::read_unaligned(
            libc::CMSG_DATA(c).cast::<i32>(),
        ))
    }
}

/// A run that passes a descriptor of its branch root to a host process, which leaves it
/// unread in its socket's queue (no fd in `/proc`, no FUSE handle: only the client, whose
/// sandbox ran the command, knows it could): its connection is aborted, never pooled, and
/// the next run gets a fresh one (red team h9/2).
fn a_run_that_could_pass_out_a_descriptor_is_not_followed_by_its_connection(
    s: Served,
    flags: &[&str],
    why: &str,
) {
    s.fx.write("a.txt", "A\n");
    if s.plain {
        common::plain::chown_tree(&s.fx.project);
    }
    let sock = s.fx.tmp.path().join("host.sock");
    let flags: Vec<String> = flags
        .iter()
        .map(|f| f.replace(HOST_SOCKET, &sock.to_string_lossy()))
        .collect();
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o777)).unwrap();
    let send = format!(
        "import socket, os, array; s = socket.socket(socket.AF_UNIX); s.connect({sock:?}); \
         fd = os.open('.', os.O_PATH); \
         s.sendmsg([b'x'], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array('i', [fd]))])"
    );
    let o1 = s
        .shade()
        .arg("run")
        .args(&flags)
        .args(["--", "/usr/bin/python3", "-c", &send])
        .output()
        .unwrap();
    ok(&o1);
    let v1 = via(&o1);
    let err1 = plain(&o1.stderr);
    assert!(
        err1.contains(&format!("the connection is not to be reused: {why}")),
        "{err1}"
    );
    // The run is over and its branch dropped; the descriptor it sent leads nowhere now.
    let (conn, _) = listener.accept().unwrap();
    let root = recv_fd(&conn);
    assert_eq!(
        open_beneath_as(&s, &root, "a.txt"),
        "ENOTCONN\n",
        "the passed-out descriptor still reaches a connection"
    );
    let (o2, v2) = s.run("echo secret > n2.txt; cat a.txt");
    ok(&o2);
    assert_eq!(v2.server_pid, v1.server_pid, "the same server serves on");
    assert!(!v2.reused, "run 2 got run 1's connection: {v2:?}");
    assert_eq!(String::from_utf8_lossy(&o2.stdout), "A\n");
    // A contained run's connection is still handed on.
    let (o3, v3) = s.run_reused("cat a.txt; test ! -e n2.txt");
    ok(&o3);
    assert!(v3.reused, "a contained run's connection is pooled: {v3:?}");
}

#[test]
fn a_run_with_an_allowed_socket_is_not_followed_by_its_connection() {
    // One after the other: each fixture holds this file's serial lock.
    for make in [Served::new as fn() -> Served, Served::plain] {
        let s = make();
        a_run_that_could_pass_out_a_descriptor_is_not_followed_by_its_connection(
            s,
            &["--allow-socket", HOST_SOCKET],
            "a command with an allowed socket ran on it",
        );
    }
}

#[test]
fn an_unconfined_run_is_not_followed_by_its_connection() {
    // One after the other: each fixture holds this file's serial lock.
    for make in [Served::new as fn() -> Served, Served::plain] {
        let s = make();
        a_run_that_could_pass_out_a_descriptor_is_not_followed_by_its_connection(
            s,
            &["--unconfined"],
            "the caller keeps it from being reused",
        );
    }
}

#[test]
fn a_servers_directory_of_another_user_is_refused() {
    let s = Served::new();
    s.fx.write("file", "orig\n");
    let (uid, gid) = common::plain::ids();
    let dir = s.state().join("servers");
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let o = s
        .shade()
        .args(["run", "--", "sh", "-c", "cat file; echo new > made"])
        .output()
        .unwrap();
    ok(&o);
    let err = plain(&o.stderr);
    assert!(!err.contains("branch served by the branch server"), "{err}");
    assert!(
        err.contains(&format!("belongs to uid {uid}, not 0")),
        "{err}"
    );
    assert_eq!(String::from_utf8_lossy(&o.stdout), "orig\n");
    assert!(err.contains("A made"), "{err}");
    // Nothing made in it, nothing changed of it.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    let m = std::fs::metadata(&dir).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!((m.uid(), m.mode() & 0o7777), (uid, 0o700));
}

#[test]
fn a_server_socket_listened_on_by_another_user_is_refused() {
    use std::io::BufRead;
    let s = Served::new();
    s.fx.write("file", "orig\n");
    let (o1, v1) = s.run("cat file");
    ok(&o1);
    let sock = sockets(&s.state()).pop().unwrap();
    stop_branch_servers(&s.state());
    wait_until("the server to exit", 30, || !alive(v1.server_pid));
    // Where the server listened, a socket file of root's, listened on by the plain user:
    // only SO_PEERCRED tells.
    let (uid, gid) = common::plain::ids();
    let py = format!(
        "import socket, os, sys\ns = socket.socket(socket.AF_UNIX)\ns.bind({sock:?})\n\
         os.chmod({sock:?}, 0o600)\nos.setgid({gid})\nos.setuid({uid})\ns.listen(8)\n\
         print('ready', flush=True)\nsys.stdin.read()\n"
    );
    let mut fake = Command::new("python3")
        .args(["-c", &py])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(fake.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n");
    let o = s
        .shade()
        .args(["run", "--", "sh", "-c", "cat file; echo new > made"])
        .output()
        .unwrap();
    drop(fake.stdin.take());
    fake.wait().unwrap();
    ok(&o);
    let err = plain(&o.stderr);
    assert!(!err.contains("branch served by the branch server"), "{err}");
    assert!(
        err.contains(&format!("is served by uid {uid}, not 0")),
        "{err}"
    );
    assert_eq!(String::from_utf8_lossy(&o.stdout), "orig\n");
    assert!(err.contains("A made"), "{err}");
}

/// A server that accepts but never answers (here: stopped) does not hang `shade run`: after
/// the create timeout the branch is made in-process, the command runs and its result is
/// right; the stopped server, continued, still serves the next run.
#[test]
fn a_server_that_does_not_answer_does_not_hang_the_run() {
    let s = Served::new();
    s.fx.write("file", "orig\n");
    let (o1, v1) = s.run("cat file");
    ok(&o1);
    // SAFETY: kill(2) with a pid and a signal.
    assert_eq!(
        unsafe { libc::kill(v1.server_pid as i32, libc::SIGSTOP) },
        0
    );
    let o2 = s
        .shade()
        .args(["run", "--", "sh", "-c", "echo new > file; cat file"])
        .output()
        .unwrap();
    // SAFETY: as above.
    assert_eq!(
        unsafe { libc::kill(v1.server_pid as i32, libc::SIGCONT) },
        0
    );
    ok(&o2);
    let err = plain(&o2.stderr);
    assert!(
        err.contains("no answer in") && err.contains("the branch is made in-process"),
        "the run did not fall back to an in-process branch:\n{err}"
    );
    assert_eq!(String::from_utf8_lossy(&o2.stdout), "new\n");
    assert_eq!(s.fx.read("file"), "orig\n", "a run without --accept wrote");
    let (o3, v3) = s.run("cat file");
    ok(&o3);
    assert_eq!(
        v3.server_pid, v1.server_pid,
        "the continued server serves again"
    );
}
