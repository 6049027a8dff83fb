//! Staging: every new file and symlink is fully written (content, mode, owner, fsync) into
//! `.shade-accept-<id>/<n>` at the project root before the commit point, so that applying
//! is only renames — each atomic, each a whole old or a whole new file.
//!
//! The staging dir lives on the project root's file system; a target on a nested mount gets
//! an EXDEV fallback at apply time (see `exec`).

use super::{fault, sys};
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
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
    let out = sys::create_file_at(staging.as_raw_fd(), OsStr::new(&name), true)?;
    copy_sparse(content, &out)?;
    set_perms(&out, perms)?;
    if sync_each {
        sys::fsync(&out)?;
    }
    Ok(())
}

/// Copy unit: between two of them a cancel (a signal before the commit point) is noticed.
const CHUNK: usize = 1 << 20;

/// The error of an accept cancelled before its commit point.
pub fn cancelled() -> io::Error {
    io::Error::new(
        io::ErrorKind::Interrupted,
        "cancelled by a signal before the commit point",
    )
}

/// Fails with [`cancelled`] once a termination signal came.
pub fn check_cancel() -> io::Result<()> {
    if super::signals::cancel_requested() {
        return Err(cancelled());
    }
    Ok(())
}

/// The data regions of `f` (offset, length): its holes left out, so a sparse file is not
/// written out in full (`truncate -s 1T` in a branch costs nothing there and must cost
/// nothing in the project). `None` where the file system cannot say (then all is data).
pub(super) fn data_regions(f: &File) -> io::Result<Option<Vec<(u64, u64)>>> {
    let len = f.metadata()?.len();
    let fd = f.as_raw_fd();
    let mut regions = Vec::new();
    let mut pos: u64 = 0;
    while pos < len {
        // SAFETY: lseek on a descriptor we hold.
        let data = unsafe { libc::lseek(fd, pos as libc::off_t, libc::SEEK_DATA) };
        if data < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENXIO) => Ok(Some(regions)), // only a hole up to the end
                Some(libc::EINVAL) | Some(libc::EOPNOTSUPP) if pos == 0 => Ok(None),
                _ => Err(e),
            };
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(io::Error::last_os_error());
        }
        let (data, hole) = (data as u64, (hole as u64).min(len));
        if hole <= data {
            break;
        }
        regions.push((data, hole - data));
        pos = hole;
    }
    Ok(Some(regions))
}

/// Bytes of `f` that hold data (its holes not counted): what staging it costs the disk.
pub fn data_bytes(f: &File) -> io::Result<u64> {
    Ok(match data_regions(f)? {
        Some(r) => r.iter().map(|(_, n)| n).sum(),
        None => f.metadata()?.len(),
    })
}

/// Copies `content` into the new, empty `out`: its data regions only, holes left as holes,
/// and the length set at the end; a cancel between chunks stops it.
fn copy_sparse(content: &mut File, out: &File) -> io::Result<()> {
    let len = content.metadata()?.len();
    let regions = data_regions(content)?.unwrap_or_else(|| vec![(0, len)]);
    let mut buf = vec![0u8; CHUNK];
    let mut out_ref = out;
    for (start, n) in regions {
        content.seek(SeekFrom::Start(start))?;
        out_ref.seek(SeekFrom::Start(start))?;
        let mut left = n;
        while left > 0 {
            check_cancel()?;
            let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            let got = match content.read(&mut buf[..want]) {
                Ok(0) => break, // shrank meanwhile: the length below still holds
                Ok(got) => got,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            out_ref.write_all(&buf[..got])?;
            left -= got as u64;
        }
    }
    out.set_len(len)
}

/// Refuses, before anything is staged, an accept whose files need more room than the
/// project's file system has free (for an unprivileged user): failing half-way would
/// fill the disk first.
pub fn check_space(root: &OwnedFd, needed: u64) -> io::Result<()> {
    // SAFETY: fstatvfs fills the struct we pass.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above, on a descriptor we hold.
    if unsafe { libc::fstatvfs(root.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let free = (st.f_bavail as u64).saturating_mul(st.f_frsize as u64);
    if needed > free {
        return Err(io::Error::new(
            io::ErrorKind::StorageFull,
            format!(
                "the files to write need {} and the project's file system has {} free",
                crate::units::format_size(needed),
                crate::units::format_size(free)
            ),
        ));
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
