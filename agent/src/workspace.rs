//! The directory tools may touch. Every path argument goes through `Workspace::resolve`,
//! which refuses `..` escapes, absolute paths outside the root and symlinks leading out.
//! The root can be the real project or a branch mount: tools never look past it. A shadowed
//! workspace ([`Workspace::shadowed`]) keeps files in a branch mount while the model keeps
//! seeing the project's real absolute paths: those map into the mount, and nothing shown
//! to the model names the mount.
//!
//! `resolve` decides what a path means; it is a check, not the access. Commands write the
//! tree and may swap a directory for a link to the host right after it, so every access
//! then goes through [`Workspace::files`] (a [`RootDir`]): the kernel resolves the path
//! beneath the root's descriptor and the file is used through the descriptor it returns.

use std::path::{Component, Path, PathBuf};

pub use shade_fusefs::rootdir::{Kind, RootDir};

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
    /// Where the files are (the project, or a branch mount).
    root: PathBuf,
    /// The path the model knows the files by, when it differs from `root`.
    shown: Option<PathBuf>,
}

impl Workspace {
    /// Use `root` (canonicalized, so later prefix checks compare real paths).
    pub fn new(root: impl AsRef<Path>) -> std::io::Result<Self> {
        Ok(Self {
            root: root.as_ref().canonicalize()?,
            shown: None,
        })
    }

    /// Files live in `mount` (a branch of `project`), but paths are given and shown as
    /// under `project`: an absolute path in the project means the same path in the mount.
    pub fn shadowed(project: impl AsRef<Path>, mount: impl AsRef<Path>) -> std::io::Result<Self> {
        Ok(Self {
            root: mount.as_ref().canonicalize()?,
            shown: Some(project.as_ref().canonicalize()?),
        })
    }

    /// The canonical root: where the files are.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The root as the model and the user know it: the real project of a shadowed
    /// workspace, else [`Workspace::root`]. Commands run here (inside the branch's namespace).
    pub fn shown_root(&self) -> &Path {
        self.shown.as_deref().unwrap_or(&self.root)
    }

    /// A path under [`Workspace::root`] as the model knows it (under the real project).
    pub fn shown(&self, path: &Path) -> PathBuf {
        match (&self.shown, path.strip_prefix(&self.root)) {
            (Some(shown), Ok(rel)) => shown.join(rel),
            _ => path.to_path_buf(),
        }
    }

    /// A path as the model knows it mapped to where the file is: the real project's
    /// prefix becomes the mount's.
    fn backing(&self, path: &Path) -> Option<PathBuf> {
        if path.starts_with(&self.root) {
            return None;
        }
        let rel = path.strip_prefix(self.shown.as_ref()?).ok()?;
        Some(self.root.join(rel))
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
            root: self.shown_root().display().to_string(),
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
        if let Some(inside) = self.backing(&normal) {
            normal = inside;
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
        let canonical = |p: &Path| {
            p.canonicalize().map_err(|e| PathError::Io {
                path: arg.to_string(),
                // A dangling symlink: refuse rather than guess where a write would land.
                reason: format!("{e} (dangling symlink?)"),
            })
        };
        let mut real = canonical(&existing)?;
        // A symlink in a shadowed workspace may name the real project by its absolute path:
        // inside the branch it means the branch (as for commands, which see it there).
        for _ in 0..8 {
            match self.backing(&real) {
                Some(inside) => real = canonical(&inside)?,
                None => break,
            }
        }
        if !real.starts_with(&self.root) {
            return Err(outside());
        }
        let mut out = real;
        for name in rest.into_iter().rev() {
            out.push(name);
        }
        Ok(out)
    }

    /// The root's descriptor, which every file access of the tools goes through: `resolve`
    /// decides what a path means, the kernel then keeps the access beneath the root, so a
    /// link a command swaps in after the check cannot lead out.
    pub fn files(&self) -> std::io::Result<RootDir> {
        RootDir::open(&self.root)
    }

    /// A path from [`Workspace::resolve`] relative to the root, as [`RootDir`] takes it
    /// (any other path stays as it is, and `RootDir` refuses it).
    pub fn relative<'p>(&self, path: &'p Path) -> &'p Path {
        path.strip_prefix(&self.root).unwrap_or(path)
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

    #[test]
    fn a_shadowed_workspace_maps_the_projects_paths_into_the_mount() {
        let dir = tempfile::tempdir().unwrap();
        let (project, mount) = (dir.path().join("project"), dir.path().join("mount"));
        std::fs::create_dir_all(project.join("src")).unwrap();
        std::fs::create_dir_all(mount.join("src")).unwrap();
        let ws = Workspace::shadowed(&project, &mount).unwrap();
        let (project, mount) = (
            project.canonicalize().unwrap(),
            mount.canonicalize().unwrap(),
        );
        assert_eq!(ws.root(), mount);
        assert_eq!(ws.shown_root(), project);
        let abs = project.join("src/a.rs");
        assert_eq!(
            ws.resolve(abs.to_str().unwrap()).unwrap(),
            mount.join("src/a.rs")
        );
        assert_eq!(ws.resolve("src/a.rs").unwrap(), mount.join("src/a.rs"));
        assert_eq!(ws.shown(&mount.join("src/a.rs")), abs);
        assert_eq!(ws.display(&mount.join("src/a.rs")), "src/a.rs");
        // A link in the branch naming the real project absolutely stays in the branch.
        std::os::unix::fs::symlink(project.join("src"), mount.join("alias")).unwrap();
        assert_eq!(ws.resolve("alias/b.rs").unwrap(), mount.join("src/b.rs"));
        // The real project's neighbours are still outside, and errors name the project.
        let sibling = project.join("../secret");
        match ws.resolve(sibling.to_str().unwrap()) {
            Err(PathError::Outside { root, .. }) => assert_eq!(root, project.display().to_string()),
            other => panic!("{other:?}"),
        }
    }
}
