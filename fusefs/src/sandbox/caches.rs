//! Build caches outside the project under a read-only sandbox: each gets a throw-away branch
//! bound over it, so `cargo build`, `npm ci` or `pip install` read the real cache and may
//! write to it, and every such write vanishes with the branch. A path outside the project is
//! never written.

use std::path::{Path, PathBuf};

use super::Bind;
use crate::{Branch, BranchError, BranchOptions};

/// Throw-away branches of cache directories, for [`super::RunSpec::binds`].
pub struct CacheBranches {
    branches: Vec<Branch>,
}

impl CacheBranches {
    /// Branches of those `dirs` that exist as directories, neither inside nor around
    /// `project`, outermost only when one contains another.
    pub fn create(
        project: &Path,
        dirs: &[PathBuf],
        opts: &BranchOptions,
    ) -> Result<CacheBranches, BranchError> {
        let mut picked: Vec<PathBuf> = Vec::new();
        let mut real: Vec<PathBuf> = dirs
            .iter()
            .filter_map(|d| std::fs::canonicalize(d).ok())
            .filter(|d| d.is_dir() && !d.starts_with(project) && !project.starts_with(d))
            .collect();
        real.sort();
        for d in real {
            if !picked.iter().any(|p| d.starts_with(p)) {
                picked.push(d);
            }
        }
        let branches = picked
            .iter()
            .map(|d| Branch::create(d, opts))
            .collect::<Result<_, _>>()?;
        let caches = CacheBranches { branches };
        caches.mask_credentials(project);
        Ok(caches)
    }

    /// The home's credentials made absent in the branches and its secret-bearing
    /// configuration sanitized there (see masks.rs), as the outside layer shows them: the
    /// branches are thrown away, so nothing of this reaches the host, and a command may
    /// still write its own file there. What fails here is hidden for each command instead
    /// (see `bwrap::masked_in_bind`).
    fn mask_credentials(&self, project: &Path) {
        let masks =
            super::masks::home_masks(super::env::EnvPolicy::Agent, &super::env::homes(), project);
        for b in &self.branches {
            let Ok(root) = crate::rootdir::RootDir::open(b.mountpoint()) else {
                continue;
            };
            for (path, how) in &masks {
                let Ok(rel) = path.strip_prefix(b.project()) else {
                    continue;
                };
                if rel.as_os_str().is_empty() {
                    continue;
                }
                let done = match how {
                    super::masks::Masked::Hidden => root.remove_all(rel),
                    super::masks::Masked::Copy(copy) => root.write(rel, copy),
                };
                if let Err(e) = done {
                    tracing::warn!("{} not masked in its cache branch: {e}", path.display());
                }
            }
        }
    }

    /// No caches: nothing outside the project is writable.
    pub fn none() -> CacheBranches {
        CacheBranches {
            branches: Vec::new(),
        }
    }

    /// The binds that put each branch over its cache directory.
    pub fn binds(&self) -> Vec<Bind> {
        self.branches
            .iter()
            .map(|b| Bind {
                source: b.mountpoint().to_path_buf(),
                target: b.project().to_path_buf(),
            })
            .collect()
    }

    /// Let each branch's connection go while no command runs (see [`Branch::detach`]): an
    /// idle shadow then holds no cache mounts either. Stops at the first branch that must
    /// stay attached and says why; [`CacheBranches::attach`] undoes it.
    pub fn detach(&mut self) -> Result<(), String> {
        self.branches.iter_mut().try_for_each(Branch::detach)
    }

    /// Attach every detached branch again (before [`CacheBranches::binds`]).
    pub fn attach(&mut self) -> Result<(), BranchError> {
        self.branches.iter_mut().try_for_each(Branch::attach)
    }

    /// The cache directories covered.
    pub fn dirs(&self) -> Vec<&Path> {
        self.branches.iter().map(Branch::project).collect()
    }
}

/// The usual per-user build caches: `$CARGO_HOME` (or ~/.cargo), `$XDG_CACHE_HOME` (or
/// ~/.cache: pip, go-build, …), ~/.npm, ~/.yarn, `$GOPATH` (or ~/go), ~/.m2, ~/.gradle.
/// Only the ones that exist; the others a command cannot create (the home is read-only).
pub fn default_cache_dirs() -> Vec<PathBuf> {
    let var = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let Some(home) = var("HOME") else {
        return Vec::new();
    };
    [
        var("CARGO_HOME").unwrap_or_else(|| home.join(".cargo")),
        var("XDG_CACHE_HOME").unwrap_or_else(|| home.join(".cache")),
        home.join(".npm"),
        home.join(".yarn"),
        var("GOPATH").unwrap_or_else(|| home.join("go")),
        home.join(".m2"),
        home.join(".gradle"),
    ]
    .into_iter()
    .filter(|d| d.is_dir())
    .collect()
}
