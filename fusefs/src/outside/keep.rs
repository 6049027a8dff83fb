//! Keeping outside changes: the chosen paths are written to the host by the accept engine
//! (journal, all or nothing, set-ID bits and file capabilities stripped), after a conflict
//! check against the layer's creation time and an owner check.

use super::{OutsideChange, OutsideChanges, OutsideKind, Owner};
use crate::accept::{self, AcceptError, AcceptOptions, AcceptReport};
use crate::fingerprint::{Base, Fingerprint};
use crate::plan::{Perms, PlanOp, ReadBase};
use crate::state::StateDir;
use std::collections::BTreeMap;
use std::fmt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::RwLock;

/// A kept path the host changed since the command started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutsideConflict {
    /// The host path.
    pub path: PathBuf,
    /// What changed.
    pub reason: String,
}

impl fmt::Display for OutsideConflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {}",
            super::display_path(&self.path, super::home_dir().as_deref()),
            self.reason
        )
    }
}

/// Why nothing was kept (or, for `Accept` after its commit point, not all: see
/// [`AcceptError::nothing_written`]).
#[derive(Debug, thiserror::Error)]
pub enum KeepError {
    /// The host changed under kept paths; nothing was written.
    #[error("{} outside path(s) changed on the host since the command started, nothing kept: {}", .0.len(), list(.0))]
    Conflicts(Vec<OutsideConflict>),
    /// A kept path cannot be kept safely (owner, type); nothing was written.
    #[error("not keeping {}: {reason}", .path.display())]
    Refused { path: PathBuf, reason: String },
    /// The accept engine refused or failed.
    #[error(transparent)]
    Accept(#[from] AcceptError),
}

impl KeepError {
    /// Whether the host is exactly as before.
    pub fn nothing_written(&self) -> bool {
        match self {
            KeepError::Accept(e) => e.nothing_written(),
            _ => true,
        }
    }
}

fn list(c: &[OutsideConflict]) -> String {
    c.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// The standing keep rules in force (the config's `[outside] keep`), absolute.
static STANDING: RwLock<Vec<PathBuf>> = RwLock::new(Vec::new());

/// Says which keep rules are standing ones (the config's `[outside] keep`, expanded), as
/// opposed to those given for one run: a standing rule never keeps a change that makes a
/// program run code (see [`OutsideChange::runs_code`]), since a branch's command could
/// plant one there (an agent's hook, a shell rc file) and have it kept with nobody asked.
/// A path also given for this run is not standing: leave it out.
pub fn set_standing_rules(rules: Vec<PathBuf>) {
    let mut slot = STANDING.write().unwrap_or_else(|e| e.into_inner());
    *slot = rules;
}

fn standing_rules() -> Vec<PathBuf> {
    STANDING.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Home-relative paths (a file, or a directory and all below it) whose contents make a
/// program run code: shells' and editors' start-up files, agents' settings (hooks, MCP
/// servers), git's config and hooks, ssh's rc and authorized keys, desktop autostart,
/// systemd user units, per-user cron, programs on `PATH`, Python's start-up hooks.
const HOME_CODE: &[&str] = &[
    ".profile",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".bashrc",
    ".bash_aliases",
    ".zshrc",
    ".zshenv",
    ".zprofile",
    ".zlogin",
    ".zlogout",
    ".zsh",
    ".oh-my-zsh",
    ".cshrc",
    ".tcshrc",
    ".kshrc",
    ".mkshrc",
    ".xinitrc",
    ".xsession",
    ".xsessionrc",
    ".xprofile",
    ".pam_environment",
    ".config/environment.d",
    ".config/fish",
    ".config/nushell",
    ".config/xonsh",
    ".xonshrc",
    ".envrc",
    ".direnvrc",
    ".config/direnv",
    ".claude",
    ".claude.json",
    ".codex",
    ".gemini",
    ".qwen",
    ".cursor",
    ".continue",
    ".aider.conf.yml",
    ".config/claude",
    ".config/opencode",
    ".config/goose",
    ".config/github-copilot",
    ".vscode",
    ".vscode-server",
    ".config/Code",
    ".config/zed",
    ".gitconfig",
    ".config/git",
    // shade's own config, instructions and memory: the sandbox rules and the prompt of every
    // later session (red team round 8).
    ".config/shade",
    ".githooks",
    ".ssh",
    ".config/autostart",
    ".config/systemd",
    ".local/share/systemd",
    ".config/upstart",
    ".local/bin",
    "bin",
    ".cargo/bin",
    ".cargo/config",
    ".cargo/config.toml",
    ".local/lib",
    ".pythonrc",
    ".pythonstartup",
    ".npmrc",
    ".yarnrc",
    ".yarnrc.yml",
    ".vimrc",
    ".vim",
    ".exrc",
    ".config/nvim",
    ".emacs",
    ".emacs.d",
    ".config/emacs",
    ".tmux.conf",
    ".config/tmux",
    ".screenrc",
    ".inputrc",
    ".gdbinit",
    ".config/gdb",
    ".lldbinit",
    ".mailcap",
    ".config/mimeapps.list",
    ".local/share/applications",
    ".config/kitty",
    ".config/alacritty",
    ".config/wezterm",
    ".wezterm.lua",
    ".config/i3",
    ".config/sway",
    ".config/hypr",
    // Sourced or loaded without being executable (red team round 2): cargo's env script,
    // rc.d directories, editors' plugin trees, REPL start-up directories, build tools' init
    // scripts, and configs that name programs to run (credential helpers, exec plugins,
    // package indexes).
    ".cargo/env",
    ".bashrc.d",
    ".profile.d",
    ".local/share/nvim",
    ".local/share/vim",
    ".local/share/fish",
    ".local/share/zsh",
    ".ipython",
    ".jupyter",
    ".gradle/init.d",
    ".gradle/init.gradle",
    ".gradle/init.gradle.kts",
    ".m2/extensions.xml",
    ".config/pip",
    ".pip",
    ".config/uv",
    ".config/powershell",
    ".Rprofile",
    ".docker/config.json",
    ".config/containers",
    ".kube",
    ".aws/config",
    ".config/gcloud",
];

/// Agents' own directories in the home: code (settings, hooks, MCP servers, commands,
/// plugins, instructions) but for their data ([`AGENT_DATA`]).
const AGENT_DIRS: &[&str] = &[
    ".claude",
    ".codex",
    ".gemini",
    ".qwen",
    ".cursor",
    ".continue",
];

/// What in an agent's directory is its data, never run: transcripts, sessions, to-do
/// lists, logs, caches, its state file and history (a hook or MCP name inside is still
/// code: see [`code_name`]).
const AGENT_DATA: &[&str] = &[
    "projects",
    "sessions",
    "archived_sessions",
    "todos",
    "logs",
    "log",
    "cache",
    "statsig",
    "state.json",
    "history.jsonl",
];

/// Host directories outside any home whose files the system runs or configures (as root a
/// command may write there): system configuration (cron, profile.d, systemd, sudoers),
/// programs and libraries, the spool of cron jobs.
const SYSTEM_CODE: &[&str] = &[
    "/etc",
    "/usr",
    "/opt",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/boot",
    "/var/spool/cron",
    "/var/lib/systemd",
];

/// Whether `rel` (relative to a home) is in [`HOME_CODE`] and not an agent's data.
pub fn home_listed(rel: &Path) -> bool {
    let agent_data = AGENT_DIRS.iter().any(|d| {
        rel.strip_prefix(d)
            .is_ok_and(|inner| AGENT_DATA.iter().any(|data| inner.starts_with(data)))
    });
    !agent_data && HOME_CODE.iter().any(|c| rel.starts_with(c))
}

/// Whether a path of a home (`rel`, relative to it) makes the user's programs run code
/// or configures shade, by where it is: [`HOME_CODE`] (agents' data excepted), or beneath a
/// hidden entry of the home (programs' config and data) a name that marks code (hooks,
/// `*rc`, scripts, autostart entries, …). What a live session holds for the user when its
/// project is, or holds, a home (a project's ordinary files elsewhere in the home are not
/// named: `src/x.py` is no start-up file).
pub fn home_path_runs_code(rel: &Path) -> bool {
    if home_listed(rel) {
        return true;
    }
    let mut names = rel
        .components()
        .map(|c| c.as_os_str().to_str().unwrap_or(""));
    names
        .next()
        .is_some_and(|first| first.len() > 1 && first.starts_with('.'))
        && rel
            .components()
            .filter_map(|c| c.as_os_str().to_str())
            .any(code_name)
}

/// Whether a directory of a home (`rel`, relative to it; empty for the home itself) holds
/// a [`HOME_CODE`] path: making, moving or removing it makes, moves or removes that one.
pub fn home_code_within(rel: &Path) -> bool {
    HOME_CODE.iter().any(|c| Path::new(c).starts_with(rel))
}

/// The host directories outside any home whose files the system runs or configures
/// ([`SYSTEM_CODE`]).
pub fn system_code_dirs() -> &'static [&'static str] {
    SYSTEM_CODE
}

/// A file or directory name that marks code wherever it is: hooks, MCP server lists,
/// git's own config, autostart entries, cron tables, desktop entries.
fn code_name(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n.contains("hook")
        || n.contains("mcp")
        || n.contains("autostart")
        || n.contains("cron")
        || n.ends_with(".desktop")
        || n.ends_with(".service")
        || n.ends_with(".timer")
        || n.ends_with(".pth")
        || n == "sitecustomize.py"
        || n == "usercustomize.py"
        || n == ".envrc"
        || (n.starts_with('.') && n.ends_with("rc"))
        || n.ends_with("profile")
        // Directories whose files a program loads or sources as such.
        || matches!(
            n.as_str(),
            "startup" | "init.d" | "plugin" | "plugins" | "autoload" | "ftplugin" | "after"
        )
        || n.ends_with(".d")
        // Scripts and modules: sourced, imported or loaded by name, executable or not.
        || [
            ".sh", ".bash", ".zsh", ".fish", ".csh", ".ksh", ".lua", ".vim", ".el", ".elc",
            ".py", ".pyc", ".pl", ".pm", ".rb", ".js", ".mjs", ".cjs", ".ts", ".ps1",
            ".so", ".gradle", ".kts",
        ]
        .iter()
        .any(|e| n.ends_with(e))
}

/// Whether `path` (any path; for a project, relative to it) is a file of a git directory
/// that makes git run programs: `config` and `config.worktree` (`core.fsmonitor`,
/// `core.hooksPath`, aliases, filters), `hooks/`, `info/` (attributes name filter
/// drivers; `exclude` hides new files from `git status`: red team round 5), the same in `modules/**` (submodules' git directories) and a
/// linked worktree's `worktrees/*/config*`, and a `.git` that is not a directory (a
/// `gitdir:` file may point git anywhere). Everything else in `.git` (index, objects,
/// refs, logs, HEAD, COMMIT_EDITMSG) is data. The one list for the project (live accepts
/// hold these) and outside writes (flagged, kept only when named).
pub fn git_path_runs_code(path: &Path) -> bool {
    let names: Vec<&std::ffi::OsStr> = path.components().map(|c| c.as_os_str()).collect();
    let Some(at) = names.iter().position(|n| *n == ".git") else {
        return false;
    };
    let inner: Vec<&str> = names[at + 1..]
        .iter()
        .map(|n| n.to_str().unwrap_or("\u{fffd}"))
        .collect();
    !git_data(&inner)
}

/// Whether a path inside a git directory (its components below it) is plain data that git
/// never runs or follows to other places: objects, refs, logs, the index, the heads and
/// messages of operations — also in a submodule's or a worktree's git directory. Everything else (config, hooks, `commondir`, `info/attributes`, a sequencer's
/// or rebase's todo with its `exec` lines, a `.git` that is a file) is held, a list of data
/// rather than of dangers (red team round 3 found `commondir` pointing git at a config the
/// branch wrote). Not data either, though under `objects/` or `refs/` (red team round 4):
/// `refs/replace/` and `info/grafts` (they swap commits, so `git status`, `diff` and `log`
/// hide an edit), `shallow` (cuts history), `objects/info/alternates` and
/// `http-alternates` (objects from elsewhere). A path is data by name only: the caller
/// checks it is a regular file (a link at `logs/HEAD` makes git append to any file), and a
/// `HEAD` with [`git_head_valid`].
pub fn git_data(rest: &[&str]) -> bool {
    const FILES: &[&str] = &[
        "index",
        "HEAD",
        "ORIG_HEAD",
        "FETCH_HEAD",
        "MERGE_HEAD",
        "MERGE_MSG",
        "MERGE_MODE",
        "AUTO_MERGE",
        "CHERRY_PICK_HEAD",
        "REVERT_HEAD",
        "BISECT_LOG",
        "COMMIT_EDITMSG",
        "TAG_EDITMSG",
        "packed-refs",
        "description",
        "gc.log",
    ];
    match rest {
        [] => false,
        ["refs", "replace", ..] => false,
        ["objects", "info", f] if f.contains("alternates") => false,
        ["objects" | "refs" | "logs", ..] => true,
        // Not `info/exclude`: a new pattern there hides a new file from `git status`.
        ["info", "refs"] => true,
        ["modules", name, inner @ ..] if !name.is_empty() => {
            // Submodules nest: modules/a/modules/b/...
            git_data(inner)
        }
        ["worktrees", _, inner @ ..] => git_data(inner),
        [f] => FILES.contains(f) || (f.ends_with(".lock") && FILES.contains(&&f[..f.len() - 5])),
        _ => false,
    }
}

/// The entries whose presence makes git take a directory for a git directory (setup.c's
/// `is_git_directory`: a valid `HEAD`, and `objects/` and `refs/` — or a `commondir` that
/// names where they are). A directory holding [`GIT_DIR_HEAD`] and either
/// [`GIT_DIR_COMMONDIR`] or both of [`GIT_DIR_STORES`] has git-dir shape.
pub const GIT_DIR_HEAD: &str = "HEAD";
/// See [`GIT_DIR_HEAD`]: a linked worktree's or a submodule's git directory names its
/// common directory here.
pub const GIT_DIR_COMMONDIR: &str = "commondir";
/// See [`GIT_DIR_HEAD`]: the object store and the refs.
pub const GIT_DIR_STORES: [&str; 2] = ["objects", "refs"];

/// Whether a directory whose entries are told by `has` has git-dir shape, as git's
/// discovery tests it — more widely (any `HEAD`, valid or not, of any type), so that
/// nothing git could take for a repository is missed. Why: git uses such a directory as
/// a (bare) repository when it meets it, with its `config` and `hooks` — anywhere in a
/// project, not only at `.git` (red team round 4).
pub fn git_dir_shape(has: impl Fn(&str) -> bool) -> bool {
    has(GIT_DIR_HEAD) && (has(GIT_DIR_COMMONDIR) || GIT_DIR_STORES.iter().all(|s| has(s)))
}

/// Whether `content` is a `HEAD` git accepts and follows only into the refs: a symbolic
/// ref `ref: refs/…` (one line, a ref name with no control characters, spaces or `..`)
/// or an object id (40 or 64 hex digits), each with an optional final newline. Why: a
/// `HEAD` git refuses turns its directory into a non-repository, and git's discovery then
/// goes on to the parent directory, which a branch may have shaped as a bare repository
/// (red team round 4).
pub fn git_head_valid(content: &[u8]) -> bool {
    let line = content.strip_suffix(b"\n").unwrap_or(content);
    if let Some(name) = line.strip_prefix(b"ref: refs/") {
        return !name.is_empty()
            && !name.windows(2).any(|w| w == b"..")
            && name.iter().all(|&b| {
                b > b' '
                    && b != 0x7f
                    && !matches!(b, b'~' | b'^' | b':' | b'?' | b'*' | b'[' | b'\\')
            });
    }
    matches!(line.len(), 40 | 64) && line.iter().all(u8::is_ascii_hexdigit)
}

/// The paths a git index (`content`) marks assume-unchanged or skip-worktree, or None if it
/// is not an index this reads (versions 2 to 4, SHA-1 or SHA-256 ids). Why: with such a
/// mark `git status` and `git diff` skip the file, so a branch that sets one hides its edit
/// from the user as a replace ref does (red team round 4); a caller holds an index that
/// marks a path the project's did not.
pub fn git_index_hidden(content: &[u8]) -> Option<std::collections::BTreeSet<Vec<u8>>> {
    [20, 32]
        .into_iter()
        .find_map(|hash| index_hidden(content, hash))
}

/// Whether `file`, a loose object at `objects/<dir>/<name>`, is an object git made: its
/// zlib stream inflates (to at most `max` bytes) to `<type> <size>\0<content>` with a known
/// type and the right size, and hashes (SHA-1 for 40 hex digits, SHA-256 for 64) to
/// `dir` + `name`. Why: git does not check an object's hash when it reads it, so a branch
/// that writes a new object under an id its content does not have (a tree with the agent's
/// edit under the id of a tree git will look up) hides that edit from `git status` and
/// `git diff` (red team round 5).
pub fn git_loose_object_valid(dir: &str, name: &str, file: &[u8], max: usize) -> bool {
    let id = format!("{dir}{name}");
    if dir.len() != 2
        || !matches!(id.len(), 40 | 64)
        || !id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return false;
    }
    let Ok(raw) = miniz_oxide::inflate::decompress_to_vec_zlib_with_limit(file, max) else {
        return false;
    };
    let Some(nul) = raw.iter().position(|&b| b == 0) else {
        return false;
    };
    let header = String::from_utf8_lossy(&raw[..nul]);
    let Some((kind, size)) = header.split_once(' ') else {
        return false;
    };
    if !matches!(kind, "blob" | "tree" | "commit" | "tag")
        || size.parse::<usize>().ok() != Some(raw.len() - nul - 1)
    {
        return false;
    }
    let digest: Vec<u8> = if id.len() == 40 {
        use sha1::Digest;
        sha1::Sha1::digest(&raw).to_vec()
    } else {
        use sha2::Digest;
        sha2::Sha256::digest(&raw).to_vec()
    };
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    hex == id
}

fn index_hidden(b: &[u8], hash: usize) -> Option<std::collections::BTreeSet<Vec<u8>>> {
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
    };
    let u16_at = |at: usize| -> Option<u16> {
        Some(u16::from_be_bytes(b.get(at..at + 2)?.try_into().ok()?))
    };
    if b.get(..4)? != b"DIRC" {
        return None;
    }
    let version = u32_at(4)?;
    if !(2..=4).contains(&version) {
        return None;
    }
    let count = u32_at(8)?;
    let mut at = 12usize;
    let mut hidden = std::collections::BTreeSet::new();
    let mut name: Vec<u8> = Vec::new();
    for _ in 0..count {
        let start = at;
        let flags = u16_at(at + 40 + hash)?;
        at += 40 + hash + 2;
        let mut extended = 0u16;
        if flags & 0x4000 != 0 {
            if version < 3 {
                return None;
            }
            extended = u16_at(at)?;
            at += 2;
        }
        if version == 4 {
            // The name: drop N bytes of the previous one, then a NUL-ended suffix.
            let mut c = *b.get(at)?;
            at += 1;
            let mut strip = usize::from(c & 127);
            while c & 128 != 0 {
                c = *b.get(at)?;
                at += 1;
                strip = strip.checked_add(1)?.checked_mul(128)? + usize::from(c & 127);
            }
            let end = at + b.get(at..)?.iter().position(|&x| x == 0)?;
            name.truncate(name.len().checked_sub(strip)?);
            name.extend_from_slice(&b[at..end]);
            at = end + 1;
        } else {
            let end = at + b.get(at..)?.iter().position(|&x| x == 0)?;
            name = b[at..end].to_vec();
            // Entries are padded with 1 to 8 NULs to a multiple of 8 bytes.
            at = start + ((end - start + 8) & !7);
        }
        let len = usize::from(flags & 0x0fff);
        if (len < 0x0fff && len != name.len()) || name.is_empty() {
            return None;
        }
        if flags & 0x8000 != 0 || extended & 0x4000 != 0 {
            hidden.insert(name.clone());
        }
    }
    // Extensions and the trailing checksum follow.
    (b.len() >= at + hash).then_some(hidden)
}

impl OutsideChange {
    /// Whether keeping this change could make a program run code the branch chose: a
    /// start-up or config file of a shell, an agent, an editor, git or ssh, a hook, an
    /// autostart entry, a cron table, a systemd unit, an executable (by path, see
    /// [`HOME_CODE`], [`SYSTEM_CODE`], or mode). Deletions run nothing. Such a change is
    /// flagged in the listing and kept only when named for this run.
    pub fn runs_code(&self, home: Option<&Path>) -> bool {
        if self.kind == OutsideKind::Deleted {
            return false;
        }
        let p = &self.path;
        if !self.is_dir && self.mode_new.is_some_and(|m| m & 0o111 != 0) {
            return true;
        }
        if let Some(rel) = home.and_then(|h| p.strip_prefix(h).ok()) {
            if home_listed(rel) {
                return true;
            }
        } else if SYSTEM_CODE.iter().any(|d| p.starts_with(d)) {
            return true;
        }
        if git_path_runs_code(p) {
            return true;
        }
        p.components()
            .filter_map(|c| c.as_os_str().to_str())
            .any(code_name)
    }
}

/// What a keep wrote.
#[derive(Clone, Debug, Default)]
pub struct KeepReport {
    /// The host paths written (or deleted).
    pub kept: Vec<PathBuf>,
    /// The accept engine's report (paths relative to `root`).
    pub accept: AcceptReport,
    /// The directory the engine worked in (the kept paths' common ancestor).
    pub root: PathBuf,
}

fn refused(path: &Path, reason: impl Into<String>) -> KeepError {
    KeepError::Refused {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

fn owner_of(m: &std::fs::Metadata) -> Owner {
    Owner {
        uid: m.uid(),
        gid: m.gid(),
    }
}

/// The plan, its root and what it checks, before anything is written.
struct Planned {
    root: PathBuf,
    plan: Vec<PlanOp>,
    reads: Vec<ReadBase>,
    picked: Vec<usize>,
}

impl OutsideChanges {
    /// Indices of the changes `keep` selects: a path, or everything under a directory
    /// prefix (absolute paths; the caller expands `~`), plus the new directories they need.
    /// A change that makes a program run code ([`OutsideChange::runs_code`]) is selected
    /// only by a rule given for this run (`--keep-outside`, a pick), never by a standing
    /// one ([`set_standing_rules`]).
    pub fn selected(&self, keep: &[PathBuf]) -> Vec<usize> {
        let standing = standing_rules();
        let home = super::home_dir();
        let mut picked: Vec<usize> = (0..self.changes.len())
            .filter(|i| {
                let c = &self.changes[*i];
                keep.iter().any(|k| {
                    c.path.starts_with(k)
                        && (!standing.contains(k) || !c.runs_code(home.as_deref()))
                })
            })
            .collect();
        let mut need = Vec::new();
        for i in &picked {
            for a in self.changes[*i].path.ancestors().skip(1) {
                if let Some(j) = self.changes.iter().position(|c| {
                    c.path == a
                        && c.is_dir
                        && matches!(c.kind, OutsideKind::Added | OutsideKind::TypeChanged)
                }) {
                    need.push(j);
                }
            }
        }
        picked.extend(need);
        picked.sort_unstable();
        picked.dedup();
        picked
    }

    /// Would [`OutsideChanges::keep`] refuse `keep` now? The same checks, writing nothing.
    pub fn check_keep(&self, keep: &[PathBuf]) -> Result<(), KeepError> {
        let p = self.plan(keep)?;
        if p.plan.is_empty() {
            return Ok(());
        }
        // `keep` guards the state directory when it applies (the caller names it there).
        accept::check_plan(&p.root, &p.plan, &p.reads, false, None, None)?;
        Ok(())
    }

    /// Write the changes `keep` selects to the host, all or nothing, journaled in `state`
    /// (a crash mid-way is finished or undone by `shade recover` like any accept). Refused,
    /// with nothing written, when the host changed under one of them since the command
    /// started, or a new owner is not one the user may give.
    pub fn keep(&mut self, keep: &[PathBuf], state: &StateDir) -> Result<KeepReport, KeepError> {
        let p = self.plan(keep)?;
        if p.plan.is_empty() {
            return Ok(KeepReport::default());
        }
        let report = accept::apply(
            &p.root,
            p.plan,
            &AcceptOptions {
                force: false,
                state: state.clone(),
                reads: p.reads,
                own: None,
            },
        )?;
        let mut kept = Vec::new();
        for i in p.picked {
            let c = &mut self.changes[i];
            let left_out = report
                .not_applied
                .iter()
                .any(|n| p.root.join(&n.path) == c.path);
            if !left_out {
                c.kept = true;
                kept.push(c.path.clone());
            }
        }
        Ok(KeepReport {
            kept,
            accept: report,
            root: p.root,
        })
    }

    fn plan(&self, keep: &[PathBuf]) -> Result<Planned, KeepError> {
        let Some(layer) = &self.layer else {
            return Ok(Planned {
                root: PathBuf::new(),
                plan: Vec::new(),
                reads: Vec::new(),
                picked: Vec::new(),
            });
        };
        let created = i64::try_from(layer.created_ns).unwrap_or(i64::MAX);
        let picked = self.selected(keep);
        let euid = nix::unistd::geteuid().as_raw();
        let egid = nix::unistd::getegid().as_raw();
        let root_user = euid == 0;
        // New owners of the directories the plan creates: their children may take them.
        let mut planned_owner: BTreeMap<PathBuf, Owner> = BTreeMap::new();
        let mut conflicts = Vec::new();
        let mut writes = Vec::new();
        let mut deletes = Vec::new();
        let mut reads = Vec::new();
        let conflict = |c: &OutsideChange, reason: &str| OutsideConflict {
            path: c.path.clone(),
            reason: reason.to_string(),
        };
        for &i in &picked {
            let c = &self.changes[i];
            let host = std::fs::symlink_metadata(&c.path).ok();
            // The host must still be what the branch started from.
            let base = match (c.kind, &host) {
                (OutsideKind::Added, None) => Base::Absent,
                (OutsideKind::Added, Some(_)) => {
                    conflicts.push(conflict(c, "created on the host meanwhile"));
                    continue;
                }
                (_, None) => {
                    conflicts.push(conflict(c, "deleted on the host meanwhile"));
                    continue;
                }
                (_, Some(h)) => {
                    let ctime = h.ctime() * 1_000_000_000 + h.ctime_nsec();
                    let mtime = h.mtime() * 1_000_000_000 + h.mtime_nsec();
                    let same_type = c
                        .mode_old
                        .is_some_and(|m| m & libc::S_IFMT == h.mode() & libc::S_IFMT);
                    if ctime > created || mtime > created || !same_type {
                        conflicts
                            .push(conflict(c, "changed on the host since the command started"));
                        continue;
                    }
                    Base::Present(Fingerprint::from_metadata(h))
                }
            };
            if c.kind == OutsideKind::Deleted {
                if let Base::Present(fp) = base {
                    if fp.is_dir() {
                        reads.push((c.path.clone(), fp));
                    }
                }
                deletes.push((c.path.clone(), base));
                continue;
            }
            let Some(upper) = &c.upper else {
                continue;
            };
            if c.redirected {
                return Err(refused(
                    &c.path,
                    "a directory renamed in the branch (its contents come from elsewhere); copy it by hand",
                ));
            }
            let Some(new_owner) = c.owner_new else {
                return Err(refused(&c.path, "its owner is an id outside the sandbox"));
            };
            let um = std::fs::symlink_metadata(upper).map_err(|e| {
                KeepError::Accept(AcceptError::Io {
                    path: upper.clone(),
                    source: e,
                })
            })?;
            if c.kind == OutsideKind::TypeChanged
                && (um.is_dir() || host.as_ref().is_some_and(|h| h.is_dir()))
            {
                return Err(refused(
                    &c.path,
                    "a directory replaced by a file or the other way round; replace it by hand",
                ));
            }
            if um.file_type().is_block_device() || um.file_type().is_char_device() {
                return Err(refused(&c.path, "a device node"));
            }
            // Owners: the host path's, its parent directory's for a new path, or ours.
            let parent = c.path.parent().unwrap_or(Path::new("/"));
            let parent_owner = planned_owner.get(parent).copied().or_else(|| {
                std::fs::symlink_metadata(parent)
                    .ok()
                    .filter(|m| m.is_dir())
                    .map(|m| owner_of(&m))
            });
            let Some(parent_owner) = parent_owner else {
                conflicts.push(conflict(c, "its parent directory is gone on the host"));
                continue;
            };
            let current = host.as_ref().map(owner_of);
            let uid_ok = new_owner.uid == euid
                || current.is_some_and(|o| o.uid == new_owner.uid)
                || (current.is_none() && parent_owner.uid == new_owner.uid);
            let gid_ok = new_owner.gid == egid
                || current.is_some_and(|o| o.gid == new_owner.gid)
                || (current.is_none() && parent_owner.gid == new_owner.gid);
            if !uid_ok || !gid_ok {
                return Err(refused(
                    &c.path,
                    format!(
                        "the branch gives it owner {}:{}, which is neither its owner on the host, \
                         its parent directory's, nor yours",
                        new_owner.uid, new_owner.gid
                    ),
                ));
            }
            if um.is_dir() {
                planned_owner.insert(c.path.clone(), new_owner);
            }
            let xattrs = super::user_xattrs(upper);
            // `..Perms::default()` is for fields other branches add to the plan (h1's
            // `origin`): needless here, needed once they are merged.
            #[allow(clippy::needless_update)]
            let perms = Perms {
                mode: um.mode() & 0o7777,
                uid: root_user.then_some(new_owner.uid),
                gid: root_user.then_some(new_owner.gid),
                times: Some(((um.atime(), um.atime_nsec()), (um.mtime(), um.mtime_nsec()))),
                xattrs: Some(xattrs),
                // Any field the plan grows (a renamed object's origin…) stays unset: a kept
                // path is never a rename.
                ..Perms::default()
            };
            let path = c.path.clone();
            let op = {
                let ft = um.file_type();
                if ft.is_dir() {
                    if c.kind == OutsideKind::Added {
                        PlanOp::Mkdir {
                            path,
                            perms: perms.clone(),
                            base,
                            base_at: None,
                        }
                    } else {
                        PlanOp::SetPerms {
                            path,
                            perms: Perms {
                                // The host directory's own attributes stay unless the branch
                                // changed them.
                                xattrs: if c.xattrs_changed {
                                    perms.xattrs.clone()
                                } else {
                                    None
                                },
                                times: None,
                                ..perms.clone()
                            },
                            base,
                            base_at: None,
                        }
                    }
                } else if ft.is_symlink() {
                    PlanOp::Symlink {
                        path,
                        target: c.target_new.clone().unwrap_or_default(),
                        base,
                        base_at: None,
                    }
                } else if ft.is_file() {
                    // A metadata-only copy-up keeps its content in the host file.
                    let from = if c.metacopy { &c.path } else { upper };
                    let content = std::fs::OpenOptions::new()
                        .read(true)
                        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                        .open(from)
                        .map_err(|e| {
                            KeepError::Accept(AcceptError::Io {
                                path: from.clone(),
                                source: e,
                            })
                        })?;
                    PlanOp::WriteFile {
                        path,
                        content,
                        perms: perms.clone(),
                        base,
                        base_at: None,
                    }
                } else {
                    PlanOp::Special {
                        path,
                        mode: um.mode(),
                        rdev: 0,
                        perms: perms.clone(),
                        base,
                        base_at: None,
                    }
                }
            };
            writes.push(op);
        }
        if !conflicts.is_empty() {
            return Err(KeepError::Conflicts(conflicts));
        }
        // One accept for all of them, in their common ancestor.
        let mut all: Vec<&Path> = writes.iter().map(|op| op.path().as_path()).collect();
        all.extend(deletes.iter().map(|(p, _)| p.as_path()));
        let Some(first) = all.first() else {
            return Ok(Planned {
                root: PathBuf::new(),
                plan: Vec::new(),
                reads: Vec::new(),
                picked,
            });
        };
        let mut anc = first.parent().unwrap_or(Path::new("/")).to_path_buf();
        for p in &all {
            while !p.starts_with(&anc) || *p == anc {
                match anc.parent() {
                    Some(a) => anc = a.to_path_buf(),
                    None => break,
                }
            }
        }
        let root = std::fs::canonicalize(&anc).map_err(|e| {
            KeepError::Accept(AcceptError::Io {
                path: anc.clone(),
                source: e,
            })
        })?;
        let rel = |p: &Path| {
            p.strip_prefix(&anc)
                .map(Path::to_path_buf)
                .unwrap_or_default()
        };
        let mut plan = Vec::new();
        for mut op in writes {
            let r = rel(op.path());
            if let Some(path) = op.path_mut() {
                *path = r;
            }
            plan.push(op);
        }
        // Deletions deepest first, after the writes.
        deletes.sort_by(|a, b| b.0.cmp(&a.0));
        for (p, base) in deletes {
            plan.push(PlanOp::Delete {
                path: rel(&p),
                base,
                base_at: None,
            });
        }
        let reads = reads
            .into_iter()
            .map(|(p, fp)| ReadBase {
                path: rel(&p),
                seen: fp,
                listing: false,
                subtree_since: Some(created),
            })
            .collect();
        Ok(Planned {
            root,
            plan,
            reads,
            picked,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(path: &str, mode: u32) -> OutsideChange {
        OutsideChange {
            path: PathBuf::from(path),
            kind: OutsideKind::Added,
            is_dir: false,
            size_old: None,
            mode_old: None,
            owner_old: None,
            target_old: None,
            size_new: Some(1),
            mode_new: Some(0o100000 | mode),
            owner_new: None,
            target_new: None,
            foreign_owner: false,
            upper: None,
            redirected: false,
            metacopy: false,
            xattrs_changed: false,
            kept: false,
            host_hidden: false,
        }
    }

    #[test]
    fn code_is_told_from_data() {
        let home = Some(Path::new("/home/u"));
        for p in [
            "/home/u/.bashrc",
            "/home/u/.claude/settings.json",
            "/home/u/.claude/hooks/x.sh",
            "/home/u/.codex/config.toml",
            "/home/u/.config/systemd/user/x.service",
            "/home/u/.ssh/authorized_keys",
            "/home/u/.gitconfig",
            "/home/u/src/p/.git/hooks/pre-commit",
            "/home/u/.config/autostart/x.desktop",
            "/home/u/.claude/projects/mcp.json",
            "/home/u/.local/bin/tool",
            "/etc/cron.d/x",
            "/usr/local/lib/x.so",
            // Sourced or loaded though not executable (red team round 2).
            "/home/u/.cargo/env",
            "/home/u/.bashrc.d/x",
            "/home/u/.local/share/nvim/site/plugin/x.vim",
            "/home/u/.ipython/profile_default/startup/00.py",
            "/home/u/.gradle/init.d/x.gradle",
            "/home/u/.kube/config",
            "/home/u/.aws/config",
            "/home/u/.config/pip/pip.conf",
            "/home/u/tools/x.sh",
            "/home/u/.config/foo/conf.d/x.conf",
        ] {
            assert!(change(p, 0o644).runs_code(home), "{p} runs code");
        }
        for p in [
            "/home/u/.claude/state.json",
            "/home/u/.claude/projects/p/t.jsonl",
            "/home/u/notes.txt",
            "/home/u/.cache/pip/x",
            "/tmp/x",
        ] {
            assert!(!change(p, 0o644).runs_code(home), "{p} is data");
        }
        assert!(change("/home/u/notes.txt", 0o755).runs_code(home));
        let mut gone = change("/home/u/.bashrc", 0o644);
        gone.kind = OutsideKind::Deleted;
        assert!(!gone.runs_code(home));
    }

    /// Red team round 8: what a live session holds in a home it edits as its project.
    #[test]
    fn home_paths_that_run_code_are_told_by_place() {
        for p in [
            ".bashrc",
            ".config/shade/config.toml",
            ".config/shade/AGENTS.md",
            ".gitconfig",
            ".config/git/config",
            ".local/bin/x",
            ".config/foo/hooks/x",
            ".hgrc",
            ".mytool/init.lua",
        ] {
            assert!(home_path_runs_code(Path::new(p)), "{p} runs code");
        }
        for p in [
            "src/x.rs",
            "src/x.py",
            "proj/tools/build.sh",
            "notes.txt",
            ".notes.txt",
            ".config/foo/settings.json",
            ".claude/projects/p/t.jsonl",
        ] {
            assert!(!home_path_runs_code(Path::new(p)), "{p} is data");
        }
        assert!(home_code_within(Path::new("")));
        assert!(home_code_within(Path::new(".config")));
        assert!(home_code_within(Path::new(".local")));
        assert!(!home_code_within(Path::new("src")));
        assert!(!home_code_within(Path::new(".cache")));
    }

    #[test]
    fn git_code_is_told_from_git_data() {
        for p in [
            ".git/config",
            ".git/config.worktree",
            ".git/hooks/pre-commit",
            ".git/info/attributes",
            ".git/modules/sub/config",
            ".git/modules/a/modules/b/hooks/post-checkout",
            ".git/worktrees/w/config.worktree",
            "sub/.git/config",
            ".git",
            // Red team round 3: git follows these to a config or runs their lines.
            ".git/commondir",
            ".git/modules/sub/commondir",
            ".git/worktrees/w/commondir",
            ".git/rebase-merge/git-rebase-todo",
            ".git/sequencer/todo",
            // Red team round 4: they hide commits or fetch objects from elsewhere.
            ".git/refs/replace/0123456789012345678901234567890123456789",
            ".git/modules/sub/refs/replace/x",
            ".git/info/grafts",
            ".git/shallow",
            ".git/shallow.lock",
            ".git/objects/info/alternates",
            ".git/objects/info/http-alternates",
            // Red team round 5: a pattern there hides a new file from `git status`.
            ".git/info/exclude",
            ".git/modules/sub/info/exclude",
        ] {
            assert!(git_path_runs_code(Path::new(p)), "{p} runs code");
        }
        for p in [
            ".git/index",
            ".git/objects/ab/cdef",
            ".git/refs/heads/main",
            ".git/logs/HEAD",
            ".git/HEAD",
            ".git/COMMIT_EDITMSG",
            ".git/modules/sub/index",
            ".git/packed-refs",
            ".git/index.lock",
            ".git/worktrees/w/HEAD",
            "config",
            "src/hooks/x.rs",
            ".git/objects/info/packs",
            ".git/objects/info/commit-graph",
            ".git/refs/heads/replace",
            ".git/logs/refs/replace/x",
        ] {
            assert!(!git_path_runs_code(Path::new(p)), "{p} is data");
        }
    }

    /// Indexes as real git writes them (versions 2, 3, 4; SHA-1 and SHA-256): the marks
    /// that hide a file from `git status` are read, an index without them has none.
    #[test]
    #[allow(clippy::unwrap_used)]
    fn index_marks_that_hide_edits_are_read() {
        for (format, version) in [
            ("sha1", "2"),
            ("sha1", "4"),
            ("sha256", "2"),
            ("sha256", "4"),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let git = |args: &[&str]| {
                let o = std::process::Command::new("git")
                    .args(args)
                    .current_dir(dir.path())
                    .output()
                    .unwrap();
                assert!(o.status.success(), "git {args:?}: {o:?}");
            };
            git(&["init", "-q", &format!("--object-format={format}"), "."]);
            for f in ["a.txt", "dir/b.txt", "dir/c.txt", "z"] {
                std::fs::create_dir_all(dir.path().join(f).parent().unwrap()).unwrap();
                std::fs::write(dir.path().join(f), f).unwrap();
            }
            git(&["add", "."]);
            git(&["update-index", "--index-version", version]);
            let index = || std::fs::read(dir.path().join(".git/index")).unwrap();
            let none = git_index_hidden(&index()).unwrap();
            assert!(none.is_empty(), "{format} v{version}: {none:?}");
            git(&["update-index", "--assume-unchanged", "dir/b.txt"]);
            git(&["update-index", "--skip-worktree", "z"]);
            let hidden = git_index_hidden(&index()).unwrap();
            let want: std::collections::BTreeSet<Vec<u8>> =
                [b"dir/b.txt".to_vec(), b"z".to_vec()].into();
            assert_eq!(hidden, want, "{format} v{version}");
        }
        assert!(git_index_hidden(b"DIRC\0\0\0\x02\0\0\0\x05junk").is_none());
        assert!(git_index_hidden(b"not an index").is_none());
    }

    /// Loose objects as real git writes them (SHA-1 and SHA-256) hash to their names; the
    /// same bytes under another object's name, a corrupt stream or a lying header do not.
    #[test]
    #[allow(clippy::unwrap_used)]
    fn loose_objects_are_checked_against_their_names() {
        for format in ["sha1", "sha256"] {
            let dir = tempfile::tempdir().unwrap();
            let git = |args: &[&str]| {
                let o = std::process::Command::new("git")
                    .args(args)
                    .current_dir(dir.path())
                    .output()
                    .unwrap();
                assert!(o.status.success(), "git {args:?}: {o:?}");
                String::from_utf8(o.stdout).unwrap().trim().to_string()
            };
            git(&["init", "-q", &format!("--object-format={format}"), "."]);
            std::fs::write(dir.path().join("a.txt"), "one\n").unwrap();
            std::fs::write(dir.path().join("b.txt"), "two\n").unwrap();
            let a = git(&["hash-object", "-w", "a.txt"]);
            let b = git(&["hash-object", "-w", "b.txt"]);
            git(&["add", "."]);
            let tree = git(&["write-tree"]);
            let read = |id: &str| {
                std::fs::read(
                    dir.path()
                        .join(".git/objects")
                        .join(&id[..2])
                        .join(&id[2..]),
                )
                .unwrap()
            };
            for id in [&a, &b, &tree] {
                assert!(
                    git_loose_object_valid(&id[..2], &id[2..], &read(id), 1 << 20),
                    "{format} {id}"
                );
            }
            assert!(!git_loose_object_valid(
                &a[..2],
                &a[2..],
                &read(&b),
                1 << 20
            ));
            assert!(!git_loose_object_valid(&a[..2], &a[2..], b"junk", 1 << 20));
            assert!(!git_loose_object_valid(
                &tree[..2],
                &tree[2..],
                &read(&tree),
                8
            ));
        }
    }

    #[test]
    fn git_dir_shape_is_what_git_discovery_accepts_or_more() {
        let shape = |names: &[&str]| git_dir_shape(|n| names.contains(&n));
        assert!(shape(&["HEAD", "objects", "refs"]));
        assert!(shape(&["HEAD", "objects", "refs", "config", "index"]));
        // A linked worktree's or a submodule's git directory.
        assert!(shape(&["HEAD", "commondir"]));
        assert!(!shape(&["objects", "refs", "config"]));
        assert!(!shape(&["HEAD", "objects"]));
        assert!(!shape(&["HEAD", "refs", "logs"]));
        assert!(!shape(&["HEAD", "src", "README"]));
    }

    #[test]
    fn a_valid_git_head_is_a_ref_or_an_object_id() {
        for ok in [
            &b"ref: refs/heads/main\n"[..],
            b"ref: refs/heads/main",
            b"ref: refs/heads/x;id>M;\n",
            b"0123456789abcdef0123456789abcdef01234567\n",
            b"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        ] {
            assert!(git_head_valid(ok), "{}", String::from_utf8_lossy(ok));
        }
        for bad in [
            &b"tidy: 1\n"[..],
            b"",
            b"ref: refs/",
            b"ref: heads/main\n",
            b"ref: refs/heads/main\nmore\n",
            b"ref: refs/../config\n",
            b"ref: refs/heads/a b\n",
            b"ref: refs/heads/main\n\n",
            b"0123456789abcdef0123456789abcdef0123456\n",
            b"0123456789abcdef0123456789abcdef0123456g\n",
        ] {
            assert!(!git_head_valid(bad), "{}", String::from_utf8_lossy(bad));
        }
    }
}
