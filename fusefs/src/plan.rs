//! An accept plan: the concrete file system steps that turn lower into the branch's view.
//!
//! The overlay builds a plan from its overrides; the accept engine (`accept`) checks it
//! against lower, journals it and applies it. Keeping the two apart lets the accept engine
//! be tested (and crash-tested) without a mount.

use crate::fingerprint::Base;
use std::fs::File;
use std::path::PathBuf;

/// Paths in a plan are relative to the project root, with no `..`, no leading `/`, and never
/// empty (the root itself is never replaced).
pub type RelPath = PathBuf;

/// A time as `stat` gives it: seconds and nanoseconds since the epoch.
pub type Timestamp = (i64, i64);

/// Ownership, permission bits, times and extended attributes to give an object, so the
/// real tree shows what the branch showed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Perms {
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    /// Owner to set when running as root; `None` keeps the creating process's.
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// Access and modification times to set; `None` leaves what the write made.
    pub times: Option<(Timestamp, Timestamp)>,
    /// The complete set of extended attributes (names as bytes); `None` leaves them alone.
    /// On an existing directory, `user.` and `trusted.` attributes not listed are removed.
    pub xattrs: Option<Vec<(Vec<u8>, Vec<u8>)>>,
    /// The project path this object came from (a renamed file's source): as root, accept
    /// may give the object that path's owner too (see `accept::check`).
    pub origin: Option<RelPath>,
}

/// One step of an accept.
///
/// `base` is what the branch saw in lower before changing the path; `base_at`, where in
/// lower it saw it (before any op of the plan runs). Directory renames in the branch mean
/// the two can differ from `path`: pre-flight checks `base` exactly there when it is known,
/// and `None` (a path that had no lower counterpart, or a hand-built plan) falls back to
/// `path` and its place before the plan's renames.
#[derive(Debug)]
pub enum PlanOp {
    /// Create or replace a regular file with `content` (read from offset 0 to its end).
    WriteFile {
        path: RelPath,
        content: File,
        perms: Perms,
        base: Base,
        base_at: Option<RelPath>,
    },
    /// Create or replace a symlink.
    Symlink {
        path: RelPath,
        target: PathBuf,
        base: Base,
        base_at: Option<RelPath>,
    },
    /// Make `path` one more name of the file at `target` (a hard link made in the branch).
    /// Done after every write and placement, so `target` is the file the branch showed.
    Link {
        path: RelPath,
        target: RelPath,
        base: Base,
        base_at: Option<RelPath>,
    },
    /// Create a fifo, socket or device node (`mode` includes the type bits).
    Special {
        path: RelPath,
        mode: u32,
        rdev: u64,
        perms: Perms,
        base: Base,
        base_at: Option<RelPath>,
    },
    /// Create a directory (its parent exists by then, or is created by an earlier op).
    Mkdir {
        path: RelPath,
        perms: Perms,
        base: Base,
        base_at: Option<RelPath>,
    },
    /// Change the permissions, times or extended attributes of an existing directory.
    SetPerms {
        path: RelPath,
        perms: Perms,
        base: Base,
        base_at: Option<RelPath>,
    },
    /// Move a whole lower directory (the branch renamed it); done before any other op so
    /// that ops inside `to` find it there.
    RenameDir {
        from: RelPath,
        to: RelPath,
        base_from: Base,
        base_to: Base,
    },
    /// Remove a file, symlink or whole directory tree; done after writes, deepest first.
    Delete {
        path: RelPath,
        base: Base,
        base_at: Option<RelPath>,
    },
}

impl PlanOp {
    /// The path this op leaves changed (for reports and conflict lists).
    pub fn path(&self) -> &RelPath {
        match self {
            PlanOp::WriteFile { path, .. }
            | PlanOp::Symlink { path, .. }
            | PlanOp::Link { path, .. }
            | PlanOp::Special { path, .. }
            | PlanOp::Mkdir { path, .. }
            | PlanOp::SetPerms { path, .. }
            | PlanOp::Delete { path, .. } => path,
            PlanOp::RenameDir { to, .. } => to,
        }
    }

    /// The path of a single-path op, to change it (a plan built with host paths is made
    /// relative to its accept's root); a rename has two and gives none.
    pub fn path_mut(&mut self) -> Option<&mut RelPath> {
        match self {
            PlanOp::WriteFile { path, .. }
            | PlanOp::Symlink { path, .. }
            | PlanOp::Link { path, .. }
            | PlanOp::Special { path, .. }
            | PlanOp::Mkdir { path, .. }
            | PlanOp::SetPerms { path, .. }
            | PlanOp::Delete { path, .. } => Some(path),
            PlanOp::RenameDir { .. } => None,
        }
    }

    /// The base of a single-path op (a rename has two, see its fields).
    pub fn base(&self) -> Option<Base> {
        match self {
            PlanOp::WriteFile { base, .. }
            | PlanOp::Symlink { base, .. }
            | PlanOp::Link { base, .. }
            | PlanOp::Special { base, .. }
            | PlanOp::Mkdir { base, .. }
            | PlanOp::SetPerms { base, .. }
            | PlanOp::Delete { base, .. } => Some(*base),
            PlanOp::RenameDir { .. } => None,
        }
    }

    /// Where in lower the op's base was observed, if recorded.
    pub fn base_at(&self) -> Option<&RelPath> {
        match self {
            PlanOp::WriteFile { base_at, .. }
            | PlanOp::Symlink { base_at, .. }
            | PlanOp::Link { base_at, .. }
            | PlanOp::Special { base_at, .. }
            | PlanOp::Mkdir { base_at, .. }
            | PlanOp::SetPerms { base_at, .. }
            | PlanOp::Delete { base_at, .. } => base_at.as_ref(),
            PlanOp::RenameDir { .. } => None,
        }
    }
}

/// A lower object the branch read before it made a change the plan writes: accept refuses
/// (a conflict) when it is no longer what the branch saw, since the change may derive from it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadBase {
    /// Where in lower it was read (before any op of the plan runs).
    pub path: RelPath,
    /// What it was when the branch first read it.
    pub seen: crate::fingerprint::Fingerprint,
    /// A directory listing: compared by identity and entries (mtime), not by its files.
    pub listing: bool,
    /// A directory the plan deletes as a whole: besides its entries, nothing below it may
    /// have changed (ctime, in ns since the epoch) after this time, when the branch saw it.
    pub subtree_since: Option<i64>,
}

impl ReadBase {
    /// Whether `now` (what lower has at `path` now) is still what the branch read.
    pub fn holds(&self, now: &crate::fingerprint::Base) -> bool {
        match now {
            crate::fingerprint::Base::Absent => false,
            crate::fingerprint::Base::Present(fp) if self.listing => {
                fp.is_dir()
                    && fp.dev == self.seen.dev
                    && fp.ino == self.seen.ino
                    && fp.mtime_ns == self.seen.mtime_ns
            }
            crate::fingerprint::Base::Present(fp) => *fp == self.seen,
        }
    }
}
