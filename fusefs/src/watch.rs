//! Keeping kernel caches honest while lower changes under a live branch.
//!
//! The kernel may cache entries, attributes, directory listings and pages of lower
//! objects only because this watcher tells it when they change: every lower directory
//! the branch has shown gets an inotify watch, and each event becomes an
//! `inval_entry`/`inval_inode` for the paths the branch has not overridden. Without a
//! watcher (inotify unavailable) the branch simply does not cache lower objects.

use fuser::{INodeNo, Notifier};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use rustc_hash::FxHashMap;
use std::ffi::OsString;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

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

/// One inotify instance and one event thread for the whole process, shared by every
/// branch: hundreds of branches stay within the per-user instance limit, and branches of
/// one project share the watch on each directory (the kernel gives one watch per inode).
struct Hub {
    inotify: Inotify,
    subs: Mutex<Subs>,
    /// Held while events are read and turned into invalidations: [`LowerWatch::sync`]
    /// takes it to know every event queued before it has been handled.
    serving: Mutex<()>,
}

#[derive(Default)]
struct Subs {
    /// Who cares about each watched directory: (branch watch id, lower-relative dir).
    by_wd: FxHashMap<WatchDescriptor, Vec<(u64, PathBuf)>>,
    branches: FxHashMap<u64, Weak<LowerWatch>>,
}

/// A lower change: the directory, and the entry in it (None: the directory itself).
pub(crate) type Change = (PathBuf, Option<OsString>);

/// What to invalidate for a change: the entry (parent inode, name) and the inode.
pub(crate) type Invalidation = (Option<u64>, Option<OsString>, Option<u64>);

/// The mounted branch a watch reports to (the overlay implements it): which kernel objects
/// lower changes invalidate, and dropping the lower descriptor of a changed inode. A trait,
/// so the watch needs to know nothing of the overlay or its tree.
pub(crate) trait Watched: Send + Sync {
    /// Which kernel objects to invalidate for lower changes `(dir, name)`.
    fn invalidations(&self, changed: &[Change]) -> Vec<Invalidation>;
    /// Forget the cached lower descriptor of inode `ino`.
    fn forget_lower_fd(&self, ino: u64);
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn hub() -> Option<Arc<Hub>> {
    static HUB: OnceLock<Option<Arc<Hub>>> = OnceLock::new();
    HUB.get_or_init(|| {
        let inotify = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK)
            .map_err(|e| tracing::info!("no inotify ({e}); lower objects are not cached"))
            .ok()?;
        let hub = Arc::new(Hub {
            inotify,
            subs: Mutex::default(),
            serving: Mutex::new(()),
        });
        let h = hub.clone();
        std::thread::Builder::new()
            .name("shade-watch".into())
            .spawn(move || h.run())
            .map_err(|e| tracing::warn!("lower watcher thread: {e}"))
            .ok()?;
        Some(hub)
    })
    .clone()
}

impl Hub {
    /// Turn inotify events into kernel cache invalidations, for the life of the process.
    fn run(&self) {
        loop {
            let mut fds = [nix::poll::PollFd::new(
                self.inotify.as_fd(),
                nix::poll::PollFlags::POLLIN,
            )];
            match nix::poll::poll(&mut fds, nix::poll::PollTimeout::NONE) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => {
                    tracing::warn!("inotify poll: {e}; lower changes no longer reach branches");
                    return;
                }
            }
            let _serving = lock(&self.serving);
            let Ok(events) = self.inotify.read_events() else {
                continue;
            };
            self.handle(events);
        }
    }

    /// Handle every event queued now (the caller holds `serving`).
    fn drain(&self) {
        while let Ok(events) = self.inotify.read_events() {
            if events.is_empty() {
                return;
            }
            self.handle(events);
        }
    }

    /// Turn a batch of events into invalidations for the branches watching their dirs.
    fn handle(&self, events: Vec<nix::sys::inotify::InotifyEvent>) {
        {
            let mut batches: FxHashMap<u64, (Arc<LowerWatch>, Vec<Change>)> = FxHashMap::default();
            let mut gone: Vec<(Arc<LowerWatch>, PathBuf)> = Vec::new();
            {
                let mut subs = lock(&self.subs);
                for ev in events {
                    let ended = ev.mask.contains(AddWatchFlags::IN_IGNORED);
                    let list = if ended {
                        subs.by_wd.remove(&ev.wd)
                    } else {
                        subs.by_wd.get(&ev.wd).cloned()
                    };
                    for (id, dir) in list.into_iter().flatten() {
                        let Some(w) = subs.branches.get(&id).and_then(Weak::upgrade) else {
                            continue;
                        };
                        if ended {
                            gone.push((w.clone(), dir.clone()));
                        }
                        batches
                            .entry(id)
                            .or_insert_with(|| (w, Vec::new()))
                            .1
                            .push((dir, ev.name.clone()));
                    }
                }
            }
            // Outside the hub lock: branch locks are taken before it in `watch_dir`.
            for (w, dir) in gone {
                lock(&w.watched).remove(&dir);
            }
            for (w, changed) in batches.into_values() {
                w.invalidate(&changed);
            }
        }
    }
}

/// A branch's view of the hub: the lower directories it has shown, and where to send
/// invalidations once it is mounted.
pub(crate) struct LowerWatch {
    id: u64,
    hub: Arc<Hub>,
    root: PathBuf,
    watched: Mutex<FxHashMap<PathBuf, WatchDescriptor>>,
    /// The overlay served now and its connection's notifier; replaced when a pooled
    /// connection passes to its next branch (`pool.rs`).
    target: Mutex<Option<(Weak<dyn Watched>, Notifier)>>,
}

impl LowerWatch {
    /// A watch on the lower tree at `root`, or `None` where inotify is unavailable.
    pub fn new(root: &Path) -> Option<Arc<LowerWatch>> {
        static IDS: AtomicU64 = AtomicU64::new(1);
        let hub = hub()?;
        let w = Arc::new(LowerWatch {
            id: IDS.fetch_add(1, Ordering::Relaxed),
            hub: hub.clone(),
            root: root.to_path_buf(),
            watched: Mutex::default(),
            target: Mutex::new(None),
        });
        lock(&hub.subs).branches.insert(w.id, Arc::downgrade(&w));
        w.watch_dir(Path::new("")).then_some(w)
    }

    /// Where invalidations go, once the branch is mounted (again for each branch a pooled
    /// connection serves).
    pub fn attach(&self, overlay: Weak<dyn Watched>, notifier: Notifier) {
        *lock(&self.target) = Some((overlay, notifier));
    }

    /// Handle every lower change queued before this call (its invalidations are sent when
    /// it returns): a pooled connection's next branch must not start from a cache of what
    /// the user changed while the connection was idle.
    pub fn sync(&self) {
        let _serving = lock(&self.hub.serving);
        self.hub.drain();
    }

    /// Watch lower directory `rel` (idempotent). Returns false if the watch failed.
    pub fn watch_dir(&self, rel: &Path) -> bool {
        let mut watched = lock(&self.watched);
        if watched.contains_key(rel) {
            return true;
        }
        match self.hub.inotify.add_watch(&self.root.join(rel), EVENTS) {
            Ok(wd) => {
                lock(&self.hub.subs)
                    .by_wd
                    .entry(wd)
                    .or_default()
                    .push((self.id, rel.to_path_buf()));
                watched.insert(rel.to_path_buf(), wd);
                true
            }
            Err(e) => {
                tracing::debug!("inotify watch on {}: {e}", rel.display());
                false
            }
        }
    }

    fn invalidate(&self, changed: &[Change]) {
        let Some((overlay, notifier)) = lock(&self.target).clone() else {
            return;
        };
        let Some(overlay) = overlay.upgrade() else {
            return;
        };
        for (parent_ino, name, ino) in overlay.invalidations(changed) {
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

impl Drop for LowerWatch {
    /// Unsubscribe; a directory no other branch watches loses its inotify watch.
    fn drop(&mut self) {
        let watched = std::mem::take(&mut *lock(&self.watched));
        let mut subs = lock(&self.hub.subs);
        subs.branches.remove(&self.id);
        for wd in watched.into_values() {
            let Some(list) = subs.by_wd.get_mut(&wd) else {
                continue;
            };
            list.retain(|(id, _)| *id != self.id);
            if list.is_empty() {
                subs.by_wd.remove(&wd);
                let _ = self.hub.inotify.rm_watch(wd);
            }
        }
    }
}
