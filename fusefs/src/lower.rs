//! Read-only access to the real project directory ("lower").
//!
//! Everything goes through one directory fd opened at branch creation and `*at()` calls
//! with `AT_SYMLINK_NOFOLLOW`, so a branch reads exactly the tree it was created on even
//! when the runner later bind-mounts the branch over the project's path.

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The lower directory of a branch.
#[derive(Clone)]
pub(crate) struct Lower {
    root: PathBuf,
    /// Shared by every branch of the same project directory in this process (`shared_root`):
    /// ten thousand branches of one project hold one descriptor, not ten thousand.
    fd: std::sync::Arc<OwnedFd>,
    /// What the branch neither shows nor reads (relative to the root, see `hidden.rs`):
    /// shade's state directories inside the project (its own holds the branch mount points,
    /// so reading it through lower would make the FUSE server wait on its own mount, a
    /// deadlock; any of them holds other branches' stores, journals and history), the
    /// state-dir registry, and for a mode that hides them the home's credentials.
    hidden: std::sync::Arc<Hidden>,
}

/// A set of hidden relative paths, and every directory above one (which the branch may not
/// move or remove: that would move what is hidden).
#[derive(Default, Debug)]
pub(crate) struct Hidden {
    paths: std::collections::HashSet<PathBuf>,
    holders: std::collections::HashSet<PathBuf>,
}

impl Hidden {
    /// The set of `rels` (relative, non-empty paths; others are ignored).
    pub fn new(rels: &[PathBuf]) -> Hidden {
        let mut h = Hidden::default();
        for r in rels {
            if r.as_os_str().is_empty() || r.is_absolute() {
                continue;
            }
            let mut up = r.clone();
            while up.pop() {
                h.holders.insert(up.clone());
            }
            h.paths.insert(r.clone());
        }
        h
    }

    /// Whether `rel` is a hidden path or lies under one.
    pub fn covers(&self, rel: &Path) -> bool {
        if self.paths.is_empty() {
            return false;
        }
        let mut p = rel;
        loop {
            if self.paths.contains(p) {
                return true;
            }
            match p.parent() {
                Some(up) if !up.as_os_str().is_empty() => p = up,
                _ => return false,
            }
        }
    }

    /// Whether `rel` is a directory above a hidden path (not one itself).
    pub fn holds(&self, rel: &Path) -> bool {
        self.holders.contains(rel) && !self.covers(rel)
    }

    /// The hidden paths, sorted.
    pub fn paths(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = self.paths.iter().cloned().collect();
        v.sort();
        v
    }
}

/// One entry of a lower directory listing.
pub(crate) struct LowerDirEntry {
    pub name: OsString,
    pub file_type: u32,
    pub ino: u64,
}

fn cpath(rel: &Path) -> io::Result<CString> {
    let bytes = rel.as_os_str().as_bytes();
    let bytes = if bytes.is_empty() {
        b"." as &[u8]
    } else {
        bytes
    };
    CString::new(bytes).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// The descriptor of `root` that branches of it share: the one already open if it is still
/// the directory `fresh` (just opened) is and that directory is not deleted, else `fresh`.
/// The fresh one is closed when an open one is shared, so a branch still reads exactly the
/// directory that was at the path when it was created.
fn shared_root(root: &Path, fresh: OwnedFd) -> io::Result<std::sync::Arc<OwnedFd>> {
    use std::sync::{Arc, Mutex, PoisonError, Weak};
    type Roots = Vec<(PathBuf, (u64, u64), Weak<OwnedFd>)>;
    static ROOTS: Mutex<Roots> = Mutex::new(Vec::new());
    let id = |fd: &OwnedFd| -> io::Result<((u64, u64), u64)> {
        // SAFETY: fstat into a zeroed struct, read only on success.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        cvt(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
        Ok(((st.st_dev, st.st_ino), st.st_nlink))
    };
    let (want, _) = id(&fresh)?;
    let mut roots = ROOTS.lock().unwrap_or_else(PoisonError::into_inner);
    roots.retain(|(_, _, w)| w.strong_count() > 0);
    let open = roots
        .iter()
        .filter(|(p, i, _)| p == root && *i == want)
        .find_map(|(_, _, w)| w.upgrade())
        .filter(|fd| id(fd).is_ok_and(|(_, nlink)| nlink > 0));
    if let Some(fd) = open {
        return Ok(fd);
    }
    let fd = Arc::new(fresh);
    roots.push((root.to_path_buf(), want, Arc::downgrade(&fd)));
    Ok(fd)
}

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

impl Lower {
    /// Open the lower root; it must be a directory (a symlink to one is resolved here, once).
    pub fn open(root: &Path) -> io::Result<Lower> {
        let c = CString::new(root.as_os_str().as_bytes())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: plain open(2) on a valid C string; the fd is owned right after.
        let fd = cvt(unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        })?;
        // SAFETY: fd was just returned by open and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Lower {
            root: root.to_path_buf(),
            fd: shared_root(root, fd)?,
            hidden: Default::default(),
        })
    }

    /// Hide `rels` (and everything under each) from this lower: they do not exist here.
    pub fn hide(&mut self, rels: &[PathBuf]) {
        self.hidden = std::sync::Arc::new(Hidden::new(rels));
    }

    /// The hidden paths (relative), sorted.
    pub fn hidden(&self) -> Vec<PathBuf> {
        self.hidden.paths()
    }

    /// Is `rel` a hidden path or under one? Such paths do not exist in lower, and the
    /// branch refuses to create them.
    pub fn is_hidden(&self, rel: &Path) -> bool {
        self.hidden.covers(rel)
    }

    /// Is `rel` a parent directory of a hidden path? Renaming or removing it would move
    /// what is hidden (accept refuses such a plan; the branch says so at once with EBUSY).
    pub fn holds_hidden(&self, rel: &Path) -> bool {
        self.hidden.holds(rel)
    }

    /// The C path of `rel` for an `*at()` call, or ENOENT for a hidden path.
    fn cpath(&self, rel: &Path) -> io::Result<CString> {
        if self.is_hidden(rel) {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        cpath(rel)
    }

    /// The real path of the project, for messages and for the accept engine.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `lstat` of a lower path; `Ok(None)` when it does not exist (or a parent is not a dir).
    pub fn stat(&self, rel: &Path) -> io::Result<Option<libc::stat>> {
        if self.is_hidden(rel) {
            return Ok(None);
        }
        let c = cpath(rel)?;
        // SAFETY: zeroed stat is a valid out-buffer for fstatat.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid dir fd, C string and out pointer.
        let r = unsafe {
            libc::fstatat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if r == 0 {
            return Ok(Some(st));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENOTDIR) | Some(libc::ENAMETOOLONG) => Ok(None),
            _ => Err(e),
        }
    }

    /// Open a lower file for reading (never follows a final symlink).
    pub fn open_file(&self, rel: &Path) -> io::Result<File> {
        let f =
            File::from(self.open_at(rel, libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK)?);
        // O_NONBLOCK only to avoid hanging on a fifo; regular files ignore it. Clear it anyway.
        // SAFETY: fcntl on our own fd.
        unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETFL, 0) };
        Ok(f)
    }

    /// Open a lower directory as an fd usable with `fdopendir`-like listing.
    fn open_dir(&self, rel: &Path) -> io::Result<OwnedFd> {
        self.open_at(rel, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW)
    }

    /// `openat` below the lower root with `flags` (close-on-exec always).
    fn open_at(&self, rel: &Path, flags: libc::c_int) -> io::Result<OwnedFd> {
        let c = self.cpath(rel)?;
        // SAFETY: valid dir fd and C string.
        let fd =
            cvt(unsafe { libc::openat(self.fd.as_raw_fd(), c.as_ptr(), flags | libc::O_CLOEXEC) })?;
        // SAFETY: fd just returned by openat.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// List a lower directory (without `.` and `..`); missing directory = empty listing.
    pub fn read_dir(&self, rel: &Path) -> io::Result<Vec<LowerDirEntry>> {
        let fd = match self.open_dir(rel) {
            Ok(fd) => fd,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR)) => {
                return Ok(Vec::new())
            }
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        let mut dir = nix::dir::Dir::from_fd(std::os::fd::IntoRawFd::into_raw_fd(fd))
            .map_err(io::Error::from)?;
        for entry in dir.iter() {
            let entry = entry.map_err(io::Error::from)?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." || self.is_hidden(&rel.join(OsStr::from_bytes(name))) {
                continue;
            }
            let file_type = match entry.file_type() {
                Some(nix::dir::Type::Directory) => libc::S_IFDIR,
                Some(nix::dir::Type::File) => libc::S_IFREG,
                Some(nix::dir::Type::Symlink) => libc::S_IFLNK,
                Some(nix::dir::Type::Fifo) => libc::S_IFIFO,
                Some(nix::dir::Type::Socket) => libc::S_IFSOCK,
                Some(nix::dir::Type::CharacterDevice) => libc::S_IFCHR,
                Some(nix::dir::Type::BlockDevice) => libc::S_IFBLK,
                None => 0,
            };
            out.push(LowerDirEntry {
                name: OsStr::from_bytes(name).to_os_string(),
                file_type,
                ino: entry.ino(),
            });
        }
        Ok(out)
    }

    /// Target of a lower symlink.
    pub fn read_link(&self, rel: &Path) -> io::Result<OsString> {
        let c = self.cpath(rel)?;
        let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
        // SAFETY: buffer is valid for buf.len() bytes.
        let n = unsafe {
            libc::readlinkat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        buf.truncate(n as usize);
        Ok(std::os::unix::ffi::OsStringExt::from_vec(buf))
    }

    /// Extended attributes of a lower object, read through `/proc/self/fd` so symlinks in
    /// the path are never followed (an `O_PATH` fd of the object itself).
    fn proc_path(&self, rel: &Path) -> io::Result<(OwnedFd, CString)> {
        let fd = self.open_at(rel, libc::O_PATH | libc::O_NOFOLLOW)?;
        let p = CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        Ok((fd, p))
    }

    /// All xattrs of a lower object (names and values). Symlinks have none we can read.
    pub fn xattrs(&self, rel: &Path, is_symlink: bool) -> Vec<(OsString, Vec<u8>)> {
        if is_symlink {
            return Vec::new();
        }
        let Ok((_fd, p)) = self.proc_path(rel) else {
            return Vec::new();
        };
        // SAFETY (both calls): valid C string, buffer valid for `len` bytes.
        let Ok(names) =
            read_sized(|buf, len| unsafe { libc::listxattr(p.as_ptr(), buf.cast(), len) })
        else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for name in names.split(|b| *b == 0).filter(|n| !n.is_empty()) {
            let Ok(cname) = CString::new(name) else {
                continue;
            };
            if let Ok(val) = read_sized(|buf, len| unsafe {
                libc::getxattr(p.as_ptr(), cname.as_ptr(), buf, len)
            }) {
                out.push((OsStr::from_bytes(name).to_os_string(), val));
            }
        }
        out
    }

    /// One xattr of a lower object; `None` when it has no such attribute. `getxattr` is
    /// frequent (`ls -l` asks for ACLs on every file): one system call, not a listing.
    pub fn xattr(&self, rel: &Path, name: &OsStr, is_symlink: bool) -> io::Result<Option<Vec<u8>>> {
        if is_symlink {
            return Ok(None);
        }
        let (_fd, p) = self.proc_path(rel)?;
        let cname = CString::new(name.as_bytes())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: valid C strings, buffer valid for `len` bytes.
        match read_sized(|buf, len| unsafe { libc::getxattr(p.as_ptr(), cname.as_ptr(), buf, len) })
        {
            Ok(v) => Ok(Some(v)),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENODATA | libc::EOPNOTSUPP)) => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// File system statistics of lower, forwarded by `statfs`.
    pub fn statvfs(&self) -> io::Result<libc::statvfs> {
        // SAFETY: zeroed statvfs is a valid out-buffer.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: valid fd and out pointer.
        cvt(unsafe { libc::fstatvfs(self.fd.as_raw_fd(), &mut st) })?;
        Ok(st)
    }
}

/// Call a size-probing xattr function (`call(null, 0)` gives the size) and return the
/// bytes, retrying if the value grew in between.
fn read_sized(call: impl Fn(*mut libc::c_void, usize) -> isize) -> io::Result<Vec<u8>> {
    loop {
        let size = call(std::ptr::null_mut(), 0);
        if size < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buf = vec![0u8; size as usize];
        let n = call(buf.as_mut_ptr().cast(), buf.len());
        if n >= 0 {
            buf.truncate(n as usize);
            return Ok(buf);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ERANGE) {
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each hidden path and what is under it is covered; only the directories above one
    /// hold it (renaming them would move it); siblings and prefixes of a name are neither.
    #[test]
    fn hidden_set_covers_and_holds() {
        let h = Hidden::new(&[
            PathBuf::from(".local/state/shade"),
            PathBuf::from(".local/state/shade-state-dirs"),
            PathBuf::from(".ssh"),
            PathBuf::from("other/state"),
        ]);
        for p in [
            ".ssh",
            ".ssh/id_ed25519",
            ".local/state/shade/branches",
            "other/state",
        ] {
            assert!(h.covers(Path::new(p)), "{p}");
        }
        for p in [
            "",
            ".local",
            ".local/state",
            "other",
            ".sshx",
            "other/stat",
            "x",
        ] {
            assert!(!h.covers(Path::new(p)), "{p}");
        }
        for p in [".local", ".local/state", "other", ""] {
            assert!(h.holds(Path::new(p)), "{p}");
        }
        for p in [
            ".ssh",
            ".local/state/shade",
            ".local/share",
            "other/state/x",
        ] {
            assert!(!h.holds(Path::new(p)), "{p}");
        }
        assert!(!Hidden::default().covers(Path::new("a")));
    }
}
