//! The client side of the per-project branch server (issue 31): a branch asked of the
//! project's server, whose FUSE connection the server keeps warm between branches (the pool,
//! `pool.rs`). The server itself is the `shade` binary's (`src/branch_server`): a process
//! that may serve (`set_server_exe`, which only that binary calls) starts it on first use
//! (a hidden subcommand, detached with setsid, its log under the state directory) and asks
//! it over a unix socket in the 0700 state directory for a mounted branch; the client binds
//! the mount point into its sandbox as it binds its own branch, and keeps the socket open
//! for the branch's life: EOF without a `Drop` (the client was killed) aborts the branch and
//! its connection. The changeset, diff and accept run in the server (the same engine) and
//! come back as copies (`wire.rs`). Here so that every branch user (`shade run`, the agent's
//! shadows) can be served without depending on the binary.
//! `SHADE_BRANCH_SERVER=0` keeps every branch in-process, as does a server that cannot
//! start, or a process that never named a server executable (a library's tests).
//! See `fusefs/DESIGN-warm.md`.

pub mod wire;

use crate::{AcceptError, AcceptFlags, AcceptReport, Branch, BranchOptions, Changeset, LimitHit};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use wire::{Reply, Request};

/// The descriptor the server finds its end of the ready pipe at.
const READY_FD: i32 = 3;

/// The hidden subcommand the server runs as.
pub const SUBCOMMAND: &str = "__branch-server";

/// The executable that serves (`SUBCOMMAND`), once this process said it has one.
static SERVER_EXE: OnceLock<PathBuf> = OnceLock::new();

/// Name the executable that runs the server (the `shade` binary, itself): until a process
/// calls this, its branches are all made in-process.
pub fn set_server_exe(exe: PathBuf) {
    let _ = SERVER_EXE.set(exe);
}

/// Whether branches come from a server: an executable for it was named, and
/// `SHADE_BRANCH_SERVER=0` does not turn it off.
pub fn enabled() -> bool {
    SERVER_EXE.get().is_some()
        && std::env::var("SHADE_BRANCH_SERVER").map_or(true, |v| v.trim() != "0")
}

/// FNV-1a: a name that is the same in every build (std's hasher promises no such thing).
fn fnv(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.iter().chain(&[0xff]) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// What tells this shade build from another: its version and its executable's size and
/// modification time (two builds of one version differ in those).
fn build_tag() -> String {
    use std::os::unix::fs::MetadataExt;
    let exe = std::fs::metadata("/proc/self/exe").ok();
    let (size, mtime, nsec) = exe.map_or((0, 0, 0), |m| (m.size(), m.mtime(), m.mtime_nsec()));
    format!("{}:{size}:{mtime}.{nsec}", env!("CARGO_PKG_VERSION"))
}

/// Where one server's socket, lock and log live (the server finds its own the same way).
pub struct Paths {
    dir: PathBuf,
    /// The socket it listens on.
    pub socket: PathBuf,
    /// The starters' lock.
    pub lock: PathBuf,
    /// The server's log (its stdout and stderr).
    pub log: PathBuf,
}

impl Paths {
    /// The paths of the server of `project` with state directory `state`, for this user,
    /// mount namespace and build.
    pub fn new(project: &Path, state: &Path) -> Paths {
        use std::os::unix::ffi::OsStrExt;
        let euid = euid().to_string();
        // A server mounts in its own mount namespace: a client in another one (`unshare -m`,
        // a container) could not see its mounts, so it gets a server of its own.
        let mnt_ns = std::fs::read_link("/proc/self/ns/mnt").unwrap_or_default();
        let who = fnv(&[
            project.as_os_str().as_bytes(),
            state.as_os_str().as_bytes(),
            euid.as_bytes(),
            mnt_ns.as_os_str().as_bytes(),
        ]);
        let build = fnv(&[build_tag().as_bytes()]) as u32;
        let dir = state.join("servers");
        let name = format!("{who:016x}-{build:08x}");
        Paths {
            socket: dir.join(format!("{name}.sock")),
            lock: dir.join(format!("{name}.lock")),
            log: dir.join(format!("{name}.log")),
            dir,
        }
    }

    /// The servers' directory, made 0700 (only shade's user may reach a socket in it).
    /// One of another user's is refused, never changed.
    pub fn make_dir(&self) -> std::io::Result<()> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)?;
        owned(&self.dir, false)?;
        std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o700))
    }

    /// A connection to the server listening here, if it is this user's: the directory and
    /// socket are the effective user's with no group or other write, and the process that
    /// listens is the effective user's (`SO_PEERCRED`). Else `PermissionDenied` (nothing is
    /// started then): a root `shade run` with a user's state directory (`sudo -E`) must not
    /// hand a user's process its branch, nor a user's files to a user's "server".
    fn connect(&self) -> std::io::Result<UnixStream> {
        owned(&self.dir, true)?;
        owned(&self.socket, true)?;
        let s = UnixStream::connect(&self.socket)?;
        let uid = peer_uid(&s)?;
        if uid != euid() {
            return Err(denied(format!(
                "{} is served by uid {uid}, not {}",
                self.socket.display(),
                euid()
            )));
        }
        Ok(s)
    }
}

/// The effective user id.
pub fn euid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

fn denied(msg: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::PermissionDenied, msg)
}

/// `Ok` when `path` (not followed) is the effective user's and, when `strict`, writable by
/// nobody else.
fn owned(path: &Path, strict: bool) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(path)?;
    if m.uid() != euid() {
        return Err(denied(format!(
            "{} belongs to uid {}, not {}",
            path.display(),
            m.uid(),
            euid()
        )));
    }
    if strict && m.mode() & 0o022 != 0 {
        return Err(denied(format!(
            "{} is writable by others (mode {:o})",
            path.display(),
            m.mode() & 0o7777
        )));
    }
    Ok(())
}

/// The user id of the process at the other end of `stream` (as it was when it connected,
/// or listened).
pub fn peer_uid(stream: &UnixStream) -> std::io::Result<u32> {
    peer_cred(stream).map(|c| c.uid)
}

/// The credentials (pid, uid, gid) of the process at the other end of `stream`, as they
/// were when it connected or listened; a pid of 0 is one of a PID namespace we cannot see.
pub fn peer_cred(stream: &UnixStream) -> std::io::Result<libc::ucred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: u32::MAX,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt into a ucred of the size given.
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cred)
}

/// One request and its answer over a server connection: a JSON line each way.
fn exchange(
    reader: &mut impl BufRead,
    writer: &mut impl Write,
    req: &Request,
) -> std::io::Result<Reply> {
    let mut line = serde_json::to_vec(req)?;
    line.push(b'\n');
    writer.write_all(&line)?;
    let mut answer = String::new();
    if reader.read_line(&mut answer)? == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the branch server closed the connection",
        ));
    }
    serde_json::from_str(&answer).map_err(std::io::Error::other)
}

/// An exclusive `flock` on a file, released when dropped.
pub struct Lock {
    _file: std::fs::File,
}

impl Lock {
    /// Lock `path` (made if missing, never through a link), waiting for it when `wait`.
    pub fn take(path: &Path, wait: bool) -> std::io::Result<Lock> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::OpenOptionsExt;
        // Never through a link planted in the directory.
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)?;
        let op = libc::LOCK_EX | if wait { 0 } else { libc::LOCK_NB };
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(f.as_raw_fd(), op) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Lock { _file: f })
    }
}

/// A branch served by the branch server: the client's side of it. Dropping it drops the
/// branch (its connection goes back to the server's pool).
pub struct RemoteBranch {
    /// The socket to the server; `None` while the branch is parked.
    conn: Mutex<Option<(BufReader<UnixStream>, UnixStream)>>,
    project: PathBuf,
    /// The state directory (absolute) the server was found by.
    state: PathBuf,
    /// Set while the branch is parked in the server ([`RemoteBranch::park`]): the secret
    /// that names it there.
    token: Option<String>,
    mountpoint: PathBuf,
    outside_dir: PathBuf,
    server_pid: u32,
    /// The connection served an earlier branch.
    reused: bool,
    done: bool,
    /// The caller allows the connection to serve a later branch (see `reusable`).
    reuse: bool,
}

impl RemoteBranch {
    /// Ask the project's server for a branch, starting the server if none runs. `None`
    /// when it cannot be had (the caller makes the branch itself). `reuse`: whether the
    /// caller allows its connection to serve a later branch at all.
    pub fn create(project: &Path, opts: &BranchOptions, reuse: bool) -> Option<RemoteBranch> {
        // The server runs in /: a relative state directory is made absolute for it.
        let state = std::path::absolute(opts.state.root()).ok()?;
        let paths = Paths::new(project, &state);
        if paths.socket.as_os_str().len() >= 100 {
            tracing::debug!(
                "branch server: socket path {} too long; the branch is made in-process",
                paths.socket.display()
            );
            return None;
        }
        let req = Request::Create {
            project: wire::bytes(project),
            id_shift: opts.id_shift.map(|s| s.base),
            size: opts.limits.size,
            metadata: opts.limits.metadata,
            memory_budget: opts.memory_budget,
            hide_credentials: opts.hide_credentials,
            // The server's environment is its first client's: this one's may name other
            // state dirs or credentials.
            also_hide: crate::branch::hidden_paths(project, opts.hide_credentials)
                .iter()
                .map(|p| wire::bytes(p))
                .collect(),
        };
        // A server that was exiting as we connected closes on us: start another.
        for _ in 0..3 {
            let stream = match connect_or_start(&paths, project, &state) {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(
                        "branch server unavailable ({e}); the branch is made in-process"
                    );
                    return None;
                }
            };
            // A server that accepted but never answers (stopped, wedged, dying with its
            // socket still queued) must not hang the run: the branch is made in-process.
            // Later calls (an accept of many files) may take as long as they need.
            if stream.set_read_timeout(Some(CREATE_TIMEOUT)).is_err() {
                return None;
            }
            let Ok(reader) = stream.try_clone().map(BufReader::new) else {
                return None;
            };
            let mut b = RemoteBranch {
                conn: Mutex::new(Some((reader, stream))),
                project: project.to_path_buf(),
                state: state.clone(),
                token: None,
                mountpoint: PathBuf::new(),
                outside_dir: PathBuf::new(),
                server_pid: 0,
                reused: false,
                done: true,
                reuse,
            };
            match b.call(&req) {
                Ok(Reply::Created {
                    mountpoint,
                    outside_dir,
                    reused,
                    server_pid,
                    dev,
                }) => {
                    b.mountpoint = wire::path(mountpoint);
                    b.outside_dir = wire::path(outside_dir);
                    b.server_pid = server_pid;
                    b.reused = reused;
                    b.done = false;
                    let untimed = b.untimed();
                    if let Err(e) = untimed {
                        tracing::debug!("branch server: {e}; the branch is made in-process");
                        return None;
                    }
                    // The branch must be the server's mount, seen here: never bind a plain
                    // directory (or anything else) over the project.
                    if !is_fuse_mount(&b.mountpoint, dev) {
                        tracing::debug!(
                            "branch server: {} is not its mount here; the branch is made in-process",
                            b.mountpoint.display()
                        );
                        return None;
                    }
                    tracing::debug!(
                        server_pid,
                        reused_connection = reused,
                        mountpoint = %b.mountpoint.display(),
                        "branch served by the branch server"
                    );
                    return Some(b);
                }
                Ok(Reply::Error(e)) => {
                    tracing::debug!("branch server: {e}; the branch is made in-process");
                    return None;
                }
                Ok(other) => {
                    tracing::debug!(
                        "branch server answered {other:?}; the branch is made in-process"
                    );
                    return None;
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    tracing::debug!(
                        "branch server: no answer in {CREATE_TIMEOUT:?}; the branch is made in-process"
                    );
                    return None;
                }
                Err(e) => tracing::debug!("branch server: {e}; trying again"),
            }
        }
        None
    }

    /// No read timeout on the socket from now on.
    fn untimed(&self) -> std::io::Result<()> {
        match &*self
            .conn
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
        {
            Some((_, w)) => w.set_read_timeout(None),
            None => Ok(()),
        }
    }

    fn call(&self, req: &Request) -> std::io::Result<Reply> {
        let mut g = self
            .conn
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some((reader, writer)) = g.as_mut() else {
            drop(g);
            return self.call_parked(req);
        };
        exchange(reader, writer, req)
    }

    /// Whether the connection may serve a later branch, as only this process can know: the
    /// commands ran here, in its sandbox (`CommandUse`: containment, allowed sockets,
    /// survivors). The server pools it only on this word, after its own checks.
    fn reusable(&self) -> bool {
        let why = if self.reuse {
            match crate::commands_left_it_reusable(&self.mountpoint) {
                Ok(()) => return true,
                Err(why) => why,
            }
        } else {
            "the caller keeps it from being reused".into()
        };
        tracing::debug!("branch server: the connection is not to be reused: {why}");
        false
    }

    fn lost(&self, e: impl std::fmt::Display) -> std::io::Error {
        std::io::Error::other(format!(
            "the branch server (pid {}) failed: {e}",
            self.server_pid
        ))
    }

    /// Where the branch is mounted.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Whether the server's connection served an earlier branch (its caches are warm).
    pub fn reused_connection(&self) -> bool {
        self.reused
    }

    /// The project the branch is of.
    pub fn project(&self) -> &Path {
        &self.project
    }

    /// The branch limits reached since the last call, as the engine reports them (the
    /// branch's own: contents and metadata).
    pub fn take_limits_hit(&self) -> Vec<LimitHit> {
        match self.call(&Request::LimitsHit) {
            Ok(Reply::Hits(h)) => h.into_iter().map(wire::WireHit::hit).collect(),
            _ => Vec::new(),
        }
    }

    /// Where the branch's outside layer lives (the client's sandbox writes it).
    pub fn outside_dir(&self) -> PathBuf {
        self.outside_dir.clone()
    }

    /// The limits the branch reached since the last call, as lines to print.
    pub fn take_limit_hits(&self) -> Vec<String> {
        match self.call(&Request::LimitHits) {
            Ok(Reply::Lines(l)) => l,
            _ => Vec::new(),
        }
    }

    /// What the branch changed.
    pub fn changeset(&self, include_ignored: bool) -> std::io::Result<Changeset> {
        match self.call(&Request::Changeset { include_ignored })? {
            Reply::Changes(list) => Ok(Changeset {
                changes: list
                    .into_iter()
                    .filter_map(wire::WireChange::change)
                    .collect(),
            }),
            other => Err(self.lost(format!("{other:?}"))),
        }
    }

    /// The unified diff of `changes`.
    pub fn diff(&self, changes: &Changeset) -> std::io::Result<String> {
        let changes = changes.changes.iter().map(Into::into).collect();
        match self.call(&Request::Diff { changes })? {
            Reply::Text(t) => Ok(t),
            other => Err(self.lost(format!("{other:?}"))),
        }
    }

    fn accept_error(&self, e: impl std::fmt::Display) -> AcceptError {
        AcceptError::Io {
            path: self.project.clone(),
            source: self.lost(e),
        }
    }

    /// Would an accept be refused now? Writes nothing.
    pub fn check_accept(&self, flags: AcceptFlags) -> Result<(), AcceptError> {
        let req = Request::CheckAccept {
            include_ignored: flags.include_ignored,
            force: flags.force,
        };
        match self.call(&req) {
            Ok(Reply::Done) => Ok(()),
            Ok(Reply::Refused(e)) => Err(e.into()),
            Ok(other) => Err(self.accept_error(format!("{other:?}"))),
            Err(e) => Err(self.accept_error(e)),
        }
    }

    /// Accept the branch into the project (in the server), then drop it.
    pub fn accept(mut self, flags: AcceptFlags) -> Result<AcceptReport, AcceptError> {
        let req = Request::Accept {
            include_ignored: flags.include_ignored,
            force: flags.force,
            origin: crate::accept::history::origin(),
            reusable: self.reusable(),
        };
        let r = self.call(&req);
        self.done = true;
        match r {
            Ok(Reply::Accepted(r)) => Ok(r.into()),
            Ok(Reply::Refused(e)) => Err(e.into()),
            Ok(other) => Err(self.accept_error(format!("{other:?}"))),
            Err(e) => Err(self.accept_error(e)),
        }
    }
}

impl RemoteBranch {
    /// Let the branch's connection go while it is idle, keeping the branch in the server
    /// (`Request::Park`): afterwards this process holds no socket for it and the server no
    /// thread, and the mount point is a path that does not exist until
    /// [`RemoteBranch::resume`]. Refused, with the reason, while something refers into the
    /// mount (the branch stays attached and usable). The connection goes back to the
    /// server's pool only on this process's word that its commands left nothing in it
    /// ([`crate::commands_left_it_reusable`]), else it is torn down.
    pub fn park(&mut self) -> Result<(), String> {
        if self.token.is_some() {
            return Ok(());
        }
        let reusable = self.reusable();
        match self.call(&Request::Park { reusable }) {
            Ok(Reply::Parked { token }) => {
                *self
                    .conn
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
                self.token = Some(token);
                // Never the mount it had: that connection serves other branches now.
                self.mountpoint = self.state.join("servers/parked");
                Ok(())
            }
            Ok(Reply::Error(e)) => Err(e),
            Ok(other) => Err(format!("the branch server answered {other:?}")),
            Err(e) => Err(self.lost(e).to_string()),
        }
    }

    /// `req` (one that only reads the branch) for the parked branch, over a socket of its
    /// own closed after the answer: the branch stays parked.
    fn call_parked(&self, req: &Request) -> std::io::Result<Reply> {
        let Some(token) = self.token.clone() else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                "the branch's server connection is gone",
            ));
        };
        let stream = Paths::new(&self.project, &self.state).connect()?;
        let mut reader = BufReader::new(stream.try_clone()?);
        let mut writer = stream;
        let wrapped = Request::OnParked {
            token,
            request: Box::new(serde_json::from_value(serde_json::to_value(req)?)?),
        };
        exchange(&mut reader, &mut writer, &wrapped)
    }

    /// Whether the branch is parked ([`RemoteBranch::park`]).
    pub fn is_parked(&self) -> bool {
        self.token.is_some()
    }

    /// Attach a parked branch again (nothing to do when it is attached): a new socket to
    /// the same server (never a new server: only the one that parked it has it), which
    /// mounts it on a pooled connection or a new one; [`RemoteBranch::mountpoint`] is where.
    pub fn resume(&mut self) -> std::io::Result<()> {
        let Some(token) = self.token.clone() else {
            return Ok(());
        };
        let paths = Paths::new(&self.project, &self.state);
        let stream = paths.connect().map_err(|e| self.lost(e))?;
        stream.set_read_timeout(Some(CREATE_TIMEOUT))?;
        let reader = BufReader::new(stream.try_clone()?);
        *self
            .conn
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((reader, stream));
        let fail = |b: &RemoteBranch, e: std::io::Error| {
            *b.conn
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
            Err(b.lost(e))
        };
        match self.call(&Request::Resume { token }) {
            Ok(Reply::Created {
                mountpoint,
                outside_dir,
                reused,
                server_pid,
                dev,
            }) => {
                let mountpoint = wire::path(mountpoint);
                if server_pid != self.server_pid || !is_fuse_mount(&mountpoint, dev) {
                    // Dropped by the server as the socket closes (EOF without `Drop`).
                    return fail(
                        self,
                        std::io::Error::other(format!(
                            "{} is not its mount here",
                            mountpoint.display()
                        )),
                    );
                }
                self.untimed()?;
                self.mountpoint = mountpoint;
                self.outside_dir = wire::path(outside_dir);
                self.reused = reused;
                self.token = None;
                tracing::debug!(
                    server_pid,
                    reused_connection = reused,
                    mountpoint = %self.mountpoint.display(),
                    "parked branch resumed by the branch server"
                );
                Ok(())
            }
            Ok(Reply::Error(e)) => fail(self, std::io::Error::other(e)),
            Ok(other) => fail(self, std::io::Error::other(format!("{other:?}"))),
            Err(e) => fail(self, e),
        }
    }
}

impl Drop for RemoteBranch {
    fn drop(&mut self) {
        if let Some(token) = self.token.take() {
            // Parked: the server drops it when told (a server that is gone has lost it
            // already). Never a server started for this.
            let told = Paths::new(&self.project, &self.state)
                .connect()
                .and_then(|s| {
                    s.set_read_timeout(Some(CREATE_TIMEOUT))?;
                    let reader = BufReader::new(s.try_clone()?);
                    *self
                        .conn
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((reader, s));
                    self.call(&Request::Forget { token })
                });
            if let Err(e) = told {
                tracing::debug!("dropping the parked served branch: {e}");
            }
            return;
        }
        if !self.done {
            // The server answers at once and resets the connection after (a later branch
            // waits for that, so it finds the connection pooled).
            let reusable = self.reusable();
            if let Err(e) = self.call(&Request::Drop { reusable }) {
                tracing::debug!("dropping the served branch: {e}");
            }
        }
    }
}

/// Whether `mountpoint` is, in this mount namespace, a FUSE mount with device `dev`.
fn is_fuse_mount(mountpoint: &Path, dev: u64) -> bool {
    use std::os::unix::fs::MetadataExt;
    let fuse = nix::sys::statfs::statfs(mountpoint)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::FUSE_SUPER_MAGIC);
    fuse && std::fs::metadata(mountpoint).is_ok_and(|m| m.dev() == dev)
}

/// A connection to the project's server, started first if none answers.
fn connect_or_start(paths: &Paths, project: &Path, state: &Path) -> std::io::Result<UnixStream> {
    let connected = |r: std::io::Result<UnixStream>| match r {
        Ok(s) => Some(Ok(s)),
        // Another user's directory, socket or server: refused, and nothing started there.
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Some(Err(e)),
        Err(_) => None,
    };
    if let Some(r) = connected(paths.connect()) {
        return r;
    }
    paths.make_dir()?;
    // One starter at a time; a server ending for idleness takes the lock to remove its socket.
    let _lock = Lock::take(&paths.lock, true)?;
    if let Some(r) = connected(paths.connect()) {
        return r;
    }
    let ready = spawn_server(paths, project, state)?;
    // The server closes its end of `ready` once it listens, or dies with it open: either
    // way the pipe ends, and one connect says which.
    let mut fd = libc::pollfd {
        fd: ready.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll on one pollfd we own.
    unsafe { libc::poll(&mut fd, 1, 10_000) };
    paths.connect()
}

/// Start the server: shade's own binary, detached (setsid, reparented to init by a double
/// fork), stdin from /dev/null and its output to the log.
/// Returns the read end of a pipe whose other end the server holds until it listens.
fn spawn_server(paths: &Paths, project: &Path, state: &Path) -> std::io::Result<OwnedFd> {
    use std::os::unix::process::CommandExt;
    let exe = SERVER_EXE
        .get()
        .cloned()
        .ok_or_else(|| std::io::Error::other("no server executable"))?;
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors, which we own from here on.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both are fresh descriptors of ours.
    let (ready_r, ready_w) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let w = ready_w.as_raw_fd();
    let log = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&paths.log)?
    };
    let mut cmd = std::process::Command::new(exe);
    cmd.arg(SUBCOMMAND)
        .arg("--project")
        .arg(project)
        .arg("--state")
        .arg(state)
        .arg("--ready-fd")
        .arg(READY_FD.to_string())
        .current_dir("/")
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // SAFETY: only async-signal-safe calls between fork and exec (fork, _exit, setsid,
    // sigprocmask, close_range, fcntl, dup2).
    unsafe {
        cmd.pre_exec(move || {
            match libc::fork() {
                -1 => return Err(std::io::Error::last_os_error()),
                0 => {}
                _ => libc::_exit(0),
            }
            libc::setsid();
            // The client blocks termination signals around its branch: the server must not.
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            // Descriptors the client inherited (a caller's pipe) must not live on in the
            // server, or whoever waits for their end would wait for the server's.
            libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            );
            // The ready pipe's end, open across the exec.
            if w == READY_FD {
                libc::fcntl(w, libc::F_SETFD, 0);
            } else if libc::dup2(w, READY_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    child.wait()?;
    drop(ready_w);
    Ok(ready_r)
}

/// How long `shade run` waits for the server to hand it a branch before making one itself.
const CREATE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// Remove what servers killed without a chance to clean up left: sockets no server
/// listens on, with their lock and log. Live servers' files stay.
pub fn cleanup_stale(state: &Path) -> usize {
    let dir = state.join("servers");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return 0;
    };
    let mut n = 0;
    for e in entries.flatten() {
        let p = e.path();
        if p.extension().is_none_or(|x| x != "sock") {
            continue;
        }
        let Ok(_lock) = Lock::take(&p.with_extension("lock"), false) else {
            continue; // a server is starting or ending: its business
        };
        let refused = matches!(
            UnixStream::connect(&p),
            Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED)
        );
        if refused {
            let _ = std::fs::remove_file(&p);
            let _ = std::fs::remove_file(p.with_extension("log"));
            let _ = std::fs::remove_file(p.with_extension("lock"));
            n += 1;
        }
    }
    n
}

/// A branch for `shade run`: served by the branch server, or made in this process.
pub enum RunBranch {
    Local(Box<Branch>),
    Remote(RemoteBranch),
}

impl RunBranch {
    /// A branch of `project` from the server when it is on and answers, else in-process.
    /// `reuse`: whether its connection may serve a later branch.
    pub fn create(
        project: &Path,
        opts: &BranchOptions,
        reuse: bool,
    ) -> Result<RunBranch, crate::BranchError> {
        if enabled() {
            if let Some(b) = RemoteBranch::create(project, opts, reuse) {
                return Ok(RunBranch::Remote(b));
            }
        }
        Branch::create(project, opts).map(|b| RunBranch::Local(Box::new(b)))
    }

    /// Where the branch is mounted.
    pub fn mountpoint(&self) -> &Path {
        match self {
            RunBranch::Local(b) => b.mountpoint(),
            RunBranch::Remote(b) => b.mountpoint(),
        }
    }

    /// The project the branch is of.
    pub fn project(&self) -> &Path {
        match self {
            RunBranch::Local(b) => b.project(),
            RunBranch::Remote(b) => b.project(),
        }
    }

    /// Whether the branch server made it (its connection is the server's), and whether that
    /// connection served an earlier branch: `None` for an in-process branch.
    pub fn served_reused(&self) -> Option<bool> {
        match self {
            RunBranch::Local(_) => None,
            RunBranch::Remote(b) => Some(b.reused_connection()),
        }
    }

    /// Where the branch's outside layer lives.
    pub fn outside_dir(&self) -> PathBuf {
        match self {
            RunBranch::Local(b) => b.outside_dir(),
            RunBranch::Remote(b) => b.outside_dir(),
        }
    }

    /// The limits the branch reached, as lines to print.
    pub fn take_limit_hits(&self) -> Vec<String> {
        match self {
            RunBranch::Local(b) => b
                .take_limit_hits()
                .iter()
                .map(ToString::to_string)
                .collect(),
            RunBranch::Remote(b) => b.take_limit_hits(),
        }
    }

    /// What the branch changed.
    pub fn changeset(&self, include_ignored: bool) -> std::io::Result<Changeset> {
        match self {
            RunBranch::Local(b) => Ok(b.changeset(include_ignored)),
            RunBranch::Remote(b) => b.changeset(include_ignored),
        }
    }

    /// The unified diff of `changes`.
    pub fn diff(&self, changes: &Changeset) -> std::io::Result<String> {
        match self {
            RunBranch::Local(b) => Ok(b.diff(changes)),
            RunBranch::Remote(b) => b.diff(changes),
        }
    }

    /// Would an accept be refused now?
    pub fn check_accept(&self, flags: AcceptFlags) -> Result<(), AcceptError> {
        match self {
            RunBranch::Local(b) => b.check_accept(flags),
            RunBranch::Remote(b) => b.check_accept(flags),
        }
    }

    /// Accept the branch, then drop it.
    pub fn accept(self, flags: AcceptFlags) -> Result<AcceptReport, AcceptError> {
        match self {
            RunBranch::Local(b) => (*b).accept(flags),
            RunBranch::Remote(b) => b.accept(flags),
        }
    }
}

/// Mark the connection mounted at `mount` as never to serve another branch: for the branch
/// server, when a client parks a branch without its word that its commands left nothing in
/// it (`Request::Park`), so that `Branch::detach` tears the connection down.
pub fn taint_connection(mount: &Path, why: &str) {
    crate::pool::taint(mount, why);
}
