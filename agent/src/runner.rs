//! Commands in a shadow's branch: the [`ShadowRunner`] a shadow hands to its tool contexts
//! (the `shell` tool and the linter's checkers run through it), and the state a shadow
//! shares with its runners. Kept apart from `shadow` so the tools need not know shadows.

use std::collections::{BTreeSet, HashMap};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Duration;

use shade_fusefs::sandbox::{self, CacheBranches, Cancel, Isolation, Output, RunOutcome, RunSpec};
use shade_fusefs::served::RemoteBranch;
use shade_fusefs::{
    AcceptError, AcceptFlags, AcceptReport, Branch, BranchError, BranchOptions, ChangeKind,
    Changeset, LimitHit,
};
use tokio_util::sync::CancellationToken;

use crate::workspace::Workspace;

/// The part of a shadow shared with its runners (and so with every tool context made for it).
pub(crate) struct Inner {
    pub(crate) project: PathBuf,
    /// What the branch is a branch of: the project, or the parent shadow's mount.
    pub(crate) lower: PathBuf,
    /// Where the branch is mounted and its workspace, as of its last attach: a detached
    /// branch ([`Shadow::detach_idle`](crate::shadow::Shadow::detach_idle)) is mounted
    /// elsewhere when it attaches again.
    pub(crate) at: Mutex<At>,
    pub(crate) id: String,
    pub(crate) isolation: Isolation,
    pub(crate) cache_dirs: Vec<PathBuf>,
    pub(crate) branch_options: BranchOptions,
    /// `None` once accepted or aborted.
    pub(crate) branch: Mutex<Option<ShadowBranch>>,
    /// Created on the first read-only command; dropped with the branch.
    pub(crate) caches: Mutex<Option<CacheBranches>>,
    pub(crate) runs: Mutex<Runs>,
    /// Signalled whenever a command ends.
    pub(crate) idle: Condvar,
    /// Shadows made on top of this one ([`ShadowBase::create_child`](crate::shadow::ShadowBase::create_child)): closed before it,
    /// since their branch reads through its mount.
    pub(crate) children: Mutex<Vec<Weak<Inner>>>,
    /// Where commands' writes outside the project go when it is not the branch's own
    /// layer: a live session keeps one layer across the branches it renews
    /// ([`crate::shadow::Live`]).
    pub(crate) outside: Option<PathBuf>,
}

/// A shadow's branch: made in this process, or served by the project's branch server
/// (issue 31: its connection's caches are warm from the server's earlier branches). The
/// engine's answers are the same either way; a served one runs them in the server.
pub(crate) enum ShadowBranch {
    Local(Box<Branch>),
    Served(RemoteBranch),
}

impl ShadowBranch {
    pub(crate) fn mountpoint(&self) -> &Path {
        match self {
            ShadowBranch::Local(b) => b.mountpoint(),
            ShadowBranch::Served(b) => b.mountpoint(),
        }
    }

    pub(crate) fn outside_dir(&self) -> PathBuf {
        match self {
            ShadowBranch::Local(b) => b.outside_dir(),
            ShadowBranch::Served(b) => b.outside_dir(),
        }
    }

    pub(crate) fn take_limit_hits(&self) -> Vec<LimitHit> {
        match self {
            ShadowBranch::Local(b) => b.take_limit_hits(),
            ShadowBranch::Served(b) => b.take_limits_hit(),
        }
    }

    /// What the branch changed; for a served branch whose server failed, nothing (logged:
    /// its mount went with the server).
    pub(crate) fn changeset(&self, include_ignored: bool) -> Changeset {
        match self {
            ShadowBranch::Local(b) => b.changeset(include_ignored),
            ShadowBranch::Served(b) => b.changeset(include_ignored).unwrap_or_else(|e| {
                tracing::warn!("the branch's changes: {e}");
                Changeset::default()
            }),
        }
    }

    pub(crate) fn diff(&self, changes: &Changeset) -> String {
        match self {
            ShadowBranch::Local(b) => b.diff(changes),
            ShadowBranch::Served(b) => b.diff(changes).unwrap_or_else(|e| {
                tracing::warn!("the branch's diff: {e}");
                String::new()
            }),
        }
    }

    pub(crate) fn check_accept(&self, flags: AcceptFlags) -> Result<(), AcceptError> {
        match self {
            ShadowBranch::Local(b) => b.check_accept(flags),
            ShadowBranch::Served(b) => b.check_accept(flags),
        }
    }

    pub(crate) fn accept(self, flags: AcceptFlags) -> Result<AcceptReport, AcceptError> {
        match self {
            ShadowBranch::Local(b) => (*b).accept(flags),
            ShadowBranch::Served(b) => b.accept(flags),
        }
    }

    /// Accept with nothing running in the branch any more. A local branch stays mounted
    /// (in `keep`) until the caller drops it; a served one is the server's to drop.
    pub(crate) fn accept_quiesced(
        self,
        flags: AcceptFlags,
        keep: &mut Option<Branch>,
    ) -> Result<AcceptReport, AcceptError> {
        match self {
            ShadowBranch::Local(b) => {
                let r = b.accept_quiesced(flags);
                *keep = Some(*b);
                r
            }
            ShadowBranch::Served(b) => b.accept(flags),
        }
    }

    pub(crate) fn is_detached(&self) -> bool {
        match self {
            ShadowBranch::Local(b) => b.is_detached(),
            ShadowBranch::Served(b) => b.is_parked(),
        }
    }

    /// Let the connection go while idle (`Branch::detach`); a served branch is parked in
    /// the server (detached there, its socket closed here: `RemoteBranch::park`).
    pub(crate) fn detach(&mut self) -> Result<(), String> {
        match self {
            ShadowBranch::Local(b) => b.detach(),
            ShadowBranch::Served(b) => b.park(),
        }
    }

    pub(crate) fn attach(&mut self) -> Result<(), BranchError> {
        match self {
            ShadowBranch::Local(b) => b.attach(),
            ShadowBranch::Served(b) => b.resume().map_err(|source| BranchError::Mount {
                path: b.project().to_path_buf(),
                source,
            }),
        }
    }
}

/// Where a shadow's branch is mounted now, and the workspace of that mount.
pub(crate) struct At {
    pub(crate) mount: PathBuf,
    pub(crate) workspace: Workspace,
}

/// The commands running in a shadow.
#[derive(Default)]
pub(crate) struct Runs {
    pub(crate) next: u64,
    pub(crate) live: HashMap<u64, Cancel>,
    /// Set by accept/abort: no new command may start.
    pub(crate) closed: bool,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Inner {
    /// Where the branch is mounted (as of its last attach).
    pub(crate) fn mount(&self) -> PathBuf {
        lock(&self.at).mount.clone()
    }

    /// The branch's mount as a workspace (as of its last attach).
    pub(crate) fn workspace(&self) -> Workspace {
        lock(&self.at).workspace.clone()
    }

    /// Stops new commands, kills running ones, waits for them, drops the cache branches and
    /// hands back the branch (if not closed before).
    pub(crate) fn close(&self) -> Option<ShadowBranch> {
        drop(self.stop_commands());
        self.close_children();
        lock(&self.branch).take()
    }

    /// Close and unmount every shadow made on top of this one. Called once `runs.closed` is
    /// set: no child can be added after (see [`ShadowBase::create_child`](crate::shadow::ShadowBase::create_child)).
    pub(crate) fn close_children(&self) {
        let children = std::mem::take(&mut *lock(&self.children));
        for child in children.iter().filter_map(Weak::upgrade) {
            drop(child.close());
        }
    }

    /// No new command may start; running ones are killed and waited for. Hands back the
    /// cache branches (dropping them unmounts them).
    pub(crate) fn stop_commands(&self) -> Option<CacheBranches> {
        let mut runs = lock(&self.runs);
        runs.closed = true;
        for c in runs.live.values() {
            c.cancel();
        }
        drop(self.wait_idle(runs));
        lock(&self.caches).take()
    }

    pub(crate) fn wait_idle<'a>(&self, mut runs: MutexGuard<'a, Runs>) -> MutexGuard<'a, Runs> {
        while !runs.live.is_empty() {
            runs = self.idle.wait(runs).unwrap_or_else(|e| e.into_inner());
        }
        runs
    }

    /// Run `spec` with this shadow's isolation and build-cache binds (blocking), stoppable
    /// by `stop`; `registration` keeps it in the live set until it ends.
    fn run_sandboxed(
        &self,
        mut spec: RunSpec,
        stop: &Cancel,
        registration: Registration,
    ) -> Result<RunOutcome, RunError> {
        let _registration = registration;
        spec.isolation = self.isolation;
        spec.binds = self.binds().map_err(RunError::Sandbox)?;
        // Writes outside the project land in the branch's outside layer (issue 29), for
        // the live session and speculation alike (no read-only home that tools fail on).
        spec.outside = lock(&self.branch)
            .as_ref()
            .map(|b| self.outside.clone().unwrap_or_else(|| b.outside_dir()));
        let mut outcome =
            sandbox::run_cancellable(&spec, stop).map_err(|e| RunError::Sandbox(e.to_string()))?;
        // The branch's budgets are the branch's to enforce: their hits join the run's.
        if let Some(branch) = lock(&self.branch).as_ref() {
            outcome.limits_hit.extend(branch.take_limit_hits());
        }
        Ok(outcome)
    }

    /// Paths the branch adds that accept would carry (not ignored ones).
    fn added_paths(&self) -> BTreeSet<PathBuf> {
        match lock(&self.branch).as_ref() {
            Some(b) => b
                .changeset(false)
                .changes
                .into_iter()
                .filter(|c| c.kind == ChangeKind::Added)
                .map(|c| c.path)
                .collect(),
            None => BTreeSet::new(),
        }
    }

    /// Remove the paths added since `before` was taken (what a checker left): each new
    /// tree from its topmost directory that the project does not have and that holds
    /// nothing added before.
    fn remove_added_since(&self, before: &BTreeSet<PathBuf>) {
        let new: Vec<PathBuf> = self.added_paths().difference(before).cloned().collect();
        let mut tops: BTreeSet<PathBuf> = BTreeSet::new();
        for rel in &new {
            let mut top = PathBuf::new();
            for part in rel.components() {
                top.push(part);
                let fresh =
                    !self.lower.join(&top).exists() && !before.iter().any(|b| b.starts_with(&top));
                if fresh {
                    break;
                }
            }
            if !tops.iter().any(|t| top.starts_with(t)) {
                tops.insert(top);
            }
        }
        // Beneath the branch's descriptor: the checker may have left links to the host.
        let branch = shade_fusefs::rootdir::RootDir::open(&self.mount());
        for rel in tops {
            let removed = match &branch {
                Ok(b) => b.remove_all(&rel),
                Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
            };
            if let Err(e) = removed {
                tracing::warn!("cannot remove {} left by a checker: {e}", rel.display());
            }
        }
    }

    fn binds(&self) -> Result<Vec<sandbox::Bind>, String> {
        if !self.isolation.read_only || self.cache_dirs.is_empty() {
            return Ok(Vec::new());
        }
        let mut caches = lock(&self.caches);
        if caches.is_none() {
            let created =
                CacheBranches::create(&self.project, &self.cache_dirs, &self.branch_options)
                    .map_err(|e| {
                        format!("cannot give the build caches a throw-away branch: {e}")
                    })?;
            *caches = Some(created);
        }
        if let Some(c) = caches.as_mut() {
            c.attach()
                .map_err(|e| format!("cannot attach the build caches' branches: {e}"))?;
        }
        Ok(caches
            .as_ref()
            .map(CacheBranches::binds)
            .unwrap_or_default())
    }
}

/// Runs commands inside a shadow's branch sandbox (what the `shell` tool uses there).
#[derive(Clone)]
pub struct ShadowRunner {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for ShadowRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShadowRunner")
            .field("project", &self.inner.project)
            .field("branch", &self.inner.id)
            .finish()
    }
}

/// One command for [`ShadowRunner::run`].
#[derive(Debug, Clone)]
pub struct Command {
    /// Program and arguments (`argv[0]` looked up in `PATH`).
    pub argv: Vec<OsString>,
    /// Working directory: the real project path or below (the branch is bound there).
    pub cwd: PathBuf,
    /// Environment changes: `Some` sets, `None` removes.
    pub env: Vec<(OsString, Option<OsString>)>,
    /// Kill it after this long (the shadow's own time limit still applies).
    pub timeout: Option<Duration>,
    /// Bytes kept of each of stdout and stderr (head and tail).
    pub output_cap: usize,
    /// Also gets all of the output as it comes (the shell keeps it whole in a log).
    pub tee: Option<sandbox::Tee>,
    /// The user's own command (chat's `!cmd`): it may open the terminal
    /// ([`sandbox::RunSpec::user_session`]); the model's commands never may.
    pub user_session: bool,
}

/// Why a command did not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunError {
    /// The shadow was accepted or aborted.
    #[error("the shadow branch is closed (accepted or aborted); no command can run in it")]
    Closed,
    /// The caller's cancel token fired; the command was killed.
    #[error("cancelled")]
    Cancelled,
    /// [`Shadow::kill_commands`](crate::shadow::Shadow::kill_commands) killed it.
    #[error("the command was killed: its shadow branch stopped every command running in it")]
    Killed,
    /// shade could not set the sandbox up.
    #[error("{0}")]
    Sandbox(String),
}

/// Removes a run from the live set when its blocking task ends, however it ends.
struct Registration {
    inner: Arc<Inner>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        lock(&self.inner.runs).live.remove(&self.id);
        self.inner.idle.notify_all();
    }
}

impl ShadowRunner {
    /// The real project path the commands see.
    pub fn project(&self) -> &Path {
        &self.inner.project
    }

    /// The sandbox commands run in.
    pub fn isolation(&self) -> Isolation {
        self.inner.isolation
    }

    /// The branch as the linter sees it: its checkers run through this runner, so in this
    /// shadow's sandbox, and are killed with its other commands.
    pub fn lint_view(&self) -> shade_lint::BranchView {
        shade_lint::BranchView {
            project: self.inner.project.clone(),
            mount: self.inner.mount(),
            runner: Some(Arc::new(self.clone())),
        }
    }

    /// A new live run, or `Closed`.
    fn register(&self, stop: &Cancel) -> Result<Registration, RunError> {
        let mut runs = lock(&self.inner.runs);
        if runs.closed {
            return Err(RunError::Closed);
        }
        let id = runs.next;
        runs.next += 1;
        runs.live.insert(id, stop.clone());
        Ok(Registration {
            inner: self.inner.clone(),
            id,
        })
    }

    /// Runs `cmd` in the branch at the project's real path with captured output, on the
    /// blocking pool. `cancel` (or aborting the shadow) kills it and everything it started.
    pub async fn run(
        &self,
        cmd: Command,
        cancel: &CancellationToken,
    ) -> Result<RunOutcome, RunError> {
        let stop = Cancel::new();
        let registration = self.register(&stop)?;
        let inner = self.inner.clone();
        let task_stop = stop.clone();
        let task = tokio::task::spawn_blocking(move || {
            let mut spec = RunSpec::new(inner.project.clone(), inner.mount(), cmd.cwd, cmd.argv);
            spec.env = cmd.env;
            spec.timeout = cmd.timeout;
            spec.output = Output::Capture {
                cap: cmd.output_cap,
            };
            spec.tee = cmd.tee;
            spec.user_session = cmd.user_session;
            inner.run_sandboxed(spec, &task_stop, registration)
        });
        tokio::pin!(task);
        let joined = tokio::select! {
            r = &mut task => r,
            _ = cancel.cancelled() => {
                stop.cancel();
                task.await
            }
        };
        let outcome =
            joined.map_err(|e| RunError::Sandbox(format!("the command's task failed: {e}")))??;
        if outcome.termination == sandbox::Termination::Cancelled {
            return Err(if cancel.is_cancelled() {
                RunError::Cancelled
            } else if lock(&self.inner.runs).closed {
                RunError::Closed
            } else {
                RunError::Killed
            });
        }
        Ok(outcome)
    }
}

/// The linter's checkers run like the shadow's shell commands: same sandbox, same build
/// caches, killed when the shadow closes. What a checker adds to the branch outside its
/// ignored paths (`.ruff_cache/`, `.mypy_cache/` and the like) is removed when it ends, so
/// accept carries the agent's work and not the checker's caches.
impl shade_lint::exec::Runner for ShadowRunner {
    fn run(&self, spec: RunSpec) -> Result<RunOutcome, String> {
        let stop = Cancel::new();
        let registration = self.register(&stop).map_err(|e| e.to_string())?;
        let before = self.inner.added_paths();
        let outcome = self.inner.run_sandboxed(spec, &stop, registration);
        self.inner.remove_added_since(&before);
        let outcome = outcome.map_err(|e| e.to_string())?;
        if outcome.termination == sandbox::Termination::Cancelled {
            let why = if lock(&self.inner.runs).closed {
                RunError::Closed
            } else {
                RunError::Killed
            };
            return Err(why.to_string());
        }
        Ok(outcome)
    }
}
