//! A command's namespaces ended off its critical path. shade holds the sandbox's user and
//! mount namespaces past the command's end (to look at its /tmp and /dev/shm, see
//! `limits::full_tmpfs`); closing the last reference tears down every mount in them, and
//! overlayfs waits for an RCU grace period per overlay as it lets go of its layers: with 60
//! overlays (a plain user's `/` rebuilt around 60 snap mounts) that took 70–130 ms on a
//! loaded machine, all before the result was reported.
//!
//! The namespaces are handed instead to a short-lived child (`true`, with them as its stdin
//! and stdout), whose exit ends them while shade reports. Nothing of it was ever mounted on
//! the host (the mounts are the command's namespaces' own), and the child ends by itself,
//! even when shade is gone. The next command waits until every earlier teardown is done
//! (bounded, see [`settle`]), so a unit's upper directory is never in two overlays at once.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Condvar, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// Teardowns under way in this process: their count, and the signal that one ended.
static PENDING: (Mutex<usize>, Condvar) = (Mutex::new(0), Condvar::new());

/// The program that holds the namespaces until it exits: one that does nothing at all.
fn holder() -> Option<&'static Path> {
    static TRUE: OnceLock<Option<PathBuf>> = OnceLock::new();
    TRUE.get_or_init(|| {
        ["/usr/bin/true", "/bin/true"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
    })
    .as_deref()
}

fn finished() {
    let (count, cv) = &PENDING;
    let mut n = count.lock().unwrap_or_else(PoisonError::into_inner);
    *n = n.saturating_sub(1);
    cv.notify_all();
}

/// Ends the command's held namespaces (user, mount) in the background: a child holds them
/// and ends them as it exits; a thread reaps it. Where no child can be started they are
/// closed here, as before.
pub(crate) fn release(ns: (File, File)) {
    let Some(prog) = holder() else {
        drop(ns);
        return;
    };
    let (user, mnt) = ns;
    let spawned = Command::new(prog)
        .env_clear()
        // Pins no directory of the caller's (a branch, the project).
        .current_dir("/")
        .stdin(Stdio::from(user))
        .stdout(Stdio::from(mnt))
        .stderr(Stdio::null())
        .spawn();
    // Failing to start, the namespaces were closed with the command: ended already.
    let Ok(mut child) = spawned else { return };
    *PENDING.0.lock().unwrap_or_else(PoisonError::into_inner) += 1;
    let reaper = std::thread::Builder::new()
        .name("shade-teardown".into())
        .spawn(move || {
            let _ = child.wait();
            finished();
        });
    if reaper.is_err() {
        // The child ends by itself (reaped when shade exits); nothing to wait for.
        finished();
    }
}

/// Waits until every teardown this process started has ended, at most `limit`; whether
/// they all did.
pub(crate) fn settle(limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    let (count, cv) = &PENDING;
    let mut n = count.lock().unwrap_or_else(PoisonError::into_inner);
    while *n > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        n = cv
            .wait_timeout(n, left)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
    true
}

#[cfg(test)]
mod unit_tests {
    use super::*;

    /// A namespace handed off is ended by the child, and `settle` sees it.
    #[test]
    fn a_released_namespace_is_ended_and_settled() {
        let user = File::open("/proc/self/ns/user").expect("own user namespace");
        let mnt = File::open("/proc/self/ns/mnt").expect("own mount namespace");
        release((user, mnt));
        assert!(settle(Duration::from_secs(30)), "the teardown never ended");
    }
}
