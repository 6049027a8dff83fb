//! What a command takes of the kernel beyond processes and memory is bounded too: its CPU
//! priority (niceness, scheduling policy, and as root its cgroup's CPU weight), which it
//! cannot raise back, its IPC namespace's SysV IPC and POSIX message queue limits, set
//! from its memory limit, which it cannot raise either, and its open files. Each is checked from inside
//! the command, through the real binary (`shade run`), as root and as the plain user
//! (`shadetest`, made by scripts/setup.sh).
//!
//! Needs root (to become the plain user), /dev/fuse usable by the plain user, bubblewrap
//! and python3; fails loudly where something is missing.
#![allow(clippy::unwrap_used)]

mod common;

use common::describe as show;
use common::plain::{copy_of as plain_copy, ids as plain_ids, PLAIN};

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

const PYTHON: &str = "/usr/bin/python3";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Who {
    Root,
    Plain,
}

/// A project and a state directory owned by the test's user, under /var/tmp.
struct Env {
    who: Who,
    _tmp: tempfile::TempDir,
    root: PathBuf,
    project: PathBuf,
    state: PathBuf,
}

fn env(who: Who) -> Env {
    assert!(
        nix::unistd::geteuid().is_root(),
        "these tests run as root (they also become the plain user {PLAIN})"
    );
    assert!(
        std::path::Path::new(PYTHON).exists(),
        "{PYTHON} is missing: run scripts/setup.sh"
    );
    let tmp = tempfile::Builder::new()
        .prefix("shade-limk-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let root = tmp.path().canonicalize().unwrap();
    let (project, state) = (root.join("project"), root.join("state"));
    for d in [&project, &state] {
        std::fs::create_dir(d).unwrap();
    }
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    if who == Who::Plain {
        common::plain::require_fuse();
        let (uid, gid) = plain_ids();
        for p in [&root, &project, &state] {
            std::os::unix::fs::chown(p, Some(uid), Some(gid)).unwrap();
        }
    }
    Env {
        who,
        _tmp: tmp,
        root,
        project,
        state,
    }
}

impl Env {
    /// `shade run -- python3 -c script` as this test's user, with `config` as its config.
    fn run_python(&self, config: &str, script: &str) -> Output {
        let out = self
            .python(config, script)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{:?}: the command did not run to its end\n{}",
            self.who,
            show(&out)
        );
        out
    }

    /// The command of [`Env::run_python`], its stdio left to the caller.
    fn python(&self, config: &str, script: &str) -> Command {
        let cfg = self.root.join("config.toml");
        std::fs::write(&cfg, config).unwrap();
        std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o644)).unwrap();
        let bin = env!("CARGO_BIN_EXE_shade");
        let mut c = match self.who {
            Who::Root => Command::new(bin),
            Who::Plain => {
                let mut c = Command::new("/usr/bin/setpriv");
                c.args([
                    &format!("--reuid={PLAIN}"),
                    &format!("--regid={PLAIN}"),
                    "--init-groups",
                    "--",
                ])
                .arg(plain_copy(bin));
                c.env("HOME", format!("/home/{PLAIN}"));
                c
            }
        };
        c.env("SHADE_STATE_DIR", &self.state)
            .env("SHADE_CONFIG", &cfg)
            .env_remove("CARGO_TARGET_DIR")
            .current_dir(&self.project)
            .args(["run", "--", PYTHON, "-c", script]);
        c
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        common::stop_branch_servers(&self.state);
    }
}

/// The `key value…` line the command printed, as words after the key.
fn said(o: &Output, key: &str) -> Vec<String> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some(key)).then(|| w.map(str::to_string).collect())
        })
        .unwrap_or_else(|| panic!("the command did not say {key:?}\n{}", show(o)))
}

/// Reads its niceness and policy from /proc/self/stat, then tries to take more: renice to
/// 0, switch to SCHED_OTHER, raise RLIMIT_NICE. As root, finds its cpu cgroup (the
/// `shade-*` directory whose cgroup.procs lists it, seen through the host's /sys) and
/// reads its weight.
const CPU_PROBE: &str = r#"
import errno, os, resource
stat = open("/proc/self/stat").read()
f = stat[stat.rindex(")") + 2:].split()
print("nice", f[16])
print("policy", f[38])
def attempt(name, fn):
    try:
        fn()
        print(name, "allowed")
    except OSError as e:
        print(name, errno.errorcode[e.errno])
    except ValueError:
        print(name, "refused")
attempt("renice", lambda: os.setpriority(os.PRIO_PROCESS, 0, 0))
attempt("sched_other", lambda: os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0)))
attempt("sched_fifo", lambda: os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1)))
attempt("raise_rlimit_nice", lambda: resource.setrlimit(resource.RLIMIT_NICE, (20, 20)))
print("rlimit_nice", *resource.getrlimit(resource.RLIMIT_NICE))
me = str(os.getpid())
found = []
for top in ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
    for d, subdirs, files in os.walk(top):
        if os.path.basename(d).startswith("shade-"):
            try:
                procs = open(d + "/cgroup.procs").read().split()
            except OSError:
                continue
            if me in procs:
                for name in ("cpu.weight", "cpu.shares"):
                    if name in files:
                        found.append(name + "=" + open(d + "/" + name).read().strip())
print("cgroup_cpu", *(found or ["none"]))
"#;

fn cpu_priority(who: Who) {
    let e = env(who);
    let o = e.run_python(
        "[sandbox.run]\ncpu_weight = 30\nnice = 7\nscheduler = \"idle\"\n",
        CPU_PROBE,
    );
    assert_eq!(said(&o, "nice"), ["7"], "{who:?}: niceness\n{}", show(&o));
    // SCHED_IDLE is 5.
    assert_eq!(said(&o, "policy"), ["5"], "{who:?}: policy\n{}", show(&o));
    assert_eq!(said(&o, "renice"), ["EACCES"], "{who:?}\n{}", show(&o));
    assert_eq!(said(&o, "sched_other"), ["EPERM"], "{who:?}\n{}", show(&o));
    assert_eq!(said(&o, "sched_fifo"), ["EPERM"], "{who:?}\n{}", show(&o));
    // Python turns setrlimit's EPERM into ValueError.
    assert_eq!(
        said(&o, "raise_rlimit_nice"),
        ["refused"],
        "{who:?}\n{}",
        show(&o)
    );
    assert_eq!(said(&o, "rlimit_nice"), ["0", "0"], "{who:?}\n{}", show(&o));
    let cg = said(&o, "cgroup_cpu");
    match who {
        // Weight 30 of v2's 100: v1's shares are 1024 × 30 / 100.
        Who::Root => assert!(
            cg.iter()
                .any(|c| c == "cpu.shares=307" || c == "cpu.weight=30"),
            "the command's cgroup has no CPU weight of 30: {cg:?}\n{}",
            show(&o)
        ),
        Who::Plain => assert_eq!(cg, ["none"], "{}", show(&o)),
    }

    // A batch run: SCHED_BATCH (3), from which SCHED_OTHER is allowed (the same weight),
    // but never a lower niceness.
    let o = e.run_python(
        "[sandbox.run]\nnice = 3\nscheduler = \"batch\"\n",
        CPU_PROBE,
    );
    assert_eq!(said(&o, "nice"), ["3"], "{who:?}\n{}", show(&o));
    assert_eq!(said(&o, "policy"), ["3"], "{who:?}\n{}", show(&o));
    assert_eq!(said(&o, "renice"), ["EACCES"], "{who:?}\n{}", show(&o));

    // `shade run`'s defaults: nice 5, SCHED_BATCH, as root weight 100 (v1: 1024 shares).
    let o = e.run_python("", CPU_PROBE);
    assert_eq!(said(&o, "nice"), ["5"], "{who:?}\n{}", show(&o));
    assert_eq!(said(&o, "policy"), ["3"], "{who:?}\n{}", show(&o));
    if who == Who::Root {
        let cg = said(&o, "cgroup_cpu");
        assert!(
            cg.iter()
                .any(|c| c == "cpu.shares=1024" || c == "cpu.weight=100"),
            "{cg:?}\n{}",
            show(&o)
        );
    }
}

/// The FUSE work a command causes — every write, create and uncached look-up is served by
/// a thread of the branch server — is done at the commands' priority, not at shade's own
/// (red team round 8, route 7: four writers at nice 5 made the server burn 3.9 CPU-s at
/// nice 0). The server's FUSE threads that served take the least nice of the modes and
/// SCHED_BATCH.
fn fuse_work_at_the_commands_priority(who: Who) {
    let e = env(who);
    e.run_python(
        "[sandbox.run]\nnice = 7\n[sandbox.speculation]\nnice = 12\n",
        "for i in range(400):\n    open('f%d' % (i % 20), 'w').write(str(i))\nprint('done', 1)",
    );
    // The server made the branch directories (`PID-N-…`) and keeps the connection pooled.
    let server = std::fs::read_dir(e.state.join("branches"))
        .unwrap()
        .flatten()
        .filter_map(|d| {
            d.file_name()
                .to_str()?
                .split('-')
                .next()?
                .parse::<u32>()
                .ok()
        })
        .find(|pid| std::path::Path::new(&format!("/proc/{pid}/task")).exists())
        .unwrap_or_else(|| panic!("{who:?}: no live branch server made a branch"));
    let mut fuse = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{server}/task"))
        .unwrap()
        .flatten()
    {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("fuser") {
            continue;
        }
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        let f: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
        // Fields 19 (nice) and 41 (policy) of proc(5), counted from 3 here.
        fuse.push((
            comm.trim().to_string(),
            f[16].to_string(),
            f[38].to_string(),
        ));
    }
    assert!(!fuse.is_empty(), "{who:?}: the server has no FUSE threads");
    assert!(
        fuse.iter()
            .any(|(_, nice, policy)| nice == "7" && policy == "3"),
        "{who:?}: no FUSE thread of the server runs at the commands' nice 7, SCHED_BATCH: {fuse:?}"
    );
}

/// SysV shared memory, message queues and semaphores, and POSIX message queues, in the
/// command's IPC namespace (a 256 MiB memory limit): a segment past the memory limit is
/// refused (EINVAL), segments past it in all too (ENOSPC), queues past an eighth of it,
/// and writing the limits fails.
const IPC_PROBE: &str = r#"
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
libc.shmget.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
IPC_CREAT = 0o1000
def res(r):
    return "ok" if r >= 0 else errno.errorcode[ctypes.get_errno()]
def sysctl(name):
    return open("/proc/sys/" + name).read().split()
print("shmmax", *sysctl("kernel/shmmax"))
print("shmall", *sysctl("kernel/shmall"))
print("msgmni", *sysctl("kernel/msgmni"))
print("sem", *sysctl("kernel/sem"))
print("queues_max", *sysctl("fs/mqueue/queues_max"))
print("shm_big", res(libc.shmget(0, 1 << 30, IPC_CREAT | 0o600)))
print("shm_first", res(libc.shmget(0, 200 << 20, IPC_CREAT | 0o600)))
print("shm_second", res(libc.shmget(0, 200 << 20, IPC_CREAT | 0o600)))
n, err = 0, "none"
while n < 40000:
    r = libc.msgget(0, IPC_CREAT | 0o600)
    if r < 0:
        err = errno.errorcode[ctypes.get_errno()]
        break
    n += 1
print("msg_queues", n, err)
print("sem_big", res(libc.semget(0, 30000, IPC_CREAT | 0o600)))
for name in ("kernel/shmall", "kernel/msgmni", "kernel/sem", "fs/mqueue/queues_max"):
    try:
        with open("/proc/sys/" + name, "w") as f:
            f.write("1000000\n")
        print("write_" + name.split("/")[-1], "allowed")
    except OSError as e:
        print("write_" + name.split("/")[-1], errno.errorcode[e.errno])
print("shmall_after", *sysctl("kernel/shmall"))
"#;

fn ipc_bounded(who: Who) {
    let e = env(who);
    // 4096 processes: their semaphore undo records leave room for fewer than 30000
    // semaphores in an eighth of 256 MiB.
    let o = e.run_python(
        "[sandbox.run]\nmemory = \"256MiB\"\nmax_processes = 4096\n",
        IPC_PROBE,
    );
    let mib256 = 256u64 << 20;
    assert_eq!(said(&o, "shmmax"), [mib256.to_string()], "{}", show(&o));
    assert_eq!(
        said(&o, "shmall"),
        [(mib256 / 4096).to_string()],
        "{}",
        show(&o)
    );
    assert_eq!(said(&o, "shm_big"), ["EINVAL"], "{who:?}\n{}", show(&o));
    assert_eq!(said(&o, "shm_first"), ["ok"], "{who:?}\n{}", show(&o));
    assert_eq!(
        said(&o, "shm_second"),
        ["ENOSPC"],
        "{who:?}: 400 MiB of SysV shared memory under a 256 MiB limit\n{}",
        show(&o)
    );
    // An eighth of 256 MiB, in queues of 16 KiB of text and 16384 headers of 64 bytes.
    let queues = (32u64 << 20) / (16384 * 65);
    assert_eq!(said(&o, "msgmni"), [queues.to_string()], "{}", show(&o));
    assert_eq!(
        said(&o, "msg_queues"),
        [queues.to_string(), "ENOSPC".to_string()],
        "{who:?}\n{}",
        show(&o)
    );
    assert_eq!(said(&o, "sem_big"), ["EINVAL"], "{who:?}\n{}", show(&o));
    // POSIX message queues: the kernel's 256 (an eighth of 256 MiB holds more); their
    // bytes are RLIMIT_MSGQUEUE's, per user.
    assert_eq!(said(&o, "queues_max"), ["256"], "{}", show(&o));
    for name in ["shmall", "msgmni", "sem", "queues_max"] {
        assert_eq!(
            said(&o, &format!("write_{name}")),
            ["EROFS"],
            "{who:?}: the command could write {name}\n{}",
            show(&o)
        );
    }
    assert_eq!(said(&o, "shmall_after"), [(mib256 / 4096).to_string()]);
}

/// Its processes' open files: `RLIMIT_NOFILE` at `open_files`, which it cannot raise; an
/// open past it gets EMFILE.
fn open_files_bounded(who: Who) {
    let e = env(who);
    let o = e.run_python(
        "[sandbox.run]\nopen_files = 64\n",
        r#"
import errno, os, resource
print("nofile", *resource.getrlimit(resource.RLIMIT_NOFILE))
try:
    resource.setrlimit(resource.RLIMIT_NOFILE, (65, 65))
    print("raise allowed")
except (OSError, ValueError):
    print("raise refused")
fds, err = [], "none"
while len(fds) < 100000:
    try:
        fds.append(os.open("/dev/null", os.O_RDONLY))
    except OSError as e:
        err = errno.errorcode[e.errno]
        break
print("opened", len(fds), err)
"#,
    );
    let lim = said(&o, "nofile");
    assert_eq!(lim[1], "64", "{who:?}: the hard limit\n{}", show(&o));
    assert_eq!(said(&o, "raise"), ["refused"], "{who:?}\n{}", show(&o));
    let opened = said(&o, "opened");
    assert_eq!(opened[1], "EMFILE", "{who:?}\n{}", show(&o));
    assert!(
        opened[0].parse::<u32>().unwrap() < 64,
        "{who:?}: {} files open under a limit of 64\n{}",
        opened[0],
        show(&o)
    );
}

/// Queued signals and POSIX message queue bytes are counted per host user, root's too (a
/// user namespace's counts go up to its creator's): a command gets an eighth of shade's
/// own, so that it cannot leave the user's other programs unable to queue a signal or
/// open a queue (red team round 7: one command took all of host root's). Fails on a shade
/// that leaves them as they are.
fn user_queues_bounded(who: Who) {
    let own = |r| {
        let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
        // SAFETY: getrlimit(2) into a zeroed struct.
        assert_eq!(unsafe { libc::getrlimit(r, &mut lim) }, 0);
        lim.rlim_cur
    };
    let sig_share = (own(libc::RLIMIT_SIGPENDING) / 8).max(64);
    let mq_share = (own(libc::RLIMIT_MSGQUEUE) / 8).max(96 * 1024);
    let e = env(who);
    let o = e.run_python(
        "",
        r#"
import errno, os, resource, signal, threading
print("sigpending", *resource.getrlimit(resource.RLIMIT_SIGPENDING))
print("msgqueue", *resource.getrlimit(resource.RLIMIT_MSGQUEUE))
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
n, err = 0, "none"
while n < 1000000:
    try:
        # tgkill: a signal that cannot be queued is refused (kill(2)'s is sent without
        # its queue entry instead).
        signal.pthread_kill(threading.get_ident(), signal.SIGRTMIN)
        n += 1
    except OSError as e:
        err = errno.errorcode[e.errno]
        break
print("queued", n, err)
"#,
    );
    let sig = said(&o, "sigpending");
    let hard: u64 = sig[1].parse().unwrap();
    assert!(
        hard <= sig_share,
        "{who:?}: RLIMIT_SIGPENDING {hard} > {sig_share}\n{}",
        show(&o)
    );
    let queued = said(&o, "queued");
    assert_eq!(queued[1], "EAGAIN", "{who:?}\n{}", show(&o));
    assert!(
        queued[0].parse::<u64>().unwrap() <= sig_share,
        "{who:?}\n{}",
        show(&o)
    );
    let mq: u64 = said(&o, "msgqueue")[1].parse().unwrap();
    assert!(
        mq <= mq_share,
        "{who:?}: RLIMIT_MSGQUEUE {mq} > {mq_share}\n{}",
        show(&o)
    );
}

#[test]
fn user_queues_bounded_as_root() {
    user_queues_bounded(Who::Root);
}

#[test]
fn user_queues_bounded_as_plain_user() {
    user_queues_bounded(Who::Plain);
}

#[test]
fn open_files_bounded_as_root() {
    open_files_bounded(Who::Root);
}

#[test]
fn open_files_bounded_as_plain_user() {
    open_files_bounded(Who::Plain);
}

#[test]
fn cpu_priority_as_root() {
    cpu_priority(Who::Root);
}

#[test]
fn cpu_priority_as_plain_user() {
    cpu_priority(Who::Plain);
}

#[test]
fn fuse_work_at_the_commands_priority_as_root() {
    fuse_work_at_the_commands_priority(Who::Root);
}

#[test]
fn fuse_work_at_the_commands_priority_as_plain_user() {
    fuse_work_at_the_commands_priority(Who::Plain);
}

#[test]
fn ipc_bounded_as_root() {
    ipc_bounded(Who::Root);
}

#[test]
fn ipc_bounded_as_plain_user() {
    ipc_bounded(Who::Plain);
}

/// With no limits of the user's, a command forks until EAGAIN (at most `cap` children, so
/// that a tree without the bound does not take the host's pids), then holds files in as
/// many processes as it may until a fork fails or it holds more than an eighth of the
/// host's file table (`fs.file-max`, the default share; a tree without the bound would hold
/// that and go on to ENFILE).
const HOST_TABLES_PROBE: &str = r#"
import errno, os, resource, sys
cap = int(sys.argv[1])
budget = int(open("/proc/sys/fs/file-max").read()) // 8
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
print("nofile", *resource.getrlimit(resource.RLIMIT_NOFILE))
print("nproc", *resource.getrlimit(resource.RLIMIT_NPROC))
def fork_all(child, stop):
    kids, err = [], "none"
    while not stop(kids):
        try:
            r, w = os.pipe(); hold_r, hold_w = os.pipe()
        except OSError as e:
            err = errno.errorcode[e.errno]
            break
        try:
            pid = os.fork()
        except OSError as e:
            err = errno.errorcode[e.errno]
            for f in (r, w, hold_r, hold_w): os.close(f)
            break
        if pid == 0:
            os.close(r); os.close(hold_w)
            n = child()
            os.write(w, str(n).encode()); os.close(w)
            os.read(hold_r, 1); os._exit(0)
        os.close(w); os.close(hold_r)
        got = b""
        while True:
            b = os.read(r, 64)
            if not b: break
            got += b
        os.close(r)
        kids.append((pid, int(got or b"0"), hold_w))
    return kids, err
def release(kids):
    for pid, _, hold in kids: os.close(hold)
    for pid, _, _ in kids: os.waitpid(pid, 0)
kids, err = fork_all(lambda: 0, lambda k: len(k) >= cap)
print("forked", len(kids), err)
release(kids)
def hold():
    fds = []
    while sum(n for _, n, _ in kids_so_far) + len(fds) <= budget:
        try:
            fds.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            break
    return len(fds)
kids_so_far = []
def stop(k):
    kids_so_far[:] = k
    return sum(n for _, n, _ in k) > budget
kids, err = fork_all(hold, stop)
print("held", sum(n for _, n, _ in kids), err, len(kids), budget)
release(kids)
"#;

fn proc_sys(name: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/sys/{name}"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Every command has a process limit and an open-file limit by default, whose product
/// stays within an eighth of the host's file table and whose process count within an
/// eighth of its pids: a fork bomb gets EAGAIN, and processes holding files get EAGAIN
/// (or EMFILE) before they hold the host's share. Before, `shade run` had no process limit
/// and shade's own RLIMIT_NOFILE: one command held a quarter of `fs.file-max`, and a fork
/// bomb could take every pid of the host.
fn host_tables_bounded_by_default(who: Who) {
    let e = env(who);
    let file_max = proc_sys("fs/file-max");
    let pid_room = proc_sys("kernel/pid_max").min(proc_sys("kernel/threads-max"));
    // Far above the default (an eighth of the host's room), far below the host's pids.
    let cap = 1500.min(pid_room / 4);
    let probe = e.root.join("probe.py");
    std::fs::write(&probe, HOST_TABLES_PROBE).unwrap();
    std::fs::set_permissions(&probe, std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = e.run_python(
        "",
        &format!(
            "import sys; sys.argv = ['probe', '{cap}']; exec(open({:?}).read())",
            probe.display().to_string()
        ),
    );
    let nofile: u64 = said(&o, "nofile")[1].parse().unwrap();
    assert!(
        nofile <= 1024,
        "{who:?}: RLIMIT_NOFILE {nofile} by default\n{}",
        show(&o)
    );
    let forked = said(&o, "forked");
    assert_eq!(
        forked[1],
        "EAGAIN",
        "{who:?}: a fork bomb was not stopped\n{}",
        show(&o)
    );
    let procs: u64 = forked[0].parse().unwrap();
    assert!(
        procs < cap && procs <= pid_room / 8,
        "{who:?}: {procs} processes (the host's pids: {pid_room})\n{}",
        show(&o)
    );
    assert!(
        (procs + 1) * nofile <= file_max / 8,
        "{who:?}: {procs} processes of {nofile} files each may hold more than an eighth \
         of fs.file-max {file_max}\n{}",
        show(&o)
    );
    let held = said(&o, "held");
    let files: u64 = held[0].parse().unwrap();
    assert!(
        held[1] == "EAGAIN" && files <= file_max / 8,
        "{who:?}: the command held {files} files (fs.file-max {file_max})\n{}",
        show(&o)
    );
}

#[test]
fn host_tables_bounded_by_default_as_root() {
    host_tables_bounded_by_default(Who::Root);
}

#[test]
fn host_tables_bounded_by_default_as_plain_user() {
    host_tables_bounded_by_default(Who::Plain);
}

/// A user's limits above the host's tables are lowered, and said so: processes to half of
/// the host's pids, open files so that processes × files stay within half of
/// `fs.file-max`.
fn host_tables_bound_explicit_limits(who: Who) {
    let e = env(who);
    let file_max = proc_sys("fs/file-max");
    let pid_room = proc_sys("kernel/pid_max").min(proc_sys("kernel/threads-max"));
    let o = e.run_python(
        "[sandbox.run]\nmax_processes = 4000000000\nopen_files = 100000000\n",
        r#"
import resource
print("nofile", *resource.getrlimit(resource.RLIMIT_NOFILE))
print("nproc", *resource.getrlimit(resource.RLIMIT_NPROC))
"#,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("the process limit 4000000000 is lowered to")
            && err.contains("the open-file limit"),
        "{who:?}: no warning\n{}",
        show(&o)
    );
    let nofile: u64 = said(&o, "nofile")[1].parse().unwrap();
    assert!(nofile <= proc_sys("fs/nr_open"), "{}", show(&o));
    if who == Who::Plain {
        // The process limit is visible inside: RLIMIT_NPROC (one more, the sandbox's init).
        let nproc: u64 = said(&o, "nproc")[1].parse().unwrap();
        assert!(nproc <= pid_room / 2 + 1, "{}", show(&o));
        assert!(
            (nproc - 1) * nofile <= file_max / 2,
            "{nproc} processes × {nofile} files\n{}",
            show(&o)
        );
    }
}

#[test]
fn host_tables_bound_explicit_limits_as_root() {
    host_tables_bound_explicit_limits(Who::Root);
}

#[test]
fn host_tables_bound_explicit_limits_as_plain_user() {
    host_tables_bound_explicit_limits(Who::Plain);
}

/// A pty works in the sandbox (master to slave and back, `pty.fork`'s controlling
/// terminal, util-linux `script`), then the command opens /dev/ptmx until it is refused or
/// it holds `sys.argv[1]` (so that a shade without the bound does not take the host's
/// table), in children of up to 900 each (its open-file limit), says how many, and holds
/// them until its stdin has a line.
const PTY_PROBE: &str = r#"
import errno, os, pty, subprocess, sys, tty
cap = int(sys.argv[1])
m, s = os.openpty()
tty.setraw(s)  # no echo: the master reads only what the slave writes
os.write(m, b"ping\n")
print("slave_read", os.read(s, 100).decode().strip(), os.ttyname(s))
os.write(s, b"pong")
print("master_read", os.read(m, 100).decode().strip())
os.close(m); os.close(s)
pid, fd = pty.fork()
if pid == 0:
    os.execvp("tty", ["tty"])
out = b""
while True:
    try:
        b = os.read(fd, 100)
    except OSError:
        break
    if not b:
        break
    out += b
os.waitpid(pid, 0); os.close(fd)
print("pty_fork", out.decode().strip())
r = subprocess.run(["script", "-qec", "tty", "/dev/null"], stdin=subprocess.DEVNULL,
                   capture_output=True, text=True)
print("script", r.returncode, r.stdout.strip())
mounts = [l.split(" - ")[1].split()[2] for l in open("/proc/self/mountinfo")
          if l.split()[4] == "/dev/pts"]
print("devpts_options", mounts[-1])
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
ctypes.set_errno(0)
libc.mount(b"devpts", b"/dev/pts", b"devpts", 32, b"max=1000000")  # MS_REMOUNT
print("remount", errno.errorcode.get(ctypes.get_errno(), "allowed"))
ctypes.set_errno(0)
libc.umount2(b"/dev/pts", 2)  # MNT_DETACH
print("umount", errno.errorcode.get(ctypes.get_errno(), "allowed"))
def grab(limit):
    got = []
    try:
        while len(got) < limit:
            got.append(os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY))
    except OSError as e:
        return got, errno.errorcode[e.errno]
    return got, "none"
total, err, kids = 0, "none", []
while total < cap:
    r, w = os.pipe(); hold_r, hold_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r); os.close(hold_w)
        got, e = grab(min(900, cap - total))
        os.write(w, ("%d %s" % (len(got), e)).encode()); os.close(w)
        os.read(hold_r, 1); os._exit(0)
    os.close(w); os.close(hold_r)
    n, e = os.read(r, 100).decode().split()
    os.close(r)
    kids.append((pid, hold_w)); total += int(n)
    if e != "none":
        err = e
        break
print("ptys", total, err, flush=True)
print("READY", flush=True)
sys.stdin.readline()
for pid, hold in kids:
    os.close(hold); os.waitpid(pid, 0)
"#;

/// Opens one pty in another sandbox: master to slave.
const PTY_SECOND: &str = r#"
import os
m, s = os.openpty()
os.write(m, b"x\n")
print("second", os.read(s, 10).decode().strip())
"#;

/// Every devpts but the host's shares `kernel.pty.max` less `kernel.pty.reserve`: a
/// command's own devpts has a `max=` (`ptys`, by default less than an eighth of that), so
/// one command opening ptys gets ENOSPC there while another sandbox still opens one (red
/// team round 7: one command took all 3,071 and the next `shade run`'s openpty failed).
/// Its terminals work as before, and it cannot remount its devpts to lift the bound.
/// Fails on a shade whose commands get bubblewrap's devpts as it is.
fn ptys_bounded(who: Who, config: &str, expect: Option<u64>) {
    use std::io::{BufRead, Write};
    let e = env(who);
    let room = proc_sys("kernel/pty/max") - proc_sys("kernel/pty/reserve");
    // Past the default share, far below the host's table.
    let cap = room / 8 + 64;
    let probe = e.root.join("pty_probe.py");
    std::fs::write(&probe, PTY_PROBE).unwrap();
    std::fs::set_permissions(&probe, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut first = e
        .python(
            config,
            &format!(
                "import sys; sys.argv = ['probe', '{cap}']; exec(open({:?}).read())",
                probe.display().to_string()
            ),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut said_lines = Vec::new();
    let mut lines = std::io::BufReader::new(first.stdout.take().unwrap()).lines();
    for line in lines.by_ref() {
        let line = line.unwrap();
        if line == "READY" {
            break;
        }
        said_lines.push(line);
    }
    // While the first holds what it could open: another sandbox and the host each open one.
    let second = e.run_python(config, PTY_SECOND);
    // SAFETY: posix_openpt(3) and close(2) on our own fd.
    let host = unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY) };
    let host_err = std::io::Error::last_os_error();
    if host >= 0 {
        // SAFETY: our own fd, opened above.
        unsafe { libc::close(host) };
    }
    let mut stdin = first.stdin.take().unwrap();
    let _ = stdin.write_all(b"go\n");
    drop(stdin);
    said_lines.extend(lines.map_while(Result::ok));
    let mut out = first.wait_with_output().unwrap();
    out.stdout = (said_lines.join("\n") + "\n").into_bytes();
    assert_eq!(out.status.code(), Some(0), "{who:?}\n{}", show(&out));
    let o = &out;
    assert_eq!(
        said(o, "slave_read")[0],
        "ping",
        "{who:?}: a pty does not carry data\n{}",
        show(o)
    );
    assert!(
        said(o, "slave_read")[1].starts_with("/dev/pts/"),
        "{}",
        show(o)
    );
    assert_eq!(said(o, "master_read"), ["pong"], "{who:?}\n{}", show(o));
    assert!(
        said(o, "pty_fork")[0].starts_with("/dev/pts/"),
        "{who:?}: pty.fork's child has no terminal\n{}",
        show(o)
    );
    assert_eq!(said(o, "script")[0], "0", "{who:?}: script(1)\n{}", show(o));
    assert!(said(o, "script")[1].starts_with("/dev/pts/"), "{}", show(o));
    let options = said(o, "devpts_options").join(" ");
    assert!(options.contains("max="), "{who:?}: {options}\n{}", show(o));
    assert_eq!(said(o, "remount"), ["EPERM"], "{who:?}\n{}", show(o));
    assert_eq!(said(o, "umount"), ["EPERM"], "{who:?}\n{}", show(o));
    let ptys = said(o, "ptys");
    let n: u64 = ptys[0].parse().unwrap();
    assert_eq!(
        ptys[1],
        "ENOSPC",
        "{who:?}: the command opened {n} ptys unrefused (the host's room {room})\n{}",
        show(o)
    );
    match expect {
        Some(want) => assert_eq!(n, want, "{who:?}\n{}", show(o)),
        None => assert!(
            n * 8 < room && n >= 8,
            "{who:?}: {n} ptys of the host's {room}\n{}",
            show(o)
        ),
    }
    assert_eq!(
        said(&second, "second"),
        ["x"],
        "{who:?}: another sandbox could not open a pty\n{}",
        show(&second)
    );
    assert!(
        host >= 0,
        "{who:?}: the host could not open a pty: {host_err}"
    );
}

#[test]
fn ptys_bounded_as_root() {
    ptys_bounded(Who::Root, "", None);
}

#[test]
fn ptys_bounded_as_plain_user() {
    ptys_bounded(Who::Plain, "", None);
}

#[test]
fn ptys_configured_as_root() {
    ptys_bounded(Who::Root, "[sandbox.run]\nptys = 5\n", Some(5));
}

#[test]
fn ptys_configured_as_plain_user() {
    ptys_bounded(Who::Plain, "[sandbox.run]\nptys = 5\n", Some(5));
}
