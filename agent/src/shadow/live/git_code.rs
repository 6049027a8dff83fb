//! The project's own files that git's effective configuration makes code (red team round 5,
//! route 2): a repository's config commonly points git at files in the worktree —
//! `core.hooksPath = .husky/_` (husky; the directory is git-ignored), `include.path =
//! ../.gitconfig`, a hook in `.git/hooks` that is a link into `tools/`, a filter, alias or
//! `core.fsmonitor` naming a script of the project. An edit of such a file looks like any
//! other, yet the user's next `git status`/`commit`/`checkout` runs it: a live accept holds
//! it as it holds `.git/config` (see [`GitCode`]).

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Most config files read through includes whose condition does not hold now (each is
/// read with `git config --file`), and most bytes of a hook script scanned for the files
/// it runs.
const INCLUDES_MAX: usize = 32;
const HOOK_SCAN_MAX: u64 = 64 << 10;

/// Git's hook names: what a hooks directory that is the project's root makes code.
const HOOK_NAMES: &[&str] = &[
    "applypatch-msg",
    "pre-applypatch",
    "post-applypatch",
    "pre-commit",
    "pre-merge-commit",
    "prepare-commit-msg",
    "commit-msg",
    "post-commit",
    "pre-rebase",
    "post-checkout",
    "post-merge",
    "pre-push",
    "pre-receive",
    "update",
    "proc-receive",
    "post-receive",
    "post-update",
    "reference-transaction",
    "push-to-checkout",
    "pre-auto-gc",
    "post-rewrite",
    "sendemail-validate",
    "fsmonitor-watchman",
    "p4-changelist",
    "p4-prepare-changelist",
    "p4-post-changelist",
    "p4-pre-submit",
    "post-index-change",
];

/// Paths of the project (relative to it) that git, as configured for the project in every
/// scope (system, global, local, worktree, with includes followed), reads as its config,
/// runs or sources: every config file read; every include target (also of a condition
/// that does not hold now); the hooks directory when it lies in the project, and the
/// targets of links in it and the files its scripts name; and the files named by values
/// that git runs (`core.fsmonitor`, `core.sshCommand`, `core.pager`, aliases, filters,
/// diff and merge drivers, credential helpers, …) or reads as rules (`core.attributesFile`,
/// `core.excludesFile`). Read without running anything the project controls: only the host's
/// `git config` and `git rev-parse`, which run no hooks, filters or monitors.
#[derive(Debug, Default, Clone)]
pub(super) struct GitCode {
    named: BTreeSet<PathBuf>,
}

/// How a config value names files.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A config file, relative to the including file's directory.
    Include,
    /// One path (a file or a whole directory).
    Path,
    /// A command line for the shell: its words that could be files.
    Command,
}

fn kind(key: &str, value: &str) -> Option<Kind> {
    let section = key.split('.').next().unwrap_or("");
    let name = key.rsplit('.').next().unwrap_or("");
    match (section, name) {
        ("include" | "includeif", "path") => return Some(Kind::Include),
        ("core", "hookspath" | "attributesfile" | "excludesfile")
        | ("init", "templatedir")
        | ("mergetool" | "difftool" | "browser" | "man" | "web", "path") => {
            return Some(Kind::Path)
        }
        ("alias" | "pager", _) => return Some(Kind::Command),
        _ => {}
    }
    let command = value.trim_start().starts_with('!')
        || [
            "cmd", "command", "program", "hook", "helper", "editor", "pager",
        ]
        .iter()
        .any(|s| name.ends_with(s))
        || matches!(
            name,
            "textconv"
                | "driver"
                | "clean"
                | "smudge"
                | "process"
                | "external"
                | "difffilter"
                | "uploadpack"
                | "receivepack"
                | "smtpserver"
                | "askpass"
                | "sshcommand"
                | "fsmonitor"
                | "gitproxy"
        );
    command.then_some(Kind::Command)
}

/// `path` with links resolved as far as it exists on the host (the rest appended).
pub(super) fn canonical_prefix(path: &Path) -> Option<PathBuf> {
    let path = shade_lint::diag::lexical(path);
    let mut rest = Vec::new();
    let mut at = path.as_path();
    loop {
        if let Ok(c) = std::fs::canonicalize(at) {
            let mut out = c;
            for r in rest.iter().rev() {
                out.push(r);
            }
            return Some(out);
        }
        rest.push(at.file_name()?.to_os_string());
        at = at.parent()?;
    }
}

/// The words of a shell command line that could name files (no options, no operators).
fn words(cmd: &str) -> impl Iterator<Item = &str> {
    cmd.split(|c: char| c.is_whitespace() || ";|&<>()`'\"=,:!$\\{}".contains(c))
        .filter(|w| !w.is_empty() && !w.starts_with('-'))
}

fn home_join(rest: &str) -> Option<PathBuf> {
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(rest))
}

/// `git` for reading the project's configuration: in the project, with the location
/// variables of this process's environment left out, every repository owner accepted (the
/// user's git, as the repository's owner, reads its config even when this process is
/// another user), and no optional locks taken.
fn git(project: &Path) -> Command {
    let mut c = Command::new("git");
    c.arg("-C")
        .arg(project)
        .args(["-c", "safe.directory=*"])
        .env("GIT_OPTIONAL_LOCKS", "0")
        .stdin(Stdio::null())
        .stderr(Stdio::null());
    for v in [
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_COMMON_DIR",
        "GIT_INDEX_FILE",
        "GIT_CONFIG_PARAMETERS",
        "GIT_CONFIG_COUNT",
    ] {
        c.env_remove(v);
    }
    c
}

/// One line of `git … --path-format=absolute` output, or None when git refused.
fn rev_parse(project: &Path, args: &[&str]) -> Result<Option<PathBuf>, String> {
    let o = git(project)
        .arg("rev-parse")
        .arg("--path-format=absolute")
        .args(args)
        .output()
        .map_err(|e| format!("could not run `git rev-parse`: {e}"))?;
    let line = o.stdout.strip_suffix(b"\n").unwrap_or(&o.stdout);
    Ok((o.status.success() && !line.is_empty()).then(|| PathBuf::from(OsStr::from_bytes(line))))
}

/// Entries of `git config --list --show-origin -z`: (origin, key, value).
type Entry = (String, String, Option<String>);

fn parse_list(out: &[u8]) -> Vec<Entry> {
    let text = String::from_utf8_lossy(out);
    let mut fields = text.split('\0');
    let mut entries = Vec::new();
    while let (Some(origin), Some(entry)) = (fields.next(), fields.next()) {
        let (key, value) = match entry.split_once('\n') {
            Some((k, v)) => (k, Some(v.to_string())),
            None => (entry, None),
        };
        entries.push((origin.to_string(), key.to_string(), value));
    }
    entries
}

impl GitCode {
    /// Git's view of `project` (canonical) now. Err: git ran but could not read the
    /// configuration (the caller then vouches for nothing). No git on the host: nothing is
    /// named (the user's git cannot run either).
    pub(super) fn read(project: &Path) -> Result<GitCode, String> {
        let mut code = Reader {
            project,
            top: None,
            out: GitCode::default(),
        };
        let list = match git(project)
            .args(["config", "--list", "--show-origin", "-z"])
            .output()
        {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(GitCode::default()),
            Err(e) => return Err(format!("could not run `git config`: {e}")),
            Ok(o) if !o.status.success() => {
                return Err("`git config --list` failed (a broken configuration?)".into())
            }
            Ok(o) => o.stdout,
        };
        code.top = rev_parse(project, &["--show-toplevel"])?;
        let mut read_files: BTreeSet<PathBuf> = BTreeSet::new();
        let mut queue: Vec<PathBuf> = Vec::new();
        let mut entries = parse_list(&list);
        let mut extra = 0usize;
        loop {
            for (origin, key, value) in &entries {
                let file = origin
                    .strip_prefix("file:")
                    .map(|f| shade_lint::diag::lexical(&project.join(f)));
                if let Some(f) = &file {
                    code.add(f, true);
                    read_files.insert(f.clone());
                }
                let Some(value) = value else { continue };
                match kind(key, value) {
                    Some(Kind::Include) => {
                        let target = if let Some(rest) = value.strip_prefix("~/") {
                            home_join(rest)
                        } else if value.starts_with('/') {
                            Some(PathBuf::from(value))
                        } else {
                            file.as_deref()
                                .and_then(Path::parent)
                                .map(|d| d.join(value))
                        };
                        if let Some(t) = target.map(|t| shade_lint::diag::lexical(&t)) {
                            code.add(&t, true);
                            queue.push(t);
                        }
                    }
                    Some(Kind::Path) => code.path(value, true),
                    Some(Kind::Command) => {
                        for w in words(value) {
                            code.path(w, false);
                        }
                    }
                    None => {}
                }
            }
            // An include whose condition does not hold now (`includeIf "onbranch:…"`)
            // may hold later: what it names counts too.
            let Some(next) =
                std::iter::from_fn(|| queue.pop()).find(|n| !read_files.contains(n) && n.is_file())
            else {
                break;
            };
            extra += 1;
            if extra > INCLUDES_MAX {
                return Err("too many configuration files included".into());
            }
            read_files.insert(next.clone());
            entries = match git(project)
                .args([
                    "config",
                    "--list",
                    "--show-origin",
                    "-z",
                    "--includes",
                    "--file",
                ])
                .arg(&next)
                .output()
            {
                Ok(o) if o.status.success() => parse_list(&o.stdout),
                _ => Vec::new(),
            };
        }
        if let Some(hooks) = rev_parse(project, &["--git-path", "hooks"])? {
            code.hooks(&hooks);
        }
        Ok(code.out)
    }

    /// Whether `path` (relative to the project) is a path this names, lies below one, or
    /// is a directory above one (`ancestor_counts`: a change that makes, removes or renames
    /// it; a directory's own mode change does not count).
    pub(super) fn names(&self, path: &Path, ancestor_counts: bool) -> bool {
        self.named
            .iter()
            .any(|n| path.starts_with(n) || (ancestor_counts && n.starts_with(path)))
    }

    /// The paths named, for messages and tests.
    #[cfg(test)]
    pub(super) fn named(&self) -> &BTreeSet<PathBuf> {
        &self.named
    }
}

struct Reader<'a> {
    project: &'a Path,
    /// The work tree's top (where git runs hooks, aliases and filters).
    top: Option<PathBuf>,
    out: GitCode,
}

impl Reader<'_> {
    /// `abs` (and where it leads through links on the host) when inside the project and
    /// not the project itself; a directory only if `dirs`.
    fn add(&mut self, abs: &Path, dirs: bool) {
        if !dirs && abs.is_dir() {
            return;
        }
        for p in [Some(shade_lint::diag::lexical(abs)), canonical_prefix(abs)]
            .into_iter()
            .flatten()
        {
            if let Ok(rel) = p.strip_prefix(self.project) {
                if !rel.as_os_str().is_empty() {
                    self.out.named.insert(rel.to_path_buf());
                }
            }
        }
    }

    /// A path as git or a shell would take it: `~/` from the home, relative from the work
    /// tree's top or the project; an absolute one also from there (what `$(git rev-parse
    /// --show-toplevel)/x` becomes).
    fn path(&mut self, word: &str, dirs: bool) {
        let word = word.strip_prefix(":(optional)").unwrap_or(word);
        if let Some(rest) = word.strip_prefix("~/") {
            if let Some(p) = home_join(rest) {
                self.add(&p, dirs);
            }
            return;
        }
        let bases: Vec<PathBuf> = self
            .top
            .iter()
            .cloned()
            .chain([self.project.to_path_buf()])
            .collect();
        if word.starts_with('/') {
            self.add(Path::new(word), dirs);
        }
        let rel = word.trim_start_matches('/');
        if rel.is_empty() {
            return;
        }
        for b in bases {
            self.add(&b.join(rel), dirs);
        }
    }

    /// The hooks directory git uses (`core.hooksPath` or the git directory's `hooks`): the
    /// whole of it when in the project (its hook names if it is the project's root), the
    /// targets of the links in it, and the files its scripts name.
    fn hooks(&mut self, dir: &Path) {
        let Some(real) = canonical_prefix(dir) else {
            return;
        };
        if real == self.project {
            for h in HOOK_NAMES {
                self.add(&real.join(h), true);
            }
        } else {
            self.add(dir, true);
            self.add(&real, true);
        }
        let Ok(entries) = std::fs::read_dir(&real) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            let Ok(meta) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            if meta.file_type().is_symlink() {
                if let Some(t) = canonical_prefix(&p) {
                    self.add(&t, true);
                }
                continue;
            }
            if !meta.is_file() || p.extension().is_some_and(|x| x == "sample") {
                continue;
            }
            // A stub hook that runs the project's script (`exec tools/pre-commit "$@"`):
            // the files it names (existing ones; directories it enters are not code).
            let Ok(f) = std::fs::File::open(&p) else {
                continue;
            };
            let mut text = Vec::new();
            let _ =
                std::io::Read::read_to_end(&mut std::io::Read::take(f, HOOK_SCAN_MAX), &mut text);
            let text = String::from_utf8_lossy(&text).into_owned();
            for w in words(&text) {
                for b in self
                    .top
                    .iter()
                    .cloned()
                    .chain([real.clone()])
                    .collect::<Vec<_>>()
                {
                    let abs = b.join(w.trim_start_matches('/'));
                    if abs.is_file() {
                        self.add(&abs, false);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn sh(dir: &Path, script: &str) {
        let o = Command::new("sh")
            .args(["-ec", script])
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(o.status.success(), "{script}: {o:?}");
    }

    fn repo(setup: &str) -> (tempfile::TempDir, GitCode) {
        let d = tempfile::tempdir().unwrap();
        let p = std::fs::canonicalize(d.path()).unwrap();
        sh(&p, "git init -q . && mkdir -p src && echo x > src/m.c");
        sh(&p, setup);
        let code = GitCode::read(&p).unwrap();
        (d, code)
    }

    fn names(code: &GitCode, p: &str) -> bool {
        code.names(Path::new(p), true)
    }

    #[test]
    fn hooks_path_in_the_work_tree_is_code() {
        let (_d, code) = repo("mkdir -p .husky/_ && git config core.hooksPath .husky/_");
        assert!(names(&code, ".husky/_/h"), "{:?}", code.named());
        assert!(names(&code, ".husky/_"), "{:?}", code.named());
        assert!(!names(&code, "src/m.c"), "{:?}", code.named());
    }

    #[test]
    fn includes_are_code_with_what_they_name() {
        let (_d, code) = repo(
            "printf '[include]\\n\\tpath = tools/more.cfg\\n' > .gitconfig && mkdir tools && \
             printf '[alias]\\n\\tt = !sh tools/t.sh && cd src\\n' > tools/more.cfg && \
             git config include.path ../.gitconfig && \
             git config includeIf.onbranch:feat.path ../feat.cfg && \
             printf '[filter \"x\"]\\n\\tclean = ./scripts/clean\\n' > feat.cfg && \
             git config core.fsmonitor \"$(pwd)/tools/mon --flag\"",
        );
        for p in [
            ".gitconfig",
            "tools/more.cfg",
            "tools/t.sh",
            "feat.cfg",
            "scripts/clean",
            "tools/mon",
            ".git/config",
        ] {
            assert!(names(&code, p), "{p}: {:?}", code.named());
        }
        // A directory an alias enters is not code; nor the rest of the tree.
        for p in ["src/m.c", "tools/other.txt", "notes.txt"] {
            assert!(!names(&code, p), "{p}: {:?}", code.named());
        }
        // The directory holding a named file counts when it is made, moved or removed.
        assert!(names(&code, "tools"));
        assert!(!code.names(Path::new("tools"), false));
    }

    /// An include git followed already is not read again (PoC of route 2: it looped).
    #[test]
    fn one_include_alone_is_read_once() {
        let (_d, code) = repo(
            "printf '[diff]\\n\\tcolorMoved = zebra\\n' > .gitconfig && \
             git config include.path ../.gitconfig",
        );
        assert!(names(&code, ".gitconfig"), "{:?}", code.named());
        assert!(!names(&code, "src/m.c"), "{:?}", code.named());
    }

    #[test]
    fn links_and_stubs_in_the_hooks_directory_lead_to_code() {
        let (_d, code) = repo(
            "mkdir -p tools/git-hooks && echo 'exit 0' > tools/git-hooks/pre-commit && \
             echo 'exit 0' > tools/post && \
             ln -s ../../tools/git-hooks/pre-commit .git/hooks/pre-commit && \
             printf '#!/bin/sh\\nexec tools/post \"$@\"\\n' > .git/hooks/post-checkout && \
             chmod +x .git/hooks/post-checkout",
        );
        for p in ["tools/git-hooks/pre-commit", "tools/post"] {
            assert!(names(&code, p), "{p}: {:?}", code.named());
        }
        assert!(!names(&code, "src/m.c"), "{:?}", code.named());
    }

    #[test]
    fn a_hooks_path_at_the_root_names_hooks_only() {
        let (_d, code) = repo("git config core.hooksPath .");
        assert!(names(&code, "pre-commit"), "{:?}", code.named());
        assert!(!names(&code, "src/m.c"), "{:?}", code.named());
    }

    #[test]
    fn not_a_repository_names_nothing_of_the_project() {
        let d = tempfile::tempdir().unwrap();
        let p = std::fs::canonicalize(d.path()).unwrap();
        std::fs::write(p.join("x"), "x").unwrap();
        let code = GitCode::read(&p).unwrap();
        assert!(!names(&code, "x"), "{:?}", code.named());
    }
}
