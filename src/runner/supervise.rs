//! The parent side of a run: wait for the command while watching the clock and our
//! signals, stop its process group when asked, and sweep up what it leaves behind.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use anyhow::Context;

use super::procs::Members;
use super::{child, signals, RunOutcome, Running, Termination, GRACE};

/// Upper bound on how late we notice a signal (the handler cannot wake the poll).
const TICK: Duration = Duration::from_millis(50);

/// Waits for the command and everything it started to be gone.
pub(crate) fn wait(
    mut running: Running,
    timeout: Option<Duration>,
    namespaced: bool,
) -> anyhow::Result<RunOutcome> {
    let pid = i32::try_from(running.child.id()).context("child pid out of range")?;
    let mnt_ns = running
        .mnt_ns
        .as_ref()
        .and_then(|f| f.metadata().ok())
        .map(|m| m.ino());
    let members = Members { pgid: pid, mnt_ns };
    let pidfd = pidfd_open(pid);
    let deadline = timeout.map(|t| Instant::now() + t);

    let stop_reason = loop {
        if has_exited(pid).context("waiting for the command")? {
            child::restore_tty(running.tty_handed);
            // Reap only after the sweep: the zombie keeps its pid, and so the process
            // group id, from being reused by an unrelated process meanwhile.
            let signals_seen = signals::count();
            let seen = members.terminate(GRACE, || signals::count() > signals_seen);
            let status = running.child.wait().context("reaping the command")?;
            let leftovers_killed = seen.iter().filter(|&&p| p != pid).count();
            return Ok(RunOutcome {
                termination: natural(status),
                namespaced,
                leftovers_killed,
            });
        }
        if running.tty_handed && has_stopped(pid) {
            suspend_with(pid);
        }
        if let Some(sig) = signals::pending() {
            break Termination::Interrupted(sig);
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            break Termination::TimedOut;
        }
        let nap = deadline.map_or(TICK, |d| TICK.min(d - now));
        wait_exit(pidfd.as_ref(), nap);
    };

    // The signal that stopped us counts once; only a further one cuts the grace short.
    let signals_seen = signals::count();
    let seen = members.terminate(GRACE, || signals::count() > signals_seen);
    if running.child.try_wait().ok().flatten().is_none() {
        // It left its process group and has no namespace to find it by.
        let _ = running.child.kill();
    }
    running.child.wait().context("reaping the command")?;
    child::restore_tty(running.tty_handed);
    let leftovers_killed = seen.iter().filter(|&&p| p != pid).count();
    Ok(RunOutcome {
        termination: stop_reason,
        namespaced,
        leftovers_killed,
    })
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

/// Ctrl-Z stopped the command, which owns the terminal: stop ourselves too so the user's
/// shell gets its prompt back, and on `fg` hand the terminal back and continue the command.
fn suspend_with(pgid: i32) {
    child::restore_tty(true);
    // SAFETY: raise/killpg on our own job; we resume here when the shell continues us.
    unsafe { libc::raise(libc::SIGTSTP) };
    child::set_foreground(pgid);
    // SAFETY: as above.
    unsafe { libc::killpg(pgid, libc::SIGCONT) };
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

fn wait_exit(pidfd: Option<&OwnedFd>, nap: Duration) {
    match pidfd {
        Some(fd) => {
            let mut pfd = libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = libc::c_int::try_from(nap.as_millis())
                .unwrap_or(libc::c_int::MAX)
                .max(1);
            // SAFETY: poll(2) on one valid pollfd; EINTR just ends the nap early.
            unsafe { libc::poll(&mut pfd, 1, ms) };
        }
        None => std::thread::sleep(nap),
    }
}
