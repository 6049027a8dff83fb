//! Runs a command inside a branch mount, at the project's real absolute path.
//!
//! The command gets its own process group and a private mount namespace in which the
//! branch mount is bind-mounted over the project path, so absolute paths baked into
//! venvs, build caches and compile databases resolve into the branch and can never write
//! through to the real tree. Without the privileges for namespaces it degrades to running
//! in the mount directory and says so. This module knows nothing about how the overlay
//! works: it only needs a directory to bind and the path to bind it over.

mod child;
mod procs;
mod report;
mod signals;
mod supervise;
#[cfg(test)]
mod tests;

use std::ffi::{CString, OsString};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use nix::errno::Errno;

use crate::exit;
use child::{ChildPlan, Mode};
use report::{Report, Stage};

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
    /// Kill the command's process group after this long.
    pub timeout: Option<Duration>,
    /// For `--json`: the command's stdout goes to our stderr so our stdout stays parseable.
    pub stdout_to_stderr: bool,
    /// Extra isolation for speculative runs.
    pub isolation: Isolation,
}

/// Optional isolation on top of the mount namespace. Both need namespaces: when they are
/// unavailable, `run` refuses instead of silently running without them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Isolation {
    /// New network namespace with only the loopback interface, up.
    pub network: bool,
    /// A fresh tmpfs on /tmp, gone when the command ends.
    pub private_tmp: bool,
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
    /// Killed by us because we received this signal (SIGINT, SIGTERM or SIGHUP).
    Interrupted(i32),
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
    /// when we stopped it) and that we killed: background jobs, escaped daemons.
    pub leftovers_killed: usize,
}

impl RunOutcome {
    /// The status shade should exit with, following shell conventions so callers can treat
    /// shade like the command itself: 128+signal for signal deaths.
    pub fn exit_code(&self) -> i32 {
        match &self.termination {
            Termination::Exited(code) => *code,
            Termination::Signaled(sig) | Termination::Interrupted(sig) => 128 + sig,
            Termination::TimedOut => exit::TIMED_OUT,
            Termination::CannotExec(_) => exit::CANNOT_EXEC,
        }
    }
}

/// How long a command gets between SIGTERM and SIGKILL when we stop it.
pub const GRACE: Duration = Duration::from_secs(2);

/// Runs the command described by `spec` to completion and reports how it ended.
///
/// Errors are shade's own failures (bad spec, namespace set-up failed); anything the
/// command does, including failing to start, is a [`Termination`].
pub fn run(spec: &RunSpec) -> anyhow::Result<RunOutcome> {
    check_spec(spec)?;
    let _signals = signals::Guard::install().context("installing signal handlers")?;
    match spawn(spec, Mode::namespaced(spec)?)? {
        Spawned::Running(running) => supervise::wait(running, spec.timeout, true),
        Spawned::CannotExec(msg) => Ok(cannot_exec(msg, true)),
        Spawned::NoPrivileges(errno) => {
            if spec.isolation != Isolation::default() {
                bail!(
                    "isolation needs a private namespace, which this process may not create ({errno}); \
                     run as root or enable unprivileged user namespaces"
                );
            }
            let fallback_cwd = fallback_cwd(spec)?;
            eprintln!(
                "shade: warning: no privileges for a mount namespace ({errno}); running in {} \
                 — absolute paths to {} are NOT redirected to the branch",
                fallback_cwd.display(),
                spec.project.display()
            );
            match spawn(
                spec,
                Mode::Fallback {
                    cwd: cstring(&fallback_cwd)?,
                },
            )? {
                Spawned::Running(running) => supervise::wait(running, spec.timeout, false),
                Spawned::CannotExec(msg) => Ok(cannot_exec(msg, false)),
                Spawned::NoPrivileges(errno) => {
                    bail!("unexpected failure starting the command: {errno}")
                }
            }
        }
    }
}

fn cannot_exec(msg: String, namespaced: bool) -> RunOutcome {
    RunOutcome {
        termination: Termination::CannotExec(msg),
        namespaced,
        leftovers_killed: 0,
    }
}

fn check_spec(spec: &RunSpec) -> anyhow::Result<()> {
    if spec.argv.is_empty() {
        bail!("no command given");
    }
    for (what, path) in [
        ("project", &spec.project),
        ("mount", &spec.mount),
        ("cwd", &spec.cwd),
    ] {
        if !path.is_absolute() {
            bail!("{what} path {} is not absolute", path.display());
        }
    }
    if !spec.cwd.starts_with(&spec.project) {
        bail!(
            "working directory {} is outside the project {}",
            spec.cwd.display(),
            spec.project.display()
        );
    }
    Ok(())
}

/// The fallback runs without a bind, so the working directory is translated into the mount.
fn fallback_cwd(spec: &RunSpec) -> anyhow::Result<PathBuf> {
    let rel = spec
        .cwd
        .strip_prefix(&spec.project)
        .context("cwd outside the project")?;
    Ok(if rel.as_os_str().is_empty() {
        spec.mount.clone()
    } else {
        spec.mount.join(rel)
    })
}

pub(crate) fn cstring(path: &Path) -> anyhow::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .with_context(|| format!("path {} contains a NUL byte", path.display()))
}

/// A started child, handed to the supervisor.
pub(crate) struct Running {
    pub child: std::process::Child,
    /// The child's private mount namespace, to find processes that left its process group
    /// (setsid daemons) but still live in the branch. Held open so its identity stays unique.
    pub mnt_ns: Option<std::fs::File>,
    /// Whether we gave the terminal's foreground to the child; restored afterwards.
    pub tty_handed: bool,
}

enum Spawned {
    Running(Running),
    CannotExec(String),
    /// Creating the namespace was refused: the caller falls back.
    NoPrivileges(Errno),
}

fn spawn(spec: &RunSpec, mode: Mode) -> anyhow::Result<Spawned> {
    let (report_rd, report_wr) = report::channel().context("creating a socket pair")?;
    let tty_handed = child::can_hand_tty();
    let plan = ChildPlan::new(mode, &report_wr, tty_handed);

    let mut cmd = Command::new(&spec.argv[0]);
    cmd.args(&spec.argv[1..]);
    // Shells trust an inherited $PWD that names their cwd; give them the right one.
    cmd.env("PWD", plan.cwd_os());
    if spec.stdout_to_stderr {
        let err = std::io::stderr()
            .as_fd()
            .try_clone_to_owned()
            .context("duplicating stderr")?;
        cmd.stdout(Stdio::from(err));
    }
    // SAFETY: the closure only makes async-signal-safe system calls on data prepared
    // before the fork (see child.rs); it allocates nothing.
    unsafe {
        cmd.pre_exec(move || plan.enter());
    }
    let result = cmd.spawn();
    drop(report_wr);
    let report = Report::read(report_rd);
    match result {
        Ok(child) => Ok(Spawned::Running(Running {
            child,
            mnt_ns: report.mnt_ns,
            tty_handed,
        })),
        Err(err) => {
            child::restore_tty(tty_handed);
            let errno = Errno::from_raw(err.raw_os_error().unwrap_or(0));
            let program = spec.argv[0].to_string_lossy();
            match report.last_stage {
                Some(Stage::Exec) => Ok(Spawned::CannotExec(format!("{program}: {err}"))),
                Some(Stage::Unshare | Stage::UserMaps) if child::is_no_privileges(errno) => {
                    Ok(Spawned::NoPrivileges(errno))
                }
                Some(stage) => Err(anyhow::anyhow!(err)).context(stage.describe(spec)),
                None => Err(anyhow::anyhow!(err)).context(format!("starting {program}")),
            }
        }
    }
}
