//! Accept history: what every accept replaced, so `shade undo` can put it back.
//!
//! Each accept records, per path it touches, the state before (content, mode, owner,
//! symlink target, extended attributes, or absence) and the state it writes, in
//! `StateDir::history()/entries/<id>.json` (`id` = the accept's journal id), and its
//! directory renames. Only before-contents the project will not hold after the accept are
//! stored (overwritten or deleted ones; a renamed tree is still there, and undo renames it
//! back), once per distinct content in `objects/<sha256>` (content-addressed); past the
//! retention's `max_bytes` or the disk's free space, none are and the entry says the accept
//! cannot be undone. The entry is
//! written and fsynced before the accept's commit point; an accept that rolls back (before
//! its commit point, or in recovery) removes it again, so an entry exists only for an
//! accept that is (or will be, by recovery) in the project.
//!
//! Retention keeps the last `keep` accepts and at most `max_bytes` of stored contents; an
//! older entry is *evicted* (its contents dropped, its record kept so `shade log` can say
//! it can no longer be undone), never one whose journal is still live.

use super::safe_path::{rebase, Walker};
use super::sys;
use crate::plan::{PlanOp, Timestamp};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub use super::journal::JPath;

/// The version of entry files this shade writes.
pub const VERSION: u32 = 1;

/// How much history to keep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    /// Keep the contents of this many most recent accepts (0 records no history at all).
    pub keep: usize,
    /// Keep at most this many bytes of stored contents (older accepts are evicted first).
    pub max_bytes: u64,
}

impl Default for Retention {
    fn default() -> Retention {
        Retention {
            keep: 1000,
            max_bytes: 2 << 30,
        }
    }
}

static RETENTION: Mutex<Option<Retention>> = Mutex::new(None);
static ORIGIN: Mutex<Option<String>> = Mutex::new(None);

thread_local! {
    static NOTE: RefCell<Option<(String, Option<String>)>> = const { RefCell::new(None) };
}

/// Set the retention for every later accept of this process (from the config).
pub fn configure(r: Retention) {
    if let Ok(mut g) = RETENTION.lock() {
        *g = Some(r);
    }
}

/// The retention in force.
pub fn retention() -> Retention {
    RETENTION.lock().ok().and_then(|g| *g).unwrap_or_default()
}

/// Say where this process's accepts come from ("shade run -- make", "mcp client X"): the
/// history shows it.
pub fn set_origin(origin: impl Into<String>) {
    if let Ok(mut g) = ORIGIN.lock() {
        *g = Some(origin.into());
    }
}

/// The origin to record, kept to one line of visible text: it comes from whoever started
/// the accept (an MCP client's self-chosen name, a command line) and `shade log` prints it.
pub fn origin() -> String {
    let o = NOTE
        .with(|n| n.borrow().as_ref().map(|(o, _)| o.clone()))
        .or_else(|| ORIGIN.lock().ok().and_then(|g| g.clone()))
        .unwrap_or_else(|| "shade".into());
    crate::quote::visible_line(&o).into_owned()
}

fn undoes() -> Option<String> {
    NOTE.with(|n| n.borrow().as_ref().and_then(|(_, u)| u.clone()))
}

/// Run `f` with accepts on this thread recorded as coming from `origin` (and as the undo of
/// accept `undoes`), whatever the process-wide origin says.
pub fn with_note<T>(origin: String, undoes: Option<String>, f: impl FnOnce() -> T) -> T {
    let old = NOTE.with(|n| n.replace(Some((origin, undoes))));
    let out = f();
    NOTE.with(|n| *n.borrow_mut() = old);
    out
}

/// The state of one path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum State {
    /// Nothing there.
    Absent,
    /// A regular file; its content is `objects/<sha256>` (when stored: before-states).
    File {
        mode: u32,
        uid: u32,
        gid: u32,
        size: u64,
        sha256: String,
        #[serde(default)]
        mtime: Option<Timestamp>,
        #[serde(default)]
        xattrs: Vec<(Vec<u8>, Vec<u8>)>,
        /// For a file known without its hash (`sha256` empty: one of a renamed tree): its
        /// ctime and inode, which no write can keep as they were (an mtime can be set
        /// back; a ctime cannot), so that undo tells an edit of the same size whose mtime
        /// was reset.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        changed: Option<(i64, i64, u64)>,
    },
    /// A symbolic link.
    Symlink { target: JPath, uid: u32, gid: u32 },
    /// A directory (its entries are paths of their own).
    Dir {
        mode: u32,
        uid: u32,
        gid: u32,
        #[serde(default)]
        mtime: Option<Timestamp>,
        #[serde(default)]
        xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    },
    /// A fifo, socket or device node (`mode` with its type bits).
    Special {
        mode: u32,
        rdev: u64,
        uid: u32,
        gid: u32,
    },
}

impl State {
    /// One word for the kind of object.
    pub fn kind(&self) -> &'static str {
        match self {
            State::Absent => "nothing",
            State::File { .. } => "a file",
            State::Symlink { .. } => "a symlink",
            State::Dir { .. } => "a directory",
            State::Special { .. } => "a special file",
        }
    }

    /// Whether this is a directory.
    pub fn is_dir(&self) -> bool {
        matches!(self, State::Dir { .. })
    }

    /// Whether something is there.
    pub fn present(&self) -> bool {
        !matches!(self, State::Absent)
    }

    /// Whether `now` is this state as far as a user can tell: kind, content, link target,
    /// permission bits (owners, times and attributes are not compared).
    pub fn same_as(&self, now: &State) -> bool {
        match (self, now) {
            (State::Absent, State::Absent) => true,
            (
                State::File {
                    mode: m1,
                    sha256: h1,
                    ..
                },
                State::File {
                    mode: m2,
                    sha256: h2,
                    ..
                },
            ) => m1 & 0o7777 == m2 & 0o7777 && h1 == h2,
            (State::Symlink { target: a, .. }, State::Symlink { target: b, .. }) => a == b,
            (State::Dir { mode: a, .. }, State::Dir { mode: b, .. }) => a & 0o7777 == b & 0o7777,
            (
                State::Special {
                    mode: a, rdev: r1, ..
                },
                State::Special {
                    mode: b, rdev: r2, ..
                },
            ) => a == b && r1 == r2,
            _ => false,
        }
    }

    /// Content bytes this state stores (a file's size).
    pub fn bytes(&self) -> u64 {
        match self {
            State::File { size, .. } => *size,
            _ => 0,
        }
    }
}

/// One path an accept changed.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Change {
    /// Relative to the project root.
    pub path: JPath,
    /// What was there before the accept.
    pub before: State,
    /// What the accept put there.
    pub after: State,
}

/// One accept in the history.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Entry {
    pub version: u32,
    /// The accept's id (its journal's).
    pub id: String,
    /// Absolute project root.
    pub root: JPath,
    /// When the accept was made (ns since the epoch).
    pub time_ns: i64,
    /// Where it came from: the command line, a chat session's turn, an MCP client.
    pub origin: String,
    /// The accept this one undid, if it is an undo.
    #[serde(default)]
    pub undoes: Option<String>,
    /// Every path it changed, parents before children: kept in `<id>.changes.json` beside
    /// the entry (so listing and retention read only the small entry files); empty until
    /// [`load_changes`] fills it.
    #[serde(skip, default)]
    pub changes: Vec<Change>,
    /// How many paths it changed.
    #[serde(default)]
    pub paths: usize,
    /// Bytes of before-contents it keeps (shared contents counted in each entry).
    pub bytes: u64,
    /// Its contents were dropped by retention: it can no longer be undone.
    #[serde(default)]
    pub evicted: bool,
    /// Its journal was given up (`shade recover --drop`): the entry no longer tells what
    /// the project holds, and it is never undone.
    #[serde(default)]
    pub dropped: Option<Dropped>,
    /// The directory renames it made (`from`, `to`, in plan order): undo renames them back
    /// instead of keeping a copy of the renamed trees (the contents are still in the
    /// project, under the new names).
    #[serde(default)]
    pub renames: Vec<(JPath, JPath)>,
    /// Why its earlier contents were not kept (more than the history may hold, or than the
    /// state directory's disk has free): it was applied, but it cannot be undone.
    #[serde(default)]
    pub not_kept: Option<String>,
}

/// How an accept's journal was given up by `shade recover --drop`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dropped {
    /// Before its commit point: nothing of it entered the project (rolled back).
    RolledBack,
    /// After its commit point, unfinished: the project may hold part of it.
    Unfinished,
}

impl Dropped {
    /// What `shade log` says of it.
    pub fn describe(self) -> &'static str {
        match self {
            Dropped::RolledBack => {
                "rolled back (`shade recover --drop` gave it up before its commit point: \
                 nothing of it is in the project)"
            }
            Dropped::Unfinished => {
                "never finished (`shade recover --drop` gave it up after its commit point: \
                 the project may hold part of it); cannot be undone"
            }
        }
    }
}

/// Say in the entry of accept `id` that its journal was dropped (`committed`: after its
/// commit point). Returns whether there was an entry.
pub fn mark_dropped(history: &Path, id: &str, committed: bool) -> io::Result<bool> {
    let p = entry_path(history, id);
    let bytes = match std::fs::read(&p) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    let mut e: Entry = serde_json::from_slice(&bytes).map_err(|err| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {err}", p.display()),
        )
    })?;
    e.dropped = Some(if committed {
        Dropped::Unfinished
    } else {
        Dropped::RolledBack
    });
    let _lock = lock(history)?;
    store_head(history, &e)?;
    Ok(true)
}

/// `StateDir::history()` parts.
fn entries_dir(history: &Path) -> PathBuf {
    history.join("entries")
}
fn objects_dir(history: &Path) -> PathBuf {
    history.join("objects")
}
fn entry_path(history: &Path, id: &str) -> PathBuf {
    entries_dir(history).join(format!("{id}.json"))
}

/// The history directory beside the journal directory `journals` of one state dir.
pub fn beside_journals(journals: &Path) -> PathBuf {
    journals
        .parent()
        .map(|p| p.join("history"))
        .unwrap_or_else(|| PathBuf::from("history"))
}

/// The file holding the contents with this hash.
pub fn object_path(history: &Path, sha256: &str) -> PathBuf {
    objects_dir(history).join(sha256)
}

fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Blocks of the sparse content hash ([`hash_file`]): a block all zeros (a hole, or
/// zeros written) is left out of it.
const BLOCK: u64 = 64 << 10;

/// Marks a content hash of the sparse form. Records made before it have the plain SHA-256
/// of the whole content (64 hex digits): they are still compared (and undone) by that
/// form ([`Lookup::read_state_as`]), and their objects keep their names.
const SPARSE_PREFIX: &str = "z1-";

/// Whether `sha256` (a recorded content hash) is of the plain form, over every byte.
pub fn plain_hash(sha256: &str) -> bool {
    !sha256.starts_with(SPARSE_PREFIX)
}

/// The content hash of `f` and its size, with `each` given every block that is not all
/// zeros (offset, bytes). SHA-256 over a header, the size and each such block with its
/// index: the same for the same content whatever its holes (file systems place them at
/// different granularity), and a hole costs nothing (the data regions come from
/// `SEEK_DATA`/`SEEK_HOLE`; a command in a branch may make a file of any apparent size).
fn sparse_hash(
    f: &mut std::fs::File,
    mut each: impl FnMut(u64, &[u8]) -> io::Result<()>,
) -> io::Result<(String, u64)> {
    use std::os::unix::fs::FileExt;
    let len = f.metadata()?.len();
    let regions = super::stage::data_regions(f)?.unwrap_or_else(|| vec![(0, len)]);
    let mut h = Sha256::new();
    h.update(b"shade sparse content v1\0");
    h.update(len.to_le_bytes());
    let mut buf = vec![0u8; BLOCK as usize];
    // The next block not yet looked at (regions may share a block at their edges).
    let mut next = 0u64;
    for (start, n) in regions {
        let first = (start / BLOCK).max(next);
        let end = start.saturating_add(n).min(len);
        let last = end.div_ceil(BLOCK);
        for b in first..last {
            super::stage::check_cancel()?; // Ctrl-C stops the accept
            let at = b * BLOCK;
            let want = usize::try_from(BLOCK.min(len - at)).unwrap_or(0);
            let mut got = 0;
            while got < want {
                match f.read_at(&mut buf[got..want], at + got as u64) {
                    Ok(0) => break, // shrank meanwhile: zeros from here
                    Ok(k) => got += k,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            buf[got..want].fill(0);
            let block = &buf[..want];
            if block.iter().any(|&x| x != 0) {
                h.update(b.to_le_bytes());
                h.update(block);
                each(at, block)?;
            }
        }
        next = next.max(last);
    }
    Ok((format!("{SPARSE_PREFIX}{}", hex(&h.finalize())), len))
}

/// The content hash of a file (its sparse form: see [`sparse_hash`]) and its size.
pub fn hash_file(f: &mut std::fs::File) -> io::Result<(String, u64)> {
    sparse_hash(f, |_, _| Ok(()))
}

/// The plain form of a file's content hash (SHA-256 of every byte from its start), as
/// records made before the sparse form have it.
pub fn plain_hash_file(f: &mut std::fs::File) -> io::Result<(String, u64)> {
    f.seek(SeekFrom::Start(0))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut n = 0u64;
    loop {
        super::stage::check_cancel()?; // a huge (sparse) file: Ctrl-C stops the accept
        let k = f.read(&mut buf)?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        n += k as u64;
    }
    Ok((hex(&h.finalize()), n))
}

/// The content store of one history directory, writing each distinct content once.
pub struct Objects {
    dir: PathBuf,
    seq: u64,
}

impl Objects {
    /// Open (creating) the object store of `history`.
    pub fn open(history: &Path) -> io::Result<Objects> {
        private_dir(history)?;
        let dir = objects_dir(history);
        std::fs::create_dir_all(&dir)?;
        Ok(Objects { dir, seq: 0 })
    }

    /// Copy `f` (from its start) into the store; its hash and size. Not synced: the caller
    /// syncs the store's file system once before recording the entry.
    pub fn put(&mut self, f: &mut std::fs::File) -> io::Result<(String, u64)> {
        use std::os::unix::fs::FileExt;
        self.seq += 1;
        let tmp = self
            .dir
            .join(format!(".tmp-{}-{}", std::process::id(), self.seq));
        let out = std::fs::File::create(&tmp)?;
        // Only the blocks that are not all zeros are written: the stored copy is as sparse
        // as the content allows, whatever the size it claims.
        let res = sparse_hash(f, |at, block| out.write_all_at(block, at))
            .and_then(|(sum, n)| out.set_len(n).map(|()| (sum, n)));
        drop(out);
        let (sum, n) = match res {
            Ok(r) => r,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        };
        let dst = self.dir.join(&sum);
        if dst.exists() {
            std::fs::remove_file(&tmp)?;
            // Touch it: a content used again is recent (eviction looks at entries, not this).
        } else {
            std::fs::rename(&tmp, &dst)?;
        }
        Ok((sum, n))
    }

    /// Make every content put so far durable.
    pub fn sync(&self) -> io::Result<()> {
        let d = sys::open_dir_path(&self.dir)?;
        sys::syncfs(&d)?;
        sys::fsync(&d)
    }
}

fn xattrs_of(fd: RawFd) -> Vec<(Vec<u8>, Vec<u8>)> {
    let Ok(names) = sys::list_xattrs(fd) else {
        return Vec::new();
    };
    names
        .into_iter()
        .filter(|n| n.starts_with(b"user.") || n.starts_with(b"trusted."))
        .filter_map(|n| sys::get_xattr(fd, &n).ok().map(|v| (n, v)))
        .collect()
}

fn is_gone(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOENT) | Some(libc::ENOTDIR) | Some(libc::ELOOP)
    )
}

/// Looks up many paths beneath one root, keeping the directories of the last walk open:
/// the paths of a chain `d` deep cost one walk, not one each (a walk per path is
/// quadratic in the depth, and a branch makes a chain 2,000 deep in a second).
pub struct Lookup {
    walker: Walker,
}

impl Lookup {
    /// Lookups beneath `root` (which must outlive it).
    pub fn new(root: RawFd) -> Lookup {
        Lookup {
            walker: Walker::new(root),
        }
    }

    /// As [`observe`].
    pub fn observe(&mut self, path: &Path) -> io::Result<crate::fingerprint::Base> {
        Ok(self.walker.observe(path)?.base())
    }

    /// As [`read_state`].
    pub fn read_state(&mut self, path: &Path, store: Option<&mut Objects>) -> io::Result<State> {
        read_state_in(&mut self.walker, path, store)
    }

    /// As [`Lookup::read_state`], a file's content hash in the form `like` (a recorded
    /// state) has it: a record made before the sparse form is compared by the plain one;
    /// not read at all (empty hash) when `like` has none (a file of a renamed tree).
    pub fn read_state_as(&mut self, path: &Path, like: &State) -> io::Result<State> {
        if matches!(like, State::File { sha256, .. } if sha256.is_empty()) {
            let (parent, name) = match self.walker.open_parent(path) {
                Ok(p) => p,
                Err(e) if is_gone(&e) => return Ok(State::Absent),
                Err(e) => return Err(e),
            };
            return state_at(parent.as_raw_fd(), &name, None, false);
        }
        let mut now = self.read_state(path, None)?;
        let plain = matches!(like, State::File { sha256, .. } if plain_hash(sha256));
        if let (true, State::File { sha256, .. }) = (plain, &mut now) {
            let (parent, name) = self.walker.open_parent(path)?;
            let mut f = sys::open_file_at(parent.as_raw_fd(), &name)?;
            *sha256 = plain_hash_file(&mut f)?.0;
        }
        Ok(now)
    }

    /// The regular file at `path`, opened for reading without following a symlink at any
    /// point (undo reads a content the project still holds, elsewhere, this way).
    pub fn open_file(&mut self, path: &Path) -> io::Result<std::fs::File> {
        let (parent, name) = self.walker.open_parent(path)?;
        sys::open_file_at(parent.as_raw_fd(), &name)
    }

    /// As [`read_tree`].
    pub fn read_tree(
        &mut self,
        path: &Path,
        store: Option<&mut Objects>,
    ) -> io::Result<Vec<(PathBuf, State)>> {
        read_tree_in(&mut self.walker, path, store, true)
    }

    /// As [`Lookup::read_tree`] without reading any file's content: names and kinds (a
    /// file's `sha256` is empty).
    pub fn list_tree(&mut self, path: &Path) -> io::Result<Vec<(PathBuf, State)>> {
        read_tree_in(&mut self.walker, path, None, false)
    }
}

/// What is at `path` beneath `root` now (never following a symlink); a file's content is
/// put in `store` when given, else only hashed.
pub fn read_state(root: RawFd, path: &Path, store: Option<&mut Objects>) -> io::Result<State> {
    read_state_in(&mut Walker::new(root), path, store)
}

/// [`read_state`] by `walker`, which keeps the directories of its last walk open (many
/// paths of a deep chain cost one walk, not one each).
fn read_state_in(
    walker: &mut Walker,
    path: &Path,
    store: Option<&mut Objects>,
) -> io::Result<State> {
    let (parent, name) = match walker.open_parent(path) {
        Ok(p) => p,
        Err(e) if is_gone(&e) => return Ok(State::Absent),
        Err(e) => return Err(e),
    };
    state_at(parent.as_raw_fd(), &name, store, true)
}

/// The state of `name` in `dir`; a file's content is hashed only when `hash` (else its
/// `sha256` is empty: the file is known by its size, mode and times).
fn state_at(
    dir: RawFd,
    name: &OsStr,
    store: Option<&mut Objects>,
    hash: bool,
) -> io::Result<State> {
    let Some(st) = sys::lstat_at(dir, name)? else {
        return Ok(State::Absent);
    };
    let (uid, gid) = (st.st_uid, st.st_gid);
    let mtime = Some((st.st_mtime, st.st_mtime_nsec));
    Ok(match st.st_mode & libc::S_IFMT {
        libc::S_IFREG if !hash => {
            let f = sys::open_file_at(dir, name)?;
            State::File {
                mode: st.st_mode & 0o7777,
                uid,
                gid,
                size: st.st_size as u64,
                sha256: String::new(),
                mtime,
                xattrs: xattrs_of(f.as_raw_fd()),
                changed: Some((st.st_ctime, st.st_ctime_nsec, st.st_ino)),
            }
        }
        libc::S_IFREG => {
            let mut f = sys::open_file_at(dir, name)?;
            let (sha256, size) = match store {
                Some(s) => s.put(&mut f)?,
                None => hash_file(&mut f)?,
            };
            State::File {
                mode: st.st_mode & 0o7777,
                uid,
                gid,
                size,
                sha256,
                mtime,
                xattrs: xattrs_of(f.as_raw_fd()),
                changed: None,
            }
        }
        libc::S_IFLNK => State::Symlink {
            target: JPath(sys::readlink_at(dir, name)?),
            uid,
            gid,
        },
        libc::S_IFDIR => {
            let d = sys::open_dir_at(dir, name)?;
            State::Dir {
                mode: st.st_mode & 0o7777,
                uid,
                gid,
                mtime,
                xattrs: xattrs_of(d.as_raw_fd()),
            }
        }
        _ => State::Special {
            mode: st.st_mode,
            rdev: st.st_rdev,
            uid,
            gid,
        },
    })
}

/// Every object below the directory `path` (not `path` itself), parents first, with its
/// state; contents put in `store` when given.
pub fn read_tree(
    root: RawFd,
    path: &Path,
    store: Option<&mut Objects>,
) -> io::Result<Vec<(PathBuf, State)>> {
    read_tree_in(&mut Walker::new(root), path, store, true)
}

/// [`read_tree`] by `walker` (see [`read_state_in`]).
fn read_tree_in(
    walker: &mut Walker,
    path: &Path,
    mut store: Option<&mut Objects>,
    hash: bool,
) -> io::Result<Vec<(PathBuf, State)>> {
    let mut out = Vec::new();
    let dir = match walker.open_dir(path) {
        Ok(d) => d,
        Err(e) if is_gone(&e) => return Ok(out),
        Err(e) => return Err(e),
    };
    let mut stack = vec![(dir, path.to_path_buf())];
    while let Some((dir, at)) = stack.pop() {
        let mut names = sys::list_dir(dir.as_raw_fd())?;
        names.sort();
        for name in names {
            let b = name.as_bytes();
            if b.starts_with(b".shade-trash-") || b.starts_with(b".shade-tmp-") {
                continue;
            }
            let s = state_at(dir.as_raw_fd(), &name, store.as_deref_mut(), hash)?;
            let p = at.join(&name);
            if s.is_dir() {
                match sys::open_dir_at(dir.as_raw_fd(), &name) {
                    Ok(sub) => stack.push((sub, p.clone())),
                    Err(e) if is_gone(&e) => {}
                    Err(e) => return Err(e),
                }
            }
            out.push((p, s));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// A symbolic run of a plan over the states of the paths it touches, recording each
/// touched path's state before the plan (where it was then) and after it.
///
/// Nothing is copied while the plan is run: contents are hashed only, and once the whole
/// plan is known [`record`] stores the before-contents an undo cannot find in the project
/// (a file that a rename only moved comes back by renaming its directory back).
struct Capture {
    /// Looks in the project, keeping the directories of its last walk open.
    walker: Walker,
    /// Before-states, by path before the plan.
    before: BTreeMap<PathBuf, State>,
    /// States as the plan goes, by path at that point of the plan.
    cur: BTreeMap<PathBuf, State>,
    /// Directories whose whole subtree is in `cur` (moved, deleted, or made by the plan).
    full: BTreeSet<PathBuf>,
    renames: Vec<(PathBuf, PathBuf)>,
}

impl Capture {
    fn map_back(&self, p: &Path) -> PathBuf {
        let mut cur = p.to_path_buf();
        for (from, to) in self.renames.iter().rev() {
            if let Some(b) = rebase(&cur, to, from) {
                cur = b;
            }
        }
        cur
    }

    /// Make sure `cur` knows `p`.
    fn ensure(&mut self, p: &Path) -> io::Result<()> {
        if self.cur.contains_key(p) {
            return Ok(());
        }
        // Under something the plan itself accounts for whole: absent unless recorded.
        for a in p.ancestors().skip(1).filter(|a| !a.as_os_str().is_empty()) {
            match self.cur.get(a) {
                Some(s) if !s.is_dir() || self.full.contains(a) => {
                    self.cur.insert(p.to_path_buf(), State::Absent);
                    return Ok(());
                }
                _ => {}
            }
        }
        let orig = self.map_back(p);
        let s = match self.before.get(&orig) {
            Some(s) => s.clone(),
            None => {
                let s = read_state_in(&mut self.walker, &orig, None)?;
                self.before.insert(orig, s.clone());
                s
            }
        };
        self.cur.insert(p.to_path_buf(), s);
        Ok(())
    }

    /// Make sure `cur` knows `p` and, for a directory, everything below it.
    fn ensure_tree(&mut self, p: &Path) -> io::Result<()> {
        self.ensure_tree_as(p, true)
    }

    /// As [`Capture::ensure_tree`]; the files below `p` are not read when not `hash` (a
    /// renamed tree: its contents stay in the project, known by size, mode and times, and
    /// [`record`] reads only those it must keep).
    fn ensure_tree_as(&mut self, p: &Path, hash: bool) -> io::Result<()> {
        self.ensure(p)?;
        if !self.cur.get(p).is_some_and(State::is_dir) || self.full.contains(p) {
            return Ok(());
        }
        let orig = self.map_back(p);
        for (q, s) in read_tree_in(&mut self.walker, &orig, None, hash)? {
            let at = rebase(&q, &orig, p).unwrap_or(q.clone());
            if !self.cur.contains_key(&at) {
                self.cur.insert(at.clone(), s.clone());
            }
            self.before.entry(q).or_insert(s);
            if self.cur.get(&at).is_some_and(State::is_dir) {
                self.full.insert(at);
            }
        }
        self.full.insert(p.to_path_buf());
        Ok(())
    }

    /// `p` becomes `s`; whatever was below it is gone.
    fn set(&mut self, p: &Path, s: State) {
        let below: Vec<PathBuf> = self
            .cur
            .range::<Path, _>((std::ops::Bound::Excluded(p), std::ops::Bound::Unbounded))
            .take_while(|(q, _)| q.starts_with(p))
            .map(|(q, _)| q.clone())
            .collect();
        for q in below {
            self.cur.insert(q.clone(), State::Absent);
            self.full.remove(&q);
        }
        self.cur.insert(p.to_path_buf(), s);
    }

    fn op(&mut self, op: &mut PlanOp) -> io::Result<()> {
        // SAFETY: geteuid/getegid cannot fail.
        let me = unsafe { (libc::geteuid(), libc::getegid()) };
        match op {
            PlanOp::WriteFile {
                path,
                content,
                perms,
                ..
            } => {
                self.ensure_tree(path)?;
                let (sha256, size) = hash_file(content)?;
                let s = State::File {
                    mode: perms.mode & 0o7777,
                    uid: perms.uid.unwrap_or(me.0),
                    gid: perms.gid.unwrap_or(me.1),
                    size,
                    sha256,
                    mtime: perms.times.map(|t| t.1),
                    xattrs: perms.xattrs.clone().unwrap_or_default(),
                    changed: None,
                };
                self.set(path, s);
            }
            PlanOp::Symlink { path, target, .. } => {
                self.ensure_tree(path)?;
                self.set(
                    path,
                    State::Symlink {
                        target: JPath::new(target),
                        uid: me.0,
                        gid: me.1,
                    },
                );
            }
            PlanOp::Special {
                path,
                mode,
                rdev,
                perms,
                ..
            } => {
                self.ensure_tree(path)?;
                self.set(
                    path,
                    State::Special {
                        mode: *mode & libc::S_IFMT | perms.mode & 0o7777,
                        rdev: *rdev,
                        uid: perms.uid.unwrap_or(me.0),
                        gid: perms.gid.unwrap_or(me.1),
                    },
                );
            }
            PlanOp::Link { path, target, .. } => {
                self.ensure_tree(path)?;
                self.ensure(target)?;
                let s = self
                    .cur
                    .get(target.as_path())
                    .cloned()
                    .unwrap_or(State::Absent);
                self.set(path, s);
            }
            PlanOp::Mkdir { path, perms, .. } => {
                self.ensure_tree(path)?;
                self.set(
                    path,
                    State::Dir {
                        mode: perms.mode & 0o7777,
                        uid: perms.uid.unwrap_or(me.0),
                        gid: perms.gid.unwrap_or(me.1),
                        mtime: perms.times.map(|t| t.1),
                        xattrs: perms.xattrs.clone().unwrap_or_default(),
                    },
                );
                self.full.insert(path.clone());
            }
            PlanOp::SetPerms { path, perms, .. } => {
                self.ensure(path)?;
                if let Some(State::Dir {
                    mode,
                    uid,
                    gid,
                    mtime,
                    xattrs,
                }) = self.cur.get_mut(path.as_path())
                {
                    *mode = perms.mode & 0o7777;
                    if let Some(u) = perms.uid {
                        *uid = u;
                    }
                    if let Some(g) = perms.gid {
                        *gid = g;
                    }
                    if let Some(t) = perms.times {
                        *mtime = Some(t.1);
                    }
                    if let Some(x) = &perms.xattrs {
                        *xattrs = x.clone();
                    }
                }
            }
            PlanOp::RenameDir { from, to, .. } => {
                self.ensure_tree_as(from, false)?;
                self.ensure_tree(to)?;
                let moved: Vec<(PathBuf, State)> = self
                    .cur
                    .range::<Path, _>((
                        std::ops::Bound::Included(from.as_path()),
                        std::ops::Bound::Unbounded,
                    ))
                    .take_while(|(q, _)| q.starts_with(from.as_path()))
                    .map(|(q, s)| (q.clone(), s.clone()))
                    .collect();
                self.set(from, State::Absent);
                self.set(to, State::Absent);
                for (q, s) in moved {
                    if let Some(at) = rebase(&q, from, to) {
                        if s.is_dir() {
                            self.full.insert(at.clone());
                        }
                        self.cur.insert(at, s);
                    }
                }
                self.renames.push((from.clone(), to.clone()));
            }
            PlanOp::Delete { path, .. } => {
                self.ensure_tree(path)?;
                self.set(path, State::Absent);
            }
        }
        Ok(())
    }
}

/// One step of putting an accept's directory renames back (see [`rename_back`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackStep {
    /// Remove what the accept left where a renamed directory goes back.
    Delete(PathBuf),
    /// Rename the directory at `from` (where the accept put it) back to `to`.
    Rename { from: PathBuf, to: PathBuf },
}

fn below<'m, T>(
    map: &'m BTreeMap<PathBuf, Option<T>>,
    p: &'m Path,
) -> impl Iterator<Item = (&'m PathBuf, &'m Option<T>)> + 'm {
    map.range::<Path, _>((std::ops::Bound::Included(p), std::ops::Bound::Unbounded))
        .take_while(move |(q, _)| q.starts_with(p))
}

/// Undo an accept's directory `renames` (in plan order) on `map` (every path the accept
/// changed, in the namespace after it, with what is there or `None`), newest first: what
/// the accept left where a directory goes back is removed first, then the directory is
/// renamed back. A rename whose directory is no longer one, whose old parent is gone or
/// that `skip` refuses is left out (its contents come back from the store, or not at all).
/// Shared by [`record`] (which keeps the contents the renames will not bring back) and
/// `shade undo` (which replays the steps): the two must agree.
pub fn rename_back<T: Clone>(
    map: &mut BTreeMap<PathBuf, Option<T>>,
    renames: &[(PathBuf, PathBuf)],
    is_dir: impl Fn(&T) -> bool,
    mut skip: impl FnMut(&Path, &Path, &BTreeMap<PathBuf, Option<T>>) -> bool,
) -> Vec<BackStep> {
    let mut steps = Vec::new();
    for (from, to) in renames.iter().rev() {
        if !matches!(map.get(to.as_path()), Some(Some(v)) if is_dir(v)) {
            continue;
        }
        let parent_ok = from
            .ancestors()
            .skip(1)
            .filter(|a| !a.as_os_str().is_empty())
            .all(|a| match map.get(a) {
                None => true,
                Some(None) => false,
                Some(Some(v)) => is_dir(v),
            });
        if !parent_ok || skip(from, to, map) {
            continue;
        }
        let occupied: Vec<PathBuf> = below(map, from)
            .filter(|(_, v)| v.is_some())
            .map(|(q, _)| q.clone())
            .collect();
        if !occupied.is_empty() {
            steps.push(BackStep::Delete(from.clone()));
            for q in occupied {
                map.insert(q, None);
            }
        }
        let moving: Vec<(PathBuf, T)> = below(map, to)
            .filter_map(|(q, v)| v.clone().map(|v| (q.clone(), v)))
            .collect();
        for (q, v) in moving {
            map.insert(q.clone(), None);
            if let Some(at) = rebase(&q, to, from) {
                map.insert(at, Some(v));
            }
        }
        steps.push(BackStep::Rename {
            from: to.clone(),
            to: from.clone(),
        });
    }
    steps
}

/// A plan's directory renames as the user made them: each from where it was to where it
/// ended, without the temporary names (`.shade-move-…` at the root) a plan moves
/// directories through.
pub fn shown_renames(renames: &[(PathBuf, PathBuf)]) -> Vec<(PathBuf, PathBuf)> {
    let temp = |p: &Path| {
        p.components()
            .next()
            .is_some_and(|c| c.as_os_str().as_bytes().starts_with(b".shade-move-"))
    };
    let mut out = Vec::new();
    for (i, (f, t)) in renames.iter().enumerate() {
        if temp(f) && f.components().count() == 1 {
            continue; // the second leg of a move through a temporary name
        }
        let mut from = f.clone();
        for (pf, pt) in renames[..i].iter().rev() {
            if let Some(b) = rebase(&from, pt, pf) {
                from = b;
            }
        }
        let mut to = t.clone();
        for (nf, nt) in &renames[i + 1..] {
            if let Some(b) = rebase(&to, nf, nt) {
                to = b;
            }
        }
        if !temp(&from) && !temp(&to) {
            out.push((from, to));
        }
    }
    out
}

/// Room kept free on the state directory's disk: the history never fills it.
const FREE_MARGIN: u64 = 512 << 20;

fn free_bytes(dir: &Path) -> io::Result<u64> {
    let d = sys::open_dir_path(dir)?;
    // SAFETY: fstatvfs fills the struct we pass, on a descriptor we hold.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstatvfs(d.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// Record (before the accept's commit point, with the project locked and checked) what
/// `plan` will change in the project at `root`: before-contents an undo cannot find in
/// the project go to the store, and the entry is written durably. When those contents
/// would take more than the retention's `max_bytes`, or than the state directory's disk
/// has free (less a margin), nothing is copied, and the accept is refused (an error:
/// nothing is written) unless `anyway` (the user's `--force`): then the entry says the
/// accept cannot be undone and it goes ahead. A command decides how much it deletes and
/// how full the state directory's disk is (its outside layer may live there), so it must
/// not decide that what it destroys cannot be had back. Returns the entry's path, and why
/// it is not undoable if it is not; `None` when history is off or not kept for this root.
pub fn record(
    history: &Path,
    root_fd: RawFd,
    root: &Path,
    id: &str,
    plan: &mut [PlanOp],
    anyway: bool,
) -> io::Result<Option<(PathBuf, Option<String>)>> {
    if retention().keep == 0 {
        return Ok(None);
    }
    let _lock = lock(history)?;
    let mut store = Objects::open(history)?;
    let mut cap = Capture {
        walker: Walker::new(root_fd),
        before: BTreeMap::new(),
        cur: BTreeMap::new(),
        full: BTreeSet::new(),
        renames: Vec::new(),
    };
    for op in plan.iter_mut() {
        cap.op(op)?;
    }
    let Capture {
        mut walker,
        before,
        cur,
        renames,
        ..
    } = cap;
    let mut paths: BTreeSet<&PathBuf> = before.keys().collect();
    paths.extend(cur.keys());
    // Paths below a rename's ends are listed even when unchanged in place: undo moves them.
    let ends: Vec<&PathBuf> = renames.iter().flat_map(|(f, t)| [f, t]).collect();
    let moved = |p: &Path| ends.iter().any(|e| p.starts_with(e));
    // What the project holds after the accept once its renames are undone: a before-content
    // found there again need not be kept.
    let mut back: BTreeMap<PathBuf, Option<State>> = paths
        .iter()
        .map(|p| ((*p).clone(), cur.get(*p).filter(|s| s.present()).cloned()))
        .collect();
    if !renames.is_empty() {
        rename_back(&mut back, &renames, State::is_dir, |_, _, _| false);
    }
    let mut changes = Vec::new();
    let mut keep: Vec<(PathBuf, String, u64)> = Vec::new();
    for p in paths {
        let b = before.get(p).cloned().unwrap_or(State::Absent);
        let a = cur.get(p).cloned().unwrap_or(State::Absent);
        if b == a && !(moved(p) && b.present()) {
            continue;
        }
        if let State::File {
            sha256,
            size,
            mtime,
            ..
        } = &b
        {
            // The same content back in place (a file of a renamed tree, never read: by its
            // size and times as well).
            let found = matches!(
                back.get(p),
                Some(Some(State::File { sha256: h, size: s2, mtime: m2, .. }))
                    if h == sha256 && (!h.is_empty() || (s2 == size && m2 == mtime))
            );
            if !found {
                keep.push((p.clone(), sha256.clone(), *size));
            }
        }
        changes.push(Change {
            path: JPath::new(p),
            before: b,
            after: a,
        });
    }
    let kept_bytes: u64 = keep.iter().map(|(_, _, s)| *s).sum();
    // Each distinct content once; what the store holds already costs nothing. (A file of a
    // renamed tree was not read: its hash is not known yet.)
    let mut seen = BTreeSet::new();
    keep.retain(|(_, h, _)| {
        h.is_empty() || (seen.insert(h.clone()) && !store.dir.join(h).exists())
    });
    let mut need = 0u64;
    for (p, _, size) in &keep {
        super::stage::check_cancel()?;
        let (parent, name) = walker.open_parent(p)?;
        let f = sys::open_file_at(parent.as_raw_fd(), &name)?;
        let m = f.metadata()?;
        use std::os::unix::fs::MetadataExt;
        need = need.saturating_add((*size).min(m.blocks().saturating_mul(512)));
    }
    let r = retention();
    let free = free_bytes(&store.dir)?;
    let not_kept = if need > r.max_bytes {
        Some(format!(
            "its earlier contents ({}) are more than the history keeps ([history] max_size = {})",
            crate::units::format_size(need),
            crate::units::format_size(r.max_bytes)
        ))
    } else if need.saturating_add(FREE_MARGIN) > free {
        Some(format!(
            "its earlier contents ({}) do not fit in the {} free on the state directory's disk \
             (less a margin of {})",
            crate::units::format_size(need),
            crate::units::format_size(free),
            crate::units::format_size(FREE_MARGIN)
        ))
    } else {
        None
    };
    if let (Some(why), false) = (&not_kept, anyway) {
        return Err(io::Error::other(format!(
            "the accept could not be undone: {why}; nothing was written (free space on the \
             state directory's disk or raise [history] max_size, or accept with --force to \
             do without undo)"
        )));
    }
    let mut bytes = 0;
    if not_kept.is_none() {
        for (p, sha256, _) in &keep {
            let (parent, name) = walker.open_parent(p)?;
            let mut f = sys::open_file_at(parent.as_raw_fd(), &name)?;
            let (got, _) = store.put(&mut f)?;
            if sha256.is_empty() {
                // Now it is known (the change is found by its path: `changes` is in order).
                if let Ok(i) = changes.binary_search_by(|c| c.path.path().cmp(p.as_path())) {
                    if let State::File { sha256: h, .. } = &mut changes[i].before {
                        *h = got;
                    }
                }
            } else if &got != sha256 {
                return Err(io::Error::other(format!(
                    "{} changed while the accept recorded it",
                    p.display()
                )));
            }
        }
        bytes = kept_bytes;
        store.sync()?;
    }
    let entry = Entry {
        version: VERSION,
        id: id.to_string(),
        root: JPath::new(root),
        time_ns: super::now_ns(),
        origin: origin(),
        undoes: undoes(),
        paths: changes.len(),
        changes,
        bytes,
        evicted: false,
        dropped: None,
        renames: renames
            .iter()
            .map(|(f, t)| (JPath::new(f), JPath::new(t)))
            .collect(),
        not_kept: not_kept.clone(),
    };
    store_entry(history, &entry)?;
    if let Some(why) = &not_kept {
        tracing::warn!(
            "accept {id} cannot be undone: {why}; it is applied all the same (`shade log` \
             marks it not undoable)"
        );
    }
    Ok(Some((entry_path(history, id), not_kept)))
}

fn changes_path(history: &Path, id: &str) -> PathBuf {
    entries_dir(history).join(format!("{id}.changes"))
}

/// Write `bytes` to `path` through a temp file, fsynced, renamed into place.
fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        sys::fsync(&f)?;
    }
    std::fs::rename(&tmp, path)
}

/// Write an entry: its changes, then the entry file (whose presence says it is complete).
pub fn store_entry(history: &Path, e: &Entry) -> io::Result<()> {
    let dir = entries_dir(history);
    std::fs::create_dir_all(&dir)?;
    let changes = serde_json::to_vec(&e.changes).map_err(io::Error::other)?;
    write_atomic(&changes_path(history, &e.id), &changes)?;
    store_head(history, e)
}

/// Rewrite only an entry's own file (its changes stay as they are).
fn store_head(history: &Path, e: &Entry) -> io::Result<()> {
    let dir = entries_dir(history);
    let bytes = serde_json::to_vec(e).map_err(io::Error::other)?;
    write_atomic(&entry_path(history, &e.id), &bytes)?;
    sys::fsync(&sys::open_dir_path(&dir)?)
}

/// Fill `e.changes` from its changes file.
pub fn load_changes(history: &Path, e: &mut Entry) -> io::Result<()> {
    if !super::guard::valid_id(&e.id) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("history entry id {:?} is not one shade makes", e.id),
        ));
    }
    let p = changes_path(history, &e.id);
    super::guard::owned(&p)?;
    let bytes = std::fs::read(&p)?;
    e.changes = serde_json::from_slice(&bytes).map_err(|err| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {err}", p.display()),
        )
    })?;
    Ok(())
}

/// Remove the entry of accept `id` (it rolled back: nothing of it is in the project).
pub fn discard(history: &Path, id: &str) -> io::Result<()> {
    let dir = entries_dir(history);
    for p in [
        entry_path(history, id),
        dir.join(format!("{id}.json.tmp")),
        changes_path(history, id),
        dir.join(format!("{id}.changes.tmp")),
    ] {
        match std::fs::remove_file(p) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    match sys::open_dir_path(&dir) {
        Ok(d) => sys::fsync(&d),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Create `dir` (and its parents) readable by its owner only: earlier contents of the
/// user's files (an overwritten `.env` among them) are kept here.
fn private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let m = std::fs::metadata(dir)?;
    if m.permissions().mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// The history lock: shared by recording (objects written, entry not yet), exclusive for
/// eviction (which removes objects no entry refers to).
fn lock_file(history: &Path) -> io::Result<std::fs::File> {
    private_dir(history)?;
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(history.join("lock"))
}

fn lock(history: &Path) -> io::Result<std::fs::File> {
    let f = lock_file(history)?;
    // SAFETY: plain syscall on an fd we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(f)
}

/// Every entry in `history`, oldest first (unreadable ones skipped with a warning), without
/// their changes (see [`load_changes`]).
pub fn entries(history: &Path) -> io::Result<Vec<Entry>> {
    let dir = entries_dir(history);
    let rd = match std::fs::read_dir(&dir) {
        Ok(r) => r,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    // Entries shade did not write (a command's tree put in the history's place) are never
    // believed: `shade undo` would replay them.
    super::guard::owned(history)?;
    super::guard::owned(&dir)?;
    let mut out = Vec::new();
    for d in rd {
        let p = d?.path();
        if p.extension() != Some(OsStr::new("json")) {
            continue;
        }
        super::guard::owned(&p)?;
        match std::fs::read(&p).and_then(|b| {
            serde_json::from_slice::<Entry>(&b)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
        }) {
            Ok(e) => out.push(e),
            Err(e) => tracing::warn!(entry = %p.display(), error = %e, "history entry skipped"),
        }
    }
    out.sort_by(|a, b| (a.time_ns, &a.id).cmp(&(b.time_ns, &b.id)));
    Ok(out)
}

/// Apply the retention: evict the oldest entries past `keep` accepts or `max_bytes`, except
/// any whose journal (in `journals`) is still live; then drop contents no entry keeps.
pub fn evict(history: &Path, journals: &Path, r: Retention) -> io::Result<Vec<String>> {
    let lockf = lock_file(history)?;
    // SAFETY: plain syscall on an fd we own.
    if unsafe { libc::flock(lockf.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut all = entries(history)?;
    let mut evicted = Vec::new();
    let mut kept = 0usize;
    let mut total = 0u64;
    // Once one is evicted, every older one is too: what can be undone is always the newest.
    let mut evicting = false;
    for e in all.iter_mut().rev() {
        if e.evicted {
            continue;
        }
        let live = super::journal::journal_path(journals, &e.id).exists();
        evicting |= kept > 0 && (kept >= r.keep || total + e.bytes > r.max_bytes);
        if live || !evicting {
            kept += 1;
            total += e.bytes;
            continue;
        }
        e.evicted = true;
        store_head(history, e)?;
        evicted.push(e.id.clone());
    }
    if evicted.is_empty() {
        return Ok(evicted);
    }
    for e in all.iter_mut().filter(|e| !e.evicted) {
        // An entry whose changes cannot be read keeps every content (nothing is dropped).
        load_changes(history, e)?;
    }
    let used: BTreeSet<String> = all
        .iter()
        .filter(|e| !e.evicted)
        .flat_map(|e| e.changes.iter())
        .filter_map(|c| match &c.before {
            State::File { sha256, .. } => Some(sha256.clone()),
            _ => None,
        })
        .collect();
    let rd = match std::fs::read_dir(objects_dir(history)) {
        Ok(r) => r,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(evicted),
        Err(e) => return Err(e),
    };
    for d in rd {
        let d = d?;
        let name = d.file_name();
        let name = name.to_string_lossy();
        if let Some(rest) = name.strip_prefix(".tmp-") {
            // A content being written, or left by a writer that died: only the latter goes.
            let pid = rest.split('-').next().and_then(|p| p.parse::<i32>().ok());
            if pid.is_some_and(|p| p == std::process::id() as i32 || sys::process_alive(p)) {
                continue;
            }
        } else if name.starts_with('.') || used.contains(name.as_ref()) {
            continue;
        }
        match std::fs::remove_file(d.path()) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(evicted)
}

/// Open a project root as accept does (for [`read_state`] and [`observe`]).
pub fn open_root(root: &Path) -> io::Result<std::os::fd::OwnedFd> {
    sys::open_dir_path(root)
}

/// The base (identity and version) of `path` beneath `root` now, never following a symlink;
/// a path behind a symlinked or missing parent is absent.
pub fn observe(root: RawFd, path: &Path) -> io::Result<crate::fingerprint::Base> {
    Ok(super::safe_path::observe(root, path)?.base())
}

/// Whether accept `id` of `all` is undone: an undo of it exists that is not undone itself.
pub fn undone_by<'a>(all: &'a [Entry], id: &str) -> Option<&'a Entry> {
    fn undone(all: &[Entry], id: &str, depth: usize) -> Option<usize> {
        if depth > all.len() {
            return None;
        }
        all.iter()
            .enumerate()
            .rev()
            .filter(|(_, e)| e.undoes.as_deref() == Some(id))
            .find(|(_, e)| undone(all, &e.id, depth + 1).is_none())
            .map(|(i, _)| i)
    }
    undone(all, id, 0).map(|i| &all[i])
}

/// Whether this process runs as root (and so restores owners).
pub fn is_root() -> bool {
    sys::is_root()
}
