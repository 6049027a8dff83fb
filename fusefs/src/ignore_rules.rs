//! Which paths are build output (gitignored): their writes go to the disk store and
//! accept skips them unless asked.

use ignore::gitignore::{Gitignore, GitignoreBuilder};
use std::path::Path;

/// The project's root `.gitignore` and `.git/info/exclude`, read once per branch.
pub(crate) struct IgnoreRules {
    matcher: Option<Gitignore>,
}

impl IgnoreRules {
    pub fn load(root: &Path) -> IgnoreRules {
        let mut b = GitignoreBuilder::new(root);
        let mut any = false;
        for f in [root.join(".gitignore"), root.join(".git/info/exclude")] {
            if f.is_file() && b.add(&f).is_none() {
                any = true;
            }
        }
        IgnoreRules {
            matcher: if any { b.build().ok() } else { None },
        }
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
