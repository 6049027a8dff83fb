//! Runner tests with a plain directory standing in for the branch mount (no FUSE needed).
//! They need root for mount namespaces and fail loudly without it.
#![allow(clippy::unwrap_used)]

use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::*;

/// Runs are serialized: the signal test interrupts the whole test process.
static LOCK: Mutex<()> = Mutex::new(());

struct Fixture {
    _lock: MutexGuard<'static, ()>,
    _dir: tempfile::TempDir,
    project: PathBuf,
    mnt: PathBuf,
    /// Outside both: where commands leave evidence for the test to read.
    out: PathBuf,
}

fn fixture() -> Fixture {
    let lock = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    assert!(
        nix::unistd::geteuid().is_root(),
        "the runner tests need root (they create mount namespaces); run `cargo test -p shade-fusefs` as root"
    );
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let root = dir.path().canonicalize().unwrap();
    let (project, mnt, out) = (root.join("project"), root.join("mnt"), root.join("out"));
    for d in [&project, &mnt, &out] {
        fs::create_dir(d).unwrap();
    }
    fs::write(project.join("a"), "real").unwrap();
    fs::write(mnt.join("a"), "shadow").unwrap();
    // The command's root is the sandbox's unprivileged host id (ids.rs): the plain
    // directory standing in for a branch, and `out`, are that id's, as a branch would show
    // them; `out` is bound in for real (see `spec`).
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
    let b = super::sandbox_base();
    for p in [&mnt, &mnt.join("a"), &out] {
        std::os::unix::fs::chown(p, Some(b), Some(b)).unwrap();
    }
    Fixture {
        _lock: lock,
        _dir: dir,
        project,
        mnt,
        out,
    }
}

impl Fixture {
    fn spec(&self, script: &str) -> RunSpec {
        RunSpec {
            project: self.project.clone(),
            mount: self.mnt.clone(),
            cwd: self.project.clone(),
            argv: ["sh", "-c", script].map(OsString::from).to_vec(),
            env: Vec::new(),
            env_policy: super::EnvPolicy::Agent,
            timeout: Some(Duration::from_secs(30)),
            output: Output::Inherit,
            tee: None,
            foreground: false,
            user_session: false,
            isolation: Isolation::default(),
            binds: vec![super::Bind {
                source: self.out.clone(),
                target: self.out.clone(),
            }],
            outside: None,
        }
    }

    fn run(&self, script: &str) -> RunOutcome {
        run(&self.spec(script)).unwrap()
    }

    fn out(&self, name: &str) -> String {
        fs::read_to_string(self.out.join(name)).unwrap_or_default()
    }
}

/// Processes still alive whose command line mentions `marker`.
fn alive_with(marker: &str) -> usize {
    fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let state = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            String::from_utf8_lossy(&cmdline).contains(marker) && !state.contains(") Z")
        })
        .count()
}

#[test]
fn command_sees_branch_at_the_real_path() {
    let f = fixture();
    let script = format!(
        r#"cat "$PWD/a" > {out}/seen; cat {project}/a >> {out}/seen; echo x > {project}/b; pwd > {out}/pwd"#,
        out = f.out.display(),
        project = f.project.display()
    );
    let outcome = f.run(&script);
    assert_eq!(outcome.termination, Termination::Exited(0));
    assert!(outcome.namespaced);
    assert_eq!(f.out("seen"), "shadowshadow");
    assert_eq!(f.out("pwd").trim(), f.project.to_str().unwrap());
    assert_eq!(fs::read_to_string(f.mnt.join("b")).unwrap(), "x\n");
    assert!(
        !f.project.join("b").exists(),
        "write went through to the real tree"
    );
    assert_eq!(fs::read_to_string(f.project.join("a")).unwrap(), "real");
}

#[test]
fn cwd_in_a_subdirectory_is_entered_after_the_bind() {
    let f = fixture();
    fs::create_dir(f.project.join("sub")).unwrap();
    fs::create_dir(f.mnt.join("sub")).unwrap();
    fs::write(f.mnt.join("sub/s"), "shadow-sub").unwrap();
    let b = super::sandbox_base();
    std::os::unix::fs::chown(f.mnt.join("sub"), Some(b), Some(b)).unwrap();
    let mut spec = f.spec(&format!("cat s > {}/seen; echo y > rel", f.out.display()));
    spec.cwd = f.project.join("sub");
    assert_eq!(run(&spec).unwrap().termination, Termination::Exited(0));
    assert_eq!(f.out("seen"), "shadow-sub");
    assert!(f.mnt.join("sub/rel").exists());
    assert!(!f.project.join("sub/rel").exists());
}

#[test]
fn exit_status_passes_through() {
    let f = fixture();
    let outcome = f.run("exit 42");
    assert_eq!(outcome.termination, Termination::Exited(42));
    assert_eq!(outcome.exit_code(), 42);
    assert_eq!(f.run("true").exit_code(), 0);
}

#[test]
fn death_by_signal_is_128_plus_n() {
    let f = fixture();
    let outcome = f.run("kill -SEGV $$");
    assert_eq!(outcome.termination, Termination::Signaled(libc::SIGSEGV));
    assert_eq!(outcome.exit_code(), 128 + libc::SIGSEGV);
}

#[test]
fn timeout_kills_the_whole_process_group() {
    let f = fixture();
    let marker = "shade-timeout-test";
    let mut spec = f.spec(&format!("sleep 100 & exec -a {marker} sleep 100"));
    // `exec -a` is not POSIX; name the background sleep through a copy instead.
    let sleeper = f.out.join(marker);
    fs::copy(which("sleep"), &sleeper).unwrap();
    spec.argv = [
        "sh",
        "-c",
        &format!("{s} 100 & {s} 100", s = sleeper.display()),
    ]
    .map(OsString::from)
    .to_vec();
    spec.timeout = Some(Duration::from_millis(500));
    let start = Instant::now();
    let outcome = run(&spec).unwrap();
    assert_eq!(outcome.termination, Termination::TimedOut);
    assert_eq!(outcome.exit_code(), EXIT_TIMED_OUT);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
    assert_eq!(
        alive_with(marker),
        0,
        "a process of the timed-out command survived"
    );
}

#[test]
fn leftover_processes_are_killed_and_counted() {
    let f = fixture();
    let marker = "shade-leftover-test";
    let sleeper = f.out.join(marker);
    fs::copy(which("sleep"), &sleeper).unwrap();
    let outcome = f.run(&format!(
        "{s} 100 & {s} 100 & exit 3",
        s = sleeper.display()
    ));
    assert_eq!(outcome.termination, Termination::Exited(3));
    // Confined, the kernel kills what is left in the PID namespace as soon as the command
    // ends, often before the supervisor can count it: the count is best effort, the kill is
    // not.
    assert!(outcome.leftovers_killed <= 2, "{outcome:?}");
    assert_eq!(alive_with(marker), 0);
}

#[test]
fn unconfined_leftover_processes_are_killed_and_counted() {
    let f = fixture();
    let marker = "shade-leftover-unconfined";
    let sleeper = f.out.join(marker);
    fs::copy(which("sleep"), &sleeper).unwrap();
    let mut spec = f.spec(&format!(
        "{s} 100 & {s} 100 & exit 3",
        s = sleeper.display()
    ));
    spec.isolation.unconfined = true;
    let outcome = run(&spec).unwrap();
    assert_eq!(outcome.termination, Termination::Exited(3));
    assert_eq!(outcome.leftovers_killed, 2);
    assert_eq!(alive_with(marker), 0);
}

#[test]
fn daemons_that_leave_the_process_group_are_found_by_namespace() {
    let f = fixture();
    if which_opt("setsid").is_none() {
        panic!("setsid (util-linux) is needed for this test");
    }
    let marker = "shade-setsid-test";
    let sleeper = f.out.join(marker);
    fs::copy(which("sleep"), &sleeper).unwrap();
    let outcome = f.run(&format!(
        "setsid {s} 100 & sleep 0.2",
        s = sleeper.display()
    ));
    assert_eq!(outcome.termination, Termination::Exited(0));
    // Best effort when confined (see leftover_processes_are_killed_and_counted).
    assert!(outcome.leftovers_killed <= 1, "{outcome:?}");
    assert_eq!(alive_with(marker), 0);
}

#[test]
fn missing_program_cannot_exec() {
    let f = fixture();
    let mut spec = f.spec("");
    spec.argv = vec![OsString::from("shade-no-such-program")];
    let outcome = run(&spec).unwrap();
    assert!(
        matches!(&outcome.termination, Termination::CannotExec(m) if m.contains("shade-no-such-program")),
        "{outcome:?}"
    );
    assert_eq!(outcome.exit_code(), EXIT_CANNOT_EXEC);
}

#[test]
fn stdout_goes_to_our_stderr_when_asked() {
    let f = fixture();
    let ident = |fd: i32| {
        let m = fs::metadata(format!("/proc/self/fd/{fd}")).unwrap();
        format!("{}:{}", m.dev(), m.ino())
    };
    // find writes to a named file, so the command's own fd 1 is what gets examined.
    let script = format!(
        "find -L /proc/self/fd/1 -maxdepth 0 -fprintf {}/fd1 '%D:%i'",
        f.out.display()
    );
    let mut spec = f.spec(&script);
    spec.output = Output::StdoutToStderr;
    assert_eq!(run(&spec).unwrap().exit_code(), 0);
    assert_eq!(f.out("fd1").trim(), ident(2));
    spec.output = Output::Inherit;
    assert_eq!(run(&spec).unwrap().exit_code(), 0);
    assert_eq!(f.out("fd1").trim(), ident(1));
}

#[test]
fn interrupt_stops_the_command() {
    let f = fixture();
    let ready = f.out.join("ready");
    let mut spec = f.spec(&format!("touch {}; sleep 100", ready.display()));
    spec.foreground = true;
    let sender = std::thread::spawn(move || {
        while !ready.exists() {
            std::thread::sleep(Duration::from_millis(10));
        }
        // SAFETY: raising a signal our handler is installed for.
        unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
    });
    let outcome = run(&spec).unwrap();
    sender.join().unwrap();
    assert_eq!(outcome.termination, Termination::Interrupted(libc::SIGTERM));
    assert_eq!(outcome.exit_code(), 128 + libc::SIGTERM);
}

#[test]
fn network_isolation_leaves_only_loopback_up() {
    let f = fixture();
    let mut spec = f.spec(&format!(
        "ls /sys/class/net > {o}/ifaces; cat /sys/class/net/lo/operstate /sys/class/net/lo/flags > {o}/lo",
        o = f.out.display()
    ));
    spec.isolation.network = true;
    assert_eq!(run(&spec).unwrap().exit_code(), 0);
    // /sys shows the namespace that mounted it, so read flags via the ioctl's effect instead.
    let flags = f.out("lo");
    let flag_word = flags.lines().nth(1).unwrap();
    let flags = u32::from_str_radix(flag_word.trim_start_matches("0x"), 16).unwrap();
    assert!(
        flags & libc::IFF_UP as u32 != 0,
        "lo is not up: {flag_word}"
    );
}

#[test]
fn private_tmp_hides_the_real_tmp_but_keeps_the_branch() {
    let f = fixture();
    fs::write("/tmp/shade-runner-test-real", "x").unwrap();
    let mut spec = f.spec("true");
    spec.isolation.private_tmp = true;
    // Evidence goes into the branch.
    spec.argv[2] =
        OsString::from("ls -A /tmp > tmp-list; cat a > tmp-a; touch /tmp/shade-runner-inside");
    assert_eq!(run(&spec).unwrap().exit_code(), 0);
    let list = fs::read_to_string(f.mnt.join("tmp-list")).unwrap();
    assert!(
        !list.contains("shade-runner-test-real"),
        "real /tmp visible: {list}"
    );
    assert_eq!(fs::read_to_string(f.mnt.join("tmp-a")).unwrap(), "shadow");
    assert!(!Path::new("/tmp/shade-runner-inside").exists());
    fs::remove_file("/tmp/shade-runner-test-real").unwrap();
}

fn which_opt(prog: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(prog))
        .find(|p| p.is_file())
}

fn which(prog: &str) -> PathBuf {
    which_opt(prog).unwrap_or_else(|| panic!("{prog} not found in PATH"))
}

#[test]
fn a_command_ignoring_sigterm_is_killed_after_the_grace_period() {
    let f = fixture();
    // Ignored signals stay ignored across exec, so the sleep ignores SIGTERM too.
    let mut spec = f.spec("trap '' TERM; sleep 100; true");
    spec.timeout = Some(Duration::from_millis(300));
    let start = Instant::now();
    let outcome = run(&spec).unwrap();
    let took = start.elapsed();
    assert_eq!(outcome.termination, Termination::TimedOut);
    assert!(
        took >= GRACE && took < GRACE + Duration::from_secs(3),
        "took {took:?}"
    );
}

#[test]
fn a_second_signal_skips_the_grace_period() {
    let f = fixture();
    let ready = f.out.join("ready");
    let mut spec = f.spec(&format!(
        "trap '' TERM; touch {}; sleep 100; true",
        ready.display()
    ));
    spec.foreground = true;
    let sender = std::thread::spawn(move || {
        while !ready.exists() {
            std::thread::sleep(Duration::from_millis(10));
        }
        // SAFETY: raising signals our handler is installed for; the second arrives well
        // within the grace period, while run() is still waiting.
        unsafe { libc::kill(libc::getpid(), libc::SIGINT) };
        std::thread::sleep(Duration::from_millis(300));
        unsafe { libc::kill(libc::getpid(), libc::SIGINT) };
    });
    let start = Instant::now();
    let outcome = run(&spec).unwrap();
    let took = start.elapsed();
    sender.join().unwrap();
    assert_eq!(outcome.termination, Termination::Interrupted(libc::SIGINT));
    assert!(
        took < GRACE,
        "second Ctrl-C did not cut the grace short: {took:?}"
    );
}

/// Drops CAP_SYS_ADMIN from this thread's effective set, so children forked from it
/// cannot create mount namespaces. Capabilities are per thread; the test thread ends after.
fn drop_sys_admin_on_this_thread() {
    const CAP_SYS_ADMIN: u32 = 21;
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut header = Header {
        version: 0x2008_0522,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: capget/capset with the v3 header and two data words.
    unsafe {
        assert_eq!(
            libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()),
            0
        );
        data[0].effective &= !(1 << CAP_SYS_ADMIN);
        assert_eq!(
            libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()),
            0
        );
    }
}

#[test]
fn without_namespace_privileges_it_runs_in_the_mount_and_says_so() {
    let f = fixture();
    drop_sys_admin_on_this_thread();
    fs::create_dir(f.project.join("sub")).unwrap();
    fs::create_dir(f.mnt.join("sub")).unwrap();
    let mut spec = f.spec(&format!(
        "pwd > {o}/pwd; cat ../a > {o}/seen; echo z > new",
        o = f.out.display()
    ));
    // Only an unconfined run falls back; a confined one is refused (bwrap needs no
    // CAP_SYS_ADMIN of ours, so dropping it here does not stop it).
    spec.isolation.unconfined = true;
    // Unconfined, it writes `out` as it is (a bind would need a namespace).
    spec.binds.clear();
    spec.cwd = f.project.join("sub");
    let outcome = run(&spec).unwrap();
    assert_eq!(outcome.termination, Termination::Exited(0));
    assert!(!outcome.namespaced);
    assert_eq!(f.out("pwd").trim(), f.mnt.join("sub").to_str().unwrap());
    assert_eq!(f.out("seen"), "shadow");
    assert!(f.mnt.join("sub/new").exists());
    assert!(!f.project.join("sub/new").exists());
}

#[test]
fn isolation_without_namespace_privileges_is_refused() {
    let f = fixture();
    drop_sys_admin_on_this_thread();
    let mut spec = f.spec("true");
    spec.isolation.network = true;
    spec.isolation.unconfined = true;
    let err = run(&spec).unwrap_err();
    assert!(
        format!("{err:#}").contains("isolation needs a private namespace"),
        "{err:#}"
    );
}

#[test]
fn a_missing_mount_dir_is_a_clear_error() {
    let f = fixture();
    let mut spec = f.spec("true");
    spec.mount = f.out.join("no-such-mount");
    let err = format!("{:#}", run(&spec).unwrap_err());
    assert!(
        err.contains("bind-mounting the branch") && err.contains("no-such-mount"),
        "{err}"
    );
}

#[test]
fn captured_output_keeps_head_and_tail_and_stdin_is_empty() {
    let f = fixture();
    let mut spec = f.spec("cat; echo start; seq 1 100000; echo end; echo oops >&2; exit 5");
    spec.output = Output::Capture { cap: 1000 };
    let outcome = run(&spec).unwrap();
    assert_eq!(outcome.termination, Termination::Exited(5));
    let out = outcome.stdout.unwrap();
    let text = out.text();
    assert!(text.starts_with("start\n1\n2\n"), "{text:.40}");
    assert!(
        text.ends_with("99999\n100000\nend\n"),
        "{}",
        &text[text.len() - 40..]
    );
    assert_eq!(out.head.len(), 500);
    assert_eq!(out.tail.len(), 500);
    let total = 6
        + (1..=100_000)
            .map(|n: u32| n.to_string().len() + 1)
            .sum::<usize>()
        + 4;
    assert_eq!(out.omitted as usize, total - 1000);
    assert!(text.contains(&format!("[… {} bytes omitted …]", total - 1000)));
    assert_eq!(outcome.stderr.unwrap().text(), "oops\n");
}

/// A tee gets every byte of both streams while the capture keeps only head and tail.
#[test]
fn a_tee_sees_all_of_the_output_the_capture_cuts() {
    let f = fixture();
    let mut spec = f.spec("seq 1 200000; echo oops >&2");
    spec.output = Output::Capture { cap: 1000 };
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Vec<u8>>::new()));
    let sink = seen.clone();
    spec.tee = Some(Tee::new(move |chunk: &[u8]| {
        sink.lock().unwrap().push(chunk.to_vec())
    }));
    let outcome = run(&spec).unwrap();
    assert_eq!(outcome.termination, Termination::Exited(0));
    let out = outcome.stdout.unwrap();
    assert_eq!(out.head.len() + out.tail.len(), 1000);
    // Chunks come whole from one stream or the other; the stderr one is `oops\n`.
    let chunks = seen.lock().unwrap().clone();
    let (errs, outs): (Vec<_>, Vec<_>) = chunks.into_iter().partition(|c| c == b"oops\n");
    assert_eq!(errs.len(), 1);
    let expected: String = (1..=200_000).map(|n| format!("{n}\n")).collect();
    assert!(outs.concat() == expected.as_bytes(), "the tee missed bytes");
    assert_eq!(out.omitted as usize, expected.len() - 1000);
}

#[test]
fn cancel_kills_the_group_and_the_namespace_leftovers_at_once() {
    let f = fixture();
    let marker = "shade-cancel-test";
    let sleeper = f.out.join(marker);
    fs::copy(which("sleep"), &sleeper).unwrap();
    let ready = f.out.join("ready");
    // One child in the group, one escaped by setsid, and a main process ignoring SIGTERM.
    let mut spec = f.spec(&format!(
        "trap '' TERM; {s} 100 & setsid {s} 100 & touch {r}; {s} 100; true",
        s = sleeper.display(),
        r = ready.display()
    ));
    spec.timeout = None;
    let cancel = Cancel::new();
    let canceller = {
        let cancel = cancel.clone();
        std::thread::spawn(move || {
            while !ready.exists() {
                std::thread::sleep(Duration::from_millis(10));
            }
            std::thread::sleep(Duration::from_millis(100));
            cancel.cancel();
        })
    };
    let outcome = run_cancellable(&spec, &cancel).unwrap();
    canceller.join().unwrap();
    assert_eq!(outcome.termination, Termination::Cancelled);
    assert!(outcome.leftovers_killed >= 2, "{outcome:?}");
    assert_eq!(
        alive_with(marker),
        0,
        "a process of the cancelled run survived"
    );
    // A handle already cancelled starts nothing.
    let spec = f.spec(&format!("touch {}/started", f.out.display()));
    let outcome = run_cancellable(&spec, &cancel).unwrap();
    assert_eq!(outcome.termination, Termination::Cancelled);
    assert!(!f.out.join("started").exists());
}

/// Whether this process currently catches `sig` (SigCgt in /proc/self/status).
fn catches(sig: i32) -> bool {
    let status = fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("SigCgt:")).unwrap();
    let mask = u64::from_str_radix(line["SigCgt:".len()..].trim(), 16).unwrap();
    mask & (1 << (sig - 1)) != 0
}

#[test]
fn only_foreground_runs_install_signal_handlers() {
    let f = fixture();
    let ready = f.out.join("ready");
    for foreground in [false, true] {
        let _ = fs::remove_file(&ready);
        let mut spec = f.spec(&format!("touch {}; sleep 0.5", ready.display()));
        spec.foreground = foreground;
        let ready = ready.clone();
        let probe = std::thread::spawn(move || {
            while !ready.exists() {
                std::thread::sleep(Duration::from_millis(10));
            }
            catches(libc::SIGINT)
        });
        assert_eq!(run(&spec).unwrap().exit_code(), 0);
        assert_eq!(probe.join().unwrap(), foreground, "foreground={foreground}");
    }
    assert!(!catches(libc::SIGINT), "the handlers outlived the run");
}

#[test]
fn read_only_leaves_only_the_branch_tmp_and_devices_writable() {
    let f = fixture();
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let var_tmp = format!("/var/tmp/shade-ro-test-{}", std::process::id());
    let home_file = format!("{home}/shade-ro-test-{}", std::process::id());
    // A service listening on a unix socket (as systemd, a session bus or docker do): a
    // command that reaches one can have anything done outside the branch.
    let sock = format!("/var/tmp/shade-ro-test-{}.sock", std::process::id());
    let _ = fs::remove_file(&sock);
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    listener.set_nonblocking(true).unwrap();
    let sock_in_run = "/run/shade-ro-test-missing";
    let _ = fs::create_dir_all("/run");
    fs::write(sock_in_run, "").unwrap();
    // Evidence goes into the branch: it is the only place the command can write to.
    let script = format!(
        r#"try() {{ if sh -c "$2" 2>>errors; then echo "$1 ok" >> log; else echo "$1 refused" >> log; fi; }}
try var-tmp 'touch {var_tmp}'
try home 'touch {home_file}'
try etc 'echo x >> /etc/hostname'
try dev-null 'echo x > /dev/null'
try tmp 'echo x > /tmp/shade-ro-test-tmp && cat /tmp/shade-ro-test-tmp'
try shm 'echo x > /dev/shm/t'
try branch 'echo x > sub-made'
try remount-root 'mount -o remount,rw,bind / && touch {var_tmp}'
try remount-home 'mount -o remount,rw,bind {home} && touch {home_file}'
try proc-root 'echo x > /proc/1/root{var_tmp}'
try unix-socket '/usr/bin/python3 -c "import socket; socket.socket(socket.AF_UNIX).connect(\"{sock}\")"'
try socketpair '/usr/bin/python3 -c "import socket; a, b = socket.socketpair(); a.send(b\"x\"); assert b.recv(1)"'
try seqpacket-pair '/usr/bin/python3 -c "import socket; socket.socketpair(type=socket.SOCK_SEQPACKET)"'
try dgram-pair '/usr/bin/python3 -c "import socket; socket.socketpair(type=socket.SOCK_DGRAM)"'
try raw-pair '/usr/bin/python3 -c "import socket; socket.socketpair(type=socket.SOCK_RAW)"'
try run-hidden 'test -d /run && test ! -e {sock_in_run}'
exit 0"#
    );
    let mut spec = f.spec(&script);
    spec.isolation.read_only = true;
    let outcome = run(&spec).unwrap();
    assert_eq!(outcome.termination, Termination::Exited(0));
    let log = fs::read_to_string(f.mnt.join("log")).unwrap();
    let errors = fs::read_to_string(f.mnt.join("errors")).unwrap_or_default();
    for expected in [
        "var-tmp refused",
        "home refused",
        "etc refused",
        "dev-null ok",
        "tmp ok",
        "shm ok",
        "branch ok",
        "remount-root refused",
        "remount-home refused",
        "proc-root refused",
        "unix-socket refused",
        "socketpair ok",
        "seqpacket-pair ok",
        "dgram-pair refused",
        "raw-pair refused",
        "run-hidden ok",
    ] {
        assert!(
            log.contains(expected),
            "{expected} missing from:\n{log}\nerrors:\n{errors}"
        );
    }
    assert!(errors.contains("Read-only file system"), "{errors}");
    assert!(!Path::new(&var_tmp).exists());
    assert!(!Path::new(&home_file).exists());
    assert!(!f.project.join("sub-made").exists());
    assert!(!Path::new("/dev/shm/t").exists());
    assert!(
        !Path::new("/tmp/shade-ro-test-tmp").exists(),
        "the private /tmp was the real one"
    );
    assert!(
        listener.accept().is_err(),
        "the command connected to a unix socket outside the sandbox"
    );
    let _ = fs::remove_file(&sock);
    let _ = fs::remove_file(sock_in_run);
}

#[test]
fn the_isolation_time_limit_kills_the_command() {
    let f = fixture();
    let mut spec = f.spec("sleep 100");
    spec.timeout = None;
    spec.isolation.limits.time_limit = Some(Duration::from_millis(300));
    let out = run(&spec).unwrap();
    assert_eq!(out.termination, Termination::TimedOut);
    assert_eq!(
        out.limit_lines(),
        ["the command reached its 0.3 s time limit"],
        "the time limit is said in one line"
    );
    // The shorter of the two wins.
    spec.timeout = Some(Duration::from_millis(300));
    spec.isolation.limits.time_limit = Some(Duration::from_secs(100));
    assert_eq!(run(&spec).unwrap().termination, Termination::TimedOut);
}

/// Whether anything is mounted at `path` in our namespace.
fn mounted(path: &Path) -> bool {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let p = path.to_str().unwrap();
    info.lines().any(|l| l.split(' ').nth(4) == Some(p))
}

#[test]
fn a_cache_outside_the_project_gets_a_throw_away_branch() {
    let f = fixture();
    let cache_dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let cache = cache_dir.path().canonicalize().unwrap();
    fs::write(cache.join("reg"), "real").unwrap();
    fs::create_dir(cache.join("nested")).unwrap();
    let state = tempfile::tempdir_in("/var/tmp").unwrap();
    let opts = crate::BranchOptions {
        state: crate::StateDir::at(state.path().to_path_buf()),
        id_shift: super::branch_id_shift(&Isolation::default()),
        ..crate::BranchOptions::default()
    };
    // Missing and nested directories are skipped; only the outer cache gets a branch.
    let caches = CacheBranches::create(
        &f.project,
        &[
            cache.join("nested"),
            cache.clone(),
            cache.join("missing"),
            f.project.clone(),
        ],
        &opts,
    )
    .unwrap();
    assert_eq!(caches.dirs(), vec![cache.as_path()]);
    let c = cache.display();
    let mut spec = f.spec(&format!(
        "cat {c}/reg > seen; echo new > {c}/reg; echo made > {c}/nested/file; cat {c}/reg > seen2; \
         touch {c}/../shade-beside-cache 2>/dev/null; true"
    ));
    spec.isolation.read_only = true;
    spec.binds = caches.binds();
    assert_eq!(run(&spec).unwrap().exit_code(), 0);
    assert_eq!(fs::read_to_string(f.mnt.join("seen")).unwrap(), "real");
    assert_eq!(fs::read_to_string(f.mnt.join("seen2")).unwrap(), "new\n");
    assert_eq!(fs::read_to_string(cache.join("reg")).unwrap(), "real");
    assert!(!cache.join("nested/file").exists());
    assert!(!cache.parent().unwrap().join("shade-beside-cache").exists());
    let mnt = caches.binds()[0].source.clone();
    assert!(mounted(&mnt));
    drop(caches);
    // A cache branch's connection may wait in the pool of warm connections.
    crate::pool::drain();
    assert!(!mounted(&mnt), "the cache branch is still mounted");
    assert_eq!(fs::read_dir(opts.state.branches()).unwrap().count(), 0);
}

#[test]
fn binds_over_the_project_or_a_hidden_tmp_are_refused() {
    let f = fixture();
    let mut spec = f.spec("true");
    spec.binds = vec![Bind {
        source: f.mnt.clone(),
        target: f.project.join("x"),
    }];
    assert!(
        matches!(run(&spec), Err(SandboxError::Invalid(m)) if m.contains("overlaps the project"))
    );
    spec.binds[0].target = PathBuf::from("/tmp/shade-cache");
    spec.isolation.private_tmp = true;
    assert!(matches!(run(&spec), Err(SandboxError::Invalid(m)) if m.contains("private /tmp")));
}

#[test]
fn network_isolation_cannot_reach_a_server_on_the_host() {
    let f = fixture();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut spec = f.spec("");
    spec.argv = ["bash", "-c", &format!("exec 3<>/dev/tcp/127.0.0.1/{port}")]
        .map(OsString::from)
        .to_vec();
    assert_eq!(
        run(&spec).unwrap().exit_code(),
        0,
        "the host server is not reachable at all"
    );
    spec.isolation.network = true;
    assert_ne!(
        run(&spec).unwrap().exit_code(),
        0,
        "reached the host's network"
    );
}

#[test]
fn the_seccomp_filter_denies_what_the_module_doc_lists_and_threads_still_work() {
    let f = fixture();
    let python = "/usr/bin/python3";
    assert!(Path::new(python).exists(), "this test needs {python}");
    // errno of each call, one per line; threads must still start (clone3 -> ENOSYS -> clone).
    let script = format!(
        r#"{python} -c '
import ctypes, os, threading
libc = ctypes.CDLL(None, use_errno=True)
def err(ret):
    return 0 if ret >= 0 else ctypes.get_errno()
out = []
out.append("unshare-user %d" % err(libc.unshare(0x10000000)))
out.append("unshare-fs %d" % err(libc.unshare(0x200)))
out.append("clone3 %d" % err(libc.syscall(435, None, 0)))
out.append("keyctl %d" % err(libc.syscall(250, 0, 0, 0, 0, 0)))
out.append("bpf %d" % err(libc.syscall(321, 0, None, 0)))
out.append("userfaultfd %d" % err(libc.syscall(323, 0)))
fd = os.open("/dev/null", os.O_RDONLY)
c = ctypes.c_char(b"x")
out.append("tiocsti %d" % err(libc.ioctl(fd, 0x5412, ctypes.byref(c))))
out.append("fionread %d" % err(libc.ioctl(fd, 0x541B, ctypes.byref(ctypes.c_int()))))
out.append("mount %d" % err(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)))
out.append("io_uring_setup %d" % err(libc.syscall(425, 8, ctypes.create_string_buffer(120))))
out.append("uselib %d" % err(libc.syscall(134, b"/x")))
out.append("clock_settime %d" % err(libc.clock_settime(0, ctypes.create_string_buffer(16))))
out.append("persona-rie %d" % err(libc.personality(0x0400000)))
out.append("persona-query %d" % err(libc.personality(0xffffffff)))
out.append("persona-norandom %d" % err(libc.personality(0x0040000)))
out.append("af_alg %d" % err(libc.socket(38, 5, 0)))
out.append("af_vsock %d" % err(libc.socket(40, 1, 0)))
out.append("netlink-audit %d" % err(libc.socket(16, 3, 9)))
out.append("netlink-route %d" % err(libc.socket(16, 3, 0)))
out.append("unix %d" % err(libc.socket(1, 1, 0)))
out.append("dgram-pair %d" % err(libc.socketpair(1, 2, 0, ctypes.create_string_buffer(8))))
out.append("stream-pair %d" % err(libc.socketpair(1, 1 | 0o2000000, 0, ctypes.create_string_buffer(8))))
t = threading.Thread(target=lambda: out.append("thread ran"))
t.start(); t.join()
open("result", "w").write("\n".join(out) + "\n")
'"#
    );
    let outcome = f.run(&script);
    assert_eq!(outcome.termination, Termination::Exited(0));
    let result = fs::read_to_string(f.mnt.join("result")).unwrap();
    for expected in [
        "unshare-user 1\n",
        "unshare-fs 1\n",
        "clone3 38\n",
        "keyctl 1\n",
        "bpf 1\n",
        "userfaultfd 1\n",
        "tiocsti 1\n",
        // Other ioctls pass the filter: /dev/null is no terminal.
        "fionread 25\n",
        // Refused (EPERM) wins over the allowlist's ENOSYS, which is for the unlisted.
        "mount 1\n",
        "io_uring_setup 1\n",
        "uselib 38\n",
        "clock_settime 1\n",
        "persona-rie 1\n",
        "persona-query 0\n",
        "persona-norandom 0\n",
        "af_alg 1\n",
        "af_vsock 1\n",
        "netlink-audit 1\n",
        "netlink-route 0\n",
        "unix 0\n",
        "dgram-pair 0\n",
        "stream-pair 0\n",
        "thread ran\n",
    ] {
        assert!(
            result.contains(expected),
            "{expected:?} missing from:\n{result}"
        );
    }
}

/// The 32-bit system call ABI on x86_64 (`int $0x80`) sees other numbers the filter does not
/// list: any such call kills the process.
#[cfg(target_arch = "x86_64")]
#[test]
fn a_32_bit_system_call_kills_the_process() {
    let f = fixture();
    let src = f.out.join("int80.c");
    let bin = f.out.join("int80");
    // i386 getpid (20) through int $0x80, then exit 0.
    fs::write(
        &src,
        "int main(void){ long r; __asm__ volatile(\"int $0x80\" : \"=a\"(r) : \"a\"(20L)); return r > 0 ? 0 : 1; }\n",
    )
    .unwrap();
    let cc = Command::new("cc")
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("this test needs a C compiler (cc)");
    assert!(cc.success());
    // Unfiltered it works: the test would mean nothing otherwise.
    assert!(Command::new(&bin).status().unwrap().success());
    let outcome = f.run(&format!("{}", bin.display()));
    assert_eq!(outcome.termination, Termination::Signaled(libc::SIGSYS));
    // An x32 number (bit 30: x32's getpid) through the 64-bit entry: killed too.
    let outcome =
        f.run("exec /usr/bin/python3 -c 'import ctypes; ctypes.CDLL(None).syscall(0x40000027)'");
    assert_eq!(outcome.termination, Termination::Signaled(libc::SIGSYS));
}

/// Issue 29: a confined command's writes outside the project land in the outside layer,
/// the host's files stay as they were, and the next command given the same layer sees them.
#[test]
fn outside_writes_land_in_the_layer_and_the_next_command_sees_them() {
    let f = fixture();
    let outside = f.mnt.parent().unwrap().join("outside");
    let probe = format!("/etc/shade-layer-probe-{}", std::process::id());
    let captured = |script: &str| {
        let mut s = f.spec(script);
        s.outside = Some(outside.clone());
        s.output = Output::Capture { cap: 1 << 16 };
        let o = run(&s).unwrap();
        let text = o.stdout.as_ref().map(Captured::text).unwrap_or_default();
        let err = o.stderr.as_ref().map(Captured::text).unwrap_or_default();
        (o.exit_code(), format!("{text}{err}"))
    };
    let (code, said) = captured(&format!(
        "echo one > {probe} && mkdir -p /usr/local/shade-layer-probe && echo two > /usr/local/shade-layer-probe/f"
    ));
    assert_eq!(code, 0, "{said}");
    assert!(!Path::new(&probe).exists(), "the write reached the host");
    assert!(!Path::new("/usr/local/shade-layer-probe").exists());
    let (code, said) = captured(&format!("cat {probe} /usr/local/shade-layer-probe/f"));
    assert_eq!((code, said.as_str()), (0, "one\ntwo\n"));
    // On disk, in the unit of `/`, as layer.json says.
    let layer: serde_json::Value =
        serde_json::from_slice(&fs::read(outside.join("layer.json")).unwrap()).unwrap();
    let dir = layer["units"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["path"] == "/")
        .map(|u| u["dir"].as_str().unwrap().to_string())
        .unwrap();
    let upper = outside.join(dir).join("upper");
    assert_eq!(
        fs::read_to_string(upper.join(probe.trim_start_matches('/'))).unwrap(),
        "one\n"
    );
    release_outside(&outside);
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&*outside.to_string_lossy()),
        "the layer is still mounted after its release"
    );
    fs::remove_dir_all(&outside).unwrap();
}

/// Issue 29: a sized outside layer (`outside_size`) refuses writes past its size with
/// ENOSPC and says so among the limits hit, keeps what fit for the branch's next command,
/// and mounts nothing on the host (a detached tmpfs, gone with its fd).
#[test]
fn a_sized_outside_layer_refuses_writes_past_it_and_mounts_nothing_on_the_host() {
    let f = fixture();
    let outside = f.mnt.parent().unwrap().join("outside-sized");
    let dir = format!("/var/tmp/shade-sized-probe-{}", std::process::id());
    let captured = |script: &str| {
        let mut s = f.spec(script);
        s.outside = Some(outside.clone());
        s.isolation.limits.outside_size = Some(4 << 20);
        s.output = Output::Capture { cap: 1 << 16 };
        let o = run(&s).unwrap();
        let text = o.stdout.as_ref().map(Captured::text).unwrap_or_default();
        let err = o.stderr.as_ref().map(Captured::text).unwrap_or_default();
        (o, format!("{text}{err}"))
    };
    let (o, said) = captured(&format!(
        "mkdir -p {dir} && head -c 1000000 /dev/zero > {dir}/fits && \
         head -c 8000000 /dev/zero > {dir}/big; echo big=$?"
    ));
    assert!(said.contains("big=1"), "{said}");
    assert!(said.contains("No space left on device"), "{said}");
    assert!(
        o.limits_hit
            .contains(&crate::budget::LimitHit::Outside(4 << 20)),
        "{:?}",
        o.limits_hit
    );
    assert!(!Path::new(&dir).exists(), "the write reached the host");
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&*outside.to_string_lossy()),
        "the sized layer is mounted on the host"
    );
    let (_, said) = captured(&format!("wc -c < {dir}/fits"));
    assert_eq!(said.trim(), "1000000");
    release_outside(&outside);
    fs::remove_dir_all(&outside).unwrap();
}

/// Whatever runs it (a speculation's read-only sandbox through [`run`], a checker or
/// language server through [`command`]), a command's devpts holds at most its `ptys`: the
/// next /dev/ptmx open gets ENOSPC, and a pty it has carries data (red team round 7: one
/// command took every pty of every sandbox on the host).
#[test]
fn every_sandbox_kind_bounds_its_ptys() {
    let f = fixture();
    let script = r#"/usr/bin/python3 - <<'P' > "$OUT" 2>&1
import errno, os, tty
m, s = os.openpty()
tty.setraw(s)
os.write(m, b"ping")
got = os.read(s, 10)
fds, err = [], "none"
while len(fds) < 100:
    try:
        fds.append(os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY))
    except OSError as e:
        err = errno.errorcode[e.errno]
        break
print(got.decode(), len(fds), err)
P"#;
    let expect = "ping 2 ENOSPC";
    let mut spec = f.spec(&script.replace("$OUT", &f.out.join("spec").to_string_lossy()));
    spec.isolation = Isolation::speculative(Duration::from_secs(30));
    spec.isolation.limits.ptys = Some(3);
    assert_eq!(run(&spec).unwrap().termination, Termination::Exited(0));
    assert_eq!(f.out("spec").trim(), expect, "speculation's sandbox");
    let mut spec = f.spec(&script.replace("$OUT", &f.out.join("cmd").to_string_lossy()));
    spec.isolation.limits.ptys = Some(3);
    let status = command(&spec).unwrap().status().unwrap();
    assert!(status.success(), "{status:?}");
    assert_eq!(
        f.out("cmd").trim(),
        expect,
        "an unsupervised command's sandbox"
    );
}
