//! Lints in the shadow: the diagnostics an edit introduces, from the project's own checkers
//! and language servers run inside a branch of the overlay (shade-fusefs). It knows no LLM
//! and no config file: the `[lint]` section comes in as a plain [`LintConfig`].
//!
//! Checkers run at the project's real path (so checkers that read the disk see the edit, and
//! the user's build cache reads through while new build output stays in the branch); who
//! runs them in a sandbox is handed in ([`exec::Runner`] in a [`BranchView`]).
//!
//! - [`Linter`]: one project's checkers ([`checker::choose`]), their cached baselines
//!   ([`baseline`]) and warm language servers ([`lsp`]); [`Linter::new_diagnostics`] is
//!   the post-edit hook for agents working in a branch. Its language servers run in one
//!   branch of their own, shared by every caller's branch: each request first replays the
//!   caller's state of the files it asks about (on disk there, and as document text), as
//!   the shadow-window design resets its folder to one AI's edit after another's. Servers
//!   idle for `[lint] server_idle_secs` are stopped.
//! - [`Session`]: a long-lived branch into which patches are replayed in turn (restore the
//!   previous state, apply the patch, check), as `shade lint` and its warm daemon
//!   ([`daemon`]) use it.
//! - [`target_overlay`]: a session's checkers see the user's `target/` through a kernel
//!   overlay of the session's own, so rustc's incremental state is not written through FUSE.
#![warn(missing_docs)]

pub mod baseline;
pub mod checker;
pub mod daemon;
pub mod diag;
pub mod exec;
pub mod lsp;
pub mod matching;
pub mod parse;
pub mod patch;
pub mod target_overlay;

pub use checker::{Checker, LintConfig};
pub use diag::{Diagnostic, Severity};
pub use exec::BranchView;

use checker::{DetectError, Kind};
use diag::PathBase;
use matching::LineMap;
use patch::{FileEdit, PatchError};
use shade_fusefs::served::RunBranch;
use shade_fusefs::{BranchError, BranchOptions, StateDir};
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Why linting failed (all of them are shade's own errors: exit 125).
#[derive(Debug, thiserror::Error)]
pub enum LintError {
    /// The patch was refused; nothing was changed.
    #[error(transparent)]
    Patch(#[from] PatchError),
    /// No usable checker.
    #[error(transparent)]
    Detect(#[from] DetectError),
    /// The branch could not be made.
    #[error(transparent)]
    Branch(#[from] BranchError),
    /// A checker ran but failed without diagnostics.
    #[error("checker {name} failed{status}: {line}")]
    CheckerFailed {
        /// Checker.
        name: String,
        /// ` (exit N)` or empty.
        status: String,
        /// Its most telling line of stderr.
        line: String,
    },
    /// The time limit passed.
    #[error("{0} did not finish in time")]
    Timeout(String),
    /// A language server failed.
    #[error(transparent)]
    Lsp(#[from] lsp::LspError),
    /// Reading or writing files.
    #[error("{0}")]
    Io(String),
}

/// One project's checkers, baselines and language servers.
pub struct Linter {
    project: PathBuf,
    state: StateDir,
    checkers: Vec<Checker>,
    cache: baseline::Cache,
    /// Language servers, the branch they run in, and their reaper.
    servers: Arc<Mutex<Servers>>,
    /// How long a language server may sit unused before it is stopped.
    server_idle: Duration,
    /// LSP baselines by (checker, path, hash of the unedited text).
    lsp_baselines: Mutex<HashMap<(String, String, String), Vec<Diagnostic>>>,
    /// Baselines being computed in the background, by fingerprint.
    baseline_jobs: Mutex<HashMap<String, BaselineJob>>,
    /// Stops the background baselines' checkers when the linter goes (their branches must
    /// not outlive the process).
    stop: shade_fusefs::sandbox::Cancel,
    /// Language servers run in the speculation sandbox (see [`Linter::confine_servers`]).
    confined_servers: bool,
}

/// The running language servers (by checker name) and where they run.
#[derive(Default)]
struct Servers {
    running: HashMap<String, lsp::Server>,
    home: Option<Home>,
    /// A thread stopping idle servers is running.
    reaper: bool,
}

/// The branch language servers run in: every caller's branch shares it, its state
/// replayed into it in turn.
struct Home {
    view: BranchView,
    /// The branch when the linter made it for its servers (a [`Session`] lends its own).
    owned: Option<RunBranch>,
    /// Files a caller's state put there, restored to the project's before the next one.
    replayed: BTreeSet<String>,
    /// Throw-away branches of the build caches, for servers in the speculation sandbox
    /// (made with the first such server, unmounted with the home). Declared last: dropped
    /// after the servers' branch.
    caches: Option<shade_fusefs::sandbox::CacheBranches>,
}

impl Servers {
    /// Stop servers unused for `idle`; with none left, unmount the linter's own branch.
    fn stop_idle(&mut self, idle: Duration) {
        let stale: Vec<String> = self
            .running
            .iter()
            .filter(|(_, s)| s.last_used().elapsed() >= idle)
            .map(|(k, _)| k.clone())
            .collect();
        for k in stale {
            if let Some(s) = self.running.remove(&k) {
                s.stop();
            }
        }
        if self.running.is_empty() && self.home.as_ref().is_some_and(|h| h.owned.is_some()) {
            self.home = None;
        }
    }
}

fn lock_servers(m: &Mutex<Servers>) -> MutexGuard<'_, Servers> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A baseline computed on a thread of its own: its result (an error as text), once there.
type BaselineJob = std::sync::Arc<(
    Mutex<Option<Result<Vec<Diagnostic>, String>>>,
    std::sync::Condvar,
)>;

impl Linter {
    /// The linter of `project` with the checkers `only` (a `--checker` name), the config's
    /// list, or the detected ones.
    pub fn new(
        project: &Path,
        state: StateDir,
        config: &LintConfig,
        only: Option<&str>,
    ) -> Result<Linter, LintError> {
        let project = std::fs::canonicalize(project)
            .map_err(|e| LintError::Io(format!("project directory {}: {e}", project.display())))?;
        let checkers = checker::choose(&project, config, only)?;
        Ok(Linter {
            cache: baseline::Cache::new(state.root()),
            project,
            state,
            checkers,
            servers: Arc::default(),
            server_idle: config.server_idle(),
            lsp_baselines: Mutex::default(),
            baseline_jobs: Mutex::default(),
            stop: shade_fusefs::sandbox::Cancel::new(),
            confined_servers: false,
        })
    }

    /// Start language servers in the speculation sandbox (network off, private /tmp, the
    /// rest of the file system read-only but for throw-away branches of the build caches)
    /// rather than the plain one. For agent sessions: their servers start on their own, on
    /// whatever an agent (or a speculation nobody asked for) wrote, and run project code
    /// (build scripts, proc macros, plugins) with nobody watching. `shade lint`, which the
    /// user runs, keeps the plain sandbox.
    pub fn confine_servers(mut self) -> Linter {
        self.confined_servers = true;
        self
    }

    /// The real project directory.
    pub fn project(&self) -> &Path {
        &self.project
    }

    /// The checkers in use.
    pub fn checkers(&self) -> &[Checker] {
        &self.checkers
    }

    /// A fresh branch of the project: from the project's branch server when it is on and
    /// answers (its connection warm from earlier branches), else made in this process
    /// (`SHADE_BRANCH_SERVER=0`, a server that cannot start, a process that names no
    /// server: a library's tests). Lint never accepts, so the branch is only a view: its
    /// commands run in this process's sandbox, which tells the server on drop whether the
    /// connection may serve a later branch (a language server, started with
    /// `sandbox::command`, keeps it from being reused).
    pub fn branch(&self) -> Result<RunBranch, LintError> {
        project_branch(&self.project, &self.state)
    }

    /// Check the state of `view`, in which `edits` are the files that differ from the
    /// project, and mark the diagnostics the edits introduced. Batch checkers' baselines come
    /// from the cache, else from `lower` (a view of the unedited project) or a fresh branch.
    pub fn check(
        &self,
        view: &BranchView,
        edits: &[FileEdit],
        lower: Option<&BranchView>,
        deadline: Option<Instant>,
    ) -> Result<Vec<Diagnostic>, LintError> {
        let maps: HashMap<String, LineMap> = edits
            .iter()
            .map(|e| {
                let m = LineMap::between(
                    e.old.as_deref().unwrap_or(""),
                    e.new.as_deref().unwrap_or(""),
                );
                (e.path.clone(), m)
            })
            .collect();
        let mut all = Vec::new();
        for c in &self.checkers {
            let (before, mut after) = match &c.kind {
                Kind::Batch { .. } => {
                    let before = self.baseline(c, lower, deadline)?;
                    (before, run_batch(&self.project, view, c, deadline)?)
                }
                Kind::Lsp {
                    command,
                    extensions,
                } => self.run_lsp(view, c, command, extensions, edits, deadline)?,
            };
            matching::mark_new(&before, &mut after, &maps);
            all.extend(after);
        }
        diag::sort(&mut all);
        Ok(all)
    }

    /// The post-edit hook: new diagnostics in `touched` (project-relative paths) of the
    /// branch `view`, compared with the unedited project, within `budget`.
    pub fn new_diagnostics(
        &self,
        view: &BranchView,
        touched: &[String],
        budget: Duration,
    ) -> Result<Vec<Diagnostic>, LintError> {
        let deadline = Some(Instant::now() + budget);
        let edits: Vec<FileEdit> = touched
            .iter()
            .map(|rel| FileEdit {
                path: rel.clone(),
                old: std::fs::read_to_string(self.project.join(rel)).ok(),
                new: view.read(rel).ok().and_then(|b| String::from_utf8(b).ok()),
            })
            .collect();
        let all = self.check(view, &edits, None, deadline)?;
        Ok(all
            .into_iter()
            .filter(|d| d.new && touched.contains(&d.path))
            .collect())
    }

    /// The checker's diagnostics on the unedited project: cached by fingerprint, else run in
    /// `lower` (within `deadline`) or, without one, in a fresh branch by a background job
    /// that is waited for until `deadline` but runs to the end regardless, so a baseline
    /// slower than the post-edit budget is still ready for a later edit.
    fn baseline(
        &self,
        c: &Checker,
        lower: Option<&BranchView>,
        deadline: Option<Instant>,
    ) -> Result<Vec<Diagnostic>, LintError> {
        let key = baseline::fingerprint(&self.project, &c.identity());
        if let Some(b) = self.cache.get(&key) {
            return Ok(b);
        }
        if let Some(v) = lower {
            let diags = run_batch(&self.project, v, c, deadline)?;
            // Only store it if the project did not change while the checker ran.
            if baseline::fingerprint(&self.project, &c.identity()) == key {
                self.cache.put(&key, &diags);
            }
            return Ok(diags);
        }
        let job = self
            .baseline_jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key.clone())
            .or_insert_with(|| self.start_baseline_job(c, key.clone()))
            .clone();
        let (slot, done) = &*job;
        let mut st = slot.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            match &*st {
                Some(Ok(d)) => return Ok(d.clone()),
                Some(Err(e)) => {
                    let e = e.clone();
                    drop(st);
                    // Let a later call try again.
                    self.baseline_jobs
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&key);
                    return Err(LintError::Io(format!("baseline of {}: {e}", c.name)));
                }
                None => {}
            }
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => Duration::from_secs(3600),
            };
            if left.is_zero() {
                return Err(LintError::Timeout(format!(
                    "the baseline of checker {}",
                    c.name
                )));
            }
            st = done
                .wait_timeout(st, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// Start computing the baselines of the batch checkers that have none cached, in the
    /// background, so the first edit's diagnostics do not wait for a whole check of the
    /// unedited project. A later [`Linter::check`] waits for the same job.
    pub fn warm_baselines(&self) {
        for c in &self.checkers {
            if !matches!(c.kind, Kind::Batch { .. }) {
                continue;
            }
            let key = baseline::fingerprint(&self.project, &c.identity());
            if self.cache.get(&key).is_some() {
                continue;
            }
            self.baseline_jobs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(key.clone())
                .or_insert_with(|| self.start_baseline_job(c, key));
        }
    }

    /// Compute a baseline in a fresh branch on a thread of its own, store it in the cache.
    fn start_baseline_job(&self, c: &Checker, key: String) -> BaselineJob {
        let job = BaselineJob::default();
        let (project, state, cache, c, j) = (
            self.project.clone(),
            self.state.clone(),
            self.cache.clone(),
            c.clone(),
            job.clone(),
        );
        let runner: Arc<dyn exec::Runner> = Arc::new(exec::Stoppable(self.stop.clone()));
        std::thread::spawn(move || {
            let run = || -> Result<Vec<Diagnostic>, LintError> {
                let b = project_branch(&project, &state)?;
                let view = BranchView {
                    runner: Some(runner),
                    ..BranchView::of_run(&b)
                };
                run_batch(&project, &view, &c, None)
            };
            let res = run();
            if let Ok(d) = &res {
                if baseline::fingerprint(&project, &c.identity()) == key {
                    cache.put(&key, d);
                }
            }
            let (slot, done) = &*j;
            *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(res.map_err(|e| e.to_string()));
            done.notify_all();
        });
        job
    }

    fn run_lsp(
        &self,
        view: &BranchView,
        c: &Checker,
        command: &[String],
        extensions: &[String],
        edits: &[FileEdit],
        deadline: Option<Instant>,
    ) -> Result<(Vec<Diagnostic>, Vec<Diagnostic>), LintError> {
        let left = || {
            deadline
                .map(|d| d.saturating_duration_since(Instant::now()))
                .unwrap_or(Duration::from_secs(60))
        };
        let mut guard = lock_servers(&self.servers);
        let sv = &mut *guard;
        if sv.home.is_none() {
            let b = self.branch()?;
            sv.home = Some(Home {
                view: BranchView::of_run(&b),
                owned: Some(b),
                replayed: BTreeSet::new(),
                caches: None,
            });
        }
        let home = sv
            .home
            .as_mut()
            .ok_or_else(|| LintError::Io("the language servers' branch vanished".into()))?;
        if home.view.mount != view.mount {
            replay_files(&self.project, home, edits)?;
        }
        if let Some(s) = sv.running.get_mut(&c.name) {
            if !s.alive() {
                sv.running.remove(&c.name);
            }
        }
        if !sv.running.contains_key(&c.name) {
            let confine = if self.confined_servers {
                if home.caches.is_none() {
                    let opts = BranchOptions {
                        state: self.state.clone(),
                        id_shift: shade_fusefs::sandbox::branch_id_shift(&Default::default()),
                        ..BranchOptions::default()
                    };
                    home.caches = Some(shade_fusefs::sandbox::CacheBranches::create(
                        &self.project,
                        &shade_fusefs::sandbox::default_cache_dirs(),
                        &opts,
                    )?);
                }
                exec::Confinement::speculative(
                    home.caches.as_ref().map(|c| c.binds()).unwrap_or_default(),
                )
            } else {
                exec::Confinement::default()
            };
            let s = lsp::Server::start(&c.name, &home.view, command, left(), &confine)?;
            sv.running.insert(c.name.clone(), s);
            if !sv.reaper {
                sv.reaper = true;
                spawn_reaper(Arc::downgrade(&self.servers), self.server_idle);
            }
        }
        let server = sv
            .running
            .get_mut(&c.name)
            .ok_or_else(|| LintError::Io("language server vanished".into()))?;
        // Documents an earlier caller (or request) left behind go back to this caller's
        // state of them before anything is asked.
        for rel in server.open_documents() {
            if !edits.iter().any(|e| e.path == rel) {
                let text = view
                    .read(&rel)
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok())
                    .unwrap_or_default();
                server.set_text(&rel, &text)?;
            }
        }
        let base = PathBase {
            project: &self.project,
            cwd: &self.project,
            mount: Some(&view.mount),
        };
        let norm = |raws: Vec<diag::Raw>| -> Vec<Diagnostic> {
            raws.into_iter()
                .map(|r| r.normalise(&base, &c.name, Severity::Error))
                .collect()
        };
        let mut before = Vec::new();
        let mut after = Vec::new();
        for e in edits {
            let handled = Path::new(&e.path)
                .extension()
                .is_some_and(|x| extensions.iter().any(|h| x == h.as_str()));
            let Some(new) = e.new.as_deref().filter(|_| handled) else {
                continue;
            };
            if let Some(old) = &e.old {
                let bkey = (
                    c.name.clone(),
                    e.path.clone(),
                    baseline::digest(old.as_bytes()),
                );
                let cached = self
                    .lsp_baselines
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&bkey)
                    .cloned();
                let b = match cached {
                    Some(b) => b,
                    None => {
                        let b = norm(server.diagnostics(&e.path, old, left())?);
                        self.lsp_baselines
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(bkey, b.clone());
                        b
                    }
                };
                before.extend(b);
            }
            after.extend(norm(server.diagnostics(&e.path, new, left())?));
        }
        Ok((before, after))
    }

    /// Stop language servers idle for longer than `idle`; returns how many remain.
    pub fn stop_idle_servers(&self, idle: Duration) -> usize {
        let mut sv = lock_servers(&self.servers);
        sv.stop_idle(idle);
        sv.running.len()
    }

    /// Run language servers in `view` (a branch the caller keeps mounted for the linter's
    /// life) instead of a branch of the linter's own; only before any server started.
    fn lend_home(&self, view: BranchView) {
        let mut sv = lock_servers(&self.servers);
        if sv.home.is_none() {
            sv.home = Some(Home {
                view,
                owned: None,
                replayed: BTreeSet::new(),
                caches: None,
            });
        }
    }

    /// Stop every language server.
    pub fn stop_servers(&self) {
        self.stop_idle_servers(Duration::ZERO);
    }
}

impl Drop for Linter {
    fn drop(&mut self) {
        let mut sv = lock_servers(&self.servers);
        sv.stop_idle(Duration::ZERO);
        sv.home = None;
        drop(sv);
        // Background baselines: kill their checkers and wait until their branches are
        // unmounted (a session ending mid-baseline must leave no mount behind).
        self.stop.cancel();
        let jobs: Vec<BaselineJob> = self
            .baseline_jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .map(|(_, j)| j)
            .collect();
        for job in jobs {
            let (slot, done) = &*job;
            let mut st = slot.lock().unwrap_or_else(|e| e.into_inner());
            let until = Instant::now() + Duration::from_secs(30);
            while st.is_none() && Instant::now() < until {
                st = done
                    .wait_timeout(st, until.saturating_duration_since(Instant::now()))
                    .map(|(g, _)| g)
                    .unwrap_or_else(|e| e.into_inner().0);
            }
        }
    }
}

/// Stops the linter's idle language servers every so often; ends with the linter or when
/// no server is left.
fn spawn_reaper(servers: std::sync::Weak<Mutex<Servers>>, idle: Duration) {
    let tick = (idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(1));
    std::thread::spawn(move || loop {
        std::thread::sleep(tick);
        let Some(servers) = servers.upgrade() else {
            return;
        };
        let mut sv = lock_servers(&servers);
        sv.stop_idle(idle);
        if sv.running.is_empty() {
            sv.reaper = false;
            return;
        }
    });
}

/// Put a caller's state of `edits` into the servers' branch, after putting back the files
/// an earlier caller's state changed there.
fn replay_files(project: &Path, home: &mut Home, edits: &[FileEdit]) -> Result<(), LintError> {
    let write = |rel: &str, text: Option<&[u8]>| -> Result<(), LintError> {
        if home.view.read(rel).ok().as_deref() == text {
            return Ok(());
        }
        home.view
            .put(rel, text)
            .map_err(|e| LintError::Io(format!("replaying {rel} for the language server: {e}")))
    };
    let earlier = std::mem::take(&mut home.replayed);
    for rel in earlier
        .iter()
        .filter(|r| !edits.iter().any(|e| &e.path == *r))
    {
        write(rel, std::fs::read(project.join(rel)).ok().as_deref())?;
    }
    for e in edits {
        write(&e.path, e.new.as_deref().map(str::as_bytes))?;
        home.replayed.insert(e.path.clone());
    }
    Ok(())
}

/// Run a batch checker in `view` and normalise what it printed.
fn run_batch(
    project: &Path,
    view: &BranchView,
    c: &Checker,
    deadline: Option<Instant>,
) -> Result<Vec<Diagnostic>, LintError> {
    let Kind::Batch {
        runs,
        format,
        default_severity,
    } = &c.kind
    else {
        return Ok(Vec::new());
    };
    let mut out: Vec<Diagnostic> = Vec::new();
    for inv in runs {
        let cwd = project.join(&inv.cwd);
        let o = exec::run(view, &inv.argv, &cwd, &inv.env, deadline).map_err(|e| {
            LintError::CheckerFailed {
                name: c.name.clone(),
                status: String::new(),
                line: format!("cannot run `{}`: {e}", inv.argv.join(" ")),
            }
        })?;
        if o.timed_out {
            return Err(LintError::Timeout(format!("checker {}", c.name)));
        }
        let raws = parse::parse(*format, &o.stdout, &o.stderr);
        if raws.is_empty() && o.status != Some(0) {
            return Err(LintError::CheckerFailed {
                name: c.name.clone(),
                status: o.status.map(|s| format!(" (exit {s})")).unwrap_or_default(),
                line: telling_line(&o.stderr, &o.stdout),
            });
        }
        let base = PathBase {
            project,
            cwd: &cwd,
            mount: Some(&view.mount),
        };
        for r in raws {
            let d = r.normalise(&base, &c.name, *default_severity);
            if !out.contains(&d) {
                out.push(d);
            }
        }
    }
    Ok(out)
}

/// The most useful line of a failed checker's output: the first `error` line, else the
/// last non-empty one.
fn telling_line(stderr: &str, stdout: &str) -> String {
    let lines = || {
        stderr
            .lines()
            .chain(stdout.lines())
            .map(str::trim)
            .filter(|l| !l.is_empty())
    };
    lines()
        .find(|l| l.to_ascii_lowercase().starts_with("error"))
        .or_else(|| lines().next_back())
        .unwrap_or("no output")
        .to_string()
}

/// A long-lived branch into which patches are replayed in turn: each request first
/// restores every file an earlier request wrote to the project's current content, then
/// applies its patch and checks. Several callers share its checkers (and their warm
/// state) this way, one state at a time.
pub struct Session {
    linter: Linter,
    branch: RunBranch,
    view: BranchView,
    written: BTreeSet<String>,
}

impl Session {
    /// A session over a fresh branch.
    pub fn new(linter: Linter) -> Result<Session, LintError> {
        let branch = linter.branch()?;
        let mut view = BranchView::of_run(&branch);
        // Checkers see the user's target/ through a kernel overlay of the session's own.
        // A served branch's mount point is its connection's, which a later branch reuses:
        // the overlay's directory is named for this session, not for the mount.
        let name = match &branch {
            RunBranch::Local(b) => b.id().to_string(),
            RunBranch::Remote(_) => format!("served-{}-{}", std::process::id(), session_serial()),
        };
        let dir = linter.state.root().join("lint/overlay").join(name);
        if let Some(o) = target_overlay::TargetOverlay::new(&linter.project, dir) {
            view.runner = Some(Arc::new(o));
        }
        // The servers run in the session's branch: it already holds each request's state.
        linter.lend_home(view.clone());
        Ok(Session {
            linter,
            branch,
            view,
            written: BTreeSet::new(),
        })
    }

    /// The linter.
    pub fn linter(&self) -> &Linter {
        &self.linter
    }

    /// Apply `patch` (a unified diff; empty = none) in the branch and return every
    /// diagnostic, the new ones marked. A patch that does not apply changes nothing.
    pub fn lint_patch(
        &mut self,
        patch_text: &str,
        deadline: Option<Instant>,
    ) -> Result<Vec<Diagnostic>, LintError> {
        let files = patch::parse(patch_text)?;
        self.restore()?;
        let edits = patch::plan(&self.view.mount, &files)?;
        // Baselines first, while the branch still shows the unedited project.
        for c in self.linter.checkers() {
            if matches!(c.kind, Kind::Batch { .. }) {
                self.linter.baseline(c, Some(&self.view), deadline)?;
            }
        }
        for e in &edits {
            self.written.insert(e.path.clone());
            let res = self.view.put(&e.path, e.new.as_deref().map(str::as_bytes));
            res.map_err(|err| LintError::Io(format!("writing {} in the branch: {err}", e.path)))?;
        }
        self.linter
            .check(&self.view, &edits, Some(&self.view), deadline)
    }

    /// Put every file an earlier patch wrote back to the project's current content.
    fn restore(&mut self) -> Result<(), LintError> {
        for rel in &self.written {
            let lower = std::fs::read(self.linter.project.join(rel)).ok();
            let now = self.view.read(rel).ok();
            if lower == now {
                continue;
            }
            let res = self.view.put(rel, lower.as_deref());
            res.map_err(|e| LintError::Io(format!("restoring {rel} in the branch: {e}")))?;
        }
        Ok(())
    }

    /// The branch the session works in.
    pub fn branch(&self) -> &RunBranch {
        &self.branch
    }
}

/// A number no other session of this process had (names its overlay directory).
fn session_serial() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// A fresh branch of `project` for a linter: served when the server is on and answers,
/// else in-process ([`Linter::branch`]).
fn project_branch(project: &Path, state: &StateDir) -> Result<RunBranch, LintError> {
    let opts = BranchOptions {
        state: state.clone(),
        id_shift: shade_fusefs::sandbox::branch_id_shift(&Default::default()),
        ..BranchOptions::default()
    };
    Ok(RunBranch::create(project, &opts, true)?)
}
