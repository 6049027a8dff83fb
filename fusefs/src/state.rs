//! Where shade keeps its own state: branch stores (spilled file contents, mount points)
//! and accept journals. Never inside the project, never in /tmp (tmpfs would hold spilled
//! data in RAM, and /tmp may be cleaned under a live branch).

use std::path::{Path, PathBuf};

/// Root of shade's state on this machine.
#[derive(Clone, Debug)]
pub struct StateDir {
    root: PathBuf,
}

impl StateDir {
    /// `$SHADE_STATE_DIR`, else `$XDG_STATE_HOME/shade`, else `~/.local/state/shade`.
    pub fn from_env() -> StateDir {
        if let Some(p) = std::env::var_os("SHADE_STATE_DIR").filter(|p| !p.is_empty()) {
            return StateDir::at(PathBuf::from(p));
        }
        if let Some(p) = std::env::var_os("XDG_STATE_HOME").filter(|p| !p.is_empty()) {
            return StateDir::at(PathBuf::from(p).join("shade"));
        }
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/root"));
        StateDir::at(home.join(".local/state/shade"))
    }

    /// A state dir at an explicit place (tests use a temp dir).
    pub fn at(root: PathBuf) -> StateDir {
        StateDir { root }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// One directory per live branch: `store/` (spilled contents), `mnt/` (its mount point),
    /// `owner` (pid of the process serving it, for stale-branch cleanup).
    pub fn branches(&self) -> PathBuf {
        self.root.join("branches")
    }

    /// Accept history: what each accept replaced, for `shade log` and `shade undo`.
    pub fn history(&self) -> PathBuf {
        self.root.join("history")
    }

    /// Accept journals, one file per accept in progress.
    pub fn journals(&self) -> PathBuf {
        self.root.join("journals")
    }
}
