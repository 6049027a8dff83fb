//! Thin, safe wrappers over the `*at()` system calls accept uses.
//!
//! Every call takes a directory fd and a single file name (never a path with `/`), and never
//! follows a symlink in the last component, so nothing accept does can be redirected out of
//! the project by a symlink planted in it.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;

fn cstr(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "name contains NUL"))
}

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

thread_local! {
    /// Directories [`open_dir_at`] opened on this thread (accept runs on its caller's).
    static DIRS_OPENED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Directories opened by accept's walks on this thread so far: the work a walk did, for
/// tests that bound it (a walk per op from the root is quadratic in a chain's depth).
pub fn dirs_opened() -> u64 {
    DIRS_OPENED.with(std::cell::Cell::get)
}

/// Retry a call interrupted by a signal.
fn retry(mut f: impl FnMut() -> libc::c_int) -> io::Result<libc::c_int> {
    loop {
        match check(f()) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

/// Open a path (following symlinks: only used for the project root and the state dir,
/// which the user names).
pub fn open_dir_path(path: &std::path::Path) -> io::Result<OwnedFd> {
    let c = cstr(path.as_os_str())?;
    // SAFETY: c is a valid NUL-terminated string; the fd is owned by the result.
    let fd = retry(|| unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: fd was just returned by open and is not owned elsewhere.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Open the directory `name` inside `dir`, refusing a symlink (ELOOP) or a non-directory (ENOTDIR).
pub fn open_dir_at(dir: RawFd, name: &OsStr) -> io::Result<OwnedFd> {
    DIRS_OPENED.with(|n| n.set(n.get() + 1));
    let c = cstr(name)?;
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: valid dirfd and C string.
    let fd = retry(|| unsafe { libc::openat(dir, c.as_ptr(), flags) })?;
    // SAFETY: fd was just returned by openat.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Open the regular file `name` inside `dir` for reading, refusing a symlink.
pub fn open_file_at(dir: RawFd, name: &OsStr) -> io::Result<File> {
    let c = cstr(name)?;
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: valid dirfd and C string.
    let fd = retry(|| unsafe { libc::openat(dir, c.as_ptr(), flags) })?;
    // SAFETY: fd was just returned by openat.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Create (or truncate, if `excl` is false) the regular file `name` in `dir` for writing.
pub fn create_file_at(dir: RawFd, name: &OsStr, excl: bool) -> io::Result<File> {
    let c = cstr(name)?;
    let mut flags = libc::O_WRONLY | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    flags |= if excl { libc::O_EXCL } else { libc::O_TRUNC };
    // SAFETY: valid dirfd and C string.
    let fd = retry(|| unsafe { libc::openat(dir, c.as_ptr(), flags, 0o600 as libc::c_uint) })?;
    // SAFETY: fd was just returned by openat.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// `fstatat(AT_SYMLINK_NOFOLLOW)`; `Ok(None)` when the name does not exist.
pub fn lstat_at(dir: RawFd, name: &OsStr) -> io::Result<Option<libc::stat>> {
    let c = cstr(name)?;
    // SAFETY: zeroed stat is a valid out buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid dirfd, C string and out buffer.
    match retry(|| unsafe { libc::fstatat(dir, c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) }) {
        Ok(_) => Ok(Some(st)),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// `fstat` of an open file or directory, as a base.
pub fn fstat(fd: RawFd) -> io::Result<crate::fingerprint::Base> {
    // SAFETY: zeroed stat is a valid out buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and out buffer.
    retry(|| unsafe { libc::fstat(fd, &mut st) })?;
    Ok(crate::fingerprint::Base::Present(
        crate::fingerprint::Fingerprint::from_stat(&st),
    ))
}

/// `mkdirat`.
pub fn mkdir_at(dir: RawFd, name: &OsStr, mode: u32) -> io::Result<()> {
    let c = cstr(name)?;
    // SAFETY: valid dirfd and C string.
    retry(|| unsafe { libc::mkdirat(dir, c.as_ptr(), mode as libc::mode_t) }).map(drop)
}

/// `symlinkat(target, dir, name)`.
pub fn symlink_at(target: &OsStr, dir: RawFd, name: &OsStr) -> io::Result<()> {
    let t = cstr(target)?;
    let c = cstr(name)?;
    // SAFETY: valid C strings and dirfd.
    retry(|| unsafe { libc::symlinkat(t.as_ptr(), dir, c.as_ptr()) }).map(drop)
}

/// `readlinkat`.
pub fn readlink_at(dir: RawFd, name: &OsStr) -> io::Result<Vec<u8>> {
    let c = cstr(name)?;
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: buffer is valid for buf.len() bytes.
    let n = unsafe { libc::readlinkat(dir, c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// `renameat2(from_dir, from, to_dir, to, flags)`; `noreplace` fails with EEXIST instead of
/// replacing.
pub fn rename_at(
    from_dir: RawFd,
    from: &OsStr,
    to_dir: RawFd,
    to: &OsStr,
    noreplace: bool,
) -> io::Result<()> {
    let f = cstr(from)?;
    let t = cstr(to)?;
    let flags = if noreplace { libc::RENAME_NOREPLACE } else { 0 };
    // SAFETY: valid dirfds and C strings.
    retry(|| unsafe { libc::renameat2(from_dir, f.as_ptr(), to_dir, t.as_ptr(), flags) }).map(drop)
}

/// `unlinkat`, with `AT_REMOVEDIR` for a directory.
pub fn unlink_at(dir: RawFd, name: &OsStr, is_dir: bool) -> io::Result<()> {
    let c = cstr(name)?;
    let flags = if is_dir { libc::AT_REMOVEDIR } else { 0 };
    // SAFETY: valid dirfd and C string.
    retry(|| unsafe { libc::unlinkat(dir, c.as_ptr(), flags) }).map(drop)
}

/// `fchmod` (permission bits only).
pub fn fchmod(fd: RawFd, mode: u32) -> io::Result<()> {
    // SAFETY: plain syscall on an fd.
    retry(|| unsafe { libc::fchmod(fd, (mode & 0o7777) as libc::mode_t) }).map(drop)
}

/// `fchown`; `None` keeps the current id.
pub fn fchown(fd: RawFd, uid: Option<u32>, gid: Option<u32>) -> io::Result<()> {
    let u = uid.unwrap_or(u32::MAX);
    let g = gid.unwrap_or(u32::MAX);
    // SAFETY: plain syscall on an fd; -1 keeps an id.
    retry(|| unsafe { libc::fchown(fd, u, g) }).map(drop)
}

/// `fsync` of any fd (files and directories).
pub fn fsync(fd: &impl AsRawFd) -> io::Result<()> {
    // SAFETY: plain syscall on an fd.
    retry(|| unsafe { libc::fsync(fd.as_raw_fd()) }).map(drop)
}

/// `syncfs`: flush the whole file system holding `fd` — one call instead of thousands of
/// `fsync`s when many files were staged.
pub fn syncfs(fd: &impl AsRawFd) -> io::Result<()> {
    // SAFETY: plain syscall on an fd.
    retry(|| unsafe { libc::syncfs(fd.as_raw_fd()) }).map(drop)
}

/// Whether process `pid` exists and has not exited (a journal id starts with its writer's
/// pid). A zombie — exited, not yet reaped by its parent — is dead: it serves nothing.
pub fn process_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence and permission.
    let r = unsafe { libc::kill(pid, 0) };
    let exists = r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH);
    exists && !zombie(pid)
}

/// Whether `pid` is a zombie (or dead), from the state field of `/proc/PID/stat`.
pub fn zombie(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The command name (in parentheses) may hold spaces: the state follows the last ')'.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next())
        .is_some_and(|state| state == 'Z' || state == 'X')
}

/// Exclusive `flock` on an fd; released when the fd is closed.
pub fn lock_exclusive(fd: &impl AsRawFd) -> io::Result<()> {
    // SAFETY: plain syscall on an fd.
    retry(|| unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX) }).map(drop)
}

/// Whether the process runs as root (and may therefore chown).
pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The names in the directory `dir` (without `.` and `..`).
pub fn list_dir(dir: RawFd) -> io::Result<Vec<std::ffi::OsString>> {
    // fdopendir takes ownership of its fd, so hand it a duplicate.
    // SAFETY: plain syscall on an fd.
    let dup = retry(|| unsafe { libc::fcntl(dir, libc::F_DUPFD_CLOEXEC, 0) })?;
    // SAFETY: dup is a fresh fd we own; on success the DIR owns it.
    let d = unsafe { libc::fdopendir(dup) };
    if d.is_null() {
        let e = io::Error::last_os_error();
        // SAFETY: dup is still ours when fdopendir failed.
        unsafe { libc::close(dup) };
        return Err(e);
    }
    // SAFETY: d is a valid DIR*.
    unsafe { libc::rewinddir(d) };
    let mut out = Vec::new();
    let res = loop {
        // SAFETY: errno is thread-local; reset it to tell end-of-dir from an error.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: d is a valid DIR*.
        let ent = unsafe { libc::readdir64(d) };
        if ent.is_null() {
            let e = io::Error::last_os_error();
            break if e.raw_os_error().unwrap_or(0) == 0 {
                Ok(())
            } else {
                Err(e)
            };
        }
        // SAFETY: d_name is a NUL-terminated string inside the dirent.
        let name = unsafe { std::ffi::CStr::from_ptr((*ent).d_name.as_ptr()) };
        let b = name.to_bytes();
        if b != b"." && b != b".." {
            out.push(OsStr::from_bytes(b).to_os_string());
        }
    };
    // SAFETY: d is valid and closed exactly once.
    unsafe { libc::closedir(d) };
    res.map(|()| out)
}

/// Remove `name` in `dir` and, if it is a directory, everything below it, never following
/// a symlink. A missing name is not an error.
pub fn remove_tree_at(dir: RawFd, name: &OsStr) -> io::Result<()> {
    let Some(st) = lstat_at(dir, name)? else {
        return Ok(());
    };
    if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
        let sub = open_dir_at(dir, name)?;
        for child in list_dir(sub.as_raw_fd())? {
            remove_tree_at(sub.as_raw_fd(), &child)?;
        }
        drop(sub);
        match unlink_at(dir, name, true) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            r => r,
        }
    } else {
        match unlink_at(dir, name, false) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            r => r,
        }
    }
}

/// Create the fifo, socket or device node `name` in `dir` (`mode` includes the type bits).
pub fn mknod_at(dir: RawFd, name: &OsStr, mode: u32, rdev: u64) -> io::Result<()> {
    let c = cstr(name)?;
    // SAFETY: valid dirfd and C string.
    retry(|| unsafe { libc::mknodat(dir, c.as_ptr(), mode, rdev as libc::dev_t) }).map(drop)
}

/// Make `new_name` in `new_dir` one more name of `old_name` in `old_dir` (no symlink followed).
pub fn link_at(
    old_dir: RawFd,
    old_name: &OsStr,
    new_dir: RawFd,
    new_name: &OsStr,
) -> io::Result<()> {
    let (o, n) = (cstr(old_name)?, cstr(new_name)?);
    // SAFETY: valid dirfds and C strings.
    retry(|| unsafe { libc::linkat(old_dir, o.as_ptr(), new_dir, n.as_ptr(), 0) }).map(drop)
}

/// Owner and mode of `name` in `dir` itself (a special file cannot be opened to fchmod it).
pub fn chown_chmod_at(
    dir: RawFd,
    name: &OsStr,
    uid: Option<u32>,
    gid: Option<u32>,
    mode: u32,
) -> io::Result<()> {
    let c = cstr(name)?;
    if is_root() && (uid.is_some() || gid.is_some()) {
        let (u, g) = (uid.unwrap_or(u32::MAX), gid.unwrap_or(u32::MAX));
        // SAFETY: valid dirfd and C string.
        retry(|| unsafe { libc::fchownat(dir, c.as_ptr(), u, g, libc::AT_SYMLINK_NOFOLLOW) })?;
    }
    // SAFETY: valid dirfd and C string.
    retry(|| unsafe { libc::fchmodat(dir, c.as_ptr(), mode, 0) }).map(drop)
}

/// Set access and modification times (`(seconds, nanoseconds)`) of `name` in `dir`, or of
/// `dir` itself when `name` is empty; a symlink's own times, never its target's.
pub fn set_times_at(
    dir: RawFd,
    name: &OsStr,
    atime: (i64, i64),
    mtime: (i64, i64),
) -> io::Result<()> {
    let ts = [
        libc::timespec {
            tv_sec: atime.0,
            tv_nsec: atime.1,
        },
        libc::timespec {
            tv_sec: mtime.0,
            tv_nsec: mtime.1,
        },
    ];
    if name.is_empty() {
        // SAFETY: valid fd and a two-element timespec array.
        return retry(|| unsafe { libc::futimens(dir, ts.as_ptr()) }).map(drop);
    }
    let c = cstr(name)?;
    // SAFETY: valid dirfd, C string and a two-element timespec array.
    retry(|| unsafe { libc::utimensat(dir, c.as_ptr(), ts.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) })
        .map(drop)
}

/// Names of the extended attributes of an open file or directory.
pub fn list_xattrs(fd: RawFd) -> io::Result<Vec<Vec<u8>>> {
    let mut buf = vec![0u8; 64 * 1024];
    // SAFETY: buf is valid for its length.
    let n = retry(|| unsafe {
        libc::flistxattr(fd, buf.as_mut_ptr().cast(), buf.len()) as libc::c_int
    })?;
    Ok(buf[..n as usize]
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty())
        .map(<[u8]>::to_vec)
        .collect())
}

/// Set extended attribute `name` of an open file or directory.
pub fn set_xattr(fd: RawFd, name: &[u8], value: &[u8]) -> io::Result<()> {
    let c = cstr(OsStr::from_bytes(name))?;
    // SAFETY: valid fd, C string and value buffer.
    retry(|| unsafe { libc::fsetxattr(fd, c.as_ptr(), value.as_ptr().cast(), value.len(), 0) })
        .map(drop)
}

/// Remove extended attribute `name` of an open file or directory (absent is fine).
pub fn remove_xattr(fd: RawFd, name: &[u8]) -> io::Result<()> {
    let c = cstr(OsStr::from_bytes(name))?;
    // SAFETY: valid fd and C string.
    match retry(|| unsafe { libc::fremovexattr(fd, c.as_ptr()) }) {
        Err(e) if e.raw_os_error() == Some(libc::ENODATA) => Ok(()),
        r => r.map(drop),
    }
}

/// The value of extended attribute `name` of an open file.
pub fn get_xattr(fd: RawFd, name: &[u8]) -> io::Result<Vec<u8>> {
    let c = cstr(OsStr::from_bytes(name))?;
    let mut buf = vec![0u8; 64 * 1024];
    // SAFETY: valid fd, C string and buffer of the given length.
    let n = retry(|| unsafe {
        libc::fgetxattr(fd, c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) as libc::c_int
    })?;
    buf.truncate(n as usize);
    Ok(buf)
}
