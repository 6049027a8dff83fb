//! Mount bookkeeping: the benchmark's own tmpfs, and unmounting everything it left under
//! its root — on success, on error, on Ctrl-C, and for runs that died earlier.

use anyhow::{bail, Context, Result};
use nix::mount::{MntFlags, MsFlags};
use std::path::{Path, PathBuf};

/// Where every benchmark run keeps its files: `/var/tmp/shade-bench/<pid>/`.
pub const BASE: &str = "/var/tmp/shade-bench";

/// Mount a fresh tmpfs at `dir` (ext4 here has discard stalls that make timings noise).
pub fn mount_tmpfs(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    nix::mount::mount(
        Some("shade-bench"),
        dir,
        Some("tmpfs"),
        MsFlags::empty(),
        Some("size=16g,mode=0755"),
    )
    .with_context(|| format!("mounting tmpfs at {}", dir.display()))
}

/// Mount points at or below `prefix`, deepest first (so children unmount before parents).
pub fn mounts_under(prefix: &Path) -> Result<Vec<PathBuf>> {
    let text = std::fs::read_to_string("/proc/mounts").context("reading /proc/mounts")?;
    let mut out: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(1))
        .map(unescape)
        .map(PathBuf::from)
        .filter(|p| p.starts_with(prefix))
        .collect();
    out.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    out.dedup();
    Ok(out)
}

/// /proc/mounts escapes space, tab, newline and backslash as `\ooo` octal.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Unmount everything at or below `prefix`: a plain unmount first (so a FUSE daemon like
/// fuse-overlayfs sees its mount go away and exits), a lazy detach if that fails.
pub fn unmount_all(prefix: &Path) -> Result<()> {
    // Stacked mounts (overlay on tmpfs) can need more than one pass.
    for _ in 0..3 {
        let list = mounts_under(prefix)?;
        if list.is_empty() {
            return Ok(());
        }
        for m in list {
            if nix::mount::umount2(&m, MntFlags::empty()).is_err() {
                let _ = nix::mount::umount2(&m, MntFlags::MNT_DETACH);
            }
        }
    }
    let left = mounts_under(prefix)?;
    if !left.is_empty() {
        bail!("still mounted after clean-up: {left:?}");
    }
    Ok(())
}

/// Clean up directories of earlier runs whose process is gone (killed with -9, say):
/// their mounts and files. Directories of live runs are left alone.
pub fn clean_stale_runs() {
    let Ok(entries) = std::fs::read_dir(BASE) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let alive = pid == std::process::id() as i32
            || nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok();
        if alive {
            continue;
        }
        let dir = e.path();
        match unmount_all(&dir) {
            Ok(()) => {
                let _ = std::fs::remove_dir_all(&dir);
                eprintln!("bench: cleaned up stale run {}", dir.display());
            }
            Err(err) => eprintln!("bench: could not clean {}: {err:#}", dir.display()),
        }
    }
}

/// Owns the run directory: dropping it unmounts everything below and removes it, so an
/// error or a panic anywhere still leaves nothing mounted.
pub struct RunDir {
    pub path: PathBuf,
}

impl RunDir {
    /// Create `/var/tmp/shade-bench/<pid>` with a tmpfs at `tmpfs/` inside.
    pub fn create() -> Result<RunDir> {
        let path = Path::new(BASE).join(std::process::id().to_string());
        if path.exists() {
            unmount_all(&path)?;
            std::fs::remove_dir_all(&path)
                .with_context(|| format!("removing {}", path.display()))?;
        }
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        let dir = RunDir { path };
        mount_tmpfs(&dir.tmpfs())?;
        Ok(dir)
    }

    /// The tmpfs everything is measured on.
    pub fn tmpfs(&self) -> PathBuf {
        self.path.join("tmpfs")
    }

    /// Unmount and remove; returns what could not be unmounted as an error.
    pub fn finish(&self) -> Result<()> {
        unmount_all(&self.path)?;
        std::fs::remove_dir_all(&self.path)
            .with_context(|| format!("removing {}", self.path.display()))
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if self.path.exists() {
            if let Err(e) = self.finish() {
                eprintln!("bench: clean-up of {}: {e:#}", self.path.display());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescapes_octal() {
        assert_eq!(unescape(r"/a\040b"), "/a b");
        assert_eq!(unescape("/plain"), "/plain");
        assert_eq!(unescape(r"/end\"), r"/end\");
    }
}
