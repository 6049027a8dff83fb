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

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use shade_fusefs::sandbox::{self, CacheBranches, Isolation};
use shade_fusefs::{
    AcceptError, AcceptFlags, AcceptReport, Branch, BranchError, BranchOptions, Changeset,
};

use crate::runner::{lock, At, Inner, Runs, ShadowBranch};
pub use crate::runner::{Command, RunError, ShadowRunner};
use crate::tools::ToolContext;
use crate::workspace::Workspace;

mod live;
pub use live::{remove_layers_before_exit, AfterCall, Live};

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
    /// except throw-away branches of the usual build caches, the speculation limits
    /// (`[sandbox.speculation]`: processes, /tmp, /dev/shm, the branch's size), commands
    /// killed after `time_limit`.
    pub fn speculative(time_limit: Duration) -> ShadowOptions {
        ShadowOptions {
            branch: BranchOptions {
                limits: sandbox::Limits::speculation().branch(),
                id_shift: sandbox::branch_id_shift(&Isolation::speculative(time_limit)),
                ..BranchOptions::default()
            },
            isolation: Isolation::speculative(time_limit),
            cache_dirs: sandbox::default_cache_dirs(),
        }
    }

    /// For a live `--shadow` session: network and /tmp as usual; inside the project only
    /// the branch is writable.
    pub fn live() -> ShadowOptions {
        ShadowOptions {
            branch: BranchOptions {
                id_shift: sandbox::branch_id_shift(&Isolation::default()),
                ..BranchOptions::default()
            },
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

impl Shadow {
    /// Mounts a fresh branch of `project` (canonicalized) in this process.
    pub fn create(project: &Path, options: ShadowOptions) -> Result<Shadow, ShadowError> {
        let branch = Branch::create(project, &options.branch)?;
        let project = branch.project().to_path_buf();
        Self::around(
            ShadowBranch::Local(Box::new(branch)),
            project,
            options,
            None,
        )
    }

    /// [`Shadow::create`], the branch asked of the project's branch server (issue 31) when
    /// this process may use one (`shade_fusefs::served`): its connection comes warm from
    /// the server's earlier branches, so the first command does not pay a cold mount. The
    /// same fallback as `shade run`'s: `SHADE_BRANCH_SERVER=0`, or a server that cannot
    /// start or answer, makes the branch in-process (said in a debug log). For shadows
    /// that are never handed out as a [`Branch`] ([`Shadow::into_branch`]) or branched
    /// off: `exec`/`chat --shadow`, speculation on the project, `shade mcp` (an idle
    /// served branch is parked in the server: [`Shadow::detach_idle`]).
    pub fn create_served(project: &Path, options: ShadowOptions) -> Result<Shadow, ShadowError> {
        if shade_fusefs::served::enabled() {
            let canonical =
                std::fs::canonicalize(project).map_err(|source| ShadowError::Workspace {
                    path: project.to_path_buf(),
                    source,
                })?;
            // Reusable: every command of a shadow runs in its sandbox, which tells the
            // server (through `commands_left_it_reusable`) whether one may still hold it.
            if let Some(b) =
                shade_fusefs::served::RemoteBranch::create(&canonical, &options.branch, true)
            {
                let project = b.project().to_path_buf();
                return Self::around(ShadowBranch::Served(b), project, options, None);
            }
        }
        Self::create(project, options)
    }

    /// Whether the branch is served by the branch server ([`Shadow::create_served`]) on a
    /// connection that served an earlier branch (its caches warm).
    pub fn served_warm(&self) -> bool {
        matches!(&*lock(&self.inner.branch), Some(ShadowBranch::Served(b)) if b.reused_connection())
    }

    /// [`Shadow::create`] whose commands write outside the project into `outside` (an
    /// outside layer directory that outlives the branch) instead of the branch's own.
    pub fn create_with_outside(
        project: &Path,
        options: ShadowOptions,
        outside: PathBuf,
    ) -> Result<Shadow, ShadowError> {
        let branch = Branch::create(project, &options.branch)?;
        let project = branch.project().to_path_buf();
        Self::around(
            ShadowBranch::Local(Box::new(branch)),
            project,
            options,
            Some(outside),
        )
    }

    /// The shadow of `branch`, whose commands and paths show it at `project`.
    fn around(
        branch: ShadowBranch,
        project: PathBuf,
        options: ShadowOptions,
        outside: Option<PathBuf>,
    ) -> Result<Shadow, ShadowError> {
        let (id, lower) = match &branch {
            ShadowBranch::Local(b) => {
                // Every shadow's first command comes after a model call (or an MCP client's
                // next request): meanwhile a background walk fills the kernel's caches of
                // the fresh branch, so that command's look-ups (`git status`, `find`,
                // builds) are answered without round trips. Best effort: a failure only
                // loses the speed.
                if let Err(e) = b.warm_up() {
                    tracing::debug!("warming up branch {}: {e}", b.id());
                }
                (b.id().to_string(), b.project().to_path_buf())
            }
            // The server's connection is warm already (or, new, warms as it serves).
            ShadowBranch::Served(b) => {
                let name = b.mountpoint().file_name().unwrap_or_default();
                (
                    format!("served-{}", name.to_string_lossy()),
                    b.project().to_path_buf(),
                )
            }
        };
        let mount = branch.mountpoint().to_path_buf();
        let workspace =
            Workspace::shadowed(&project, &mount).map_err(|source| ShadowError::Workspace {
                path: mount.clone(),
                source,
            })?;
        Ok(Shadow {
            inner: Arc::new(Inner {
                id,
                project,
                lower,
                at: Mutex::new(At { mount, workspace }),
                isolation: options.isolation,
                cache_dirs: options.cache_dirs,
                branch_options: options.branch,
                branch: Mutex::new(Some(branch)),
                caches: Mutex::new(None),
                runs: Mutex::new(Runs::default()),
                idle: Condvar::new(),
                children: Mutex::new(Vec::new()),
                outside,
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

    /// Where the branch is mounted (never shown to the model); after
    /// [`Shadow::detach_idle`], where it was until [`Shadow::attach`] mounts it again.
    pub fn mountpoint(&self) -> PathBuf {
        self.inner.mount()
    }

    /// Let the branch's FUSE connection (and its build caches' branches') go while the
    /// shadow is idle: no command running, no shadow branched off it. An MCP server holding
    /// many branches then keeps its threads and descriptors flat (issue 31); the branch
    /// keeps its changes and reads. Refused, with the reason, where the branch must stay
    /// mounted ([`Branch::detach`]: something still refers into it). A served branch is
    /// parked in the branch server instead (detached there; no socket to it is kept here:
    /// `RemoteBranch::park`). Call [`Shadow::attach`] before using the mount, the
    /// workspace or the runner again.
    pub fn detach_idle(&self) -> Result<(), String> {
        let runs = lock(&self.inner.runs);
        if runs.closed {
            return Err("the shadow is closed".into());
        }
        if !runs.live.is_empty() {
            return Err(format!("{} command(s) running", runs.live.len()));
        }
        if lock(&self.inner.children)
            .iter()
            .any(|c| c.strong_count() > 0)
        {
            return Err("shadows are branched off it".into());
        }
        if let Some(c) = lock(&self.inner.caches).as_mut() {
            c.detach()?;
        }
        match lock(&self.inner.branch).as_mut() {
            Some(b) => b.detach(),
            None => Err("the shadow is closed".into()),
        }
    }

    /// Mount the branch again after [`Shadow::detach_idle`] (nothing to do when it is
    /// mounted): [`Shadow::mountpoint`] and [`Shadow::workspace`] then name the new mount,
    /// and a tool context made before must take the new workspace. The build caches'
    /// branches attach at the next command.
    pub fn attach(&self) -> Result<(), ShadowError> {
        self.inner.attach()
    }

    /// Whether the branch holds no connection now ([`Shadow::detach_idle`]).
    pub fn is_detached(&self) -> bool {
        lock(&self.inner.branch)
            .as_ref()
            .is_some_and(ShadowBranch::is_detached)
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
        self.inner.workspace()
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

    /// What the branch's commands wrote outside the project (empty once accepted or
    /// aborted, or when the layer cannot be read: that is logged).
    pub fn outside(&self) -> shade_fusefs::outside::OutsideChanges {
        match lock(&self.inner.branch).as_ref() {
            Some(b) => shade_fusefs::outside::OutsideChanges::read(
                self.inner.outside.as_deref().unwrap_or(&b.outside_dir()),
            )
            .unwrap_or_else(|e| {
                tracing::warn!("reading the writes outside the project: {e}");
                shade_fusefs::outside::OutsideChanges::default()
            }),
            None => shade_fusefs::outside::OutsideChanges::default(),
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
        let mut kept = None;
        let result = branch.accept_quiesced(flags, &mut kept);
        let leftover = Leftover {
            _branch: kept,
            _caches: caches,
        };
        result.map(|report| (report, leftover))
    }

    /// Drops the branch: kills every process still running in it, unmounts it and removes
    /// its store (and the cache branches). Nothing is left mounted or on disk.
    pub fn abort(self) {}

    /// The branch itself, for a caller that reviews and accepts it on its own (best of N
    /// hands the picked attempt to the per-file review): commands are killed first and no
    /// new one can start, so nothing writes in it any more. The [`Leftover`] holds the
    /// cache branches; dropping it unmounts them. None once accepted or aborted.
    pub fn into_branch(self) -> Option<(Branch, Leftover)> {
        let caches = self.inner.stop_commands();
        self.inner.close_children();
        let branch = match lock(&self.inner.branch).take()? {
            ShadowBranch::Local(b) => *b,
            ShadowBranch::Served(b) => {
                // Never made so (`create_served` is for shadows that are not handed out).
                tracing::warn!("a served branch cannot be handed out; it is dropped");
                drop(b);
                return None;
            }
        };
        Some((
            branch,
            Leftover {
                _branch: None,
                _caches: caches,
            },
        ))
    }
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
            path: self.inner.mount(),
            source: std::io::Error::other("the shadow branch is closed"),
        };
        if lock(&self.inner.runs).closed {
            return Err(closed());
        }
        // A child reads through this shadow's mount: it stays attached while the child
        // lives (`detach_idle` refuses).
        self.inner.attach()?;
        let branch = Branch::create(&self.inner.mount(), &options.branch)?;
        let child = Shadow::around(
            ShadowBranch::Local(Box::new(branch)),
            self.inner.project.clone(),
            options,
            None,
        )?;
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

impl Inner {
    /// [`Shadow::attach`].
    fn attach(&self) -> Result<(), ShadowError> {
        let mut branch = lock(&self.branch);
        let Some(b) = branch.as_mut() else {
            return Ok(());
        };
        if !b.is_detached() {
            return Ok(());
        }
        b.attach()?;
        let mount = b.mountpoint().to_path_buf();
        let workspace = Workspace::shadowed(&self.project, &mount).map_err(|source| {
            ShadowError::Workspace {
                path: mount.clone(),
                source,
            }
        })?;
        *lock(&self.at) = At { mount, workspace };
        Ok(())
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
