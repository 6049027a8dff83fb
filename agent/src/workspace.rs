//! The directory tools may touch. Every path argument goes through `Workspace::resolve`,
//! which refuses `..` escapes, absolute paths outside the root and symlinks leading out.
//! The root can be the real project or a branch mount: tools never look past it.

use std::path::{Component, Path, PathBuf};

/// Why a path was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// Empty path argument.
    #[error("empty path")]
    Empty,
    /// The path points outside the workspace (lexically or through a symlink).
    #[error(
        "path `{path}` is outside the workspace; only files inside the workspace root can be used"
    )]
    Outside {
        /// The path as given.
        path: String,
        /// The root (not in the message: results must not depend on where a branch is mounted).
        root: String,
    },
    /// The filesystem refused to tell where the path leads.
    #[error("cannot resolve `{path}`: {reason}")]
    Io {
        /// The path as given.
        path: String,
        /// OS error text.
        reason: String,
    },
}

/// A confined directory tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workspace {
    root: PathBuf,
}

impl Workspace {
    /// Use `root` (canonicalized, so later prefix checks compare real paths).
    pub fn new(root: impl AsRef<Path>) -> std::io::Result<Self> {
        Ok(Self {
            root: root.as_ref().canonicalize()?,
        })
    }

    /// The canonical root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Map a tool's path argument (relative to the root, or absolute inside it) to a real
    /// path inside the root. The path itself need not exist, but every existing ancestor is
    /// resolved through symlinks and must stay inside.
    pub fn resolve(&self, arg: &str) -> Result<PathBuf, PathError> {
        if arg.trim().is_empty() {
            return Err(PathError::Empty);
        }
        let outside = || PathError::Outside {
            path: arg.to_string(),
            root: self.root.display().to_string(),
        };
        let given = Path::new(arg);
        // Lexical normalisation. A relative path may never climb above the root, even to
        // come back in (`../root/x`); an absolute one must end up inside it.
        let (mut normal, floor) = if given.is_absolute() {
            (PathBuf::from("/"), PathBuf::from("/"))
        } else {
            (self.root.clone(), self.root.clone())
        };
        for c in given.components() {
            match c {
                Component::ParentDir => {
                    if normal == floor {
                        return Err(outside());
                    }
                    normal.pop();
                }
                Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
                Component::Normal(name) => normal.push(name),
            }
        }
        // Resolve symlinks (this is the check that decides: an absolute path spelled through
        // a symlink to the root is accepted, one leading elsewhere is not) in the longest existing prefix.
        let mut existing = normal.clone();
        let mut rest = Vec::new();
        loop {
            match existing.symlink_metadata() {
                Ok(_) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    match (existing.file_name(), existing.parent()) {
                        (Some(name), Some(parent)) => {
                            rest.push(name.to_os_string());
                            existing = parent.to_path_buf();
                        }
                        _ => return Err(outside()),
                    }
                }
                Err(e) => {
                    return Err(PathError::Io {
                        path: arg.to_string(),
                        reason: e.to_string(),
                    })
                }
            }
        }
        let real = match existing.canonicalize() {
            Ok(r) => r,
            // A dangling symlink: refuse rather than guess where a write would land.
            Err(e) => {
                return Err(PathError::Io {
                    path: arg.to_string(),
                    reason: format!("{e} (dangling symlink?)"),
                })
            }
        };
        if !real.starts_with(&self.root) {
            return Err(outside());
        }
        let mut out = real;
        for name in rest.into_iter().rev() {
            out.push(name);
        }
        Ok(out)
    }

    /// How to show a resolved path to the user and the model: relative to the root.
    pub fn display(&self, path: &Path) -> String {
        match path.strip_prefix(&self.root) {
            Ok(rel) if rel.as_os_str().is_empty() => ".".to_string(),
            Ok(rel) => rel.display().to_string(),
            Err(_) => path.display().to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn absolute_paths_through_a_symlinked_root_are_inside() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&real, dir.path().join("alias")).unwrap();
        let ws = Workspace::new(dir.path().join("alias")).unwrap();
        let via_alias = dir.path().join("alias/new.txt");
        assert_eq!(
            ws.resolve(via_alias.to_str().unwrap()).unwrap(),
            ws.root().join("new.txt")
        );
        let sibling = dir.path().join("alias/../other.txt");
        assert!(ws.resolve(sibling.to_str().unwrap()).is_err());
    }

    #[test]
    fn confines_paths() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("src")).unwrap();
        std::fs::write(dir.path().join("src/a.rs"), "x").unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("out")).unwrap();
        std::os::unix::fs::symlink("src/a.rs", dir.path().join("inlink")).unwrap();
        let ws = Workspace::new(dir.path()).unwrap();
        let root = ws.root().to_path_buf();

        assert_eq!(ws.resolve("src/a.rs").unwrap(), root.join("src/a.rs"));
        assert_eq!(
            ws.resolve("src/../src/./a.rs").unwrap(),
            root.join("src/a.rs")
        );
        assert_eq!(
            ws.resolve("new/dir/f.txt").unwrap(),
            root.join("new/dir/f.txt")
        );
        assert_eq!(ws.resolve(".").unwrap(), root);
        assert_eq!(ws.resolve("inlink").unwrap(), root.join("src/a.rs"));
        let abs = root.join("src/a.rs");
        assert_eq!(ws.resolve(abs.to_str().unwrap()).unwrap(), abs);

        for bad in [
            "..",
            "../x",
            "src/../../etc/passwd",
            "/etc/passwd",
            "out/x",
            "out",
        ] {
            assert!(
                matches!(ws.resolve(bad), Err(PathError::Outside { .. })),
                "{bad} should be refused: {:?}",
                ws.resolve(bad)
            );
        }
        let sneaky = format!(
            "../{}/src/a.rs",
            root.file_name().unwrap().to_str().unwrap()
        );
        assert!(ws.resolve(&sneaky).is_err());
        assert_eq!(ws.resolve(""), Err(PathError::Empty));
        assert_eq!(ws.display(&root.join("src/a.rs")), "src/a.rs");
    }
}
