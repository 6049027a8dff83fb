//! What client and branch server say to each other: one JSON object per line each way.
//! Paths travel as bytes (a project may hold names that are not UTF-8), and the engine's
//! results (changes, accept reports and refusals) as plain copies rebuilt on the client, so
//! the client prints exactly what an in-process `shade run` prints.

use crate::{AcceptError, AcceptReport, Base, Change, ChangeKind, Conflict, LimitHit, NotApplied};
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// A path as its bytes.
pub type Bytes = Vec<u8>;

/// `p` as bytes for the wire.
pub fn bytes(p: &Path) -> Bytes {
    p.as_os_str().as_bytes().to_vec()
}

/// The path `b` names.
pub fn path(b: Bytes) -> PathBuf {
    PathBuf::from(OsString::from_vec(b))
}

/// A client's request.
#[derive(Serialize, Deserialize, Debug)]
pub enum Request {
    /// Mount a branch of `project` for this client (one per connection).
    Create {
        project: Bytes,
        /// `IdShift::base`, for a branch shown to a user namespace.
        id_shift: Option<u32>,
        size: Option<u64>,
        metadata: Option<u64>,
        memory_budget: u64,
        /// [`crate::BranchOptions::hide_credentials`].
        hide_credentials: bool,
        /// What the client's environment hides (`branch::hidden_paths`).
        also_hide: Vec<Bytes>,
    },
    /// The limits the branch reached since the last ask, as the lines to print.
    LimitHits,
    /// The same as the engine's values ([`Reply::Hits`]), for a client that reports them
    /// (the agent's shell tool).
    LimitsHit,
    Changeset {
        include_ignored: bool,
    },
    Diff {
        changes: Vec<WireChange>,
    },
    CheckAccept {
        include_ignored: bool,
        force: bool,
    },
    /// Accept and drop the branch; `origin` is the client's command line for the history.
    Accept {
        include_ignored: bool,
        force: bool,
        origin: String,
        /// See `Drop`.
        #[serde(default)]
        reusable: bool,
    },
    /// Drop the branch.
    Drop {
        /// The client's word that nothing of its commands can still refer into the branch
        /// (it ran them, so only it knows: allowed sockets, containment, survivors). Without
        /// it (`false`, the default) the connection is aborted, never pooled; with it the
        /// server still makes its own checks before pooling.
        #[serde(default)]
        reusable: bool,
    },
    /// Keep the branch but let its connection go while the client is idle (`shade mcp`'s
    /// many idle branches): the server detaches it (`Branch::detach`: its connection is
    /// reset into the pool, the branch keeps its changes and reads) and answers
    /// [`Reply::Parked`]; the client then closes this socket, so an idle branch costs it
    /// no descriptor and the server no thread. `reusable` as for `Drop`: without it the
    /// connection is torn down, never pooled. Refused (the branch stays attached, the
    /// conversation goes on) while something refers into the mount.
    Park {
        #[serde(default)]
        reusable: bool,
    },
    /// On a new connection: attach the branch parked under `token` again and serve it
    /// here, as if just created ([`Reply::Created`], with its new mount point).
    Resume {
        token: String,
    },
    /// On a new connection: answer `request`, one that only reads the branch (limits,
    /// changes, diff, the accept check), for the branch parked under `token`, which stays
    /// parked.
    OnParked {
        token: String,
        request: Box<Request>,
    },
    /// On a new connection: drop the branch parked under `token` (its client ended it
    /// while it was idle).
    Forget {
        token: String,
    },
}

/// The server's answer to one request.
#[derive(Serialize, Deserialize, Debug)]
pub enum Reply {
    Created {
        mountpoint: Bytes,
        outside_dir: Bytes,
        /// The connection served an earlier branch (the pool).
        reused: bool,
        server_pid: u32,
        /// The mount's device, as the server sees it (the client checks it sees the same).
        dev: u64,
    },
    Lines(Vec<String>),
    Hits(Vec<WireHit>),
    Changes(Vec<WireChange>),
    Text(String),
    Done,
    Accepted(WireReport),
    Refused(WireAcceptError),
    /// The branch is parked (`Request::Park`): `token`, a secret only this client has, names
    /// it to `Resume` or `Forget`.
    Parked {
        token: String,
    },
    /// The request failed (a branch that could not be made, a bad request).
    Error(String),
}

/// A branch's [`LimitHit`] (the branch reports only its own budgets).
#[derive(Serialize, Deserialize, Debug, Clone, Copy)]
pub enum WireHit {
    /// [`LimitHit::BranchSize`].
    Size(u64),
    /// [`LimitHit::BranchMetadata`].
    Metadata(u64),
}

impl WireHit {
    /// `h` for the wire; `None` for a limit that is not the branch's.
    pub fn of(h: &LimitHit) -> Option<WireHit> {
        match h {
            LimitHit::BranchSize(n) => Some(WireHit::Size(*n)),
            LimitHit::BranchMetadata(n) => Some(WireHit::Metadata(*n)),
            _ => None,
        }
    }

    /// The engine's value.
    pub fn hit(self) -> LimitHit {
        match self {
            WireHit::Size(n) => LimitHit::BranchSize(n),
            WireHit::Metadata(n) => LimitHit::BranchMetadata(n),
        }
    }
}

/// A [`Change`].
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct WireChange {
    kind: char,
    path: Bytes,
    old_path: Option<Bytes>,
    is_dir: bool,
    ignored: bool,
    mode: Option<(u32, u32)>,
    owner: Option<((u32, u32), (u32, u32))>,
}

impl From<&Change> for WireChange {
    fn from(c: &Change) -> Self {
        WireChange {
            kind: c.kind.letter(),
            path: bytes(&c.path),
            old_path: c.old_path.as_deref().map(bytes),
            is_dir: c.is_dir,
            ignored: c.ignored,
            mode: c.mode,
            owner: c.owner,
        }
    }
}

impl WireChange {
    /// The change, or `None` for an unknown kind letter.
    pub fn change(self) -> Option<Change> {
        let kind = match self.kind {
            'A' => ChangeKind::Added,
            'M' => ChangeKind::Modified,
            'D' => ChangeKind::Deleted,
            'R' => ChangeKind::Renamed,
            _ => return None,
        };
        let mut c = Change::new(kind, path(self.path), self.old_path.map(path), self.is_dir);
        c.ignored = self.ignored;
        c.mode = self.mode;
        c.owner = self.owner;
        Some(c)
    }
}

/// An [`AcceptReport`].
#[derive(Serialize, Deserialize, Debug)]
pub struct WireReport {
    written: usize,
    created_dirs: usize,
    renamed_dirs: usize,
    deleted: usize,
    not_applied: Vec<(Bytes, String, Option<Bytes>)>,
    privileges_dropped: Vec<Bytes>,
}

impl From<&AcceptReport> for WireReport {
    fn from(r: &AcceptReport) -> Self {
        WireReport {
            written: r.written,
            created_dirs: r.created_dirs,
            renamed_dirs: r.renamed_dirs,
            deleted: r.deleted,
            not_applied: r
                .not_applied
                .iter()
                .map(|n| {
                    (
                        bytes(&n.path),
                        n.reason.clone(),
                        n.kept_at.as_deref().map(bytes),
                    )
                })
                .collect(),
            privileges_dropped: r.privileges_dropped.iter().map(|p| bytes(p)).collect(),
        }
    }
}

impl From<WireReport> for AcceptReport {
    fn from(w: WireReport) -> Self {
        AcceptReport {
            written: w.written,
            created_dirs: w.created_dirs,
            renamed_dirs: w.renamed_dirs,
            deleted: w.deleted,
            not_applied: w
                .not_applied
                .into_iter()
                .map(|(p, reason, kept)| NotApplied {
                    path: path(p),
                    reason,
                    kept_at: kept.map(path),
                })
                .collect(),
            privileges_dropped: w.privileges_dropped.into_iter().map(path).collect(),
        }
    }
}

/// An `io::Error`: its errno when it has one, and its text.
#[derive(Serialize, Deserialize, Debug)]
pub struct WireIo {
    errno: Option<i32>,
    text: String,
}

impl From<&std::io::Error> for WireIo {
    fn from(e: &std::io::Error) -> Self {
        WireIo {
            errno: e.raw_os_error(),
            text: e.to_string(),
        }
    }
}

impl From<WireIo> for std::io::Error {
    fn from(w: WireIo) -> Self {
        // The same error when the errno says all of it (the text then reads the same).
        if let Some(n) = w.errno {
            let e = std::io::Error::from_raw_os_error(n);
            if e.to_string() == w.text {
                return e;
            }
        }
        std::io::Error::other(w.text)
    }
}

/// A [`Conflict`].
#[derive(Serialize, Deserialize, Debug)]
pub struct WireConflict {
    path: Bytes,
    expected: Base,
    found: Base,
    read: bool,
}

/// An [`AcceptError`].
#[derive(Serialize, Deserialize, Debug)]
pub enum WireAcceptError {
    Conflicts(Vec<WireConflict>),
    Unsafe {
        path: Bytes,
        reason: String,
    },
    Owner {
        path: Bytes,
        uid: u32,
        gid: u32,
        own: (u32, u32),
    },
    Io {
        path: Bytes,
        source: WireIo,
    },
    Unfinished {
        id: String,
        path: Bytes,
        source: WireIo,
        done: usize,
        total: usize,
    },
    StagingLeft {
        path: Bytes,
        source: WireIo,
        staging: Bytes,
    },
}

impl From<&AcceptError> for WireAcceptError {
    fn from(e: &AcceptError) -> Self {
        match e {
            AcceptError::Conflicts(list) => WireAcceptError::Conflicts(
                list.iter()
                    .map(|c| WireConflict {
                        path: bytes(&c.path),
                        expected: c.expected,
                        found: c.found,
                        read: c.read,
                    })
                    .collect(),
            ),
            AcceptError::Unsafe { path, reason } => WireAcceptError::Unsafe {
                path: bytes(path),
                reason: reason.clone(),
            },
            AcceptError::Owner {
                path,
                uid,
                gid,
                own,
            } => WireAcceptError::Owner {
                path: bytes(path),
                uid: *uid,
                gid: *gid,
                own: *own,
            },
            AcceptError::Io { path, source } => WireAcceptError::Io {
                path: bytes(path),
                source: source.into(),
            },
            AcceptError::Unfinished {
                id,
                path,
                source,
                done,
                total,
            } => WireAcceptError::Unfinished {
                id: id.clone(),
                path: bytes(path),
                source: source.into(),
                done: *done,
                total: *total,
            },
            AcceptError::StagingLeft {
                path,
                source,
                staging,
            } => WireAcceptError::StagingLeft {
                path: bytes(path),
                source: source.into(),
                staging: bytes(staging),
            },
        }
    }
}

impl From<WireAcceptError> for AcceptError {
    fn from(w: WireAcceptError) -> Self {
        match w {
            WireAcceptError::Conflicts(list) => AcceptError::Conflicts(
                list.into_iter()
                    .map(|c| Conflict {
                        path: path(c.path),
                        expected: c.expected,
                        found: c.found,
                        read: c.read,
                    })
                    .collect(),
            ),
            WireAcceptError::Unsafe { path: p, reason } => AcceptError::Unsafe {
                path: path(p),
                reason,
            },
            WireAcceptError::Owner {
                path: p,
                uid,
                gid,
                own,
            } => AcceptError::Owner {
                path: path(p),
                uid,
                gid,
                own,
            },
            WireAcceptError::Io { path: p, source } => AcceptError::Io {
                path: path(p),
                source: source.into(),
            },
            WireAcceptError::Unfinished {
                id,
                path: p,
                source,
                done,
                total,
            } => AcceptError::Unfinished {
                id,
                path: path(p),
                source: source.into(),
                done,
                total,
            },
            WireAcceptError::StagingLeft {
                path: p,
                source,
                staging,
            } => AcceptError::StagingLeft {
                path: path(p),
                source: source.into(),
                staging: path(staging),
            },
        }
    }
}
