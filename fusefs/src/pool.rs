//! Warm connections for new branches (issue 31): a branch's FUSE connection, instead of
//! being unmounted when the branch is dropped, can wait in a per-project pool; the next
//! branch of that project with the same options takes it. The kernel keeps what it cached
//! of the connection (entries, attributes, page cache of unchanged files), so the new
//! branch starts warm. The connection is reset in between (`reset.rs`): it serves a parked,
//! empty overlay, and the kernel drops exactly what the last branch changed.
//!
//! On by default: [`DEFAULT_SIZE`] idle connections are kept per project (`SHADE_BRANCH_POOL=N`
//! or [`set_pool_size`] says otherwise, 0 turns it off), each for at most
//! `SHADE_BRANCH_POOL_IDLE` seconds (default 60). A connection something may still refer
//! into when its branch ends is torn down instead (see "what may still hold a connection"
//! below). The
//! pool is emptied at process exit (an `atexit` handler, and
//! [`crate::unmount_all_before_exit`]); after a `kill -9`, `cleanup_stale` finds the
//! connection's directory like any branch's, by its owner pid. See `fusefs/DESIGN-warm.md`.

use crate::fs::Current;
use crate::overlay::Overlay;
use crate::reset::Reset;
use fuser::{BackgroundSession, Notifier};
use std::os::unix::fs::OpenOptionsExt;
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
    /// What the branch hides (relative, sorted): the kernel may hold entries of what one
    /// set showed, so a connection serves only branches that hide the same.
    pub hidden: Vec<PathBuf>,
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
        dir_use(&dir, Some(true), None);
        // A number an earlier, gone connection had: what ran on that one is no concern.
        forget_uses(id);
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

    /// Teardown, and remove its state directory unless a live branch's state is in it (the
    /// branch removes it then).
    pub fn discard(self) {
        let _going = Discarding::start();
        let dir = self.dir.clone();
        let id = self.id;
        self.teardown();
        forget_uses(id);
        if !dir_use(&dir, Some(false), None) {
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                tracing::warn!("removing pooled connection {}: {e}", dir.display());
            }
        }
    }
}

/// Who uses a state directory: a mounted connection (its `mnt`), a live branch (its
/// store, outside layer), or both — a branch's directory hosts the connection mounted for
/// it, which outlives the branch in the pool, and a branch that let its connection go
/// (`Branch::detach`) outlives the connection. Whoever goes last removes the directory.
#[derive(Default, Clone, Copy)]
struct DirUse {
    conn: bool,
    branch: bool,
}

static DIRS: Mutex<Option<std::collections::HashMap<PathBuf, DirUse>>> = Mutex::new(None);

/// Note that a connection (`conn`) or a branch (`branch`) starts or stops using `dir`;
/// returns whether anything still uses it afterwards.
pub(crate) fn dir_use(dir: &Path, conn: Option<bool>, branch: Option<bool>) -> bool {
    let mut all = DIRS.lock().unwrap_or_else(PoisonError::into_inner);
    let all = all.get_or_insert_with(Default::default);
    let mut u = all.get(dir).copied().unwrap_or_default();
    if let Some(c) = conn {
        u.conn = c;
    }
    if let Some(b) = branch {
        u.branch = b;
    }
    if u.conn || u.branch {
        all.insert(dir.to_path_buf(), u);
        true
    } else {
        all.remove(dir);
        false
    }
}

/// The file in an idle connection's directory (next to its `mnt`) while it waits in the
/// pool: such a directory and mount belong to no branch.
pub const POOLED_MARK: &str = "pooled";

/// Idle connections, oldest first, with the time each was given back.
static POOL: Mutex<Vec<(Conn, Instant)>> = Mutex::new(Vec::new());

/// `usize::MAX`: not read from the environment yet.
static SIZE: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Connections kept, in all, whatever the per-project size.
const MAX_TOTAL: usize = 64;

fn pool() -> std::sync::MutexGuard<'static, Vec<(Conn, Instant)>> {
    POOL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Idle connections kept per project unless `SHADE_BRANCH_POOL` says otherwise: a process
/// that makes branches one after another (speculation, `exec --shadow`, `shade mcp`, lint)
/// finds one warm; two cover a branch being dropped while the next is made.
pub const DEFAULT_SIZE: usize = 2;

/// How many idle connections are kept per project (0: branches unmount when dropped).
pub fn pool_size() -> usize {
    match SIZE.load(Ordering::Relaxed) {
        usize::MAX => {
            let n = std::env::var("SHADE_BRANCH_POOL")
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(DEFAULT_SIZE);
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

/// A connection parked less than this ago may still be reached by what its last command
/// left going away (see [`take`]).
const JUST_PARKED: Duration = Duration::from_secs(5);

/// How long [`take`] waits for that to go.
const GOING_AWAY: Duration = Duration::from_millis(500);

/// Take an idle connection mounted with `key`, the most recently used first.
pub(crate) fn take(key: &Key) -> Option<Conn> {
    let (found, expired) = {
        let mut p = pool();
        let expired = take_expired(&mut p);
        let at = p.iter().rposition(|(c, _)| &c.key == key);
        (at.map(|i| p.remove(i)), expired)
    };
    for c in expired {
        c.discard();
    }
    let (c, parked) = found?;
    // Something that still refers into the mount, or a copy of it in another namespace
    // (one made while the connection idled, or the last command's, not yet gone), would
    // see the new branch too. What the last command left is going away as it exits —
    // its processes' last references, its sandbox's namespaces (the kernel tears them down
    // after the processes are gone) — so for a connection parked a moment ago that is
    // waited for, briefly: a branch started right after another ended got a fresh, cold
    // connection instead (CI saw it). One that has idled longer is refused at once.
    let wait_until = (parked.elapsed() < JUST_PARKED).then(|| Instant::now() + GOING_AWAY);
    let why = loop {
        let why = match c.id {
            _ if !c.alive() => break Some("it is no longer mounted where it was".to_string()),
            None => break Some("its connection number is unknown".to_string()),
            Some(id) => referred_into(id, &c.mountpoint).or_else(|| copy_of_mount(id)),
        };
        match (why, wait_until) {
            (Some(_), Some(until)) if Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(5));
            }
            (why, _) => break why,
        }
    };
    if let Some(why) = why {
        tracing::debug!("not reusing {}: {why}", c.mountpoint.display());
        c.discard();
        return None;
    }
    let _ = std::fs::remove_file(c.dir.join(POOLED_MARK));
    Some(c)
}

/// Give a parked connection back, or tear it down when pooling is off or the pool full.
/// What may still be going away when a command has just ended (its last processes'
/// references into the mount, its namespaces' copies of it) is not looked for here but
/// when a branch takes the connection ([`take`]): a parked connection serves only the
/// unchanged project, read-only, to whatever still reaches it, and a connection checked
/// an instant after its command ended was almost never pooled as the plain user (the
/// sandbox's stage namespace was still being torn down).
pub(crate) fn give(conn: Conn) {
    if let Some(why) = conn.unreusable(&conn.current.get(), false) {
        tracing::debug!("not pooling {}: {why}", conn.mountpoint.display());
        conn.discard();
        return;
    }
    give_checked(conn);
}

/// [`give`] of a connection whose caller just made the checks ([`Conn::busy`],
/// [`Conn::unsafe_to_pool`]) and parked it: `Branch::detach` scans `/proc` once, not twice.
pub(crate) fn give_checked(mut conn: Conn) {
    let size = pool_size();
    if size == 0 || !conn.alive() {
        conn.discard();
        return;
    }
    conn.served += 1;
    register_exit_drain();
    // Says "no branch, a warm connection" to whoever counts branches in the state dir.
    if let Err(e) = std::fs::write(conn.dir.join(POOLED_MARK), b"") {
        tracing::debug!("marking {} pooled: {e}", conn.dir.display());
    }
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
                // Counted from before the pool is locked, so that a [`drain`] that finds
                // the pool empty waits for what this took.
                let _going = Discarding::start();
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

/// Unmount every idle connection (waiting for each to stop), and wait (at most 10 s) for
/// those another thread is discarding — the reaper may have taken an expired one out of
/// the pool an instant before: a server exiting then left its directory behind. Returns
/// how many were in the pool.
pub fn drain() -> usize {
    let all: Vec<Conn> = pool().drain(..).map(|(c, _)| c).collect();
    let n = all.len();
    for c in all {
        c.discard();
    }
    Discarding::wait_none(Duration::from_secs(10));
    n
}

/// How many connections are being discarded right now, for [`drain`] to wait on.
static DISCARDING: (Mutex<usize>, std::sync::Condvar) = (Mutex::new(0), std::sync::Condvar::new());

/// One discard in progress, counted in [`DISCARDING`] while it lives.
struct Discarding;

impl Discarding {
    fn start() -> Discarding {
        *DISCARDING.0.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        Discarding
    }

    /// Wait until no discard is in progress, at most `limit`.
    fn wait_none(limit: Duration) {
        let n = DISCARDING.0.lock().unwrap_or_else(PoisonError::into_inner);
        let waited = DISCARDING
            .1
            .wait_timeout_while(n, limit, |n| *n > 0)
            .map(|(n, _)| *n);
        if let Ok(left) = waited {
            if left > 0 {
                tracing::warn!("{left} pooled connection(s) still being discarded");
            }
        }
    }
}

impl Drop for Discarding {
    fn drop(&mut self) {
        let mut n = DISCARDING.0.lock().unwrap_or_else(PoisonError::into_inner);
        *n = n.saturating_sub(1);
        DISCARDING.1.notify_all();
    }
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

// ----- what may still hold a connection --------------------------------------------------
//
// A reused connection serves the next branch to whatever still refers into it: an fd (O_PATH
// ones too, which send no OPEN), a cwd or root, an mmap. Those live in processes, so a
// connection goes back to the pool only when no process can still have one: every command
// that ran on it ran in a sandbox no descriptor can leave (no `--unconfined`, no allowed
// socket, abstract sockets scoped or no network) and ended with its whole PID namespace,
// it has no open handle, and no live process refers into it now (`/proc`). Anything else
// tears it down, as a branch without a pool would be.

/// What ran on one mounted connection (by its number).
#[derive(Default, Debug)]
struct Uses {
    /// Commands running on it now.
    running: usize,
    /// Why a reference may have outlived a command (the first reason seen).
    tainted: Option<String>,
}

static USES: Mutex<std::collections::BTreeMap<u32, Uses>> =
    Mutex::new(std::collections::BTreeMap::new());

fn uses() -> std::sync::MutexGuard<'static, std::collections::BTreeMap<u32, Uses>> {
    USES.lock().unwrap_or_else(PoisonError::into_inner)
}

thread_local! {
    /// Set when a run's processes outlived its SIGKILLs (`sandbox/procs.rs`).
    static SURVIVORS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Say that processes of the command being waited for on this thread survived its end: a
/// connection it ran on is never reused.
pub(crate) fn note_survivors() {
    SURVIVORS.with(|s| s.set(true));
}

/// A command running on a branch mount, from [`CommandUse::begin`] to [`CommandUse::end`]:
/// while it runs the connection is not pooled, and one whose end was not seen whole (or
/// that could pass a descriptor out) never is.
#[must_use]
pub(crate) struct CommandUse {
    ids: Vec<u32>,
    ended: bool,
}

impl CommandUse {
    /// A command starts with the mounts `mounts` (its branch, the cache branches bound for
    /// it; paths that are no connection are left out).
    pub fn begin<'a>(
        mounts: impl IntoIterator<Item = &'a Path>,
        contained: Result<(), String>,
    ) -> CommandUse {
        SURVIVORS.with(|s| s.set(false));
        let mut ids: Vec<u32> = mounts.into_iter().filter_map(connection_id).collect();
        ids.sort_unstable();
        ids.dedup();
        let mut u = uses();
        for id in &ids {
            let e = u.entry(*id).or_default();
            e.running += 1;
            if let Err(why) = &contained {
                e.tainted.get_or_insert_with(|| why.clone());
            }
        }
        CommandUse { ids, ended: false }
    }

    /// The command and every process of it are gone (the sandbox waited for them).
    pub fn end(mut self) {
        self.ended = !SURVIVORS.with(|s| s.replace(false));
    }
}

impl Drop for CommandUse {
    fn drop(&mut self) {
        let mut u = uses();
        for id in &self.ids {
            let e = u.entry(*id).or_default();
            e.running = e.running.saturating_sub(1);
            if !self.ended {
                e.tainted
                    .get_or_insert_with(|| "a command's processes were not all seen to end".into());
            }
        }
    }
}

/// Mark the connection mounted at `mount` as never to be reused: a command runs on it whose
/// end shade does not wait for ([`crate::sandbox::command`]).
pub(crate) fn taint(mount: &Path, why: &str) {
    if let Some(id) = connection_id(mount) {
        uses()
            .entry(id)
            .or_default()
            .tainted
            .get_or_insert_with(|| why.into());
    }
}

/// Why the connection mounted at `mount` may not serve another branch, as far as the
/// commands this process ran on it tell (`Ok`: none ran, or every one ran contained and was
/// seen to end whole). For a process whose branch is another's connection (a `shade run`
/// served by the branch server): the taint lives here, where the sandbox ran, and the
/// owner must hear it. The owner still makes its own checks (handles, `/proc`).
pub fn commands_left_it_reusable(mount: &Path) -> Result<(), String> {
    let Some(id) = connection_id(mount) else {
        return Err("its connection number is unknown".into());
    };
    match uses().get(&id) {
        None => Ok(()),
        Some(u) if u.running > 0 => Err(format!("{} command(s) still run on it", u.running)),
        Some(u) => u.tainted.clone().map_or(Ok(()), Err),
    }
}

/// Forget what ran on connection `id` (a new mount has that number now, or it is gone).
pub(crate) fn forget_uses(id: Option<u32>) {
    if let Some(id) = id {
        uses().remove(&id);
    }
}

impl Conn {
    /// Why the connection is in use now (`None`: it is not): a command runs on it, a
    /// handle is open, or a live process refers into it (`/proc`). A branch whose
    /// connection is in use keeps it (`Branch::detach`).
    pub fn busy(&self, overlay: &Overlay) -> Option<String> {
        let Some(id) = self.id else {
            return Some("its connection number is unknown".into());
        };
        if let Some(u) = uses().get(&id) {
            if u.running > 0 {
                return Some(format!("{} command(s) still run on it", u.running));
            }
        }
        let handles = settled_handles(overlay, id, &self.mountpoint);
        if handles > 0 {
            return Some(format!("{handles} open file handle(s)"));
        }
        referred_into(id, &self.mountpoint)
    }

    /// Why a connection not [`Conn::busy`] may still not serve another branch: a command
    /// on it may have left a reference shade cannot see (tainted). Such a connection is
    /// torn down (aborted), which ends every such reference too. A copy of the mount in
    /// another namespace is not looked for here: [`take`] looks before any branch is served
    /// (a namespace made while the connection idles must be caught there anyway), and the
    /// look reads every other namespace's mount table — with other sandboxes' overlay
    /// mounts, most of a detach's cost on this machine.
    pub fn unsafe_to_pool(&self) -> Option<String> {
        let id = self.id?;
        uses().get(&id).and_then(|u| u.tainted.clone())
    }

    /// Why the connection may not serve another branch (`None`: it may): see above.
    /// `scan`: look through `/proc` too (a few milliseconds).
    pub fn unreusable(&self, overlay: &Overlay, scan: bool) -> Option<String> {
        let Some(id) = self.id else {
            return Some("its connection number is unknown".into());
        };
        if let Some(u) = uses().get(&id) {
            if u.running > 0 {
                return Some(format!("{} command(s) still run on it", u.running));
            }
            if let Some(why) = &u.tainted {
                return Some(why.clone());
            }
        }
        let handles = settled_handles(overlay, id, &self.mountpoint);
        if handles > 0 {
            return Some(format!("{handles} open file handle(s)"));
        }
        if !scan {
            return None;
        }
        referred_into(id, &self.mountpoint).or_else(|| copy_of_mount(id))
    }
}

/// How long a file's last close may take to reach us as RELEASE: the kernel sends it in
/// the background, so a command that has just exited may still count as holding a handle.
const RELEASE_IN_FLIGHT: Duration = Duration::from_millis(500);

/// The handles `overlay` still has open once those whose RELEASE is in flight have arrived:
/// with no process referring into connection `id`, open handles are releases on their way
/// and are waited for (at most [`RELEASE_IN_FLIGHT`]); with one, they are counted at once.
/// Without this wait a connection was not pooled whenever the daemon had not yet read the
/// RELEASE of the command's last file (often on a loaded machine).
fn settled_handles(overlay: &Overlay, id: u32, mountpoint: &Path) -> usize {
    let handles = overlay.open_handles();
    if handles == 0 || referred_into(id, mountpoint).is_some() {
        return handles;
    }
    let start = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(2));
        let now = overlay.open_handles();
        if now == 0 || start.elapsed() >= RELEASE_IN_FLIGHT {
            return now;
        }
    }
}

/// A mount namespace that holds a mount of device (0, `minor`) other than the connection's
/// own one in ours, said in words: a namespace made (`unshare -m`, a container, a service
/// with private mounts) while the branch was mounted keeps a copy that would serve the next
/// branch. Asked of the kernel's list of namespaces where it answers (root, Linux 6.11+:
/// also one kept only by a bind mount of its nsfs file), else of the processes' ones.
fn copy_of_mount(minor: u32) -> Option<String> {
    if let Some(found) = crate::mntns::mounts_of(minor) {
        return found
            .into_iter()
            .find(|&(_, n, ours)| n > usize::from(ours))
            .map(|(ns, n, _)| format!("mount namespace {ns} holds {n} mount(s) of it"));
    }
    copy_in_a_process_namespace(minor)
        .map(|pid| format!("process {pid}'s mount namespace has a copy of it"))
}

/// [`copy_of_mount`] from `/proc` (not root, or a kernel before 6.11): the namespaces of
/// the processes we may look at; one without a process in it is not seen.
fn copy_in_a_process_namespace(minor: u32) -> Option<i32> {
    let ours = std::fs::read_link("/proc/self/ns/mnt").ok();
    let dev = format!("0:{minor}");
    let count = |pid: i32| -> usize {
        std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
            .map(|m| {
                m.lines()
                    .filter(|l| l.split(' ').nth(2) == Some(dev.as_str()))
                    .count()
            })
            .unwrap_or(0)
    };
    let mut seen = std::collections::HashSet::new();
    let dir = std::fs::read_dir("/proc").ok()?;
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .find(|&pid| {
            let Ok(ns) = std::fs::read_link(format!("/proc/{pid}/ns/mnt")) else {
                return false;
            };
            if !seen.insert(ns.clone()) {
                return false;
            }
            let allowed = usize::from(Some(&ns) == ours.as_ref());
            count(pid) > allowed
        })
}

/// Why something may still refer into connection `id` mounted at `mountpoint` (`None`:
/// nothing does). As root, the kernel's count of references to the mount answers in one
/// call (`mount_in_use`): every open file (O_PATH ones, mappings and descriptors queued in
/// a socket included), cwd and root on it holds one — more than the `/proc` scan sees, at
/// a fraction of its cost (which grows with every process's descriptors, this holder's
/// own ten thousand memory files included). Without the privilege, the `/proc` scan.
fn referred_into(id: u32, mountpoint: &Path) -> Option<String> {
    match mount_in_use(mountpoint) {
        Some(true) => Some("something still refers into it (the mount is busy)".into()),
        Some(false) => None,
        None => holder_of(id).map(|pid| format!("process {pid} still refers into it")),
    }
}

/// Whether the mount at `mountpoint` has references beyond its place in the mount tree,
/// from `umount2(MNT_EXPIRE)`: `EBUSY` if it has; if not, `EAGAIN` and the mount is marked
/// expired — the mark is cleared at once by taking and dropping a reference (an O_PATH
/// open), as any use of the mount clears it, so that no later `MNT_EXPIRE` unmounts it.
/// `None` where the call is not permitted (not root) or says nothing.
fn mount_in_use(mountpoint: &Path) -> Option<bool> {
    match nix::mount::umount2(mountpoint, nix::mount::MntFlags::MNT_EXPIRE) {
        Err(nix::errno::Errno::EBUSY) => Some(true),
        Err(nix::errno::Errno::EAGAIN) => {
            let cleared = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
                .open(mountpoint);
            drop(cleared);
            Some(false)
        }
        // It was marked already and is unmounted now: nothing can refer into it through
        // this mount; the connection fails the pool's liveness check and is torn down.
        Ok(()) => Some(false),
        Err(_) => None,
    }
}

/// A live process (ours too) with an fd, cwd, root or mapping on the file system with
/// device (0, `minor`); `None` if no process we can look at has one.
fn holder_of(minor: u32) -> Option<i32> {
    let dir = std::fs::read_dir("/proc").ok()?;
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .find(|&pid| refers(pid, minor))
}

/// Whether process `pid` refers into device (0, `minor`).
fn refers(pid: i32, minor: u32) -> bool {
    let base = PathBuf::from(format!("/proc/{pid}"));
    let on = |p: &Path| dev_of(p) == Some((0, minor));
    // Each thread may have a cwd and root of its own (no CLONE_FS).
    let tasks = std::fs::read_dir(base.join("task"))
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    if tasks
        .iter()
        .any(|t| on(&t.join("cwd")) || on(&t.join("root")))
    {
        return true;
    }
    if let Ok(fds) = std::fs::read_dir(base.join("fd")) {
        if fds.filter_map(Result::ok).any(|e| on(&e.path())) {
            return true;
        }
    }
    // Mappings name their device as `MAJOR:MINOR` in hex.
    let dev = format!(" 00:{minor:02x} ");
    std::fs::read_to_string(base.join("maps")).is_ok_and(|m| m.lines().any(|l| l.contains(&dev)))
}

/// The device of what `path` (a `/proc` link) points at, from the kernel's cached
/// attributes: a FUSE file system is not asked (one that hangs would hang us).
fn dev_of(path: &Path) -> Option<(u32, u32)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statx into a zeroed struct; read only on success.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let rc = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_STATX_DONT_SYNC,
            0,
            &mut stx,
        )
    };
    (rc == 0).then_some((stx.stx_dev_major, stx.stx_dev_minor))
}
