//! Base fingerprints: what a lower path looked like when a branch first overrode it.
//!
//! Accept compares these against lower *now*; any difference means the user (or another
//! branch) changed the path meanwhile, and accepting would clobber their work.

use serde::{Deserialize, Serialize};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Identity and version of one lower file system object, cheap to take with one `lstat`.
///
/// `ctime` changes on every write, chmod, rename-into-place or truncate and cannot be set by
/// user space, so together with dev/ino it detects any change without hashing content.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprint {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    /// `st_mode` including the file type bits, so a file replaced by a directory is caught.
    pub mode: u32,
}

impl Fingerprint {
    /// Fingerprint of the object at `path` itself (a symlink is not followed).
    pub fn of_path(path: &Path) -> io::Result<Fingerprint> {
        Ok(Self::from_metadata(&std::fs::symlink_metadata(path)?))
    }

    /// Fingerprint from metadata already at hand (e.g. from `fstatat`).
    pub fn from_metadata(m: &std::fs::Metadata) -> Fingerprint {
        Fingerprint {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
            ctime_ns: m.ctime() * 1_000_000_000 + m.ctime_nsec(),
            mode: m.mode(),
        }
    }

    /// Fingerprint from a raw `stat` buffer, the form the overlay's hot paths have.
    pub fn from_stat(st: &libc::stat) -> Fingerprint {
        Fingerprint {
            dev: st.st_dev,
            ino: st.st_ino,
            size: st.st_size as u64,
            mtime_ns: st.st_mtime * 1_000_000_000 + st.st_mtime_nsec,
            ctime_ns: st.st_ctime * 1_000_000_000 + st.st_ctime_nsec,
            mode: st.st_mode,
        }
    }

    /// Whether this object is a directory (directories are compared by identity only:
    /// files appearing inside them are not a conflict for the directory itself).
    pub fn is_dir(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFDIR
    }

    /// Whether `now` is the same object in the same version as `self`.
    pub fn matches(&self, now: &Fingerprint) -> bool {
        if self.is_dir() {
            now.is_dir() && self.dev == now.dev && self.ino == now.ino
        } else {
            self == now
        }
    }
}

/// What a branch expects to find at a lower path when it accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Base {
    /// The path did not exist in lower when the branch created it.
    Absent,
    /// The path existed, in this version.
    Present(Fingerprint),
}

impl Base {
    /// Observe the base of `path` now.
    pub fn observe(path: &Path) -> io::Result<Base> {
        match std::fs::symlink_metadata(path) {
            Ok(m) => Ok(Base::Present(Fingerprint::from_metadata(&m))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Base::Absent),
            Err(e) => Err(e),
        }
    }

    /// Whether lower at `path` still matches this base.
    pub fn still_holds(&self, path: &Path) -> io::Result<bool> {
        Ok(match (self, Base::observe(path)?) {
            (Base::Absent, Base::Absent) => true,
            (Base::Present(then), Base::Present(now)) => then.matches(&now),
            _ => false,
        })
    }
}
