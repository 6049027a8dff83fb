//! Objects that live in a branch's override layer.

use crate::content::Content;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::SystemTime;

/// What `stat` shows of an overridden object besides its size.
#[derive(Clone, Debug)]
pub(crate) struct Meta {
    /// Permission bits including setuid/setgid/sticky (`mode & 0o7777`).
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    pub rdev: u32,
    pub xattrs: BTreeMap<OsString, Vec<u8>>,
}

impl Meta {
    /// Metadata of a fresh object created by `uid:gid`.
    pub fn new(perm: u32, uid: u32, gid: u32) -> Meta {
        let now = SystemTime::now();
        Meta {
            perm,
            uid,
            gid,
            atime: now,
            mtime: now,
            ctime: now,
            rdev: 0,
            xattrs: BTreeMap::new(),
        }
    }

    /// Metadata copied from a lower `stat` (copy-up keeps owner, mode and times).
    pub fn from_stat(st: &libc::stat) -> Meta {
        Meta {
            perm: st.st_mode & 0o7777,
            uid: st.st_uid,
            gid: st.st_gid,
            atime: time(st.st_atime, st.st_atime_nsec),
            mtime: time(st.st_mtime, st.st_mtime_nsec),
            ctime: time(st.st_ctime, st.st_ctime_nsec),
            rdev: st.st_rdev as u32,
            xattrs: BTreeMap::new(),
        }
    }

    /// Record a change of the object itself (chmod, chown, link count, xattr).
    pub fn changed(&mut self) {
        self.ctime = SystemTime::now();
    }

    /// Record a change of the object's data (or a directory's entries).
    pub fn modified(&mut self) {
        let now = SystemTime::now();
        self.mtime = now;
        self.ctime = now;
    }
}

/// Convert a `stat` time to `SystemTime` (negative times included).
pub(crate) fn time(secs: i64, nsecs: i64) -> SystemTime {
    if secs >= 0 {
        SystemTime::UNIX_EPOCH + std::time::Duration::new(secs as u64, nsecs as u32)
    } else {
        SystemTime::UNIX_EPOCH - std::time::Duration::new(secs.unsigned_abs(), 0)
            + std::time::Duration::new(0, nsecs as u32)
    }
}

/// The kind of a non-directory object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NodeKind {
    File,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

impl NodeKind {
    pub fn from_mode(mode: u32) -> Option<NodeKind> {
        Some(match mode & libc::S_IFMT {
            libc::S_IFREG => NodeKind::File,
            libc::S_IFLNK => NodeKind::Symlink,
            libc::S_IFIFO => NodeKind::Fifo,
            libc::S_IFSOCK => NodeKind::Socket,
            libc::S_IFCHR => NodeKind::CharDevice,
            libc::S_IFBLK => NodeKind::BlockDevice,
            _ => return None,
        })
    }

    /// The `S_IFMT` bits of this kind, for a full `st_mode`.
    pub fn type_bits(self) -> u32 {
        match self {
            NodeKind::File => libc::S_IFREG,
            NodeKind::Symlink => libc::S_IFLNK,
            NodeKind::Fifo => libc::S_IFIFO,
            NodeKind::Socket => libc::S_IFSOCK,
            NodeKind::CharDevice => libc::S_IFCHR,
            NodeKind::BlockDevice => libc::S_IFBLK,
        }
    }

    pub fn file_type(self) -> fuser::FileType {
        match self {
            NodeKind::File => fuser::FileType::RegularFile,
            NodeKind::Symlink => fuser::FileType::Symlink,
            NodeKind::Fifo => fuser::FileType::NamedPipe,
            NodeKind::Socket => fuser::FileType::Socket,
            NodeKind::CharDevice => fuser::FileType::CharDevice,
            NodeKind::BlockDevice => fuser::FileType::BlockDevice,
        }
    }
}

/// Mutable part of a node, under one lock.
pub(crate) struct NodeState {
    pub meta: Meta,
    pub size: u64,
    pub nlink: u32,
}

/// A non-directory object owned by the branch: a created file, a copied-up lower file,
/// a symlink or a special file. Shared by all its hard links (same inode number).
pub(crate) struct Node {
    pub ino: u64,
    pub kind: NodeKind,
    pub state: Mutex<NodeState>,
    /// Bytes of a regular file; `None` for other kinds.
    pub data: RwLock<Option<Content>>,
    /// Target of a symlink.
    pub target: OsString,
    /// The lower path this node was copied up from, for the changeset (rename/modify).
    pub origin: Option<PathBuf>,
}

impl Node {
    /// A node with one link: copy-up and creation differ only in what they pass here.
    pub fn new(
        ino: u64,
        kind: NodeKind,
        meta: Meta,
        size: u64,
        data: Option<Content>,
        target: OsString,
        origin: Option<PathBuf>,
    ) -> Node {
        Node {
            ino,
            kind,
            state: Mutex::new(NodeState {
                meta,
                size,
                nlink: 1,
            }),
            data: RwLock::new(data),
            target,
            origin,
        }
    }

    pub fn state(&self) -> MutexGuard<'_, NodeState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn data(&self) -> RwLockReadGuard<'_, Option<Content>> {
        self.data.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Read a regular file's bytes at `offset` (a short count only at end of file).
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        match self.data().as_ref() {
            Some(c) => c.read_at(buf, offset),
            None => Err(std::io::Error::from_raw_os_error(libc::EINVAL)),
        }
    }

    pub fn data_mut(&self) -> RwLockWriteGuard<'_, Option<Content>> {
        self.data.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A directory the branch has touched: its own metadata, and where its lower children
/// come from (`None`: created in the branch, or removed and re-created — hides lower).
#[derive(Clone, Debug)]
pub(crate) struct DirOver {
    /// Its inode number: the lower directory's, or one from the branch's range for a
    /// directory the branch made; it travels with the directory through renames.
    pub ino: u64,
    pub meta: Meta,
    pub lower: Option<PathBuf>,
    /// Fingerprint of the lower directory at `lower` when the branch first touched it
    /// (the base a directory rename is checked against on accept).
    pub lower_fp: Option<crate::fingerprint::Fingerprint>,
    pub nlink: u32,
}
