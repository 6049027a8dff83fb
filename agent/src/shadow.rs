//! Agents in branches: a [`Shadow`] is one branch of the project in which an agent's file
//! tools and shell commands all land, so nothing reaches the real tree until
//! [`Shadow::accept`]. The model keeps seeing the project's real absolute paths (the
//! workspace maps them into the mount, commands run in a namespace where the branch is
//! bound over the project path). A shadow can be aborted while commands run in it: they are
//! killed, with everything they started, before the branch is unmounted.
//!
//! Hundreds can live at once: a shadow costs one FUSE mount (plus, for a read-only sandbox,
//! one throw-away branch per build cache, created on its first command) and no thread
//! except while a command runs.

use std::collections::{BTreeSet, HashMap};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Duration;

use shade_fusefs::sandbox::{self, CacheBranches, Cancel, Isolation, Output, RunOutcome, RunSpec};
use shade_fusefs::{
    AcceptError, AcceptFlags, AcceptReport, Branch, BranchError, BranchOptions, ChangeKind,
    Changeset,
};
use tokio_util::sync::CancellationToken;

use crate::tools::ToolContext;
use crate::workspace::Workspace;

/// How to create a shadow.
#[derive(Debug, Clone)]
pub struct ShadowOptions {
    /// The branch's options (state dir, memory budget, FUSE threads).
    pub branch: BranchOptions,
    /// The sandbox every shell command of the shadow runs in.
    pub isolation: Isolation,
    /// Build caches outside the project that get a throw-away branch each when
    /// `isolation.read_only` is set (otherwise commands write to them normally).
    pub cache_dirs: Vec<PathBuf>,
}

impl ShadowOptions {
    /// For speculation: network off, private /tmp, the rest of the file system read-only
    /// except throw-away branches of the usual build caches, commands killed after
    /// `time_limit`.
    pub fn speculative(time_limit: Duration) -> ShadowOptions {
        ShadowOptions {
            branch: BranchOptions::default(),
            isolation: Isolation::speculative(time_limit),
            cache_dirs: sandbox::default_cache_dirs(),
        }
    }

    /// For a live `--shadow` session: network and /tmp as usual; inside the project only
    /// the branch is writable.
    pub fn live() -> ShadowOptions {
        ShadowOptions {
            branch: BranchOptions::default(),
            isolation: Isolation::default(),
            cache_dirs: Vec::new(),
        }
    }
}

/// Why a shadow could not be created.
#[derive(Debug, thiserror::Error)]
pub enum ShadowError {
    /// Creating or mounting the branch failed.
    #[error(transparent)]
    Branch(#[from] BranchError),
    /// The mount could not be used as a workspace.
    #[error("branch mount {path}: {source}")]
    Workspace {
        /// The mount point.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// One branch of a project with an agent working in it. Dropping it aborts it.
pub struct Shadow {
    inner: Arc<Inner>,
}

/// The part shared with every [`ToolContext`] made for the shadow.
struct Inner {
    project: PathBuf,
    /// What the branch is a branch of: the project, or the parent shadow's mount.
    lower: PathBuf,
    mount: PathBuf,
    id: String,
    workspace: Workspace,
    isolation: Isolation,
    cache_dirs: Vec<PathBuf>,
    branch_options: BranchOptions,
    /// `None` once accepted or aborted.
    branch: Mutex<Option<Branch>>,
    /// Created on the first read-only command; dropped with the branch.
    caches: Mutex<Option<CacheBranches>>,
    runs: Mutex<Runs>,
    /// Signalled whenever a command ends.
    idle: Condvar,
    /// Shadows made on top of this one ([`ShadowBase::create_child`]): closed before it,
    /// since their branch reads through its mount.
    children: Mutex<Vec<Weak<Inner>>>,
}

#[derive(Default)]
struct Runs {
    next: u64,
    live: HashMap<u64, Cancel>,
    /// Set by accept/abort: no new command may start.
    closed: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shadow {
    /// Mounts a fresh branch of `project` (canonicalized).
    pub fn create(project: &Path, options: ShadowOptions) -> Result<Shadow, ShadowError> {
        let branch = Branch::create(project, &options.branch)?;
        let project = branch.project().to_path_buf();
        Self::around(branch, project, options)
    }

    /// The shadow of `branch`, whose commands and paths show it at `project`.
    fn around(
        branch: Branch,
        project: PathBuf,
        options: ShadowOptions,
    ) -> Result<Shadow, ShadowError> {
        let lower = branch.project().to_path_buf();
        let mount = branch.mountpoint().to_path_buf();
        let workspace =
            Workspace::shadowed(&project, &mount).map_err(|source| ShadowError::Workspace {
                path: mount.clone(),
                source,
            })?;
        Ok(Shadow {
            inner: Arc::new(Inner {
                id: branch.id().to_string(),
                project,
                lower,
                mount,
                workspace,
                isolation: options.isolation,
                cache_dirs: options.cache_dirs,
                branch_options: options.branch,
                branch: Mutex::new(Some(branch)),
                caches: Mutex::new(None),
                runs: Mutex::new(Runs::default()),
                idle: Condvar::new(),
                children: Mutex::new(Vec::new()),
            }),
        })
    }

    /// A handle to branch off this shadow ([`ShadowBase::create_child`]), for a speculation
    /// started while the session works here.
    pub fn base(&self) -> ShadowBase {
        ShadowBase {
            inner: self.inner.clone(),
        }
    }

    /// The real project directory (canonical).
    pub fn project(&self) -> &Path {
        &self.inner.project
    }

    /// Where the branch is mounted (never shown to the model).
    pub fn mountpoint(&self) -> &Path {
        &self.inner.mount
    }

    /// The branch's id (its FUSE fsname is `shade:ID`).
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// The sandbox shell commands run in.
    pub fn isolation(&self) -> Isolation {
        self.inner.isolation
    }

    /// The branch as a workspace: files in the mount, paths as in the project.
    pub fn workspace(&self) -> Workspace {
        self.inner.workspace.clone()
    }

    /// `base` moved into the shadow: its workspace becomes the branch, its `shell` runs in
    /// the branch sandbox, and it gets its own todo list. A lint hook of `base` (bound to
    /// another branch, or to none) is bound to this branch instead: same linter, and its
    /// checkers run in this shadow's sandbox.
    pub fn tool_context(&self, base: &ToolContext) -> ToolContext {
        let mut ctx = base.clone();
        ctx.workspace = self.workspace();
        ctx.todos = Default::default();
        ctx.shadow = Some(self.runner());
        ctx.lint = base
            .lint
            .as_ref()
            .map(|h| Arc::new(h.bound_to(Some(self.runner().lint_view()))));
        ctx
    }

    /// Runs commands in this shadow; usable after the shadow is gone (it then refuses).
    pub fn runner(&self) -> ShadowRunner {
        ShadowRunner {
            inner: self.inner.clone(),
        }
    }

    /// Commands running in the branch right now.
    pub fn running_commands(&self) -> usize {
        lock(&self.inner.runs).live.len()
    }

    /// Kills every command running in the branch now (process groups and namespace
    /// leftovers) and waits until they are gone; the shadow stays usable.
    pub fn kill_commands(&self) {
        let runs = lock(&self.inner.runs);
        for c in runs.live.values() {
            c.cancel();
        }
        drop(self.inner.wait_idle(runs));
    }

    /// What the branch changed so far (empty once accepted or aborted).
    pub fn changeset(&self, include_ignored: bool) -> Changeset {
        match lock(&self.inner.branch).as_ref() {
            Some(b) => b.changeset(include_ignored),
            None => Changeset::default(),
        }
    }

    /// Unified diff of `changes` (from [`Shadow::changeset`]), paths relative to the project.
    pub fn diff(&self, changes: &Changeset) -> String {
        match lock(&self.inner.branch).as_ref() {
            Some(b) => b.diff(changes),
            None => String::new(),
        }
    }

    /// Would [`Shadow::accept`] be refused now (paths changed in the project meanwhile)?
    /// Writes nothing and keeps the shadow, so a session can report and decide.
    pub fn check_accept(&self, flags: AcceptFlags) -> Result<(), AcceptError> {
        match lock(&self.inner.branch).as_ref() {
            Some(b) => b.check_accept(flags),
            None => Err(AcceptError::Io {
                path: self.inner.project.clone(),
                source: std::io::Error::other("the shadow was already closed"),
            }),
        }
    }

    /// Writes the branch into the real project: commands still running are killed first,
    /// then the accept is conflict-checked and atomic (nothing written on a conflict).
    pub fn accept(self, flags: AcceptFlags) -> Result<AcceptReport, AcceptError> {
        let branch = self.inner.close();
        match branch {
            Some(b) => b.accept(flags),
            None => Err(AcceptError::Io {
                path: self.inner.project.clone(),
                source: std::io::Error::other("the shadow was already closed"),
            }),
        }
    }

    /// [`Shadow::accept`] for a caller waiting on the result: commands are killed first, so
    /// nothing can write in the branch; the accept runs while it is still mounted, and the
    /// unmounts (branch and cache branches) happen when the returned [`Leftover`] is dropped.
    pub fn accept_then_clean(
        self,
        flags: AcceptFlags,
    ) -> Result<(AcceptReport, Leftover), AcceptError> {
        let caches = self.inner.stop_commands();
        self.inner.close_children();
        let branch = lock(&self.inner.branch).take();
        let Some(branch) = branch else {
            return Err(AcceptError::Io {
                path: self.inner.project.clone(),
                source: std::io::Error::other("the shadow was already closed"),
            });
        };
        let result = branch.accept_quiesced(flags);
        let leftover = Leftover {
            _branch: Some(branch),
            _caches: caches,
        };
        result.map(|report| (report, leftover))
    }

    /// Drops the branch: kills every process still running in it, unmounts it and removes
    /// its store (and the cache branches). Nothing is left mounted or on disk.
    pub fn abort(self) {}
}

/// A shadow as the base of others: a child is a branch of its branch (it sees the
/// shadow's unaccepted changes, its accept writes into the shadow, never into the project)
/// whose commands still run at the project's path. Closing the shadow closes its children
/// first.
#[derive(Clone)]
pub struct ShadowBase {
    inner: Arc<Inner>,
}

impl ShadowBase {
    /// Mount a branch of the shadow's mount (refused once the shadow is closed).
    pub fn create_child(&self, options: ShadowOptions) -> Result<Shadow, ShadowError> {
        let closed = || ShadowError::Workspace {
            path: self.inner.mount.clone(),
            source: std::io::Error::other("the shadow branch is closed"),
        };
        if lock(&self.inner.runs).closed {
            return Err(closed());
        }
        let branch = Branch::create(&self.inner.mount, &options.branch)?;
        let child = Shadow::around(branch, self.inner.project.clone(), options)?;
        // Registered under the parent's run lock, so a close that began meanwhile is seen.
        let runs = lock(&self.inner.runs);
        if runs.closed {
            drop(runs);
            drop(child);
            return Err(closed());
        }
        let mut children = lock(&self.inner.children);
        children.retain(|c| c.strong_count() > 0);
        children.push(Arc::downgrade(&child.inner));
        Ok(child)
    }
}

impl std::fmt::Debug for ShadowBase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShadowBase")
            .field("branch", &self.inner.id)
            .finish()
    }
}

/// What an accepted shadow still holds mounted; dropping it unmounts and removes it.
pub struct Leftover {
    _branch: Option<Branch>,
    _caches: Option<CacheBranches>,
}

impl Drop for Shadow {
    fn drop(&mut self) {
        drop(self.inner.close());
    }
}

impl Inner {
    /// Stops new commands, kills running ones, waits for them, drops the cache branches and
    /// hands back the branch (if not closed before).
    fn close(&self) -> Option<Branch> {
        drop(self.stop_commands());
        self.close_children();
        lock(&self.branch).take()
    }

    /// Close and unmount every shadow made on top of this one. Called once `runs.closed` is
    /// set: no child can be added after (see [`ShadowBase::create_child`]).
    fn close_children(&self) {
        let children = std::mem::take(&mut *lock(&self.children));
        for child in children.iter().filter_map(Weak::upgrade) {
            drop(child.close());
        }
    }

    /// No new command may start; running ones are killed and waited for. Hands back the
    /// cache branches (dropping them unmounts them).
    fn stop_commands(&self) -> Option<CacheBranches> {
        let mut runs = lock(&self.runs);
        runs.closed = true;
        for c in runs.live.values() {
            c.cancel();
        }
        drop(self.wait_idle(runs));
        lock(&self.caches).take()
    }

    fn wait_idle<'a>(&self, mut runs: MutexGuard<'a, Runs>) -> MutexGuard<'a, Runs> {
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
        sandbox::run_cancellable(&spec, stop).map_err(|e| RunError::Sandbox(e.to_string()))
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
        for rel in tops {
            let abs = self.mount.join(&rel);
            let removed = match std::fs::symlink_metadata(&abs) {
                Ok(m) if m.is_dir() => std::fs::remove_dir_all(&abs),
                Ok(_) => std::fs::remove_file(&abs),
                Err(_) => Ok(()),
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
        Ok(caches
            .as_ref()
            .map(CacheBranches::binds)
            .unwrap_or_default())
    }
}

/// Runs commands inside a shadow's branch sandbox (what the `shell` tool uses there).
#[derive(Clone)]
pub struct ShadowRunner {
    inner: Arc<Inner>,
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
    /// [`Shadow::kill_commands`] killed it.
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
            mount: self.inner.mount.clone(),
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
            let mut spec = RunSpec::new(
                inner.project.clone(),
                inner.mount.clone(),
                cmd.cwd,
                cmd.argv,
            );
            spec.env = cmd.env;
            spec.timeout = cmd.timeout;
            spec.output = Output::Capture {
                cap: cmd.output_cap,
            };
            spec.tee = cmd.tee;
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
