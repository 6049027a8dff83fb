//! Warm connections for new branches (issue 31): a branch's FUSE connection, instead of
//! being unmounted when the branch is dropped, can wait in a per-project pool; the next
//! branch of that project with the same options takes it. The kernel keeps what it cached
//! of the connection (entries, attributes, page cache of unchanged files), so the new
//! branch starts warm. The connection is reset in between (`reset.rs`): it serves a parked,
//! empty overlay, and the kernel drops exactly what the last branch changed.
//!
//! Off unless asked for (`SHADE_BRANCH_POOL=N`, or [`set_pool_size`]): N idle connections are
//! kept per project, each for at most `SHADE_BRANCH_POOL_IDLE` seconds (default 60). The
//! pool is emptied at process exit (an `atexit` handler, and
//! [`crate::unmount_all_before_exit`]); after a `kill -9`, `cleanup_stale` finds the
//! connection's directory like any branch's, by its owner pid. See `fusefs/DESIGN-warm.md`.

use crate::fs::Current;
use crate::overlay::Overlay;
use crate::reset::Reset;
use fuser::{BackgroundSession, Notifier};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// What a connection was mounted with: a branch may take a pooled connection only when all
/// of it matches (the kernel fixed them at mount or INIT).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Key {
    pub project: PathBuf,
    pub state: PathBuf,
    pub allow_other: bool,
    pub threads: usize,
    pub shift: Option<crate::idmap::IdShift>,
    pub passthrough: bool,
    pub euid: u32,
}

/// A mounted FUSE connection and what serving it takes.
pub(crate) struct Conn {
    session: BackgroundSession,
    /// The overlay it serves now.
    pub current: Arc<Current>,
    pub notifier: Notifier,
    pub mountpoint: PathBuf,
    /// The connection's own state directory (its mount point and owner file): that of the
    /// first branch it served.
    pub dir: PathBuf,
    pub key: Key,
    /// The connection number (device minor) it was mounted with.
    id: Option<u32>,
    /// How many branches it has served before the current one.
    pub served: u64,
}

impl Conn {
    /// A connection just mounted for its first branch.
    pub fn new(
        session: BackgroundSession,
        current: Arc<Current>,
        mountpoint: PathBuf,
        dir: PathBuf,
        key: Key,
    ) -> Conn {
        let notifier = session.notifier();
        let id = connection_id(&mountpoint);
        Conn {
            session,
            current,
            notifier,
            mountpoint,
            dir,
            key,
            id,
            served: 0,
        }
    }

    /// Serve `overlay` from now on, reporting lower changes to it.
    pub fn serve(&self, overlay: &Arc<Overlay>) {
        let _ = overlay.notifier.set(self.notifier.clone());
        if let Some(w) = &overlay.watch {
            w.attach(Arc::<Overlay>::downgrade(overlay), self.notifier.clone());
        }
        self.current.swap(overlay.clone());
    }

    /// Take the connection from `overlay`'s branch: from now on it serves an empty overlay
    /// of the unchanged project (`parked`), and the kernel has dropped what the branch
    /// changed. Returns that reset (to send again after an accept changed the project).
    pub fn park(
        &self,
        overlay: &Overlay,
        parked: impl FnOnce(crate::tree::Tree) -> Overlay,
    ) -> Reset {
        let (tree, reset) = overlay.successor();
        self.serve(&Arc::new(parked(tree)));
        reset.send(&self.notifier);
        reset
    }

    /// The inode table of the parked overlay, for the branch that takes the connection.
    /// Whatever reached the parked overlay meanwhile (it has no room for changes, but a
    /// stray process could still try) is reset like a branch's; its reads are dropped.
    pub fn unpark(&self) -> crate::tree::Tree {
        let parked = self.current.get();
        let touched = !parked.tree().slots.is_empty();
        let mut tree = if touched {
            let (tree, reset) = parked.successor();
            reset.send(&self.notifier);
            tree
        } else {
            let mut t = parked.tree();
            let carried = t.carried();
            std::mem::replace(&mut *t, carried)
        };
        tree.reads = Default::default();
        tree
    }

    /// Whether it is still the mount it was (nobody unmounted or aborted it meanwhile).
    fn alive(&self) -> bool {
        self.id.is_some() && connection_id(&self.mountpoint) == self.id
    }

    /// Unmount and stop serving (processes using it get errors from now on).
    pub fn teardown(self) {
        // Opened while the connection is surely ours: once our unmount releases it, its
        // number can be reused at once by another mount, which a later lookup by number
        // would abort instead. A write through this handle reaches only our connection.
        let abort = connection_id(&self.mountpoint).and_then(open_abort_handle);
        // Dropping the session's other parts unmounts (fuser's way); only the thread
        // handle is kept, to join. Then detach what is left: a mount fuser could not
        // unmount (busy), or one fusermount3 made.
        let mountpoint = self.mountpoint;
        let guard = {
            let s = self.session;
            s.guard
        };
        lazy_unmount(&mountpoint);
        // A mount namespace made while the branch was mounted (another `shade run`, any
        // `unshare`) holds a copy of the mount that our unmount does not reach, and the
        // kernel keeps the connection — and our FUSE threads — alive as long as that
        // namespace lives. Abort the connection if anything still holds it.
        if let Some(handle) = abort {
            abort_connection(handle);
        }
        match guard.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("serving {}: {e}", mountpoint.display()),
            Err(_) => tracing::warn!("the FUSE thread of {} panicked", mountpoint.display()),
        }
    }

    /// Teardown and remove its state directory.
    fn discard(self) {
        let dir = self.dir.clone();
        self.teardown();
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            tracing::warn!("removing pooled connection {}: {e}", dir.display());
        }
    }
}

/// Idle connections, oldest first, with the time each was given back.
static POOL: Mutex<Vec<(Conn, Instant)>> = Mutex::new(Vec::new());

/// `usize::MAX`: not read from the environment yet.
static SIZE: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Connections kept, in all, whatever the per-project size.
const MAX_TOTAL: usize = 64;

fn pool() -> std::sync::MutexGuard<'static, Vec<(Conn, Instant)>> {
    POOL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How many idle connections are kept per project (0: branches unmount when dropped).
pub fn pool_size() -> usize {
    match SIZE.load(Ordering::Relaxed) {
        usize::MAX => {
            let n = std::env::var("SHADE_BRANCH_POOL")
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            SIZE.store(n, Ordering::Relaxed);
            n
        }
        n => n,
    }
}

/// Keep `n` idle connections per project from now on (0 turns pooling off; connections
/// already kept stay until taken, idle too long, or [`drain`]).
pub fn set_pool_size(n: usize) {
    SIZE.store(n, Ordering::Relaxed);
}

/// `u64::MAX`: from the environment.
static IDLE_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(u64::MAX);

/// Keep an idle connection at most `idle` from now on (else `SHADE_BRANCH_POOL_IDLE`
/// seconds, default 60).
pub fn set_pool_idle(idle: Duration) {
    let ms = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX - 1);
    IDLE_MS.store(ms.min(u64::MAX - 1), Ordering::Relaxed);
}

fn idle_limit() -> Duration {
    match IDLE_MS.load(Ordering::Relaxed) {
        u64::MAX => {
            let secs = std::env::var("SHADE_BRANCH_POOL_IDLE")
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(60);
            Duration::from_secs(secs)
        }
        ms => Duration::from_millis(ms),
    }
}

/// Take an idle connection mounted with `key`, the most recently used first.
pub(crate) fn take(key: &Key) -> Option<Conn> {
    let (found, expired) = {
        let mut p = pool();
        let expired = take_expired(&mut p);
        let at = p.iter().rposition(|(c, _)| &c.key == key);
        (at.map(|i| p.remove(i).0), expired)
    };
    for c in expired {
        c.discard();
    }
    match found {
        Some(c) if c.alive() => Some(c),
        Some(c) => {
            c.discard();
            None
        }
        None => None,
    }
}

/// Give a parked connection back, or tear it down when pooling is off or the pool full.
pub(crate) fn give(mut conn: Conn) {
    let size = pool_size();
    if size == 0 || !conn.alive() {
        conn.discard();
        return;
    }
    conn.served += 1;
    register_exit_drain();
    let mut out = {
        let mut p = pool();
        let mut out = take_expired(&mut p);
        let key = conn.key.clone();
        p.push((conn, Instant::now()));
        while p.iter().filter(|(c, _)| c.key == key).count() > size {
            match p.iter().position(|(c, _)| c.key == key) {
                Some(i) => out.push(p.remove(i).0),
                None => break,
            }
        }
        while p.len() > MAX_TOTAL {
            out.push(p.remove(0).0);
        }
        out
    };
    for c in out.drain(..) {
        c.discard();
    }
    start_reaper();
}

fn take_expired(p: &mut Vec<(Conn, Instant)>) -> Vec<Conn> {
    let limit = idle_limit();
    let mut out = Vec::new();
    let mut i = 0;
    while i < p.len() {
        if p[i].1.elapsed() >= limit {
            out.push(p.remove(i).0);
        } else {
            i += 1;
        }
    }
    out
}

/// One thread per process that tears down connections idle too long.
fn start_reaper() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let spawned = std::thread::Builder::new()
            .name("shade-pool".into())
            .spawn(|| loop {
                let tick = idle_limit().clamp(Duration::from_millis(100), Duration::from_secs(1));
                std::thread::sleep(tick);
                let expired = take_expired(&mut pool());
                for c in expired {
                    c.discard();
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("pool reaper thread: {e}; idle connections wait for the next branch");
        }
    });
}

/// Unmount every idle connection (waiting for each to stop). Returns how many there were.
pub fn drain() -> usize {
    let all: Vec<Conn> = pool().drain(..).map(|(c, _)| c).collect();
    let n = all.len();
    for c in all {
        c.discard();
    }
    n
}

/// Detach every idle connection and remove its directory without waiting: for a process
/// about to exit (the kernel ends the connections with it). Never blocks on the pool's lock.
pub(crate) fn drain_before_exit() -> usize {
    let Ok(mut p) = POOL.try_lock() else {
        return 0;
    };
    let all: Vec<(Conn, Instant)> = p.drain(..).collect();
    drop(p);
    let n = all.len();
    for (c, _) in all {
        lazy_unmount(&c.mountpoint);
        let _ = std::fs::remove_dir_all(&c.dir);
        // Its threads end with the process; joining them here could wait on a request.
        std::mem::forget(c);
    }
    n
}

/// How many idle connections the pool holds.
pub fn pooled_count() -> usize {
    pool().len()
}

fn register_exit_drain() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    extern "C" fn at_exit() {
        drain_before_exit();
    }
    ONCE.call_once(|| {
        // SAFETY: registers a plain function; it only unmounts and removes directories.
        unsafe {
            libc::atexit(at_exit);
        }
    });
}

/// The FUSE connection number of the mount at `mountpoint` (its device minor).
pub(crate) fn connection_id(mountpoint: &Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(mountpoint).ok()?.dev();
    (libc::major(dev) == 0).then(|| libc::minor(dev))
}

/// A handle on FUSE connection `id`'s abort file (fusectl, mounted on demand).
fn open_abort_handle(id: u32) -> Option<std::fs::File> {
    let ctl = Path::new("/sys/fs/fuse/connections");
    const FUSECTL_MAGIC: i64 = 0x6573_5543;
    let mounted =
        nix::sys::statfs::statfs(ctl).is_ok_and(|s| s.filesystem_type().0 == FUSECTL_MAGIC);
    if !mounted {
        let _ = nix::mount::mount(
            Some("fusectl"),
            ctl,
            Some("fusectl"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        );
    }
    std::fs::OpenOptions::new()
        .write(true)
        .open(ctl.join(id.to_string()).join("abort"))
        .ok()
}

/// Abort the connection behind `handle` if it is still alive (a copy of the mount in another
/// namespace keeps it so); a connection already gone ignores the write.
fn abort_connection(mut handle: std::fs::File) {
    use std::io::Write;
    tracing::debug!("aborting our FUSE connection in case a copy of the mount outlived ours");
    let _ = handle.write_all(b"1");
}

/// Detach a mount even if processes still use it (through fusermount3 for a user).
pub(crate) fn lazy_unmount(path: &Path) {
    if nix::mount::umount2(path, nix::mount::MntFlags::MNT_DETACH) == Err(nix::errno::Errno::EPERM)
    {
        if let Some(bin) = crate::fusermount::find() {
            crate::fusermount::unmount(&bin, path);
        }
    }
}
