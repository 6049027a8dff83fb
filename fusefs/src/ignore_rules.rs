//! Which paths are build output (gitignored): their writes go to the disk store and
//! accept skips them unless asked.

use ignore::gitignore::{Gitignore, GitignoreBuilder};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

/// The project's root `.gitignore` and `.git/info/exclude`, read once per branch — and
/// shared by the branches that found both files unchanged (thousands of idle branches of
/// one project hold one matcher).
pub(crate) struct IgnoreRules {
    matcher: Option<Arc<Gitignore>>,
}

/// What identifies the two files' versions: (size, mtime, ctime, inode) of each.
type Version = [Option<(u64, i64, i64, u64)>; 2];

/// The last load: the project, its files' versions, the matcher made of them.
type Loaded = (PathBuf, Version, Option<Arc<Gitignore>>);

impl IgnoreRules {
    pub fn load(root: &Path) -> IgnoreRules {
        use std::os::unix::fs::MetadataExt;
        static LAST: Mutex<Option<Loaded>> = Mutex::new(None);
        let files = [root.join(".gitignore"), root.join(".git/info/exclude")];
        let version: Version = files.clone().map(|f| {
            std::fs::metadata(f).ok().filter(|m| m.is_file()).map(|m| {
                (
                    m.size(),
                    m.mtime_nsec() + m.mtime() * 1_000_000_000,
                    m.ctime_nsec() + m.ctime() * 1_000_000_000,
                    m.ino(),
                )
            })
        });
        let mut last = LAST.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((r, v, m)) = &*last {
            if r == root && *v == version {
                return IgnoreRules { matcher: m.clone() };
            }
        }
        let mut b = GitignoreBuilder::new(root);
        let mut any = false;
        for (f, v) in files.iter().zip(&version) {
            if v.is_some() && b.add(f).is_none() {
                any = true;
            }
        }
        let matcher = if any {
            b.build().ok().map(Arc::new)
        } else {
            None
        };
        *last = Some((root.to_path_buf(), version, matcher.clone()));
        IgnoreRules { matcher }
    }

    /// No rules: nothing is ignored.
    pub fn empty() -> IgnoreRules {
        IgnoreRules { matcher: None }
    }

    /// Whether `rel` (or any of its parent directories) is ignored.
    pub fn is_ignored(&self, rel: &Path, is_dir: bool) -> bool {
        match &self.matcher {
            Some(m) if !rel.as_os_str().is_empty() => {
                m.matched_path_or_any_parents(rel, is_dir).is_ignore()
            }
            _ => false,
        }
    }
}
