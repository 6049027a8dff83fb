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
    /// Directories renamed back (where the accept put them, where they were).
    pub renamed: Vec<(RelPath, RelPath)>,
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
    /// Its contents were never kept (more than the history could hold when it was made).
    #[error("accept {id} cannot be undone: {why}")]
    NotKept { id: String, why: String },
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
    if let Some(why) = &entry.not_kept {
        return Err(UndoError::NotKept {
            id: entry.id.clone(),
            why: format!("it was applied without keeping a way back: {why}"),
        });
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
        renamed: built.renamed,
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
    renamed: Vec<(RelPath, RelPath)>,
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

/// What is at a path once the undo's renames are done: its state and where it is now.
type Placed = Option<(State, PathBuf)>;

/// Compare the project with what the accept wrote and plan the way back: the accept's
/// directory renames are undone by renaming back (after checking each renamed tree holds
/// only what the accept left), then every path is put back as it was, from the store or,
/// for a content a rename only moved, from where it is in the project now.
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
        } else if !after.same_as(&s) || !same_unread(after, &s) {
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
    let renames: Vec<(PathBuf, PathBuf)> = entry
        .renames
        .iter()
        .map(|(f, t)| (f.path().to_path_buf(), t.path().to_path_buf()))
        .collect();
    let start: BTreeMap<PathBuf, Placed> = now
        .iter()
        .map(|(p, s)| (p.clone(), s.present().then(|| (s.clone(), p.clone()))))
        .collect();
    let is_dir = |v: &(State, PathBuf)| v.0.is_dir();
    // Every rename put back, whatever changed: where each earlier content is now, and which
    // directories go back (or make room for one), to check their trees.
    let mut full = start.clone();
    let mut moving: Vec<PathBuf> = Vec::new();
    history::rename_back(&mut full, &renames, is_dir, |f, t, m| {
        if let Some(Some((_, q))) = m.get(t) {
            moving.push(q.clone());
        }
        if let Some(Some((s, q))) = m.get(f) {
            if s.is_dir() {
                moving.push(q.clone());
            }
        }
        false
    });
    // A directory renamed back (or removed to make room for one) must hold nothing the
    // accept did not leave there.
    let mut reads = Vec::new();
    let mut read_trees: Vec<PathBuf> = Vec::new();
    let mut check_tree = |look: &mut history::Lookup,
                          q: &Path,
                          conflicts: &mut BTreeMap<PathBuf, String>,
                          reads: &mut Vec<ReadBase>|
     -> Result<(), UndoError> {
        if read_trees.iter().any(|r| q.starts_with(r)) {
            return Ok(());
        }
        read_trees.push(q.to_path_buf());
        // Names and kinds only: every content the accept left was compared above.
        let tree = look.list_tree(q).map_err(|e| io(q.display(), e))?;
        for (x, s) in tree {
            let known = changes.get(&x).is_some_and(|(_, a)| a.present());
            if !known {
                conflicts
                    .entry(x)
                    .or_insert_with(|| format!("{} created since the accept", s.kind()));
            }
        }
        if let Base::Present(fp) = look.observe(q).map_err(|e| io(q.display(), e))? {
            reads.push(ReadBase {
                path: q.to_path_buf(),
                seen: fp,
                listing: false,
                subtree_since: Some(since),
            });
        }
        Ok(())
    };
    moving.sort();
    for q in &moving {
        if !conflicts.contains_key(q) {
            check_tree(&mut look, q, &mut conflicts, &mut reads)?;
        }
    }
    // The renames done: those near a path changed since (in, around or in the way of the
    // renamed directory) stay undone, with `keep_mine`.
    let near = |q: &Path, conflicts: &BTreeMap<PathBuf, String>| {
        conflicts
            .keys()
            .any(|c| c.starts_with(q) || q.starts_with(c))
    };
    let mut placed: Vec<(Option<PathBuf>, PathBuf)> = Vec::new();
    let mut post = start.clone();
    let steps = history::rename_back(&mut post, &renames, is_dir, |f, t, m| {
        let Some(Some((_, src))) = m.get(t) else {
            return true;
        };
        let occ: Vec<&PathBuf> = m
            .range::<Path, _>((std::ops::Bound::Included(f), std::ops::Bound::Unbounded))
            .take_while(|(q, _)| q.starts_with(f))
            .filter_map(|(_, v)| v.as_ref().map(|(_, q)| q))
            .collect();
        if near(src, &conflicts) || near(f, &conflicts) || occ.iter().any(|q| near(q, &conflicts)) {
            return true;
        }
        let at_f = match m.get(f) {
            Some(Some((_, q))) => Some(q.clone()),
            _ => None,
        };
        placed.push((at_f, src.clone()));
        false
    });
    let base_of = |q: &Option<PathBuf>| {
        q.as_ref()
            .and_then(|q| bases.get(q).copied())
            .unwrap_or(Base::Absent)
    };
    let mut plan = Vec::new();
    let mut renamed: Vec<(PathBuf, PathBuf)> = Vec::new();
    let mut placed = placed.into_iter();
    let mut cur: Option<(Option<PathBuf>, PathBuf)> = None;
    for step in &steps {
        match step {
            history::BackStep::Delete(f) => {
                cur = placed.next();
                let occ = cur.as_ref().and_then(|c| c.0.clone());
                plan.push(PlanOp::Delete {
                    path: f.clone(),
                    base: base_of(&occ),
                    base_at: None,
                });
            }
            history::BackStep::Rename { from, to } => {
                let c = match cur.take() {
                    Some(c) => c,
                    None => placed.next().unwrap_or((None, from.clone())),
                };
                plan.push(PlanOp::RenameDir {
                    from: from.clone(),
                    to: to.clone(),
                    base_from: base_of(&Some(c.1)),
                    base_to: Base::Absent,
                });
                renamed.push((from.clone(), to.clone()));
            }
        }
    }
    let before_of = |p: &Path| changes.get(p).map(|c| c.0).unwrap_or(&State::Absent);
    let state_of = |p: &Path| match post.get(p) {
        Some(Some((s, _))) => s.clone(),
        _ => State::Absent,
    };
    let now_at = |p: &Path| match post.get(p) {
        Some(Some((_, q))) => Some(q.clone()),
        _ => None,
    };
    // Which paths the undo deletes (outermost only; their trees go with them).
    let deletes = |before: &State, now: &State| {
        now.present() && (!before.present() || before.is_dir() != now.is_dir())
    };
    // A directory the undo removes must hold nothing the accept did not leave there.
    // Only the outermost of nested ones is read: its tree holds theirs (`post` is in
    // path order, so what lies below a directory follows it), and reading each level of a
    // deep chain again would be quadratic in its depth.
    let mut read_below: Option<&PathBuf> = None;
    for p in post.keys() {
        let n = state_of(p);
        if conflicts.contains_key(p) || !n.is_dir() || !deletes(before_of(p), &n) {
            continue;
        }
        if read_below.is_some_and(|q| p.starts_with(q)) {
            continue;
        }
        read_below = Some(p);
        if let Some(q) = now_at(p) {
            check_tree(&mut look, &q, &mut conflicts, &mut reads)?;
        }
    }
    // Keep what a conflict needs: its own path, what lies below it, and every directory
    // above it that the undo would remove.
    let mut skip: BTreeMap<PathBuf, String> = BTreeMap::new();
    for (c, why) in &conflicts {
        skip.insert(c.clone(), why.clone());
        for p in post.keys() {
            if p != c && p.starts_with(c) {
                skip.entry(p.clone())
                    .or_insert_with(|| format!("inside {}, kept", c.display()));
            }
            if c != p && c.starts_with(p) && deletes(before_of(p), &state_of(p)) {
                skip.entry(p.clone()).or_insert_with(|| {
                    format!("holds {}, which changed since the accept", c.display())
                });
            }
        }
    }
    reads.retain(|r| !skip.contains_key(&r.path));

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
    for p in post.keys() {
        let (before, n) = (before_of(p), state_of(p));
        if skip.contains_key(p) || !deletes(before, &n) || under(&gone, p) {
            continue;
        }
        plan.push(PlanOp::Delete {
            path: p.clone(),
            base: base_of(&now_at(p)),
            base_at: None,
        });
        gone.insert(p.clone());
        if !before.present() {
            removed.push(p.clone());
        }
    }
    // Then, parents before children, everything that comes back.
    let mut late: Vec<Kept> = Vec::new();
    for p in post.keys() {
        let before = before_of(p);
        if skip.contains_key(p) || !before.present() {
            continue;
        }
        let n = state_of(p);
        let fresh = gone.contains(p) || under(&gone, p) || !n.present();
        let base = if fresh {
            Base::Absent
        } else {
            base_of(&now_at(p))
        };
        // Renamed back (it was elsewhere before the undo) and as it was: nothing to do.
        let moved_back = !fresh && now_at(p).as_deref() != Some(p.as_path());
        let op = match before {
            State::Dir { .. } if moved_back && *before == n => continue,
            State::File { .. } | State::Symlink { .. } | State::Special { .. }
                if moved_back && before.same_as(&n) =>
            {
                continue
            }
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
                let Some(content) = earlier_content(history_dir, &mut look, &full, p, before)?
                else {
                    late.push(Kept {
                        path: p.clone(),
                        reason: format!(
                            "its earlier content was not kept: it went with a renamed \
                             directory, which changed since the accept ({})",
                            &sha256[..sha256.len().min(12)]
                        ),
                    });
                    continue;
                };
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
        if !(moved_back && before.same_as(&n)) {
            // (Else only times or attributes differ, of a directory renamed back: not news.)
            restored.push(p.clone());
        }
        plan.push(op);
    }
    let mut kept: Vec<Kept> = skip
        .into_iter()
        .map(|(path, reason)| Kept { path, reason })
        .collect();
    kept.extend(late);
    Ok(Built {
        plan,
        reads,
        restored,
        removed,
        renamed: history::shown_renames(&renamed),
        kept,
    })
}

/// For a file of a renamed tree (recorded without its hash, known by size, times, ctime and
/// inode): whether `now` is still the one the accept left.
fn same_unread(after: &State, now: &State) -> bool {
    match (after, now) {
        (
            State::File {
                sha256,
                size,
                mtime,
                changed,
                ..
            },
            State::File {
                size: s2,
                mtime: m2,
                changed: c2,
                ..
            },
        ) if sha256.is_empty() => size == s2 && mtime == m2 && (changed.is_none() || changed == c2),
        _ => true,
    }
}

/// The content `before` had at `p`: from the history's store, else from where a rename put
/// it in the project (`full`: every path once all the renames are undone, with where it is
/// now), if it is still that content there. `None` if neither has it.
fn earlier_content(
    history_dir: &Path,
    look: &mut history::Lookup,
    full: &BTreeMap<PathBuf, Placed>,
    p: &Path,
    before: &State,
) -> Result<Option<std::fs::File>, UndoError> {
    let State::File { sha256, .. } = before else {
        return Ok(None);
    };
    let obj = history::object_path(history_dir, sha256);
    let stored = if sha256.is_empty() {
        // A file of a renamed tree, never read: never stored either.
        Err(std::io::Error::from(std::io::ErrorKind::NotFound))
    } else {
        std::fs::File::open(&obj)
    };
    match stored {
        Ok(f) => return Ok(Some(f)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(io(
                format!("the earlier content of {} ({})", p.display(), obj.display()),
                e,
            ))
        }
    }
    // The same content (its mode, owner and times come from `before`).
    let Some(Some((State::File { sha256: now, .. }, q))) = full.get(p) else {
        return Ok(None);
    };
    if now != sha256 {
        return Ok(None);
    }
    let mut f = look.open_file(q).map_err(|e| io(q.display(), e))?;
    if sha256.is_empty() {
        // A file of a renamed tree, never read: compared by size and times above.
        return Ok(Some(f));
    }
    // Checked again as it is read: it must be the content recorded.
    let (h, _) = if history::plain_hash(sha256) {
        history::plain_hash_file(&mut f)
    } else {
        history::hash_file(&mut f)
    }
    .map_err(|e| io(q.display(), e))?;
    if &h != sha256 {
        return Ok(None);
    }
    Ok(Some(f))
}
