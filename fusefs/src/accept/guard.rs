//! Shade's own state directory is off limits to every plan, and what shade reads back from
//! it (journals, history) is checked before it is acted on.
//!
//! The state directory may lie inside the project (the home as the project with the default
//! `~/.local/state/shade`, or `SHADE_STATE_DIR` below it). A branch hides it by path, but a
//! command can move one of its ancestors away and put a tree of its own in its place: an
//! accept would then hand shade forged journals and history (which recovery and `shade undo`
//! replay). So no op of any plan (accept, live, undo, recovery) may have its path at, inside
//! or above the state directory — only a mode change of an ancestor is let through — and a
//! journal or history file must be shade's own (our euid, not writable by others), with
//! paths that stay beneath their project.

use super::safe_path::invalid_reason;
use super::AcceptError;
use crate::plan::PlanOp;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

/// The places no plan may touch, relative to a project root: shade's state directory as
/// given and as resolved (a symlinked ancestor inside the project protects both its own name
/// and its target), every other state dir and state-dir registry inside the project
/// ([`crate::state::state_places`]), and what the branch hid besides ([`Protected::with`]).
/// A directory of the project holding a state-dir marker is protected too, found per op.
#[derive(Clone, Debug, Default)]
pub struct Protected {
    rels: Vec<PathBuf>,
    /// The project (canonical), whose directories are checked for a marker.
    root: Option<PathBuf>,
}

/// `p` made absolute and without `.` components (lexically; `..` kept for the caller).
fn absolute(p: &Path) -> PathBuf {
    let abs = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(p))
            .unwrap_or_else(|_| p.to_path_buf())
    };
    abs.components()
        .filter(|c| !matches!(c, Component::CurDir))
        .collect()
}

/// `p` with its longest existing prefix resolved (the rest appended as is).
fn resolved(p: &Path) -> Option<PathBuf> {
    let mut rest = Vec::new();
    let mut cur = p.to_path_buf();
    loop {
        if let Ok(c) = std::fs::canonicalize(&cur) {
            let mut out = c;
            for r in rest.iter().rev() {
                out.push(r);
            }
            return Some(out);
        }
        let name = cur.file_name()?.to_os_string();
        rest.push(name);
        if !cur.pop() {
            return None;
        }
    }
}

impl Protected {
    /// Where `state` (shade's state root) lies beneath the project `root` (given and
    /// canonical forms are both tried); empty when it is outside the project.
    pub fn new(root: &Path, state: &Path) -> Protected {
        let roots = {
            let r = absolute(root);
            let mut v = vec![r.clone()];
            if let Some(c) = resolved(&r) {
                v.push(c);
            }
            v
        };
        let abs = absolute(state);
        let mut states = vec![abs.clone()];
        if let Some(c) = resolved(&abs) {
            states.push(c);
        }
        let real_root = roots.last().cloned();
        if let Some(r) = &real_root {
            states.extend(crate::state::state_places(r));
        }
        let mut rels: Vec<PathBuf> = Vec::new();
        for s in &states {
            if s.components().any(|c| matches!(c, Component::ParentDir)) {
                continue;
            }
            for r in &roots {
                if let Ok(rel) = s.strip_prefix(r) {
                    let rel = rel.to_path_buf();
                    if !rels.contains(&rel) {
                        rels.push(rel);
                    }
                }
            }
        }
        Protected {
            rels,
            root: real_root,
        }
    }

    /// These places (relative to the project root) protected as well: what a branch hides
    /// (for a mode that hides them, the home's credentials inside the project).
    pub fn with(mut self, rels: &[PathBuf]) -> Protected {
        for r in rels {
            if !r.as_os_str().is_empty() && r.is_relative() && !self.rels.contains(r) {
                self.rels.push(r.clone());
            }
        }
        self
    }

    /// The state directory's place this `p` (relative) is at, inside or above, if any.
    fn hit(&self, p: &Path) -> Option<&PathBuf> {
        self.rels
            .iter()
            .find(|r| r.starts_with(p) || p.starts_with(r))
    }

    /// The state directory's place `p` is at or inside, if any.
    fn inside(&self, p: &Path) -> Option<&PathBuf> {
        self.rels.iter().find(|r| p.starts_with(r))
    }

    /// Why `path` may not be touched by a plan (`dir_mode_only`: the op only sets a
    /// directory's mode and owner), if it may not.
    pub fn reason(&self, path: &Path, dir_mode_only: bool) -> Option<String> {
        let r = if dir_mode_only {
            self.inside(path)
        } else {
            self.hit(path)
        }?;
        Some(format!(
            "it is shade's state directory, another state dir or their registry, or a path the \
             branch hides ({}), inside it or one of its parent directories; a command in a \
             branch may not move, replace or write it; nothing was written",
            r.display()
        ))
    }

    /// Refuse `plan` if any op touches the state directory (see the module doc).
    pub fn check_plan(&self, plan: &[PlanOp]) -> Result<(), AcceptError> {
        let mut seen = std::collections::HashMap::new();
        for op in plan {
            if let Some(root) = &self.root {
                for p in op_paths(op) {
                    if let Some(m) = crate::state::marked_above(root, p, &mut seen) {
                        return Err(AcceptError::Unsafe {
                            path: p.to_path_buf(),
                            reason: format!(
                                "{} holds a shade state-dir marker: it is a state directory \
                                 of shade's, which a command may not write; nothing was written",
                                m.display()
                            ),
                        });
                    }
                }
            }
            if self.rels.is_empty() {
                continue;
            }
            let paths: Vec<(&Path, bool)> = match op {
                PlanOp::RenameDir { from, to, .. } => vec![(from, false), (to, false)],
                PlanOp::Link { path, target, .. } => vec![(path, false), (target, false)],
                PlanOp::SetPerms { path, .. } => vec![(path, true)],
                other => vec![(other.path(), false)],
            };
            for (p, mode_only) in paths {
                if let Some(reason) = self.reason(p, mode_only) {
                    return Err(AcceptError::Unsafe {
                        path: p.to_path_buf(),
                        reason,
                    });
                }
            }
        }
        Ok(())
    }
}

/// The paths an op writes (all of them, for the marker check).
fn op_paths(op: &PlanOp) -> Vec<&Path> {
    match op {
        PlanOp::RenameDir { from, to, .. } => vec![from, to],
        PlanOp::Link { path, target, .. } => vec![path, target],
        other => vec![other.path()],
    }
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// Refuse a file or directory shade reads its own records from unless it is shade's: owned
/// by our euid, not writable by others nor by a group other than our own (a umask of 002
/// makes shade's own dirs group-writable for the user's private group), and not a symlink.
pub fn owned(path: &Path) -> io::Result<()> {
    let m = std::fs::symlink_metadata(path)?;
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if m.file_type().is_symlink() {
        return Err(invalid(format!(
            "{} is a symlink, not shade's own record; refusing to use it (left as it is)",
            path.display()
        )));
    }
    // SAFETY: getegid cannot fail.
    let my_group = unsafe { libc::getegid() };
    let group_writable = m.mode() & 0o020 != 0 && m.gid() != my_group;
    if m.uid() != me || m.mode() & 0o002 != 0 || group_writable {
        return Err(invalid(format!(
            "{} is owned by uid {} with mode {:o}, not shade's own (uid {me}, not writable by \
             others); refusing to use it (left as it is)",
            path.display(),
            m.uid(),
            m.mode() & 0o7777
        )));
    }
    Ok(())
}

/// Whether `id` can be an accept's id: one plain name (accept makes `<hex pid>-<hex ns>`,
/// [`super::new_id`]), never a path or a name with dots.
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !id.starts_with('-')
}

/// Refuse a journal read back from disk unless it is one accept could have written for the
/// file it came from (`file_id`): its id is that of its file, its root an absolute project
/// directory (not `/`, no `.`/`..`), its staging directory exactly `.shade-accept-<id>`, and
/// every op path relative and beneath the root, none touching the state directory `state`.
pub fn check_journal(j: &super::journal::Journal, file_id: &str, state: &Path) -> io::Result<()> {
    use super::journal::JOp;
    let bad = |what: String| invalid(format!("accept journal {file_id}: {what}; left as it is"));
    if j.id != file_id || !valid_id(&j.id) {
        return Err(bad(format!("its id {:?} does not name its file", j.id)));
    }
    let root = j.root.path();
    let normal = root.is_absolute()
        && root
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    if !normal || root.parent().is_none() {
        return Err(bad(format!(
            "its project root {} is not an absolute project directory",
            root.display()
        )));
    }
    if let Ok(c) = std::fs::canonicalize(root) {
        if c != root {
            return Err(bad(format!(
                "its project root {} goes through a symlink (to {})",
                root.display(),
                c.display()
            )));
        }
    }
    if j.staging != super::journal::staging_name(&j.id) {
        return Err(bad(format!(
            "its staging directory {:?} is not {:?}",
            j.staging,
            super::journal::staging_name(&j.id)
        )));
    }
    let protected = Protected::new(root, state);
    let check_as = |p: &Path, mode_only: bool| -> io::Result<()> {
        if let Some(r) = invalid_reason(p) {
            return Err(bad(format!("op path {}: {r}", p.display())));
        }
        if let Some(r) = protected.reason(p, mode_only) {
            return Err(bad(format!("op path {}: {r}", p.display())));
        }
        Ok(())
    };
    let check = |p: &Path| check_as(p, false);
    for op in &j.ops {
        match op {
            JOp::Dir { path, created, .. } => check_as(path.path(), !created)?,
            JOp::Place { path, .. } | JOp::Delete { path, .. } => check(path.path())?,
            JOp::Link { path, target, .. } => {
                check(path.path())?;
                check(target.path())?;
            }
            JOp::RenameDir { from, to, .. } => {
                check(from.path())?;
                check(to.path())?;
            }
        }
    }
    for s in &j.set_aside {
        check(s.path.path())?;
    }
    Ok(())
}
