//! Staging: every new file and symlink is fully written (content, mode, owner, fsync) into
//! `.shade-accept-<id>/<n>` at the project root before the commit point, so that applying
//! is only renames — each atomic, each a whole old or a whole new file.
//!
//! The staging dir lives on the project root's file system; a target on a nested mount gets
//! an EXDEV fallback at apply time (see `exec`).

use super::{fault, sys};
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Seek, SeekFrom};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use crate::plan::Perms;

/// Create the (empty) staging dir `name` under `root`, mode 0700.
pub fn create_dir(root: &OwnedFd, name: &str) -> io::Result<OwnedFd> {
    fault::step()?;
    sys::mkdir_at(root.as_raw_fd(), OsStr::new(name), 0o700)?;
    sys::open_dir_at(root.as_raw_fd(), OsStr::new(name))
}

/// Above this many staged files one `syncfs` replaces the per-file `fsync`s.
pub const SYNC_EACH_MAX: usize = 64;

/// Stage a regular file: copy `content` from its start, set perms, and fsync it unless the
/// caller syncs the whole file system afterwards (`sync_each == false`).
pub fn file(
    staging: &OwnedFd,
    n: usize,
    content: &mut File,
    perms: &Perms,
    sync_each: bool,
) -> io::Result<()> {
    fault::step()?;
    let name = n.to_string();
    let mut out = sys::create_file_at(staging.as_raw_fd(), OsStr::new(&name), true)?;
    content.seek(SeekFrom::Start(0))?;
    io::copy(content, &mut out)?;
    set_perms(&out, perms)?;
    if sync_each {
        sys::fsync(&out)?;
    }
    Ok(())
}

/// Stage a new, empty directory (its mode, owner and times are set once it is in place).
pub fn dir(staging: &OwnedFd, n: usize) -> io::Result<()> {
    fault::step()?;
    sys::mkdir_at(staging.as_raw_fd(), OsStr::new(&n.to_string()), 0o700)
}

/// Stage a symlink.
pub fn symlink(staging: &OwnedFd, n: usize, target: &Path) -> io::Result<()> {
    fault::step()?;
    sys::symlink_at(
        target.as_os_str(),
        staging.as_raw_fd(),
        OsStr::new(&n.to_string()),
    )
}

/// Stage a fifo, socket or device node (`mode` with its type bits) with its owner, mode
/// and times. A device node needs root (CAP_MKNOD): without it this fails, before the
/// commit point, naming the path.
pub fn special(staging: &OwnedFd, n: usize, mode: u32, rdev: u64, perms: &Perms) -> io::Result<()> {
    fault::step()?;
    let name = n.to_string();
    let name = OsStr::new(&name);
    sys::mknod_at(staging.as_raw_fd(), name, mode & libc::S_IFMT | 0o600, rdev)?;
    sys::chown_chmod_at(staging.as_raw_fd(), name, perms.uid, perms.gid, perms.mode)?;
    if let Some((atime, mtime)) = perms.times {
        sys::set_times_at(staging.as_raw_fd(), name, atime, mtime)?;
    }
    Ok(())
}

/// Give an open file or directory its owner (when running as root), mode, extended
/// attributes and times.
pub fn set_perms(f: &impl AsRawFd, perms: &Perms) -> io::Result<()> {
    let fd = f.as_raw_fd();
    if sys::is_root() && (perms.uid.is_some() || perms.gid.is_some()) {
        sys::fchown(fd, perms.uid, perms.gid)?;
    }
    if let Some(want) = &perms.xattrs {
        // Only names we may have set ourselves are removed: a file system's own
        // attributes (security.selinux, system.*) stay.
        for name in sys::list_xattrs(fd)? {
            let ours = name.starts_with(b"user.") || name.starts_with(b"trusted.");
            if ours && !want.iter().any(|(n, _)| *n == name) {
                sys::remove_xattr(fd, &name)?;
            }
        }
        for (name, value) in want {
            sys::set_xattr(fd, name, value)?;
        }
    }
    // chown clears setuid/setgid bits (and so may a file capability), so the mode goes last.
    sys::fchmod(fd, perms.mode)?;
    if let Some((atime, mtime)) = perms.times {
        sys::set_times_at(fd, OsStr::new(""), atime, mtime)?;
    }
    Ok(())
}
