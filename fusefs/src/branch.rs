//! A branch: one mounted shadow of a project, with its override layer.
//!
//! Creating a branch copies nothing: it opens the project directory, makes a store
//! directory and mounts. Dropping a branch without accepting it aborts it.

use crate::accept::{self, AcceptError, AcceptOptions, AcceptReport};
use crate::budget::{BranchLimits, Budget, LimitHit};
use crate::changeset::Changeset;
use crate::content::Store;
use crate::fs::ShadeFs;
use crate::ignore_rules::IgnoreRules;
use crate::lower::Lower;
use crate::overlay::Overlay;
use crate::select::Selection;
use crate::state::StateDir;
use fuser::{Config, MountOption, SessionACL};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// How to create a branch.
#[derive(Clone, Debug)]
pub struct BranchOptions {
    /// Where branch stores, mount points and journals live.
    pub state: StateDir,
    /// File contents held in memory before spilling to the disk store (bytes).
    pub memory_budget: u64,
    /// Let every uid use the mount (`allow_other`), so a command that switches users (a
    /// test suite, `su`, a package build) gets the permissions a real directory gives; the
    /// kernel checks them against the shown modes. Users outside the command are kept out
    /// by the mount point's parent, a 0700 directory of shade's user. On by default where
    /// the system permits it: as root, or with `user_allow_other` in /etc/fuse.conf.
    pub allow_other: bool,
    /// FUSE worker threads.
    pub threads: usize,
    /// Ids shown shifted to the kernel and taken back from requests (`idmap.rs`): for a
    /// command in a user namespace whose ids map to a host range. `None`: ids as stored.
    pub id_shift: Option<crate::idmap::IdShift>,
    /// How much the branch may hold: contents beyond `size` and metadata beyond
    /// `metadata` get ENOSPC (see [`Branch::take_limit_hits`]).
    pub limits: BranchLimits,
    /// Hide the home's credentials that lie inside the project (the home as the project:
    /// `~/.ssh`, `~/.aws`, `.env` files, …), as the sandbox hides those outside it: on for
    /// the agent's modes, `shade run` sets it from `[sandbox] hide_credentials`. Shade's
    /// state dirs and their registry inside the project are hidden whatever this says.
    pub hide_credentials: bool,
    /// More paths to hide (absolute; those outside the project are ignored): what the
    /// environment of a branch server's client names (`hidden_paths`), which may differ
    /// from the server's own (another `XDG_STATE_HOME`, `HOME`, `KUBECONFIG`).
    pub also_hide: Vec<PathBuf>,
}

impl Default for BranchOptions {
    fn default() -> Self {
        BranchOptions {
            state: StateDir::from_env(),
            memory_budget: memory_budget_from_env(),
            allow_other: other_users_permitted(),
            threads: 2,
            // Callers whose branch serves confined commands set it (see
            // `sandbox::branch_id_shift`); a branch read and written only by shade and the
            // host shows its ids as they are.
            id_shift: None,
            limits: BranchLimits::default(),
            hide_credentials: true,
            also_hide: Vec::new(),
        }
    }
}

/// Whether `path` is the mount point of a shade branch (the project of a branch of a
/// branch), from /proc/self/mountinfo.
fn is_shade_mount(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = path.as_os_str().as_bytes();
    info.lines().any(|l| {
        let mut halves = l.splitn(2, " - ");
        let (Some(head), Some(tail)) = (halves.next(), halves.next()) else {
            return false;
        };
        // `fuse` (mounted by root) or `fuse.shade` (by fusermount3), source `shade:ID`.
        let mut t = tail.split(' ');
        let fstype = t.next().unwrap_or("");
        (fstype == "fuse" || fstype == "fuse.shade")
            && t.next().is_some_and(|src| src.starts_with("shade:"))
            && head
                .split(' ')
                .nth(4)
                .is_some_and(|m| unescape_mount(m) == want)
    })
}

/// A mountinfo path with its `\ooo` escapes (space, tab, newline, backslash) undone.
fn unescape_mount(m: &str) -> Vec<u8> {
    let b = m.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], oct) {
            (b'\\', Some(d)) => {
                out.push(d.iter().fold(0u8, |v, c| v.wrapping_mul(8) + (c - b'0')));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// Whether this process may mount with `allow_other`: root may; anyone else only where
/// /etc/fuse.conf says `user_allow_other` (fusermount3 refuses the mount otherwise).
fn other_users_permitted() -> bool {
    nix::unistd::geteuid().is_root()
        || std::fs::read_to_string("/etc/fuse.conf")
            .is_ok_and(|c| c.lines().any(|l| l.trim() == "user_allow_other"))
}

/// The memory budget: `SHADE_MEMORY_BUDGET` (bytes) if set and valid, else 256 MiB.
/// Tests and the integrity suite set it tiny to force contents onto the disk store.
fn memory_budget_from_env() -> u64 {
    std::env::var("SHADE_MEMORY_BUDGET")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(256 << 20)
}

/// Why a branch could not be created.
#[derive(Debug, thiserror::Error)]
pub enum BranchError {
    #[error("project directory {path}: {source}")]
    Project {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a directory")]
    NotADirectory { path: PathBuf },
    #[error("cannot open /dev/fuse ({0}); shade needs FUSE (modprobe fuse, or run the container with --device /dev/fuse)")]
    NoFuse(std::io::Error),
    /// `/dev/fuse` exists but this user may not open it (mode 0600): fusermount3 cannot help,
    /// it opens the device with the caller's rights.
    #[error("cannot open /dev/fuse ({0}); a user who is not root needs it mode 0666 (as desktop distributions ship it: chmod 0666 /dev/fuse), fusermount3 opens it with your rights too")]
    FuseDenied(std::io::Error),
    #[error("state directory {path}: {source}")]
    State {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{project} is inside shade's state directory {state}; choose another project or SHADE_STATE_DIR")]
    InsideState { project: PathBuf, state: PathBuf },
    #[error("mounting the branch at {path} failed: {source}")]
    Mount {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What accept does with ignored build output and conflicts.
#[derive(Clone, Copy, Debug, Default)]
pub struct AcceptFlags {
    /// Also write changes under gitignored paths (`target/`, `node_modules/`, …).
    pub include_ignored: bool,
    /// Overwrite paths the user changed since the branch first touched them.
    pub force: bool,
}

/// A live branch of a project, mounted at [`Branch::mountpoint`].
pub struct Branch {
    id: String,
    project: PathBuf,
    dir: PathBuf,
    mountpoint: PathBuf,
    state: StateDir,
    overlay: Arc<Overlay>,
    /// The FUSE connection serving the branch: mounted for it, or taken from the pool.
    conn: Option<crate::pool::Conn>,
    /// The connection once the branch let it go to be pooled (`unmount`): it serves an
    /// empty overlay, and what the branch changed was dropped from the kernel; sent again
    /// when the branch is dropped (an accept may have changed those paths since).
    parked: Option<(crate::pool::Conn, crate::reset::Reset)>,
    /// The warm-up walk, if started ([`Branch::warm_up`]).
    warm: std::sync::Mutex<Option<crate::warm::Warm>>,
    /// shade's ids as the project shows them, when it is a shifted branch (see `create`).
    own: Option<(u32, u32)>,
    /// What a connection serving this branch is mounted with (`attach` takes one).
    key: crate::pool::Key,
    /// The branch let its connection go while idle ([`Branch::detach`]): it holds no
    /// mount, descriptor or thread until [`Branch::attach`].
    detached: bool,
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// Where shade's state directory lies relative to `project` (both canonical): inside it
/// (`Some(relative path)`, which the branch hides), or elsewhere (`None`). A project that is
/// the state directory or inside it is refused — except a live branch's mount point, which a
/// branch of a branch has as its project.
fn state_inside(project: &Path, state: &StateDir) -> Result<Option<PathBuf>, BranchError> {
    let root = std::fs::canonicalize(state.root()).map_err(|source| BranchError::State {
        path: state.root().to_path_buf(),
        source,
    })?;
    if let Ok(rel) = root.strip_prefix(project) {
        if !rel.as_os_str().is_empty() {
            return Ok(Some(rel.to_path_buf()));
        }
    }
    if project.starts_with(&root) {
        let branches = root.join("branches");
        let in_a_mount = project.strip_prefix(&branches).is_ok_and(|rest| {
            let mut parts = rest.components();
            parts.next().is_some() && parts.next().is_some_and(|c| c.as_os_str() == "mnt")
        });
        if !in_a_mount {
            return Err(BranchError::InsideState {
                project: project.to_path_buf(),
                state: root,
            });
        }
    }
    Ok(None)
}

/// What a branch of `project` (canonical) hides besides shade's own state dir, relative to
/// it: every other state dir and state-dir registry inside it (`state::state_places`) and,
/// with `credentials`, the home's credentials inside it (`sandbox::credentials_inside`).
/// Found when the branch is made; a state dir made inside the project later by a shade of
/// another environment is still refused at accept by its marker (`accept::Protected`).
fn hidden_in(project: &Path, credentials: bool, also: &[PathBuf]) -> Vec<PathBuf> {
    let mut abs = hidden_paths(project, credentials);
    abs.extend(also.iter().cloned());
    let mut rels: Vec<PathBuf> = abs
        .iter()
        .filter_map(|p| p.strip_prefix(project).ok())
        .filter(|r| !r.as_os_str().is_empty())
        .map(Path::to_path_buf)
        .collect();
    rels.sort();
    rels.dedup();
    rels
}

/// The absolute paths inside `project` (canonical) a branch of it hides as this process's
/// environment sees them (see `hidden_in`); a branch server's client sends them along.
pub(crate) fn hidden_paths(project: &Path, credentials: bool) -> Vec<PathBuf> {
    let Ok(project) = std::fs::canonicalize(project) else {
        return Vec::new();
    };
    // Worked out at most once a second per project: it reads the registries, the mount
    // table, as root the password database, and may walk a home — a few milliseconds that
    // every one of a holder's ten thousand branches paid. The set is a snapshot anyway
    // (fixed when the branch is made); accept refuses a state dir made later all the same.
    type Seen = std::collections::HashMap<(PathBuf, bool), (std::time::Instant, Vec<PathBuf>)>;
    static SEEN: std::sync::Mutex<Option<Seen>> = std::sync::Mutex::new(None);
    let key = (project.clone(), credentials);
    let fresh = |at: &std::time::Instant| at.elapsed() < std::time::Duration::from_secs(1);
    if let Some((_, abs)) = SEEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .as_ref()
        .and_then(|m| m.get(&key))
        .filter(|(at, _)| fresh(at))
    {
        return abs.clone();
    }
    let mut abs = crate::state::state_places(&project);
    if credentials {
        abs.extend(crate::sandbox::credentials_inside(&project));
    }
    let mut seen = SEEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let m = seen.get_or_insert_with(Default::default);
    m.retain(|_, (at, _)| fresh(at));
    m.insert(key, (std::time::Instant::now(), abs.clone()));
    abs
}

impl Branch {
    /// Create and mount a new branch of `project`.
    pub fn create(project: &Path, opts: &BranchOptions) -> Result<Branch, BranchError> {
        Branch::make(project, opts, false)
    }

    /// Create a branch that holds no connection yet ([`Branch::detach`]ed from the start):
    /// no mount, thread or `/proc` look until [`Branch::attach`]. For a holder of many
    /// branches that are made ahead of use (`shade mcp`, the scale bench).
    pub fn create_detached(project: &Path, opts: &BranchOptions) -> Result<Branch, BranchError> {
        Branch::make(project, opts, true)
    }

    fn make(project: &Path, opts: &BranchOptions, detached: bool) -> Result<Branch, BranchError> {
        raise_fd_limit();
        keep_big_buffers_unresident();
        let project = std::fs::canonicalize(project).map_err(|source| BranchError::Project {
            path: project.to_path_buf(),
            source,
        })?;
        let meta = std::fs::metadata(&project).map_err(|source| BranchError::Project {
            path: project.clone(),
            source,
        })?;
        if !meta.is_dir() {
            return Err(BranchError::NotADirectory { path: project });
        }
        let mut lower = Lower::open(&project).map_err(|source| BranchError::Project {
            path: project.clone(),
            source,
        })?;
        // Listing the root proves the directory is readable before anything is mounted;
        // checked before /dev/fuse so an unreadable project is named as the problem.
        lower
            .read_dir(Path::new(""))
            .map_err(|source| BranchError::Project {
                path: project.clone(),
                source,
            })?;
        // A user who may open /dev/fuse but not mount(2) is mounted through the setuid
        // fusermount3 (fuser does it as libfuse does). One who may not open /dev/fuse
        // cannot use FUSE at all: fusermount3 opens it with the user's own rights too
        // (libfuse drops its privileges for that open), so it is no way around mode 0600.
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .map_err(|e| match e.raw_os_error() {
                Some(libc::EACCES | libc::EPERM) => BranchError::FuseDenied(e),
                _ => BranchError::NoFuse(e),
            })?;

        let id = format!(
            "{}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0)
        );
        let dir = opts.state.branches().join(&id);
        let store_dir = dir.join("store");
        let mountpoint = dir.join("mnt");
        let mk = |p: &Path, mode: u32| {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(mode)
                .create(p)
                .map_err(|source| BranchError::State {
                    path: p.to_path_buf(),
                    source,
                })
        };
        mk(&opts.state.branches(), 0o755)?;
        // Marked and listed, so that every other shade's sandbox hides it too.
        opts.state.mark().map_err(|source| BranchError::State {
            path: opts.state.root().to_path_buf(),
            source,
        })?;
        let mut hidden = hidden_in(&project, opts.hide_credentials, &opts.also_hide);
        if let Some(rel) = state_inside(&project, &opts.state)? {
            hidden.push(rel);
        }
        hidden.sort();
        hidden.dedup();
        lower.hide(&hidden);
        // The mount admits every uid (allow_other): this 0700 directory is what keeps
        // users outside the command away from it. The command reaches the branch through
        // its bind mount over the project's path, which needs no path through here.
        mk(&dir, 0o700)?;
        crate::pool::dir_use(&dir, None, Some(true));
        mk(&store_dir, 0o700)?;
        if !detached {
            // A detached branch mounts in a directory of its own when it attaches.
            mk(&mountpoint, 0o755)?;
        }
        let owner = dir.join("owner");
        std::fs::write(&owner, owner_text(&project)).map_err(|source| BranchError::State {
            path: owner,
            source,
        })?;

        let store = Store::new(
            store_dir,
            opts.memory_budget,
            Arc::new(Budget::new(opts.limits)),
        );
        // SAFETY: geteuid cannot fail.
        let euid = unsafe { libc::geteuid() };
        let key = crate::pool::Key {
            project: project.clone(),
            state: opts.state.root().to_path_buf(),
            allow_other: opts.allow_other,
            threads: opts.threads.max(1),
            shift: opts.id_shift,
            passthrough: crate::passthrough::wanted(),
            euid,
            hidden,
        };
        if detached {
            let root_dev = lower
                .stat(Path::new(""))
                .ok()
                .flatten()
                .map_or(0, |st| st.st_dev);
            let ignore = IgnoreRules::load(&project);
            let tree = crate::tree::Tree::new(root_dev);
            let overlay = Arc::new(Overlay::with_tree(lower, store, ignore, None, tree));
            overlay.tree().forget_kernel();
            let own = match opts.id_shift {
                Some(s) if is_shade_mount(&project) => {
                    // SAFETY: geteuid/getegid cannot fail.
                    let (u, g) = unsafe { (libc::geteuid(), libc::getegid()) };
                    Some((s.show(u), s.show(g)))
                }
                _ => None,
            };
            let mountpoint = dir.join("detached");
            live_mounts().insert(mountpoint.clone(), vec![dir.clone()]);
            return Ok(Branch {
                id,
                project,
                dir,
                mountpoint,
                state: opts.state.clone(),
                overlay,
                conn: None,
                parked: None,
                warm: std::sync::Mutex::new(None),
                own,
                key,
                detached: true,
            });
        }
        let pooled = (crate::pool::pool_size() > 0 && !key.passthrough)
            .then(|| crate::pool::take(&key))
            .flatten();
        let (lower, store) = match pooled {
            Some(conn) => {
                return Ok(Branch::on_pooled(
                    conn,
                    (id, project, dir),
                    (lower, store),
                    opts,
                    key,
                ))
            }
            None => (lower, store),
        };
        let overlay = Arc::new(Overlay::new(lower, store, IgnoreRules::load(&project)));
        // A branch of a branch reads its parent's mount, whose ids are already shifted:
        // left as they are, they are what the command's namespace maps back; shade's own
        // files there show as the namespace's root, which accept then counts as shade's.
        let (shift, own) = match opts.id_shift {
            Some(s) if is_shade_mount(&project) => {
                // SAFETY: geteuid/getegid cannot fail.
                let (u, g) = unsafe { (libc::geteuid(), libc::getegid()) };
                (None, Some((s.show(u), s.show(g))))
            }
            s => (s, None),
        };
        let conn = mount_conn(&key, &id, &dir, shift, &overlay)?;
        conn.serve(&overlay);
        raise_readahead(&mountpoint);
        live_mounts().insert(mountpoint.clone(), vec![dir.clone()]);
        Ok(Branch {
            id,
            project,
            dir,
            mountpoint,
            state: opts.state.clone(),
            overlay,
            conn: Some(conn),
            parked: None,
            warm: std::sync::Mutex::new(None),
            own,
            key,
            detached: false,
        })
    }

    /// A new branch served by `conn`, a pooled connection of the same project and options:
    /// it starts from the inodes the kernel still holds of it (`reset.rs`), with its own
    /// id, state directory, store, limits and reads.
    fn on_pooled(
        conn: crate::pool::Conn,
        (id, project, dir): (String, PathBuf, PathBuf),
        (lower, store): (Lower, Store),
        opts: &BranchOptions,
        key: crate::pool::Key,
    ) -> Branch {
        let tree = conn.unpark();
        let watch = conn.current.get().watch.clone();
        let overlay = Arc::new(Overlay::with_tree(
            lower,
            store,
            IgnoreRules::load(&project),
            watch,
            tree,
        ));
        conn.serve(&overlay);
        if let Some(w) = &overlay.watch {
            w.sync();
        }
        let own = match opts.id_shift {
            Some(s) if is_shade_mount(&project) => {
                // SAFETY: geteuid/getegid cannot fail.
                let (u, g) = unsafe { (libc::geteuid(), libc::getegid()) };
                Some((s.show(u), s.show(g)))
            }
            _ => None,
        };
        let mountpoint = conn.mountpoint.clone();
        live_mounts().insert(mountpoint.clone(), vec![dir.clone(), conn.dir.clone()]);
        tracing::debug!(
            branch = %id,
            connection = %conn.dir.display(),
            served = conn.served,
            "a pooled connection serves the new branch"
        );
        Branch {
            id,
            project,
            dir,
            mountpoint,
            state: opts.state.clone(),
            overlay,
            conn: Some(conn),
            parked: None,
            warm: std::sync::Mutex::new(None),
            own,
            key,
            detached: false,
        }
    }

    /// Whether this branch is served by a connection an earlier branch used (the pool).
    pub fn reused_connection(&self) -> bool {
        self.conn.as_ref().is_some_and(|c| c.served > 0)
    }

    /// Let the branch's FUSE connection go while nothing uses it (issue 31, scale): an idle
    /// branch then holds no mount, thread or descriptor — only its changes, store and
    /// reads — and ten thousand of them fit in one process. The connection goes back to
    /// the pool (or is unmounted) exactly as when a branch is dropped, after the same
    /// checks (`pool.rs`: no command running or tainted, no open handle, no process
    /// referring into the mount, no copy of it in another namespace); if any fails the
    /// branch stays attached and the reason is returned. [`Branch::attach`] (or
    /// [`Branch::mountpoint_attached`]) takes a connection again; the mount point may differ.
    pub fn detach(&mut self) -> Result<(), String> {
        if self.detached {
            return Ok(());
        }
        if self.conn.is_none() {
            return Err("the branch is unmounted".into());
        }
        // The warm-up walk reads through the mount (an open directory is a reference into
        // it): it ends first, or an idle branch still warming could never be detached.
        self.stop_warming();
        let Some(conn) = self.conn.as_ref() else {
            return Err("the branch is unmounted".into());
        };
        if let Some(why) = conn.busy(&self.overlay) {
            return Err(why);
        }
        let unsafe_to_pool = conn.unsafe_to_pool();
        let Some(conn) = self.conn.take() else {
            return Err("the branch is unmounted".into());
        };
        let pooling = crate::pool::pool_size() > 0 && !conn.key.passthrough;
        let make = match (&unsafe_to_pool, pooling) {
            (None, true) => self.parked_overlay(&conn).ok(),
            _ => None,
        };
        live_mounts().remove(&self.mountpoint);
        match make {
            Some(make) => {
                let _reset = conn.park(&self.overlay, make);
                crate::pool::give_checked(conn);
            }
            None => {
                // Unmounted (aborted): the kernel forgets everything of it, and whatever
                // still referred into it gets errors.
                if let Some(why) = &unsafe_to_pool {
                    tracing::debug!("detaching {} without pooling: {why}", self.id);
                }
                conn.discard();
            }
        }
        let stand_in = Arc::new(empty_overlay_like(&self.overlay));
        self.overlay = detached_overlay(std::mem::replace(&mut self.overlay, stand_in));
        self.overlay.tree().forget_kernel();
        // A path that does not exist: `mnt` may be the mount of the connection this branch
        // was first mounted with, which serves other branches now.
        self.mountpoint = self.dir.join("detached");
        live_mounts().insert(self.mountpoint.clone(), vec![self.dir.clone()]);
        self.detached = true;
        Ok(())
    }

    /// Whether the branch holds no connection now ([`Branch::detach`]).
    pub fn is_detached(&self) -> bool {
        self.detached
    }

    /// Take a FUSE connection again after [`Branch::detach`]: a pooled one of the project
    /// (its kernel caches of the unchanged project stay warm) or a new mount. The kernel
    /// is made to show exactly this branch (`attach.rs`): nothing of the connection's
    /// previous branches, every change of this one. Afterwards [`Branch::mountpoint`] is
    /// where it is mounted now. Does nothing on an attached branch.
    pub fn attach(&mut self) -> Result<(), BranchError> {
        if !self.detached {
            return Ok(());
        }
        let pooled = (crate::pool::pool_size() > 0 && !self.key.passthrough)
            .then(|| crate::pool::take(&self.key))
            .flatten();
        let (lower, store, ignore, mut tree) = take_parts(&mut self.overlay)?;
        let (conn, kernel) = match pooled {
            Some(conn) => {
                let kernel = conn.unpark();
                (Some(conn), kernel)
            }
            None => {
                let dev = lower
                    .stat(Path::new(""))
                    .ok()
                    .flatten()
                    .map_or(0, |st| st.st_dev);
                (None, crate::tree::Tree::new(dev))
            }
        };
        let reset = tree.adopt(kernel, &lower);
        let (conn, overlay) = match conn {
            Some(conn) => {
                let watch = conn.current.get().watch.clone();
                let overlay = Arc::new(Overlay::with_tree(lower, store, ignore, watch, tree));
                conn.serve(&overlay);
                reset.send(&conn.notifier);
                if let Some(w) = &overlay.watch {
                    w.sync();
                }
                (conn, overlay)
            }
            None => {
                let cache = std::env::var_os("SHADE_KERNEL_CACHE").is_none_or(|v| v != "0");
                let watch = cache
                    .then(|| crate::watch::LowerWatch::new(lower.root()))
                    .flatten();
                let overlay = Arc::new(Overlay::with_tree(lower, store, ignore, watch, tree));
                let cid = format!(
                    "{}-c{}",
                    std::process::id(),
                    COUNTER.fetch_add(1, Ordering::Relaxed)
                );
                let cdir = self.state.branches().join(&cid);
                let made = make_conn_dir(&cdir, &self.project);
                let shift = if self.own.is_some() {
                    None
                } else {
                    self.key.shift
                };
                let conn = made.and_then(|()| mount_conn(&self.key, &cid, &cdir, shift, &overlay));
                let conn = match conn {
                    Ok(c) => c,
                    Err(e) => {
                        // Keep the branch whole and detached: its parts go back.
                        self.overlay = detached_overlay(overlay);
                        self.overlay.tree().forget_kernel();
                        return Err(e);
                    }
                };
                conn.serve(&overlay);
                raise_readahead(&conn.mountpoint);
                (conn, overlay)
            }
        };
        live_mounts().remove(&self.mountpoint);
        self.mountpoint = conn.mountpoint.clone();
        live_mounts().insert(
            self.mountpoint.clone(),
            vec![self.dir.clone(), conn.dir.clone()],
        );
        tracing::debug!(
            branch = %self.id,
            connection = %conn.dir.display(),
            notifications = reset.len(),
            "a detached branch took a connection again"
        );
        self.overlay = overlay;
        self.conn = Some(conn);
        self.detached = false;
        Ok(())
    }

    /// [`Branch::attach`], then where the branch is mounted.
    pub fn mountpoint_attached(&mut self) -> Result<PathBuf, BranchError> {
        self.attach()?;
        Ok(self.mountpoint.clone())
    }

    /// Start walking the branch's directories in the background (`warm.rs`), so that
    /// the first commands find every entry and its attributes already in the kernel:
    /// for a branch made ahead of its commands (a speculation), a fresh `git status` then
    /// costs a fraction of its lookups. Ignored directories and `.git` are skipped; the
    /// walk reads no file data, records no reads and stops when the branch goes.
    pub fn warm_up(&self) -> std::io::Result<()> {
        let mut warm = self
            .warm
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if warm.is_none() {
            let o = self.overlay.clone();
            *warm = Some(crate::warm::Warm::start(
                self.mountpoint.clone(),
                move |rel| o.ignore.is_ignored(rel, true),
            )?);
        }
        Ok(())
    }

    /// Whether the walk [`Branch::warm_up`] started has finished (true if none started).
    pub fn warmed(&self) -> bool {
        self.warm
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .is_none_or(crate::warm::Warm::done)
    }

    /// Unique name of this branch (also the FUSE fsname suffix, unless the branch took a
    /// pooled connection: that keeps the name of the branch it was mounted for).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The real project directory this branch shadows.
    pub fn project(&self) -> &Path {
        &self.project
    }

    /// Where the branch's outside layer lives: the writes its commands make outside the
    /// project (see `sandbox::RunSpec::outside`).
    pub fn outside_dir(&self) -> PathBuf {
        self.dir.join("outside")
    }

    /// Where the branch is mounted; processes see the project's files here.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// The limits this branch reached since the last call (each said once): a command
    /// that got ENOSPC from the branch's budgets, to be reported in one line.
    pub fn take_limit_hits(&self) -> Vec<LimitHit> {
        self.overlay.store.limits().take_hits()
    }

    /// The limits this branch enforces.
    pub fn limits(&self) -> BranchLimits {
        self.overlay.store.limits().limits()
    }

    /// Bytes of file contents the branch holds, in memory and on disk, as its contents
    /// budget counts them.
    pub fn size_used(&self) -> u64 {
        self.overlay.store.limits().size_used()
    }

    /// Bytes of file content this branch holds in memory (the rest is on disk).
    pub fn memory_used(&self) -> u64 {
        self.overlay.store.memory_used()
    }

    /// What the branch changed so far.
    pub fn changeset(&self, include_ignored: bool) -> Changeset {
        self.overlay.changeset(include_ignored)
    }

    /// Unified diff of `changes` (from [`Branch::changeset`]).
    pub fn diff(&self, changes: &Changeset) -> String {
        self.overlay.diff(changes)
    }

    /// Stop serving the mount (processes using it get errors from now on).
    /// Stop the background walk that warms the kernel's caches (it walks the mount).
    fn stop_warming(&mut self) {
        if let Some(mut w) = self
            .warm
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        {
            w.stop();
        }
    }

    pub fn unmount(&mut self) {
        // The outside layer's overlays first: the branch's directory is removed next. (None
        // can be mounted under a directory that does not exist: a branch no command ran in
        // skips reading the mount table, which 10,000 dropped branches felt.)
        let outside = self.outside_dir();
        if std::fs::symlink_metadata(&outside).is_ok() {
            crate::sandbox::release_outside(&outside);
        }
        self.stop_warming();
        let Some(conn) = self.conn.take() else {
            return;
        };
        let unreusable = conn.unreusable(&self.overlay, false);
        if let Some(why) = &unreusable {
            tracing::debug!("not pooling {}: {why}", self.mountpoint.display());
        }
        if crate::pool::pool_size() > 0 && !conn.key.passthrough && unreusable.is_none() {
            match self.parked_overlay(&conn) {
                Ok(make) => {
                    let reset = conn.park(&self.overlay, make);
                    tracing::debug!(
                        notifications = reset.len(),
                        "branch {} let its connection go to the pool",
                        self.id
                    );
                    self.parked = Some((conn, reset));
                    return;
                }
                Err(e) => tracing::debug!("not pooling {}: {e}", self.mountpoint.display()),
            }
        }
        conn.discard();
    }

    /// What a parked connection serves until a branch takes it: the unchanged project,
    /// with no room for any change.
    fn parked_overlay(
        &self,
        conn: &crate::pool::Conn,
    ) -> std::io::Result<impl FnOnce(crate::tree::Tree) -> Overlay> {
        let mut lower = Lower::open(&self.project)?;
        lower.hide(&self.overlay.lower.hidden());
        let none = BranchLimits {
            size: Some(0),
            metadata: Some(0),
        };
        let store = Store::new(conn.dir.join("parked"), 0, Arc::new(Budget::new(none)));
        let ignore = IgnoreRules::load(&self.project);
        let watch = self.overlay.watch.clone();
        Ok(move |tree| Overlay::with_tree(lower, store, ignore, watch, tree))
    }

    /// The accept plan of the branch as it is now.
    fn plan(&self, flags: AcceptFlags) -> Result<Vec<crate::plan::PlanOp>, AcceptError> {
        self.overlay
            .plan(flags.include_ignored)
            .map_err(|source| AcceptError::Io {
                path: self.project.clone(),
                source,
            })
    }

    /// What the branch read before the changes it would accept (`reads.rs`).
    fn read_bases(&self, flags: AcceptFlags) -> Vec<crate::plan::ReadBase> {
        if self.reads_recorded() == 0 && !self.overlay.deletes_a_directory() {
            return Vec::new(); // and no changeset to compute again
        }
        let changes = self.overlay.changeset(flags.include_ignored);
        let bases = self.overlay.read_bases(&changes, flags.include_ignored);
        tracing::debug!(
            recorded = self.reads_recorded(),
            checked = bases.len(),
            "reads the accept checks"
        );
        bases
    }

    /// How many lower paths the branch has read so far (files, symlinks and listings).
    pub fn reads_recorded(&self) -> usize {
        self.overlay.tree().reads.len()
    }

    /// Refuse a plan that touches what the branch hides (the accept engine guards the state
    /// dirs and their registry itself; this adds the credentials a mode hid).
    fn guard(&self, plan: &[crate::plan::PlanOp]) -> Result<(), AcceptError> {
        accept::Protected::default()
            .with(&self.overlay.lower.hidden())
            .check_plan(plan)
    }

    /// Plan and apply: the accept's common part.
    fn apply(&self, flags: AcceptFlags) -> Result<AcceptReport, AcceptError> {
        let plan = self.plan(flags)?;
        self.guard(&plan)?;
        accept::apply(
            &self.project,
            plan,
            &AcceptOptions {
                force: flags.force,
                state: self.state.clone(),
                reads: self.read_bases(flags),
                own: self.own,
            },
        )
    }

    /// Would [`Branch::accept`] be refused now (conflicts, unsafe paths)? Writes nothing and
    /// keeps the branch mounted, so an interactive caller can report and let the user decide.
    /// (The accept checks again: the project may change in between.)
    pub fn check_accept(&self, flags: AcceptFlags) -> Result<(), AcceptError> {
        let plan = self.plan(flags)?;
        self.guard(&plan)?;
        accept::check_plan(
            &self.project,
            &plan,
            &self.read_bases(flags),
            flags.force,
            self.own,
            Some(self.state.root()),
        )
    }

    /// [`Branch::accept`] without unmounting first, for a caller that knows nothing can
    /// write in the branch any more (every process that could has been killed, as a shadow
    /// does): dirty pages are synced to the overlay, then the same all-or-nothing accept runs,
    /// and the slow unmount is left to dropping the branch — after the user has the result.
    pub fn accept_quiesced(&self, flags: AcceptFlags) -> Result<AcceptReport, AcceptError> {
        if let Ok(dir) = std::fs::File::open(&self.mountpoint) {
            use std::os::fd::AsRawFd;
            // SAFETY: syncfs on a descriptor we own; it only flushes.
            unsafe {
                libc::syncfs(dir.as_raw_fd());
            }
        }
        self.apply(flags)
    }

    /// Apply the branch's changes to the project: all or nothing, conflict-checked.
    /// The branch is unmounted first so nothing changes under the accept.
    pub fn accept(mut self, flags: AcceptFlags) -> Result<AcceptReport, AcceptError> {
        self.unmount();
        self.apply(flags)
    }

    /// `changes` (from [`Branch::changeset`]) as a [`Selection`] to pick from, everything
    /// picked; it knows which changes come only together (see `select.rs`).
    pub fn selection(&self, changes: Changeset) -> Selection {
        self.overlay.selection(changes)
    }

    /// The accept plan of the picked changes of `sel` (the whole branch when all are picked).
    fn plan_selected(
        &self,
        flags: AcceptFlags,
        sel: &Selection,
    ) -> Result<Vec<crate::plan::PlanOp>, AcceptError> {
        if sel.all_picked() {
            return self.plan(flags);
        }
        let keep = crate::select::Keep::of(sel);
        self.overlay
            .plan_only(flags.include_ignored, Some(&keep))
            .map_err(|source| AcceptError::Io {
                path: self.project.clone(),
                source,
            })
    }

    /// The reads to check for the picked changes of `sel`: those before a picked change
    /// (`reads.rs`; the check of removed directories' trees stays whole, which is stricter).
    fn read_bases_selected(
        &self,
        flags: AcceptFlags,
        sel: &Selection,
    ) -> Vec<crate::plan::ReadBase> {
        if sel.all_picked() || (self.reads_recorded() == 0 && !self.overlay.deletes_a_directory()) {
            return self.read_bases(flags);
        }
        self.overlay
            .read_bases(&sel.picked(), flags.include_ignored)
    }

    /// [`Branch::check_accept`] for the picked changes of `sel` only: a review can report a
    /// conflict and let the person pick again. Writes nothing.
    pub fn check_accept_selected(
        &self,
        flags: AcceptFlags,
        sel: &Selection,
    ) -> Result<(), AcceptError> {
        let plan = self.plan_selected(flags, sel)?;
        self.guard(&plan)?;
        accept::check_plan(
            &self.project,
            &plan,
            &self.read_bases_selected(flags, sel),
            flags.force,
            self.own,
            Some(self.state.root()),
        )
    }

    /// [`Branch::accept`] of the picked changes of `sel` only (a person reviewed the branch
    /// and picked files): the same all-or-nothing, conflict-checked accept, of a plan that
    /// holds nothing else; the rest of the branch is dropped with it.
    pub fn accept_selected(
        mut self,
        flags: AcceptFlags,
        sel: &Selection,
    ) -> Result<AcceptReport, AcceptError> {
        self.unmount();
        let plan = self.plan_selected(flags, sel)?;
        self.guard(&plan)?;
        accept::apply(
            &self.project,
            plan,
            &AcceptOptions {
                force: flags.force,
                state: self.state.clone(),
                reads: self.read_bases_selected(flags, sel),
                own: self.own,
            },
        )
    }

    /// Drop every change of the branch.
    pub fn abort(self) {}
}

impl Drop for Branch {
    fn drop(&mut self) {
        self.unmount();
        let parked = self.parked.take();
        let removed = if crate::pool::dir_use(&self.dir, None, Some(false)) {
            // A connection mounted in the branch's directory (this was its first branch)
            // lives on in the pool or serves another branch: only the branch's own parts go.
            ["store", "outside"]
                .iter()
                .map(|p| self.dir.join(p))
                .filter(|p| p.exists())
                .try_for_each(std::fs::remove_dir_all)
        } else {
            std::fs::remove_dir_all(&self.dir)
        };
        if let Err(e) = removed {
            tracing::warn!("removing branch store {}: {e}", self.dir.display());
        }
        live_mounts().remove(&self.mountpoint);
        if let Some((conn, reset)) = parked {
            // An accept wrote the branch's changes into the project since it was parked:
            // what the kernel cached of those paths in between is dropped too.
            reset.send(&conn.notifier);
            crate::pool::give(conn);
        }
    }
}

/// An overlay of the same project with nothing in it, to stand in for a moment while a
/// branch's own is taken apart.
fn empty_overlay_like(o: &Overlay) -> Overlay {
    let none = BranchLimits {
        size: Some(0),
        metadata: Some(0),
    };
    let store = Store::new(PathBuf::new(), 0, Arc::new(Budget::new(none)));
    Overlay::with_tree(
        o.lower.clone(),
        store,
        IgnoreRules::empty(),
        None,
        crate::tree::Tree::new(0),
    )
}

/// `o` as a detached branch keeps it: its own parts only (no handles, cached lower
/// descriptors, listings, watch or notifier). If something still holds the served overlay
/// (a request in flight the instant the connection passed on), it is kept as it is and
/// taken apart on the next attach.
fn detached_overlay(mut o: Arc<Overlay>) -> Arc<Overlay> {
    for _ in 0..200 {
        match Arc::try_unwrap(o) {
            Ok(ov) => {
                let (lower, store, ignore, tree) = ov.into_parts();
                return Arc::new(Overlay::with_tree(lower, store, ignore, None, tree));
            }
            Err(back) => {
                o = back;
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    }
    o
}

/// The parts of a detached branch's overlay, to build the served one from.
fn take_parts(
    o: &mut Arc<Overlay>,
) -> Result<(Lower, Store, IgnoreRules, crate::tree::Tree), BranchError> {
    let stand_in = Arc::new(empty_overlay_like(o));
    let mine = std::mem::replace(o, stand_in);
    let mut mine = mine;
    for _ in 0..1000 {
        match Arc::try_unwrap(mine) {
            Ok(ov) => return Ok(ov.into_parts()),
            Err(back) => {
                mine = back;
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    }
    let path = mine.lower.root().to_path_buf();
    *o = mine;
    Err(BranchError::State {
        path,
        source: std::io::Error::other("the branch's overlay is still in use"),
    })
}

/// A connection's own state directory (for a detached branch that takes a new mount): an
/// owner file, so `cleanup_stale` finds it after a crash, and the mount point.
fn make_conn_dir(dir: &Path, project: &Path) -> Result<(), BranchError> {
    use std::os::unix::fs::DirBuilderExt;
    let err = |p: &Path| {
        let p = p.to_path_buf();
        move |source| BranchError::State { path: p, source }
    };
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .map_err(err(dir))?;
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(dir.join("mnt"))
        .map_err(err(dir))?;
    std::fs::write(dir.join("owner"), owner_text(project)).map_err(err(dir))
}

/// Mount a new FUSE connection at `dir/mnt` serving `overlay`, with `key`'s options.
fn mount_conn(
    key: &crate::pool::Key,
    id: &str,
    dir: &Path,
    shift: Option<crate::idmap::IdShift>,
    overlay: &Arc<Overlay>,
) -> Result<crate::pool::Conn, BranchError> {
    let mountpoint = dir.join("mnt");
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(format!("shade:{id}")),
        MountOption::Subtype("shade".into()),
        MountOption::DefaultPermissions,
        MountOption::Dev,
        MountOption::Suid,
    ];
    config.acl = if key.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(key.threads.max(1));
    config.clone_fd = key.threads > 1;
    let current = Arc::new(crate::fs::Current::new(overlay.clone()));
    let fs = ShadeFs {
        current: current.clone(),
        passthrough: (key.passthrough && overlay.caching())
            .then(crate::passthrough::Passthrough::default),
        shift,
    };
    let session = fuser::Session::new(fs, &mountpoint, &config)
        .and_then(|s| s.spawn())
        .map_err(|source| {
            let _ = std::fs::remove_dir_all(dir);
            BranchError::Mount {
                path: mountpoint.clone(),
                source,
            }
        })?;
    Ok(crate::pool::Conn::new(
        session,
        current,
        mountpoint,
        dir.to_path_buf(),
        key.clone(),
    ))
}

/// Every branch this process has mounted and not yet dropped: mount point → state directory.
/// A process that must end now (a signal, a lost terminal) cannot wait for each owner to drop
/// its branch, so [`unmount_all_before_exit`] finds them all here.
static LIVE_MOUNTS: std::sync::Mutex<std::collections::BTreeMap<PathBuf, Vec<PathBuf>>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

fn live_mounts() -> std::sync::MutexGuard<'static, std::collections::BTreeMap<PathBuf, Vec<PathBuf>>>
{
    LIVE_MOUNTS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// How many branches this process has mounted and not yet dropped.
pub fn live_mount_count() -> usize {
    live_mounts().len()
}

/// Before the process exits without unwinding (`std::process::exit` after a signal): detach
/// every branch it still has mounted and remove its state, wherever its owner is (a thread
/// blocked on a question, a speculation being dropped). Processes still using a branch get
/// errors from then on; the kernel ends each FUSE connection when the process exits.
/// Returns how many branches were still mounted.
pub fn unmount_all_before_exit() -> usize {
    let live = std::mem::take(&mut *live_mounts());
    for (mountpoint, dirs) in &live {
        lazy_unmount(mountpoint);
        for dir in dirs {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
    crate::pool::drain_before_exit();
    live.len()
}

/// Each branch holds a few fds (its FUSE channel per worker thread, the lower directory,
/// cached lower files); hundreds of branches need more than the default soft limit of
/// 1024, so raise it to the hard limit once.
fn raise_fd_limit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        use nix::sys::resource::{getrlimit, setrlimit, Resource};
        if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
            if soft < hard {
                let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
            }
        }
    });
}

/// Each FUSE worker allocates a zeroed 16 MiB request buffer. Once glibc's dynamic mmap
/// threshold has grown (it does after the first large free), such buffers come from the
/// heap and are zero-filled, so every idle branch kept ~10 MiB resident. Pinning the
/// threshold makes them fresh mmaps whose untouched pages cost nothing.
fn keep_big_buffers_unresident() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only tunes the allocator; any value is valid to pass.
    ONCE.call_once(|| unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    });
    #[cfg(not(target_env = "gnu"))]
    ONCE.call_once(|| {});
}

pub(crate) use crate::pool::lazy_unmount;

/// Branches left behind by a shade process that died: unmount them and remove their
/// stores. Returns the ids cleaned up.
pub fn cleanup_stale(state: &StateDir) -> Vec<String> {
    let mut cleaned = Vec::new();
    let Ok(entries) = std::fs::read_dir(state.branches()) else {
        return cleaned;
    };
    let own_ns = pid_namespace();
    for e in entries.flatten() {
        let dir = e.path();
        let owner = std::fs::read_to_string(dir.join("owner")).unwrap_or_default();
        let mut lines = owner.lines();
        // A directory whose owner file is not written yet (its shade is making it right
        // now) is known by its name, `PID-N-…`.
        let pid: i32 = lines
            .next()
            .and_then(|l| l.trim().parse().ok())
            .or_else(|| {
                e.file_name()
                    .to_str()
                    .and_then(|n| n.split('-').next())
                    .and_then(|p| p.parse().ok())
            })
            .unwrap_or(0);
        if pid > 0 && pid_alive(pid) {
            continue;
        }
        // No owner file yet and just made: a shade (maybe of another PID namespace, whose
        // pid says nothing here) is making it right now.
        let young = || {
            std::fs::symlink_metadata(&dir)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age < std::time::Duration::from_secs(60))
        };
        if owner.is_empty() && young() {
            continue;
        }
        // A shade of another PID namespace: its pid says nothing here.
        let ns = lines
            .nth(1)
            .and_then(|l| l.strip_prefix("pidns "))
            .map(str::trim);
        if let (Some(ns), Some(own)) = (ns, own_ns.as_deref()) {
            if ns != own {
                continue;
            }
        }
        // Only what shade makes: a real directory whose `mnt` and `outside` are real
        // directories. A planted symlink there would turn the unmount and the outside
        // layer's release onto any path (red team round 8); such a directory is left alone.
        let real_dir = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir());
        let not_dir = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| !m.is_dir());
        if !real_dir(&dir) || not_dir(&dir.join("mnt")) || not_dir(&dir.join("outside")) {
            tracing::warn!(
                "{}: not a branch directory shade made (a symlink in it); left as it is",
                dir.display()
            );
            continue;
        }
        lazy_unmount(&dir.join("mnt"));
        // Its outside layer's overlays too, before the removal walks into them.
        crate::sandbox::release_outside(&dir.join("outside"));
        if std::fs::remove_dir_all(&dir).is_ok() {
            cleaned.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    cleaned
}

/// What a branch directory's `owner` file says: the pid of the shade that made it, the
/// project, and that shade's PID namespace (a pid means nothing in another).
fn owner_text(project: &Path) -> String {
    format!(
        "{}\n{}\npidns {}\n",
        std::process::id(),
        project.display(),
        pid_namespace().unwrap_or_default()
    )
}

/// This process's PID namespace, as `readlink /proc/self/ns/pid` says it.
fn pid_namespace() -> Option<String> {
    std::fs::read_link("/proc/self/ns/pid")
        .ok()
        .map(|l| l.to_string_lossy().into_owned())
}

fn pid_alive(pid: i32) -> bool {
    // A recycled pid keeps a stale branch alive until that process exits: harmless.
    // A zombie (exited, not reaped) serves no branch: it is dead too.
    crate::accept::process_alive(pid)
}

/// Readahead for the mount, in KiB: one full-size (1 MiB) FUSE READ per step.
const READAHEAD_KB: u32 = 1024;

/// Let sequential reads of unchanged files arrive as 1 MiB READs instead of the
/// default 128 KiB (FUSE can only lower readahead at init; the bdi's sysfs knob raises
/// it). Measured on a cold 1 GiB file: 0.86 → 1.7 GB/s. Needs root; without it the
/// default stays, which is only slower.
fn raise_readahead(mountpoint: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(mountpoint) else {
        return;
    };
    let (major, minor) = (libc::major(meta.dev()), libc::minor(meta.dev()));
    let knob = format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb");
    if let Err(e) = std::fs::write(&knob, READAHEAD_KB.to_string()) {
        tracing::debug!(
            "readahead of {} stays default: {knob}: {e}",
            mountpoint.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape_mount(r"/a\040b\134c"), b"/a b\\c".to_vec());
        assert_eq!(unescape_mount(r"/plain\0"), b"/plain\\0".to_vec());
        assert!(!is_shade_mount(Path::new("/")));
    }
}
