//! The project's paths that are code for the host by where they are (red team round 8,
//! route 2): when the project is a home, holds one (`/home`, `/`) or lies in a place the
//! host reads, a live accept would otherwise write `~/.bashrc`, `~/.local/bin/x` or shade's
//! own `config.toml` (the sandbox rules of every later session) without a question. The
//! rules are the outside layer's ([`shade_fusefs::outside::home_path_runs_code`],
//! [`shade_fusefs::outside::system_code_dirs`]), judged for the project's absolute paths
//! (see [`HostCode`]).

use std::path::{Path, PathBuf};

/// The places that make a project path code for the host: every home the session could
/// reach ([`shade_fusefs::sandbox::env::homes`]) with its start-up and config paths; the
/// XDG config and data directories when set elsewhere; shade's config directory and files
/// ([`crate::paths::config_files`], always); git's global config when named by the
/// environment; the directories on `PATH`; the system's code directories that lie in the
/// project, and `/etc` always. Paths as the host has them (links resolved), also as given.
#[derive(Debug, Default, Clone)]
pub(super) struct HostCode {
    project: PathBuf,
    homes: Vec<PathBuf>,
    /// `(dir, as)`: a directory that stands for `as` in a home (`$XDG_CONFIG_HOME` for
    /// `.config`).
    bases: Vec<(PathBuf, &'static str)>,
    /// Files or directories that are code whole.
    whole: Vec<PathBuf>,
}

/// `path` and where it leads on the host (its longest existing prefix resolved).
fn both(path: &Path) -> Vec<PathBuf> {
    let lexical = shade_lint::diag::lexical(path);
    let mut out = vec![lexical.clone()];
    if let Some(real) = super::git_code::canonical_prefix(&lexical) {
        if real != lexical {
            out.push(real);
        }
    }
    out
}

/// Where the symlinks among `home`'s hidden entries, and among the entries of its
/// `.config` and `.local/share`, lead (resolved; those that resolve).
fn linked_dotfiles(home: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for (dir, hidden_only) in [
        (home.to_path_buf(), true),
        (home.join(".config"), false),
        (home.join(".local/share"), false),
    ] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten().take(4096) {
            let hidden = e.file_name().as_encoded_bytes().first() == Some(&b'.');
            if (hidden || !hidden_only) && e.file_type().is_ok_and(|t| t.is_symlink()) {
                out.extend(std::fs::canonicalize(e.path()).ok());
            }
        }
    }
    out
}

fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
}

impl HostCode {
    /// The places for `project` (canonical) in this process's environment now.
    pub(super) fn read(project: &Path) -> HostCode {
        let mut homes: Vec<PathBuf> = shade_fusefs::sandbox::env::homes();
        homes.extend(shade_fusefs::outside::home_dir());
        let homes: Vec<PathBuf> = homes.iter().flat_map(|h| both(h)).collect();
        let mut bases = Vec::new();
        for (var, stands) in [
            ("XDG_CONFIG_HOME", ".config"),
            ("XDG_DATA_HOME", ".local/share"),
        ] {
            if let Some(d) = env_path(var) {
                bases.extend(both(&d).into_iter().map(|d| (d, stands)));
            }
        }
        let mut whole: Vec<PathBuf> = crate::paths::config_files();
        whole.extend(env_path("XDG_CONFIG_HOME").map(|d| d.join("git")));
        whole.extend(
            ["GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM"]
                .iter()
                .filter_map(|v| env_path(v)),
        );
        if let Some(path) = std::env::var_os("PATH") {
            whole.extend(
                std::env::split_paths(&path).filter(|d| d.is_absolute() && d != Path::new("/")),
            );
        }
        for d in shade_fusefs::outside::system_code_dirs() {
            // A project inside `/usr` or `/opt` (`/usr/src/app`) is the user's own tree; one
            // that holds a system directory (`/`, `/usr`) edits the host's. `/etc` is the
            // host's configuration wherever the project lies in it.
            if Path::new(d).starts_with(project) || *d == "/etc" {
                whole.push(PathBuf::from(d));
            }
        }
        // Dotfiles kept elsewhere and linked in (GNU stow: `~/.bashrc ->
        // dotfiles/bash/.bashrc`, `~/.config/fish -> ../dotfiles/fish`): what the link leads
        // to is the start-up file, whatever its own name (red team round 10).
        for home in &homes {
            whole.extend(linked_dotfiles(home));
        }
        // A relative `XDG_CONFIG_HOME` (against the spec, yet read so) is relative to the
        // current directory, which is the project's.
        let cwd = std::env::current_dir().unwrap_or_default();
        let whole = whole.iter().flat_map(|p| both(&cwd.join(p))).collect();
        HostCode {
            project: project.to_path_buf(),
            homes,
            bases,
            whole,
        }
    }

    /// The places when `home` is the project and the only home (for tests).
    #[cfg(test)]
    pub(super) fn home_only(home: &Path) -> HostCode {
        HostCode {
            project: home.to_path_buf(),
            homes: vec![home.to_path_buf()],
            ..HostCode::default()
        }
    }

    /// Whether `path` (relative to the project) is code for the host, lies below such a
    /// place, or (`ancestor_counts`: a change that makes, removes or renames it) is a
    /// directory above one.
    pub(super) fn names(&self, path: &Path, ancestor_counts: bool) -> bool {
        use shade_fusefs::outside::{home_code_within, home_listed, home_path_runs_code};
        let abs = self.project.join(path);
        if self
            .whole
            .iter()
            .any(|w| abs.starts_with(w) || (ancestor_counts && w.starts_with(&abs)))
        {
            return true;
        }
        let in_home = |home: &Path, stands: &str| {
            if let Ok(rel) = abs.strip_prefix(home) {
                // Names that mark code (`.config/foo/hooks/`, `.hgrc`) count when the project
                // holds the home; a project inside it (`~/.local/src/p`) is the user's own
                // tree, where only the listed places are the host's.
                let rel = Path::new(stands).join(rel);
                let by_name = home.starts_with(&self.project);
                if home_listed(&rel) || (by_name && home_path_runs_code(&rel)) {
                    return true;
                }
                // With the home in the project, everything under its hidden entries: no list
                // of the places programs run code from is complete (toolchains' `bin`,
                // installers' `env` files a `.bashrc` sources, completions, `build.rs` of
                // cargo's registry — red team round 10), and the home's dot-directories are
                // the host's programs' own, not the project's work.
                let hidden = rel
                    .components()
                    .next()
                    .is_some_and(|c| c.as_os_str().as_encoded_bytes().first() == Some(&b'.'));
                if by_name && hidden {
                    return true;
                }
            }
            if !ancestor_counts {
                return false;
            }
            // A directory above the home, or one in it above a listed path.
            match home.strip_prefix(&abs) {
                Ok(_) => home_code_within(Path::new(stands)),
                Err(_) => abs
                    .strip_prefix(home)
                    .is_ok_and(|rel| home_code_within(&Path::new(stands).join(rel))),
            }
        };
        self.homes.iter().any(|h| in_home(h, ""))
            || self.bases.iter().any(|(d, stands)| in_home(d, stands))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn code(project: &str, homes: &[&str]) -> HostCode {
        HostCode {
            project: PathBuf::from(project),
            homes: homes.iter().map(PathBuf::from).collect(),
            bases: vec![(PathBuf::from("/x/cfg"), ".config")],
            whole: vec![
                PathBuf::from("/home/u/.config/shade"),
                PathBuf::from("/home/u/.local/bin"),
            ],
        }
    }

    fn named(c: &HostCode, p: &str) -> bool {
        c.names(Path::new(p), false)
    }

    #[test]
    fn the_home_as_the_project() {
        let c = code("/home/u", &["/home/u"]);
        for p in [
            ".bashrc",
            ".config/shade/config.toml",
            ".gitconfig",
            ".config/git/config",
            ".local/bin/tool",
            ".config/autostart/x.desktop",
        ] {
            assert!(named(&c, p), "{p}");
        }
        // Everything under the home's hidden entries: no list of code places is whole.
        for p in [".notes", ".cargo/registry/src/x/build.rs", ".ghcup/env"] {
            assert!(named(&c, p), "{p}");
        }
        for p in [
            "src/x.rs",
            "proj/src/main.rs",
            "notes.txt",
            "proj/.env.example",
        ] {
            assert!(!named(&c, p), "{p}");
        }
        // Made, moved or removed: a directory holding one.
        assert!(c.names(Path::new(".config"), true));
        assert!(c.names(Path::new(".config"), false));
        assert!(!c.names(Path::new("proj"), true));
    }

    /// Dotfiles kept in a directory of their own and linked in (GNU stow): what the links
    /// lead to is held, under its own name (red team round 10, attack10/08).
    #[test]
    fn linked_dotfiles_are_held_where_they_lead() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().canonicalize().unwrap();
        for d in ["dotfiles/bash", "dotfiles/fish", ".config"] {
            std::fs::create_dir_all(home.join(d)).unwrap();
        }
        std::fs::write(home.join("dotfiles/bash/.bashrc"), "id\n").unwrap();
        std::os::unix::fs::symlink("dotfiles/bash/.bashrc", home.join(".bashrc")).unwrap();
        std::os::unix::fs::symlink("../dotfiles/fish", home.join(".config/fish")).unwrap();
        let mut found = linked_dotfiles(&home);
        found.sort();
        assert_eq!(
            found,
            [
                home.join("dotfiles/bash/.bashrc"),
                home.join("dotfiles/fish")
            ]
        );
        let c = HostCode {
            project: home.clone(),
            homes: vec![home.clone()],
            whole: found,
            ..HostCode::default()
        };
        assert!(named(&c, "dotfiles/bash/.bashrc"));
        assert!(named(&c, "dotfiles/fish/config.fish"));
        assert!(!named(&c, "dotfiles/README.md"));
    }

    #[test]
    fn a_parent_of_homes_and_a_project_in_one() {
        let c = code("/home", &["/home/u", "/home/v"]);
        assert!(named(&c, "v/.bashrc"));
        assert!(named(&c, "u/.config/shade/AGENTS.md"));
        assert!(!named(&c, "v/src/main.rs"));
        assert!(c.names(Path::new("v"), true));
        // A project in the home: its files are the project's.
        let c = code("/home/u/proj", &["/home/u"]);
        assert!(!named(&c, "src/main.rs"));
        assert!(!named(&c, ".bashrc"));
        assert!(!c.names(Path::new("src"), true));
        // A project that is a listed place is code whole.
        let c = code("/home/u/.local/bin", &["/home/u"]);
        assert!(named(&c, "tool"));
    }

    #[test]
    fn xdg_config_elsewhere_counts_as_the_homes() {
        let c = code("/x", &["/home/u"]);
        assert!(named(&c, "cfg/fish/config.fish"));
        assert!(named(&c, "cfg/git/config"));
        assert!(named(&c, "cfg/foo/hooks/x"));
        // The XDG config directory in the project stands for the home's `.config`: whole.
        assert!(named(&c, "cfg/foo/settings.json"));
        assert!(c.names(Path::new("cfg"), true));
        // A project inside the XDG config directory: its own scripts are not held.
        let c = code("/x/cfg/proj", &["/home/u"]);
        assert!(!named(&c, "src/x.py"));
        assert!(!named(&c, "hooks/x.sh"));
    }
}
