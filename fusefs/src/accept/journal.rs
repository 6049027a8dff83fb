//! The accept journal: one file per accept in `StateDir::journals()`.
//!
//! The file is only ever replaced atomically (write `<id>.json.tmp`, fsync, rename, fsync
//! the directory), so it is always one complete version. Its `phase` decides recovery:
//! `Staging` (not committed: roll back), `Committed` (roll forward), `Applied` (only clean
//! up). Paths are stored as raw bytes so names that are not UTF-8 survive.

use super::sys;
use crate::fingerprint::Base;
use crate::plan::Timestamp;
use serde::{Deserialize, Serialize};
use std::ffi::OsStr;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// A path in the journal: a JSON string when it is UTF-8 (compact, readable), raw bytes
/// otherwise (serde_json cannot carry non-UTF-8 `PathBuf`s).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "PathRepr", into = "PathRepr")]
pub struct JPath(pub Vec<u8>);

#[derive(Clone, Serialize, Deserialize)]
#[serde(untagged)]
enum PathRepr {
    Utf8(String),
    Bytes(Vec<u8>),
}

impl From<PathRepr> for JPath {
    fn from(r: PathRepr) -> JPath {
        match r {
            PathRepr::Utf8(s) => JPath(s.into_bytes()),
            PathRepr::Bytes(b) => JPath(b),
        }
    }
}

impl From<JPath> for PathRepr {
    fn from(p: JPath) -> PathRepr {
        match String::from_utf8(p.0) {
            Ok(s) => PathRepr::Utf8(s),
            Err(e) => PathRepr::Bytes(e.into_bytes()),
        }
    }
}

impl JPath {
    pub fn new(p: &Path) -> JPath {
        JPath(p.as_os_str().as_bytes().to_vec())
    }
    pub fn path(&self) -> &Path {
        Path::new(OsStr::from_bytes(&self.0))
    }
}

/// How far an accept got.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// Staging in progress; the real tree is untouched. Recovery removes the staging dir.
    Staging,
    /// The commit point is passed: recovery re-runs every (idempotent) op.
    Committed,
    /// Every op is done; recovery only removes trash, staging and the journal.
    Applied,
}

/// One journaled op. `n` is the op's index: staged entries are named `n` in the staging dir
/// and trash `.shade-trash-<id>-<n>` beside the path.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum JOp {
    /// Rename staged `n` (a file or a symlink) onto `path`, while `path` still is `pre`.
    Place {
        n: usize,
        path: JPath,
        symlink: bool,
        /// What the accept expects at `path` before this op (checked at the commit point):
        /// anything else there is a change made since, which is never overwritten. `None`
        /// in journals of version 1 (see `Journal::committed_ns`).
        #[serde(default)]
        pre: Option<Base>,
    },
    /// Make sure a directory exists at `path` with these permissions (and extended
    /// attributes; its times are set last, once nothing else changes inside it).
    Dir {
        n: usize,
        path: JPath,
        mode: u32,
        uid: Option<u32>,
        gid: Option<u32>,
        created: bool,
        #[serde(default)]
        times: Option<(Timestamp, Timestamp)>,
        #[serde(default)]
        xattrs: Option<Vec<(Vec<u8>, Vec<u8>)>>,
        /// What the accept expects at `path` before this op.
        #[serde(default)]
        pre: Option<Base>,
        /// A new directory staged (empty) as `n`, renamed into place: applying then needs no
        /// new inode, so a full file system fails the accept before its commit point.
        #[serde(default)]
        staged: bool,
    },
    /// Make `path` a hard link to `target` (through a temporary name beside `path`, renamed
    /// over it), unless it already is one.
    Link {
        n: usize,
        path: JPath,
        target: JPath,
        /// What the accept expects at `path` before this op.
        #[serde(default)]
        pre: Option<Base>,
    },
    /// Move `from` to `to` while `from` is still `base_from`; a `to` matching `base_to` is
    /// trashed first.
    RenameDir {
        n: usize,
        from: JPath,
        to: JPath,
        base_from: Base,
        base_to: Base,
    },
    /// Trash `path` while it still is `base`.
    Delete { n: usize, path: JPath, base: Base },
}

impl JOp {
    /// Where this op may have left trash: the parent dir of the path it replaced.
    pub fn trash_parent(&self) -> (usize, &Path) {
        match self {
            JOp::Place { n, path, .. }
            | JOp::Dir { n, path, .. }
            | JOp::Link { n, path, .. }
            | JOp::Delete { n, path, .. } => (*n, path.path()),
            JOp::RenameDir { n, to, .. } => (*n, to.path()),
        }
    }
}

/// The whole journal file.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Journal {
    pub version: u32,
    pub id: String,
    /// Absolute project root.
    pub root: JPath,
    /// Name of the staging dir directly under `root`.
    pub staging: String,
    pub phase: Phase,
    pub ops: Vec<JOp>,
    /// Ops not applied because their path changed after the commit point, and where their
    /// new content is kept (recorded with `Applied`).
    #[serde(default)]
    pub set_aside: Vec<SetAside>,
    /// When the journal file was last written (read from it by `load`): for a version 1
    /// journal, which has no pre-states, a path whose ctime is later changed after that.
    #[serde(skip)]
    pub written_ns: Option<i64>,
}

/// The journal version this shade writes: 2 records each op's expected pre-state.
pub const VERSION: u32 = 2;

/// One change an accept did not apply because the user changed its path meanwhile.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAside {
    /// The op's index (its staged entry, if any, is `n` in the rescue directory).
    pub n: usize,
    /// The project path it was for (relative).
    pub path: JPath,
    /// What was found there instead.
    pub reason: String,
    /// Whether the branch's version was kept (in the rescue directory, as `n`).
    pub kept: bool,
}

/// Name of the directory (at the project root) that keeps the branch's version of paths an
/// accept set aside: the staging directory, renamed.
pub fn rescued_name(id: &str) -> String {
    format!(".shade-rescued-{id}")
}

/// Name of the staging directory for accept `id`.
pub fn staging_name(id: &str) -> String {
    format!(".shade-accept-{id}")
}

/// Name of the trash entry op `n` of accept `id` leaves beside its path.
pub fn trash_name(id: &str, n: usize) -> String {
    format!(".shade-trash-{id}-{n}")
}

/// Name of the temp file beside a target used when staging is on another file system.
pub fn xdev_tmp_name(id: &str, n: usize) -> String {
    format!(".shade-tmp-{id}-{n}")
}

/// The journal file of accept `id`.
pub fn journal_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.json"))
}

/// Where a new version of journal `id` is written before it is renamed into place.
pub fn tmp_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.json.tmp"))
}

impl Journal {
    /// Atomically (re)write this journal in `dir`: after this returns, a crash finds exactly
    /// this version.
    pub fn store(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let final_path = journal_path(dir, &self.id);
        let tmp = tmp_path(dir, &self.id);
        let bytes = serde_json::to_vec(self).map_err(io::Error::other)?;
        {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&bytes)?;
            sys::fsync(&f)?;
        }
        std::fs::rename(&tmp, &final_path)?;
        sys::fsync(&sys::open_dir_path(dir)?)
    }

    /// Read a journal file.
    pub fn load(path: &Path) -> io::Result<Journal> {
        use std::os::unix::fs::MetadataExt;
        let bytes = std::fs::read(path)?;
        let mut j: Journal = serde_json::from_slice(&bytes)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        if j.version > VERSION {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "journal version {} is newer than this shade understands ({VERSION})",
                    j.version
                ),
            ));
        }
        let m = std::fs::metadata(path)?;
        j.written_ns = Some(m.mtime() * 1_000_000_000 + m.mtime_nsec());
        Ok(j)
    }

    /// Remove this journal (the last step of an accept or a recovery), and any half-written
    /// newer version of it.
    pub fn remove(&self, dir: &Path) -> io::Result<()> {
        for p in [journal_path(dir, &self.id), tmp_path(dir, &self.id)] {
            match std::fs::remove_file(p) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        sys::fsync(&sys::open_dir_path(dir)?)
    }
}
