//! Applying a committed journal, and rolling back an uncommitted one.
//!
//! Every op is idempotent, so roll-forward after a crash simply runs the whole list again:
//! - `Place`: rename staged `n` onto the path only while `n` still exists in staging;
//! - `Dir`: mkdir tolerates an existing directory, then sets the mode;
//! - `RenameDir`: only while `from` still is the journaled directory;
//! - `Delete`: only while the path still is the journaled object.
//!
//! Replaced and deleted objects are *renamed* to `.shade-trash-<id>-<n>` beside them rather
//! than removed, which makes a delete one atomic step and keeps their inodes alive (so a
//! newly created object cannot reuse an inode number and be mistaken for a delete's base on
//! a re-run). Trash and staging are removed only after the journal says `Applied`.

use super::journal::{
    journal_path, rescued_name, trash_name, xdev_tmp_name, JOp, JPath, Journal, Phase, SetAside,
};
use super::safe_path::{base_matches, changed_below, observe, open_parent, rebase, Walker};
use super::{fault, stage, sys};
use crate::fingerprint::{Base, Fingerprint};
use crate::plan::Perms;
use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

/// Attach a path to an error so a failed recovery says where.
fn ctx(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

fn is_gone(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOENT) | Some(libc::ENOTDIR) | Some(libc::ELOOP)
    )
}

struct Exec<'a> {
    root: OwnedFd,
    staging: OwnedFd,
    j: &'a Journal,
    /// Parent dirs (relative) whose entries changed, to fsync before `Applied`.
    touched: BTreeSet<PathBuf>,
    /// Ops not applied because their path is no longer what the journal expects.
    set_aside: Vec<SetAside>,
    /// The directories of the last op's walk, kept open for the next (deep chains).
    walker: Walker,
}

/// Why an op leaves its path alone: what is there is not what the accept expected.
enum Skip {
    /// Not applied; the reason says what was found.
    Changed(String),
}

type OpResult = io::Result<Result<(), Skip>>;

fn describe(b: &Base) -> &'static str {
    match b {
        Base::Absent => "nothing",
        Base::Present(fp) => match fp.mode & libc::S_IFMT {
            libc::S_IFDIR => "a directory",
            libc::S_IFLNK => "a symlink",
            libc::S_IFREG => "a file",
            _ => "a special file",
        },
    }
}

/// Whether a failed walk to a path's parent means the tree changed under it (a parent that
/// became a symlink or a file, or went away) rather than an I/O failure.
fn blocked(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOTDIR) | Some(libc::ELOOP) | Some(libc::ENOENT)
    )
}

fn parent_changed(e: &io::Error) -> Skip {
    Skip::Changed(format!(
        "a parent directory was replaced or removed during the accept ({e})"
    ))
}

fn parent_of(p: &Path) -> PathBuf {
    p.parent().map(Path::to_path_buf).unwrap_or_default()
}

impl Exec<'_> {
    /// Move `name` in `dir` to this op's trash name beside it.
    fn trash(&self, dir: RawFd, name: &OsStr, n: usize) -> io::Result<()> {
        let t = trash_name(&self.j.id, n);
        fault::step()?;
        match sys::rename_at(dir, name, dir, OsStr::new(&t), true) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                // Left by an earlier run of this very op; it is ours to drop.
                sys::remove_tree_at(dir, OsStr::new(&t))?;
                sys::rename_at(dir, name, dir, OsStr::new(&t), true)
            }
            r => r,
        }
    }

    /// Whether what is at `name` in `parent` is still what the journal expects (`pre`); if
    /// not, what is there instead. A version 1 journal has no pre-states: there, anything
    /// changed after the journal was written counts as changed.
    fn changed_since(
        &self,
        parent: RawFd,
        name: &OsStr,
        pre: &Option<Base>,
    ) -> io::Result<Option<String>> {
        let now = match sys::lstat_at(parent, name)? {
            Some(st) => Base::Present(Fingerprint::from_stat(&st)),
            None => Base::Absent,
        };
        Ok(match pre {
            Some(pre) if base_matches(pre, &now) => None,
            Some(pre) => Some(if describe(pre) == describe(&now) {
                format!("{} changed since the accept began", describe(&now))
            } else {
                format!(
                    "found {} instead of {} (changed since the accept began)",
                    describe(&now),
                    describe(pre)
                )
            }),
            None => match (now, self.j.written_ns) {
                (Base::Present(fp), Some(t)) if fp.ctime_ns > t => {
                    Some("changed after the accept's commit point".into())
                }
                _ => None,
            },
        })
    }

    fn run(&mut self, op: &JOp) -> io::Result<()> {
        let outcome = match op {
            JOp::Place {
                n,
                path,
                symlink,
                pre,
            } => self.place(*n, path.path(), *symlink, pre),
            JOp::Dir {
                n,
                path,
                mode,
                uid,
                gid,
                xattrs,
                pre,
                staged,
                ..
            } => self.dir(
                *n,
                path.path(),
                // Times come last (`set_dir_times`): entries placed later would move them.
                &Perms {
                    mode: *mode,
                    uid: *uid,
                    gid: *gid,
                    times: None,
                    xattrs: xattrs.clone(),
                    origin: None,
                },
                pre,
                *staged,
            ),
            JOp::Link {
                n,
                path,
                target,
                pre,
            } => self.link(*n, path.path(), target.path(), pre),
            JOp::RenameDir {
                n,
                from,
                to,
                base_from,
                base_to,
            } => self.rename_dir(*n, from.path(), to.path(), base_from, base_to),
            JOp::Delete { n, path, base } => self.delete(*n, path.path(), base),
        };
        // What the op replaced, moved or removed is opened again by the next walk.
        match op {
            JOp::RenameDir { from, to, .. } => {
                self.walker.forget(from.path());
                self.walker.forget(to.path());
            }
            _ => self.walker.forget(op.trash_parent().1),
        }
        let outcome = outcome?;
        if let Err(Skip::Changed(reason)) = outcome {
            let (n, path) = op.trash_parent();
            let kept = match op {
                JOp::Place { .. } => {
                    let staged = n.to_string();
                    sys::lstat_at(self.staging.as_raw_fd(), OsStr::new(&staged))?.is_some()
                }
                _ => false,
            };
            tracing::warn!(path = %path.display(), %reason, "accept: not applied");
            self.set_aside.push(SetAside {
                n,
                path: JPath::new(path),
                reason,
                kept,
            });
        }
        Ok(())
    }

    fn place(&mut self, n: usize, path: &Path, symlink: bool, pre: &Option<Base>) -> OpResult {
        let staged = n.to_string();
        let staged = OsStr::new(&staged);
        if sys::lstat_at(self.staging.as_raw_fd(), staged)?.is_none() {
            return Ok(Ok(())); // placed by an earlier run
        }
        let (parent, name) = match self.walker.open_parent_create(path) {
            Err(e) if blocked(&e) => return Ok(Err(parent_changed(&e))),
            r => r?,
        };
        if let Some(why) = self.changed_since(parent.as_raw_fd(), &name, pre)? {
            return Ok(Err(Skip::Changed(why)));
        }
        if let Some(st) = sys::lstat_at(parent.as_raw_fd(), &name)? {
            if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                self.trash(parent.as_raw_fd(), &name, n)?;
            }
        }
        fault::step()?;
        match sys::rename_at(
            self.staging.as_raw_fd(),
            staged,
            parent.as_raw_fd(),
            &name,
            false,
        ) {
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
                self.place_xdev(n, &parent, &name, symlink)?
            }
            r => r?,
        }
        self.touched.insert(parent_of(path));
        Ok(Ok(()))
    }

    /// The target is on another file system than the staging dir (a nested mount): copy the
    /// staged object to a temp file beside the target, fsync, rename it into place, and only
    /// then drop the staged copy (so a re-run redoes the copy, never loses it).
    fn place_xdev(
        &self,
        n: usize,
        parent: &OwnedFd,
        name: &OsStr,
        symlink: bool,
    ) -> io::Result<()> {
        let staged = n.to_string();
        let staged = OsStr::new(&staged);
        let tmp = xdev_tmp_name(&self.j.id, n);
        let tmp = OsStr::new(&tmp);
        sys::remove_tree_at(parent.as_raw_fd(), tmp)?;
        let st = sys::lstat_at(self.staging.as_raw_fd(), staged)?
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        let times = Some((
            (st.st_atime, st.st_atime_nsec),
            (st.st_mtime, st.st_mtime_nsec),
        ));
        if symlink {
            let target = sys::readlink_at(self.staging.as_raw_fd(), staged)?;
            sys::symlink_at(
                std::os::unix::ffi::OsStrExt::from_bytes(&target[..]),
                parent.as_raw_fd(),
                tmp,
            )?;
        } else if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            sys::mknod_at(parent.as_raw_fd(), tmp, st.st_mode, st.st_rdev)?;
            let (uid, gid) = (Some(st.st_uid), Some(st.st_gid));
            sys::chown_chmod_at(parent.as_raw_fd(), tmp, uid, gid, st.st_mode & 0o7777)?;
            if let Some((a, m)) = times {
                sys::set_times_at(parent.as_raw_fd(), tmp, a, m)?;
            }
        } else {
            let mut src = sys::open_file_at(self.staging.as_raw_fd(), staged)?;
            let mut out = sys::create_file_at(parent.as_raw_fd(), tmp, false)?;
            io::copy(&mut src, &mut out)?;
            let xattrs = sys::list_xattrs(src.as_raw_fd())?
                .into_iter()
                .filter_map(|n| {
                    let v = sys::get_xattr(src.as_raw_fd(), &n).ok()?;
                    Some((n, v))
                })
                .collect();
            let perms = Perms {
                mode: st.st_mode & 0o7777,
                uid: Some(st.st_uid),
                gid: Some(st.st_gid),
                times,
                xattrs: Some(xattrs),
                origin: None,
            };
            stage::set_perms(&out, &perms)?;
            sys::fsync(&out)?;
        }
        sys::rename_at(parent.as_raw_fd(), tmp, parent.as_raw_fd(), name, false)?;
        sys::fsync(parent)?;
        fault::step()?;
        sys::unlink_at(self.staging.as_raw_fd(), staged, false)
    }

    fn dir(
        &mut self,
        n: usize,
        path: &Path,
        perms: &Perms,
        pre: &Option<Base>,
        staged: bool,
    ) -> OpResult {
        let (parent, name) = match self.walker.open_parent_create(path) {
            Err(e) if blocked(&e) => return Ok(Err(parent_changed(&e))),
            r => r?,
        };
        let staged_name = n.to_string();
        let staged_name = OsStr::new(&staged_name);
        match sys::lstat_at(parent.as_raw_fd(), &name)? {
            Some(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {
                // Ours from an earlier run, or one made meanwhile: used as it is.
                if staged {
                    sys::remove_tree_at(self.staging.as_raw_fd(), staged_name)?;
                }
            }
            existing => {
                if existing.is_some() {
                    if let Some(why) = self.changed_since(parent.as_raw_fd(), &name, pre)? {
                        return Ok(Err(Skip::Changed(why)));
                    }
                    self.trash(parent.as_raw_fd(), &name, n)?;
                }
                fault::step()?;
                let have_staged =
                    staged && sys::lstat_at(self.staging.as_raw_fd(), staged_name)?.is_some();
                if have_staged {
                    // A rename needs no new inode, so a full file system cannot stop it.
                    match sys::rename_at(
                        self.staging.as_raw_fd(),
                        staged_name,
                        parent.as_raw_fd(),
                        &name,
                        true,
                    ) {
                        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
                            sys::mkdir_at(parent.as_raw_fd(), &name, 0o700)?;
                            sys::remove_tree_at(self.staging.as_raw_fd(), staged_name)?;
                        }
                        r => r?,
                    }
                } else {
                    match sys::mkdir_at(parent.as_raw_fd(), &name, 0o700) {
                        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
                        r => r?,
                    }
                }
                self.touched.insert(parent_of(path));
            }
        }
        let d = sys::open_dir_at(parent.as_raw_fd(), &name)?;
        stage::set_perms(&d, perms)?;
        Ok(Ok(()))
    }

    /// Make `path` a hard link to `target`: linked under a temporary name beside `path`,
    /// then renamed over it, so `path` is always the old or the new file.
    fn link(&mut self, n: usize, path: &Path, target: &Path, pre: &Option<Base>) -> OpResult {
        let (tp, tname) = match open_parent(self.root.as_raw_fd(), target, false) {
            Err(e) if blocked(&e) => return Ok(Err(parent_changed(&e))),
            r => r?,
        };
        let Some(tst) = sys::lstat_at(tp.as_raw_fd(), &tname)? else {
            return Ok(Err(Skip::Changed(format!(
                "the file it is a link to, {}, is gone",
                target.display()
            ))));
        };
        let (parent, name) = match open_parent(self.root.as_raw_fd(), path, true) {
            Err(e) if blocked(&e) => return Ok(Err(parent_changed(&e))),
            r => r?,
        };
        if let Some(st) = sys::lstat_at(parent.as_raw_fd(), &name)? {
            if st.st_dev == tst.st_dev && st.st_ino == tst.st_ino {
                return Ok(Ok(())); // linked by an earlier run
            }
        }
        if let Some(why) = self.changed_since(parent.as_raw_fd(), &name, pre)? {
            return Ok(Err(Skip::Changed(why)));
        }
        if let Some(st) = sys::lstat_at(parent.as_raw_fd(), &name)? {
            if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                self.trash(parent.as_raw_fd(), &name, n)?;
            }
        }
        let tmp = xdev_tmp_name(&self.j.id, n);
        let tmp = OsStr::new(&tmp);
        sys::remove_tree_at(parent.as_raw_fd(), tmp)?;
        fault::step()?;
        sys::link_at(tp.as_raw_fd(), &tname, parent.as_raw_fd(), tmp)?;
        sys::rename_at(parent.as_raw_fd(), tmp, parent.as_raw_fd(), &name, false)?;
        self.touched.insert(parent_of(path));
        Ok(Ok(()))
    }

    fn rename_dir(
        &mut self,
        n: usize,
        from: &Path,
        to: &Path,
        base_from: &Base,
        base_to: &Base,
    ) -> OpResult {
        if !base_matches(base_from, &observe(self.root.as_raw_fd(), from)?.base()) {
            return Ok(Ok(())); // renamed by an earlier run
        }
        let (tp, tname) = match open_parent(self.root.as_raw_fd(), to, true) {
            Err(e) if blocked(&e) => return Ok(Err(parent_changed(&e))),
            r => r?,
        };
        if let Some(st) = sys::lstat_at(tp.as_raw_fd(), &tname)? {
            if base_matches(base_to, &Base::Present(Fingerprint::from_stat(&st))) {
                self.trash(tp.as_raw_fd(), &tname, n)?;
            } else {
                return Ok(Err(Skip::Changed(format!(
                    "{} appeared at the destination during the accept; {} was not moved",
                    describe(&Base::Present(Fingerprint::from_stat(&st))),
                    from.display()
                ))));
            }
        }
        let (fp, fname) = match open_parent(self.root.as_raw_fd(), from, false) {
            Err(e) if blocked(&e) => return Ok(Err(parent_changed(&e))),
            r => r?,
        };
        fault::step()?;
        sys::rename_at(fp.as_raw_fd(), &fname, tp.as_raw_fd(), &tname, true)?;
        self.touched.insert(parent_of(from));
        self.touched.insert(parent_of(to));
        Ok(Ok(()))
    }

    fn delete(&mut self, n: usize, path: &Path, base: &Base) -> OpResult {
        if *base == Base::Absent {
            return Ok(Ok(())); // (forced) nothing was there
        }
        let now = observe(self.root.as_raw_fd(), path)?.base();
        if !base_matches(base, &now) {
            // Trashed by an earlier run (then its trash is beside it, and what is there now
            // is a later op's), or removed meanwhile: either way gone. Anything else there
            // now is a change made since, left alone.
            if now == Base::Absent {
                return Ok(Ok(()));
            }
            let trashed = match open_parent(self.root.as_raw_fd(), path, false) {
                Ok((parent, _)) => {
                    sys::lstat_at(parent.as_raw_fd(), OsStr::new(&trash_name(&self.j.id, n)))?
                        .is_some()
                }
                Err(e) if is_gone(&e) => false,
                Err(e) => return Err(e),
            };
            return Ok(if trashed {
                Ok(())
            } else {
                Err(Skip::Changed(format!(
                    "{} changed since the accept began; not deleted",
                    describe(&now)
                )))
            });
        }
        let (parent, name) = match open_parent(self.root.as_raw_fd(), path, false) {
            Err(e) if is_gone(&e) => return Ok(Ok(())),
            r => r?,
        };
        // A whole tree goes: not if something in it changed since the accept began.
        if let (Base::Present(fp), Some(since)) = (base, self.j.written_ns) {
            if fp.is_dir() {
                let dir = sys::open_dir_at(parent.as_raw_fd(), &name)?;
                if changed_below(dir.as_raw_fd(), since)? {
                    return Ok(Err(Skip::Changed(
                        "something inside it changed since the accept began; not deleted".into(),
                    )));
                }
            }
        }
        self.trash(parent.as_raw_fd(), &name, n)?;
        self.touched.insert(parent_of(path));
        Ok(Ok(()))
    }
}

/// Why a roll-forward stopped: the step that failed, and how many ops were done before it.
#[derive(Debug)]
pub struct Stopped {
    pub path: PathBuf,
    pub source: io::Error,
    pub done: usize,
}

impl From<Stopped> for io::Error {
    fn from(s: Stopped) -> io::Error {
        ctx(&s.path, s.source)
    }
}

/// Finish a journal whose phase is `Committed` or `Applied`: run every op (idempotently,
/// leaving alone every path that is no longer what the journal expects), mark it `Applied`,
/// then remove trash, staging and the journal itself. Returns what was set aside.
pub fn roll_forward(j: &mut Journal, dir: &Path) -> Result<Vec<SetAside>, Stopped> {
    let stop = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Stopped {
            path,
            source,
            done: 0,
        }
    };
    let root = sys::open_dir_path(j.root.path()).map_err(stop(j.root.path()))?;
    sys::lock_exclusive(&root).map_err(stop(j.root.path()))?;
    if !journal_path(dir, &j.id).exists() {
        return Ok(Vec::new()); // a live accept finished it while we waited for the lock
    }
    roll_forward_locked(root, j, dir)
}

/// `roll_forward` with the project root already open and locked by the caller.
pub fn roll_forward_locked(
    root: OwnedFd,
    j: &mut Journal,
    dir: &Path,
) -> Result<Vec<SetAside>, Stopped> {
    let root_path = j.root.path().to_path_buf();
    let mut done = 0;
    let stop = |path: PathBuf, done: usize| move |source| Stopped { path, source, done };
    if j.phase == Phase::Committed {
        let staging_path = root_path.join(&j.staging);
        let staging = sys::open_dir_at(root.as_raw_fd(), OsStr::new(&j.staging))
            .map_err(stop(staging_path, 0))?;
        let snapshot = j.clone();
        let mut ex = Exec {
            walker: Walker::new(root.as_raw_fd()),
            root,
            staging,
            j: &snapshot,
            touched: BTreeSet::new(),
            set_aside: Vec::new(),
        };
        for op in &snapshot.ops {
            let (_, p) = op.trash_parent();
            ex.run(op).map_err(stop(root_path.join(p), done))?;
            done += 1;
        }
        // Syncing moves nothing: the walks share their open directories.
        let mut synced = Walker::new(ex.root.as_raw_fd());
        for d in &ex.touched {
            match synced.open_dir(d) {
                Ok(fd) => sys::fsync(&fd).map_err(stop(root_path.join(d), done))?,
                Err(e) if is_gone(&e) => {}
                Err(e) => return Err(stop(root_path.join(d), done)(e)),
            }
        }
        fault::step().map_err(stop(dir.to_path_buf(), done))?;
        j.phase = Phase::Applied;
        j.set_aside = std::mem::take(&mut ex.set_aside);
        j.store(dir).map_err(stop(dir.to_path_buf(), done))?;
        clean_up(&ex.root, j, dir).map_err(stop(root_path.clone(), done))?;
        return Ok(j.set_aside.clone());
    }
    clean_up(&root, j, dir).map_err(stop(root_path, j.ops.len()))?;
    Ok(j.set_aside.clone())
}

/// Remove every trash entry, the staging dir and then the journal.
fn clean_up(root: &OwnedFd, j: &Journal, dir: &Path) -> io::Result<()> {
    // Only trash (reserved names) is removed below: no directory on a walk moves.
    let mut walker = Walker::new(root.as_raw_fd());
    for (i, op) in j.ops.iter().enumerate() {
        let (n, p) = op.trash_parent();
        // Trash left inside a directory that a later op moved has moved with it (deletes
        // run while moved directories sit at their temporary names).
        let mut p = p.to_path_buf();
        for later in &j.ops[i + 1..] {
            if let JOp::RenameDir { from, to, .. } = later {
                if let Some(q) = rebase(&p, from.path(), to.path()) {
                    p = q;
                }
            }
        }
        let parent = match walker.open_parent(&p) {
            Ok((fd, _)) => fd,
            Err(e) if is_gone(&e) => continue, // an ancestor was trashed as a whole
            Err(e) => return Err(e),
        };
        let t = trash_name(&j.id, n);
        if sys::lstat_at(parent.as_raw_fd(), OsStr::new(&t))?.is_some() {
            fault::step()?;
            sys::remove_tree_at(parent.as_raw_fd(), OsStr::new(&t))?;
        }
    }
    fault::step()?;
    if j.set_aside.iter().any(|s| s.kept) {
        // The branch's versions of what was set aside stay, under a name that says so.
        match sys::rename_at(
            root.as_raw_fd(),
            OsStr::new(&j.staging),
            root.as_raw_fd(),
            OsStr::new(&rescued_name(&j.id)),
            true,
        ) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {} // renamed by an earlier run
            r => r?,
        }
    } else {
        sys::remove_tree_at(root.as_raw_fd(), OsStr::new(&j.staging))?;
    }
    set_dir_times(root, j)?;
    sys::fsync(root)?;
    fault::step()?;
    j.remove(dir)
}

/// Give every directory the plan touched the times the branch showed, now that nothing
/// more changes inside it (trash and staging are gone). Idempotent.
fn set_dir_times(root: &OwnedFd, j: &Journal) -> io::Result<()> {
    // Setting times moves nothing: the walks share their open directories.
    let mut walker = Walker::new(root.as_raw_fd());
    for op in j.ops.iter().rev() {
        let JOp::Dir {
            path,
            times: Some((atime, mtime)),
            ..
        } = op
        else {
            continue;
        };
        match walker.open_dir(path.path()) {
            Ok(fd) => sys::set_times_at(fd.as_raw_fd(), OsStr::new(""), *atime, *mtime)?,
            Err(e) if is_gone(&e) => {}
            Err(e) => return Err(ctx(path.path(), e)),
        }
    }
    Ok(())
}

/// Undo an accept that never reached its commit point: the real tree was never touched,
/// so dropping the staging dir and the journal is all there is.
pub fn roll_back(j: &Journal, dir: &Path) -> io::Result<()> {
    match sys::open_dir_path(j.root.path()) {
        Ok(root) => {
            sys::lock_exclusive(&root)?;
            if !journal_path(dir, &j.id).exists() {
                return Ok(());
            }
            roll_back_locked(&root, j, dir)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => j.remove(dir),
        Err(e) => Err(ctx(j.root.path(), e)),
    }
}

/// `roll_back` with the project root already open and locked by the caller.
pub fn roll_back_locked(root: &OwnedFd, j: &Journal, dir: &Path) -> io::Result<()> {
    fault::step()?;
    sys::remove_tree_at(root.as_raw_fd(), OsStr::new(&j.staging))?;
    sys::fsync(root)?;
    // Nothing of this accept reaches the project: neither does its history entry (removed
    // before the journal, so a crash in between still finds the journal and comes back here).
    super::history::discard(&super::history::beside_journals(dir), &j.id)?;
    j.remove(dir)
}
