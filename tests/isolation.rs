//! A command in a branch cannot get out (issue 18): one test per route an attacker would
//! take, each run against the real `shade` binary, as root and as a plain user (`shadetest`,
//! created by scripts/setup.sh). Each asserts that the real project still says "orig" and
//! that nothing was written where the command had no business writing.
//!
//! These tests need root (to become the plain user, and for the root half), /dev/fuse usable
//! by the plain user, bubblewrap and python3; they fail loudly where something is missing.
#![allow(clippy::unwrap_used)]

mod common;

use common::describe as show;
use common::plain::{copy_of as plain_copy, ids as plain_ids, PLAIN};

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

/// The plain user the tests run as (scripts/setup.sh creates it).
/// Python with nothing but the standard library, readable by every user.
const PYTHON: &str = "/usr/bin/python3";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Who {
    Root,
    Plain,
}

/// A project (with `file` = "orig"), a state dir and an evidence dir outside both, all
/// owned by the user the test runs as, under /var/tmp.
struct Env {
    who: Who,
    _tmp: tempfile::TempDir,
    project: PathBuf,
    state: PathBuf,
    /// Writable by the command's user and outside the project: where an escape leaves proof.
    out: PathBuf,
}

fn env(who: Who) -> Env {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the isolation tests run as root (they also become the plain user {PLAIN})"
    );
    for tool in [PYTHON, "/usr/bin/setpriv", "/usr/bin/nsenter"] {
        assert!(
            Path::new(tool).exists(),
            "{tool} is missing: run scripts/setup.sh"
        );
    }
    let tmp = tempfile::Builder::new()
        .prefix("shade-iso-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let root = tmp.path().canonicalize().unwrap();
    let (project, state, out) = (root.join("project"), root.join("state"), root.join("out"));
    let share = root.join("share");
    for d in [&project, &state, &out, &share] {
        std::fs::create_dir(d).unwrap();
    }
    // `out` (where an escape leaves its proof) and `share` are written by the command for
    // real, past its outside layer (SHADE_SHARE), by whatever id the sandbox's root is.
    for d in [&out, &share] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    std::fs::write(project.join("file"), "orig").unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    if who == Who::Plain {
        let (uid, gid) = plain_ids();
        for p in [&root, &project, &state, &out, &share, &project.join("file")] {
            std::os::unix::fs::chown(p, Some(uid), Some(gid)).unwrap();
        }
        common::plain::require_fuse();
    }
    Env {
        who,
        _tmp: tmp,
        project,
        state,
        out,
    }
}

impl Env {
    /// `shade` as this test's user, in the project, with its own state dir.
    fn shade(&self) -> Command {
        // SHADE_ISOLATION_BIN: run the same attacks against another build (to show that
        // they succeed against one without the sandbox).
        let bin = std::env::var("SHADE_ISOLATION_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_shade").to_string());
        let bin = match self.who {
            Who::Root => bin,
            Who::Plain => plain_copy(&bin).display().to_string(),
        };
        let bin = bin.as_str();
        let mut c = match self.who {
            Who::Root => Command::new(bin),
            Who::Plain => {
                let mut c = Command::new("/usr/bin/setpriv");
                c.args([
                    &format!("--reuid={PLAIN}"),
                    &format!("--regid={PLAIN}"),
                    "--init-groups",
                    "--",
                    bin,
                ]);
                c.env("HOME", format!("/home/{PLAIN}"));
                c
            }
        };
        let share = std::env::join_paths([self.out.clone(), self.out.join("../share")]).unwrap();
        c.env("SHADE_STATE_DIR", &self.state)
            .env("SHADE_SHARE", share)
            .env_remove("CARGO_TARGET_DIR")
            .current_dir(&self.project)
            .stdin(Stdio::null());
        c
    }

    fn run(&self, extra: &[&str], script: &str) -> Output {
        self.shade()
            .arg("run")
            .args(extra)
            .args(["--", "sh", "-c", script])
            .output()
            .unwrap()
    }

    fn p(&self) -> String {
        self.project.display().to_string()
    }

    fn o(&self) -> String {
        self.out.display().to_string()
    }

    /// The real project is as it was and no escape left proof in `out`.
    fn assert_held(&self, what: &Output) {
        let file = std::fs::read_to_string(self.project.join("file")).unwrap();
        let entries: Vec<String> = std::fs::read_dir(&self.project)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        let proof: Vec<(String, String)> = std::fs::read_dir(&self.out)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.file_name().to_string_lossy().into_owned(),
                    std::fs::read_to_string(e.path()).unwrap_or_default(),
                )
            })
            .collect();
        let log = show(what);
        assert_eq!(
            file, "orig",
            "the real project was written ({:?})\n{log}",
            self.who
        );
        assert_eq!(entries, ["file"], "the real project was changed\n{log}");
        assert!(
            proof.is_empty(),
            "the command got out ({:?}): {proof:?}\n{log}",
            self.who
        );
    }

    /// Unmount and clean up what a killed shade left (as its user).
    fn recover(&self) {
        let _ = self.shade().arg("recover").output();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        for line in mounts
            .lines()
            .filter(|l| l.contains(&*self.state.to_string_lossy()))
        {
            if let Some(mnt) = line.split(' ').nth(4) {
                let _ = nix::mount::umount2(mnt, nix::mount::MntFlags::MNT_DETACH);
            }
        }
    }
}

/// The branch servers `shade run` started for this test end (their sockets removed, they
/// unmount their pooled connections and exit) before the test's directories go.
impl Drop for Env {
    fn drop(&mut self) {
        common::stop_branch_servers(&self.state);
    }
}

/// The run itself worked (the attack ran and failed, rather than shade refusing to run).
fn ran(o: &Output) {
    assert!(
        o.status.code() == Some(0),
        "the command did not run to its end\n{}",
        show(o)
    );
}

/// Writing the project through shade's root: /proc/PID/root of the parent and of every
/// process the command can see.
fn proc_root(who: Who) {
    let e = env(who);
    let o = e.run(
        &[],
        &format!(
            r#"for p in $PPID /proc/[0-9]*; do p=${{p#/proc/}}; echo X > /proc/$p/root{P}/file; done 2>/dev/null; true"#,
            P = e.p(),
        ),
    );
    ran(&o);
    e.assert_held(&o);
}

/// Writing through shade's open directory descriptors (the lower's O_PATH fd).
fn proc_fds(who: Who) {
    let e = env(who);
    let o = e.run(
        &[],
        r#"for f in /proc/$PPID/fd/* /proc/[0-9]*/fd/*; do [ -d "$f" ] && echo X > "$f/file"; done 2>/dev/null; true"#,
    );
    ran(&o);
    // A directory fd of the command's own (its cwd) is the branch: writing there is fine,
    // but the real project must not change.
    e.assert_held(&o);
}

/// Unmounting the branch to write the real directory under it.
fn umount_project(who: Who) {
    let e = env(who);
    let o = e.run(
        &[],
        &format!(
            "umount -l {P} 2>/dev/null || umount {P} 2>/dev/null; echo X > {P}/file; true",
            P = e.p()
        ),
    );
    ran(&o);
    e.assert_held(&o);
}

/// Entering shade's (or init's) mount namespace.
fn nsenter_mount(who: Who) {
    let e = env(who);
    let o = e.run(
        &[],
        &format!(
            r#"for t in $PPID 1; do nsenter -t $t -m -- sh -c "echo X > {P}/file; echo X > {O}/nsenter-$t"; done 2>/dev/null; true"#,
            P = e.p(),
            O = e.o()
        ),
    );
    ran(&o);
    e.assert_held(&o);
}

/// chroot into shade's root.
fn chroot_parent(who: Who) {
    let e = env(who);
    let o = e.run(
        &[],
        &format!(
            r#"chroot /proc/$PPID/root sh -c "echo X > {P}/file" 2>/dev/null; true"#,
            P = e.p(),
        ),
    );
    ran(&o);
    e.assert_held(&o);
}

/// A daemon that leaves the command's session (and tries to leave its namespace) to write
/// after the run has ended.
fn daemon_outlives_run(who: Who) {
    let e = env(who);
    let o = e.run(
        &[],
        &format!(
            r#"setsid -f sh -c "sleep 2; echo X > {O}/late" ; setsid -f nsenter -t $PPID -m -- sh -c "sleep 2; echo X > {P}/file; echo X > {O}/late-ns" 2>/dev/null; sleep 1; true"#,
            P = e.p(),
            O = e.o()
        ),
    );
    ran(&o);
    std::thread::sleep(Duration::from_secs(4));
    e.assert_held(&o);
}

/// `kill -9` of shade takes the command and its daemons with it.
fn killed_shade_kills_the_sandbox(who: Who) {
    let e = env(who);
    let mut child: Child = e
        .shade()
        .args(["run", "--", "sh", "-c"])
        .arg(format!(
            r#"setsid -f sh -c "sleep 3; echo X > {O}/late9"; sh -c "sleep 3; echo X > {O}/late9-child" & echo up > {O}/ready; sleep 100"#,
            O = e.o()
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let ready = e.out.join("ready");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !ready.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the command never started"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::remove_file(&ready).unwrap();
    // SAFETY: kill(2) of our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let status = child.wait().unwrap();
    std::thread::sleep(Duration::from_secs(5));
    let o = Output {
        status,
        stdout: Vec::new(),
        stderr: Vec::new(),
    };
    e.recover();
    e.assert_held(&o);
}

/// `--no-network`, then back to the host's network through shade's or init's namespace,
/// to reach a server listening on the host's loopback.
fn no_network_reaches_host(who: Who) {
    let e = env(who);
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    server.set_nonblocking(true).unwrap();
    let port = server.local_addr().unwrap().port();
    let connect = format!(
        "{PYTHON} -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 2)'"
    );
    let o = e.run(
        &["--no-network"],
        &format!(
            r#"{connect} 2>/dev/null && echo direct > {O}/net; for t in $PPID 1; do nsenter -t $t -n -- {connect} 2>/dev/null && echo via-$t >> {O}/net; done; true"#,
            O = e.o()
        ),
    );
    ran(&o);
    let reached = server.accept().is_ok();
    e.assert_held(&o);
    assert!(!reached, "the host's server was reached\n{}", show(&o));
}

/// A raw disk device: root in a user namespace owning the device node could write the real
/// project's blocks. Only opened, never written.
fn raw_device(who: Who) {
    let e = env(who);
    let disk = std::fs::read_dir("/sys/class/block")
        .unwrap()
        .map(|d| d.unwrap().file_name().to_string_lossy().into_owned())
        .find(|n| Path::new(&format!("/dev/{n}")).exists())
        .expect("no block device to test with");
    let dev = std::fs::read_to_string(format!("/sys/class/block/{disk}/dev")).unwrap();
    let (major, minor) = dev.trim().split_once(':').unwrap();
    let probe = format!(
        r#"{PYTHON} -c '
import os, sys
for path in sys.argv[1:]:
    try:
        fd = os.open(path, os.O_RDWR)
        os.close(fd)
        open("{O}/device", "a").write(path + "\n")
    except OSError:
        pass
' /dev/{disk} {O}/../node"#,
        O = e.o()
    );
    let o = e.run(
        &[],
        &format!(
            "mknod {O}/../node b {major} {minor} 2>/dev/null; {probe}; true",
            O = e.o()
        ),
    );
    ran(&o);
    let _ = std::fs::remove_file(e.out.join("../node"));
    e.assert_held(&o);
}

/// ptrace of shade and reading its memory through /proc.
fn ptrace_shade(who: Who) {
    let e = env(who);
    let script = format!(
        r#"{PYTHON} -c '
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
me = os.getpid()
for p in os.listdir("/proc"):
    if not p.isdigit() or int(p) == me:
        continue
    try:
        comm = open("/proc/%s/comm" % p).read().strip()
    except OSError:
        continue
    if not comm.startswith("shade"):
        continue
    open("{O}/seen-shade", "a").write(p + "\n")
    if libc.ptrace(16, int(p), 0, 0) == 0:  # PTRACE_ATTACH
        open("{O}/ptrace", "a").write(p + "\n")
        # Let it go again, or a shade that allowed this would hang stopped.
        try:
            os.waitpid(int(p), 0x40000000)  # __WALL
        except OSError:
            pass
        libc.ptrace(17, int(p), 0, 0)  # PTRACE_DETACH
    try:
        maps = open("/proc/%s/maps" % p).readline()
        start = int(maps.split("-")[0], 16)
        with open("/proc/%s/mem" % p, "rb") as m:
            m.seek(start)
            m.read(16)
        open("{O}/mem", "a").write(p + "\n")
    except (OSError, ValueError):
        pass
'"#,
        O = e.o()
    );
    let o = e.run(&[], &script);
    ran(&o);
    e.assert_held(&o);
}

/// open_by_handle_at: opens any inode of a file system by its handle, past every mount.
fn open_by_handle(who: Who) {
    let e = env(who);
    // The handle of the real file, taken outside the sandbox.
    let helper = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
class H(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_uint), ("type", ctypes.c_int), ("f", ctypes.c_ubyte * 128)]
def handle(path):
    h = H(); h.bytes = 128; mid = ctypes.c_int()
    if libc.name_to_handle_at(-100, path.encode(), ctypes.byref(h), ctypes.byref(mid), 0) != 0:
        sys.exit("name_to_handle_at: %d" % ctypes.get_errno())
    print("%d %d %s" % (h.bytes, h.type, bytes(h.f[:h.bytes]).hex()))
def use(mount, n, t, data, out):
    h = H(); h.bytes = int(n); h.type = int(t)
    raw = bytes.fromhex(data)
    ctypes.memmove(h.f, raw, len(raw))
    mfd = os.open(mount, os.O_RDONLY)
    fd = libc.open_by_handle_at(mfd, ctypes.byref(h), os.O_WRONLY)
    if fd >= 0:
        os.write(fd, b"X")
        open(out, "a").write("opened\n")
if sys.argv[1] == "get":
    handle(sys.argv[2])
else:
    use(*sys.argv[2:])
"#;
    let helper_path = e.out.join("../handle.py");
    std::fs::write(&helper_path, helper).unwrap();
    let got = Command::new(PYTHON)
        .arg(&helper_path)
        .arg("get")
        .arg(e.project.join("file"))
        .output()
        .unwrap();
    assert!(got.status.success(), "{}", show(&got));
    let handle = String::from_utf8(got.stdout).unwrap();
    let o = e.run(
        &[],
        &format!(
            "{PYTHON} {helper} use / {handle} {O}/handle 2>/dev/null; true",
            helper = helper_path.display(),
            handle = handle.trim(),
            O = e.o()
        ),
    );
    ran(&o);
    e.assert_held(&o);
}

/// A forged accept journal in the state dir, which a later shade start would roll forward
/// into the real project.
fn forged_journal(who: Who) {
    let e = env(who);
    let o = e.run(
        &[],
        &format!(
            "mkdir -p {S}/journals 2>/dev/null && echo forged > {S}/journals/forged.json 2>/dev/null; ls {S}/branches/*/mnt > /dev/null 2>&1 && echo X > {O}/branches; true",
            S = e.state.display(),
            O = e.o()
        ),
    );
    ran(&o);
    assert!(
        !e.state.join("journals/forged.json").exists(),
        "the command wrote into shade's state dir\n{}",
        show(&o)
    );
    e.assert_held(&o);
}

/// What a command may hold: stdin, stdout and stderr. Nothing of shade's own, nor anything
/// shade itself inherited from whoever started it (the test harness, a shell, a terminal).
fn passed_on() -> Vec<i32> {
    vec![0, 1, 2]
}

/// The command inherits no descriptor of shade's: only stdin, stdout and stderr (not even
/// what the test itself passes on to shade, from whoever started it).
fn inherited_fds(who: Who) {
    let e = env(who);
    let o = e.run(&[], "ls /proc/$$/fd");
    ran(&o);
    let expected = passed_on();
    let mut got: Vec<i32> = String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .map(|f| f.parse().unwrap())
        .collect();
    got.sort();
    assert_eq!(got, expected, "descriptors the command got\n{}", show(&o));
    e.assert_held(&o);
}

/// Where the sandbox cannot be had (here: bubblewrap missing), `shade run` refuses in one
/// line and runs nothing; `--unconfined` runs the command; `shade doctor` says why.
fn refused_without_sandbox(who: Who) {
    let e = env(who);
    let o = e
        .shade()
        .env("SHADE_BWRAP", "/nonexistent/bwrap")
        .args(["run", "--", "sh", "-c"])
        .arg(format!("echo ran > {O}/ran", O = e.o()))
        .output()
        .unwrap();
    assert_ne!(o.status.code(), Some(0), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{}", show(&o));
    assert!(
        err.contains("bubblewrap") && err.contains("--unconfined"),
        "{}",
        show(&o)
    );
    assert!(!e.out.join("ran").exists(), "the command ran\n{}", show(&o));

    let o = e
        .shade()
        .env("SHADE_BWRAP", "/nonexistent/bwrap")
        .args([
            "run",
            "--unconfined",
            "--",
            "sh",
            "-c",
            "echo unconfined > file",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    e.assert_held(&o);

    let o = e
        .shade()
        .env("SHADE_BWRAP", "/nonexistent/bwrap")
        .arg("doctor")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(
        text.contains("unavailable") && text.contains("REFUSED"),
        "{}",
        show(&o)
    );
}

/// `-C /`: the branch would be bound over the whole file system; refused in one line.
fn project_root_refused(who: Who) {
    let e = env(who);
    let o = e
        .shade()
        .args(["run", "-C", "/", "--", "sh", "-c"])
        .arg(format!("echo ran > {O}/ran", O = e.o()))
        .output()
        .unwrap();
    assert_ne!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stderr).lines().count(),
        1,
        "{}",
        show(&o)
    );
    assert!(!e.out.join("ran").exists(), "the command ran\n{}", show(&o));
}

/// On a terminal the confined command is the foreground job, not bwrap: Ctrl-C reaches it
/// (and only it: the sandbox lives on), Ctrl-Z suspends the whole run to the shell and `fg`
/// resumes it, Ctrl-\\ kills it with 128+SIGQUIT.
#[test]
fn terminal_signals_reach_the_command_alone() {
    let e = env(Who::Root);
    let tty = common::tty::Tty::start(
        &["bash", "--norc", "--noprofile", "-i"],
        &e.project,
        &[("SHADE_STATE_DIR", e.state.display().to_string())],
    );
    tty.wait_text("#", 10);
    tty.type_text(&format!(
        "{} run -- {PYTHON} -c \"import time,signal; signal.signal(signal.SIGINT, lambda *a: print('got-' + 'int', flush=True)); print('rea' + 'dy', flush=True); [time.sleep(0.1) for _ in range(600)]\"",
        env!("CARGO_BIN_EXE_shade")
    ));
    tty.keys(&["Enter"]);
    tty.wait_text("\nready", 20);
    tty.keys(&["C-c"]);
    tty.wait_text("got-int", 10);
    tty.keys(&["C-z"]);
    tty.wait_text("Stopped", 10);
    tty.say("fg");
    std::thread::sleep(Duration::from_millis(500));
    tty.keys(&["C-c"]);
    tty.wait_for("a second got-int", 10, |s| {
        s.matches("got-int").count() >= 2
    });
    tty.keys(&["C-\\"]);
    std::thread::sleep(Duration::from_millis(500));
    tty.say("echo rc=$?");
    tty.wait_text("rc=131", 10);
}

/// `exec --shadow`: the agent's shell tries the routes out; the real project stays as it
/// was and shade does not claim otherwise.
fn exec_shadow(who: Who) {
    let e = env(who);
    let attack = format!(
        r#"for p in /proc/[0-9]*; do echo X > $p/root{P}/file; done 2>/dev/null; for t in $PPID 1; do nsenter -t $t -m -- sh -c "echo X > {P}/file; echo X > {O}/ns-$t"; done 2>/dev/null; umount -l {P} 2>/dev/null; echo X > {P}/file; ls /proc/$$/fd > {O}/../share/fds; echo attempted"#,
        P = e.p(),
        O = e.o()
    );
    let o = agent_shell(&e, &attack);
    e.assert_held(&o);
}

/// A program the command makes set-user-ID (and set-group-ID) with a file capability:
/// inside the branch they count for nothing (no_new_privs, a user namespace), but accept
/// would write them for real — a root-owned setuid program or `cap_setuid` anyone can
/// run. Accept writes the file without them and says so.
fn planted_privileges(who: Who) {
    let e = env(who);
    let o = e.run(
        &["--accept"],
        "cp /bin/true t && chmod 6755 t && \
         setfattr -n security.capability -v 0sAQAAAgAAAAAAAAAAAAAAAAAAAAA= t 2>/dev/null; \
         stat -c %a t",
    );
    ran(&o);
    let log = show(&o);
    assert!(
        String::from_utf8_lossy(&o.stdout).trim() == "6755",
        "the branch did not show the bits it was given\n{log}"
    );
    let t = e.project.join("t");
    let mode = std::fs::metadata(&t).unwrap().permissions().mode();
    assert_eq!(mode & 0o7777, 0o755, "accept wrote mode {mode:o}\n{log}");
    let name = std::ffi::CString::new("security.capability").unwrap();
    let path = std::ffi::CString::new(t.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a size query (null buffer, length 0) on a path we own.
    let size = unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
    assert!(size < 0, "accept wrote a file capability\n{log}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("written without the set-user-ID"),
        "accept did not say what it left out\n{log}"
    );
}

/// A minimal MCP client over stdio (JSON-RPC, one message a line) for `shade mcp` as the
/// test's user: every wait is bounded, and the server is killed if it outlives the test.
struct Mcp {
    child: Child,
    stdin: Option<std::process::ChildStdin>,
    lines: std::sync::mpsc::Receiver<String>,
    next: u64,
}

impl Mcp {
    fn start(e: &Env) -> Mcp {
        use std::io::BufRead;
        let mut child = e
            .shade()
            .args(["mcp", "--no-lint"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut m = Mcp {
            stdin: child.stdin.take(),
            child,
            lines,
            next: 1,
        };
        m.request(
            "initialize",
            serde_json::json!({
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "isolation", "version": "1"}
            }),
        );
        m.send(&serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        m
    }

    fn send(&mut self, msg: &serde_json::Value) {
        use std::io::Write;
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{msg}").unwrap();
        stdin.flush().unwrap();
    }

    /// Sends a request and waits (at most two minutes) for its answer's `result`.
    fn request(&mut self, method: &str, params: serde_json::Value) -> serde_json::Value {
        let id = self.next;
        self.next += 1;
        self.send(
            &serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|e| panic!("shade mcp did not answer {method}: {e}"));
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            if v["id"] == id {
                assert!(v.get("error").is_none(), "{method} failed: {v}");
                return v["result"].clone();
            }
        }
    }

    /// The text of tool `name`'s answer.
    fn tool(&mut self, name: &str, args: serde_json::Value) -> String {
        let r = self.request(
            "tools/call",
            serde_json::json!({"name": name, "arguments": args}),
        );
        r["content"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// `command` in a new branch, through `run_command`: the speculation sandbox.
    fn run_in_branch(&mut self, command: &str) -> String {
        let made = self.tool("create_branch", serde_json::json!({}));
        let id = made
            .split_whitespace()
            .nth(2)
            .unwrap_or_default()
            .trim_end_matches(|c: char| !c.is_alphanumeric())
            .to_string();
        assert!(id.starts_with('b'), "no branch: {made}");
        self.tool(
            "run_command",
            serde_json::json!({"branch": id, "command": command}),
        )
    }
}

impl Drop for Mcp {
    /// Closes stdin (the server ends and drops its branches), waits up to a minute, then
    /// kills it.
    fn drop(&mut self) {
        drop(self.stdin.take());
        for _ in 0..600 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A unix socket listening outside the project and the evidence dir, that any user may
/// connect to, and the io_uring probe beside it (readable by every user).
fn unix_listener(e: &Env) -> (std::os::unix::net::UnixListener, PathBuf, PathBuf) {
    let dir = e.out.parent().unwrap();
    let sock = dir.join("listen.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    listener.set_nonblocking(true).unwrap();
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o777)).unwrap();
    let probe = dir.join("io_uring.py");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/probes/io_uring.py"),
        &probe,
    )
    .unwrap();
    std::fs::set_permissions(&probe, std::fs::Permissions::from_mode(0o644)).unwrap();
    (listener, sock, probe)
}

/// Nobody connected to `listener` (the connection would be queued by now: no wait).
fn no_connection(listener: &std::os::unix::net::UnixListener, what: &str) {
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("{what}: the listener outside got a connection: {other:?}"),
    }
}

/// io_uring makes and connects sockets with operations no rule on socket(2) sees:
/// `IORING_OP_SOCKET` + `IORING_OP_CONNECT` to a unix socket outside (issue 28, item 3; a
/// tmux server there ran commands for a zero-click speculation). io_uring_setup is refused
/// in `shade run` and in the speculation sandbox of `shade mcp`'s `run_command`, and the
/// listener sees no one.
fn io_uring(who: Who) {
    let e = env(who);
    let (listener, sock, probe) = unix_listener(&e);
    let cmd = format!("{PYTHON} {} {}", probe.display(), sock.display());
    let text = {
        let mut mcp = Mcp::start(&e);
        mcp.run_in_branch(&cmd)
    };
    no_connection(&listener, "shade mcp run_command");
    assert!(
        text.contains("setup-refused"),
        "io_uring_setup worked in shade mcp's run_command:\n{text}"
    );
    let o = e.run(&[], &cmd);
    ran(&o);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    no_connection(&listener, "shade run");
    assert!(
        out.contains("setup-refused"),
        "io_uring_setup worked in shade run\n{}",
        show(&o)
    );
    e.assert_held(&o);
}

/// `exec --shadow` whose agent runs `command` in its shell once, then says "Done.".
fn agent_shell(e: &Env, command: &str) -> Output {
    agent_shell_env(e, command, &[])
}

/// [`agent_shell`] with `vars` set for shade (HOME, secrets).
fn agent_shell_env(e: &Env, command: &str, vars: &[(&str, &str)]) -> Output {
    use std::sync::Arc;
    let command = command.to_string();
    let llm = shade_testkit::FakeLlm::start(Arc::new(move |body: &serde_json::Value| {
        if shade_testkit::tool_results_since_user(body) == 0 {
            shade_testkit::Reply::tool("shell", serde_json::json!({ "command": command }))
        } else {
            shade_testkit::Reply::text("Done.")
        }
    }))
    .unwrap();
    let config = e.out.join("../agent-config");
    std::fs::create_dir_all(&config).unwrap();
    if e.who == Who::Plain {
        let (uid, gid) = plain_ids();
        std::os::unix::fs::chown(&config, Some(uid), Some(gid)).unwrap();
    }
    let o = e
        .shade()
        .args(["exec", "--shadow", "--approval", "yolo", "go"])
        .env("XDG_CONFIG_HOME", &config)
        .env("OPENAI_BASE_URL", &llm.base_url)
        .env("OPENAI_API_KEY", "test-key")
        .env("SHADE_MODEL", "main-model")
        .env("SHADE_FAST_MODEL", "fast-model")
        .envs(vars.iter().copied())
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("Done."),
        "the agent did not finish\n{}",
        show(&o)
    );
    o
}

/// Host unix sockets (issue 29): a service listening outside the branch acts for whoever
/// connects (systemd, the buses, docker, a tmux server, an ssh agent), so none is reachable
/// from a confined command: one under /tmp, one beside the project (a directory the plain
/// user's layer cannot overlay whole: the project lies below it) and an abstract one (no
/// file at all). `shade run` with and without network and `/tmp`, `shade mcp`'s
/// `run_command` and `exec --shadow`'s shell: no listener sees a connection. Then `--allow-socket` and `[sandbox]
/// allow_sockets` (with `$VAR`) open exactly the two named, and the abstract one stays shut.
fn host_sockets(who: Who) {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixListener};
    let e = env(who);
    let dir = e.out.parent().unwrap().to_path_buf();
    let tag = format!("{}-{who:?}", std::process::id());
    let in_tmp = PathBuf::from(format!("/tmp/shade-iso-{tag}.sock"));
    let beside = dir.join("beside.sock");
    let abstract_name = format!("shade-iso-{tag}");
    struct Gone(PathBuf);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _ = std::fs::remove_file(&in_tmp);
    let _gone = Gone(in_tmp.clone());
    let listen = |p: &Path| {
        let l = UnixListener::bind(p).unwrap();
        l.set_nonblocking(true).unwrap();
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).unwrap();
        l
    };
    let tmp_l = listen(&in_tmp);
    let beside_l = listen(&beside);
    let abs_l =
        UnixListener::bind_addr(&SocketAddr::from_abstract_name(abstract_name.as_bytes()).unwrap())
            .unwrap();
    abs_l.set_nonblocking(true).unwrap();
    let client = dir.join("connect.py");
    std::fs::write(
        &client,
        "import socket, sys\n\
         for p in sys.argv[1:]:\n\
         \x20   s = socket.socket(socket.AF_UNIX)\n\
         \x20   s.settimeout(5)\n\
         \x20   try:\n\
         \x20       s.connect('\\0' + p[1:] if p.startswith('@') else p)\n\
         \x20       print('connected', p)\n\
         \x20   except OSError as e:\n\
         \x20       print('refused', p, e)\n",
    )
    .unwrap();
    std::fs::set_permissions(&client, std::fs::Permissions::from_mode(0o644)).unwrap();
    let cmd = format!(
        "{PYTHON} {} {} {} @{abstract_name}",
        client.display(),
        in_tmp.display(),
        beside.display()
    );
    let none = |what: &str| {
        no_connection(&tmp_l, &format!("{what}, under /tmp"));
        no_connection(&beside_l, &format!("{what}, beside the project"));
        no_connection(&abs_l, &format!("{what}, abstract"));
    };
    for extra in [&[][..], &["--no-network", "--private-tmp"][..]] {
        let o = e.run(extra, &cmd);
        ran(&o);
        none(&format!("shade run {extra:?}"));
        assert!(
            !String::from_utf8_lossy(&o.stdout).contains("connected"),
            "{}",
            show(&o)
        );
        e.assert_held(&o);
    }
    let text = {
        let mut mcp = Mcp::start(&e);
        mcp.run_in_branch(&cmd)
    };
    none("shade mcp run_command");
    assert!(!text.contains("connected"), "{text}");
    let o = agent_shell(&e, &cmd);
    none("exec --shadow's shell");
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("connected"),
        "{}",
        show(&o)
    );
    e.assert_held(&o);
    // Allowed: by flag and by config ($VAR expanded); the abstract one is never reachable.
    let cfg = dir.join("sockets.toml");
    std::fs::write(&cfg, "[sandbox]\nallow_sockets = [\"$SHADE_ISO_SOCKET\"]\n").unwrap();
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = e
        .shade()
        .env("SHADE_CONFIG", &cfg)
        .env("SHADE_ISO_SOCKET", &beside)
        .arg("run")
        .arg("--allow-socket")
        .arg(&in_tmp)
        .args(["--", "sh", "-c", &cmd])
        .output()
        .unwrap();
    ran(&o);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    for (l, p) in [(&tmp_l, &in_tmp), (&beside_l, &beside)] {
        assert!(
            l.accept().is_ok(),
            "the allowed socket {} got no connection\n{}",
            p.display(),
            show(&o)
        );
    }
    no_connection(&abs_l, "allowed run, abstract");
    assert!(
        out.contains(&format!("refused @{abstract_name}")),
        "{}",
        show(&o)
    );
    e.assert_held(&o);
}

/// An allowed socket's path that a command can write for real (here in a SHADE_SHARE
/// directory; the project through an accept) is no way to another socket (attack round):
/// a command plants `share/app.sock -> victim` (the session bus, docker's), and the next
/// `shade run --allow-socket share/app.sock` bound the victim (as root idmapped, so host
/// root's). Now the link is not followed: nothing is bound, the victim sees no one.
fn allowed_socket_planted_link(who: Who) {
    use std::os::unix::net::UnixListener;
    let e = env(who);
    let dir = e.out.parent().unwrap().to_path_buf();
    let victim = dir.join("victim.sock");
    let planted = dir.join("share/app.sock");
    let l = UnixListener::bind(&victim).unwrap();
    l.set_nonblocking(true).unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o777)).unwrap();
    let client = dir.join("connect.py");
    std::fs::write(
        &client,
        "import socket, sys\n\
         for p in sys.argv[1:]:\n\
         \x20   s = socket.socket(socket.AF_UNIX)\n\
         \x20   s.settimeout(5)\n\
         \x20   try:\n\
         \x20       s.connect(p)\n\
         \x20       print('connected', p)\n\
         \x20   except OSError as e:\n\
         \x20       print('refused', p, e)\n",
    )
    .unwrap();
    std::fs::set_permissions(&client, std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = e.run(
        &[],
        &format!("ln -s {} {}", victim.display(), planted.display()),
    );
    ran(&o);
    assert!(
        std::fs::symlink_metadata(&planted).is_ok_and(|m| m.file_type().is_symlink()),
        "the command could not plant its link in the shared directory\n{}",
        show(&o)
    );
    let planted_arg = planted.display().to_string();
    let o = e.run(
        &["--allow-socket", &planted_arg],
        &format!(
            "{PYTHON} {} {} {}",
            client.display(),
            planted.display(),
            victim.display()
        ),
    );
    ran(&o);
    no_connection(&l, "--allow-socket of a link a command planted");
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("connected"),
        "{}",
        show(&o)
    );
    e.assert_held(&o);
}

/// An allowed socket is bound read-only (attack round): bound writable (as root through
/// the idmapped mount, as host root) a command chmod-ed, chown-ed and touched the host's
/// socket for real, opening a 0600 socket to every local user. Connecting still works.
fn allowed_socket_read_only(who: Who) {
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::net::UnixListener;
    let e = env(who);
    let dir = e.out.parent().unwrap().to_path_buf();
    let sock = dir.join("allowed.sock");
    let l = UnixListener::bind(&sock).unwrap();
    l.set_nonblocking(true).unwrap();
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o600)).unwrap();
    if who == Who::Plain {
        let (uid, gid) = plain_ids();
        std::os::unix::fs::lchown(&sock, Some(uid), Some(gid)).unwrap();
    }
    let before = std::fs::symlink_metadata(&sock).unwrap();
    let s = sock.display().to_string();
    let o = e.run(
        &["--allow-socket", &s],
        &format!(
            r#"chmod 666 {s}; chown 12345 {s}; {PYTHON} -c '
import os, socket
try:
    os.utime("{s}", (0, 0)); print("touched")
except OSError as e:
    print("utime refused", e)
c = socket.socket(socket.AF_UNIX); c.settimeout(5); c.connect("{s}"); print("connected")
'"#
        ),
    );
    ran(&o);
    let after = std::fs::symlink_metadata(&sock).unwrap();
    assert_eq!(
        (before.mode(), before.uid(), before.gid(), before.mtime()),
        (after.mode(), after.uid(), after.gid(), after.mtime()),
        "the command changed the host's allowed socket\n{}",
        show(&o)
    );
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("connected") && l.accept().is_ok(),
        "the allowed socket got no connection\n{}",
        show(&o)
    );
    e.assert_held(&o);
}

/// Host-wide knobs under /proc (issue 28): a sysctl write as the sandbox's root was the
/// host's (core_pattern → a program run as full root). Every probe only opens for writing,
/// or writes the value already there, so a success harms nothing; the kernel-memory and
/// key files give nothing.
fn host_knobs(who: Who) {
    let e = env(who);
    let before = std::fs::read_to_string("/proc/sys/vm/swappiness").unwrap();
    let o = e.run(
        &[],
        &format!(
            r#"v=$(cat /proc/sys/vm/swappiness)
            (echo "$v" > /proc/sys/vm/swappiness) 2>/dev/null && echo "$v" > {O}/swappiness
            for f in /proc/sys/kernel/core_pattern /proc/sysrq-trigger /proc/sys/vm/drop_caches; do
              (: >> "$f") 2>/dev/null && echo w > "{O}/$(basename $f)"
            done
            for f in /proc/kcore /proc/keys /proc/timer_list; do
              [ -n "$(head -c 1 $f 2>/dev/null)" ] && echo r > "{O}/$(basename $f)"
            done
            true"#,
            O = e.o()
        ),
    );
    let after = std::fs::read_to_string("/proc/sys/vm/swappiness").unwrap();
    if after != before {
        let _ = std::fs::write("/proc/sys/vm/swappiness", &before);
    }
    ran(&o);
    assert_eq!(
        before,
        after,
        "the host's vm.swappiness changed\n{}",
        show(&o)
    );
    e.assert_held(&o);
}

// ----- limits (issue 28, item 5) ---------------------------------------------------

/// How long a limits test may take before it is killed and fails (a command that escaped
/// its limits may otherwise run on).
const LIMITS_DEADLINE: Duration = Duration::from_secs(300);

/// What a bounded run gave: its output, and the largest resident size of the shade process
/// seen while it ran (kB).
struct Bounded {
    out: Output,
    max_rss_kb: u64,
}

/// `shade run [extra] -- sh -c script` with `config` as its config file, killed (with its
/// process group) and failed after LIMITS_DEADLINE; samples shade's VmRSS meanwhile.
fn run_limited(e: &Env, config: &str, extra: &[&str], script: &str) -> Bounded {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    let cfg = e.out.parent().unwrap().join("limits.toml");
    std::fs::write(&cfg, config).unwrap();
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut child = e
        .shade()
        .env("SHADE_CONFIG", &cfg)
        .arg("run")
        .args(extra)
        .args(["--", "sh", "-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let reader = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let out_t = reader(Box::new(child.stdout.take().unwrap()));
    let err_t = reader(Box::new(child.stderr.take().unwrap()));
    let start = std::time::Instant::now();
    let mut max_rss_kb = 0;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            })
            .unwrap_or(0);
        max_rss_kb = max_rss_kb.max(rss);
        if start.elapsed() > LIMITS_DEADLINE {
            // SAFETY: kill(2) of the process group we made.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
            let _ = child.wait();
            e.recover();
            panic!("shade did not end within {LIMITS_DEADLINE:?}: a limit did not hold");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = Output {
        status,
        stdout: out_t.join().unwrap(),
        stderr: err_t.join().unwrap(),
    };
    Bounded { out, max_rss_kb }
}

/// Live processes whose command line is exactly `argv` (a marker no other test uses).
fn processes_running(argv: &[&str]) -> usize {
    let want: Vec<u8> = argv
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want))
        .count()
}

fn stderr_says(o: &Output, line: &str) {
    assert!(
        String::from_utf8_lossy(&o.stderr)
            .lines()
            .any(|l| l == line),
        "shade did not say {line:?}\n{}",
        show(o)
    );
}

/// A fork bomb stops at the process limit, leaves no process behind, and (as root, where
/// a pids cgroup counts the refusals) is reported in one line.
fn limits_fork_bomb(who: Who) {
    let e = env(who);
    let b = run_limited(
        &e,
        "[sandbox.run]\nmax_processes = 64\ntime_limit_secs = 90\n",
        &[],
        // The forks fail in a subshell; the count is taken with builtins only (no process
        // is left to fork one), then the command ends and its sandbox with it.
        "(for i in $(seq 2000); do sleep 37 & done) 2>/dev/null; set -- /proc/[0-9]*; echo procs=$#",
    );
    let o = &b.out;
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    let procs: usize = text
        .lines()
        .find_map(|l| l.strip_prefix("procs="))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("the command did not count its processes\n{}", show(o)));
    // Its own 64, the sandbox's init.
    assert!(
        procs <= 66,
        "{procs} processes ran in a sandbox limited to 64\n{}",
        show(o)
    );
    if who == Who::Root {
        stderr_says(o, "shade: the command reached its 64-process limit");
    }
    assert_eq!(
        processes_running(&["sleep", "37"]),
        0,
        "the fork bomb's processes outlived the run\n{}",
        show(o)
    );
    e.assert_held(o);
}

/// /tmp and /dev/shm have their configured sizes: writing past them gets ENOSPC, and each
/// full one is reported.
fn limits_tmp_and_shm(who: Who) {
    let e = env(who);
    let b = run_limited(
        &e,
        "[sandbox.run]\ntmp_size = \"8MiB\"\nshm_size = \"4MiB\"\n",
        &["--private-tmp"],
        "dd if=/dev/zero of=/tmp/x bs=1M count=20 2>/dev/null; echo tmp=$?; \
         dd if=/dev/zero of=/dev/shm/x bs=1M count=20 2>/dev/null; echo shm=$?",
    );
    let o = &b.out;
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        text.contains("tmp=1") && text.contains("shm=1"),
        "writes past /tmp's or /dev/shm's size went through\n{}",
        show(o)
    );
    stderr_says(o, "shade: the command reached /tmp's 8 MiB limit");
    stderr_says(o, "shade: the command reached /dev/shm's 4 MiB limit");
    e.assert_held(o);
}

/// What the sandbox hides (shade's state directory) shows as an empty directory that takes
/// no writes: a writable tmpfs there held whatever a command wrote, up to half the
/// machine's memory, past every limit.
fn limits_hidden_dirs(who: Who) {
    let e = env(who);
    let state = e.state.display().to_string();
    let o = e.run(
        &[],
        &format!(
            "ls -A {state} | wc -l; \
             dd if=/dev/zero of={state}/fill bs=1M count=20 2>/dev/null; echo dd=$?; \
             mkdir {state}/d 2>/dev/null; echo mkdir=$?"
        ),
    );
    ran(&o);
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    assert_eq!(text, "0\ndd=1\nmkdir=1\n", "{}", show(&o));
    e.assert_held(&o);
}

/// A branch write past `branch_size` gets ENOSPC and is reported.
fn limits_branch_size(who: Who) {
    let e = env(who);
    let b = run_limited(
        &e,
        "[sandbox.run]\nbranch_size = \"16MiB\"\n",
        &[],
        "dd if=/dev/zero of=big bs=1M count=40 2>&1; echo rc=$?",
    );
    let o = &b.out;
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        text.contains("No space left on device") && text.contains("rc=1"),
        "a write past the branch's size went through\n{}",
        show(o)
    );
    stderr_says(o, "shade: the command reached the branch's 16 MiB limit");
    e.assert_held(o);
}

/// The outside layer's size (issue 29; an attacker wrote 4.6 GB through MCP): a write in
/// the home past `outside_size` gets ENOSPC, says so in one line, and the host's home is
/// unchanged. The layer is a detached tmpfs: nothing of it is mounted on the host while a
/// command runs, nor after shade is killed with SIGKILL and `shade recover` ran.
fn limits_outside_size(who: Who) {
    let e = env(who);
    let home = match who {
        Who::Root => PathBuf::from("/root"),
        Who::Plain => PathBuf::from(format!("/home/{PLAIN}")),
    };
    let name = format!("shade-iso-outside-{}", std::process::id());
    let config = "[sandbox.run]\noutside_size = \"8MiB\"\n";
    let b = run_limited(
        &e,
        config,
        &[],
        &format!("head -c 20000000 /dev/zero > ~/{name}; echo rc=$?"),
    );
    let o = &b.out;
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("rc=1")
            && String::from_utf8_lossy(&o.stderr).contains("No space left on device"),
        "a write past the outside layer's size went through\n{}",
        show(o)
    );
    stderr_says(
        o,
        "shade: the command reached the branch's 8 MiB limit on writes outside the project",
    );
    assert!(
        !home.join(&name).exists(),
        "the write reached the host's home"
    );
    e.assert_held(o);
    // Killed while its command runs: no host mount of the layer then, or after recover.
    let cfg = e.out.parent().unwrap().join("limits.toml");
    let share = e.out.join("../share");
    let mut child = e
        .shade()
        .env("SHADE_CONFIG", &cfg)
        .args(["run", "--", "sh", "-c"])
        .arg(format!(
            "echo x > ~/{name}; echo up > {}/ready; sleep 100",
            share.display()
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    common::wait_until("the command to start", 60, || share.join("ready").exists());
    let state = e.state.to_string_lossy().to_string();
    let layer_mounts = || -> Vec<String> {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter(|l| l.contains(&state) && !l.contains(" - fuse"))
            .map(str::to_string)
            .collect()
    };
    let during = layer_mounts();
    // SAFETY: kill(2) of our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
    let recovered = e.shade().arg("recover").output().unwrap();
    let mounted = || -> Vec<String> {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter(|l| l.contains(&state))
            .map(str::to_string)
            .collect()
    };
    // The branch server aborts the killed client's branch when it sees the client go, which
    // may be a moment after `recover` returns.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !mounted().is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let after = mounted();
    e.recover();
    assert!(
        during.is_empty(),
        "the layer is mounted on the host: {during:?}"
    );
    assert!(
        after.is_empty(),
        "left mounted after kill -9 and recover: {after:?}\n{}",
        show(&recovered)
    );
    assert!(
        !home.join(&name).exists(),
        "the write reached the host's home"
    );
}

/// The time limit kills the command, and says so in one line.
fn limits_time(who: Who) {
    let e = env(who);
    let b = run_limited(&e, "[sandbox.run]\ntime_limit_secs = 1\n", &[], "sleep 43");
    stderr_says(&b.out, "shade: the command reached its 1 s time limit");
    assert_eq!(processes_running(&["sleep", "43"]), 0, "{}", show(&b.out));
    e.assert_held(&b.out);
}

/// The outside layer's size bounds its xattrs too (attack round): tmpfs charges xattrs and
/// inodes to an inode space that `size` does not bound, so with the kernel's default
/// `nr_inodes` a command kept ~3 GB of `user.*` xattrs in an 8 MiB layer. Now a flood of
/// 60 KB values on files in the home stops (ENOSPC) within a few MiB.
fn limits_outside_xattrs(who: Who) {
    let e = env(who);
    let name = format!("shade-iso-outside-xattrs-{}", std::process::id());
    let script = format!(
        r#"mkdir -p ~/{name} && cd ~/{name} && {PYTHON} -c '
import os
v, n, err = b"v" * 60000, 0, 0
try:
    while n < 64 << 20:
        p = "f%d" % (n // 180000)
        if not os.path.exists(p):
            open(p, "w").close()
        os.setxattr(p, "user.k%d" % n, v)
        n += len(v)
except OSError as e:
    err = e.errno
print("stored", n >> 20, "errno", err)
'"#
    );
    let b = run_limited(&e, "[sandbox.run]\noutside_size = \"8MiB\"\n", &[], &script);
    let o = &b.out;
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    let stored: u64 = text
        .split_whitespace()
        .skip_while(|w| *w != "stored")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count\n{}", show(o)));
    assert!(
        stored < 8 && text.contains(&format!("errno {}", libc::ENOSPC)),
        "{stored} MiB of xattrs in an 8 MiB outside layer\n{}",
        show(o)
    );
    e.assert_held(o);
}

/// A small outside layer still takes a write when the host has many places a command may
/// write (a plain user's layer has one unit per writable sibling of the project's
/// ancestors: a busy `/var/tmp` has hundreds): the units' own directories used to take
/// the 8 MiB layer's inodes, and the command's first write outside the project failed
/// with ENOSPC. 600 sibling directories next to the project here.
fn limits_outside_many_units(who: Who) {
    let e = env(who);
    // Beside the project, in the directory that has the branch's mounts below it (its state
    // directory): each is a unit of its own.
    let parent = e.out.parent().unwrap().to_path_buf();
    for i in 0..600 {
        let sib = parent.join(format!("sib{i}"));
        std::fs::create_dir(&sib).unwrap();
        if who == Who::Plain {
            common::plain::chown_tree(&sib);
        }
    }
    let name = format!("shade-iso-outside-units-{}", std::process::id());
    let b = run_limited(
        &e,
        "[sandbox.run]\noutside_size = \"8MiB\"\n",
        &[],
        &format!("for i in 1 2 3; do mkdir -p ~/{name}/d$i && echo x > ~/{name}/d$i/f; done && echo made"),
    );
    let o = &b.out;
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("made"),
        "a small write outside the project failed in an 8 MiB layer with 600 units\n{}",
        show(o)
    );
    let home = match who {
        Who::Root => PathBuf::from("/root"),
        Who::Plain => PathBuf::from(format!("/home/{PLAIN}")),
    };
    assert!(
        !home.join(&name).exists(),
        "the write reached the host's home"
    );
    e.assert_held(o);
}

/// The private /tmp's inodes, and the user extended attributes tmpfs counts with them, are
/// bounded with its size (bubblewrap's own tmpfs left about a million inodes per GiB of
/// RAM: gigabytes of xattrs in an 8 MiB /tmp), as root and as a plain user; and so are
/// /dev/shm's inodes (a flood of empty files stops within a few thousand).
#[test]
fn limits_tmp_xattrs_as_root() {
    limits_tmp_xattrs(Who::Root);
}

#[test]
fn limits_tmp_xattrs_as_plain_user() {
    limits_tmp_xattrs(Who::Plain);
}

fn limits_tmp_xattrs(who: Who) {
    let e = env(who);
    let files = inode_flood(&e, "/dev/shm");
    assert!(files < 4096, "{files} files in an 8 MiB /dev/shm");
    let script = format!(
        r#"cd /tmp && {PYTHON} -c '
import os
v, n, err = b"v" * 60000, 0, 0
try:
    while n < 64 << 20:
        p = "f%d" % (n // 180000)
        if not os.path.exists(p):
            open(p, "w").close()
        os.setxattr(p, "user.k%d" % n, v)
        n += len(v)
except OSError as e:
    err = e.errno
print("stored", n >> 20, "errno", err)
'"#
    );
    let b = run_limited(
        &e,
        "[sandbox.run]\ntmp_size = \"8MiB\"\n",
        &["--private-tmp"],
        &script,
    );
    let o = &b.out;
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    let stored: u64 = text
        .split_whitespace()
        .skip_while(|w| *w != "stored")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count\n{}", show(o)));
    assert!(
        stored < 8 && text.contains(&format!("errno {}", libc::ENOSPC)),
        "{stored} MiB of xattrs in an 8 MiB /tmp\n{}",
        show(o)
    );
    e.assert_held(o);
}

/// An xattr flood (64 KiB values, as many as it can) is refused once the branch's
/// metadata budget is spent, oversized values and names get E2BIG and ERANGE, and shade's
/// own memory stays bounded all along.
fn limits_xattr_flood(who: Who) {
    let e = env(who);
    let script = format!(
        r#"touch f && {PYTHON} -c '
import errno, os
v = b"x" * 65536
def code(f):
    try:
        f(); return 0
    except OSError as e:
        return e.errno
print("big", code(lambda: os.setxattr("f", "user.big", v + b"x")))
print("long", code(lambda: os.setxattr("f", "user." + "n" * 251, b"v")))
n = 0
while n < 24000:
    c = code(lambda: os.setxattr("f", "user.x%d" % n, v))
    if c:
        print("flood", n, c); break
    n += 1
else:
    print("flood", n, 0)
'"#
    );
    let b = run_limited(
        &e,
        "[sandbox.run]\nbranch_metadata = \"64MiB\"\n",
        &[],
        &script,
    );
    let o = &b.out;
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        b.max_rss_kb < 512 * 1024,
        "shade grew to {} MiB during the flood\n{}",
        b.max_rss_kb / 1024,
        show(o)
    );
    assert!(
        text.contains(&format!("big {}", libc::E2BIG)),
        "{}",
        show(o)
    );
    assert!(
        text.contains(&format!("long {}", libc::ERANGE)),
        "{}",
        show(o)
    );
    let flood = text
        .lines()
        .find_map(|l| l.strip_prefix("flood "))
        .unwrap_or_else(|| panic!("the flood did not run\n{}", show(o)));
    assert!(
        flood.ends_with(&format!(" {}", libc::ENOSPC)),
        "the xattr flood was not refused with ENOSPC ({flood})\n{}",
        show(o)
    );
    stderr_says(
        o,
        "shade: the command reached the branch's 64 MiB limit on metadata (new entries, \
         links, symlinks, extended attributes)",
    );
    e.assert_held(o);
}

// ----- h5 red team: root's view, capabilities, secrets, inotify, keep rules ----------

/// A directory of the test's own under the env, owned by the test's user.
fn own_dir(e: &Env, name: &str) -> PathBuf {
    let d = e.out.parent().unwrap().join(name);
    std::fs::create_dir_all(&d).unwrap();
    if e.who == Who::Plain {
        common::plain::chown_tree(&d);
    }
    d
}

/// Root's view of the host (h5 #5): another user's private file (owner-only, in an
/// owner-only directory) and /etc/shadow and the host's ssh keys are not the command's,
/// whether the user runs it (`shade run`, the outside layer) or the agent does (`exec
/// --shadow`): the host is idmapped through a namespace that maps only host root and the
/// sudo user, so the command's root has no DAC override on another user's files.
#[test]
fn root_view_other_users_files() {
    let e = env(Who::Root);
    let victim = e.out.parent().unwrap().join("victim");
    std::fs::create_dir(&victim).unwrap();
    std::fs::write(victim.join("secret"), "VICTIM-SECRET-h7").unwrap();
    std::fs::set_permissions(
        victim.join("secret"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o700)).unwrap();
    common::plain::chown_tree(&victim);
    let probe = format!(
        r#"v=$(cat {V}/secret 2>/dev/null); [ -z "$v" ] || echo "$v" > {O}/victim
        v=$(head -c 64 /etc/shadow 2>/dev/null); [ -z "$v" ] || echo "$v" > {O}/shadow
        for k in /etc/ssh/ssh_host_*_key; do
          v=$(head -c 64 "$k" 2>/dev/null); [ -z "$v" ] || echo "$v" > {O}/hostkey
        done
        true"#,
        V = victim.display(),
        O = e.o()
    );
    let o = e.run(&[], &probe);
    ran(&o);
    e.assert_held(&o);
    let o = e.run(&["--no-network"], &probe);
    ran(&o);
    e.assert_held(&o);
    let o = agent_shell(&e, &probe);
    e.assert_held(&o);
}

/// Secret variables whose names the old denylist missed (h5 #6): the agent's commands get
/// an allowlist of shade's environment.
fn agent_env_allowlist(who: Who) {
    let e = env(who);
    let vars = [
        ("GITHUB_PAT", "ghp_LEAK"),
        ("CI_JOB_JWT", "LEAK.jwt"),
        ("MYSQL_PWD", "LEAKpw"),
        (
            "SLACK_WEBHOOK_URL",
            "https://hooks.slack.com/services/T0/B0/LEAK",
        ),
        ("BEARER", "LEAKbearer"),
        ("CODECOV_UPLOAD", "LEAKcodecov"),
        ("CARGO_REGISTRY_TOKEN", "LEAKcargo"),
        ("CARGO_TERM_COLOR", "never-kept-h7"),
    ];
    let o = agent_shell_env(
        &e,
        &format!(
            r#"l=$(env | grep LEAK); [ -z "$l" ] || echo "$l" > {O}/env
            [ "$CARGO_TERM_COLOR" = never-kept-h7 ] || echo lost > {O}/allowed"#,
            O = e.o()
        ),
        &vars,
    );
    e.assert_held(&o);
}

/// Credential files of the home the old fixed list missed (h5 #6): containers' registry
/// auth, Gemini's and qwen's OAuth, Copilot, Maven, Gradle, sops, Pulumi, Composer, Hugging
/// Face, another project's `.env`, a token lying in a notes directory.
fn agent_home_credentials(who: Who) {
    let e = env(who);
    let home = own_dir(&e, "home");
    for f in [
        ".config/containers/auth.json",
        ".gemini/oauth_creds.json",
        ".qwen/oauth_creds.json",
        ".config/github-copilot/apps.json",
        ".m2/settings.xml",
        ".gradle/gradle.properties",
        ".config/sops/age/keys.txt",
        ".pulumi/credentials.json",
        ".config/composer/auth.json",
        ".cache/huggingface/token",
        "other-project/.env",
        "notes/deploy-token.txt",
    ] {
        let p = home.join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, format!("SECRET-IN-{f}")).unwrap();
    }
    std::fs::write(home.join("notes/plain.txt"), "visible-h7").unwrap();
    if who == Who::Plain {
        common::plain::chown_tree(&home);
    }
    let h = home.display().to_string();
    let o = agent_shell_env(
        &e,
        &format!(
            r#"cd ~ && l=$(grep -rh SECRET-IN . 2>/dev/null); [ -z "$l" ] || echo "$l" > {O}/home
            grep -q visible-h7 notes/plain.txt || echo lost > {O}/plain"#,
            O = e.o()
        ),
        &[("HOME", h.as_str())],
    );
    e.assert_held(&o);
}

/// Secrets in files that stay visible under ordinary names (red team round 5 route 5): a
/// token in `~/.gitconfig`'s `url.*.insteadOf`, an extra header and a credential helper
/// are not readable while `git config user.name` and aliases still work; `~/.cargo/
/// credentials.toml` and `~/.local/share/gem/credentials` are absent, yet the command may
/// create its own; and `git config --global` still writes, into the outside layer (listed,
/// the host's file untouched).
fn agent_home_config_secrets(who: Who) {
    let e = env(who);
    let home = own_dir(&e, "home");
    let gitconfig = "[user]\n\tname = Shade Tester\n\temail = t@example.org\n\
        [alias]\n\tco = checkout\n\
        [url \"https://x-access-token:TOKEN-url@github.com/\"]\n\tinsteadOf = https://github.com/\n\
        [http]\n\textraHeader = Authorization: Basic TOKEN-header\n\
        [credential]\n\thelper = store --file /var/tmp/TOKEN-helper\n";
    let files = [
        (".gitconfig", gitconfig),
        (
            ".cargo/credentials.toml",
            "[registry]\ntoken = \"TOKEN-cargo\"\n",
        ),
        (
            ".local/share/gem/credentials",
            "---\n:rubygems_api_key: TOKEN-gem\n",
        ),
    ];
    for (f, text) in files {
        let p = home.join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
    }
    if who == Who::Plain {
        common::plain::chown_tree(&home);
    }
    let ran = e.out.join("../share/ran-h21");
    let h = home.display().to_string();
    let o = agent_shell_env(
        &e,
        &format!(
            r#"cd ~
            l=$(cat .gitconfig .cargo/credentials.toml .local/share/gem/credentials 2>&1; git config --global --list 2>&1)
            case "$l" in *TOKEN-*) echo "$l" > {O}/leak;; esac
            [ "$(git config user.name)" = "Shade Tester" ] || echo "name: $(git config user.name)" > {O}/name
            [ "$(git config alias.co)" = checkout ] || echo lost > {O}/alias
            for f in .cargo/credentials.toml .local/share/gem/credentials; do
              if [ -e "$f" ] || [ -L "$f" ]; then echo present > {O}/present-$(basename $f); fi
            done
            git config --global shade.probe written-h21 || echo failed > {O}/write
            [ "$(git config --global shade.probe)" = written-h21 ] || echo lost > {O}/readback
            echo mine > .local/share/gem/credentials && [ "$(cat .local/share/gem/credentials)" = mine ] || echo failed > {O}/own-gem
            echo done > {R}"#,
            O = e.o(),
            R = ran.display()
        ),
        &[("HOME", h.as_str())],
    );
    let log = show(&o);
    assert!(ran.exists(), "{who:?}: the command did not run\n{log}");
    e.assert_held(&o);
    assert_eq!(
        std::fs::read_to_string(home.join(".gitconfig")).unwrap(),
        gitconfig,
        "{who:?}: the host's ~/.gitconfig changed\n{log}"
    );
    assert_eq!(
        std::fs::read_to_string(home.join(".local/share/gem/credentials")).unwrap(),
        files[2].1,
        "{who:?}: the host's gem credentials changed\n{log}"
    );
    let out = String::from_utf8_lossy(&o.stdout);
    let listed = out
        .split_once("outside the project")
        .is_some_and(|(_, rest)| rest.contains("~/.gitconfig"));
    assert!(
        listed,
        "{who:?}: the write to ~/.gitconfig is not in the outside layer\n{log}"
    );
    assert!(
        !log.contains("TOKEN-"),
        "{who:?}: the output shows a token\n{log}"
    );
}

/// The network kernel surface (h5 #7): in its own network namespace the command's root
/// makes no link, no traffic-control filter and no packet socket (CAP_NET_ADMIN/NET_RAW
/// dropped from every set), and its bounding set holds nothing of the kind either.
fn net_admin(who: Who) {
    let e = env(who);
    let o = e.run(
        &["--no-network"],
        &format!(
            r#"ip link add v0 type veth peer name v1 2>/dev/null && echo link > {O}/link
            tc qdisc add dev lo root handle 1: htb 2>/dev/null && echo tc > {O}/tc
            {PY} -c "import socket; socket.socket(socket.AF_PACKET, socket.SOCK_RAW)" 2>/dev/null && echo p > {O}/packet
            {PY} -c "import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)" 2>/dev/null && echo r > {O}/raw
            eff=$(sed -n 's/^CapEff:	//p' /proc/self/status)
            [ $(( 0x$eff & ((1<<12)|(1<<13)|(1<<21)|(1<<24)) )) = 0 ] || echo "$eff" > {O}/caps
            true"#,
            O = e.o(),
            PY = PYTHON
        ),
    );
    ran(&o);
    e.assert_held(&o);
}

/// The user's inotify instances (h5 #12): a command that takes every instance it can
/// leaves its user's own programs on the host some (the sandbox's user namespace has a
/// limit of its own below the host's).
fn inotify_bounded(who: Who) {
    let e = env(who);
    let meet = own_dir(&e, "meet");
    std::fs::set_permissions(&meet, std::fs::Permissions::from_mode(0o777)).unwrap();
    let hog = format!(
        r#"import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
fds = []
while True:
    fd = libc.inotify_init()
    if fd < 0:
        break
    fds.append(fd)
open("{M}/took", "w").write(str(len(fds)))
for _ in range(1200):
    if os.path.exists("{M}/done"):
        break
    time.sleep(0.1)
"#,
        M = meet.display()
    );
    std::fs::write(meet.join("hog.py"), hog).unwrap();
    let mut cmd = e.shade();
    cmd.env(
        "SHADE_SHARE",
        std::env::join_paths([e.out.clone(), meet.clone()]).unwrap(),
    )
    .args(["run", "--private-tmp", "--", PYTHON])
    .arg(meet.join("hog.py"))
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    let took = meet.join("took");
    for _ in 0..1200 {
        if took.exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let probe = "import ctypes, sys; fd = ctypes.CDLL(None).inotify_init(); print(fd); sys.exit(0 if fd >= 0 else 1)";
    let host = match who {
        Who::Root => Command::new(PYTHON).args(["-c", probe]).output().unwrap(),
        Who::Plain => Command::new("/usr/bin/setpriv")
            .args([
                &format!("--reuid={PLAIN}"),
                &format!("--regid={PLAIN}"),
                "--init-groups",
                "--",
                PYTHON,
                "-c",
                probe,
            ])
            .output()
            .unwrap(),
    };
    std::fs::write(meet.join("done"), "").unwrap();
    let o = child.wait_with_output().unwrap();
    let n = std::fs::read_to_string(&took).unwrap_or_default();
    assert!(
        n.trim().parse::<u32>().is_ok_and(|n| n > 0),
        "the command took no inotify instance ({n:?})
{}",
        show(&o)
    );
    assert!(
        host.status.success(),
        "the user's own program got no inotify instance while the command held {n}
{}
{}",
        show(&host),
        show(&o)
    );
}

/// Standing keep rules (h5 #3): `[outside] keep` keeps plain data under a rule, but never
/// a write that makes a program run code (an agent's hook in `~/.claude/settings.json`),
/// which is flagged and kept only with `--keep-outside` naming it for that run.
fn standing_keep_rules(who: Who) {
    let e = env(who);
    let home = own_dir(&e, "home");
    let xdg = own_dir(&e, "xdg");
    std::fs::create_dir_all(home.join(".claude")).unwrap();
    std::fs::create_dir_all(home.join("data")).unwrap();
    std::fs::write(
        home.join(".claude/settings.json"),
        "{}
",
    )
    .unwrap();
    std::fs::create_dir_all(xdg.join("shade")).unwrap();
    std::fs::write(
        xdg.join("shade/config.toml"),
        "[outside]\nkeep = [\"~/.claude\", \"~/data\"]\n",
    )
    .unwrap();
    if who == Who::Plain {
        common::plain::chown_tree(&home);
        common::plain::chown_tree(&xdg);
    }
    let hook = r#"{"hooks":{"SessionStart":[{"hooks":[{"type":"command","command":"id"}]}]}}"#;
    let script =
        format!("echo fixed > file; echo '{hook}' > ~/.claude/settings.json; echo d > ~/data/x");
    let run = |extra: &[&str]| {
        let o = e
            .shade()
            .env("HOME", &home)
            .env("XDG_CONFIG_HOME", &xdg)
            .args(["run", "--accept"])
            .args(extra)
            .args(["--", "sh", "-c", &script])
            .output()
            .unwrap();
        ran(&o);
        o
    };
    let o = run(&[]);
    let settings = std::fs::read_to_string(home.join(".claude/settings.json")).unwrap();
    assert_eq!(
        settings,
        "{}
",
        "a standing rule kept the planted hook
{}",
        show(&o)
    );
    assert_eq!(
        std::fs::read_to_string(home.join("data/x")).unwrap_or_default(),
        "d
",
        "the standing rule did not keep plain data
{}",
        show(&o)
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("runs code"),
        "the hook was not flagged
{}",
        show(&o)
    );
    std::fs::write(e.project.join("file"), "orig").unwrap();
    let named = home.join(".claude/settings.json").display().to_string();
    let o = run(&["--keep-outside", &named]);
    let settings = std::fs::read_to_string(home.join(".claude/settings.json")).unwrap();
    assert!(
        settings.contains("SessionStart"),
        "--keep-outside naming the file did not keep it
{}",
        show(&o)
    );
}

/// A host directory beside the project, writable by the test's user, holding a canary:
/// where the links a command plants in a branch lead.
fn host_canary(e: &Env) -> PathBuf {
    let dir = e.out.parent().unwrap().join("host");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("canary.txt"), "HOST-CANARY\n").unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    if e.who == Who::Plain {
        let (uid, gid) = plain_ids();
        for p in [&dir, &dir.join("canary.txt")] {
            std::os::unix::fs::chown(p, Some(uid), Some(gid)).unwrap();
        }
    }
    dir
}

/// Shade neither wrote in `host` nor changed its canary.
fn assert_host_untouched(host: &Path, what: &str) {
    let mut names: Vec<String> = std::fs::read_dir(host)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["canary.txt"],
        "{what}: shade wrote in the host directory"
    );
    assert_eq!(
        std::fs::read_to_string(host.join("canary.txt")).unwrap(),
        "HOST-CANARY\n",
        "{what}: shade changed the host's canary"
    );
}

/// Python that makes `d` and `l` (in its working directory, or the directory its argument
/// names) trade places until `stop` appears there (a bounded number of swaps).
const SWAP: &str = r#"
import ctypes, os, sys
if len(sys.argv) > 1:
    os.chdir(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
for i in range(2000000):
    if i % 500 == 0 and os.path.exists("stop"):
        break
    if libc.renameat2(-100, b"d", -100, b"l", 2) != 0:
        os.rename("d", "t"); os.rename("l", "d"); os.rename("d", "l"); os.rename("t", "d")
"#;

/// A command that makes `d` (a directory holding a.txt) and `l` (a link to `host`), says
/// `ready`, then swaps them (see [`SWAP`]).
fn swapper(host: &Path) -> String {
    format!(
        "mkdir -p d && echo branchfile > d/a.txt && ln -s {host} l && touch ready && {PYTHON} -c '{SWAP}'",
        host = host.display()
    )
}

/// `shade mcp`'s file tools while a `run_command` of the same branch swaps a directory
/// with a link to the host (red team h5, item 1): no call reads, lists or writes the host
/// directory. On main read_file returned the host file and grep found it in every call.
fn mcp_file_tools_race(who: Who) {
    let e = env(who);
    let host = host_canary(&e);
    let mut mcp = Mcp::start(&e);
    let made = mcp.tool("create_branch", serde_json::json!({}));
    let id = made
        .split_whitespace()
        .nth(2)
        .unwrap_or_default()
        .trim_end_matches(|c: char| !c.is_alphanumeric())
        .to_string();
    assert!(id.starts_with('b'), "no branch: {made}");
    // Started, not awaited: the swapper runs while the file tools do.
    let rid = mcp.next;
    mcp.next += 1;
    mcp.send(
        &serde_json::json!({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
        "params": {"name": "run_command", "arguments": {"branch": id, "command": swapper(&host)}}}),
    );
    let mut ready = false;
    for _ in 0..600 {
        if mcp
            .tool("ls", serde_json::json!({"branch": id}))
            .contains("ready")
        {
            ready = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(ready, "the swapper did not start");
    let mut leaks = Vec::new();
    for _ in 0..300 {
        let read = mcp.tool(
            "read_file",
            serde_json::json!({"branch": id, "path": "d/canary.txt"}),
        );
        let grep = mcp.tool(
            "grep",
            serde_json::json!({"branch": id, "pattern": "HOST-CANARY"}),
        );
        let ls = mcp.tool("ls", serde_json::json!({"branch": id, "path": "d"}));
        mcp.tool(
            "write_file",
            serde_json::json!({"branch": id, "path": "d/pwned", "content": "written by a branch\n"}),
        );
        mcp.tool(
            "edit",
            serde_json::json!({"branch": id, "path": "d/canary.txt",
                "old_string": "HOST-CANARY", "new_string": "EDITED"}),
        );
        for (what, text) in [("read_file", read), ("grep", grep), ("ls", ls)] {
            // (grep's "no matches" answer repeats the pattern: a hit is `path:1: line`.)
            if text.contains("1: HOST-CANARY")
                || text.starts_with("HOST-CANARY")
                || text.contains("canary.txt (")
            {
                leaks.push(format!("{what}: {text}"));
            }
        }
    }
    mcp.tool(
        "write_file",
        serde_json::json!({"branch": id, "path": "stop", "content": ""}),
    );
    drop(mcp);
    assert!(
        leaks.is_empty(),
        "{who:?}: file tools reached the host in {} calls, first: {}",
        leaks.len(),
        leaks[0]
    );
    assert_host_untouched(&host, "shade mcp's file tools");
}

/// `shade lint` (cold, then the warm daemon) after the project's own checker planted
/// `d -> host` in the lint branch (red team h5, item 2): the patch's `d/pwned` is not
/// written on the host. No race: on main it landed there every time.
fn lint_planted_symlink(who: Who) {
    let e = env(who);
    let host = host_canary(&e);
    let root = e.out.parent().unwrap().to_path_buf();
    let config = root.join("lint.toml");
    std::fs::write(
        &config,
        "[lint]\ncheckers = [\"command\"]\ncommand = [\"sh\", \"lint.sh\"]\n",
    )
    .unwrap();
    let script = e.project.join("lint.sh");
    std::fs::write(
        &script,
        format!("ln -s {} d 2>/dev/null; true\n", host.display()),
    )
    .unwrap();
    let patch = root.join("edit.patch");
    std::fs::write(
        &patch,
        "--- /dev/null\n+++ b/d/pwned\n@@ -0,0 +1 @@\n+written by shade lint outside its branch\n",
    )
    .unwrap();
    for p in [&config, &patch] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    if e.who == Who::Plain {
        let (uid, gid) = plain_ids();
        std::os::unix::fs::chown(&script, Some(uid), Some(gid)).unwrap();
    }
    for mode in [&["--cold"][..], &[]] {
        let o = e
            .shade()
            .arg("lint")
            .args(mode)
            .arg("--patch")
            .arg(&patch)
            .env("SHADE_CONFIG", &config)
            .output()
            .unwrap();
        assert_host_untouched(&host, &format!("shade lint {mode:?}\n{}", show(&o)));
    }
    let o = e.shade().args(["lint", "--stop"]).output().unwrap();
    assert!(o.status.success(), "lint --stop\n{}", show(&o));
    assert_host_untouched(&host, "shade lint");
}

/// The FUSE branch mounted under `state`, if any.
fn branch_mount(state: &Path) -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    mounts
        .lines()
        .filter(|l| l.contains(" - fuse"))
        .filter_map(|l| l.split(' ').nth(4))
        .find(|m| Path::new(m).starts_with(state))
        .map(PathBuf::from)
}

/// The agent's own file tools in `exec --shadow` while the branch's `d` and a link to the
/// host trade places (red team h5, item 1, for the agent): write_file, edit, read_file, grep
/// and ls never reach the host directory, and nothing the model is sent holds the host's
/// canary. The swapping is what a process a command left behind (or a language server in
/// the branch) does; a command of `exec` does not outlive its call, so the test runs it as
/// the test's user in the branch mount, started once the shell made `d` and `l`.
fn agent_tools_race(who: Who) {
    use std::sync::{Arc, Mutex};
    let e = env(who);
    let host = host_canary(&e);
    let setup = format!(
        "mkdir -p d && echo branchfile > d/a.txt && ln -s {} l && echo started",
        host.display()
    );
    const ROUNDS: usize = 40;
    const PER_ROUND: usize = 7;
    let swapping: Arc<Mutex<Option<Child>>> = Arc::new(Mutex::new(None));
    let (state, plain, sw) = (e.state.clone(), e.who == Who::Plain, swapping.clone());
    let llm = shade_testkit::FakeLlm::start(Arc::new(move |body: &serde_json::Value| {
        let done = shade_testkit::tool_results_since_user(body);
        if done == 0 {
            return shade_testkit::Reply::tool("shell", serde_json::json!({ "command": setup }));
        }
        let mut running = sw.lock().unwrap();
        if running.is_none() {
            let mount = branch_mount(&state).expect("the shadow branch is mounted");
            let mut c = if plain {
                let mut c = Command::new("/usr/bin/setpriv");
                c.args([
                    &format!("--reuid={PLAIN}"),
                    &format!("--regid={PLAIN}"),
                    "--init-groups",
                    "--",
                    PYTHON,
                ]);
                c
            } else {
                Command::new(PYTHON)
            };
            *running = Some(
                // (chdir as the user: root may not enter the plain user's FUSE mount.)
                c.args(["-c", SWAP])
                    .arg(mount)
                    .stdin(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap(),
            );
        }
        if done < 1 + PER_ROUND * ROUNDS {
            // Arguments differ each round, or shade would stop the model as looping.
            let n = done;
            shade_testkit::Reply::tool(
                "write_file",
                serde_json::json!({"path": "d/pwned", "content": format!("x{n}\n")}),
            )
            .and_tool(
                "edit",
                serde_json::json!({"path": "d/canary.txt",
                    "old_string": "HOST-CANARY", "new_string": format!("EDITED{n}")}),
            )
            .and_tool(
                "read_file",
                serde_json::json!({"path": "d/canary.txt", "limit": n}),
            )
            .and_tool(
                "read_file",
                serde_json::json!({"path": "d/canary.txt", "limit": n + 1}),
            )
            .and_tool(
                "read_file",
                serde_json::json!({"path": "d/canary.txt", "limit": n + 2}),
            )
            .and_tool(
                "grep",
                serde_json::json!({"pattern": "HOST-CANARY", "max_results": n}),
            )
            .and_tool("ls", serde_json::json!({"path": "d"}))
        } else if done < 2 + PER_ROUND * ROUNDS {
            shade_testkit::Reply::tool("shell", serde_json::json!({ "command": "touch stop" }))
        } else {
            shade_testkit::Reply::text("Done.")
        }
    }))
    .unwrap();
    let config = e.out.join("../agent-config");
    std::fs::create_dir_all(&config).unwrap();
    if e.who == Who::Plain {
        let (uid, gid) = plain_ids();
        std::os::unix::fs::chown(&config, Some(uid), Some(gid)).unwrap();
    }
    let o = e
        .shade()
        .args(["exec", "--shadow", "--approval", "yolo", "go"])
        .env("XDG_CONFIG_HOME", &config)
        .env("OPENAI_BASE_URL", &llm.base_url)
        .env("OPENAI_API_KEY", "test-key")
        .env("SHADE_MODEL", "main-model")
        .env("SHADE_FAST_MODEL", "fast-model")
        .output()
        .unwrap();
    let swapper = swapping.lock().unwrap().take();
    if let Some(mut c) = swapper {
        let _ = c.kill();
        let _ = c.wait();
    }
    let log = show(&o);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("Done."),
        "the agent did not finish\n{log}"
    );
    let sent: Vec<String> = llm.requests().iter().map(|b| b.to_string()).collect();
    assert!(
        sent.iter().any(|b| b.contains("started")),
        "the shell did not make d and l\n{log}"
    );
    let leaked = sent
        .iter()
        .filter(|b| {
            b.contains("HOST-CANARY\\n")
                || b.contains("1: HOST-CANARY")
                || b.contains("canary.txt (")
        })
        .count();
    assert_eq!(
        leaked, 0,
        "{who:?}: the model was sent the host's file\n{log}"
    );
    assert_host_untouched(&host, &format!("exec --shadow\n{log}"));
}

/// Ends the other shade's command (its stop file) however the test ends.
struct Ender {
    child: Child,
    stop: PathBuf,
}

impl Drop for Ender {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.stop, "");
        let _ = self.child.wait();
    }
}

/// Another shade of the same user with another state dir (red team 6 route 2: an MCP
/// server with another XDG_STATE_HOME, a per-project SHADE_STATE_DIR) holds a live branch
/// with a new file it has not accepted and a write it made outside its project: a command
/// of this shade reads neither, through that branch's mount, its outside layer or its
/// store, and does not even list that state dir.
fn other_state_dir_hidden(who: Who) {
    let e = env(who);
    let b = env(who);
    let w = own_dir(&b, "w");
    let child: Child = b
        .shade()
        .args(["run", "--", "sh", "-c"])
        .arg(format!(
            "echo B-NEW-h28 > new.txt; echo B-OUT-h28 > {W}/secret; echo up > {O}/ready; \
             while [ ! -e {O}/stop ] && [ -d {O} ]; do sleep 0.2; done",
            W = w.display(),
            O = b.o()
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut other = Ender {
        child,
        stop: b.out.join("stop"),
    };
    common::wait_until("the other shade's command to start", 120, || {
        b.out.join("ready").exists()
    });
    let mount = branch_mount(&b.state).expect("the other shade's branch is mounted");
    let branch = mount.parent().unwrap().to_path_buf();
    // What there is to read, seen from the host by the same user: the attack is real.
    let mut cat = match who {
        Who::Root => Command::new("cat"),
        Who::Plain => {
            let mut c = Command::new("/usr/bin/setpriv");
            c.args([
                &format!("--reuid={PLAIN}"),
                &format!("--regid={PLAIN}"),
                "--init-groups",
                "cat",
            ]);
            c
        }
    };
    let new = String::from_utf8(cat.arg(mount.join("new.txt")).output().unwrap().stdout).unwrap();
    let grep = Command::new("grep")
        .args(["-rl", "B-OUT-h28"])
        .arg(branch.join("outside"))
        .output()
        .unwrap();
    let s = b.state.display().to_string();
    let probe = format!(
        r#"v=$(cat {S}/branches/*/mnt/new.txt {M}/new.txt 2>/dev/null); [ -z "$v" ] || echo "$v" > {O}/mnt
        v=$(grep -rh B-OUT-h28 {S} {B} 2>/dev/null); [ -z "$v" ] || echo "$v" > {O}/outside
        v=$(ls -A {S} 2>/dev/null; ls -A {B} 2>/dev/null); [ -z "$v" ] || echo "$v" > {O}/listed
        true"#,
        S = s,
        M = mount.display(),
        B = branch.display(),
        O = e.o()
    );
    // Found from the registry and from the mount table; then from the mount table alone
    // (the other state dir's registry entry set aside for that run).
    let both = e.run(&[], &probe);
    let registry = match who {
        Who::Root => PathBuf::from("/root"),
        Who::Plain => PathBuf::from(format!("/home/{PLAIN}")),
    }
    .join(".local/state/shade-state-dirs");
    let entry = std::fs::read_dir(&registry)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|l| std::fs::read_link(l).is_ok_and(|t| t == b.state));
    if let Some(entry) = &entry {
        std::fs::remove_file(entry).unwrap();
    }
    let mounted = e.run(&[], &probe);
    if let Some(entry) = &entry {
        std::os::unix::fs::symlink(&b.state, entry).unwrap();
        if who == Who::Plain {
            let (uid, gid) = plain_ids();
            std::os::unix::fs::lchown(entry, Some(uid), Some(gid)).unwrap();
        }
    }
    std::fs::write(&other.stop, "").unwrap();
    let status = other.child.wait().unwrap();
    // No branch mounted any more: found from the registry alone.
    let listed = e.run(
        &[],
        &format!(
            r#"v=$(ls -A {s} 2>/dev/null); [ -z "$v" ] || echo "$v" > {}/listed; true"#,
            e.o()
        ),
    );
    b.recover();
    assert_eq!(
        new.trim(),
        "B-NEW-h28",
        "the other branch holds no new file"
    );
    assert!(
        !grep.stdout.is_empty(),
        "the other branch's outside layer holds no write\n{}",
        String::from_utf8_lossy(&grep.stderr)
    );
    assert!(status.success(), "the other shade failed");
    assert!(
        std::fs::read_dir(&b.state).unwrap().count() > 1,
        "the other state dir is empty: nothing to hide"
    );
    for o in [&both, &mounted, &listed] {
        ran(o);
        e.assert_held(o);
    }
    assert!(entry.is_some(), "the other state dir is not registered");
}

macro_rules! both {
    ($($route:ident),* $(,)?) => {
        mod as_root {
            $(#[test] fn $route() { super::$route(super::Who::Root) })*
        }
        mod as_plain_user {
            $(#[test] fn $route() { super::$route(super::Who::Plain) })*
        }
    };
}

both!(
    proc_root,
    proc_fds,
    umount_project,
    nsenter_mount,
    chroot_parent,
    daemon_outlives_run,
    killed_shade_kills_the_sandbox,
    no_network_reaches_host,
    raw_device,
    ptrace_shade,
    open_by_handle,
    forged_journal,
    inherited_fds,
    refused_without_sandbox,
    project_root_refused,
    exec_shadow,
    planted_privileges,
    io_uring,
    host_sockets,
    allowed_socket_planted_link,
    allowed_socket_read_only,
    limits_fork_bomb,
    limits_tmp_and_shm,
    limits_branch_size,
    limits_hidden_dirs,
    limits_outside_size,
    limits_outside_xattrs,
    limits_outside_many_units,
    limits_xattr_flood,
    limits_time,
    host_knobs,
    agent_env_allowlist,
    agent_home_credentials,
    agent_home_config_secrets,
    net_admin,
    inotify_bounded,
    standing_keep_rules,
    mcp_file_tools_race,
    lint_planted_symlink,
    agent_tools_race,
    other_state_dir_hidden,
);

/// A command allocating past its memory limit (1 GiB touched, 256 MiB allowed) does not
/// get it. As root the OOM killer of the command's cgroup ends the allocating process, shade
/// says so in one line and survives, and the branch still serves what the command wrote
/// before. As a plain user (no cgroup of their own) `RLIMIT_AS` refuses the allocation.
fn limits_memory(who: Who) {
    let e = env(who);
    let script = format!(
        r#"echo kept > kept; {PYTHON} -c 'x = b"x" * (1 << 30); print("allocated", len(x))'; echo "python $?"; cat kept"#
    );
    let b = run_limited(&e, "[sandbox.run]\nmemory = \"256MiB\"\n", &[], &script);
    let o = &b.out;
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        !text.contains("allocated"),
        "1 GiB was allocated under a 256 MiB limit\n{}",
        show(o)
    );
    match who {
        Who::Root => {
            assert!(text.contains("python 137"), "not killed\n{}", show(o));
            stderr_says(o, "shade: the command reached its 256 MiB memory limit");
        }
        Who::Plain => assert!(
            text.contains("python 1") && String::from_utf8_lossy(&o.stderr).contains("MemoryError"),
            "the allocation was not refused\n{}",
            show(o)
        ),
    }
    assert!(
        text.contains("kept"),
        "the branch lost its file\n{}",
        show(o)
    );
    assert_eq!(o.status.code(), Some(0), "{}", show(o));
    assert!(
        b.max_rss_kb < 512 * 1024,
        "shade grew to {} MiB\n{}",
        b.max_rss_kb / 1024,
        show(o)
    );
    e.assert_held(o);
}

#[test]
fn limits_memory_as_root() {
    limits_memory(Who::Root);
}

#[test]
fn limits_memory_as_plain_user() {
    limits_memory(Who::Plain);
}

/// How many empty files a command makes in `dir` (with an 8 MiB /tmp and /dev/shm, up to
/// 20000) before ENOSPC; panics if it was not ENOSPC that stopped it.
fn inode_flood(e: &Env, dir: &str) -> u64 {
    let script = format!(
        r#"mkdir -p {dir}/flood && cd {dir}/flood && {PYTHON} -c '
n, err = 0, 0
try:
    while n < 20000:
        open("f%d" % n, "w").close()
        n += 1
except OSError as e:
    err = e.errno
print("files", n, "errno", err)
'"#
    );
    let b = run_limited(
        e,
        "[sandbox.run]\ntmp_size = \"8MiB\"\nshm_size = \"8MiB\"\n",
        &["--private-tmp"],
        &script,
    );
    let o = &b.out;
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    let files: u64 = text
        .split_whitespace()
        .skip_while(|w| *w != "files")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count\n{}", show(o)));
    assert!(
        text.contains(&format!("errno {}", libc::ENOSPC)),
        "{files} files in {dir} and no ENOSPC\n{}",
        show(o)
    );
    e.assert_held(o);
    files
}

/// What is checked of an allowed socket is what is bound (attack round): a process that
/// writes a directory for real (here SHADE_SHARE's) swaps the allowed path between a socket
/// of its own and a symlink to another socket (the session bus, docker's), thousands of
/// times a second. shade's check saw the socket, bubblewrap (or, as root, the stage) then
/// bound whatever the path was a moment later: the victim, idmapped as root. Now the socket
/// is pinned by the check and the bind is refused unless it is that very socket.
fn allowed_socket_race(who: Who) {
    use std::os::unix::net::UnixListener;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let e = env(who);
    let dir = e.out.parent().unwrap().to_path_buf();
    let share = dir.join("share");
    let victim = dir.join("victim.sock");
    let l = UnixListener::bind(&victim).unwrap();
    l.set_nonblocking(true).unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o777)).unwrap();
    let allowed = share.join("app.sock");
    let stop = Arc::new(AtomicBool::new(false));
    let racer = {
        let (stop, share, allowed, victim) =
            (stop.clone(), share.clone(), allowed.clone(), victim.clone());
        std::thread::spawn(move || {
            use std::os::unix::ffi::OsStrExt;
            // The racer's own socket at the allowed path, a link to the victim beside it;
            // each renameat2(RENAME_EXCHANGE) swaps them in one step.
            let own = UnixListener::bind(&allowed).unwrap();
            std::fs::set_permissions(&allowed, std::fs::Permissions::from_mode(0o777)).unwrap();
            let link = share.join("app.lnk");
            std::os::unix::fs::symlink(&victim, &link).unwrap();
            let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
            let (x, y) = (c(&allowed), c(&link));
            let mut swaps = 0u64;
            // Bounded: the runs below end it, or this many swaps do.
            while !stop.load(Ordering::Relaxed) && swaps < 100_000_000 {
                // SAFETY: renameat2(2) of two NUL-terminated paths.
                let r = unsafe {
                    libc::renameat2(
                        libc::AT_FDCWD,
                        x.as_ptr(),
                        libc::AT_FDCWD,
                        y.as_ptr(),
                        libc::RENAME_EXCHANGE,
                    )
                };
                assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
                swaps += 1;
            }
            drop(own);
            swaps
        })
    };
    let a = allowed.display().to_string();
    let mut outputs = Vec::new();
    let mut reached = false;
    // On main the victim was reached within 1 to 12 runs (six tries); each run here costs
    // a sandbox start.
    for _ in 0..24 {
        outputs.push(e.run(
            &["--allow-socket", &a],
            &format!(
                r#"{PYTHON} -c '
import socket
c = socket.socket(socket.AF_UNIX); c.settimeout(2)
try:
    c.connect("{a}"); print("connected")
except OSError as e:
    print("refused", e)
'"#
            ),
        ));
        if l.accept().is_ok() {
            reached = true;
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = racer.join().unwrap();
    let last = outputs.last().unwrap();
    assert!(swaps > 100, "the racer did not race ({swaps} swaps)");
    let connected = outputs
        .iter()
        .filter(|o| String::from_utf8_lossy(&o.stdout).contains("connected"))
        .count();
    eprintln!(
        "{swaps} swaps; {connected} of {} runs connected to the racer's own socket",
        outputs.len()
    );
    assert!(
        !reached,
        "an allowed socket swapped for a link while shade bound it: the other socket was \
         reached after {} runs\n{}",
        outputs.len(),
        show(last)
    );
    e.assert_held(last);
}

#[test]
fn allowed_socket_race_as_root() {
    allowed_socket_race(Who::Root);
}

#[test]
fn allowed_socket_race_as_plain_user() {
    allowed_socket_race(Who::Plain);
}

/// A shade killed with SIGKILL while its command's sandbox is being set up leaves nothing
/// running past the next shade start: bubblewrap ties its inner process to its outer one
/// only at the end of its set-up, so a kill in that window (tens of ms) used to leave the
/// command running unwatched, with no time limit (6 of 40 kills here before). The kills
/// land at delays spread over the start; the next command's shade kills what is left in
/// the dead shade's cgroup.
#[test]
fn a_shade_killed_while_starting_leaves_nothing_running() {
    let e = env(Who::Root);
    let marker = format!("{}.{}", 7000 + std::process::id() % 1000, 4321);
    let running = || -> Vec<String> {
        let mut found = Vec::new();
        for p in std::fs::read_dir("/proc").unwrap().flatten() {
            if let Ok(c) = std::fs::read(p.path().join("cmdline")) {
                let c = String::from_utf8_lossy(&c).replace('\0', " ");
                if c.trim() == format!("sleep {marker}") {
                    found.push(p.file_name().to_string_lossy().into_owned());
                }
            }
        }
        found
    };
    for i in 0..40u64 {
        let mut child: Child = e
            .shade()
            .args(["run", "--", "sleep", &marker])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(2 + (i % 20) * 4));
        // SAFETY: kill(2) of our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        let _ = child.wait();
    }
    // Let every sandbox that was going to die with its shade do so.
    std::thread::sleep(Duration::from_secs(2));
    let o = e.run(&[], "true");
    ran(&o);
    let left = running();
    for pid in &left {
        // SAFETY: kill(2); cleaning up after a failed check.
        unsafe { libc::kill(pid.parse().unwrap(), libc::SIGKILL) };
    }
    e.recover();
    assert!(
        left.is_empty(),
        "still running after the next start: {left:?}"
    );
}

/// A shade killed with SIGKILL cannot remove its command's cgroup; the next command's
/// shade does (`shade-PID-N` of a PID that is gone, empty), so killed runs do not pile up
/// cgroups on the host.
#[test]
fn killed_shades_cgroups_are_swept() {
    let e = env(Who::Root);
    let mut child: Child = e
        .shade()
        .args(["run", "--", "sh", "-c"])
        .arg(format!("echo up > {}/ready; sleep 100", e.o()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    common::wait_until("the command to start", 60, || e.out.join("ready").exists());
    // `shade-PID-N-PIDNS`.
    let name = format!("shade-{}-0-", child.id());
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let mut dirs: Vec<PathBuf> = vec![
        PathBuf::from("/sys/fs/cgroup"),
        PathBuf::from("/sys/fs/cgroup/unified"),
    ];
    for line in own.lines() {
        let mut f = line.splitn(3, ':');
        let (_, ctrls, path) = (f.next().unwrap(), f.next().unwrap(), f.next().unwrap());
        let rel = path.trim_start_matches('/');
        if ctrls.is_empty() {
            dirs.push(Path::new("/sys/fs/cgroup").join(rel));
            dirs.push(Path::new("/sys/fs/cgroup/unified").join(rel));
        }
        for c in ctrls.split(',').filter(|c| ["memory", "pids"].contains(c)) {
            dirs.push(Path::new("/sys/fs/cgroup").join(c).join(rel));
            dirs.push(Path::new("/sys/fs/cgroup").join(c));
        }
    }
    let made: Vec<PathBuf> = dirs
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flat_map(|r| r.flatten().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&name))
        })
        .filter(|d| d.is_dir())
        .collect();
    assert!(!made.is_empty(), "no cgroup {name} for the command");
    // SAFETY: kill(2) of our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
    // The sandbox dies with it (bwrap's --die-with-parent); the cgroup is left empty.
    common::wait_until("the sandbox to end", 30, || {
        made.iter().all(|d| {
            std::fs::read_to_string(d.join("cgroup.procs")).is_ok_and(|p| p.trim().is_empty())
        })
    });
    assert!(made.iter().all(|d| d.is_dir()), "removed already?");
    let o = e.run(&[], "true");
    ran(&o);
    let left: Vec<&PathBuf> = made.iter().filter(|d| d.is_dir()).collect();
    e.recover();
    assert!(left.is_empty(), "left behind: {left:?}\n{}", show(&o));
}
