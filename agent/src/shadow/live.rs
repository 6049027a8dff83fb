//! Live mode: a session that edits the project as it works, yet through the accept engine.
//! Every tool call runs in a branch ([`Shadow`]); a call that changed files is accepted
//! into the project right after it ran (conflict-checked, journaled, recorded in the
//! history under the session's origin, so `/undo` can take it back — shell-made changes
//! included), and the branch is renewed. The user sees edits appear as the agent works,
//! as with direct writes, but commands run in the branch's sandbox.
//!
//! - **Conflict**: a path the call changed that the user changed meanwhile keeps the branch
//!   pending — nothing written, neither edit lost; the user is told in one line, the model
//!   in the tool result; later calls go on in that branch, each accept retried, until the
//!   user resolves it (`/accept` after reconciling, `/abort`).
//! - **Code for the host**: a change that could make programs run code or write where the
//!   branch chose when the user works in the project (`.git/config`, `.git/hooks/…`: a
//!   sandboxed command could set `core.fsmonitor` for the user's next `git status`; a
//!   bare-repository shape anywhere in the project; a symbolic link; with the home as the
//!   project, `~/.bashrc`, `~/.local/bin/…` and shade's own `~/.config/shade/config.toml`;
//!   see [`held_changes`])
//!   is never accepted automatically: it is held pending like a conflict, the user is told
//!   which paths, the model in the tool result; `/accept` writes it (after `/diff`),
//!   `/abort` drops it. What is accepted live is an allowlist over the whole change set:
//!   regular files and directories, and in git directories only git's data (index,
//!   objects, refs, logs, a valid `HEAD`).
//! - **Outside the project**: commands' writes there land in one outside layer for the
//!   whole session (it outlives the renewed branches); listed after each turn, never
//!   written to the host except by the user's keep rules.

use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use shade_fusefs::{AcceptError, AcceptFlags, AcceptReport, StateDir};
use tokio_util::sync::CancellationToken;

mod git_code;
mod host_code;

use super::{Shadow, ShadowError, ShadowOptions};
use crate::llm::{BoxFuture, ToolSpec};
use crate::runner::lock;
use crate::tools::{Prepared, Tool, ToolContext, ToolError, ToolKind, ToolOutput, ToolRegistry};

/// What the session's accepts write: everything the call changed, build output under
/// ignored paths included (direct writes put it in the project too).
const FLAGS: AcceptFlags = AcceptFlags {
    include_ignored: true,
    force: false,
};

/// A session's live branch: the current [`Shadow`], renewed after each accept, and the
/// outside layer all of them share. Dropping it drops the branch and the layer.
pub struct Live {
    project: PathBuf,
    options: ShadowOptions,
    /// `<state>/branches/<id>/`: holds `owner` (so a dead session's layer is cleaned up
    /// like a branch's) and `outside/`.
    dir: PathBuf,
    state: Mutex<State>,
    /// How accepts are named in the history (the session and the turn); None: the
    /// process's origin (its command line).
    origin: Mutex<Option<String>>,
    /// Lines for the user since the last [`Live::take_notices`] (conflicts, failures).
    notices: Mutex<Vec<String>>,
}

#[derive(Default)]
struct State {
    shadow: Option<Shadow>,
    /// The branch holds changes whose accept was refused (a conflict) or held (code).
    pending: bool,
    /// The user asked for the accept (`/accept`): held changes go in too.
    confirmed: bool,
    /// Time of each tool-call accept, for `SHADE_LIVE_TIMING`.
    accepts: Vec<Duration>,
}

/// What happened after a tool call.
#[derive(Debug)]
pub enum AfterCall {
    /// Nothing changed in the project.
    Nothing,
    /// The call's changes are in the project.
    Accepted(AcceptReport, usize),
    /// Refused: the branch keeps them (see [`Live`]).
    Pending(String),
}

impl Live {
    /// Mount the first branch of `project` (canonical) with `options`.
    pub fn start(project: &Path, options: ShadowOptions) -> Result<Arc<Live>, ShadowError> {
        let state = options.branch.state.clone();
        let dir = live_dir(&state, project)?;
        let shadow = Shadow::create_with_outside(project, options.clone(), dir.join("outside"))?;
        note_branch(&dir, &shadow);
        Ok(Arc::new(Live {
            project: shadow.project().to_path_buf(),
            options,
            dir,
            state: Mutex::new(State {
                shadow: Some(shadow),
                ..State::default()
            }),
            origin: Mutex::new(None),
            notices: Mutex::new(Vec::new()),
        }))
    }

    /// The project (canonical).
    pub fn project(&self) -> &Path {
        &self.project
    }

    /// Name the accepts from now on in the history (`chat session X turn N`).
    pub fn set_origin(&self, origin: String) {
        *lock(&self.origin) = Some(origin);
    }

    /// `tools` with every tool running in the live branch (see [`LiveTool`]).
    pub fn wrap(self: &Arc<Live>, tools: &ToolRegistry) -> ToolRegistry {
        let mut out = ToolRegistry::empty();
        for name in tools.names() {
            if let Some(t) = tools.get(name) {
                out.add(Arc::new(LiveTool {
                    inner: t,
                    live: self.clone(),
                }));
            }
        }
        out
    }

    /// Run `f` with the current branch (None when it could not be renewed).
    pub fn with_shadow<T>(&self, f: impl FnOnce(Option<&Shadow>) -> T) -> T {
        f(lock(&self.state).shadow.as_ref())
    }

    /// Whether the branch holds changes an accept refused.
    pub fn pending(&self) -> bool {
        lock(&self.state).pending
    }

    /// The lines for the user gathered since the last call.
    pub fn take_notices(&self) -> Vec<String> {
        std::mem::take(&mut *lock(&self.notices))
    }

    /// The durations of the accepts so far (for measuring).
    pub fn accept_times(&self) -> Vec<Duration> {
        lock(&self.state).accepts.clone()
    }

    /// `base` pointed at the current branch: files there, `shell` in its sandbox; the todo
    /// list and the lint hook stay the session's.
    fn context(&self, base: &ToolContext) -> Result<ToolContext, ToolError> {
        let st = lock(&self.state);
        let Some(shadow) = st.shadow.as_ref() else {
            return Err(ToolError::Failed(
                "the session's branch could not be renewed after the last accept; nothing can \
                 run (see the message shown to the user)"
                    .into(),
            ));
        };
        let mut ctx = shadow.tool_context(base);
        ctx.todos = base.todos.clone();
        ctx.lint = base.lint.clone();
        Ok(ctx)
    }

    /// After a call (or a turn): accept what the branch changed into the project and renew
    /// the branch; on a conflict keep it. Blocking.
    pub fn settle(&self) -> AfterCall {
        let mut st = lock(&self.state);
        let Some(shadow) = st.shadow.as_ref() else {
            return AfterCall::Nothing;
        };
        if shadow.changeset(true).changes.is_empty() {
            return AfterCall::Nothing;
        }
        // What is checked must be what is accepted: nothing may write in the branch between
        // (a command left in the background could put a link where a file was checked).
        // The accept would kill them anyway.
        shadow.kill_commands();
        let changes = shadow.changeset(true);
        let n = changes.changes.len();
        if n == 0 {
            return AfterCall::Nothing;
        }
        // Git's configuration as the project has it now (the call's own edits of it are
        // held below): which of the project's files it makes code.
        let code = git_code::GitCode::read(&self.project).map_err(|e| {
            lock(&self.notices).push(format!(
                "cannot tell which files git's configuration runs ({e}): every change waits"
            ));
        });
        let held = match (
            shade_fusefs::rootdir::RootDir::open(&shadow.mountpoint()),
            shade_fusefs::rootdir::RootDir::open(&self.project),
            code,
        ) {
            (Ok(branch), Ok(project), Ok(code)) => {
                let host = host_code::HostCode::read(&self.project);
                held_changes(&changes, &branch, &project, &code, &host)
            }
            // Nothing can be vouched for: all of it waits for the user.
            _ => (0..n).collect(),
        };
        if !held.is_empty() && !st.confirmed {
            return self.accept_holding(&mut st, changes, &held);
        }
        if let Err(e) = shadow.check_accept(FLAGS) {
            st.pending = true;
            let line = refusal(&e, n);
            lock(&self.notices).push(line.clone());
            return AfterCall::Pending(line);
        }
        self.accept_locked(&mut st, n)
    }

    /// `/accept` of a pending branch: the same accept, now (refused again while the
    /// conflict stands).
    /// Changes held ([`held_changes`]) go in now: the user asked.
    pub fn accept_now(&self) -> AfterCall {
        lock(&self.state).confirmed = true;
        let out = self.settle();
        lock(&self.state).confirmed = false;
        out
    }

    /// `/abort`: drop the branch's changes and go on in a fresh branch.
    pub fn abort(&self) -> usize {
        let mut st = lock(&self.state);
        let n = st
            .shadow
            .as_ref()
            .map(|s| s.changeset(true).changes.len())
            .unwrap_or(0);
        if let Some(s) = st.shadow.take() {
            s.abort();
        }
        st.pending = false;
        self.renew(&mut st);
        n
    }

    /// A call whose changes include code for the host ([`held_changes`]): the rest is
    /// accepted (the engine's selected accept), the held files are carried into the
    /// renewed branch, pending, for `/diff`, `/accept`, `/abort`. Whatever cannot be carried
    /// (not a small regular file) or a refused accept keeps the whole branch pending.
    fn accept_holding(
        &self,
        st: &mut State,
        changes: shade_fusefs::Changeset,
        held: &[usize],
    ) -> AfterCall {
        let n = changes.changes.len();
        let paths: Vec<PathBuf> = held
            .iter()
            .map(|&i| changes.changes[i].path.clone())
            .collect();
        let line = held_line(&paths, n);
        let hold_all = |st: &mut State| {
            st.pending = true;
            lock(&self.notices).push(line.clone());
            AfterCall::Pending(line.clone())
        };
        let Some(copies) = st
            .shadow
            .as_ref()
            .and_then(|s| carry(&s.mountpoint(), held.iter().map(|&i| &changes.changes[i])))
        else {
            return hold_all(st);
        };
        let Some(shadow) = st.shadow.take() else {
            return AfterCall::Nothing;
        };
        if let Some(origin) = lock(&self.origin).clone() {
            shade_fusefs::accept::history::set_origin(origin);
        }
        let Some((branch, leftover)) = shadow.into_branch() else {
            self.renew(st);
            return AfterCall::Nothing;
        };
        let mut sel = branch.selection(changes);
        // A change that cannot go in without a held one would be lost (it is not carried):
        // then the whole call stays pending.
        let mut dragged = false;
        for &i in held {
            dragged |= sel.set(i, false).iter().any(|k| !held.contains(k));
        }
        let picked = sel.picked_count();
        if dragged || picked == 0 || branch.check_accept_selected(FLAGS, &sel).is_err() {
            drop(leftover);
            self.keep(st, branch);
            return hold_all(st);
        }
        let started = Instant::now();
        let accepted = branch.accept_selected(FLAGS, &sel);
        drop(leftover);
        st.accepts.push(started.elapsed());
        self.renew(st);
        let planted = st
            .shadow
            .as_ref()
            .map(|s| plant(&s.mountpoint(), &copies))
            .unwrap_or_else(|| Err(std::io::Error::other("no branch")));
        if let Err(e) = &planted {
            lock(&self.notices).push(format!(
                "the held changes could not be kept in the new branch ({e}); they were dropped, \
                 nothing of them written to the project"
            ));
        } else {
            st.pending = true;
        }
        let line = match accepted {
            Ok(_) => format!(
                "{} accepted; {line}",
                crate::tools::text::plural(picked, "change")
            ),
            Err(e) => format!("the accept of the rest failed ({e}); {line}"),
        };
        lock(&self.notices).push(line.clone());
        AfterCall::Pending(line)
    }

    fn accept_locked(&self, st: &mut State, n: usize) -> AfterCall {
        let Some(shadow) = st.shadow.take() else {
            return AfterCall::Nothing;
        };
        let started = Instant::now();
        if let Some(origin) = lock(&self.origin).clone() {
            shade_fusefs::accept::history::set_origin(origin);
        }
        let Some((branch, leftover)) = shadow.into_branch() else {
            self.renew(st);
            return AfterCall::Nothing;
        };
        let out = match branch.accept_quiesced(FLAGS) {
            Ok(report) => {
                drop(leftover);
                drop(branch);
                st.pending = false;
                if !report.not_applied.is_empty() {
                    let mut line = format!(
                        "{} of {n} changes not applied (changed in the project while the accept ran):",
                        report.not_applied.len()
                    );
                    for a in &report.not_applied {
                        line.push_str(&format!(" {a};"));
                    }
                    lock(&self.notices).push(line);
                }
                self.renew(st);
                AfterCall::Accepted(report, n)
            }
            Err(e) if e.nothing_written() => {
                // Refused after the check (the project changed in between): the branch is
                // kept, pending, as for a refused check.
                drop(leftover);
                let line = refusal(&e, n);
                lock(&self.notices).push(line.clone());
                st.pending = true;
                self.keep(st, branch);
                AfterCall::Pending(line)
            }
            Err(e) => {
                // Past the commit point: the journal's recovery finishes it (`shade recover`).
                drop(leftover);
                drop(branch);
                let line = format!("the accept of the last tool call failed: {e}");
                lock(&self.notices).push(line.clone());
                self.renew(st);
                AfterCall::Pending(line)
            }
        };
        st.accepts.push(started.elapsed());
        out
    }

    /// Keep `branch` as the session's (pending) branch, wrapped again for tools; when that
    /// fails the session goes on in a fresh branch and says so.
    fn keep(&self, st: &mut State, branch: shade_fusefs::Branch) {
        match Shadow::around(
            crate::runner::ShadowBranch::Local(Box::new(branch)),
            self.project.clone(),
            self.options.clone(),
            Some(self.dir.join("outside")),
        ) {
            Ok(s) => st.shadow = Some(s),
            Err(e) => {
                lock(&self.notices).push(format!("cannot keep the branch: {e}"));
                self.renew(st);
            }
        }
    }

    /// A fresh branch of the project (sharing the outside layer).
    fn renew(&self, st: &mut State) {
        match Shadow::create_with_outside(
            &self.project,
            self.options.clone(),
            self.dir.join("outside"),
        ) {
            Ok(s) => {
                note_branch(&self.dir, &s);
                st.shadow = Some(s);
            }
            Err(e) => {
                st.shadow = None;
                lock(&self.notices).push(format!(
                    "cannot create a new branch for the session: {e}; tools cannot run"
                ));
            }
        }
    }

    /// What the session's commands wrote outside the project (in the shared layer).
    pub fn outside(&self) -> shade_fusefs::outside::OutsideChanges {
        shade_fusefs::outside::OutsideChanges::read(&self.dir.join("outside")).unwrap_or_else(|e| {
            tracing::warn!("reading the writes outside the project: {e}");
            shade_fusefs::outside::OutsideChanges::default()
        })
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        if let Some(s) = lock(&self.state).shadow.take() {
            s.abort();
        }
        shade_fusefs::sandbox::release_outside(&self.dir.join("outside"));
        lock(&DIRS).retain(|d| d != &self.dir);
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::warn!("removing {}: {e}", self.dir.display());
        }
    }
}

/// The live sessions' directories of this process, for [`remove_layers_before_exit`].
static DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Before the process exits without unwinding (after a signal): release and remove every
/// live session's outside layer, as `shade_fusefs::unmount_all_before_exit` does for
/// branches (call it after that).
pub fn remove_layers_before_exit() {
    for dir in std::mem::take(&mut *lock(&DIRS)) {
        shade_fusefs::sandbox::release_outside(&dir.join("outside"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// `<state>/branches/<pid>-live-<n>/` with its `owner` file (pid, project): what
/// `cleanup_stale` recognises as a dead process's branch directory.
fn live_dir(state: &StateDir, project: &Path) -> Result<PathBuf, ShadowError> {
    use std::os::unix::fs::DirBuilderExt;
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let id = format!(
        "{}-live-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let dir = state.branches().join(id);
    let err = |source| ShadowError::Workspace {
        path: dir.clone(),
        source,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(err)?;
    std::fs::write(
        dir.join("owner"),
        format!("{}\n{}\n", std::process::id(), project.display()),
    )
    .map_err(err)?;
    lock(&DIRS).push(dir.clone());
    Ok(dir)
}

/// `<live dir>/branch`: the id of the session's branch now, and `<live dir>/mount` its mount
/// point — in another branch's directory when the branch took a pooled connection (for
/// tools and tests that tell the session's own branch from others). Best effort.
fn note_branch(dir: &Path, shadow: &Shadow) {
    let _ = std::fs::write(dir.join("branch"), format!("{}\n", shadow.id()));
    let _ = std::fs::write(
        dir.join("mount"),
        shadow.mountpoint().as_os_str().as_bytes(),
    );
}

/// The changes (indices) of `changes` that no automatic accept writes, decided over the
/// whole change set against the branch as the call left it (`branch`) and the project as
/// it is (`project`). An allowlist: a change goes in live only if it is a regular file or a
/// directory, and, inside anything git could take for a git directory, plain data
/// ([`shade_fusefs::outside::git_data`]). Held (red team rounds 3 and 4):
/// - a symbolic link, FIFO, socket or device, new or changed (a link at `.git/logs/HEAD`
///   makes git append to any host file);
/// - under a directory named `.git` or with git-dir shape after the call
///   ([`shade_fusefs::outside::git_dir_shape`], as git's discovery tests it, anywhere in
///   the project): what is not data (config, hooks, `refs/replace/`…), a `HEAD` that is
///   not a valid ref, a `packed-refs` naming replace refs, an index that newly marks a file
///   assume-unchanged or skip-worktree; and the making of a new git-dir
///   shape (its `HEAD`, `objects`, `refs`, `commondir`, or the directory renamed in);
/// - a `.git` that is not a directory (a `gitdir:` file);
/// - the deletion (or renaming away) of a git directory or of its `HEAD`, `objects`,
///   `refs`, `commondir` (git would then take the next directory up, which the branch may
///   have shaped);
/// - a directory renamed: every path beneath it, under its new name and its old one,
///   goes through the same rules (one `R` change stands for them all); one too big to walk
///   is held whole;
/// - a project file that git's configuration makes code ([`git_code::GitCode`]: a hooks
///   path in the work tree, an included config file, a hook link's target, a script a
///   filter or alias names), or a directory holding one made, moved or removed (red team
///   round 5);
/// - under `objects/`: an object rewritten in place, a new loose object that does not hash
///   to its name, a new pack, pack index or commit-graph (git reads them unchecked);
/// - a path that is code for the host by where it is ([`host_code::HostCode`]: when the
///   project is or holds a home, its shell start-up files, `~/.local/bin`, autostart, git's
///   and agents' config…; shade's own config directory and files always; a directory on
///   `PATH`; `/etc`, and the system's code directories the project holds), made, changed,
///   removed or renamed onto or away, or a directory holding one made, moved or removed
///   (red team round 8).
fn held_changes(
    changes: &shade_fusefs::Changeset,
    branch: &shade_fusefs::rootdir::RootDir,
    project: &shade_fusefs::rootdir::RootDir,
    code: &git_code::GitCode,
    host: &host_code::HostCode,
) -> Vec<usize> {
    let mut holds = Holds {
        branch,
        project,
        code,
        host,
        after: HashMap::new(),
        before: HashMap::new(),
    };
    changes
        .changes
        .iter()
        .enumerate()
        .filter(|(_, c)| holds.held(c))
        .map(|(i, _)| i)
        .collect()
}

impl Shadow {
    /// The paths of `changes` (this shadow's changeset) that are code for the host by where
    /// they are ([`host_code::HostCode`], the rules live mode holds by, red team round 8):
    /// an accept the model makes itself (`shade mcp`'s `accept_branch`, `exec --shadow
    /// --accept`) must not write `~/.bashrc` or shade's config when the project is or holds
    /// the home. A directory renamed into place counts for every path beneath it (one too
    /// big to walk counts whole). Judged in this process's environment (its homes, `PATH`).
    pub fn host_code_changes(&self, changes: &shade_fusefs::Changeset) -> Vec<PathBuf> {
        let host = host_code::HostCode::read(self.project());
        let mount = self.mountpoint();
        changes
            .changes
            .iter()
            .filter(|c| {
                let whole = c.kind != shade_fusefs::ChangeKind::Modified;
                std::iter::once(&c.path)
                    .chain(c.old_path.as_ref())
                    .any(|p| host.names(p, whole))
                    || (c.kind == shade_fusefs::ChangeKind::Renamed
                        && c.is_dir
                        && renamed_dir_names_host_code(&mount, &c.path, &host))
            })
            .map(|c| c.path.clone())
            .collect()
    }
}

/// Whether a path beneath directory `dir` (relative to the project; read in the branch at
/// `mount`) is code for the host; true for one too big to walk or unreadable.
fn renamed_dir_names_host_code(mount: &Path, dir: &Path, host: &host_code::HostCode) -> bool {
    let mut stack = vec![dir.to_path_buf()];
    let mut seen = 0usize;
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(mount.join(&d)) else {
            return true;
        };
        for e in entries {
            let Ok(e) = e else { return true };
            seen += 1;
            if seen > WALK_MAX {
                return true;
            }
            let rel = d.join(e.file_name());
            if host.names(&rel, false) {
                return true;
            }
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(rel);
            }
        }
    }
    false
}

/// Most entries a renamed directory may hold for [`held_changes`] to check them one by one;
/// a bigger one is held whole.
const WALK_MAX: usize = 200_000;

/// Most bytes of a git index read to check it; a bigger one is held.
const INDEX_MAX: u64 = 512 << 20;

/// Most bytes of a loose object read to check its hash, and most it may inflate to; a
/// bigger one is held.
const OBJECT_MAX: u64 = 64 << 20;
const INFLATED_MAX: usize = 256 << 20;

/// The path below `objects/` of a path below a git directory (`rest`, also inside its
/// submodules' git directories `modules/<name>/…`), or None if it is not there.
fn objects_below<'r>(rest: &'r [&'r str]) -> Option<&'r [&'r str]> {
    match rest {
        ["objects", obj @ ..] => Some(obj),
        ["modules", name, inner @ ..] if !name.is_empty() => objects_below(inner),
        _ => None,
    }
}

/// Most bytes of a `HEAD` or `packed-refs` read to check it; a bigger one is held.
const REFS_MAX: u64 = 64 << 20;

/// [`held_changes`]' view of the branch (after) and the project (before), with the
/// git-dir shapes found so far.
struct Holds<'a> {
    branch: &'a shade_fusefs::rootdir::RootDir,
    project: &'a shade_fusefs::rootdir::RootDir,
    /// The project's files git's configuration makes code.
    code: &'a git_code::GitCode,
    /// The project's paths that are code for the host by where they are.
    host: &'a host_code::HostCode,
    after: HashMap<PathBuf, bool>,
    before: HashMap<PathBuf, bool>,
}

/// What makes a directory a git directory: a new one of these in a git-dir shape is its
/// making, a deleted one its unmaking.
fn git_dir_sign(name: &str) -> bool {
    use shade_fusefs::outside::{GIT_DIR_COMMONDIR, GIT_DIR_HEAD, GIT_DIR_STORES};
    name == GIT_DIR_HEAD || name == GIT_DIR_COMMONDIR || GIT_DIR_STORES.contains(&name)
}

/// `path`'s components below `dir` as text (a name that is not UTF-8 matches no rule).
fn rest_below<'p>(path: &'p Path, dir: &Path) -> Vec<&'p str> {
    path.strip_prefix(dir)
        .map(|r| {
            r.components()
                .map(|c| c.as_os_str().to_str().unwrap_or("\u{fffd}"))
                .collect()
        })
        .unwrap_or_default()
}

fn named_dot_git(path: &Path) -> bool {
    path.file_name().is_some_and(|n| n == ".git")
}

impl Holds<'_> {
    fn held(&mut self, c: &shade_fusefs::Change) -> bool {
        use shade_fusefs::ChangeKind;
        // A file git's configuration makes code, or a directory holding one made, moved or
        // removed (its new name or its old one).
        let whole = c.kind != ChangeKind::Modified;
        if std::iter::once(&c.path)
            .chain(c.old_path.as_ref())
            .any(|p| self.code.names(p, whole) || self.host.names(p, whole))
        {
            return true;
        }
        match c.kind {
            ChangeKind::Deleted => self.deletion_held(&c.path),
            ChangeKind::Renamed => {
                if c.old_path.as_deref().is_some_and(|o| self.deletion_held(o)) {
                    return true;
                }
                if c.is_dir {
                    self.renamed_dir_held(&c.path, c.old_path.as_deref())
                } else {
                    self.write_held(&c.path)
                }
            }
            ChangeKind::Added | ChangeKind::Modified => self.write_held(&c.path),
        }
    }

    /// Whether directory `dir` has git-dir shape in the branch (`after`) or the project.
    fn shaped(&mut self, dir: &Path, after: bool) -> bool {
        let (cache, tree) = if after {
            (&mut self.after, self.branch)
        } else {
            (&mut self.before, self.project)
        };
        *cache.entry(dir.to_path_buf()).or_insert_with(|| {
            shade_fusefs::outside::git_dir_shape(|n| tree.symlink_metadata(&dir.join(n)).is_ok())
        })
    }

    /// Whether `dir` has git-dir shape after the call but had none before.
    fn newly_shaped(&mut self, dir: &Path) -> bool {
        self.shaped(dir, true) && !self.shaped(dir, false)
    }

    /// The directories above `path` (nearest first, the project root last) that git may
    /// take for a git directory: named `.git`, or with git-dir shape (after the call, or
    /// before it for `before`).
    fn git_dirs_above(&mut self, path: &Path, after: bool) -> Vec<PathBuf> {
        path.ancestors()
            .skip(1)
            .map(Path::to_path_buf)
            .collect::<Vec<_>>()
            .into_iter()
            .filter(|d| named_dot_git(d) || self.shaped(d, after))
            .collect()
    }

    /// `path` gone (deleted, or the old name of a rename).
    fn deletion_held(&mut self, path: &Path) -> bool {
        if named_dot_git(path) || self.shaped(path, false) || self.host.names(path, false) {
            return true;
        }
        self.git_dirs_above(path, false)
            .iter()
            .any(|g| matches!(rest_below(path, g).as_slice(), [n] if git_dir_sign(n)))
    }

    /// `path` as the branch has it now (added, changed, or the new name of a rename).
    fn write_held(&mut self, path: &Path) -> bool {
        // A start-up file, shade's config, a program on `PATH`… (also beneath a directory
        // renamed into place: this runs for each path in it).
        if self.host.names(path, false) {
            return true;
        }
        let Ok(meta) = self.branch.symlink_metadata(path) else {
            // Gone again, or unreadable: nothing to vouch for.
            return true;
        };
        let ft = meta.file_type();
        if !(ft.is_file() || ft.is_dir()) {
            return true;
        }
        // A second name of a file: the accept makes the link on the host too, and whatever
        // writes through one name (git appending to a reflog) writes the other (a hook).
        if ft.is_file() && std::os::unix::fs::MetadataExt::nlink(&meta) > 1 {
            return true;
        }
        if named_dot_git(path) && !ft.is_dir() {
            return true;
        }
        if ft.is_dir() && self.newly_shaped(path) {
            return true;
        }
        for g in self.git_dirs_above(path, true) {
            let rest = rest_below(path, &g);
            if rest.first().is_some_and(|n| git_dir_sign(n)) && self.newly_shaped(&g) {
                return true;
            }
            if !ft.is_file() {
                continue;
            }
            if !shade_fusefs::outside::git_data(&rest) {
                return true;
            }
            // Objects never change once written: one rewritten in place (a forged tree that
            // hides an edit from `git status`) is no object git made; nor is a new loose
            // object that does not hash to its name. What else git reads objects from
            // (packs and their indexes, the commit-graph with its trees) is held.
            if let Some(obj) = objects_below(&rest) {
                if self.project.symlink_metadata(path).is_ok() || self.object_held(path, obj) {
                    return true;
                }
            }
            let bad = |bytes: std::io::Result<Vec<u8>>, ok: &dyn Fn(&[u8]) -> bool| {
                bytes.map(|b| !ok(&b)).unwrap_or(true)
            };
            if rest == [shade_fusefs::outside::GIT_DIR_HEAD]
                && bad(
                    self.branch.read_at_most(path, REFS_MAX),
                    &shade_fusefs::outside::git_head_valid,
                )
            {
                return true;
            }
            if rest == ["index"] && self.index_hides(path) {
                return true;
            }
            if rest.last() == Some(&"packed-refs")
                && bad(self.branch.read_at_most(path, REFS_MAX), &|b: &[u8]| {
                    !b.windows(13).any(|w| w == b"refs/replace/")
                })
            {
                return true;
            }
        }
        false
    }

    /// Whether the file at `path`, `objects/` + `obj` of a git directory, is not a loose
    /// object git made nor the list of packs: a loose object must hash to its name
    /// ([`shade_fusefs::outside::git_loose_object_valid`]); a pack, an index, a
    /// commit-graph cannot be checked here (git reads objects out of packs first, and
    /// commits' trees from the commit-graph, without checking their hashes).
    fn object_held(&self, path: &Path, obj: &[&str]) -> bool {
        match obj {
            [dir, name] if dir.len() == 2 && dir.bytes().all(|b| b.is_ascii_hexdigit()) => self
                .branch
                .read_at_most(path, OBJECT_MAX)
                .map(|b| {
                    !shade_fusefs::outside::git_loose_object_valid(dir, name, &b, INFLATED_MAX)
                })
                .unwrap_or(true),
            ["info", "packs"] => false,
            ["pack", f] => !f.ends_with(".keep"),
            _ => true,
        }
    }

    /// Whether the git index at `path` marks a file assume-unchanged or skip-worktree that
    /// the project's index there did not (`git status` and `git diff` would not show that
    /// file's edits), or cannot be read.
    fn index_hides(&self, path: &Path) -> bool {
        let read = |tree: &shade_fusefs::rootdir::RootDir| {
            tree.read_at_most(path, INDEX_MAX)
                .ok()
                .and_then(|b| shade_fusefs::outside::git_index_hidden(&b))
        };
        let Some(now) = read(self.branch) else {
            return true;
        };
        let before = read(self.project).unwrap_or_default();
        now.iter().any(|p| !before.contains(p))
    }

    /// A directory renamed from `old` to `new`: itself, then every path beneath it under
    /// both names.
    fn renamed_dir_held(&mut self, new: &Path, old: Option<&Path>) -> bool {
        if self.write_held(new) {
            return true;
        }
        let mut dirs = vec![PathBuf::new()];
        let mut seen = 0usize;
        while let Some(rel) = dirs.pop() {
            let Ok(entries) = self.branch.read_dir(&new.join(&rel)) else {
                return true;
            };
            for e in entries {
                seen += 1;
                if seen > WALK_MAX {
                    return true;
                }
                let rel = rel.join(&e.name);
                if old.is_some_and(|o| self.deletion_held(&o.join(&rel)))
                    || self.write_held(&new.join(&rel))
                {
                    return true;
                }
                if e.kind == shade_fusefs::rootdir::Kind::Dir {
                    dirs.push(rel);
                }
            }
        }
        false
    }
}

/// The most of one held file carried into the next branch (git's config and hooks are
/// small; anything larger keeps the whole call pending instead).
const CARRY_MAX: u64 = 1 << 20;

/// A held file as the branch has it: path, content (None: a new directory), permission
/// bits.
type Carried = (PathBuf, Option<Vec<u8>>, u32);

/// The `held` changes read out of the branch at `mount` (beneath its descriptor), or None
/// if one is neither a regular file of at most [`CARRY_MAX`] bytes nor a directory made
/// in the branch (a link, a deletion, a directory renamed with what it holds).
fn carry<'c>(
    mount: &Path,
    held: impl Iterator<Item = &'c shade_fusefs::Change>,
) -> Option<Vec<Carried>> {
    use std::os::unix::fs::PermissionsExt;
    let files = shade_fusefs::rootdir::RootDir::open(mount).ok()?;
    held.map(|c| {
        let p = &c.path;
        let meta = files.symlink_metadata(p).ok()?;
        let mode = meta.permissions().mode() & 0o7777;
        if meta.is_dir() && c.kind == shade_fusefs::ChangeKind::Added {
            return Some((p.clone(), None, mode));
        }
        if !meta.is_file() || c.kind == shade_fusefs::ChangeKind::Deleted {
            return None;
        }
        let bytes = files.read_at_most(p, CARRY_MAX).ok()?;
        Some((p.clone(), Some(bytes), mode))
    })
    .collect()
}

/// Write `copies` into the branch at `mount` (beneath its descriptor), files' modes
/// included.
fn plant(mount: &Path, copies: &[Carried]) -> std::io::Result<()> {
    let files = shade_fusefs::rootdir::RootDir::open(mount)?;
    for (path, bytes, mode) in copies {
        let Some(bytes) = bytes else {
            files.create_dir_all(path)?;
            continue;
        };
        if let Some(dir) = path.parent() {
            files.create_dir_all(dir)?;
        }
        files.write(path, bytes)?;
        files.set_mode(path, *mode)?;
    }
    Ok(())
}

/// One line for an accept held by [`held_changes`].
fn held_line(held: &[PathBuf], n: usize) -> String {
    const SHOWN: usize = 8;
    let mut paths: Vec<String> = held
        .iter()
        .take(SHOWN)
        .map(|p| shade_fusefs::quote::quote_path(p).into_owned())
        .collect();
    if held.len() > SHOWN {
        paths.push(format!("{} more", held.len() - SHOWN));
    }
    format!(
        "held, not accepted: {} could make programs on the host run code or write where the \
         branch chose (git's config, hooks, repository shape, links, start-up files, shade's \
         config: {}); the branch keeps \
         its {} pending, nothing written (/diff shows them, /accept writes them, /abort drops \
         them)",
        if held.len() == 1 {
            "a change"
        } else {
            "changes"
        },
        paths.join(", "),
        crate::tools::text::plural(n, "change"),
    )
}

/// One line for a refused accept.
fn refusal(e: &AcceptError, n: usize) -> String {
    match e {
        AcceptError::Conflicts(list) => {
            let paths: Vec<String> = list
                .iter()
                .map(|c| shade_fusefs::quote::quote_path(&c.path).into_owned())
                .collect();
            format!(
                "not accepted: {} changed in the project meanwhile ({}); the branch keeps its {} \
                 pending, nothing written (/diff shows them, /accept retries, /abort drops them)",
                if paths.len() == 1 { "a path" } else { "paths" },
                paths.join(", "),
                crate::tools::text::plural(n, "change"),
            )
        }
        other => format!("not accepted, the branch keeps its changes: {other}"),
    }
}

/// A tool of a live session: runs in the current branch, then the branch is settled
/// ([`Live::settle`]). A call made in another branch (a speculation, an attempt: its
/// context has a shadow of its own) runs there untouched.
struct LiveTool {
    inner: Arc<dyn Tool>,
    live: Arc<Live>,
}

impl LiveTool {
    fn redirect(&self, ctx: &ToolContext) -> Result<Option<ToolContext>, ToolError> {
        if ctx.shadow.is_some() {
            return Ok(None);
        }
        self.live.context(ctx).map(Some)
    }
}

impl Tool for LiveTool {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn spec(&self) -> ToolSpec {
        self.inner.spec()
    }
    fn kind(&self) -> ToolKind {
        self.inner.kind()
    }
    fn is_read_only(&self, args: &Value) -> bool {
        self.inner.is_read_only(args)
    }
    fn is_read_only_in(&self, args: &Value, ctx: &ToolContext) -> bool {
        self.inner.is_read_only_in(args, ctx)
    }
    fn describe(&self, args: &Value) -> String {
        self.inner.describe(args)
    }
    fn preview(&self, args: &Value, ctx: &ToolContext) -> Option<String> {
        match self.redirect(ctx) {
            Ok(Some(c)) => self.inner.preview(args, &c),
            _ => self.inner.preview(args, ctx),
        }
    }
    fn prepare<'a>(
        &'a self,
        args: Value,
        ctx: &'a ToolContext,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Prepared> {
        Box::pin(async move {
            match self.redirect(ctx) {
                Ok(Some(c)) => self.inner.prepare(args, &c, cancel).await,
                _ => self.inner.prepare(args, ctx, cancel).await,
            }
        })
    }
    fn run<'a>(
        &'a self,
        args: Value,
        ctx: &'a ToolContext,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let c = match self.redirect(ctx)? {
                None => return self.inner.run(args, ctx, cancel).await,
                Some(c) => c,
            };
            // Read-only calls may run concurrently: they are settled with the next
            // writing call or at the end of the turn, never while another one runs.
            let read_only = self.inner.is_read_only_in(&args, ctx);
            let result = self.inner.run(args, &c, cancel).await;
            drop(c);
            if read_only {
                return result;
            }
            let live = self.live.clone();
            let after = tokio::task::spawn_blocking(move || live.settle())
                .await
                .unwrap_or(AfterCall::Nothing);
            let AfterCall::Pending(note) = after else {
                return result;
            };
            let note = format!(
                "\n\n[shade] The changes of this call are NOT in the project yet: {note}. The \
                 user decides; later calls go on in the same branch."
            );
            match result {
                Ok(mut out) => {
                    out.content.push_str(&note);
                    out.display
                        .push_str(" — not in the project yet: held or in conflict (see below)");
                    Ok(out)
                }
                Err(ToolError::Failed(m)) => Err(ToolError::Failed(m + &note)),
                Err(e) => Err(e),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use shade_fusefs::rootdir::RootDir;
    use shade_fusefs::{Change, ChangeKind, Changeset};

    /// A project (before) and the branch after a call (after), as two trees.
    struct Trees {
        before: tempfile::TempDir,
        after: tempfile::TempDir,
    }

    fn write(root: &Path, rel: &str, content: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }

    /// A git directory's skeleton at `dir` ("" for the root).
    fn git_dir(root: &Path, dir: &str) {
        let d = root.join(dir);
        let at = |rel: &str| {
            d.join(rel)
                .strip_prefix(root)
                .unwrap()
                .display()
                .to_string()
        };
        write(root, &at("HEAD"), "ref: refs/heads/main\n");
        write(root, &at("config"), "[core]\n\tbare = false\n");
        write(
            root,
            &at("refs/heads/main"),
            &format!("{}\n", "a".repeat(40)),
        );
        write(root, &at("objects/aa/bb"), "blob");
    }

    impl Trees {
        /// Both trees: a project with `.git` and `notes.txt`.
        fn new() -> Trees {
            let t = Trees {
                before: tempfile::tempdir().unwrap(),
                after: tempfile::tempdir().unwrap(),
            };
            for root in [t.before.path(), t.after.path()] {
                git_dir(root, ".git");
                write(root, "notes.txt", "one\n");
                write(root, "src/m.c", "x\n");
            }
            t
        }

        fn a(&self) -> &Path {
            self.after.path()
        }

        /// The indices [`held_changes`] holds of `changes`.
        fn held(&self, changes: Vec<Change>) -> Vec<usize> {
            self.held_with(changes, &host_code::HostCode::default())
        }

        /// The same with the project (before) as the home.
        fn held_in_home(&self, changes: Vec<Change>) -> Vec<usize> {
            self.held_with(changes, &host_code::HostCode::home_only(self.before.path()))
        }

        fn held_with(&self, changes: Vec<Change>, host: &host_code::HostCode) -> Vec<usize> {
            let set = Changeset { changes };
            held_changes(
                &set,
                &RootDir::open(self.after.path()).unwrap(),
                &RootDir::open(self.before.path()).unwrap(),
                &git_code::GitCode::default(),
                host,
            )
        }
    }

    /// A loose object of `content` written by git into `root`'s `.git`; its path.
    fn loose_object(root: &Path, content: &str) -> String {
        use std::io::Write;
        let mut c = std::process::Command::new("git")
            .args(["hash-object", "-w", "--stdin"])
            .env("GIT_DIR", root.join(".git"))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin
            .take()
            .unwrap()
            .write_all(content.as_bytes())
            .unwrap();
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "{o:?}");
        let id = String::from_utf8(o.stdout).unwrap().trim().to_string();
        format!(".git/objects/{}/{}", &id[..2], &id[2..])
    }

    /// Round 5: objects git reads without checking their hashes. A loose object under
    /// another object's name, a pack and its index, a commit-graph: held.
    #[test]
    fn objects_that_do_not_hash_to_their_names_and_packs_are_held() {
        let t = Trees::new();
        let one = loose_object(t.a(), "one\n");
        let two = loose_object(t.a(), "two\n");
        // `two`'s bytes under a third name (a new file, nothing rewritten in place).
        let forged = format!(".git/objects/ee/{}", "e".repeat(38));
        write(t.a(), &forged, "");
        std::fs::copy(t.a().join(&two), t.a().join(&forged)).unwrap();
        write(t.a(), ".git/objects/pack/pack-1.pack", "PACK");
        write(t.a(), ".git/objects/pack/pack-1.idx", "idx");
        write(t.a(), ".git/objects/info/commit-graph", "CGPH");
        write(t.a(), ".git/objects/pack/pack-1.keep", "");
        write(t.a(), ".git/modules/sub/objects/ab/cdef", "x");
        let held = t.held(vec![
            ch(ChangeKind::Added, &one),
            ch(ChangeKind::Added, &forged),
            ch(ChangeKind::Added, ".git/objects/pack/pack-1.pack"),
            ch(ChangeKind::Added, ".git/objects/pack/pack-1.idx"),
            ch(ChangeKind::Added, ".git/objects/info/commit-graph"),
            ch(ChangeKind::Added, ".git/objects/pack/pack-1.keep"),
            ch(ChangeKind::Added, ".git/modules/sub/objects/ab/cdef"),
        ]);
        assert_eq!(held, vec![1, 2, 3, 4, 6]);
    }

    fn ch(kind: ChangeKind, path: &str) -> Change {
        Change::new(kind, PathBuf::from(path), None, false)
    }

    fn renamed_dir(from: &str, to: &str) -> Change {
        Change::new(
            ChangeKind::Renamed,
            PathBuf::from(to),
            Some(PathBuf::from(from)),
            true,
        )
    }

    #[test]
    fn plain_edits_and_git_data_go_in_live() {
        let t = Trees::new();
        write(t.a(), "notes.txt", "two\n");
        // An empty version-2 index (header, no entries, checksum).
        write(
            t.a(),
            ".git/index",
            &format!("DIRC\0\0\0\x02\0\0\0\0{}", "\0".repeat(20)),
        );
        let blob = loose_object(t.a(), "hello\n");
        write(
            t.a(),
            ".git/refs/heads/main",
            &format!("{}\n", "b".repeat(40)),
        );
        write(t.a(), ".git/logs/HEAD", "log\n");
        write(t.a(), ".git/objects/info/packs", "P pack-x.pack\n");
        write(t.a(), ".git/HEAD", "ref: refs/heads/other\n");
        write(t.a(), "new/dir/file.rs", "fn main() {}\n");
        std::fs::rename(t.a().join("src"), t.a().join("lib")).unwrap();
        let held = t.held(vec![
            ch(ChangeKind::Modified, "notes.txt"),
            ch(ChangeKind::Added, ".git/index"),
            ch(ChangeKind::Added, &blob),
            ch(ChangeKind::Added, ".git/objects/info/packs"),
            ch(ChangeKind::Modified, ".git/refs/heads/main"),
            ch(ChangeKind::Added, ".git/logs/HEAD"),
            ch(ChangeKind::Modified, ".git/HEAD"),
            ch(ChangeKind::Added, "new/dir/file.rs"),
            renamed_dir("src", "lib"),
        ]);
        assert!(held.is_empty(), "{held:?}");
    }

    /// Round 4, route 1: `.git/HEAD` made invalid and a bare-repository shape at the root
    /// (or in `src/`) with its own config.
    #[test]
    fn a_bare_repository_shape_and_a_broken_head_are_held() {
        let t = Trees::new();
        write(t.a(), ".git/HEAD", "tidy: 1\n");
        git_dir(t.a(), "");
        write(t.a(), "index", "DIRC");
        let held = t.held(vec![
            ch(ChangeKind::Modified, ".git/HEAD"),
            ch(ChangeKind::Added, "HEAD"),
            ch(ChangeKind::Added, "config"),
            ch(ChangeKind::Added, "objects/aa/bb"),
            ch(ChangeKind::Added, "refs/heads/main"),
        ]);
        assert_eq!(held, vec![0, 1, 2, 3, 4]);

        let t = Trees::new();
        git_dir(t.a(), "src");
        write(t.a(), "notes.txt", "two\n");
        let held = t.held(vec![
            ch(ChangeKind::Modified, "notes.txt"),
            ch(ChangeKind::Added, "src/HEAD"),
            ch(ChangeKind::Added, "src/config"),
            ch(ChangeKind::Added, "src/objects/aa/bb"),
            ch(ChangeKind::Added, "src/refs/heads/main"),
        ]);
        assert_eq!(held, vec![1, 2, 3, 4]);
        // A linked-worktree shape (HEAD and commondir) too.
        let t = Trees::new();
        write(t.a(), "w/HEAD", "ref: refs/heads/main\n");
        write(t.a(), "w/commondir", "../.cache\n");
        let held = t.held(vec![
            ch(ChangeKind::Added, "w/HEAD"),
            ch(ChangeKind::Added, "w/commondir"),
        ]);
        assert_eq!(held, vec![0, 1]);
        // A `.git` file (gitdir:).
        let t = Trees::new();
        write(t.a(), "sub/.git", "gitdir: ../elsewhere\n");
        assert_eq!(t.held(vec![ch(ChangeKind::Added, "sub/.git")]), vec![0]);
    }

    /// Round 4, route 2: a directory renamed is one change; what it carries is checked.
    #[test]
    fn a_directory_renamed_into_or_out_of_git_is_checked_beneath() {
        let t = Trees::new();
        git_dir(t.before.path(), ".cache/g");
        std::fs::rename(t.a().join(".git"), t.a().join(".cache_old")).unwrap();
        git_dir(t.a(), ".git");
        write(t.a(), ".git/config", "[core]\n\tfsmonitor = \"id\"\n");
        let held = t.held(vec![
            renamed_dir(".git", ".cache_old"),
            renamed_dir(".cache/g", ".git"),
        ]);
        assert_eq!(held, vec![0, 1]);

        let t = Trees::new();
        write(t.before.path(), "tools/pre-commit", "#!/bin/sh\nid\n");
        write(t.a(), ".git/hooks/pre-commit", "#!/bin/sh\nid\n");
        assert_eq!(t.held(vec![renamed_dir("tools", ".git/hooks")]), vec![0]);
        // Deep below the renamed directory.
        let t = Trees::new();
        write(t.a(), "x/a/b/.git/hooks/post-checkout", "#!/bin/sh\n");
        assert_eq!(t.held(vec![renamed_dir("y", "x")]), vec![0]);
        // A plain tree renamed goes in.
        let t = Trees::new();
        write(t.a(), "lib2/a/b.rs", "x\n");
        assert!(t.held(vec![renamed_dir("lib", "lib2")]).is_empty());
    }

    /// Round 4, route 4: a link at a data path, and links anywhere.
    #[test]
    fn links_are_held_wherever_they_are() {
        let t = Trees::new();
        std::fs::create_dir_all(t.a().join(".git/logs")).unwrap();
        std::os::unix::fs::symlink("/root/.bashrc", t.a().join(".git/logs/HEAD")).unwrap();
        std::os::unix::fs::symlink("notes.txt", t.a().join("link")).unwrap();
        write(
            t.a(),
            ".git/refs/heads/x;id>M;",
            &format!("{}\n", "a".repeat(40)),
        );
        write(t.a(), ".git/HEAD", "ref: refs/heads/x;id>M;\n");
        let held = t.held(vec![
            ch(ChangeKind::Added, ".git/logs/HEAD"),
            ch(ChangeKind::Added, "link"),
            ch(ChangeKind::Added, ".git/refs/heads/x;id>M;"),
            ch(ChangeKind::Modified, ".git/HEAD"),
        ]);
        assert_eq!(held, vec![0, 1]);
        // A link carried in by a renamed directory.
        let t = Trees::new();
        std::fs::create_dir_all(t.a().join("d")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", t.a().join("d/l")).unwrap();
        assert_eq!(t.held(vec![renamed_dir("e", "d")]), vec![0]);
    }

    /// Round 4, route 5: replace refs (loose or packed) and their kin.
    #[test]
    fn replace_refs_grafts_and_alternates_are_held() {
        let t = Trees::new();
        let sha = "c".repeat(40);
        write(
            t.a(),
            &format!(".git/refs/replace/{sha}"),
            &format!("{sha}\n"),
        );
        write(
            t.a(),
            ".git/packed-refs",
            &format!("# pack-refs with: peeled\n{sha} refs/replace/{sha}\n"),
        );
        write(t.a(), ".git/info/grafts", "x\n");
        write(t.a(), ".git/shallow", "x\n");
        write(t.a(), ".git/objects/info/alternates", "/tmp/x\n");
        let held = t.held(vec![
            ch(ChangeKind::Added, &format!(".git/refs/replace/{sha}")),
            ch(ChangeKind::Added, ".git/packed-refs"),
            ch(ChangeKind::Added, ".git/info/grafts"),
            ch(ChangeKind::Added, ".git/shallow"),
            ch(ChangeKind::Added, ".git/objects/info/alternates"),
        ]);
        assert_eq!(held, vec![0, 1, 2, 3, 4]);
        let t = Trees::new();
        write(
            t.a(),
            ".git/packed-refs",
            &format!("{} refs/heads/main\n", "d".repeat(40)),
        );
        assert!(t
            .held(vec![ch(ChangeKind::Added, ".git/packed-refs")])
            .is_empty());
    }

    /// Red team round 8, route 2: the home as the project. Start-up files and shade's own
    /// config are held however they are made (written, renamed onto, carried in by a
    /// directory renamed into place) or removed; the project's other files go in.
    #[test]
    fn start_up_files_and_shades_config_are_held_in_a_home() {
        let t = Trees::new();
        write(t.a(), ".bashrc", "id\n");
        write(t.a(), ".config/shade/config.toml", "[sandbox]\n");
        write(t.a(), ".profile", "id\n");
        write(t.a(), ".mytool/hooks/post", "id\n");
        write(t.a(), "src/x.rs", "fn x() {}\n");
        write(t.a(), ".notes", "n\n");
        let held = t.held_in_home(vec![
            ch(ChangeKind::Added, ".bashrc"),
            renamed_dir("stuff", ".config"),
            Change::new(
                ChangeKind::Renamed,
                PathBuf::from(".profile"),
                Some(PathBuf::from("old.txt")),
                false,
            ),
            renamed_dir("dots", ".mytool"),
            ch(ChangeKind::Added, "src/x.rs"),
            ch(ChangeKind::Added, ".notes"),
            ch(ChangeKind::Modified, "notes.txt"),
            Change::new(ChangeKind::Deleted, PathBuf::from(".local"), None, true),
            ch(ChangeKind::Deleted, ".config/shade/AGENTS.md"),
        ]);
        // `.notes` too: everything under the home's hidden entries is held.
        assert_eq!(held, vec![0, 1, 2, 3, 5, 7, 8]);
        // Not in a home: the same names are the project's.
        assert!(t
            .held(vec![
                ch(ChangeKind::Added, ".bashrc"),
                ch(ChangeKind::Added, ".config/shade/config.toml"),
            ])
            .is_empty());
    }

    /// Unmaking a git directory (git would go on to the next one up) is held.
    #[test]
    fn deleting_a_git_directory_or_its_signs_is_held() {
        let t = Trees::new();
        std::fs::remove_file(t.a().join(".git/HEAD")).unwrap();
        std::fs::remove_file(t.a().join(".git/objects/aa/bb")).unwrap();
        let held = t.held(vec![
            ch(ChangeKind::Deleted, ".git/HEAD"),
            ch(ChangeKind::Deleted, ".git/objects/aa/bb"),
            ch(ChangeKind::Deleted, "notes.txt"),
            Change::new(ChangeKind::Deleted, PathBuf::from(".git"), None, true),
        ]);
        assert_eq!(held, vec![0, 3]);
    }
}
