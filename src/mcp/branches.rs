//! The branches of one MCP session: created on request, each a [`Shadow`] of the project
//! with the agent's tool context bound to it, and all of them dropped (unmounted) when the
//! session ends unless accepted.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use shade_agent::tools::diagnostics::{session_hook, LintHook};
use shade_agent::{Shadow, ShadowOptions, ToolContext};
use shade_fusefs::StateDir;

/// One live branch: the shadow (taken out when it is accepted or aborted) and the tool
/// context whose workspace and shell are the branch.
pub struct Entry {
    /// `None` once accept or abort took it.
    shadow: Mutex<Option<Shadow>>,
    /// Tools run with this: files in the branch mount, commands in its sandbox.
    pub ctx: ToolContext,
}

impl Entry {
    /// The shadow, unless another call already took it.
    pub fn shadow(&self) -> MutexGuard<'_, Option<Shadow>> {
        lock(&self.shadow)
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
    /// Names this session's accepts in the history (`undo_accept` undoes its own).
    session: String,
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

    /// How this session's accepts are named in the history, for `client`.
    pub fn origin(&self, client: &str) -> String {
        format!("mcp client {client} (session {})", self.session)
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
        let mut options = ShadowOptions::speculative(self.options.time_limit);
        options.branch.state = self.options.state.clone();
        let shadow = Shadow::create(&self.options.project, options)?;
        let mut base = ToolContext::new(shadow.workspace());
        base.output_dir = self.options.state.root().join("tool-output");
        base.lint = self.lint_hook();
        let ctx = shadow.tool_context(&base);
        let id = format!("b{}", self.next.fetch_add(1, Ordering::Relaxed));
        let entry = Arc::new(Entry {
            shadow: Mutex::new(Some(shadow)),
            ctx,
        });
        let mut live = lock(&self.live);
        if self.closed.load(Ordering::SeqCst) {
            drop(live);
            drop(entry);
            anyhow::bail!("the session is ending; no new branch");
        }
        live.insert(id.clone(), entry);
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
