//! The parent side of a run: wait for the command while watching the clock and our
//! signals, stop its process group when asked, and sweep up what it leaves behind.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use super::procs::Members;
use super::{
    child, signals, Cancel, Captured, Result, RunOutcome, Running, SandboxError, Termination, GRACE,
};

/// Upper bound on how late a foreground run notices a signal (the handler cannot wake the
/// poll), and how often we look when no pidfd or eventfd is available.
const TICK: Duration = Duration::from_millis(50);

/// What may stop a run besides the command ending.
pub(crate) struct Control<'a> {
    pub timeout: Option<Duration>,
    /// Watch our signal handlers and the terminal (the CLI's foreground job).
    pub foreground: bool,
    pub cancel: Option<&'a Cancel>,
}

impl Control<'_> {
    fn cancelled(&self) -> bool {
        self.cancel.is_some_and(Cancel::is_cancelled)
    }

    /// During a stop's grace period: kill at once if the user insists (a further signal)
    /// or the run is cancelled.
    fn hurry(&self, signals_seen: usize) -> impl Fn() -> bool + '_ {
        move || self.cancelled() || (self.foreground && signals::count() > signals_seen)
    }
}

/// Waits for the command and everything it started to be gone.
pub(crate) fn wait(mut running: Running, ctl: &Control, namespaced: bool) -> Result<RunOutcome> {
    let pid = i32::try_from(running.child.id())
        .map_err(|_| SandboxError::Invalid("child pid out of range".into()))?;
    let mnt_ns = running
        .mnt_ns
        .as_ref()
        .and_then(|f| f.metadata().ok())
        .map(|m| m.ino());
    let pid_ns = running
        .status
        .as_ref()
        .and_then(|s| s.pid_ns.as_ref())
        .and_then(|f| f.metadata().ok())
        .map(|m| m.ino());
    let members = Members {
        pgid: pid,
        mnt_ns,
        pid_ns,
        monitor: running.status.as_ref().map(|_| pid),
    };
    let pidfd = pidfd_open(pid);
    let deadline = ctl.timeout.map(|t| Instant::now() + t);
    let wake = ctl.cancel.and_then(Cancel::wake_fd);

    let stop_reason = loop {
        if has_exited(pid).map_err(SandboxError::io("waiting for the command"))? {
            crate::timing::mark("exited");
            child::restore_tty(running.tty_handed.as_ref());
            // Reap only after the sweep: the zombie keeps its pid, and so the process
            // group id, from being reused by an unrelated process meanwhile.
            // Confined, the kernel is already killing what is left (bwrap's monitor has
            // exited, and its init with it): no grace to give, only the end to wait for.
            let grace = if running.status.is_some() {
                Duration::ZERO
            } else {
                GRACE
            };
            let leftovers_killed = members.terminate(grace, ctl.hurry(signals::count()));
            let status = running
                .child
                .wait()
                .map_err(SandboxError::io("reaping the command"))?;
            let termination = match running.status.as_mut() {
                Some(bwrap) => confined_end(status, bwrap.exit_code()),
                None => natural(status),
            };
            return Ok(finish(running, termination, namespaced, leftovers_killed));
        }
        if running.tty_handed.is_some() && has_stopped(pid) {
            suspend_with(pid);
        }
        if running.tty_handed.is_some() && running.status.is_some() {
            // Confined, the command owns the terminal in a group of its own (see
            // bwrap::foreground_helper), which stops without bwrap noticing.
            if let Some(group) = stopped_foreground(pid) {
                suspend_with(group);
            }
        }
        if ctl.foreground {
            if let Some(sig) = signals::pending() {
                break Termination::Interrupted(sig);
            }
        }
        if ctl.cancelled() {
            break Termination::Cancelled;
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            break Termination::TimedOut;
        }
        // Without a signal to watch and with both fds, we sleep until something happens.
        let tick = (ctl.foreground || pidfd.is_none() || (ctl.cancel.is_some() && wake.is_none()))
            .then_some(TICK);
        let nap = match (deadline, tick) {
            (Some(d), Some(t)) => Some(t.min(d - now)),
            (Some(d), None) => Some(d - now),
            (None, t) => t,
        };
        wait_exit(pidfd.as_ref().map(AsRawFd::as_raw_fd), wake, nap);
    };

    // The signal that stopped us counts once; only a further one cuts the grace short.
    let leftovers_killed = members.terminate(GRACE, ctl.hurry(signals::count()));
    if running.child.try_wait().ok().flatten().is_none() {
        // It left its process group and has no namespace to find it by.
        let _ = running.child.kill();
    }
    running
        .child
        .wait()
        .map_err(SandboxError::io("reaping the command"))?;
    child::restore_tty(running.tty_handed.as_ref());
    Ok(finish(running, stop_reason, namespaced, leftovers_killed))
}

fn finish(
    running: Running,
    termination: Termination,
    namespaced: bool,
    leftovers_killed: usize,
) -> RunOutcome {
    let (stdout, stderr): (Option<Captured>, Option<Captured>) = match running.capture {
        Some(readers) => {
            let (o, e) = readers.finish();
            (Some(o), Some(e))
        }
        None => (None, None),
    };
    RunOutcome {
        termination,
        namespaced,
        leftovers_killed,
        stdout,
        stderr,
        limits_hit: Vec::new(),
    }
}

/// True once the command has exited, without reaping it.
fn has_exited(pid: i32) -> std::io::Result<bool> {
    // SAFETY: waitid(2) into a zeroed siginfo; si_pid is valid to read after success.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
        if libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, flags) == -1 {
            let err = std::io::Error::last_os_error();
            return if err.kind() == std::io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(err)
            };
        }
        Ok(info.si_pid() != 0)
    }
}

/// True if the command has stopped (Ctrl-Z) since we last asked; consumes the event.
fn has_stopped(pid: i32) -> bool {
    // SAFETY: waitid(2) for stop events only (no WEXITED, so nothing is reaped).
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WSTOPPED | libc::WNOHANG,
        ) == 0
            && info.si_pid() != 0
    }
}

/// The terminal's foreground process group if it is a stopped one other than ours and
/// `monitor`'s.
fn stopped_foreground(monitor: i32) -> Option<i32> {
    // SAFETY: plain queries.
    let (fg, ours) = unsafe { (libc::tcgetpgrp(0), libc::getpgrp()) };
    if fg <= 0 || fg == ours || fg == monitor {
        return None;
    }
    let stat = std::fs::read_to_string(format!("/proc/{fg}/stat")).ok()?;
    let state = stat[stat.rfind(')')? + 1..]
        .split_ascii_whitespace()
        .next()?;
    (state == "T").then_some(fg)
}

/// Ctrl-Z stopped the command, which owns the terminal: stop ourselves too so the user's
/// shell gets its prompt back, and on `fg` hand the terminal back and continue the command.
fn suspend_with(pgid: i32) {
    child::take_back_foreground();
    // SAFETY: raise/killpg on our own job; we resume here when the shell continues us.
    unsafe { libc::raise(libc::SIGTSTP) };
    child::set_foreground(pgid);
    // SAFETY: as above.
    unsafe { libc::killpg(pgid, libc::SIGCONT) };
}

/// How a [`Termination::CannotExec`] of a sandbox that failed to set up begins.
pub(crate) const SETUP_FAILED: &str = "the sandbox (bubblewrap) could not start the command";

/// How a confined command ended: bwrap exits with the command's status, or 128+n when a
/// signal killed it (so a command's own `exit 130` reads as SIGINT too, as in shells); no
/// status at all means the command never ran, and bwrap said why on its stderr.
fn confined_end(bwrap: ExitStatus, code: Option<i32>) -> Termination {
    match code {
        Some(c) if (129..=128 + 64).contains(&c) => Termination::Signaled(c - 128),
        Some(c) => Termination::Exited(c),
        None => match bwrap.signal() {
            Some(sig) => Termination::Signaled(sig),
            None => Termination::CannotExec(format!(
                "{SETUP_FAILED} (bwrap exited with status {})",
                bwrap.code().unwrap_or(-1)
            )),
        },
    }
}

fn natural(status: ExitStatus) -> Termination {
    match (status.code(), status.signal()) {
        (Some(code), _) => Termination::Exited(code),
        (None, Some(sig)) => Termination::Signaled(sig),
        // Stopped/continued are not reported by wait without WUNTRACED.
        (None, None) => Termination::Exited(0),
    }
}

/// A pidfd becomes readable when the process exits, so we wake at once instead of polling.
fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open(2) returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = i32::try_from(fd).ok().filter(|&fd| fd >= 0)?;
    // SAFETY: we own the fd just returned.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Sleeps until the command exits, the cancel fd fires, or `nap` passes (`None`: no limit).
fn wait_exit(pidfd: Option<RawFd>, wake: Option<RawFd>, nap: Option<Duration>) {
    let mut fds: Vec<libc::pollfd> = [pidfd, wake]
        .into_iter()
        .flatten()
        .map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = nap.map_or(-1, |nap| {
        libc::c_int::try_from(nap.as_millis())
            .unwrap_or(libc::c_int::MAX)
            .max(1)
    });
    if fds.is_empty() {
        std::thread::sleep(nap.unwrap_or(TICK));
        return;
    }
    // SAFETY: poll(2) on valid pollfds; EINTR just ends the nap early.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
}
