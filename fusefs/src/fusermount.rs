//! The setuid `fusermount3` helper, for a user: fuser mounts through it when mount(2) is
//! refused; we unmount through it what a user cannot detach with umount2 (a stale branch).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The helper, if installed setuid root (anything else could not mount for us).
pub(crate) fn find() -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/bin")])
        .map(|d| d.join("fusermount3"))
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.uid() == 0 && m.mode() & libc::S_ISUID != 0))
}

/// Detach the FUSE mount at `mountpoint` through the helper (`fusermount3 -u -z`).
pub(crate) fn unmount(bin: &Path, mountpoint: &Path) {
    let _ = Command::new(bin)
        .args(["-u", "-z", "-q", "--"])
        .arg(mountpoint)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}
