//! Warming a fresh branch (issue 20): a background walk of the branch's directories through
//! its own mount, so the kernel holds every entry with its attributes (READDIRPLUS returns
//! them in bulk) before a command asks. A fresh `git status` over 10k files otherwise sends
//! one LOOKUP per path (13k round trips); after the walk (~4.5k requests for the listings
//! and ~2.2k for refreshing the directories' attributes, no file data) it sends a few
//! hundred. Ignored directories (build output) and `.git` are not walked.
//!
//! The walk is shade's, not the command's: its listings are not recorded as reads of the
//! branch (`reads.rs`), which accept's conflict check would otherwise count.

use std::cell::Cell;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

/// Thread ids of running walks: their requests are shade's own.
static WALKERS: Mutex<Option<HashSet<u32>>> = Mutex::new(None);

thread_local! {
    /// Set on a FUSE thread while it serves a walk's request.
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Whether a request from process/thread `pid` is a warm-up walk's.
pub fn is_walker(pid: u32) -> bool {
    WALKERS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_ref()
        .is_some_and(|s| s.contains(&pid))
}

/// Run `f` (serving a request of `pid`) with reads unrecorded if `pid` is a walk.
pub fn serve<R>(pid: u32, f: impl FnOnce() -> R) -> R {
    let quiet = is_walker(pid);
    QUIET.with(|q| q.set(quiet));
    let r = f();
    QUIET.with(|q| q.set(false));
    r
}

/// Whether what this thread serves now counts as the branch's reads.
pub fn recording() -> bool {
    !QUIET.with(Cell::get)
}

/// A running walk; [`Warm::stop`] ends it (before the branch unmounts).
pub struct Warm {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Warm {
    /// Walk `mountpoint` in a background thread, skipping directories `skip` names
    /// (relative paths).
    pub fn start(
        mountpoint: PathBuf,
        skip: impl Fn(&Path) -> bool + Send + 'static,
    ) -> std::io::Result<Warm> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("shade-warm".into())
            .spawn(move || {
                let tid = nix::unistd::gettid().as_raw() as u32;
                WALKERS
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get_or_insert_with(HashSet::new)
                    .insert(tid);
                walk(&mountpoint, &flag, &skip);
                if let Some(s) = WALKERS
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .as_mut()
                {
                    s.remove(&tid);
                }
            })?;
        Ok(Warm {
            stop,
            thread: Some(thread),
        })
    }

    /// Whether the walk has finished.
    pub fn done(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Stop the walk and wait for it (at most the listing in progress).
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Warm {
    fn drop(&mut self) {
        self.stop();
    }
}

fn walk(root: &Path, stop: &AtomicBool, skip: &dyn Fn(&Path) -> bool) {
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let Ok(e) = e else { break };
            // d_type from the listing: no stat, no LOOKUP.
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                let r = rel.join(e.file_name());
                if e.file_name() != ".git" && !skip(&r) {
                    stack.push(r);
                }
            }
        }
        // Listing a directory makes the kernel mark its atime stale, and the next stat of
        // the directory (every command's) asks again: ask now instead.
        let _ = std::fs::metadata(&dir);
    }
}
