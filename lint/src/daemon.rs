//! The warm checker daemon: one per project (and checker choice), holding a [`Session`]
//! (a long-lived branch with its build output and language servers) behind a unix socket
//! under the state dir. `shade lint` starts it on first use; it serves one request at a
//! time (replaying each caller's state in turn) and exits after an idle period.
//!
//! Protocol: one JSON [`Request`] line in, one JSON [`Response`] line out per connection.

use super::{Diagnostic, LintError, Session};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// One lint request.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Request {
    /// A unified diff (empty: the project as it is).
    #[serde(default)]
    pub patch: String,
    /// Time limit of the checkers, seconds.
    #[serde(default)]
    pub timeout_secs: Option<f64>,
    /// Ask the daemon to exit.
    #[serde(default)]
    pub stop: bool,
}

/// The answer: every diagnostic (new ones marked), or shade's error line.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Response {
    /// On success.
    pub diagnostics: Option<Vec<Diagnostic>>,
    /// On failure: one line.
    pub error: Option<String>,
}

/// The daemon's socket for `project` with checker choice `checker`:
/// `<state>/lint/<hash>.sock` (hashed to stay within the 108-byte socket path limit).
pub fn socket_path(state_root: &Path, project: &Path, checker: Option<&str>) -> PathBuf {
    let key = format!("{}\0{}", project.display(), checker.unwrap_or(""));
    let h = super::baseline::digest(key.as_bytes());
    state_root.join("lint").join(format!("{}.sock", &h[..16]))
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Serve the session `open` makes on `socket` until idle for `idle` (or told to stop, or
/// SIGTERM/SIGINT/SIGHUP). Returns at once, before opening anything, when another daemon
/// already serves this socket. For the daemon process only, which exits when it returns:
/// the daemon's lock is kept until then.
pub fn serve(
    socket: &Path,
    idle: Duration,
    open: impl FnOnce() -> Result<Session, LintError>,
) -> Result<(), LintError> {
    let io = |e: std::io::Error| LintError::Io(format!("lint daemon {}: {e}", socket.display()));
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    // One daemon per socket: the lock is held for the daemon's life.
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(socket.with_extension("lock"))
        .map_err(io)?;
    let Ok(held) = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusiveNonblock)
    else {
        return Ok(());
    };
    let mut session = open()?;
    let _ = std::fs::remove_file(socket);
    let listener = UnixListener::bind(socket).map_err(io)?;
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
    let mut last = Instant::now();
    let result = loop {
        if STOP.load(Ordering::SeqCst) || last.elapsed() >= idle {
            break Ok(());
        }
        let wait = idle
            .saturating_sub(last.elapsed())
            .min(Duration::from_secs(1));
        let mut fds = [nix::poll::PollFd::new(
            listener.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        let ms = u16::try_from(wait.as_millis()).unwrap_or(1000);
        match nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(ms)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => {}
            Err(e) => break Err(io(e.into())),
        }
        let Ok((stream, _)) = listener.accept() else {
            continue;
        };
        if handle(&mut session, stream) {
            break Ok(());
        }
        last = Instant::now();
    };
    let _ = std::fs::remove_file(socket);
    drop(session);
    // The lock goes with the process: `--stop` waits for it (see [`request`]), so a stop
    // returns once this process is gone, not while it is still on its way out.
    std::mem::forget(held);
    result
}

/// Answer one connection; true when asked to stop.
fn handle(session: &mut Session, stream: UnixStream) -> bool {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let mut line = String::new();
    if BufReader::new(&stream).read_line(&mut line).is_err() {
        return false;
    }
    let (resp, stop) = match serde_json::from_str::<Request>(&line) {
        Err(e) => (failure(format!("bad request: {e}")), false),
        Ok(r) if r.stop => (
            Response {
                diagnostics: Some(Vec::new()),
                error: None,
            },
            true,
        ),
        Ok(r) => {
            let deadline = r
                .timeout_secs
                .and_then(|s| Duration::try_from_secs_f64(s).ok())
                .map(|d| Instant::now() + d);
            match session.lint_patch(&r.patch, deadline) {
                Ok(d) => (
                    Response {
                        diagnostics: Some(d),
                        error: None,
                    },
                    false,
                ),
                Err(e) => (failure(e.to_string()), false),
            }
        }
    };
    let mut w = &stream;
    if let Ok(mut text) = serde_json::to_string(&resp) {
        text.push('\n');
        let _ = w.write_all(text.as_bytes());
    }
    stop
}

fn failure(error: String) -> Response {
    Response {
        diagnostics: None,
        error: Some(error),
    }
}

/// Send `req` to the daemon at `socket`, starting it with `start` when none answers. A stop
/// returns once the daemon is gone (its branch unmounted, its lock released), so a daemon
/// started right after it is not turned away by the one still on its way out.
pub fn request(
    socket: &Path,
    req: &Request,
    start: impl FnOnce() -> std::io::Result<()>,
) -> Result<Response, String> {
    let stream = match UnixStream::connect(socket) {
        Ok(s) => s,
        Err(_) if req.stop => {
            return Ok(Response {
                diagnostics: Some(Vec::new()),
                error: None,
            })
        }
        Err(_) => {
            start().map_err(|e| format!("cannot start the lint daemon: {e}"))?;
            connect_retrying(socket, Duration::from_secs(20))?
        }
    };
    let mut text = serde_json::to_string(req).map_err(|e| e.to_string())?;
    text.push('\n');
    (&stream)
        .write_all(text.as_bytes())
        .map_err(|e| format!("lint daemon: {e}"))?;
    let mut line = String::new();
    BufReader::new(&stream)
        .read_line(&mut line)
        .map_err(|e| format!("lint daemon: {e}"))?;
    if line.is_empty() {
        return Err("the lint daemon closed the connection without answering".into());
    }
    let resp =
        serde_json::from_str(&line).map_err(|e| format!("lint daemon answered badly: {e}"))?;
    if req.stop {
        wait_gone(socket, Duration::from_secs(30))?;
    }
    Ok(resp)
}

/// Wait until no daemon holds the lock of `socket`.
fn wait_gone(socket: &Path, within: Duration) -> Result<(), String> {
    let deadline = Instant::now() + within;
    let path = socket.with_extension("lock");
    loop {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| format!("lint daemon lock {}: {e}", path.display()))?;
        if nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).is_ok() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "the lint daemon at {} did not exit",
                socket.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn connect_retrying(socket: &Path, within: Duration) -> Result<UnixStream, String> {
    let deadline = Instant::now() + within;
    loop {
        match UnixStream::connect(socket) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= deadline => {
                return Err(format!(
                    "the lint daemon did not come up at {}: {e}",
                    socket.display()
                ))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}
