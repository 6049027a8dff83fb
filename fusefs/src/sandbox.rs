//! Runs a command inside a branch mount, at the project's real absolute path.
//!
//! The command runs confined by bubblewrap (see bwrap.rs: user and PID namespaces, a
//! minimal /dev, shade's state hidden, a seccomp filter), with the branch mount bound over
//! the project path, so absolute paths baked into venvs, build caches and compile databases
//! resolve into the branch and nothing can reach the real tree. Where that sandbox cannot be
//! had, runs are refused ([`SandboxError::Unconfined`]) unless [`Isolation::unconfined`]
//! asks for the old mount namespace only (no security boundary), which without privileges
//! degrades further to running in the mount directory. This module knows nothing about how
//! the overlay works: it only needs a directory to bind and the path to bind it over.
//!
//! It is a library: `shade run` calls it as the terminal's foreground job
//! ([`RunSpec::foreground`]: signal handlers, terminal hand-over), while the agent, lint and
//! speculation call it from async programs that handle Ctrl-C themselves, capture the output
//! ([`Output::Capture`]) and stop a run through a [`Cancel`] handle.

mod bwrap;
mod caches;
mod cancel;
mod capture;
mod cgroup;
mod child;
pub mod env;
mod ids;
mod ipc;
mod limits;
mod masks;
mod outside;
mod procs;
mod report;
mod scope;
mod seccomp;
mod signals;
mod sized;
mod sockets;
mod supervise;
mod teardown;
#[cfg(test)]
mod tests;

use std::ffi::{CString, OsString};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::errno::Errno;

pub use bwrap::{
    confinement, foreground_helper, probe, set_foreground_helper, Confinement,
    FOREGROUND_HELPER_ARG,
};
pub use caches::{default_cache_dirs, CacheBranches};
pub use cancel::Cancel;
pub use capture::{Captured, Tee};
pub use cgroup::memory_enforcement;
pub use child::{cloexec_inherited_fds, detach_from_terminal};
pub use limits::{
    bounded as bounded_limits, configure as configure_limits, limits_helper, HostTables, Limits,
    Scheduler, LIMITS_HELPER_ARG,
};

pub use crate::budget::LimitHit;
use child::{ChildPlan, Mode};
pub use env::{EnvConfig, EnvPolicy};
pub use outside::release_outside;
use report::{Report, Stage};
pub use scope::abi as landlock_abi;
pub use sockets::{
    allow_sockets, allowed_sockets, check as check_socket, expand as expand_socket,
    note_unresolved, unresolved_sockets,
};

/// Exit status for a command killed at its time limit (shell conventions leave it unused).
pub const EXIT_TIMED_OUT: i32 = 123;
/// Exit status for a command that could not be started, as shells use.
pub const EXIT_CANNOT_EXEC: i32 = 127;

/// Everything needed to run one command in a branch.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// Canonical real project path: the bind target, the path the command sees.
    pub project: PathBuf,
    /// The branch's mount point: what gets bound over `project`.
    pub mount: PathBuf,
    /// Absolute working directory inside `project`, entered after the bind.
    pub cwd: PathBuf,
    /// The command and its arguments; `argv[0]` is looked up in `PATH`.
    pub argv: Vec<OsString>,
    /// Environment changes on top of ours (as [`env_policy`](Self::env_policy) filters
    /// it): `Some` sets a variable, `None` removes it.
    pub env: Vec<(OsString, Option<OsString>)>,
    /// Whose command it is: an agent's gets shade's environment without its secrets and
    /// the home's credential files hidden (see [`env`]); the user's keeps both.
    pub env_policy: EnvPolicy,
    /// Kill the command's process group after this long.
    pub timeout: Option<Duration>,
    /// Where the command's stdin, stdout and stderr go.
    pub output: Output,
    /// With [`Output::Capture`]: also handed every chunk of output as it is read, so that
    /// all of it can be kept (in a file) while only head and tail stay in memory.
    pub tee: Option<Tee>,
    /// The CLI's foreground job: while it runs, SIGINT/SIGTERM/SIGHUP stop it (handlers are
    /// installed process-wide) and it gets the terminal. Library callers leave this off and
    /// stop a run with [`Cancel`] instead.
    pub foreground: bool,
    /// A command the user runs themselves but that does not get the terminal (chat's
    /// `!cmd`, output captured): it stays in our session, as a background process group,
    /// so it may still open `/dev/tty` (a password prompt). Every other run that is not
    /// handed the terminal gets a session of its own without one. Ignored when the run
    /// gets the terminal.
    pub user_session: bool,
    /// Extra isolation for speculative runs.
    pub isolation: Isolation,
    /// Directories bound over paths outside the project, writable even with
    /// [`Isolation::read_only`]. Needs a namespace.
    pub binds: Vec<Bind>,
    /// The branch's outside directory (`Branch::outside_dir`): every write the command makes
    /// outside the project lands there (see outside.rs) instead of on the host. `None`: no
    /// capture (the rest of the file system as [`Isolation`] says).
    pub outside: Option<PathBuf>,
}

impl RunSpec {
    /// A spec with defaults for everything but the paths and the command: inherited
    /// stdio, no time limit, not foreground, no extra isolation.
    pub fn new(project: PathBuf, mount: PathBuf, cwd: PathBuf, argv: Vec<OsString>) -> RunSpec {
        RunSpec {
            project,
            mount,
            cwd,
            argv,
            env: Vec::new(),
            env_policy: EnvPolicy::default(),
            timeout: None,
            output: Output::Inherit,
            tee: None,
            foreground: false,
            user_session: false,
            isolation: Isolation::default(),
            binds: Vec::new(),
            outside: None,
        }
    }

    /// The time limit in force: the shorter of `timeout` and the isolation's.
    fn limit(&self) -> Option<Duration> {
        match (self.timeout, self.isolation.limits.time_limit) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// Where the command's standard streams go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Output {
    /// Ours: stdin, stdout and stderr are shared with the command.
    #[default]
    Inherit,
    /// For `--json`: the command's stdout goes to our stderr so our stdout stays parseable.
    StdoutToStderr,
    /// Pipes: stdin is /dev/null, stdout and stderr are read into memory, each keeping its
    /// first and last `cap / 2` bytes (see [`Captured`]).
    Capture {
        /// Bytes kept per stream.
        cap: usize,
    },
}

/// Optional isolation on top of the sandbox every command gets (see the module doc).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Isolation {
    /// Network off: a new network namespace with only the loopback interface, up.
    pub network: bool,
    /// A fresh tmpfs on /tmp, gone when the command ends.
    pub private_tmp: bool,
    /// Nothing outside the branch writable: every mount read-only except the branch at the
    /// project path, the [`RunSpec::binds`] and a private /tmp and /dev/shm (implied).
    /// Device nodes such as /dev/null stay usable. Needs Linux 5.12+ (mount_setattr).
    pub read_only: bool,
    /// What the command may consume: processes, the private /tmp's and /dev/shm's sizes,
    /// time (whatever [`RunSpec::timeout`] says, the shorter wins). The branch's share
    /// (`branch_size`, `branch_metadata`) is the branch's to enforce: see
    /// [`Limits::branch`] and `BranchOptions::limits`.
    pub limits: Limits,
    /// No sandbox: only a private mount namespace with the branch bound over the project
    /// (`shade run --unconfined`, and file system test suites that need real root). The
    /// command can reach shade, the real project and the host: no security boundary.
    pub unconfined: bool,
}

impl Isolation {
    /// The sandbox of a speculative command: network off, private /tmp, the rest of the
    /// file system read-only, the speculation limits ([`Limits::speculation`]), killed
    /// after `time_limit`.
    pub fn speculative(time_limit: Duration) -> Isolation {
        Isolation {
            network: true,
            private_tmp: true,
            read_only: true,
            limits: Limits {
                time_limit: Some(time_limit),
                ..Limits::speculation()
            },
            unconfined: false,
        }
    }

    /// Unconfined runs: whether this isolation needs a private namespace beyond the mount one.
    fn needs_namespace(&self) -> bool {
        self.network || self.private_tmp || self.read_only
    }
}

pub use ids::sandbox_base;

/// The home's credential paths inside `project` (canonical) that a mode hiding credentials
/// keeps from its commands (see masks.rs `inside_project`): the branch hides them, as the
/// outside layer's masks hide those outside the project.
pub(crate) fn credentials_inside(project: &Path) -> Vec<PathBuf> {
    masks::inside_project(&env::homes(), project)
}

/// The id shift a branch must present for a command run with `iso`: when shade runs as
/// root a confined command is root of a user namespace mapped to [`sandbox_base`], and
/// sees the branch's files only through that shift; unconfined commands and other users'
/// sandboxes keep their ids.
pub fn branch_id_shift(iso: &Isolation) -> Option<crate::idmap::IdShift> {
    (nix::unistd::geteuid().is_root() && !iso.unconfined).then(|| crate::idmap::IdShift {
        base: sandbox_base(),
    })
}

/// A writable directory bound over a path outside the project, typically a throw-away
/// branch of a build cache (see [`CacheBranches`]) so the command reads the real cache and
/// its writes vanish with the branch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    /// What gets bound (a branch's mount point).
    pub source: PathBuf,
    /// The absolute path it appears at for the command (the real cache directory).
    pub target: PathBuf,
}

/// How the command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Termination {
    /// Exited by itself with this status.
    Exited(i32),
    /// Died of this signal on its own (not sent by us).
    Signaled(i32),
    /// Killed by us because `timeout` passed.
    TimedOut,
    /// Killed by us because we received this signal (SIGINT, SIGTERM or SIGHUP); only
    /// for [`RunSpec::foreground`] runs.
    Interrupted(i32),
    /// Killed by us because its [`Cancel`] handle was used.
    Cancelled,
    /// Could not be started; the message says why.
    CannotExec(String),
}

/// What happened to a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOutcome {
    pub termination: Termination,
    /// False when we fell back to running in the mount directory without a namespace.
    pub namespaced: bool,
    /// Processes other than the command itself that were still alive when it ended (or
    /// when we stopped it) and that we killed: background jobs, escaped daemons. For a
    /// confined run a best-effort count: the kernel kills whatever is left in its PID
    /// namespace the moment the command ends, often before we can look.
    pub leftovers_killed: usize,
    /// The command's stdout, with [`Output::Capture`].
    pub stdout: Option<Captured>,
    /// The command's stderr, with [`Output::Capture`].
    pub stderr: Option<Captured>,
    /// The limits the command reached (processes, time; the branch's are the branch's to
    /// say), each said in one line by its `Display`.
    pub limits_hit: Vec<LimitHit>,
}

impl RunOutcome {
    /// The limits reached, one line each ("the command reached its 512-process limit").
    pub fn limit_lines(&self) -> Vec<String> {
        self.limits_hit.iter().map(ToString::to_string).collect()
    }
}

impl RunOutcome {
    /// The status shade should exit with, following shell conventions so callers can treat
    /// shade like the command itself: 128+signal for signal deaths.
    pub fn exit_code(&self) -> i32 {
        match &self.termination {
            Termination::Exited(code) => *code,
            Termination::Signaled(sig) | Termination::Interrupted(sig) => 128 + sig,
            Termination::Cancelled => 128 + libc::SIGKILL,
            Termination::TimedOut => EXIT_TIMED_OUT,
            Termination::CannotExec(_) => EXIT_CANNOT_EXEC,
        }
    }
}

/// shade's own failures around a run (the command's own failures are a [`Termination`]).
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The spec cannot be run as given.
    #[error("{0}")]
    Invalid(String),
    /// The sandbox cannot be had here; the message says why and what to do.
    #[error("not running the command without its sandbox: {0}")]
    Unconfined(String),
    /// Isolation was asked for, but this process may not create namespaces.
    #[error(
        "isolation needs a private namespace, which this process may not create ({0}); \
         run as root or enable unprivileged user namespaces"
    )]
    NoNamespaces(Errno),
    /// Setting up, starting or supervising the command failed.
    #[error("{what}: {err}")]
    Io {
        /// What we were doing, in the user's terms.
        what: String,
        /// Why it failed.
        err: std::io::Error,
    },
}

impl SandboxError {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> SandboxError {
        let what = what.into();
        move |err| SandboxError::Io { what, err }
    }
}

pub type Result<T> = std::result::Result<T, SandboxError>;

/// How long a command gets between SIGTERM and SIGKILL when we stop it (timeout or signal;
/// a [`Cancel`] kills at once).
pub const GRACE: Duration = Duration::from_secs(2);

/// Runs the command described by `spec` to completion and reports how it ended.
///
/// Errors are shade's own failures (bad spec, namespace set-up failed); anything the
/// command does, including failing to start, is a [`Termination`]. Blocks the calling
/// thread; from async code, call it in `spawn_blocking`.
pub fn run(spec: &RunSpec) -> Result<RunOutcome> {
    run_inner(spec, None)
}

/// [`run`], stoppable from another thread: `cancel.cancel()` kills the command's process
/// group and every process left in its mount namespace, and the run returns
/// [`Termination::Cancelled`]. A handle cancelled before the run starts nothing.
pub fn run_cancellable(spec: &RunSpec, cancel: &Cancel) -> Result<RunOutcome> {
    run_inner(spec, Some(cancel))
}

/// The bwrap command that runs `spec` confined, for callers that need their own stdio and
/// supervision (language servers speaking over stdin/stdout): the same sandbox as [`run`]
/// (only `timeout`, `output`, `tee` and `foreground` are not used). It gets its own process
/// group; killing it (bwrap's monitor) kills everything in the sandbox. Refused like a run
/// where the sandbox cannot be had; with [`Isolation::unconfined`] refused too (use
/// [`run`]).
pub fn command(spec: &RunSpec) -> Result<Command> {
    check_spec(spec)?;
    if spec.isolation.unconfined {
        return Err(SandboxError::Invalid(
            "an unconfined command cannot be prepared, only run".into(),
        ));
    }
    let conf = probe().map_err(|why| SandboxError::Unconfined(why.to_string()))?;
    // Its end is the caller's: the branch's connection is not reused (`pool.rs`).
    for m in std::iter::once(&spec.mount).chain(spec.binds.iter().map(|b| &b.source)) {
        crate::pool::taint(m, "a command ran on it unsupervised");
    }
    bwrap::build(conf, &host_bounded(spec), false, None, None)
}

fn run_inner(spec: &RunSpec, cancel: Option<&Cancel>) -> Result<RunOutcome> {
    check_spec(spec)?;
    if cancel.is_some_and(Cancel::is_cancelled) {
        return Ok(outcome(Termination::Cancelled, false));
    }
    let confined = if spec.isolation.unconfined {
        None
    } else {
        // The command's own sandbox is the probe: one that cannot start asks `probe` why.
        let conf = confinement().map_err(|why| SandboxError::Unconfined(why.to_string()))?;
        crate::timing::mark("confinement");
        check_sources(spec)?;
        if let Some(msg) = bwrap::cannot_exec(spec) {
            return Ok(outcome(Termination::CannotExec(msg), true));
        }
        Some(conf)
    };
    let _signals = if spec.foreground {
        Some(
            signals::Guard::install()
                .map_err(|e| SandboxError::io("installing signal handlers")(e.into()))?,
        )
    } else {
        None
    };
    let ctl = supervise::Control {
        timeout: spec.limit(),
        foreground: spec.foreground,
        cancel,
    };
    // Whether a reference into the branch can outlive the run (`pool.rs`).
    let scoped = confined.is_some_and(|c| c.scoped());
    let mounts = std::iter::once(&spec.mount).chain(spec.binds.iter().map(|b| &b.source));
    let used = crate::pool::CommandUse::begin(
        mounts.map(PathBuf::as_path),
        containment(&spec.isolation, scoped),
    );
    let res = match confined {
        Some(conf) => run_confined(conf, spec, &ctl, cancel),
        None => run_unconfined(spec, &ctl),
    };
    if res.is_ok() {
        used.end();
    }
    res.map(|o| timed(o, spec))
}

/// A run killed at its time limit says so among its limits.
fn timed(mut outcome: RunOutcome, spec: &RunSpec) -> RunOutcome {
    if outcome.termination == Termination::TimedOut {
        if let Some(limit) = spec.limit() {
            outcome.limits_hit.push(LimitHit::Time(limit));
        }
    }
    outcome
}

fn run_unconfined(spec: &RunSpec, ctl: &supervise::Control) -> Result<RunOutcome> {
    match spawn(spec, Mode::namespaced(spec)?)? {
        Spawned::Running(running) => supervise::wait(running, ctl, true),
        Spawned::CannotExec(msg) => Ok(outcome(Termination::CannotExec(msg), true)),
        Spawned::NoPrivileges(errno) => {
            if spec.isolation.needs_namespace() || !spec.binds.is_empty() {
                return Err(SandboxError::NoNamespaces(errno));
            }
            let fallback_cwd = fallback_cwd(spec)?;
            let warning = format!(
                "no privileges for a mount namespace ({errno}); running in {} \
                 — absolute paths to {} are NOT redirected to the branch",
                fallback_cwd.display(),
                spec.project.display()
            );
            if spec.foreground {
                eprintln!("shade: warning: {warning}");
            } else {
                tracing::warn!("{warning}");
            }
            match spawn(
                spec,
                Mode::Fallback {
                    cwd: cstring(&fallback_cwd)?,
                },
            )? {
                Spawned::Running(running) => supervise::wait(running, ctl, false),
                Spawned::CannotExec(msg) => Ok(outcome(Termination::CannotExec(msg), false)),
                Spawned::NoPrivileges(errno) => Err(SandboxError::Io {
                    what: "starting the command".into(),
                    err: errno.into(),
                }),
            }
        }
    }
}

fn outcome(termination: Termination, namespaced: bool) -> RunOutcome {
    RunOutcome {
        termination,
        namespaced,
        leftovers_killed: 0,
        stdout: None,
        stderr: None,
        limits_hit: Vec::new(),
    }
}

fn check_spec(spec: &RunSpec) -> Result<()> {
    let invalid = |m: String| Err(SandboxError::Invalid(m));
    if spec.argv.is_empty() {
        return invalid("no command given".into());
    }
    for (what, path) in [
        ("project", &spec.project),
        ("mount", &spec.mount),
        ("cwd", &spec.cwd),
    ] {
        if !path.is_absolute() {
            return invalid(format!("{what} path {} is not absolute", path.display()));
        }
    }
    if !spec.cwd.starts_with(&spec.project) {
        return invalid(format!(
            "working directory {} is outside the project {}",
            spec.cwd.display(),
            spec.project.display()
        ));
    }
    let private_tmp = spec.isolation.private_tmp || spec.isolation.read_only;
    for b in &spec.binds {
        let t = &b.target;
        if !t.is_absolute() || !b.source.is_absolute() {
            return invalid(format!(
                "bind {} over {}: paths must be absolute",
                b.source.display(),
                t.display()
            ));
        }
        if t.starts_with(&spec.project) || spec.project.starts_with(t) {
            return invalid(format!(
                "bind over {} overlaps the project {}",
                t.display(),
                spec.project.display()
            ));
        }
        if private_tmp && t.starts_with("/tmp") {
            return invalid(format!(
                "bind over {}: the private /tmp would hide it",
                t.display()
            ));
        }
    }
    Ok(())
}

/// A missing branch mount or bind source is shade's failure, said before bwrap says it in
/// the command's stderr.
fn check_sources(spec: &RunSpec) -> Result<()> {
    let missing = |p: &Path| match std::fs::metadata(p) {
        Ok(m) if m.is_dir() => None,
        Ok(_) => Some(std::io::Error::from_raw_os_error(libc::ENOTDIR)),
        Err(e) => Some(e),
    };
    if let Some(err) = missing(&spec.mount) {
        return Err(SandboxError::Io {
            what: Stage::Bind.describe(spec),
            err,
        });
    }
    for b in &spec.binds {
        if let Some(err) = missing(&b.source) {
            return Err(SandboxError::Io {
                what: format!("binding {} over {}", b.source.display(), b.target.display()),
                err,
            });
        }
    }
    Ok(())
}

/// The fallback runs without a bind, so the working directory is translated into the mount.
fn fallback_cwd(spec: &RunSpec) -> Result<PathBuf> {
    let rel = spec
        .cwd
        .strip_prefix(&spec.project)
        .map_err(|_| SandboxError::Invalid("cwd outside the project".into()))?;
    Ok(if rel.as_os_str().is_empty() {
        spec.mount.clone()
    } else {
        spec.mount.join(rel)
    })
}

pub(crate) fn cstring(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| SandboxError::Invalid(format!("path {} contains a NUL byte", path.display())))
}

/// Write `data` to an existing file (a /proc file such as uid_map) with raw calls only: both
/// namespace stages call it between fork and exec, where nothing may allocate.
///
/// # Safety
/// `path` must be a valid C string; the call is async-signal-safe.
pub(crate) unsafe fn write_file(path: &std::ffi::CStr, data: &[u8]) -> std::io::Result<()> {
    let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let n = libc::write(fd, data.as_ptr().cast(), data.len());
    let err = std::io::Error::last_os_error();
    libc::close(fd);
    if n == data.len() as isize {
        Ok(())
    } else {
        Err(err)
    }
}

/// Map the ids of the user namespace just unshared (setgroups denied first, as an
/// unprivileged gid_map write requires; old kernels have no setgroups file). Between fork
/// and exec: raw calls only.
///
/// # Safety
/// Async-signal-safe; call in the process that unshared the namespace.
pub(crate) unsafe fn write_id_maps(uid_map: &[u8], gid_map: &[u8]) -> std::io::Result<()> {
    match write_file(c"/proc/self/setgroups", b"deny") {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
        other => other?,
    }
    write_file(c"/proc/self/uid_map", uid_map)?;
    write_file(c"/proc/self/gid_map", gid_map)
}

/// A started child, handed to the supervisor.
pub(crate) struct Running {
    pub child: std::process::Child,
    /// The child's private mount namespace, to find processes that left its process group
    /// (setsid daemons) but still live in the branch. Held open so its identity stays unique.
    pub mnt_ns: Option<std::fs::File>,
    /// Whether we gave the terminal's foreground to the child (and its modes then);
    /// restored afterwards.
    pub tty_handed: Option<child::Handed>,
    /// Readers of the command's stdout and stderr, with [`Output::Capture`].
    pub capture: Option<capture::Readers>,
    /// Confined runs: what bwrap reports (its sandbox's PID namespace, the exit status).
    pub status: Option<bwrap::Status>,
}

enum Spawned {
    Running(Running),
    CannotExec(String),
    /// Creating the namespace was refused: the caller falls back.
    NoPrivileges(Errno),
}

/// How often a sandbox that failed to set up is tried: bwrap remounts every mount it binds,
/// and a mount that goes away meanwhile (another branch closing) fails that set-up. The
/// command never started then, so trying again is safe.
pub(crate) const SETUP_ATTEMPTS: u64 = 20;

/// How long a command waits for earlier commands' namespaces to be torn down (see
/// teardown.rs): well past what hundreds of overlays take on a loaded machine.
const TEARDOWN_WAIT: Duration = Duration::from_secs(10);

fn run_confined(
    conf: &Confinement,
    spec: &RunSpec,
    ctl: &supervise::Control,
    cancel: Option<&Cancel>,
) -> Result<RunOutcome> {
    let bounded = host_bounded(spec);
    let spec = &bounded;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let held = spec.tee.clone().map(capture::HeldTee::new);
        let mut this = spec.clone();
        this.tee = held.as_ref().map(capture::HeldTee::tee);
        let cgroup = process_cgroup(conf, spec);
        // An earlier command's overlays are gone before this one mounts its own on the
        // same upper directories.
        if let Some(outside) = &spec.outside {
            if !teardown::settle(outside, TEARDOWN_WAIT) {
                tracing::debug!("an earlier command's namespaces are still being torn down");
            }
        }
        let mut running = spawn_confined(conf, &this, cgroup.as_ref())?;
        // Held past the command's end, to see whether its /tmp or /dev/shm filled up.
        let namespaces = running.status.as_mut().and_then(|s| s.user_mnt_ns.take());
        let mut outcome = supervise::wait(running, ctl, true)?;
        crate::timing::mark("reaped");
        outcome
            .limits_hit
            .extend(cgroup.iter().flat_map(limits::Cgroup::hits));
        if let Some(ns) = &namespaces {
            let iso = &spec.isolation;
            let private_tmp = iso.private_tmp || iso.read_only;
            outcome
                .limits_hit
                .extend(limits::full_tmpfs(ns, &iso.limits, private_tmp));
        }
        // Their mounts (a plain user's rebuilt `/`: an overlay per unit and per
        // read-only directory) are torn down while the result is reported.
        if let Some(ns) = namespaces {
            teardown::release(ns, spec.outside.as_deref());
        }
        if let Some(size) = spec.outside.as_deref().and_then(sized::full) {
            outcome.limits_hit.push(LimitHit::Outside(size));
        }
        // Emptied and removed (bounded) before the next attempt or the return.
        drop(cgroup);
        crate::timing::mark("limits-checked");
        let setup_failed = matches!(&outcome.termination,
            Termination::CannotExec(msg) if msg.starts_with(supervise::SETUP_FAILED));
        // Not started by `run_inner`: a sandbox that cannot start anywhere here is said as
        // `probe` says it (the command never ran).
        if setup_failed {
            if let Err(why) = probe() {
                if let Some(held) = &held {
                    held.release();
                }
                return Err(SandboxError::Unconfined(why.to_string()));
            }
        }
        let retry =
            setup_failed && attempt < SETUP_ATTEMPTS && !cancel.is_some_and(Cancel::is_cancelled);
        if !retry {
            if let Some(held) = &held {
                held.release();
            }
        }
        let Termination::CannotExec(msg) = &outcome.termination else {
            return Ok(outcome);
        };
        if !setup_failed {
            return Ok(outcome);
        }
        // bwrap says why on the command's stderr: name it when we have it.
        let said = outcome.stderr.as_ref().map(Captured::text).and_then(|t| {
            t.lines()
                .rev()
                .find(|l| l.starts_with("bwrap:"))
                .map(str::to_string)
        });
        if retry {
            tracing::debug!("{msg}: {said:?}; trying again");
            std::thread::sleep(Duration::from_millis((10 * attempt).min(50)));
            continue;
        }
        outcome.termination = Termination::CannotExec(match said {
            Some(said) => format!("{msg}: {said}"),
            None => format!("{msg}; bwrap said why on stderr"),
        });
        return Ok(outcome);
    }
}

/// Where the command's streams go, on a command being prepared. A command that does not get
/// the terminal (`tty_handed` false) does not get it as its stdin either: it runs in a
/// session without a controlling terminal, where nothing would stop it (SIGTTIN) from
/// reading the keys meant for whoever has the terminal.
fn set_output(cmd: &mut Command, output: Output, tty_handed: bool) -> Result<()> {
    // SAFETY: isatty(3) on fd 0.
    if !tty_handed && unsafe { libc::isatty(0) } == 1 {
        cmd.stdin(Stdio::null());
    }
    match output {
        Output::Inherit => {}
        Output::StdoutToStderr => {
            let err = std::io::stderr()
                .as_fd()
                .try_clone_to_owned()
                .map_err(SandboxError::io("duplicating stderr"))?;
            cmd.stdout(Stdio::from(err));
        }
        Output::Capture { .. } => {
            cmd.stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
        }
    }
    Ok(())
}

/// `spec` with its process and open-file limits bounded against the host's tables (see
/// [`limits::bounded`]): every confined command has both.
fn host_bounded(spec: &RunSpec) -> RunSpec {
    let mut out = spec.clone();
    out.isolation.limits = limits::host_bounded(&spec.isolation.limits, spec.foreground);
    out
}

/// As root, a cgroup for the command's process and memory limits (a plain user's are set
/// inside the sandbox, see bwrap.rs); `None` without limits, or where no cgroup can be had
/// (said once in the log: root's commands then run without them).
fn process_cgroup(conf: &Confinement, spec: &RunSpec) -> Option<limits::Cgroup> {
    let l = &spec.isolation.limits;
    if !conf.root_userns() {
        return None;
    }
    let (cgroup, missing) = limits::Cgroup::create(l.max_processes, l.memory, l.cpu_weight);
    if let Some(m) = missing {
        if m.cpu {
            cgroup::warn_cpu_unset(&m.why);
        }
        for (lost, what) in [(m.processes, "process"), (m.memory, "memory")] {
            if lost && spec.foreground {
                eprintln!(
                    "shade: warning: the {what} limit is not enforced here: {}",
                    m.why
                );
            }
        }
        if m.processes {
            limits::warn_unenforced("the process limit", &m.why);
        }
        if m.memory {
            cgroup::warn_memory_unenforced(&m.why);
        }
    }
    cgroup
}

/// Starts bwrap for `spec` and waits for it to report its sandbox.
fn spawn_confined(
    conf: &Confinement,
    spec: &RunSpec,
    cgroup: Option<&limits::Cgroup>,
) -> Result<Running> {
    let (status_rd, status_wr) =
        bwrap::status_pipe().map_err(SandboxError::io("creating a pipe"))?;
    let tty = child::hand_tty(spec.foreground);
    let tty_handed = tty.is_some();
    let mut cmd = bwrap::build(conf, spec, tty_handed, Some(status_wr), cgroup)?;
    set_output(&mut cmd, spec.output, tty_handed)?;
    crate::timing::mark("bwrap-built");
    let spawned = cmd.spawn();
    crate::timing::mark("bwrap-spawned");
    // The hook holds bwrap's end of the status pipe: close ours so we see EOF.
    drop(cmd);
    let mut child = match spawned {
        Ok(child) => child,
        Err(err) => {
            child::restore_tty(tty.as_ref());
            return Err(SandboxError::Io {
                what: format!("starting the sandbox ({})", conf.bwrap.display()),
                err,
            });
        }
    };
    let capture = match spec.output {
        Output::Capture { cap } => {
            Some(capture::Readers::start(&mut child, cap, spec.tee.as_ref()))
        }
        _ => None,
    };
    let status = bwrap::Status::start(status_rd);
    crate::timing::mark("sandbox-namespaces");
    Ok(Running {
        child,
        mnt_ns: None,
        tty_handed: tty,
        capture,
        status: Some(status),
    })
}

fn spawn(spec: &RunSpec, mode: Mode) -> Result<Spawned> {
    let (report_rd, report_wr) =
        report::channel().map_err(SandboxError::io("creating a socket pair"))?;
    let tty = child::hand_tty(spec.foreground);
    let tty_handed = tty.is_some();
    let plan = ChildPlan::new(mode, &report_wr, tty_handed, spec.user_session);

    let mut cmd = Command::new(&spec.argv[0]);
    cmd.args(&spec.argv[1..]);
    cmd.env_clear().envs(env::command_env(spec.env_policy));
    for (key, value) in &spec.env {
        match value {
            Some(v) => cmd.env(key, v),
            None => cmd.env_remove(key),
        };
    }
    // Shells trust an inherited $PWD that names their cwd; give them the right one.
    cmd.env("PWD", plan.cwd_os());
    set_output(&mut cmd, spec.output, tty_handed)?;
    // SAFETY: the closure only makes async-signal-safe system calls on data prepared
    // before the fork (see child.rs); it allocates nothing.
    unsafe {
        cmd.pre_exec(move || plan.enter());
    }
    child::die_with_parent(&mut cmd);
    let result = cmd.spawn();
    drop(report_wr);
    let report = Report::read(report_rd);
    match result {
        Ok(mut child) => {
            let capture = match spec.output {
                Output::Capture { cap } => {
                    Some(capture::Readers::start(&mut child, cap, spec.tee.as_ref()))
                }
                _ => None,
            };
            Ok(Spawned::Running(Running {
                child,
                mnt_ns: report.mnt_ns,
                tty_handed: tty,
                capture,
                status: None,
            }))
        }
        Err(err) => {
            child::restore_tty(tty.as_ref());
            let errno = Errno::from_raw(err.raw_os_error().unwrap_or(0));
            let program = spec.argv[0].to_string_lossy();
            match report.last_stage {
                Some(Stage::Exec) => Ok(Spawned::CannotExec(format!("{program}: {err}"))),
                Some(Stage::Unshare | Stage::UserMaps) if child::is_no_privileges(errno) => {
                    Ok(Spawned::NoPrivileges(errno))
                }
                Some(stage) => Err(SandboxError::Io {
                    what: stage.describe(spec),
                    err,
                }),
                None => Err(SandboxError::Io {
                    what: format!("starting {program}"),
                    err,
                }),
            }
        }
    }
}

/// Whether a descriptor can leave a command's sandbox (`Err`: how), judged before it runs:
/// a connection such a command ran on is never pooled (`pool.rs`).
/// `scoped`: abstract unix sockets are scoped to the sandbox (Landlock).
fn containment(iso: &Isolation, scoped: bool) -> std::result::Result<(), String> {
    if iso.unconfined {
        return Err("an unconfined command ran on it".into());
    }
    if !allowed_sockets().is_empty() {
        return Err("a command with an allowed socket ran on it".into());
    }
    // `network`: a network namespace of its own, whose abstract sockets are its own.
    if !scoped && !iso.network {
        return Err("a command reached host abstract sockets (no Landlock scopes)".into());
    }
    Ok(())
}
