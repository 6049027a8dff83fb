//! A lint session's build directory at kernel speed: for each checker run, a kernel
//! overlayfs with the user's real `<project>/target` as its read-only lower layer and an
//! upper layer of the session's own (under the state dir) is mounted over `target/` in the
//! branch's mount, which the checker's namespace binds recursively over the project. The user's warm build still reads through and nothing reaches the
//! real directory, as with the branch itself, but rustc's incremental state (tens of MB
//! read and rewritten per check) no longer crosses FUSE, which was most of the warm lint's
//! cost over a native `cargo check`. Off as root, whose checkers run as an unprivileged
//! id the overlay's lower layer would not show root's files to (see `TargetOverlay::new`).
//! Where the overlay cannot be mounted (not root, an
//! upper directory on a file system overlayfs refuses, no `target/`), runs go through the
//! branch as before.
//!
//! The overlay is mounted for the run only, so the user's own builds never change the
//! lower layer under a mounted overlay; the upper layer persists between runs (the
//! session's warm state) and is removed with the session.

use super::exec::Runner;
use shade_fusefs::rootdir::RootDir;
use shade_fusefs::sandbox::{self, RunOutcome, RunSpec};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// The overlay of one session's `target/`.
pub struct TargetOverlay {
    /// The real build directory (the lower layer, and where the checker sees the overlay).
    target: PathBuf,
    /// `upper/` and `work/` live here.
    dir: PathBuf,
    /// Mounting failed once: run through the branch from then on.
    off: AtomicBool,
}

impl TargetOverlay {
    /// An overlay of `project`'s `target/` kept in `dir` (created; removed on drop), or
    /// `None` when there is no build directory to overlay or its path cannot be spelled
    /// as an overlayfs option.
    pub fn new(project: &Path, dir: PathBuf) -> Option<TargetOverlay> {
        // As root the checker is root of a namespace mapped to unprivileged ids (see
        // fusefs/src/sandbox/ids.rs): the real target/ as a lower layer shows it root's
        // files as nobody's. The branch shifts ids; the overlay cannot. Through the branch.
        if sandbox::branch_id_shift(&sandbox::Isolation::default()).is_some() {
            return None;
        }
        let target = project.join("target");
        let meta = std::fs::symlink_metadata(&target).ok()?;
        let plain = |p: &Path| !p.to_string_lossy().contains([',', ':', '\\']);
        if !meta.is_dir() || !plain(&target) || !plain(&dir) {
            return None;
        }
        Some(TargetOverlay {
            target,
            dir,
            off: AtomicBool::new(false),
        })
    }

    /// Mount the overlay over `target/` of the branch mounted at `branch`; unmounted when
    /// the guard goes.
    fn mount(&self, branch: &Path) -> std::io::Result<Mounted> {
        let (upper, work, mnt) = (
            self.dir.join("upper"),
            self.dir.join("work"),
            branch.join("target"),
        );
        for d in [&upper, &work] {
            std::fs::create_dir_all(d)?;
        }
        // The branch's `target` as a descriptor opened beneath the branch, not followed
        // if it is a link: a checker that ran before may have made it one to anywhere.
        let at = RootDir::open(branch)?.open_dir_path(Path::new("target"))?;
        let opts = format!(
            "lowerdir={},upperdir={},workdir={}",
            self.target.display(),
            upper.display(),
            work.display()
        );
        nix::mount::mount(
            Some("overlay"),
            &PathBuf::from(format!("/proc/self/fd/{}", at.as_raw_fd())),
            Some("overlay"),
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
            Some(opts.as_str()),
        )?;
        Ok(Mounted(mnt))
    }
}

/// A mounted overlay, detached when dropped.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        // Never through a link a command put in the overlay's place.
        let _ = nix::mount::umount2(
            &self.0,
            nix::mount::MntFlags::MNT_DETACH | nix::mount::MntFlags::UMOUNT_NOFOLLOW,
        );
    }
}

impl Runner for TargetOverlay {
    fn run(&self, spec: RunSpec) -> Result<RunOutcome, String> {
        let mounted = if self.off.load(Ordering::Relaxed) {
            None
        } else {
            match self.mount(&spec.mount) {
                Ok(m) => Some(m),
                Err(e) => {
                    tracing::debug!("lint: no overlay of {}: {e}", self.target.display());
                    self.off.store(true, Ordering::Relaxed);
                    None
                }
            }
        };
        let out = sandbox::run(&spec).map_err(|e| e.to_string());
        drop(mounted);
        out
    }
}

impl Drop for TargetOverlay {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
