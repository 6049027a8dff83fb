//! The checker's result on the unedited project, cached under the state dir by a
//! fingerprint of its inputs (the project's source files' identities and versions, and
//! the checker's command), so it is computed once per project state.

use super::diag::Diagnostic;
use sha2::{Digest, Sha256};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Directories never part of the inputs, even when no .gitignore says so: build output
/// and caches checkers write themselves.
const SKIP_DIRS: &[&str] = &[
    ".git",
    "target",
    "node_modules",
    "__pycache__",
    ".ruff_cache",
    ".mypy_cache",
    ".pytest_cache",
    ".cache",
];

/// Fingerprint of `project` as `checker` sees it: every non-ignored file's path, size,
/// mtime, ctime, inode and mode, in path order, plus the checker's identity.
pub fn fingerprint(project: &Path, checker_identity: &str) -> String {
    let mut entries: Vec<(PathBuf, [i64; 5])> = ignore::WalkBuilder::new(project)
        .hidden(false)
        .git_ignore(true)
        .git_exclude(true)
        .require_git(false)
        .filter_entry(|e| {
            !(e.file_type().is_some_and(|t| t.is_dir())
                && SKIP_DIRS.iter().any(|d| e.file_name() == *d))
        })
        .build()
        .flatten()
        .filter(|e| e.depth() > 0)
        .filter_map(|e| {
            let m = e.path().symlink_metadata().ok()?;
            let rel = e.path().strip_prefix(project).ok()?.to_path_buf();
            Some((
                rel,
                [
                    m.size() as i64,
                    m.mtime() * 1_000_000_000 + m.mtime_nsec(),
                    m.ctime() * 1_000_000_000 + m.ctime_nsec(),
                    m.ino() as i64,
                    m.mode() as i64,
                ],
            ))
        })
        .collect();
    entries.sort();
    let mut h = Sha256::new();
    h.update(checker_identity.as_bytes());
    h.update(project.as_os_str().as_encoded_bytes());
    for (p, v) in &entries {
        h.update(p.as_os_str().as_encoded_bytes());
        h.update([0]);
        for n in v {
            h.update(n.to_le_bytes());
        }
    }
    hex(&h.finalize())
}

/// Short stable hex digest of any bytes (socket and cache names).
pub fn digest(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Baselines on disk: `<state>/lint/baseline/<fingerprint>.json`.
#[derive(Debug, Clone)]
pub struct Cache {
    dir: PathBuf,
}

impl Cache {
    /// The cache under shade's state root.
    pub fn new(state_root: &Path) -> Cache {
        Cache {
            dir: state_root.join("lint").join("baseline"),
        }
    }

    /// The cached baseline for `key`, if any (a corrupt entry counts as missing).
    pub fn get(&self, key: &str) -> Option<Vec<Diagnostic>> {
        let text = std::fs::read(self.dir.join(format!("{key}.json"))).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// Store a baseline (atomically: write then rename). Failure only costs a recompute.
    pub fn put(&self, key: &str, diags: &[Diagnostic]) {
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(&self.dir)?;
            let tmp = self.dir.join(format!(".{key}.{}.tmp", std::process::id()));
            std::fs::write(&tmp, serde_json::to_vec(diags)?)?;
            std::fs::rename(&tmp, self.dir.join(format!("{key}.json")))
        };
        if let Err(e) = write() {
            tracing::warn!("lint baseline cache {}: {e}", self.dir.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprint_changes_with_sources_not_with_build_output() {
        let d = tempfile::tempdir().expect("tempdir");
        std::fs::write(d.path().join("a.py"), "x = 1\n").expect("write");
        let f1 = fingerprint(d.path(), "ruff");
        std::fs::create_dir(d.path().join("target")).expect("mkdir");
        std::fs::write(d.path().join("target/out"), "build").expect("write");
        assert_eq!(fingerprint(d.path(), "ruff"), f1);
        assert_ne!(fingerprint(d.path(), "mypy"), f1);
        std::fs::write(d.path().join("a.py"), "x = 22\n").expect("write");
        assert_ne!(fingerprint(d.path(), "ruff"), f1);
    }
}
