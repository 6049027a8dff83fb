//! The branches of one MCP session: created on request, each a [`Shadow`] of the project
//! with the agent's tool context bound to it, and all of them dropped (unmounted) when the
//! session ends unless accepted.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use shade_agent::tools::diagnostics::{session_hook, LintHook};
use shade_agent::{Shadow, ShadowOptions, ToolContext};
use shade_fusefs::StateDir;

/// One live branch: the shadow (taken out when it is accepted or aborted) and the tool
/// context whose workspace and shell are the branch.
///
/// An idle branch is detached (issue 31, scale: [`Shadow::detach_idle`]): it holds no FUSE
/// connection, so no thread and no descriptor, and a server holding many branches stays
/// flat. A call that needs the mount holds the branch attached with [`Entry::hold`].
pub struct Entry {
    /// `None` once accept or abort took it.
    shadow: Mutex<Option<Shadow>>,
    /// Tools run with this: files in the branch mount, commands in its sandbox. Made for
    /// the mount of the branch's last attach ([`Entry::hold`] gives the current one).
    ctx: Mutex<ToolContext>,
    /// Calls holding the branch attached; the last one to let go detaches it. Held across
    /// each attach and detach, so a call never finds the branch detached under it.
    holders: Mutex<usize>,
    /// Every tool call that may write in the branch holds it shared for its whole run; an
    /// accept holds it exclusively from listing the changes to writing them, so what the
    /// user confirmed is what the branch still holds.
    pub busy: tokio::sync::RwLock<()>,
    /// Set while an accept lists, confirms and writes the branch: tool calls are refused.
    frozen: AtomicBool,
    /// Count the branch among the session's and the process's live branches while it
    /// exists.
    _slots: (Slot, Slot),
}

/// A call's hold on an attached branch ([`Entry::hold`]); dropping it (blocking: it may
/// detach) lets the branch go when no other call holds it.
pub struct Held {
    entry: Arc<Entry>,
    /// The tool context for the branch's mount now.
    pub ctx: ToolContext,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.entry.release();
    }
}

impl Entry {
    /// Keep the branch attached for a call that uses its mount (tools, compare, accept),
    /// attaching it if idle; blocking. The context's workspace, runner and lint hook are
    /// the branch at its current mount.
    pub fn hold(self: &Arc<Self>) -> Result<Held, String> {
        let mut holders = lock(&self.holders);
        let ctx = {
            let shadow = self.shadow();
            let Some(s) = shadow.as_ref() else {
                return Err("the branch is being accepted or aborted".into());
            };
            s.attach()
                .map_err(|e| format!("cannot mount the branch again: {e}"))?;
            let mut ctx = lock(&self.ctx);
            let workspace = s.workspace();
            if ctx.workspace.root() != workspace.root() {
                // Mounted elsewhere than when the context was made: same branch, same
                // todo list and lint state, the new mount.
                ctx.workspace = workspace;
                let view = s.runner().lint_view();
                ctx.lint = ctx.lint.as_ref().map(|h| Arc::new(h.moved_to(view)));
            }
            ctx.clone()
        };
        *holders += 1;
        Ok(Held {
            entry: self.clone(),
            ctx,
        })
    }

    /// A call let go: the last one detaches the branch (best effort — a branch something
    /// still refers into, a background command say, stays attached until a later call).
    fn release(&self) {
        let mut holders = lock(&self.holders);
        *holders = holders.saturating_sub(1);
        if *holders == 0 {
            self.detach_idle();
        }
    }

    /// Detach the branch if it is idle (after creation, after the last call).
    fn detach_idle(&self) {
        if let Some(s) = self.shadow().as_ref() {
            if let Err(why) = s.detach_idle() {
                tracing::debug!("branch {} stays attached: {why}", s.id());
            }
        }
    }

    /// The shadow, unless another call already took it.
    pub fn shadow(&self) -> MutexGuard<'_, Option<Shadow>> {
        lock(&self.shadow)
    }

    /// Whether an accept has frozen the branch.
    pub fn frozen(&self) -> bool {
        self.frozen.load(Ordering::SeqCst)
    }

    /// Freezes (an accept starts) or thaws (it was declined) the branch.
    pub fn set_frozen(&self, on: bool) {
        self.frozen.store(on, Ordering::SeqCst);
    }
}

/// Live branches of every session of this process (the per-process cap counts these).
static LIVE_BRANCHES: std::sync::LazyLock<Arc<AtomicUsize>> =
    std::sync::LazyLock::new(Arc::default);

/// One place among the live (or being made) branches a counter counts, given back when
/// dropped.
struct Slot(Arc<AtomicUsize>);

impl Slot {
    /// A place, unless `cap` are taken already.
    fn take(counter: &Arc<AtomicUsize>, cap: usize) -> Option<Slot> {
        counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < cap).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(counter.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Settings every branch of the session shares.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    /// The real project (canonical).
    pub project: PathBuf,
    /// Where branch stores and mounts live.
    pub state: StateDir,
    /// Longest any one command may run in a branch.
    pub time_limit: Duration,
    /// Check edits with the project's checker (the `[lint]` section, or detection).
    pub lint: bool,
    /// Most live branches of one session (`[mcp] max_branches`).
    pub max_branches: usize,
    /// Most live branches of all sessions of the process (`[mcp] max_branches_total`).
    pub max_branches_total: usize,
}

/// All branches of one session, by id (`b1`, `b2`, …). Dropping it unmounts them all.
pub struct Branches {
    options: SessionOptions,
    next: AtomicU64,
    live: Mutex<BTreeMap<String, Arc<Entry>>>,
    /// The project's linter, made on the first branch (it starts a baseline check): `None`
    /// until then, `Some(None)` without one.
    lint: Mutex<Option<Option<Arc<LintHook>>>>,
    /// Set when the session ends: no branch may be made after.
    closed: AtomicBool,
    /// Names this session's accepts in the history.
    session: String,
    /// Ids of the accepts this session made (its accepts and undos): `undo_accept` undoes
    /// these as asked, any other only when the user confirms.
    own: Mutex<Vec<String>>,
    /// The session's live branches and those being made (the per-session cap counts these).
    count: Arc<AtomicUsize>,
}

/// Numbers the sessions of this process, for their history origin.
static SESSIONS: AtomicU64 = AtomicU64::new(1);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Branches {
    /// No branches yet.
    pub fn new(options: SessionOptions) -> Branches {
        Branches {
            options,
            next: AtomicU64::new(1),
            live: Mutex::default(),
            lint: Mutex::default(),
            closed: AtomicBool::new(false),
            own: Mutex::default(),
            count: Arc::default(),
            session: format!(
                "{}.{}",
                std::process::id(),
                SESSIONS.fetch_add(1, Ordering::SeqCst)
            ),
        }
    }

    /// Where shade keeps its state (the accept history among it).
    pub fn state(&self) -> &StateDir {
        &self.options.state
    }

    /// How this session's accepts are named in the history, for `client` (a name the
    /// client chose: kept to one line of visible text and 80 characters).
    pub fn origin(&self, client: &str) -> String {
        let name: String = client.chars().take(80).collect();
        format!(
            "mcp client {} (session {})",
            shade_fusefs::quote::visible_line(&name),
            self.session
        )
    }

    /// Notes accept `id` as this session's own.
    pub fn record_own(&self, id: &str) {
        lock(&self.own).push(id.to_string());
    }

    /// Whether this session made accept `id`.
    pub fn is_own(&self, id: &str) -> bool {
        lock(&self.own).iter().any(|o| o == id)
    }

    /// This session's accepts, oldest first.
    pub fn own_ids(&self) -> Vec<String> {
        lock(&self.own).clone()
    }

    /// The real project directory.
    pub fn project(&self) -> &Path {
        &self.options.project
    }

    /// Mounts a new branch (blocking) and returns its id.
    pub fn create(&self) -> anyhow::Result<String> {
        anyhow::ensure!(
            !self.closed.load(Ordering::SeqCst),
            "the session is ending; no new branch"
        );
        let mine = Slot::take(&self.count, self.options.max_branches).ok_or_else(|| {
            anyhow::anyhow!(
                "this session has {} live branches, its limit (`[mcp] max_branches` in shade's \
                 config): accept or abort one before creating another",
                self.options.max_branches
            )
        })?;
        let all = Slot::take(&LIVE_BRANCHES, self.options.max_branches_total).ok_or_else(|| {
            anyhow::anyhow!(
                "this shade mcp process already has {} live branches, its limit (`[mcp] \
                 max_branches_total` in shade's config): accept or abort one first",
                self.options.max_branches_total
            )
        })?;
        let mut options = ShadowOptions::speculative(self.options.time_limit);
        options.branch.state = self.options.state.clone();
        // From the project's branch server when it is on (issue 31): the connection comes
        // warm, and an idle branch is parked there (`Shadow::detach_idle`), holding no
        // socket here and no thread there. In-process otherwise (`SHADE_BRANCH_SERVER=0`,
        // a server that cannot start).
        let shadow = Shadow::create_served(&self.options.project, options)?;
        let mut base = ToolContext::new(shadow.workspace());
        base.output_dir = self.options.state.root().join("tool-output");
        base.lint = self.lint_hook();
        let ctx = shadow.tool_context(&base);
        let id = format!("b{}", self.next.fetch_add(1, Ordering::Relaxed));
        let entry = Arc::new(Entry {
            shadow: Mutex::new(Some(shadow)),
            ctx: Mutex::new(ctx),
            holders: Mutex::new(0),
            busy: tokio::sync::RwLock::new(()),
            frozen: AtomicBool::new(false),
            _slots: (mine, all),
        });
        let mut live = lock(&self.live);
        if self.closed.load(Ordering::SeqCst) {
            drop(live);
            drop(entry);
            anyhow::bail!("the session is ending; no new branch");
        }
        live.insert(id.clone(), entry.clone());
        drop(live);
        // Idle until its first call: no connection held meanwhile.
        entry.detach_idle();
        Ok(id)
    }

    /// The session's lint hook (made once; `None` without a usable checker or with lint off).
    fn lint_hook(&self) -> Option<Arc<LintHook>> {
        let mut lint = lock(&self.lint);
        lint.get_or_insert_with(|| {
            if !self.options.lint {
                return None;
            }
            match crate::config::lint_config(None) {
                Ok(config) => session_hook(&self.options.project, &config, true),
                Err(e) => {
                    tracing::warn!("no lints in shade mcp: {e}");
                    None
                }
            }
        })
        .clone()
    }

    /// The live branch `id`.
    pub fn get(&self, id: &str) -> Result<Arc<Entry>, String> {
        let found = lock(&self.live).get(id).cloned();
        found.ok_or_else(|| {
            let ids = self.ids();
            if ids.is_empty() {
                format!("no branch `{id}`: there is no live branch; call create_branch first")
            } else {
                format!(
                    "no branch `{id}`: the live branches are {} (accepted or aborted branches are gone)",
                    ids.join(", ")
                )
            }
        })
    }

    /// Takes branch `id` out of the session (for accept or abort).
    pub fn remove(&self, id: &str) -> Option<Arc<Entry>> {
        lock(&self.live).remove(id)
    }

    /// Ids of the live branches, in creation order.
    pub fn ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = lock(&self.live).keys().cloned().collect();
        ids.sort_by_key(|id| id[1..].parse::<u64>().unwrap_or(u64::MAX));
        ids
    }

    /// Drops every branch (blocking): commands in them are killed, mounts unmounted,
    /// stores removed. What the session ends with.
    pub fn close_all(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let all = std::mem::take(&mut *lock(&self.live));
        for (id, entry) in all {
            if let Some(shadow) = entry.shadow().take() {
                tracing::info!("dropping branch {id} at the end of the session");
                shadow.abort();
            }
        }
        // The linter's own branches (baseline checks, language servers) go with it.
        drop(lock(&self.lint).take());
    }
}

/// A session that ends (its handler dropped, e.g. an HTTP session closed) drops its
/// branches; unmounting blocks, so a runtime worker hands its task to another thread.
impl Drop for Branches {
    fn drop(&mut self) {
        use tokio::runtime::{Handle, RuntimeFlavor};
        match Handle::try_current() {
            Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(|| self.close_all())
            }
            _ => self.close_all(),
        }
    }
}
