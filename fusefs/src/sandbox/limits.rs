//! What one command may consume: processes, its private /tmp and /dev/shm, its branch's
//! contents and metadata, and time. [`Limits`] says how much; this module enforces the
//! process limit (a pids cgroup as root, `RLIMIT_NPROC` inside the sandbox's user namespace
//! otherwise) and says which limits a run reached ([`LimitHit`]), each in one line.
//!
//! Where a pids cgroup comes from, as root: cgroup v2 (at /sys/fs/cgroup, or a hybrid
//! system's /sys/fs/cgroup/unified) when its pids controller is available there, else the
//! cgroup v1 pids hierarchy (/sys/fs/cgroup/pids). The cgroup is made below shade's own
//! (so a container's limits still apply) or, in v2 where shade's own cannot have children
//! with controllers, below the hierarchy's root. Where neither exists (no cgroup file
//! system mounted, or a read-only one in a container), root's commands run without a
//! process limit and a warning says so: `RLIMIT_NPROC` does not bind real root.

use std::ffi::OsString;
use std::fs;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{OnceLock, PoisonError, RwLock};
use std::time::Duration;

use crate::budget::{BranchLimits, LimitHit, DEFAULT_METADATA};

/// How much one command may consume; `None` is no limit of shade's own (the system's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
    /// Processes (and threads) the command may have at once.
    pub max_processes: Option<u32>,
    /// Bytes of its private /tmp (a tmpfs; `None`: the kernel's default, half of RAM).
    pub tmp_size: Option<u64>,
    /// Bytes of its private /dev/shm (as `tmp_size`).
    pub shm_size: Option<u64>,
    /// Bytes of file contents its branch may hold (see [`BranchLimits::size`]).
    pub branch_size: Option<u64>,
    /// Bytes of metadata its branch may keep in shade's memory (see
    /// [`BranchLimits::metadata`]); `None` here is [`DEFAULT_METADATA`], never unbounded.
    pub branch_metadata: Option<u64>,
    /// Killed after this long.
    pub time_limit: Option<Duration>,
    /// Bytes the branch's outside layer may hold (what its commands write outside the
    /// project, kept in memory: a tmpfs held by shade for the branch's life); `None` keeps
    /// the layer on the state directory's disk, unbounded.
    pub outside_size: Option<u64>,
}

impl Limits {
    /// What a command nobody asked for gets (speculation, `shade mcp`) unless the config
    /// says otherwise: a laptop survives it.
    pub const SPECULATION: Limits = Limits {
        max_processes: Some(512),
        tmp_size: Some(512 << 20),
        shm_size: Some(512 << 20),
        branch_size: Some(1 << 30),
        branch_metadata: Some(64 << 20),
        time_limit: Some(Duration::from_secs(300)),
        outside_size: Some(1 << 30),
    };

    /// What `shade run` gets unless the config says otherwise: nothing below the system's
    /// own limits (the branch's metadata budget aside).
    pub const RUN: Limits = Limits {
        max_processes: None,
        tmp_size: None,
        shm_size: None,
        branch_size: None,
        branch_metadata: None,
        time_limit: None,
        outside_size: None,
    };

    /// The speculation limits in force (the config's, see [`configure`]).
    pub fn speculation() -> Limits {
        configured().map_or(Limits::SPECULATION, |c| c.speculation)
    }

    /// The `shade run` limits in force (the config's, see [`configure`]).
    pub fn run() -> Limits {
        configured().map_or(Limits::RUN, |c| c.run)
    }

    /// The branch's share: its contents and metadata budgets.
    pub fn branch(&self) -> BranchLimits {
        BranchLimits {
            size: self.branch_size,
            metadata: Some(self.branch_metadata.unwrap_or(DEFAULT_METADATA)),
        }
    }

    /// The limits in one line, for `shade doctor`.
    pub fn describe(&self) -> String {
        use crate::units::format_size;
        let size = |s: Option<u64>, none: &str| s.map_or(none.to_string(), format_size);
        format!(
            "processes {}, /tmp {}, /dev/shm {}, branch contents {}, branch metadata {}, \
             outside layer {}, time {}",
            self.max_processes
                .map_or("as the system's".to_string(), |n| n.to_string()),
            size(self.tmp_size, "half of RAM"),
            size(self.shm_size, "half of RAM"),
            size(self.branch_size, "unlimited"),
            format_size(self.branch_metadata.unwrap_or(DEFAULT_METADATA)),
            size(self.outside_size, "unlimited (on disk)"),
            self.time_limit
                .map_or("unlimited".to_string(), |d| format!("{} s", d.as_secs())),
        )
    }
}

#[derive(Clone, Copy)]
struct Configured {
    run: Limits,
    speculation: Limits,
}

static CONFIGURED: RwLock<Option<Configured>> = RwLock::new(None);

fn configured() -> Option<Configured> {
    *CONFIGURED.read().unwrap_or_else(PoisonError::into_inner)
}

/// Sets the limits of `shade run` and of speculation/MCP commands for this process, from
/// the config file (a later call, for a file named with `--config`, replaces them).
pub fn configure(run: Limits, speculation: Limits) {
    *CONFIGURED.write().unwrap_or_else(PoisonError::into_inner) =
        Some(Configured { run, speculation });
}

/// The argument that makes shade's binary set `RLIMIT_NPROC` and exec the rest
/// ([`limits_helper`]).
pub const LIMITS_HELPER_ARG: &str = "__shade-sandbox-limits";

/// Inside the sandbox, before the command (a plain user's run with a process limit): set
/// `RLIMIT_NPROC` to `argv[0]` and exec `argv[1..]`. The limit counts the processes of the
/// command's uid in the sandbox's user namespace only (the kernel keeps a count per user
/// namespace), so the user's other processes do not eat into it. Returns only on failure.
pub fn limits_helper(argv: &[OsString]) -> i32 {
    let parsed = argv
        .first()
        .and_then(|n| n.to_str())
        .and_then(|n| n.parse::<libc::rlim_t>().ok());
    let (Some(n), Some((prog, args))) = (parsed, argv.get(1..).and_then(<[_]>::split_first)) else {
        eprintln!("shade: {LIMITS_HELPER_ARG}: usage: N COMMAND [ARG…]");
        return super::EXIT_CANNOT_EXEC;
    };
    let lim = libc::rlimit {
        rlim_cur: n,
        rlim_max: n,
    };
    // SAFETY: setrlimit(2) with a valid struct.
    if unsafe { libc::setrlimit(libc::RLIMIT_NPROC, &lim) } != 0 {
        eprintln!(
            "shade: cannot set the process limit: {}",
            std::io::Error::last_os_error()
        );
        return super::EXIT_CANNOT_EXEC;
    }
    let err = Command::new(prog).args(args).exec();
    eprintln!("shade: {}: {err}", prog.to_string_lossy());
    super::EXIT_CANNOT_EXEC
}

/// For a plain user's run with a process limit: the `RLIMIT_NPROC` to set inside the
/// sandbox. It counts the sandbox's init too, hence one more than the command's share.
pub(crate) fn rlimit_nproc(limits: &Limits, root: bool) -> Option<u32> {
    if root {
        return None;
    }
    limits.max_processes.map(|n| n.saturating_add(1))
}

/// `argv` behind whatever sets `RLIMIT_NPROC` to `nproc` inside the sandbox: shade's own
/// binary (`helper`, bound into the sandbox), else util-linux's `prlimit`. `None` when
/// neither is at hand (the caller then warns and runs without the limit).
pub(crate) fn nproc_argv(
    nproc: u32,
    helper: Option<&Path>,
    argv: Vec<OsString>,
) -> Option<Vec<OsString>> {
    let prefix: Vec<OsString> = match helper {
        Some(h) => vec![
            h.as_os_str().to_os_string(),
            LIMITS_HELPER_ARG.into(),
            nproc.to_string().into(),
        ],
        None => {
            let prlimit = ["/usr/bin/prlimit", "/bin/prlimit"]
                .into_iter()
                .map(Path::new)
                .find(|p| p.exists())?;
            vec![
                prlimit.as_os_str().to_os_string(),
                format!("--nproc={nproc}:{nproc}").into(),
                "--".into(),
            ]
        }
    };
    Some(prefix.into_iter().chain(argv).collect())
}

/// bwrap's options that size the private /tmp and /dev/shm: `--size BYTES` goes right
/// before the `--tmpfs` it applies to.
pub(crate) fn tmpfs_size(size: Option<u64>) -> Vec<OsString> {
    match size {
        Some(b) => vec!["--size".into(), b.max(4096).to_string().into()],
        None => Vec::new(),
    }
}

/// A pids cgroup holding one command (as root): made before the command starts, the
/// command's bwrap entered into it before it execs, emptied and removed after.
pub(crate) struct Cgroup {
    dir: PathBuf,
    /// `cgroup.procs`, opened before the fork: the child writes "0" (itself) to it.
    procs: OwnedFd,
    max: u32,
}

/// The cgroup's processes are the command's plus bwrap's two (its monitor and the
/// sandbox's init).
const BWRAP_PROCESSES: u32 = 2;
/// How often removing an emptied cgroup is tried (the kernel frees it a moment after its
/// last process is reaped), 20 ms apart: then it is left with a log line.
const RMDIR_ATTEMPTS: u32 = 100;

static SEQ: AtomicU64 = AtomicU64::new(0);

impl Cgroup {
    /// A new pids cgroup allowing `max` processes to the command; `Err` says why none can
    /// be had here.
    pub(crate) fn create(max: u32) -> Result<Cgroup, String> {
        let parents = candidates();
        if parents.is_empty() {
            return Err("no cgroup file system with the pids controller is mounted".into());
        }
        let name = format!(
            "shade-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let mut why = Vec::new();
        for parent in parents {
            let dir = parent.join(&name);
            match Cgroup::make(&dir, max) {
                Ok(cg) => return Ok(cg),
                Err(e) => {
                    let _ = fs::remove_dir(&dir);
                    why.push(format!("{}: {e}", dir.display()));
                }
            }
        }
        Err(why.join("; "))
    }

    fn make(dir: &Path, max: u32) -> std::io::Result<Cgroup> {
        fs::create_dir(dir)?;
        fs::write(
            dir.join("pids.max"),
            max.saturating_add(BWRAP_PROCESSES).to_string(),
        )?;
        let procs = fs::OpenOptions::new()
            .write(true)
            .open(dir.join("cgroup.procs"))?;
        Ok(Cgroup {
            dir: dir.to_path_buf(),
            procs: procs.into(),
            max,
        })
    }

    /// Makes `cmd`'s process enter the cgroup right before it execs (so everything it
    /// starts is counted from its first fork).
    pub(crate) fn enter_on_exec(&self, cmd: &mut Command) {
        let fd: RawFd = self.procs.as_raw_fd();
        // SAFETY: write(2) of a static buffer to an fd that outlives the spawn.
        unsafe {
            cmd.pre_exec(move || {
                if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }

    /// Whether a fork was refused at the limit (`pids.events`' "max" count).
    pub(crate) fn hit(&self) -> Option<LimitHit> {
        let events = fs::read_to_string(self.dir.join("pids.events")).ok()?;
        let refused: u64 = events
            .lines()
            .find_map(|l| l.strip_prefix("max "))?
            .trim()
            .parse()
            .ok()?;
        (refused > 0).then_some(LimitHit::Processes(self.max))
    }

    /// Kills what is left in it and removes it, trying a bounded number of times.
    fn remove(&self) {
        for attempt in 0..RMDIR_ATTEMPTS {
            let left = fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
            for pid in left.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                // SAFETY: kill(2); a pid gone meanwhile gives ESRCH.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            match fs::remove_dir(&self.dir) {
                Ok(()) => return,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return,
                Err(e) if attempt + 1 == RMDIR_ATTEMPTS => {
                    tracing::warn!(
                        "could not remove the command's cgroup {}: {e}; left behind",
                        self.dir.display()
                    );
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Where a pids cgroup may be made, best first.
fn candidates() -> Vec<PathBuf> {
    let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let mut out = Vec::new();
    // cgroup v2: the unified hierarchy, where its pids controller is enabled for children.
    for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
        let root = Path::new(root);
        if !is_cgroup2(root) {
            continue;
        }
        let rel = own
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .unwrap_or("/")
            .trim_start_matches('/');
        let mine = root.join(rel);
        if has_word(&mine.join("cgroup.subtree_control"), "pids") {
            out.push(mine);
        }
        if has_word(&root.join("cgroup.controllers"), "pids") {
            // The root may have processes and children with controllers at once.
            if !has_word(&root.join("cgroup.subtree_control"), "pids") {
                let _ = fs::OpenOptions::new()
                    .write(true)
                    .open(root.join("cgroup.subtree_control"))
                    .and_then(|mut f| f.write_all(b"+pids"));
            }
            if has_word(&root.join("cgroup.subtree_control"), "pids") {
                out.push(root.to_path_buf());
            }
        }
    }
    // cgroup v1: the pids hierarchy, below our own cgroup in it.
    let v1 = Path::new("/sys/fs/cgroup/pids");
    if v1.join("cgroup.procs").exists() {
        let rel = own
            .lines()
            .find_map(|l| {
                let mut f = l.splitn(3, ':');
                let (_, ctrl, path) = (f.next()?, f.next()?, f.next()?);
                ctrl.split(',').any(|c| c == "pids").then_some(path)
            })
            .unwrap_or("/")
            .trim_start_matches('/');
        let mine = v1.join(rel);
        if mine.is_dir() {
            out.push(mine);
        }
        out.push(v1.to_path_buf());
    }
    out.dedup();
    out
}

fn is_cgroup2(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
}

fn has_word(file: &Path, word: &str) -> bool {
    fs::read_to_string(file).is_ok_and(|s| s.split_whitespace().any(|w| w == word))
}

/// The user and mount namespaces of the sandbox whose init is `pid` (its PID namespace
/// `pid_ns_ino`, checked after opening them, so a reused pid cannot give another's).
pub(crate) fn namespaces_of(pid: i32, pid_ns_ino: u64) -> Option<(fs::File, fs::File)> {
    use std::os::unix::fs::MetadataExt;
    let user = fs::File::open(format!("/proc/{pid}/ns/user")).ok()?;
    let mnt = fs::File::open(format!("/proc/{pid}/ns/mnt")).ok()?;
    let same = fs::metadata(format!("/proc/{pid}/ns/pid")).ok()?.ino() == pid_ns_ino;
    same.then_some((user, mnt))
}

/// Which of the sandbox's private /tmp (when it has one, `tmp`) and /dev/shm, sized by
/// `limits`, are full now: looked at from a child that enters the sandbox's namespaces
/// (`ns`, held since the start, so they outlive the command). Bounded: the child only
/// makes non-blocking calls on tmpfs, and is killed if it has not ended within a second.
pub(crate) fn full_tmpfs(ns: &(fs::File, fs::File), limits: &Limits, tmp: bool) -> Vec<LimitHit> {
    let mut asks: Vec<(&'static std::ffi::CStr, LimitHit)> = Vec::new();
    if let (Some(size), true) = (limits.tmp_size, tmp) {
        asks.push((c"/tmp", LimitHit::Tmp(size)));
    }
    if let Some(size) = limits.shm_size {
        asks.push((c"/dev/shm", LimitHit::Shm(size)));
    }
    if asks.is_empty() {
        return Vec::new();
    }
    let Ok((rd, wr)) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) else {
        return Vec::new();
    };
    let (user, mnt) = (ns.0.as_raw_fd(), ns.1.as_raw_fd());
    let paths: Vec<&std::ffi::CStr> = asks.iter().map(|(p, _)| *p).collect();
    // SAFETY: the child makes only async-signal-safe calls (setns, statfs, write, _exit)
    // on data prepared before the fork.
    let pid = unsafe { libc::fork() };
    if pid == -1 {
        return Vec::new();
    }
    if pid == 0 {
        // SAFETY: as above.
        unsafe {
            if libc::setns(user, libc::CLONE_NEWUSER) != 0 && libc::geteuid() != 0 {
                libc::_exit(1);
            }
            if libc::setns(mnt, libc::CLONE_NEWNS) != 0 {
                libc::_exit(1);
            }
            for p in &paths {
                let mut st: libc::statfs = std::mem::zeroed();
                // Full: no block left, on a tmpfs.
                let full = libc::statfs(p.as_ptr(), &mut st) == 0
                    && st.f_type == libc::TMPFS_MAGIC
                    && st.f_bavail == 0;
                let b = [u8::from(full)];
                libc::write(wr.as_raw_fd(), b.as_ptr().cast(), 1);
            }
            libc::_exit(0);
        }
    }
    drop(wr);
    let mut done = false;
    for _ in 0..100 {
        // SAFETY: reaping our own child without blocking.
        if unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) } != 0 {
            done = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    if !done {
        // SAFETY: our own child; then reaped (SIGKILL cannot be ignored).
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        return Vec::new();
    }
    let mut answers = Vec::new();
    let _ = std::io::Read::read_to_end(&mut fs::File::from(rd), &mut answers);
    asks.into_iter()
        .zip(answers)
        .filter(|(_, full)| *full == 1)
        .map(|((_, hit), _)| hit)
        .collect()
}

static WARNED: OnceLock<()> = OnceLock::new();

/// Says once per process that a limit could not be enforced here, and why.
pub(crate) fn warn_unenforced(what: &str, why: &str) {
    if WARNED.set(()).is_ok() {
        tracing::warn!("{what} is not enforced here: {why}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limits_are_described_in_one_line() {
        let d = Limits::SPECULATION.describe();
        assert_eq!(
            d,
            "processes 512, /tmp 512 MiB, /dev/shm 512 MiB, branch contents 1 GiB, \
             branch metadata 64 MiB, outside layer 1 GiB, time 300 s"
        );
        assert!(Limits::RUN.describe().contains("as the system's"));
    }

    #[test]
    fn the_branch_metadata_budget_is_never_unbounded() {
        assert_eq!(Limits::RUN.branch().metadata, Some(DEFAULT_METADATA));
        assert_eq!(Limits::SPECULATION.branch().size, Some(1 << 30));
    }
}
