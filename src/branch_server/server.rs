//! The server's side: listen, check each peer is this user, serve each client's branch in a
//! thread of its own, and exit when idle.

use clap::Args;
use shade_fusefs::served::wire::{self, Reply, Request};
use shade_fusefs::served::{Lock, Paths};
use shade_fusefs::{AcceptFlags, Branch, BranchLimits, BranchOptions, IdShift, StateDir};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The hidden `__branch-server` subcommand's arguments (`shade run` passes them).
#[derive(Args, Debug)]
pub struct ServerArgs {
    /// The project (canonical) whose branches it serves.
    #[arg(long)]
    project: PathBuf,
    /// shade's state directory.
    #[arg(long)]
    state: PathBuf,
    /// A descriptor to close once listening (the starting client waits for its end).
    #[arg(long)]
    ready_fd: Option<i32>,
}

/// Idle connections kept per project in the server unless `SHADE_BRANCH_POOL` says.
const POOL: usize = 2;

/// Accepts of all clients one at a time: the history's origin is process-wide.
static ACCEPTING: Mutex<()> = Mutex::new(());

fn idle_limit() -> Duration {
    let secs: f64 = std::env::var("SHADE_BRANCH_SERVER_IDLE")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|s: &f64| s.is_finite() && *s >= 0.0)
        .unwrap_or(60.0);
    Duration::from_secs_f64(secs)
}

/// Run the server until it has been idle long enough; returns the exit code.
pub fn main(args: ServerArgs) -> i32 {
    match serve(&args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("shade branch server: {e}");
            crate::exit::SHADE_ERROR
        }
    }
}

fn serve(args: &ServerArgs) -> std::io::Result<()> {
    let project = std::fs::canonicalize(&args.project)?;
    let state = StateDir::at(args.state.clone());
    if std::env::var_os("SHADE_BRANCH_POOL").is_none() {
        shade_fusefs::set_pool_size(POOL);
    }
    let idle = idle_limit();
    // Connections wait in the pool as long as the server waits for a client.
    shade_fusefs::set_pool_idle(idle.max(Duration::from_secs(1)));
    let paths = Paths::new(&project, state.root());
    paths.make_dir()?;
    let _ = std::fs::remove_file(&paths.socket);
    let listener = UnixListener::bind(&paths.socket)?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&paths.socket, std::fs::Permissions::from_mode(0o600))?;
    }
    listener.set_nonblocking(true)?;
    if let Some(fd) = args.ready_fd.filter(|fd| *fd > 2) {
        // SAFETY: the descriptor the client passed for this, not used otherwise.
        unsafe { libc::close(fd) };
    }
    tracing::info!(
        pid = std::process::id(),
        project = %project.display(),
        socket = %paths.socket.display(),
        "branch server listening"
    );
    let bound = socket_inode(&paths.socket);
    let clients = Arc::new(AtomicUsize::new(0));
    let mut idle_since = Some(Instant::now());
    let ctx = Arc::new(Ctx {
        project,
        state,
        dropping: Mutex::new(0),
        dropped: Condvar::new(),
        parked: Mutex::default(),
    });
    loop {
        accept_pending(&listener, &clients, &ctx);
        ctx.forget_orphans();
        // Its socket removed or replaced (the state directory deleted, a test cleaning up), or
        // its project gone: no client can reach it or use it any more, so it goes as soon
        // as its clients have.
        let gone = socket_inode(&paths.socket) != bound || !ctx.project.is_dir();
        if gone && clients.load(Ordering::SeqCst) == 0 {
            drop(std::mem::take(&mut *ctx.parked()));
            let n = shade_fusefs::drain_branch_pool();
            tracing::info!("socket or project gone: exiting ({n} pooled connections unmounted)");
            return Ok(());
        }
        // A parked branch is a client's, idle: the server is not.
        if clients.load(Ordering::SeqCst) > 0 || !ctx.parked().is_empty() {
            idle_since = None;
        } else if let Some(t) = idle_since {
            if t.elapsed() >= idle {
                // Under the starters' lock: nobody starts a server or connects to ours while
                // the socket goes. A client that connected just before is still served.
                let lock = Lock::take(&paths.lock, true)?;
                accept_pending(&listener, &clients, &ctx);
                if clients.load(Ordering::SeqCst) == 0 && ctx.parked().is_empty() {
                    let _ = std::fs::remove_file(&paths.socket);
                    drop(lock);
                    let _ = std::fs::remove_file(&paths.log);
                    let n = shade_fusefs::drain_branch_pool();
                    tracing::info!("idle for {idle:?}: exiting ({n} pooled connections unmounted)");
                    return Ok(());
                }
            }
        } else {
            idle_since = Some(Instant::now());
        }
        wait_readable(&listener, Duration::from_millis(200));
    }
}

/// The inode of the socket file, `None` when it is gone.
fn socket_inode(p: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(p).ok().map(|m| m.ino())
}

/// Wait until a client connects or `timeout` passes.
fn wait_readable(listener: &UnixListener, timeout: Duration) {
    let mut fd = libc::pollfd {
        fd: listener.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: poll on one pollfd we own.
    unsafe { libc::poll(&mut fd, 1, ms) };
}

/// What every client thread needs.
struct Ctx {
    project: PathBuf,
    state: StateDir,
    /// Branches dropped by their clients and still being reset (after the client was
    /// answered): a new branch waits for them, so it finds their connections pooled.
    dropping: Mutex<usize>,
    dropped: Condvar,
    /// Branches their clients parked while idle (`Request::Park`), by token: detached, so
    /// they hold no connection, descriptor or thread; each dropped when its client process
    /// is gone.
    parked: Mutex<std::collections::HashMap<String, Parked>>,
}

/// A parked branch and the process that parked it.
struct Parked {
    branch: Branch,
    owner: Owner,
}

/// A process, told from a later one with its pid: (pid, start time in clock ticks).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct Owner(i32, u64);

impl Owner {
    /// The process at the other end of `stream`, if it can be named from here.
    fn of(stream: &UnixStream) -> Option<Owner> {
        let cred = shade_fusefs::served::peer_cred(stream).ok()?;
        // pid 0: a process of a pid namespace this server cannot see.
        if cred.pid <= 0 {
            return None;
        }
        Some(Owner(cred.pid, start_time(cred.pid)?))
    }

    /// Whether the process still runs (the same one: its pid not reused; a zombie, dead
    /// and not yet reaped, does not).
    fn alive(self) -> bool {
        stat(self.0).is_some_and(|(state, start)| start == self.1 && !matches!(state, 'Z' | 'X'))
    }
}

/// The start time of process `pid` (`/proc/PID/stat`, field 22).
fn start_time(pid: i32) -> Option<u64> {
    stat(pid).map(|(_, start)| start)
}

/// The state letter and start time of process `pid` (`/proc/PID/stat`, fields 3 and 22).
fn stat(pid: i32) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    Some((state, fields.nth(18)?.parse().ok()?))
}

/// A secret naming a parked branch: 128 random bits, hex.
fn token() -> std::io::Result<String> {
    let mut b = [0u8; 16];
    // SAFETY: getrandom fills the buffer we pass, of the length we pass.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if usize::try_from(n).ok() != Some(b.len()) {
        return Err(std::io::Error::other("getrandom gave too few bytes"));
    }
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// How long a new branch waits for dropped ones to be reset into the pool before it
/// takes a fresh connection.
const DROP_WAIT: Duration = Duration::from_secs(2);

impl Ctx {
    fn parked(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Parked>> {
        self.parked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Drop the parked branches whose client processes are gone (killed, or ended without
    /// forgetting them): nobody can resume them.
    fn forget_orphans(&self) {
        let mut parked = self.parked();
        if parked.is_empty() {
            return;
        }
        let mut alive: std::collections::HashMap<Owner, bool> = Default::default();
        let before = parked.len();
        parked.retain(|_, p| *alive.entry(p.owner).or_insert_with(|| p.owner.alive()));
        if parked.len() < before {
            tracing::info!(
                "dropped {} parked branches of ended clients",
                before - parked.len()
            );
        }
    }

    fn dropping(&self) -> std::sync::MutexGuard<'_, usize> {
        self.dropping
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Wait (at most [`DROP_WAIT`]) until no dropped branch is being reset.
    fn wait_for_drops(&self) {
        let g = self.dropping();
        let (_g, _) = self
            .dropped
            .wait_timeout_while(g, DROP_WAIT, |n| *n > 0)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
    }

    /// Drop `b` (reset into the pool, or unmounted) and say so to waiting creators.
    fn finish_drop(&self, b: Branch) {
        drop(b);
        let mut n = self.dropping();
        *n = n.saturating_sub(1);
        self.dropped.notify_all();
    }
}

/// Take every client waiting to connect, each into a thread of its own.
fn accept_pending(listener: &UnixListener, clients: &Arc<AtomicUsize>, ctx: &Arc<Ctx>) {
    loop {
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(e) => {
                tracing::warn!("accepting a client: {e}");
                return;
            }
        };
        if let Err(e) = check_peer(&stream) {
            tracing::warn!("refused a client: {e}");
            continue;
        }
        if stream.set_nonblocking(false).is_err() {
            continue;
        }
        clients.fetch_add(1, Ordering::SeqCst);
        let (c, ctx) = (clients.clone(), ctx.clone());
        let spawned = std::thread::Builder::new()
            .name("shade-client".into())
            .spawn(move || {
                client(stream, &ctx);
                c.fetch_sub(1, Ordering::SeqCst);
            });
        if let Err(e) = spawned {
            tracing::warn!("client thread: {e}");
            clients.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Only this user's processes may ask for branches (SO_PEERCRED; the socket's directory is
/// 0700 too).
fn check_peer(stream: &UnixStream) -> std::io::Result<()> {
    let uid = shade_fusefs::served::peer_uid(stream)?;
    if uid != shade_fusefs::served::euid() {
        return Err(std::io::Error::other(format!(
            "peer is uid {uid}, not {}",
            shade_fusefs::served::euid()
        )));
    }
    Ok(())
}

/// Serve one client: its branch, until it drops it, accepts it, or goes away.
fn client(stream: UnixStream, ctx: &Ctx) {
    let Ok(read) = stream.try_clone() else { return };
    let mut reader = BufReader::new(read);
    let owner = Owner::of(&stream);
    let mut writer = stream;
    let mut branch: Option<Branch> = None;
    // A branch its client dropped: reset after the answer (the client's result is printed
    // meanwhile), still in this thread, which the server waits for before it exits.
    let mut later: Option<Branch> = None;
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let (reply, end) = match serde_json::from_str::<Request>(&line) {
            Ok(req) => answer(req, &mut branch, &mut later, ctx, owner),
            Err(e) => (Reply::Error(format!("bad request: {e}")), true),
        };
        let mut out = match serde_json::to_vec(&reply) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!("encoding a reply: {e}");
                break;
            }
        };
        out.push(b'\n');
        let written = writer.write_all(&out);
        if let Some(b) = later.take() {
            drop(writer);
            drop(reader);
            ctx.finish_drop(b);
            break;
        }
        if written.is_err() || end {
            break;
        }
    }
    if let Some(b) = branch {
        // Gone without dropping it (killed): nothing of the branch may reach a later one
        // through a process of its command that outlived the client, so the connection is
        // aborted rather than pooled.
        tracing::info!("a client left without dropping its branch: aborting it");
        abort(b.mountpoint());
        drop(b);
    }
}

/// Answer one request; `true` with it when the conversation is over. A dropped branch is
/// left in `later`, counted in `ctx.dropping`, for the caller to drop once answered.
fn answer(
    req: Request,
    branch: &mut Option<Branch>,
    later: &mut Option<Branch>,
    ctx: &Ctx,
    owner: Option<Owner>,
) -> (Reply, bool) {
    let flags = |include_ignored, force| AcceptFlags {
        include_ignored,
        force,
    };
    let req = match branch.as_ref() {
        Some(b) => match read_only(req, b) {
            Ok(reply) => return (reply, false),
            Err(req) => req,
        },
        None => req,
    };
    match (req, branch.as_ref()) {
        (
            Request::Create {
                project,
                id_shift,
                size,
                metadata,
                memory_budget,
                hide_credentials,
                also_hide,
            },
            None,
        ) => {
            let project = wire::path(project);
            if std::fs::canonicalize(&project).ok().as_deref() != Some(ctx.project.as_path()) {
                return (
                    Reply::Error(format!(
                        "this server serves {}, not {}",
                        ctx.project.display(),
                        project.display()
                    )),
                    true,
                );
            }
            ctx.wait_for_drops();
            let opts = BranchOptions {
                state: ctx.state.clone(),
                memory_budget,
                limits: BranchLimits { size, metadata },
                id_shift: id_shift.map(|base| IdShift { base }),
                hide_credentials,
                also_hide: also_hide.into_iter().map(wire::path).collect(),
                ..BranchOptions::default()
            };
            match Branch::create(&ctx.project, &opts) {
                Ok(b) => {
                    use std::os::unix::fs::MetadataExt;
                    let dev = std::fs::metadata(b.mountpoint()).map_or(0, |m| m.dev());
                    let reply = Reply::Created {
                        dev,
                        mountpoint: wire::bytes(b.mountpoint()),
                        outside_dir: wire::bytes(&b.outside_dir()),
                        reused: b.reused_connection(),
                        server_pid: std::process::id(),
                    };
                    tracing::info!(
                        branch = b.id(),
                        reused = b.reused_connection(),
                        "served a branch"
                    );
                    *branch = Some(b);
                    (reply, false)
                }
                Err(e) => (Reply::Error(e.to_string()), true),
            }
        }
        (
            Request::Create { .. }
            | Request::Resume { .. }
            | Request::Forget { .. }
            | Request::OnParked { .. },
            Some(_),
        ) => (Reply::Error("one branch per client".into()), true),
        (Request::Resume { token }, None) => {
            let Some(mut p) = ctx.parked().remove(&token) else {
                return (Reply::Error("no such parked branch".into()), true);
            };
            if let Err(e) = p.branch.attach() {
                ctx.parked().insert(token, p);
                return (Reply::Error(format!("attaching the branch: {e}")), true);
            }
            let b = p.branch;
            use std::os::unix::fs::MetadataExt;
            let dev = std::fs::metadata(b.mountpoint()).map_or(0, |m| m.dev());
            let reply = Reply::Created {
                dev,
                mountpoint: wire::bytes(b.mountpoint()),
                outside_dir: wire::bytes(&b.outside_dir()),
                reused: b.reused_connection(),
                server_pid: std::process::id(),
            };
            tracing::info!(branch = b.id(), "resumed a parked branch");
            *branch = Some(b);
            (reply, false)
        }
        (Request::OnParked { token, request }, None) => {
            // Out of the table while it is read: other clients' parks and resumes go on.
            let Some(p) = ctx.parked().remove(&token) else {
                return (Reply::Error("no such parked branch".into()), true);
            };
            let reply = read_only(*request, &p.branch).unwrap_or_else(|other| {
                Reply::Error(format!("not for a parked branch: {other:?}"))
            });
            ctx.parked().insert(token, p);
            (reply, true)
        }
        (Request::Forget { token }, None) => {
            let gone = ctx.parked().remove(&token);
            if let Some(p) = &gone {
                tracing::info!(branch = p.branch.id(), "dropped a parked branch");
            }
            drop(gone);
            (Reply::Done, true)
        }
        (_, None) => (Reply::Error("no branch".into()), true),
        // Answered by `read_only` above.
        (
            Request::LimitsHit
            | Request::LimitHits
            | Request::Changeset { .. }
            | Request::Diff { .. }
            | Request::CheckAccept { .. },
            Some(_),
        ) => (
            Reply::Error("a read-only request was not answered".into()),
            false,
        ),
        (
            Request::Accept {
                include_ignored,
                force,
                origin,
                reusable,
            },
            Some(_),
        ) => {
            let Some(b) = branch.take() else {
                return (Reply::Error("no branch".into()), true);
            };
            if !reusable {
                tracing::info!("the client did not call its branch reusable: aborting it");
                abort(b.mountpoint());
            }
            let _one = ACCEPTING
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            shade_fusefs::accept::history::set_origin(origin);
            let r = match b.accept(flags(include_ignored, force)) {
                Ok(r) => Reply::Accepted((&r).into()),
                Err(e) => Reply::Refused((&e).into()),
            };
            (r, true)
        }
        (Request::Park { reusable }, Some(_)) => {
            let Some(owner) = owner else {
                // Nobody could tell when its client is gone: it would never be dropped.
                return (
                    Reply::Error("the client's process cannot be named from the server".into()),
                    false,
                );
            };
            let Some(mut b) = branch.take() else {
                return (Reply::Error("no branch".into()), true);
            };
            if !reusable {
                tracing::info!("the client did not call its branch reusable: not pooling it");
                shade_fusefs::served::taint_connection(
                    b.mountpoint(),
                    "the client did not call it reusable",
                );
            }
            if let Err(why) = b.detach() {
                *branch = Some(b);
                return (
                    Reply::Error(format!("the branch stays attached: {why}")),
                    false,
                );
            }
            let token = match token() {
                Ok(t) => t,
                Err(e) => {
                    // Detached already: the client can do nothing with it; dropped.
                    return (Reply::Error(e.to_string()), true);
                }
            };
            tracing::info!(branch = b.id(), "parked a branch");
            ctx.parked()
                .insert(token.clone(), Parked { branch: b, owner });
            (Reply::Parked { token }, true)
        }
        (Request::Drop { reusable }, Some(_)) => {
            if let Some(b) = branch.take() {
                if !reusable {
                    tracing::info!("the client did not call its branch reusable: aborting it");
                    abort(b.mountpoint());
                }
                // Counted before the answer: a creator that comes after it waits for it.
                *ctx.dropping() += 1;
                *later = Some(b);
            }
            (Reply::Done, true)
        }
    }
}

/// Abort the FUSE connection mounted at `mountpoint` (fusectl) and detach the mount: every
/// process still using it gets errors from now on, and it is never pooled (the pool takes
/// only a connection still mounted where it was; an aborted one may still answer `stat`
/// from cached attributes, a detached one does not).
fn abort(mountpoint: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(mountpoint) else {
        return;
    };
    if libc::major(meta.dev()) != 0 {
        return;
    }
    let ctl = format!("/sys/fs/fuse/connections/{}/abort", libc::minor(meta.dev()));
    if let Err(e) = std::fs::write(&ctl, b"1") {
        tracing::debug!("aborting {}: {ctl}: {e}", mountpoint.display());
    }
    if nix::mount::umount2(mountpoint, nix::mount::MntFlags::MNT_DETACH).is_ok() {
        return;
    }
    // A user's mount is detached through the setuid helper.
    for helper in ["fusermount3", "fusermount"] {
        let done = std::process::Command::new(helper)
            .args(["-u", "-z", "--"])
            .arg(mountpoint)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
        if done.is_ok_and(|s| s.success()) {
            return;
        }
    }
    tracing::warn!(
        "could not detach the aborted branch at {}",
        mountpoint.display()
    );
}

/// The answer to a request that only reads branch `b` (limits, changes, diff, the accept
/// check), or the request back when it is another kind. Served for an attached branch and
/// for a parked one (`Request::OnParked`: `shade mcp` lists a branch's changes while it is
/// idle).
fn read_only(req: Request, b: &Branch) -> Result<Reply, Request> {
    Ok(match req {
        Request::LimitsHit => Reply::Hits(
            b.take_limit_hits()
                .iter()
                .filter_map(wire::WireHit::of)
                .collect(),
        ),
        Request::LimitHits => Reply::Lines(
            b.take_limit_hits()
                .iter()
                .map(ToString::to_string)
                .collect(),
        ),
        Request::Changeset { include_ignored } => Reply::Changes(
            b.changeset(include_ignored)
                .changes
                .iter()
                .map(Into::into)
                .collect(),
        ),
        Request::Diff { changes } => {
            let changes = shade_fusefs::Changeset {
                changes: changes
                    .into_iter()
                    .filter_map(wire::WireChange::change)
                    .collect(),
            };
            Reply::Text(b.diff(&changes))
        }
        Request::CheckAccept {
            include_ignored,
            force,
        } => match b.check_accept(AcceptFlags {
            include_ignored,
            force,
        }) {
            Ok(()) => Reply::Done,
            Err(e) => Reply::Refused((&e).into()),
        },
        other => return Err(other),
    })
}
