//! Undo of an accept: put every path the accept changed back as it was before it.
//!
//! An undo is itself an accept, of a plan built from the history entry: its target is the
//! recorded before-states, its base what the project holds now, which must be what the accept
//! wrote. So it goes through the same journaled engine (all or nothing, crash-safe, finished
//! by `shade recover`), is conflict-checked by it once more under the project's lock, and is
//! recorded in the history like any accept (it can be undone in turn).
//!
//! A path changed since the accept (by the user or a later accept) is a conflict: the undo is
//! refused with the list, or with `keep_mine` leaves those paths (and what they need: a
//! directory holding a path kept stays) as they are and undoes the rest.

use crate::accept::history::{self, Entry, State};
use crate::accept::{self, AcceptError, AcceptOptions};
use crate::fingerprint::Base;
use crate::plan::{Perms, PlanOp, ReadBase, RelPath};
use crate::state::StateDir;
use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// How to undo.
#[derive(Clone, Debug, Default)]
pub struct UndoOptions {
    /// Leave paths changed since the accept as they are and undo the rest.
    pub keep_mine: bool,
    /// Only say what would happen.
    pub dry_run: bool,
    /// Where the undo comes from, for its own history entry.
    pub origin: String,
}

/// A path an undo leaves as it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kept {
    /// The project path (relative).
    pub path: RelPath,
    /// Why.
    pub reason: String,
}

/// What an undo did (or, dry, would do).
#[derive(Clone, Debug, Default)]
pub struct UndoReport {
    /// The accept undone.
    pub id: String,
    /// Paths put back to their earlier content, link or mode (or re-created).
    pub restored: Vec<RelPath>,
    /// Paths the accept created, removed again.
    pub removed: Vec<RelPath>,
    /// Paths left as they are (changed since; only with `keep_mine`).
    pub kept: Vec<Kept>,
    /// The history id of the undo itself (none for a dry run or when nothing was to do).
    pub undo_id: Option<String>,
}

/// Why an undo did not happen.
#[derive(Debug, thiserror::Error)]
pub enum UndoError {
    /// No such accept in the history of this project.
    #[error("{0}")]
    NotFound(String),
    /// Its contents were dropped by the history's retention.
    #[error("accept {0} can no longer be undone: its earlier contents were dropped by the history's retention limit")]
    Evicted(String),
    /// Its journal was given up by `shade recover --drop`: the history does not know what
    /// the project holds of it.
    #[error("accept {id} cannot be undone: it {}", .how.describe())]
    Dropped { id: String, how: history::Dropped },
    /// It was undone already.
    #[error("accept {id} is already undone (by {by}; `shade undo {by}` puts it back)")]
    AlreadyUndone { id: String, by: String },
    /// Paths changed since the accept; nothing was changed.
    #[error("{} path(s) changed since accept {id}, nothing undone: {}", .kept.len(), list(.kept))]
    Conflicts { id: String, kept: Vec<Kept> },
    /// The accept engine refused or failed.
    #[error(transparent)]
    Accept(#[from] AcceptError),
    /// Reading the history or the project failed.
    #[error("{0}")]
    Io(String),
}

impl UndoError {
    /// Whether the project is unchanged.
    pub fn nothing_written(&self) -> bool {
        match self {
            UndoError::Accept(e) => e.nothing_written(),
            _ => true,
        }
    }
}

fn list(k: &[Kept]) -> String {
    k.iter()
        .map(|k| format!("{}: {}", crate::quote::quote_path(&k.path), k.reason))
        .collect::<Vec<_>>()
        .join("; ")
}

fn io(what: impl std::fmt::Display, e: std::io::Error) -> UndoError {
    UndoError::Io(format!("{what}: {e}"))
}

/// The history of the project at `root` (canonical), oldest first.
pub fn project_history(state: &StateDir, root: &Path) -> Result<Vec<Entry>, UndoError> {
    let all = history::entries(&state.history()).map_err(|e| io(state.history().display(), e))?;
    Ok(all.into_iter().filter(|e| e.root.path() == root).collect())
}

/// The accept `shade undo` without an id undoes: the newest that is not undone and is not
/// itself an undo.
pub fn default_target(all: &[Entry]) -> Option<&Entry> {
    all.iter().rev().find(|e| {
        e.undoes.is_none() && e.dropped.is_none() && history::undone_by(all, &e.id).is_none()
    })
}

/// Undo accept `id` (default: [`default_target`]) of the project at `root`.
pub fn undo(
    state: &StateDir,
    root: &Path,
    id: Option<&str>,
    opts: &UndoOptions,
) -> Result<UndoReport, UndoError> {
    let root = std::fs::canonicalize(root).map_err(|e| io(root.display(), e))?;
    let all = project_history(state, &root)?;
    let entry = match id {
        Some(id) => all
            .iter()
            .find(|e| e.id == id || (id.len() >= 4 && e.id.starts_with(id)))
            .ok_or_else(|| {
                UndoError::NotFound(format!(
                    "no accept {id} in the history of {}",
                    crate::quote::quote_path(&root)
                ))
            })?,
        None => default_target(&all).ok_or_else(|| {
            UndoError::NotFound(format!(
                "nothing to undo in {}: no accept in its history that is not undone",
                crate::quote::quote_path(&root)
            ))
        })?,
    };
    if let Some(how) = entry.dropped {
        return Err(UndoError::Dropped {
            id: entry.id.clone(),
            how,
        });
    }
    if entry.evicted {
        return Err(UndoError::Evicted(entry.id.clone()));
    }
    let mut entry = entry.clone();
    history::load_changes(&state.history(), &mut entry)
        .map_err(|e| io(format!("the history of accept {}", entry.id), e))?;
    let entry = &entry;
    check_entry(entry, &root)?;
    if let Some(by) = history::undone_by(&all, &entry.id) {
        return Err(UndoError::AlreadyUndone {
            id: entry.id.clone(),
            by: by.id.clone(),
        });
    }
    let root_fd = history::open_root(&root).map_err(|e| io(root.display(), e))?;
    let built = build(&state.history(), root_fd.as_raw_fd(), entry)?;
    drop(root_fd);
    let mut report = UndoReport {
        id: entry.id.clone(),
        restored: built.restored,
        removed: built.removed,
        kept: built.kept,
        undo_id: None,
    };
    if !report.kept.is_empty() && !opts.keep_mine {
        return Err(UndoError::Conflicts {
            id: entry.id.clone(),
            kept: report.kept,
        });
    }
    if opts.dry_run || built.plan.is_empty() {
        return Ok(report);
    }
    let before: BTreeSet<String> = all.iter().map(|e| e.id.clone()).collect();
    let origin = if opts.origin.is_empty() {
        format!("undo of {}", entry.id)
    } else {
        opts.origin.clone()
    };
    history::with_note(origin, Some(entry.id.clone()), || {
        accept::apply(
            &root,
            built.plan,
            &AcceptOptions {
                force: false,
                state: state.clone(),
                reads: built.reads,
                own: None,
            },
        )
    })?;
    report.undo_id = project_history(state, &root)?
        .into_iter()
        .rev()
        .find(|e| !before.contains(&e.id) && e.undoes.as_deref() == Some(&entry.id))
        .map(|e| e.id);
    Ok(report)
}

/// Refuse an entry shade could not have recorded for `root`: every path relative, without
/// `.`/`..`, beneath the project (a forged entry is never replayed).
fn check_entry(entry: &Entry, root: &Path) -> Result<(), UndoError> {
    if entry.root.path() != root {
        return Err(UndoError::Io(format!(
            "history entry {} is for {}, not {}; refusing to undo it",
            entry.id,
            crate::quote::quote_path(entry.root.path()),
            crate::quote::quote_path(root)
        )));
    }
    for c in &entry.changes {
        if let Some(r) = crate::accept::invalid_path_reason(c.path.path()) {
            return Err(UndoError::Io(format!(
                "history entry {} names path {}: {r}; refusing to undo it",
                entry.id,
                crate::quote::quote_path(c.path.path())
            )));
        }
    }
    Ok(())
}

struct Built {
    plan: Vec<PlanOp>,
    reads: Vec<ReadBase>,
    restored: Vec<RelPath>,
    removed: Vec<RelPath>,
    kept: Vec<Kept>,
}

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

fn perms(s: &State) -> Perms {
    let root = crate::accept::history::is_root();
    let (mode, uid, gid, mtime, xattrs) = match s {
        State::File {
            mode,
            uid,
            gid,
            mtime,
            xattrs,
            ..
        }
        | State::Dir {
            mode,
            uid,
            gid,
            mtime,
            xattrs,
        } => (*mode, *uid, *gid, *mtime, xattrs.clone()),
        State::Special { mode, uid, gid, .. } => (*mode & 0o7777, *uid, *gid, None, Vec::new()),
        _ => (0o644, 0, 0, None, Vec::new()),
    };
    Perms {
        mode,
        uid: root.then_some(uid),
        gid: root.then_some(gid),
        times: mtime.map(|t| (t, t)),
        xattrs: (!xattrs.is_empty()).then_some(xattrs),
        origin: None,
    }
}

/// Compare the project with what the accept wrote and plan the way back.
fn build(history_dir: &Path, root: i32, entry: &Entry) -> Result<Built, UndoError> {
    let since = now_ns();
    let changes: BTreeMap<PathBuf, (&State, &State)> = entry
        .changes
        .iter()
        .map(|c| (c.path.path().to_path_buf(), (&c.before, &c.after)))
        .collect();
    let mut now: BTreeMap<PathBuf, State> = BTreeMap::new();
    // What each path is now, observed before its content is read: the plan's base, which
    // the engine checks again under the project's lock (any write since changes it).
    let mut bases: BTreeMap<PathBuf, Base> = BTreeMap::new();
    let mut conflicts: BTreeMap<PathBuf, String> = BTreeMap::new();
    // One walker for every lookup: the paths of a deep chain cost one walk, not one each.
    let mut look = history::Lookup::new(root);
    for (p, (_, after)) in &changes {
        let base = look.observe(p).map_err(|e| io(p.display(), e))?;
        let s = look
            .read_state_as(p, after)
            .map_err(|e| io(p.display(), e))?;
        let again = look.observe(p).map_err(|e| io(p.display(), e))?;
        bases.insert(p.clone(), base);
        if base != again {
            conflicts.insert(p.clone(), "being changed right now".into());
        } else if !after.same_as(&s) {
            let why = if after.kind() == s.kind() {
                format!("{} changed since the accept", s.kind())
            } else {
                format!(
                    "the accept left {} there, now it is {}",
                    after.kind(),
                    s.kind()
                )
            };
            conflicts.insert(p.clone(), why);
        }
        now.insert(p.clone(), s);
    }
    // Which paths the undo deletes (outermost only; their trees go with them).
    let deletes = |before: &State, now: &State| {
        now.present() && (!before.present() || before.is_dir() != now.is_dir())
    };
    // A directory the undo removes must hold nothing the accept did not leave there.
    // Only the outermost of nested ones is read: its tree holds theirs (`changes` is in
    // path order, so what lies below a directory follows it), and reading each level of a
    // deep chain again would be quadratic in its depth.
    let mut reads = Vec::new();
    let mut read_below: Option<&PathBuf> = None;
    for (p, (before, _)) in &changes {
        let n = &now[p];
        if conflicts.contains_key(p) || !n.is_dir() || !deletes(before, n) {
            continue;
        }
        if read_below.is_some_and(|q| p.starts_with(q)) {
            continue;
        }
        read_below = Some(p);
        let tree = look.read_tree(p, None).map_err(|e| io(p.display(), e))?;
        for (q, s) in tree {
            let known = changes.get(&q).is_some_and(|(_, a)| a.present());
            if !known {
                conflicts
                    .entry(q)
                    .or_insert_with(|| format!("{} created since the accept", s.kind()));
            }
        }
        if let Base::Present(fp) = look.observe(p).map_err(|e| io(p.display(), e))? {
            reads.push(ReadBase {
                path: p.clone(),
                seen: fp,
                listing: false,
                subtree_since: Some(since),
            });
        }
    }
    // Keep what a conflict needs: its own path, what lies below it, and every directory
    // above it that the undo would remove.
    let mut skip: BTreeMap<PathBuf, String> = BTreeMap::new();
    for (c, why) in &conflicts {
        skip.insert(c.clone(), why.clone());
        for (p, (before, _)) in &changes {
            if p != c && p.starts_with(c) {
                skip.entry(p.clone())
                    .or_insert_with(|| format!("inside {}, kept", c.display()));
            }
            if c != p && c.starts_with(p) {
                if let Some(n) = now.get(p) {
                    if deletes(before, n) {
                        skip.entry(p.clone()).or_insert_with(|| {
                            format!("holds {}, which changed since the accept", c.display())
                        });
                    }
                }
            }
        }
    }
    reads.retain(|r| !skip.contains_key(&r.path));

    let mut plan = Vec::new();
    let mut restored = Vec::new();
    let mut removed = Vec::new();
    let mut gone: BTreeSet<PathBuf> = BTreeSet::new(); // deleted or made new by the plan
    let under = |set: &BTreeSet<PathBuf>, p: &Path| {
        p.ancestors()
            .skip(1)
            .filter(|a| !a.as_os_str().is_empty())
            .any(|a| set.contains(a))
    };
    // Deletes first (a directory replaced by a file and back needs its place free).
    for (p, (before, _)) in &changes {
        let n = &now[p];
        if skip.contains_key(p) || !deletes(before, n) || under(&gone, p) {
            continue;
        }
        let base = bases.get(p).copied().unwrap_or(Base::Absent);
        plan.push(PlanOp::Delete {
            path: p.clone(),
            base,
            base_at: None,
        });
        gone.insert(p.clone());
        if !before.present() {
            removed.push(p.clone());
        }
    }
    // Then, parents before children, everything that comes back.
    for (p, (before, _)) in &changes {
        if skip.contains_key(p) || !before.present() {
            continue;
        }
        let n = &now[p];
        let fresh = gone.contains(p) || under(&gone, p) || !n.present();
        let base = if fresh {
            Base::Absent
        } else {
            bases.get(p).copied().unwrap_or(Base::Absent)
        };
        let op = match before {
            State::Dir { .. } if !fresh => PlanOp::SetPerms {
                path: p.clone(),
                perms: perms(before),
                base,
                base_at: None,
            },
            State::Dir { .. } => {
                gone.insert(p.clone());
                PlanOp::Mkdir {
                    path: p.clone(),
                    perms: perms(before),
                    base,
                    base_at: None,
                }
            }
            State::File { sha256, .. } => {
                let obj = history::object_path(history_dir, sha256);
                let content = std::fs::File::open(&obj).map_err(|e| {
                    io(
                        format!("the earlier content of {} ({})", p.display(), obj.display()),
                        e,
                    )
                })?;
                PlanOp::WriteFile {
                    path: p.clone(),
                    content,
                    perms: perms(before),
                    base,
                    base_at: None,
                }
            }
            State::Symlink { target, .. } => PlanOp::Symlink {
                path: p.clone(),
                target: target.path().to_path_buf(),
                base,
                base_at: None,
            },
            State::Special { mode, rdev, .. } => PlanOp::Special {
                path: p.clone(),
                mode: *mode,
                rdev: *rdev,
                perms: perms(before),
                base,
                base_at: None,
            },
            State::Absent => continue,
        };
        plan.push(op);
        restored.push(p.clone());
    }
    let kept = skip
        .into_iter()
        .map(|(path, reason)| Kept { path, reason })
        .collect();
    Ok(Built {
        plan,
        reads,
        restored,
        removed,
        kept,
    })
}
