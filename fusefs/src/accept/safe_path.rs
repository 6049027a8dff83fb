//! Plan path validation and symlink-proof traversal of the project tree.
//!
//! A branch is untrusted input: its plan may name `../x`, and the user (or the branch's
//! own earlier ops) may have turned a directory into a symlink to `/tmp`. Every lookup here
//! walks one component at a time with `O_NOFOLLOW | O_DIRECTORY`, so a symlink anywhere in
//! a parent stops the walk instead of being followed out of the project.

use super::sys;
use crate::fingerprint::{Base, Fingerprint};
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Component, Path, PathBuf};

/// Prefixes of accept's own scratch names (staging dir, trash, EXDEV temp files); plans may
/// not name them, so a branch can never collide with (or aim at) an accept in progress.
pub const RESERVED_PREFIXES: [&str; 3] = [".shade-accept-", ".shade-trash-", ".shade-tmp-"];

/// Why `path` may not appear in a plan, or `None` when it is fine.
pub fn invalid_reason(path: &Path) -> Option<String> {
    if path.as_os_str().is_empty() {
        return Some("empty path".into());
    }
    for c in path.components() {
        match c {
            Component::Normal(n) => {
                let b = n.as_encoded_bytes();
                if let Some(pre) = RESERVED_PREFIXES
                    .iter()
                    .find(|pre| b.starts_with(pre.as_bytes()))
                {
                    return Some(format!("names starting with {pre} are reserved for accept"));
                }
            }
            Component::RootDir | Component::Prefix(_) => return Some("absolute path".into()),
            Component::ParentDir => return Some("`..` component".into()),
            Component::CurDir => return Some("`.` component".into()),
        }
    }
    // `Path::components` silently drops interior `.`; reject them on the raw bytes too.
    let raw = path.as_os_str().as_encoded_bytes();
    if raw
        .split(|b| *b == b'/')
        .any(|seg| seg == b"." || seg == b"..")
    {
        return Some("`.` or `..` component".into());
    }
    None
}

/// The parent components and final name of a validated relative path.
pub fn split(path: &Path) -> (Vec<&OsStr>, &OsStr) {
    let mut comps: Vec<&OsStr> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    let name = comps.pop().unwrap_or(OsStr::new(""));
    (comps, name)
}

/// Open the directory holding `path`'s last component, walking from `root` without
/// following symlinks. With `create`, missing parents are made (mode 0755) on the way.
pub fn open_parent(root: RawFd, path: &Path, create: bool) -> io::Result<(OwnedFd, OsString)> {
    let (parents, name) = split(path);
    let mut cur = dup_fd(root)?;
    for comp in parents {
        let next = match sys::open_dir_at(cur.as_raw_fd(), comp) {
            Err(e) if create && e.raw_os_error() == Some(libc::ENOENT) => {
                match sys::mkdir_at(cur.as_raw_fd(), comp, 0o755) {
                    Err(e) if e.raw_os_error() != Some(libc::EEXIST) => return Err(e),
                    _ => {}
                }
                sys::open_dir_at(cur.as_raw_fd(), comp)?
            }
            r => r?,
        };
        cur = next;
    }
    Ok((cur, name.to_os_string()))
}

/// Walks many paths beneath one root, keeping the directories of the last walk open: a
/// path sharing its first `k` components with the one before costs only the rest, so
/// visiting every level of a deep chain is linear, not quadratic, in its depth (a branch
/// can make a chain 2,000 deep in a second). A caller that moves, replaces or removes a
/// directory says so ([`Walker::forget`]): an fd kept open would not notice.
pub struct Walker {
    root: RawFd,
    /// The directories of the last walk, outermost first, with their names.
    chain: Vec<(OsString, OwnedFd)>,
}

impl Walker {
    /// A walker from `root` (which must outlive it).
    pub fn new(root: RawFd) -> Walker {
        Walker {
            root,
            chain: Vec::new(),
        }
    }

    /// Forgets the directories of the last walk at and below `path`: an op replaced,
    /// moved or removed what is there, so the next walk opens it again.
    pub fn forget(&mut self, path: &Path) {
        let comps: Vec<&OsStr> = path
            .components()
            .filter_map(|c| match c {
                Component::Normal(n) => Some(n),
                _ => None,
            })
            .collect();
        let same = self
            .chain
            .iter()
            .zip(&comps)
            .take_while(|((have, _), want)| have.as_os_str() == **want)
            .count();
        if same == comps.len() {
            self.chain.truncate(same.saturating_sub(1));
        }
    }

    /// As [`open_parent`] with `create`: missing parents are made (mode 0755).
    pub fn open_parent_create(&mut self, path: &Path) -> io::Result<(OwnedFd, OsString)> {
        let (parents, name) = split(path);
        Ok((self.walk_with(&parents, true)?, name.to_os_string()))
    }

    /// The directory `comps` names, walking (without following symlinks) only what the
    /// last walk did not; an fd of its own for the caller.
    fn walk(&mut self, comps: &[&OsStr]) -> io::Result<OwnedFd> {
        self.walk_with(comps, false)
    }

    /// [`Walker::walk`], making missing directories with `create`.
    fn walk_with(&mut self, comps: &[&OsStr], create: bool) -> io::Result<OwnedFd> {
        let same = self
            .chain
            .iter()
            .zip(comps)
            .take_while(|((have, _), want)| have.as_os_str() == **want)
            .count();
        self.chain.truncate(same);
        for comp in &comps[same..] {
            let at = self
                .chain
                .last()
                .map_or(self.root, |(_, fd)| fd.as_raw_fd());
            let fd = match sys::open_dir_at(at, comp) {
                Err(e) if create && e.raw_os_error() == Some(libc::ENOENT) => {
                    match sys::mkdir_at(at, comp, 0o755) {
                        Err(e) if e.raw_os_error() != Some(libc::EEXIST) => return Err(e),
                        _ => {}
                    }
                    sys::open_dir_at(at, comp)?
                }
                r => r?,
            };
            self.chain.push((comp.to_os_string(), fd));
        }
        dup_fd(
            self.chain
                .last()
                .map_or(self.root, |(_, fd)| fd.as_raw_fd()),
        )
    }

    /// As [`open_parent`] without `create`.
    pub fn open_parent(&mut self, path: &Path) -> io::Result<(OwnedFd, OsString)> {
        let (parents, name) = split(path);
        Ok((self.walk(&parents)?, name.to_os_string()))
    }

    /// As [`observe`], walking only what the last walk did not.
    pub fn observe(&mut self, path: &Path) -> io::Result<Seen> {
        let (parents, name) = split(path);
        let same = self
            .chain
            .iter()
            .zip(&parents)
            .take_while(|((have, _), want)| have.as_os_str() == **want)
            .count();
        self.chain.truncate(same);
        for comp in &parents[same..] {
            let at = self.at();
            match sys::open_dir_at(at, comp) {
                Ok(fd) => self.chain.push((comp.to_os_string(), fd)),
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    return Ok(Seen::Base(Base::Absent))
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENOTDIR)) => {
                    return Ok(match sys::lstat_at(at, comp)? {
                        Some(st) => Seen::Blocked {
                            at: Fingerprint::from_stat(&st),
                        },
                        None => Seen::Base(Base::Absent),
                    });
                }
                Err(e) => return Err(e),
            }
        }
        Ok(Seen::Base(match sys::lstat_at(self.at(), name)? {
            Some(st) => Base::Present(Fingerprint::from_stat(&st)),
            None => Base::Absent,
        }))
    }

    /// The directory the last walk ended in.
    fn at(&self) -> RawFd {
        self.chain
            .last()
            .map_or(self.root, |(_, fd)| fd.as_raw_fd())
    }

    /// As [`open_dir`].
    pub fn open_dir(&mut self, path: &Path) -> io::Result<OwnedFd> {
        let comps: Vec<&OsStr> = path
            .components()
            .filter_map(|c| match c {
                Component::Normal(n) => Some(n),
                _ => None,
            })
            .collect();
        self.walk(&comps)
    }
}

/// Duplicate an fd so the walk can own every step.
fn dup_fd(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: borrowing a live fd for the duration of the call.
    let b = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    b.try_clone_to_owned()
}

/// What lies at a path, seen without following any symlink.
#[derive(Clone, Copy, Debug)]
pub enum Seen {
    /// The object at the path itself.
    Base(Base),
    /// A parent component is a symlink or not a directory: the path does not exist beneath
    /// the root as such; `at` is what blocks it.
    Blocked { at: Fingerprint },
}

impl Seen {
    /// As a base: a blocked path does not exist beneath the root.
    pub fn base(self) -> Base {
        match self {
            Seen::Base(b) => b,
            Seen::Blocked { .. } => Base::Absent,
        }
    }
}

/// Observe `path` beneath `root` without following symlinks in any component.
pub fn observe(root: RawFd, path: &Path) -> io::Result<Seen> {
    let (parents, name) = split(path);
    let mut cur = dup_fd(root)?;
    for comp in parents {
        match sys::open_dir_at(cur.as_raw_fd(), comp) {
            Ok(fd) => cur = fd,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                return Ok(Seen::Base(Base::Absent))
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENOTDIR)) => {
                return Ok(match sys::lstat_at(cur.as_raw_fd(), comp)? {
                    Some(st) => Seen::Blocked {
                        at: Fingerprint::from_stat(&st),
                    },
                    None => Seen::Base(Base::Absent),
                });
            }
            Err(e) => return Err(e),
        }
    }
    Ok(Seen::Base(match sys::lstat_at(cur.as_raw_fd(), name)? {
        Some(st) => Base::Present(Fingerprint::from_stat(&st)),
        None => Base::Absent,
    }))
}

/// Whether `now` is the object `expected` describes (dirs by identity, others by version).
pub fn base_matches(expected: &Base, now: &Base) -> bool {
    match (expected, now) {
        (Base::Absent, Base::Absent) => true,
        (Base::Present(a), Base::Present(b)) => a.matches(b),
        _ => false,
    }
}

/// `path` with the prefix `from` replaced by `to`, if it lies at or under `from`.
pub fn rebase(path: &Path, from: &Path, to: &Path) -> Option<PathBuf> {
    let rest = path.strip_prefix(from).ok()?;
    Some(if rest.as_os_str().is_empty() {
        to.to_path_buf()
    } else {
        to.join(rest)
    })
}

/// Open the directory at `path` (empty = `root` itself) without following symlinks.
pub fn open_dir(root: RawFd, path: &Path) -> io::Result<OwnedFd> {
    let mut cur = dup_fd(root)?;
    for c in path.components() {
        if let Component::Normal(n) = c {
            cur = sys::open_dir_at(cur.as_raw_fd(), n)?;
        }
    }
    Ok(cur)
}

/// Whether anything below the directory `dir` changed after `since` (ns since the epoch):
/// entries added, removed or renamed in a subdirectory, a file's content or mode.
pub fn changed_below(dir: RawFd, since: i64) -> io::Result<bool> {
    for name in sys::list_dir(dir)? {
        // Accept's own trash and temp files (of an accept running now) are no user change.
        let b = name.as_encoded_bytes();
        if b.starts_with(b".shade-trash-") || b.starts_with(b".shade-tmp-") {
            continue;
        }
        let Some(st) = sys::lstat_at(dir, &name)? else {
            continue;
        };
        let fp = Fingerprint::from_stat(&st);
        if fp.ctime_ns > since || fp.mtime_ns > since {
            return Ok(true);
        }
        if fp.is_dir() {
            let sub = sys::open_dir_at(dir, &name)?;
            if changed_below(sub.as_raw_fd(), since)? {
                return Ok(true);
            }
        }
    }
    Ok(false)
}
