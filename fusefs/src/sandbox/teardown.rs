//! A command's namespaces ended off its critical path. shade holds the sandbox's user and
//! mount namespaces past the command's end (to look at its /tmp and /dev/shm, see
//! `limits::full_tmpfs`); closing the last reference tears down every mount in them, and
//! overlayfs waits for an RCU grace period per overlay as it lets go of its layers: with 60
//! overlays (a plain user's `/` rebuilt around 60 snap mounts) that took 70–130 ms on a
//! loaded machine, all before the result was reported.
//!
//! The mount namespace is handed instead to a short-lived child (`cat`, with it as its
//! stdout), whose exit ends it while shade reports. The child's stdin is a pipe shade closes
//! only once its own copies of the namespace are closed: a child that exited first would
//! leave the last close (and the teardown) to shade again. Its user namespace is closed
//! here (the mount namespace holds it, and closing it ends no mount). Nothing of it was
//! ever mounted on the host (the mounts are the command's namespaces' own), and the child
//! ends by itself, even when shade is gone (its stdin's writer then closes). Its stderr is
//! the outside layer's teardown lock (`outside/.teardown`, locked shared until the child
//! has exited): the layer's next command, in this process or another, waits for it
//! (bounded, see [`settle`]) so that a unit's upper directory is never in two overlays at
//! once.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The teardown lock's name in the outside directory.
const LOCK: &str = ".teardown";

/// The program that holds the namespace until its stdin ends: one that reads it, writes
/// what it read (nothing) and exits.
fn holder() -> Option<&'static Path> {
    static CAT: OnceLock<Option<PathBuf>> = OnceLock::new();
    CAT.get_or_init(|| {
        ["/usr/bin/cat", "/bin/cat"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
    })
    .as_deref()
}

/// `outside`'s teardown lock, opened (made if missing).
fn open_lock(outside: &Path) -> Option<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(outside.join(LOCK))
        .ok()
}

/// Ends the command's held namespaces (user, mount) in the background: a child holds the
/// mount namespace and ends it as it exits, holding `outside`'s teardown lock till then; a
/// thread reaps it. Where no child can be started they are closed here, as before.
pub(crate) fn release(ns: (File, File), outside: Option<&Path>) {
    let (user, mnt) = ns;
    drop(user);
    let Some(prog) = holder() else {
        drop(mnt);
        return;
    };
    let Ok((stdin, go)) = std::io::pipe() else {
        drop(mnt);
        return;
    };
    // Shared: the lock is the open file's, and goes with the child's copy of it.
    let lock = outside.and_then(open_lock).filter(|f| {
        // SAFETY: flock(2) on an fd we own.
        unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH) == 0 }
    });
    let mut cmd = Command::new(prog);
    cmd.env_clear()
        // Pins no directory of the caller's (a branch, the project).
        .current_dir("/")
        .stdin(Stdio::from(stdin))
        .stdout(Stdio::from(mnt))
        .stderr(lock.map_or_else(Stdio::null, Stdio::from));
    let spawned = cmd.spawn();
    // Our copies of the namespace (and of the lock) are closed first, then the child is
    // let go: its exit is the last close. Failing to start, the namespace was closed with
    // the command, here.
    drop(cmd);
    drop(go);
    let Ok(mut child) = spawned else { return };
    let reaper = std::thread::Builder::new()
        .name("shade-teardown".into())
        .spawn(move || {
            let _ = child.wait();
        });
    // Without a reaper the child ends by itself, reaped when shade exits.
    drop(reaper);
}

/// Waits until every teardown of `outside`'s earlier commands has ended, at most `limit`;
/// whether they all did (or there is no lock to wait on).
pub(crate) fn settle(outside: &Path, limit: Duration) -> bool {
    let Some(lock) = open_lock(outside) else {
        return true;
    };
    let deadline = Instant::now() + limit;
    loop {
        // SAFETY: flock(2) on an fd we own; released as it closes.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod unit_tests {
    use super::*;

    /// A namespace handed off is ended by the child, which holds the layer's teardown lock
    /// until then; `settle` waits for it.
    #[test]
    fn a_released_namespace_is_ended_and_settled() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let user = File::open("/proc/self/ns/user").expect("own user namespace");
        let mnt = File::open("/proc/self/ns/mnt").expect("own mount namespace");
        release((user, mnt), Some(dir.path()));
        assert!(
            settle(dir.path(), Duration::from_secs(30)),
            "the teardown never ended"
        );
        // A held lock is waited on, boundedly.
        let held = open_lock(dir.path()).expect("the lock");
        // SAFETY: flock(2) on an fd we own.
        assert_eq!(unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_SH) }, 0);
        assert!(!settle(dir.path(), Duration::from_millis(50)));
        drop(held);
        assert!(settle(dir.path(), Duration::from_secs(30)));
    }
}
