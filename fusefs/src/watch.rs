//! Keeping kernel caches honest while lower changes under a live branch.
//!
//! The kernel may cache entries, attributes, directory listings and pages of lower
//! objects only because this watcher tells it when they change: every lower directory
//! the branch has shown gets an inotify watch, and each event becomes an
//! `inval_entry`/`inval_inode` for the paths the branch has not overridden. Without a
//! watcher (inotify unavailable) the branch simply does not cache lower objects.

use crate::overlay::Overlay;
use crate::tree::Entry;
use fuser::{INodeNo, Notifier};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

/// inotify watches on the lower directories a branch has shown.
pub(crate) struct LowerWatch {
    inotify: Inotify,
    root: PathBuf,
    dirs: Mutex<Dirs>,
    stop: AtomicBool,
}

#[derive(Default)]
struct Dirs {
    by_wd: HashMap<WatchDescriptor, PathBuf>,
    watched: HashSet<PathBuf>,
}

const EVENTS: AddWatchFlags = AddWatchFlags::IN_CREATE
    .union(AddWatchFlags::IN_DELETE)
    .union(AddWatchFlags::IN_MOVED_FROM)
    .union(AddWatchFlags::IN_MOVED_TO)
    .union(AddWatchFlags::IN_MODIFY)
    .union(AddWatchFlags::IN_ATTRIB)
    .union(AddWatchFlags::IN_CLOSE_WRITE)
    .union(AddWatchFlags::IN_DELETE_SELF)
    .union(AddWatchFlags::IN_MOVE_SELF)
    .union(AddWatchFlags::IN_DONT_FOLLOW)
    .union(AddWatchFlags::IN_ONLYDIR);

impl LowerWatch {
    /// A watcher for the lower tree at `root`, or `None` where inotify is unavailable
    /// (e.g. the per-user instance limit is reached).
    pub fn new(root: &Path) -> Option<LowerWatch> {
        let inotify = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK)
            .map_err(|e| {
                tracing::info!("no inotify for lower changes ({e}); lower objects are not cached")
            })
            .ok()?;
        let w = LowerWatch {
            inotify,
            root: root.to_path_buf(),
            dirs: Mutex::default(),
            stop: AtomicBool::new(false),
        };
        w.watch_dir(Path::new("")).then_some(w)
    }

    /// Watch lower directory `rel` (idempotent). Returns false if the watch failed, in
    /// which case the caller must not let the kernel cache what is below it.
    pub fn watch_dir(&self, rel: &Path) -> bool {
        let mut dirs = self.dirs.lock().unwrap_or_else(PoisonError::into_inner);
        if dirs.watched.contains(rel) {
            return true;
        }
        match self.inotify.add_watch(&self.root.join(rel), EVENTS) {
            Ok(wd) => {
                dirs.by_wd.insert(wd, rel.to_path_buf());
                dirs.watched.insert(rel.to_path_buf());
                true
            }
            Err(e) => {
                tracing::debug!("inotify watch on {}: {e}", rel.display());
                false
            }
        }
    }

    /// Ask the event thread to end (it polls this flag).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Turn inotify events into kernel cache invalidations until stopped.
    pub fn run(self: Arc<Self>, overlay: Weak<Overlay>, notifier: Notifier) {
        while !self.stop.load(Ordering::Relaxed) {
            let mut fds = [nix::poll::PollFd::new(
                self.inotify.as_fd(),
                nix::poll::PollFlags::POLLIN,
            )];
            match nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(200u16)) {
                Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!("inotify poll: {e}");
                    return;
                }
            }
            let Ok(events) = self.inotify.read_events() else {
                continue;
            };
            let Some(overlay) = overlay.upgrade() else {
                return;
            };
            let mut changed: Vec<(PathBuf, Option<OsString>)> = Vec::new();
            {
                let mut dirs = self.dirs.lock().unwrap_or_else(PoisonError::into_inner);
                for ev in events {
                    let Some(dir) = dirs.by_wd.get(&ev.wd).cloned() else {
                        continue;
                    };
                    if ev.mask.intersects(
                        AddWatchFlags::IN_IGNORED
                            | AddWatchFlags::IN_DELETE_SELF
                            | AddWatchFlags::IN_MOVE_SELF,
                    ) {
                        dirs.by_wd.remove(&ev.wd);
                        dirs.watched.remove(&dir);
                    }
                    changed.push((dir, ev.name));
                }
            }
            for (parent_ino, name, ino) in invalidations(&overlay, &changed) {
                if let (Some(p), Some(n)) = (parent_ino, &name) {
                    let _ = notifier.inval_entry(INodeNo(p), n);
                }
                if let Some(i) = ino {
                    overlay.forget_lower_fd(i);
                    let _ = notifier.inval_inode(INodeNo(i), 0, 0);
                }
            }
        }
    }
}

/// Which kernel objects to invalidate for lower changes `(dir, name)`, skipping paths
/// the branch overrides (its own view does not change). Lower paths are shown at the
/// same branch path unless a directory was renamed in the branch; entries under renamed
/// directories are re-validated when their attribute timeout expires.
fn invalidations(
    overlay: &Overlay,
    changed: &[(PathBuf, Option<OsString>)],
) -> Vec<(Option<u64>, Option<OsString>, Option<u64>)> {
    let t = overlay.tree();
    let mut out = Vec::new();
    for (dir, name) in changed {
        if t.lower_of(dir).as_deref() != Some(dir.as_path()) {
            continue;
        }
        let dir_ino = t.path_ino.get(dir).copied();
        match name {
            Some(n) => {
                let child = dir.join(n);
                if matches!(
                    t.slots.get(&child).map(|s| &s.entry),
                    Some(Entry::Node(_) | Entry::Whiteout)
                ) {
                    continue;
                }
                out.push((dir_ino, Some(n.clone()), t.path_ino.get(&child).copied()));
                out.push((None, None, dir_ino));
            }
            None => out.push((None, None, dir_ino)),
        }
    }
    out
}
