//! The accept engine: flush a branch's plan into the real project directory, all or nothing.
//!
//! 1. **Validate** every path (relative, no `.`/`..`, not one of accept's own scratch names).
//! 2. **Pre-flight** (`check`): every op's base against lower now, looked up without ever
//!    following a symlink; any mismatch refuses the whole accept (unless `force`).
//! 3. **Journal** `Staging` in `StateDir::journals()`, then **stage** every new file and
//!    symlink, complete and fsynced, in `.shade-accept-<id>/` at the project root (`stage`).
//! 4. **Commit**: atomically rewrite the journal as `Committed` with the ordered ops. A crash
//!    before this rolls back (the tree was never touched); after it, rolls forward.
//! 5. **Apply** (`exec`): renames from staging, mkdirs, dir renames, deletes-by-rename to
//!    trash — each idempotent, each through dir fds that never follow symlinks.
//! 6. Mark `Applied`, remove trash and staging, remove the journal.
//!
//! [`recover`] finishes or undoes whatever a crash left in the journal dir.

mod check;
mod exec;
mod fault;
mod guard;
pub mod history;
mod journal;
mod recover;
mod safe_path;
mod signals;
mod stage;
mod sys;

pub use fault::{FAIL_AT_STEP_ENV, KILL_AT_STEP_ENV, RUN_AT_STEP_ENV};
pub use guard::{owned as check_owned, Protected};
pub use recover::{drop_journal, recover, RecoverReport};
pub use safe_path::invalid_reason as invalid_path_reason;
pub use signals::DeferSignals;
pub use sys::dirs_opened;

/// Whether process `pid` is alive (not gone, not a zombie): owners of branches and journals.
pub fn process_alive(pid: i32) -> bool {
    sys::process_alive(pid)
}

use crate::fingerprint::Base;
use crate::plan::{PlanOp, ReadBase, RelPath};
use crate::state::StateDir;
use check::Guard;
use journal::{JOp, JPath, Journal, Phase};
use std::fmt;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// How to accept.
#[derive(Clone, Debug)]
pub struct AcceptOptions {
    /// Apply even where lower changed since the branch saw it (the branch's version wins).
    pub force: bool,
    /// Where the journal goes (outside the project, so a crash can be recovered).
    pub state: StateDir,
    /// What the branch read before the changes it accepts (checked unless `force`).
    pub reads: Vec<ReadBase>,
    /// The ids shade's own files have in the project when not its euid/egid: a branch of
    /// a shifted branch accepts into a mount that shows root as the namespace's root.
    pub own: Option<(u32, u32)>,
}

/// A change that was not applied because its path changed after the accept's commit
/// point (the user edited it while the accept ran, or before a recovery finished it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotApplied {
    /// The project path (relative).
    pub path: RelPath,
    /// What was found there instead.
    pub reason: String,
    /// Where the branch's version of it is kept (absolute), if it had content.
    pub kept_at: Option<PathBuf>,
}

impl fmt::Display for NotApplied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.reason)?;
        if let Some(k) = &self.kept_at {
            write!(f, "; the branch's version is kept in {}", k.display())?;
        }
        Ok(())
    }
}

fn not_applied(root: &Path, id: &str, s: &[journal::SetAside]) -> Vec<NotApplied> {
    s.iter()
        .map(|s| NotApplied {
            path: s.path.path().to_path_buf(),
            reason: s.reason.clone(),
            kept_at: s
                .kept
                .then(|| root.join(journal::rescued_name(id)).join(s.n.to_string())),
        })
        .collect()
}

/// What an accept changed, for the CLI's summary.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AcceptReport {
    /// Files and symlinks created or replaced.
    pub written: usize,
    /// Directories the branch created (`Mkdir`).
    pub created_dirs: usize,
    /// Directories moved as a whole (`RenameDir`).
    pub renamed_dirs: usize,
    /// Files, symlinks or directory trees removed (`Delete`).
    pub deleted: usize,
    /// Changes left out because their path changed while the accept ran (after its
    /// conflict check); everything else was applied. Empty in the usual case.
    pub not_applied: Vec<NotApplied>,
    /// Files written without the set-user-ID/set-group-ID bits or the file capability
    /// (`security.capability`) the branch gave them (see [`drop_privileges`]).
    pub privileges_dropped: Vec<RelPath>,
}

impl AcceptReport {
    /// One line naming the files written without the privileges their branch gave them
    /// (names quoted like git), or `None` when there were none.
    pub fn privileges_note(&self) -> Option<String> {
        if self.privileges_dropped.is_empty() {
            return None;
        }
        let names: Vec<String> = self
            .privileges_dropped
            .iter()
            .map(|p| crate::quote::quote_path(p).into_owned())
            .collect();
        Some(format!(
            "written without the set-user-ID/set-group-ID bit or file capability the branch \
             gave them (a branch cannot grant privileges; set them yourself if you mean it): {}",
            names.join(", ")
        ))
    }
}

/// Clears what would let a file run with more privilege than whoever starts it: the
/// set-user-ID and set-group-ID bits of files and devices, and file capabilities. A
/// command in a branch is confined (a user namespace where root's powers count only
/// inside), but a setuid-root program or a `cap_setuid` capability it plants would count
/// for real once accept writes it: so accept never writes them, and says which paths it
/// left without. (A directory's set-group-ID bit, which only passes its group on, stays.)
pub fn drop_privileges(plan: &mut [PlanOp]) -> Vec<RelPath> {
    const CAPABILITY: &[u8] = b"security.capability";
    let mut dropped = Vec::new();
    for op in plan.iter_mut() {
        let (path, perms, is_dir) = match op {
            PlanOp::WriteFile { path, perms, .. } | PlanOp::Special { path, perms, .. } => {
                (path, perms, false)
            }
            PlanOp::Mkdir { path, perms, .. } | PlanOp::SetPerms { path, perms, .. } => {
                (path, perms, true)
            }
            _ => continue,
        };
        let mut changed = false;
        if !is_dir && perms.mode & (libc::S_ISUID | libc::S_ISGID) != 0 {
            perms.mode &= !(libc::S_ISUID | libc::S_ISGID);
            changed = true;
        }
        if let Some(x) = &mut perms.xattrs {
            let before = x.len();
            x.retain(|(name, _)| name.as_slice() != CAPABILITY);
            changed |= x.len() != before;
        }
        if changed {
            dropped.push(path.clone());
        }
    }
    dropped
}

/// One path where lower no longer is what the branch started from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    /// The plan path that conflicts.
    pub path: RelPath,
    /// What the branch based its change on.
    pub expected: Base,
    /// What lower has now (for a path behind a symlinked or replaced parent: that parent).
    pub found: Base,
    /// The branch did not change this path but read it (or listed it) before a change it
    /// accepts, which may derive from what it read.
    pub read: bool,
}

fn describe(b: &Base) -> &'static str {
    match b {
        Base::Absent => "absent",
        Base::Present(fp) => match fp.mode & libc::S_IFMT {
            libc::S_IFDIR => "a directory",
            libc::S_IFLNK => "a symlink",
            libc::S_IFREG => "a file",
            _ => "a special file",
        },
    }
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match (&self.expected, &self.found) {
            (Base::Absent, Base::Present(_)) => {
                format!("created meanwhile ({})", describe(&self.found))
            }
            (Base::Present(_), Base::Absent) => "deleted meanwhile".to_string(),
            (Base::Present(a), Base::Present(b))
                if a.mode & libc::S_IFMT != b.mode & libc::S_IFMT =>
            {
                format!(
                    "was {}, now {}",
                    describe(&self.expected),
                    describe(&self.found)
                )
            }
            _ if self.read && matches!(self.expected, Base::Present(fp) if fp.is_dir()) => {
                "entries added or removed meanwhile".to_string()
            }
            _ => "changed meanwhile".to_string(),
        };
        let why = if self.read {
            " (the branch read it before making its changes)"
        } else {
            ""
        };
        write!(f, "{}: {what} in the project{why}", self.path.display())
    }
}

/// Why an accept did not happen (or, for `Io` after the commit point, did not finish: the
/// journal stays and [`recover`] completes it).
#[derive(Debug, thiserror::Error)]
pub enum AcceptError {
    /// Lower changed under the branch; nothing was touched. Retry with `force` to overwrite.
    #[error("{} conflicting path(s), nothing accepted: {}", .0.len(), list(.0))]
    Conflicts(Vec<Conflict>),
    /// The plan names a path outside the project or would go through a symlink; nothing
    /// was touched.
    #[error("refusing to accept {}: {reason}", .path.display())]
    Unsafe { path: RelPath, reason: String },
    /// As root, the plan would give a path to an owner the project did not have there (not
    /// its current owner, its new parent's, a renamed file's own, nor shade's): a command in
    /// a branch may not hand the user's files to someone else. Nothing was touched.
    #[error(
        "refusing to accept: {} would belong to {uid}:{gid}, an owner it does not have in the project (accept keeps a path's owner, its directory's for a new path, or gives it to {}:{}); nothing was written",
        crate::quote::quote_path(path),
        .own.0,
        .own.1
    )]
    Owner {
        path: RelPath,
        uid: u32,
        gid: u32,
        /// shade's own (euid, egid).
        own: (u32, u32),
    },
    /// A system call failed before anything was written: the project is unchanged (the
    /// staging directory was removed again).
    #[error("accept failed at {}: {source}; the project is unchanged", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A system call failed after the commit point: `done` of `total` steps are in the
    /// project, the rest is journaled, and `shade recover` (or any later shade start) finishes
    /// it, leaving alone every path changed since.
    #[error(
        "accept not finished: {done} of {total} steps were applied when {} failed: {source};          the project is partly changed until `shade recover` finishes the accept (journal          {id}; paths changed since are not overwritten)",
        .path.display()
    )]
    Unfinished {
        id: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
        done: usize,
        total: usize,
    },
    /// A system call failed before the commit point and removing the staging directory
    /// failed too: the project's files are unchanged, but the scratch directory is left.
    #[error(
        "accept failed at {}: {source}; the project's files are unchanged, but {} is left          (`shade recover` removes it)",
        .path.display(),
        .staging.display()
    )]
    StagingLeft {
        path: PathBuf,
        #[source]
        source: std::io::Error,
        staging: PathBuf,
    },
}

impl AcceptError {
    /// Whether the project is exactly as before (refusals and failures before the commit
    /// point): callers may say "nothing written" and keep or retry the branch.
    pub fn nothing_written(&self) -> bool {
        !matches!(self, AcceptError::Unfinished { .. })
    }
}

fn list(c: &[Conflict]) -> String {
    c.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> AcceptError + '_ {
    move |source| AcceptError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Wall-clock time in ns since the epoch (file ctimes compare with it).
fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// A unique id for one accept: pid and wall-clock nanoseconds.
fn new_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{:x}-{:x}", std::process::id(), nanos)
}

/// Would [`apply`] refuse `plan` now? The same validation, state-directory guard (with the
/// `state` directory apply will be given, where the caller knows it) and conflict check,
/// writing nothing: a caller that keeps its branch on a refusal (an interactive session)
/// asks first.
pub fn check_plan(
    root: &Path,
    plan: &[PlanOp],
    reads: &[ReadBase],
    force: bool,
    own: Option<(u32, u32)>,
    state: Option<&Path>,
) -> Result<(), AcceptError> {
    check::validate(plan)?;
    let root = std::fs::canonicalize(root).map_err(io_err(root))?;
    if let Some(state) = state {
        Protected::new(&root, state).check_plan(plan)?;
    }
    let root_fd = sys::open_dir_path(&root).map_err(io_err(&root))?;
    check::preflight(root_fd.as_raw_fd(), plan, reads, force, own).map(|_| ())
}

/// Apply `plan` (in the given order) to the project at `root`, all or nothing.
///
/// Refusals (`Unsafe`, `Conflicts`) and failures before the commit point leave the project
/// untouched. A failure after it leaves the journal for [`recover`] to finish.
pub fn apply(
    root: &Path,
    mut plan: Vec<PlanOp>,
    opts: &AcceptOptions,
) -> Result<AcceptReport, AcceptError> {
    check::validate(&plan)?;
    let privileges_dropped = drop_privileges(&mut plan);
    // From here until the accept is complete (or rolled back), a termination signal waits.
    let _signals = DeferSignals::new();
    let root = std::fs::canonicalize(root).map_err(io_err(root))?;
    let root_fd = sys::open_dir_path(&root).map_err(io_err(&root))?;
    sys::lock_exclusive(&root_fd).map_err(io_err(&root))?;
    // Under the project's lock: no op may move, replace or write shade's own state dir.
    Protected::new(&root, opts.state.root()).check_plan(&plan)?;
    let guards = check::preflight(
        root_fd.as_raw_fd(),
        &plan,
        &opts.reads,
        opts.force,
        opts.own,
    )?;

    let mut report = AcceptReport {
        privileges_dropped,
        ..AcceptReport::default()
    };
    let id = new_id();
    let dir = opts.state.journals();
    let mut j = Journal {
        version: journal::VERSION,
        id: id.clone(),
        root: JPath::new(&root),
        staging: journal::staging_name(&id),
        phase: Phase::Staging,
        ops: Vec::with_capacity(plan.len()),
        set_aside: Vec::new(),
        written_ns: None,
    };
    fault::step()
        .and_then(|()| j.store(&dir))
        .map_err(io_err(&dir))?;

    // Until the commit point a signal (Ctrl-C) cancels the accept: nothing is written.
    let staging_now = signals::Staging::begin();
    // Record what the plan replaces (before the commit point; a roll-back discards it).
    if history_kept(&opts.state, &root) {
        let recorded = history::record(
            &opts.state.history(),
            root_fd.as_raw_fd(),
            &root,
            &id,
            &mut plan,
            opts.force,
        );
        if let Err(e) = recorded {
            let e = AcceptError::Io {
                path: opts.state.history(),
                source: e,
            };
            return Err(roll_back_after(&root_fd, &root, &j, &dir, e));
        }
    }

    // Stage; any failure here rolls back to an untouched project, and so does a signal.
    // First: room for the files' data (holes stay holes).
    let needed: u64 = plan
        .iter()
        .map(|op| match op {
            PlanOp::WriteFile { content, .. } => stage::data_bytes(content)
                .or_else(|_| content.metadata().map(|m| m.len()))
                .unwrap_or(0),
            _ => 0,
        })
        .sum();
    if let Err(e) = stage::check_space(&root_fd, needed).and_then(|()| stage::check_cancel()) {
        let e = AcceptError::Io {
            path: root.clone(),
            source: e,
        };
        return Err(roll_back_after(&root_fd, &root, &j, &dir, e));
    }
    let files = plan
        .iter()
        .filter(|op| matches!(op, PlanOp::WriteFile { .. }))
        .count();
    let sync_each = files <= stage::SYNC_EACH_MAX;
    let staged = (|| -> Result<Vec<JOp>, AcceptError> {
        let staging =
            stage::create_dir(&root_fd, &j.staging).map_err(io_err(&root.join(&j.staging)))?;
        let mut ops = Vec::with_capacity(plan.len());
        for (n, (op, (guard, pre))) in plan.iter_mut().zip(&guards).enumerate() {
            stage::check_cancel().map_err(io_err(&root))?;
            let created = matches!(op, PlanOp::Mkdir { .. });
            let pre = Some(*pre);
            let jop = match op {
                PlanOp::WriteFile {
                    path,
                    content,
                    perms,
                    ..
                } => {
                    stage::file(&staging, n, content, perms, sync_each).map_err(io_err(path))?;
                    report.written += 1;
                    JOp::Place {
                        n,
                        path: JPath::new(path),
                        symlink: false,
                        pre,
                    }
                }
                PlanOp::Special {
                    path,
                    mode,
                    rdev,
                    perms,
                    ..
                } => {
                    stage::special(&staging, n, *mode, *rdev, perms).map_err(io_err(path))?;
                    report.written += 1;
                    JOp::Place {
                        n,
                        path: JPath::new(path),
                        symlink: false,
                        pre,
                    }
                }
                PlanOp::Link { path, target, .. } => {
                    report.written += 1;
                    JOp::Link {
                        n,
                        path: JPath::new(path),
                        target: JPath::new(target),
                        pre,
                    }
                }
                PlanOp::Symlink { path, target, .. } => {
                    stage::symlink(&staging, n, target).map_err(io_err(path))?;
                    report.written += 1;
                    JOp::Place {
                        n,
                        path: JPath::new(path),
                        symlink: true,
                        pre,
                    }
                }
                PlanOp::Mkdir { path, perms, .. } | PlanOp::SetPerms { path, perms, .. } => {
                    report.created_dirs += usize::from(created);
                    if created {
                        stage::dir(&staging, n).map_err(io_err(path))?;
                    }
                    JOp::Dir {
                        n,
                        path: JPath::new(path),
                        mode: perms.mode,
                        uid: perms.uid,
                        gid: perms.gid,
                        created,
                        times: perms.times,
                        xattrs: perms.xattrs.clone(),
                        pre,
                        staged: created,
                    }
                }
                PlanOp::RenameDir { from, to, .. } => {
                    let Guard::Rename {
                        from: base_from,
                        to: base_to,
                    } = *guard
                    else {
                        return Err(AcceptError::Unsafe {
                            path: to.clone(),
                            reason: "internal: no rename guard".into(),
                        });
                    };
                    report.renamed_dirs += 1;
                    JOp::RenameDir {
                        n,
                        from: JPath::new(from),
                        to: JPath::new(to),
                        base_from,
                        base_to,
                    }
                }
                PlanOp::Delete { path, .. } => {
                    let Guard::Delete(base) = *guard else {
                        return Err(AcceptError::Unsafe {
                            path: path.clone(),
                            reason: "internal: no delete guard".into(),
                        });
                    };
                    report.deleted += 1;
                    JOp::Delete {
                        n,
                        path: JPath::new(path),
                        base,
                    }
                }
            };
            ops.push(jop);
        }
        if !sync_each {
            sys::syncfs(&staging).map_err(io_err(&root.join(&j.staging)))?;
        }
        sys::fsync(&staging).map_err(io_err(&root.join(&j.staging)))?;
        Ok(ops)
    })();
    let ops = match staged {
        Ok(ops) => ops,
        Err(e) => return Err(roll_back_after(&root_fd, &root, &j, &dir, e)),
    };
    // Past here a signal waits for the accept to finish.
    drop(staging_now);

    // The commit point.
    j.ops = ops;
    j.phase = Phase::Committed;
    // What changes after this moment is the user's (roll-forward leaves it alone).
    j.written_ns = Some(now_ns());
    if let Err(e) = fault::step().and_then(|()| j.store(&dir)) {
        j.phase = Phase::Staging;
        return Err(roll_back_after(
            &root_fd,
            &root,
            &j,
            &dir,
            AcceptError::Io {
                path: dir.clone(),
                source: e,
            },
        ));
    }
    let total = j.ops.len();
    match exec::roll_forward_locked(root_fd, &mut j, &dir) {
        Ok(set_aside) => {
            report.not_applied = not_applied(&root, &id, &set_aside);
            if let Err(e) = history::evict(&opts.state.history(), &dir, history::retention()) {
                tracing::warn!(error = %e, "accept history: retention not applied");
            }
            Ok(report)
        }
        Err(s) => Err(AcceptError::Unfinished {
            id,
            path: s.path,
            source: s.source,
            done: s.done,
            total,
        }),
    }
}

/// Whether accepts into `root` are kept in the history: not those into a branch's own mount
/// (a speculation into a session's branch; the session's accept is recorded instead).
fn history_kept(state: &StateDir, root: &Path) -> bool {
    let branches = state.branches();
    let canonical = std::fs::canonicalize(&branches).unwrap_or_else(|_| branches.clone());
    !root.starts_with(&branches) && !root.starts_with(&canonical)
}

/// Undo an accept that failed before its commit point with `e`; says so truthfully when the
/// staging directory could not be removed.
fn roll_back_after(
    root_fd: &std::os::fd::OwnedFd,
    root: &Path,
    j: &Journal,
    dir: &Path,
    e: AcceptError,
) -> AcceptError {
    let Err(rb) = exec::roll_back_locked(root_fd, j, dir) else {
        return e;
    };
    tracing::warn!(error = %rb, "rolling back a failed accept");
    let (path, source) = match e {
        AcceptError::Io { path, source } => (path, source),
        other => return other,
    };
    AcceptError::StagingLeft {
        path,
        source,
        staging: root.join(&j.staging),
    }
}

#[cfg(test)]
mod tests;
