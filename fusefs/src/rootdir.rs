//! Files beneath a directory that hostile code may change while shade works in it.
//!
//! A branch (and a project an agent works in) is written by commands shade does not trust:
//! any directory in it may be a symlink to the host, planted before shade looks or swapped
//! in between a check and a use. So shade's own process never opens a path in such a tree
//! by name: [`RootDir`] holds a descriptor of the root, and every access is resolved
//! beneath it by the kernel (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS |
//! RESOLVE_NO_XDEV`), then done on the descriptor it returned (fstat, read, write), never
//! by reopening the name. Creating, removing and listing go through the parent's
//! descriptor, opened the same way; the walk opens each directory from its parent's
//! descriptor with `O_NOFOLLOW`. A symlink inside the tree that stays inside still works
//! (the kernel follows it beneath the root); one leading out fails with `EXDEV`.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::ops::ControlFlow;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use ignore::gitignore::{Gitignore, GitignoreBuilder};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};

/// A directory tree accessed only beneath a descriptor of its root.
#[derive(Debug)]
pub struct RootDir {
    fd: OwnedFd,
    /// The path it was opened by (for the ignore files above it, which are not its own).
    path: PathBuf,
}

/// What an entry is, as seen without following it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (never followed by listings and walks).
    Symlink,
    /// A device, socket or pipe.
    Other,
}

impl Kind {
    fn of(t: FileType) -> Kind {
        match t {
            FileType::RegularFile => Kind::File,
            FileType::Directory => Kind::Dir,
            FileType::Symlink => Kind::Symlink,
            _ => Kind::Other,
        }
    }
}

/// One entry of a listed directory.
#[derive(Debug, Clone)]
pub struct DirEntry {
    /// Its name in the directory.
    pub name: OsString,
    /// What it is (not followed).
    pub kind: Kind,
    /// Its size in bytes (of the link itself for a symlink).
    pub len: u64,
}

/// A file met by [`RootDir::walk`], readable through its parent's descriptor.
pub struct WalkEntry<'a> {
    /// Its path relative to the root.
    pub rel: &'a Path,
    /// What it is (not followed).
    pub kind: Kind,
    parent: BorrowedFd<'a>,
    name: &'a OsStr,
}

impl WalkEntry<'_> {
    /// Its name in its directory.
    pub fn file_name(&self) -> &OsStr {
        self.name
    }

    /// Its content, if it is still a regular file (opened from the parent without
    /// following a link) of at most [`READ_LIMIT`] bytes.
    pub fn read(&self) -> io::Result<Vec<u8>> {
        read_regular(OwnedFd::from(self.open()?), READ_LIMIT)
    }

    /// The file, opened from the parent without following a link and checked (on that
    /// descriptor) to be a regular file: for a reader that streams it rather than holding
    /// it whole (a command may have made it any size).
    pub fn open(&self) -> io::Result<File> {
        let fd = rustix::fs::openat(
            self.parent,
            self.name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
            Mode::empty(),
        )?;
        regular(fd)
    }
}

/// How every path is resolved beneath the root.
fn beneath() -> ResolveFlags {
    ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS | ResolveFlags::NO_XDEV
}

/// `rel` as the kernel gets it: refused if absolute or climbing with `..` (the kernel
/// would refuse it too; this says why), `.` for the root itself.
fn relative(rel: &Path) -> io::Result<PathBuf> {
    let mut out = PathBuf::new();
    for c in rel.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("{} leads out of the directory", rel.display()),
                ))
            }
        }
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    Ok(out)
}

/// The most [`RootDir::read`] holds in memory: a command in the branch may make a file of
/// any size (a sparse one costs it nothing), and shade's own process has no memory limit.
/// A caller that may meet larger files streams them ([`RootDir::open_file`]) or asks for
/// less ([`RootDir::read_at_most`]).
pub const READ_LIMIT: u64 = 64 << 20;

/// The most an ignore file may hold to count (git itself skips huge pattern files): the
/// walk reads one in every directory.
const IGNORE_FILE_LIMIT: u64 = 1 << 20;

/// `fd` as a file, if it is a regular one (checked on the descriptor).
fn regular(fd: OwnedFd) -> io::Result<File> {
    let file = File::from(fd);
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    Ok(file)
}

/// The error for a file over `max` bytes.
fn too_large(max: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::FileTooLarge,
        format!("larger than {max} bytes; not read whole"),
    )
}

/// The content of regular file `fd`, refused if over `max` bytes: the size is checked on
/// the descriptor and the read stops after `max + 1` bytes (the file may grow meanwhile).
fn read_regular(fd: OwnedFd, max: u64) -> io::Result<Vec<u8>> {
    let file = regular(fd)?;
    let len = file.metadata()?.len();
    if len > max {
        return Err(too_large(max));
    }
    let mut out = Vec::with_capacity(usize::try_from(len).unwrap_or(0).min(1 << 24));
    file.take(max.saturating_add(1)).read_to_end(&mut out)?;
    if out.len() as u64 > max {
        return Err(too_large(max));
    }
    Ok(out)
}

impl RootDir {
    /// Open `root` (shade's own path to the tree: a branch mount, the project).
    pub fn open(root: &Path) -> io::Result<RootDir> {
        let fd = rustix::fs::open(
            root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(RootDir {
            fd,
            path: root.to_path_buf(),
        })
    }

    /// Open `rel` beneath the root (retrying while the kernel reports a concurrent rename
    /// it could not rule out, as `openat2` asks).
    pub fn open_beneath(&self, rel: &Path, flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
        let rel = relative(rel)?;
        let mut tries = 0;
        loop {
            match rustix::fs::openat2(&self.fd, &rel, flags | OFlags::CLOEXEC, mode, beneath()) {
                Err(rustix::io::Errno::AGAIN) if tries < 64 => tries += 1,
                Err(rustix::io::Errno::XDEV) => {
                    return Err(io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        format!("{} leads out of the directory", rel.display()),
                    ))
                }
                other => return other.map_err(io::Error::from),
            }
        }
    }

    /// The directory holding `rel`, opened beneath the root, and `rel`'s last name.
    fn parent_of<'p>(&self, rel: &'p Path) -> io::Result<(OwnedFd, &'p OsStr)> {
        let name = match rel.components().next_back() {
            Some(Component::Normal(n)) => n,
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{} names no file", rel.display()),
                ))
            }
        };
        let parent = rel.parent().unwrap_or(Path::new(""));
        let dir = self.open_beneath(parent, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
        Ok((dir, name))
    }

    /// An `O_PATH` descriptor of directory `rel` whose last component is no link: what
    /// to mount on (through `/proc/self/fd/N`) rather than a path a command could swap.
    pub fn open_dir_path(&self, rel: &Path) -> io::Result<OwnedFd> {
        self.open_beneath(
            rel,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW,
            Mode::empty(),
        )
    }

    /// What `rel` is (following links that stay beneath the root).
    pub fn metadata(&self, rel: &Path) -> io::Result<std::fs::Metadata> {
        let fd = self.open_beneath(rel, OFlags::PATH, Mode::empty())?;
        File::from(fd).metadata()
    }

    /// What `rel` itself is (a last component that is a link is not followed).
    pub fn symlink_metadata(&self, rel: &Path) -> io::Result<std::fs::Metadata> {
        let fd = self.open_beneath(rel, OFlags::PATH | OFlags::NOFOLLOW, Mode::empty())?;
        File::from(fd).metadata()
    }

    /// The target of symbolic link `rel` (read from its parent's descriptor, never
    /// followed): to show the user where a link points before it is accepted.
    pub fn read_link(&self, rel: &Path) -> io::Result<PathBuf> {
        let rel = relative(rel)?;
        let (dir, name) = self.parent_of(&rel)?;
        let target = rustix::fs::readlinkat(&dir, name, Vec::new())?;
        Ok(PathBuf::from(OsStr::from_bytes(target.as_bytes())))
    }

    /// Set the permission bits of regular file `rel` (no link followed at its end).
    pub fn set_mode(&self, rel: &Path, mode: u32) -> io::Result<()> {
        let fd = self.open_beneath(
            rel,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY,
            Mode::empty(),
        )?;
        let file = regular(fd)?;
        rustix::fs::fchmod(&file, Mode::from_raw_mode(mode & 0o7777))?;
        Ok(())
    }

    /// Whether `rel` exists beneath the root (a link leading out counts as not there).
    pub fn exists(&self, rel: &Path) -> bool {
        self.metadata(rel).is_ok()
    }

    /// The content of regular file `rel` (a device, socket or pipe is refused, and its
    /// opening never blocks), refused (`FileTooLarge`) over [`READ_LIMIT`] bytes.
    pub fn read(&self, rel: &Path) -> io::Result<Vec<u8>> {
        self.read_at_most(rel, READ_LIMIT)
    }

    /// [`RootDir::read`] refused over `max` bytes (checked and read on one descriptor, so
    /// a file swapped or grown after a size check is not read whole either).
    pub fn read_at_most(&self, rel: &Path, max: u64) -> io::Result<Vec<u8>> {
        read_regular(self.open_file(rel)?, max)
    }

    /// Regular file `rel`, opened for reading (never blocking on a FIFO), for a reader
    /// that streams it.
    pub fn open_file(&self, rel: &Path) -> io::Result<OwnedFd> {
        let fd = self.open_beneath(
            rel,
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY,
            Mode::empty(),
        )?;
        regular(fd).map(OwnedFd::from)
    }

    /// [`RootDir::read`] as UTF-8 text.
    pub fn read_to_string(&self, rel: &Path) -> io::Result<String> {
        String::from_utf8(self.read(rel)?)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not valid UTF-8"))
    }

    /// Replace the content of `rel` (created 0666 less the umask if missing); its
    /// directory must exist.
    pub fn write(&self, rel: &Path, bytes: &[u8]) -> io::Result<()> {
        let fd = self.open_beneath(
            rel,
            OFlags::WRONLY | OFlags::CREATE | OFlags::NONBLOCK | OFlags::NOCTTY,
            Mode::from_raw_mode(0o666),
        )?;
        let mut file = File::from(fd);
        if !file.metadata()?.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file",
            ));
        }
        file.set_len(0)?;
        file.write_all(bytes)
    }

    /// Make directory `rel` and its missing ancestors, each from its parent's descriptor
    /// (an existing link in the way is followed only beneath the root).
    pub fn create_dir_all(&self, rel: &Path) -> io::Result<()> {
        let rel = relative(rel)?;
        let mut dir = self.open_beneath(
            Path::new(""),
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        )?;
        let mut sofar = PathBuf::new();
        for c in rel.components() {
            let Component::Normal(name) = c else { continue };
            sofar.push(name);
            match rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(0o777)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(e.into()),
            }
            dir = self.open_beneath(&sofar, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
        }
        Ok(())
    }

    /// Remove the file (or link) `rel` from its directory.
    pub fn remove_file(&self, rel: &Path) -> io::Result<()> {
        let rel = relative(rel)?;
        let (dir, name) = self.parent_of(&rel)?;
        rustix::fs::unlinkat(&dir, name, AtFlags::empty())?;
        Ok(())
    }

    /// Remove `rel` and, for a directory, everything in it: each entry from its parent's
    /// descriptor, no link followed (a link is removed, not what it names). Missing is
    /// not an error.
    pub fn remove_all(&self, rel: &Path) -> io::Result<()> {
        let rel = relative(rel)?;
        let (dir, name) = self.parent_of(&rel)?;
        remove_at(&dir, name)
    }

    /// The entries of directory `rel` (without `.` and `..`), in no set order.
    pub fn read_dir(&self, rel: &Path) -> io::Result<Vec<DirEntry>> {
        let dir = self.open_beneath(rel, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
        let mut out = Vec::new();
        for e in rustix::fs::Dir::read_from(&dir)? {
            let e = e?;
            let name = OsStr::from_bytes(e.file_name().to_bytes());
            if name == "." || name == ".." {
                continue;
            }
            let Ok(st) = rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) else {
                continue;
            };
            out.push(DirEntry {
                name: name.to_os_string(),
                kind: Kind::of(FileType::from_raw_mode(st.st_mode)),
                len: u64::try_from(st.st_size).unwrap_or(0),
            });
        }
        Ok(out)
    }

    /// Visit every file and directory under `start` (relative to the root) depth first,
    /// siblings in name order, without following links and without entering `.git`,
    /// skipping what `.ignore`, `.gitignore` (from the root down), `.git/info/exclude`
    /// and the user's global git excludes ignore, as the `ignore` crate's walker does
    /// with hidden files shown. `start` itself is visited only when it is a file.
    /// `visit` may stop the walk.
    pub fn walk(
        &self,
        start: &Path,
        visit: &mut dyn FnMut(&WalkEntry<'_>) -> ControlFlow<()>,
    ) -> io::Result<()> {
        let start = relative(start)?;
        let start = if start == Path::new(".") {
            PathBuf::new()
        } else {
            start
        };
        let meta = self.metadata(&start)?;
        if !meta.is_dir() {
            let (dir, name) = self.parent_of(&start)?;
            let entry = WalkEntry {
                rel: &start,
                kind: if meta.is_file() {
                    Kind::File
                } else {
                    Kind::Other
                },
                parent: dir.as_fd(),
                name,
            };
            let _ = visit(&entry);
            return Ok(());
        }
        let mut rules = Rules {
            levels: Vec::new(),
            global: Gitignore::global().0,
            root: self.path.clone(),
        };
        // The ignore files above the root (shade's or the user's directories, not the
        // tree's), outermost first, as the `ignore` crate reads a walk's parents.
        let mut outer: Vec<&Path> = self.path.ancestors().skip(1).collect();
        outer.reverse();
        for dir in outer {
            rules.levels.push(Level::outer(dir));
        }
        // The ignore files of the directories above `start`, from the root down.
        let mut above = PathBuf::new();
        let mut ancestors = vec![PathBuf::new()];
        for c in start.components() {
            above.push(c);
            ancestors.push(above.clone());
        }
        ancestors.pop();
        for a in &ancestors {
            if let Ok(fd) = self.open_beneath(a, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
            {
                rules.levels.push(Level::read(&fd, a));
            }
        }
        let dir = self.open_beneath(&start, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
        let _ = walk_dir(&dir, &start, &mut rules, visit);
        Ok(())
    }
}

fn remove_at(dir: &OwnedFd, name: &OsStr) -> io::Result<()> {
    let st = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(rustix::io::Errno::NOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        rustix::fs::unlinkat(dir, name, AtFlags::empty())?;
        return Ok(());
    }
    let sub = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut names = Vec::new();
    for e in rustix::fs::Dir::read_from(&sub)? {
        let e = e?;
        let n = OsStr::from_bytes(e.file_name().to_bytes());
        if n != "." && n != ".." {
            names.push(n.to_os_string());
        }
    }
    for n in &names {
        remove_at(&sub, n)?;
    }
    rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)?;
    Ok(())
}

/// The ignore files of one directory.
struct Level {
    custom: Option<Gitignore>,
    git: Option<Gitignore>,
    exclude: Option<Gitignore>,
    /// Above the root: its matchers take real paths, not root-relative ones.
    outer: bool,
}

/// The path a matcher sees for `rel`: absolute under a virtual `/` root.
fn virtual_path(rel: &Path) -> PathBuf {
    Path::new("/").join(rel)
}

fn matcher(dir: BorrowedFd<'_>, file: &Path, rel_dir: &Path) -> Option<Gitignore> {
    let fd = rustix::fs::openat2(
        dir,
        file,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
        beneath(),
    )
    .ok()?;
    let bytes = read_regular(fd, IGNORE_FILE_LIMIT).ok()?;
    let text = String::from_utf8_lossy(&bytes);
    let mut b = GitignoreBuilder::new(virtual_path(rel_dir));
    for line in text.lines() {
        let _ = b.add_line(None, line);
    }
    b.build().ok().filter(|g| !g.is_empty())
}

impl Level {
    fn read(dir: &OwnedFd, rel_dir: &Path) -> Level {
        let fd = dir.as_fd();
        Level {
            custom: matcher(fd, Path::new(".ignore"), rel_dir),
            git: matcher(fd, Path::new(".gitignore"), rel_dir),
            exclude: matcher(fd, Path::new(".git/info/exclude"), rel_dir),
            outer: false,
        }
    }

    /// A directory above the root, read by its path.
    fn outer(dir: &Path) -> Level {
        let read = |name: &str| {
            let mut b = GitignoreBuilder::new(dir);
            b.add(dir.join(name));
            b.build().ok().filter(|g| !g.is_empty())
        };
        Level {
            custom: read(".ignore"),
            git: read(".gitignore"),
            exclude: read(".git/info/exclude"),
            outer: true,
        }
    }
}

/// The ignore files in force, deepest last.
struct Rules {
    levels: Vec<Level>,
    global: Gitignore,
    /// The tree's path, for the levels above it.
    root: PathBuf,
}

impl Rules {
    /// Whether `rel` is ignored, as the `ignore` crate decides without requiring git:
    /// the nearest `.ignore` match, else the nearest `.gitignore` match (up to `/`), else
    /// the nearest exclude match, else the global excludes; a whitelist (`!`) match
    /// decides too.
    fn ignored(&self, rel: &Path, is_dir: bool) -> bool {
        let inner = virtual_path(rel);
        let real = self.root.join(rel);
        let (mut custom, mut git, mut exclude) = (None, None, None);
        for level in self.levels.iter().rev() {
            let path = if level.outer { &real } else { &inner };
            let matched = |g: &Option<Gitignore>| {
                g.as_ref()
                    .map(|g| g.matched(path, is_dir))
                    .filter(|m| !m.is_none())
                    .map(|m| m.is_ignore())
            };
            custom = custom.or_else(|| matched(&level.custom));
            git = git.or_else(|| matched(&level.git));
            exclude = exclude.or_else(|| matched(&level.exclude));
        }
        custom
            .or(git)
            .or(exclude)
            .unwrap_or_else(|| self.global.matched(rel, is_dir).is_ignore())
    }
}

fn walk_dir(
    dir: &OwnedFd,
    rel: &Path,
    rules: &mut Rules,
    visit: &mut dyn FnMut(&WalkEntry<'_>) -> ControlFlow<()>,
) -> ControlFlow<()> {
    rules.levels.push(Level::read(dir, rel));
    let out = walk_entries(dir, rel, rules, visit);
    rules.levels.pop();
    out
}

fn walk_entries(
    dir: &OwnedFd,
    rel: &Path,
    rules: &mut Rules,
    visit: &mut dyn FnMut(&WalkEntry<'_>) -> ControlFlow<()>,
) -> ControlFlow<()> {
    let Ok(listing) = rustix::fs::Dir::read_from(dir) else {
        return ControlFlow::Continue(());
    };
    let mut entries: Vec<(OsString, Kind)> = Vec::new();
    for e in listing.flatten() {
        let name = OsStr::from_bytes(e.file_name().to_bytes());
        if name == "." || name == ".." || name == ".git" {
            continue;
        }
        let kind = match e.file_type() {
            FileType::Unknown => match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => Kind::of(FileType::from_raw_mode(st.st_mode)),
                Err(_) => continue,
            },
            t => Kind::of(t),
        };
        entries.push((name.to_os_string(), kind));
    }
    entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    for (name, kind) in entries {
        let child = rel.join(&name);
        if rules.ignored(&child, kind == Kind::Dir) {
            continue;
        }
        let entry = WalkEntry {
            rel: &child,
            kind,
            parent: dir.as_fd(),
            name: &name,
        };
        visit(&entry)?;
        if kind == Kind::Dir {
            let Ok(sub) = rustix::fs::openat(
                dir,
                &name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            ) else {
                continue;
            };
            walk_dir(&sub, &child, rules, visit)?;
        }
    }
    ControlFlow::Continue(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn nothing_leads_out_of_the_root() {
        let t = tempfile::tempdir().unwrap();
        let out = tempfile::tempdir().unwrap();
        std::fs::write(out.path().join("secret"), "host").unwrap();
        std::fs::create_dir(t.path().join("src")).unwrap();
        std::fs::write(t.path().join("src/a.rs"), "a").unwrap();
        std::os::unix::fs::symlink(out.path(), t.path().join("d")).unwrap();
        std::os::unix::fs::symlink("src/a.rs", t.path().join("inlink")).unwrap();
        std::os::unix::fs::symlink("../..", t.path().join("src/up")).unwrap();
        let r = RootDir::open(t.path()).unwrap();
        assert_eq!(r.read(Path::new("inlink")).unwrap(), b"a");
        assert!(r.read(Path::new("d/secret")).is_err());
        assert!(r.read(Path::new("src/up/etc/passwd")).is_err());
        assert!(r.read(Path::new("../x")).is_err());
        assert!(r.read(Path::new("/etc/passwd")).is_err());
        assert!(r.write(Path::new("d/pwned"), b"x").is_err());
        assert!(r.create_dir_all(Path::new("d/sub/deeper")).is_err());
        assert!(r.remove_file(Path::new("d/secret")).is_err());
        assert!(r.read_dir(Path::new("d")).is_err());
        assert!(!out.path().join("pwned").exists());
        assert!(!out.path().join("sub").exists());
        assert!(out.path().join("secret").exists());
        r.create_dir_all(Path::new("new/dir")).unwrap();
        r.write(Path::new("new/dir/f"), b"ok").unwrap();
        assert_eq!(std::fs::read(t.path().join("new/dir/f")).unwrap(), b"ok");
        r.write(Path::new("new/dir/f"), b"k").unwrap();
        assert_eq!(std::fs::read(t.path().join("new/dir/f")).unwrap(), b"k");
        r.remove_file(Path::new("new/dir/f")).unwrap();
        assert!(!r.exists(Path::new("new/dir/f")));
        assert!(r.remove_all(Path::new("d/secret")).is_err());
        std::os::unix::fs::symlink(out.path(), t.path().join("new/dir/link")).unwrap();
        r.write(Path::new("new/dir/g"), b"g").unwrap();
        r.remove_all(Path::new("new")).unwrap();
        assert!(!t.path().join("new").exists());
        assert!(out.path().join("secret").exists());
        r.remove_all(Path::new("d")).unwrap();
        assert!(out.path().join("secret").exists());
        assert!(t.path().join("d").symlink_metadata().is_err());
    }

    /// What the `ignore` crate's walker (as the tools used it before) lists under `start`.
    fn crate_walk(root: &Path, start: &str) -> Vec<String> {
        let base = root.join(start);
        ignore::WalkBuilder::new(&base)
            .hidden(false)
            .require_git(false)
            .filter_entry(|e| e.file_name() != ".git")
            .sort_by_file_path(|a, b| a.cmp(b))
            .build()
            .flatten()
            .filter(|e| e.depth() > 0)
            .map(|e| e.path().strip_prefix(root).unwrap().display().to_string())
            .collect()
    }

    fn our_walk(root: &Path, start: &str) -> Vec<String> {
        let mut seen = Vec::new();
        RootDir::open(root)
            .unwrap()
            .walk(Path::new(start), &mut |e| {
                seen.push(e.rel.display().to_string());
                ControlFlow::Continue(())
            })
            .unwrap();
        seen
    }

    #[test]
    fn the_walk_keeps_ignore_rules_and_does_not_follow_links() {
        let t = tempfile::tempdir().unwrap();
        let out = tempfile::tempdir().unwrap();
        std::fs::write(out.path().join("secret"), "host").unwrap();
        let p = t.path();
        std::fs::create_dir_all(p.join("src/gen")).unwrap();
        std::fs::create_dir_all(p.join(".git/info")).unwrap();
        std::fs::write(p.join(".git/info/exclude"), "excluded.txt\n").unwrap();
        std::fs::write(p.join(".gitignore"), "*.log\ntarget/\n!keep.log\n").unwrap();
        std::fs::write(p.join("src/.gitignore"), "gen/\n").unwrap();
        for f in [
            "a.log",
            "keep.log",
            "excluded.txt",
            "src/b.rs",
            "src/gen/x.rs",
            ".hidden",
        ] {
            std::fs::write(p.join(f), "x").unwrap();
        }
        std::fs::create_dir(p.join("target")).unwrap();
        std::fs::write(p.join("target/t"), "x").unwrap();
        std::os::unix::fs::symlink(out.path(), p.join("d")).unwrap();
        let r = RootDir::open(p).unwrap();
        let mut seen = Vec::new();
        r.walk(Path::new("."), &mut |e| {
            seen.push((e.rel.display().to_string(), e.kind));
            ControlFlow::Continue(())
        })
        .unwrap();
        let names: Vec<&str> = seen.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                ".gitignore",
                ".hidden",
                "d",
                "keep.log",
                "src",
                "src/.gitignore",
                "src/b.rs"
            ]
        );
        assert_eq!(seen[2].1, Kind::Symlink);
        // From a subdirectory the rules above it still hold.
        let mut sub = Vec::new();
        r.walk(Path::new("src"), &mut |e| {
            sub.push(e.rel.display().to_string());
            ControlFlow::Continue(())
        })
        .unwrap();
        assert_eq!(sub, ["src/.gitignore", "src/b.rs"]);
        assert_eq!(our_walk(p, ""), crate_walk(p, ""));
        assert_eq!(our_walk(p, "src"), crate_walk(p, "src"));
    }

    #[test]
    fn ignore_files_above_the_root_count() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path();
        std::fs::create_dir_all(p.join("repo/.git")).unwrap();
        std::fs::create_dir_all(p.join("repo/sub")).unwrap();
        std::fs::write(p.join(".gitignore"), "*.rs\n").unwrap();
        std::fs::write(p.join("repo/.gitignore"), "*.log\n").unwrap();
        for f in ["a.log", "b.rs", "c.txt"] {
            std::fs::write(p.join("repo/sub").join(f), "x").unwrap();
        }
        let r = RootDir::open(&p.join("repo/sub")).unwrap();
        let mut seen = Vec::new();
        r.walk(Path::new(""), &mut |e| {
            seen.push(e.rel.display().to_string());
            ControlFlow::Continue(())
        })
        .unwrap();
        // Without requiring git, every .gitignore up to `/` holds (as the crate's walker).
        assert_eq!(seen, ["c.txt"]);
        assert_eq!(seen, crate_walk(&p.join("repo/sub"), ""));
        assert_eq!(
            our_walk(&p.join("repo"), "sub"),
            crate_walk(&p.join("repo"), "sub")
        );
    }
}
