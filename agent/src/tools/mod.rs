//! The coding tools the model can call. Each has a JSON schema for the model, validates its
//! arguments, works only inside a `Workspace`, and returns text for the model plus a short
//! display line for the user.

pub mod config;
pub mod diagnostics;
pub mod diff;
pub mod edit;
pub mod glob;
pub mod grep;
pub mod ls;
pub mod mcp;
pub mod memory;
pub mod read_file;
pub mod repair;
pub mod shell;
pub mod summarize;
pub mod text;
pub mod todo;
pub mod web_fetch;
pub mod web_search;
pub mod write_file;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::llm::{BoxFuture, ToolSpec};
use crate::workspace::{PathError, Workspace};

/// What a tool does to the world; drives approval and concurrency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolKind {
    /// Only reads the workspace.
    Read,
    /// Writes files in the workspace.
    Edit,
    /// Runs commands (read-only or not depending on the command).
    Execute,
    /// Reads from the network.
    Fetch,
    /// Writes a memory file (possibly outside the workspace: the global one).
    Memory,
    /// Only updates agent state (todo list).
    Meta,
    /// A tool of an MCP server: it acts outside shade (and outside any branch); read-only
    /// only when the server marks it so.
    Mcp,
}

/// A successful result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutput {
    /// What the model reads.
    pub content: String,
    /// One short line for the user.
    pub display: String,
}

/// A failed tool call; its text goes back to the model so it can correct itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolError {
    /// Arguments missing, of the wrong type, unknown, or not JSON at all.
    #[error("invalid arguments: {0}")]
    InvalidArgs(String),
    /// A path argument was refused.
    #[error(transparent)]
    Path(#[from] PathError),
    /// Edit-specific failures (distinct so the model can react to each).
    #[error(transparent)]
    Edit(#[from] edit::EditError),
    /// Anything else, already phrased for the model.
    #[error("{0}")]
    Failed(String),
    /// The run was cancelled.
    #[error("cancelled")]
    Cancelled,
}

/// Shared state and settings every tool call sees.
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// Where files live (the project or a branch mount).
    pub workspace: Workspace,
    /// The session's todo list (`todo_write`).
    pub todos: Arc<Mutex<Vec<todo::TodoItem>>>,
    /// The global memory file (`memory` with scope `global`); `None` disables it.
    pub global_memory: Option<PathBuf>,
    /// File name of the project memory file at the workspace root.
    pub memory_file_name: String,
    /// Background model calls for tools that ask the model themselves (edit repair, output
    /// summaries, web_fetch's prompt); `None`: those tools fall back to what needs no model.
    pub background: Option<crate::background::BackgroundLlm>,
    /// Lints of a branch: new diagnostics after `edit`/`write_file` and the `diagnostics`
    /// tool. `None` (the default) leaves edits as they were.
    pub lint: Option<Arc<diagnostics::LintHook>>,
    /// Set in a shadow ([`crate::shadow::Shadow::tool_context`]): `shell` runs its commands
    /// in the branch sandbox at the project's real path instead of directly.
    pub shadow: Option<crate::runner::ShadowRunner>,
    /// Where oversized tool output is kept in full (under the state dir, never the project).
    pub output_dir: PathBuf,
    /// The session's token account, for model calls a tool makes outside the metered
    /// provider (web_search's search model), so that `/stats` shows them too.
    pub token_stats: Option<crate::background::TokenStats>,
    /// The user runs this tool call themselves (chat's `!cmd`): `shell` leaves its command
    /// in the user's session, where it may open the terminal. Never set for the model's
    /// calls, which run without a terminal.
    pub user_terminal: bool,
}

impl ToolContext {
    /// Defaults: global memory under the XDG config dir, project memory `SHADE.md`.
    pub fn new(workspace: Workspace) -> Self {
        Self {
            workspace,
            todos: Arc::default(),
            global_memory: crate::paths::config_dir().map(|d| d.join(memory::FILE_NAME)),
            memory_file_name: memory::FILE_NAME.to_string(),
            background: None,
            lint: None,
            shadow: None,
            output_dir: shade_fusefs::StateDir::from_env()
                .root()
                .join("tool-output"),
            token_stats: None,
            user_terminal: false,
        }
    }
}

/// A call after [`Tool::prepare`].
#[derive(Debug, Clone, PartialEq)]
pub struct Prepared {
    /// The arguments to preview, approve and run.
    pub args: Value,
    /// What was repaired, appended to the call's result so the model learns of it.
    pub note: Option<String>,
}

/// One callable tool.
pub trait Tool: Send + Sync {
    /// Name the model calls it by.
    fn name(&self) -> &'static str;
    /// Description and JSON schema for the model.
    fn spec(&self) -> ToolSpec;
    /// What it does to the world.
    fn kind(&self) -> ToolKind;
    /// Is this particular call free of side effects (safe to run concurrently, never asks)?
    fn is_read_only(&self, _args: &Value) -> bool {
        self.kind() == ToolKind::Read
    }
    /// [`Tool::is_read_only`] knowing where the call would run (the shell checks the
    /// repository's git configuration there); what the agent loop asks.
    fn is_read_only_in(&self, args: &Value, _ctx: &ToolContext) -> bool {
        self.is_read_only(args)
    }
    /// Whether this call writes what outlives every branch and every later session reads
    /// (the global memory): such a call is asked in every approval mode
    /// ([`crate::approval::decide_call`]).
    fn outlives_the_branch(&self, _args: &Value) -> bool {
        false
    }
    /// A short description of the call for the user (`read src/main.rs`).
    fn describe(&self, args: &Value) -> String {
        summarize_args(self.name(), args)
    }
    /// A unified diff of what this call would change, shown when asking for approval.
    fn preview(&self, _args: &Value, _ctx: &ToolContext) -> Option<String> {
        None
    }
    /// Settle a call before it is approved: a tool that repairs its arguments (edit,
    /// write_file, possibly with a fast-model call) returns the repaired ones, which are then
    /// previewed, approved and run, with a note for the result saying what was repaired.
    fn prepare<'a>(
        &'a self,
        args: Value,
        _ctx: &'a ToolContext,
        _cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Prepared> {
        Box::pin(async move { Prepared { args, note: None } })
    }
    /// Run it.
    fn run<'a>(
        &'a self,
        args: Value,
        ctx: &'a ToolContext,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>>;
}

/// Deserialize arguments into the tool's typed parameters, with a message the model can act on.
pub fn parse_args<T: DeserializeOwned>(args: Value) -> Result<T, ToolError> {
    let args = if args.is_null() {
        Value::Object(Default::default())
    } else {
        args
    };
    serde_json::from_value(args).map_err(|e| ToolError::InvalidArgs(e.to_string()))
}

/// Run blocking filesystem work off the async threads so concurrent reads really overlap.
pub async fn blocking<T, F>(f: F) -> Result<T, ToolError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, ToolError> + Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ToolError::Failed(format!("tool task failed: {e}")))?
}

/// The whole `run` of a tool that works on files: parse `args` into its parameters `P`, then
/// call `work` with the workspace on the blocking pool. Written once so that every such tool
/// reports bad arguments and task failures the same way.
pub fn run_blocking<'a, P, F>(
    args: Value,
    ctx: &'a ToolContext,
    work: F,
) -> BoxFuture<'a, Result<ToolOutput, ToolError>>
where
    P: DeserializeOwned + Send + 'static,
    F: FnOnce(&Workspace, P) -> Result<ToolOutput, ToolError> + Send + 'static,
{
    Box::pin(async move {
        let p: P = parse_args(args)?;
        let ws = ctx.workspace.clone();
        blocking(move || work(&ws, p)).await
    })
}

fn summarize_args(name: &str, args: &Value) -> String {
    for key in ["path", "command", "pattern", "url", "fact"] {
        if let Some(v) = args.get(key).and_then(Value::as_str) {
            return format!("{name} {}", crate::llm::error::truncate_chars(v, 80));
        }
    }
    name.to_string()
}

/// The set of tools offered to the model.
#[derive(Clone, Default)]
pub struct ToolRegistry {
    tools: Vec<Arc<dyn Tool>>,
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.tools.iter().map(|t| t.name()))
            .finish()
    }
}

impl ToolRegistry {
    /// No tools.
    pub fn empty() -> Self {
        Self::default()
    }

    /// All standard coding tools with default settings (no `web_search`: it needs a provider).
    pub fn standard() -> Self {
        Self::configured(&config::ToolsConfig::default())
    }

    /// The standard tools with the config file's settings; `web_search` only when a
    /// provider is configured.
    pub fn configured(cfg: &config::ToolsConfig) -> Self {
        let mut r = Self::empty();
        r.add(Arc::new(read_file::ReadFile));
        r.add(Arc::new(write_file::WriteFile));
        r.add(Arc::new(edit::Edit));
        r.add(Arc::new(grep::Grep));
        r.add(Arc::new(glob::Glob));
        r.add(Arc::new(ls::Ls));
        r.add(Arc::new(shell::Shell {
            output_budget: cfg.output_budget.shell,
            ..Default::default()
        }));
        r.add(Arc::new(todo::TodoWrite));
        r.add(Arc::new(memory::Memory));
        r.add(Arc::new(web_fetch::WebFetch {
            access: cfg.web_fetch.clone(),
            ..Default::default()
        }));
        if let Some(search) = &cfg.web_search {
            r.add(Arc::new(web_search::WebSearch::new(search.clone())));
        }
        r
    }

    /// Add (or replace, by name) a tool.
    pub fn add(&mut self, tool: Arc<dyn Tool>) {
        self.tools.retain(|t| t.name() != tool.name());
        self.tools.push(tool);
    }

    /// Drop a tool by name.
    pub fn remove(&mut self, name: &str) {
        self.tools.retain(|t| t.name() != name);
    }

    /// Look a tool up.
    pub fn get(&self, name: &str) -> Option<Arc<dyn Tool>> {
        self.tools.iter().find(|t| t.name() == name).cloned()
    }

    /// Specs in a stable order (part of the cacheable prefix).
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools.iter().map(|t| t.spec()).collect()
    }

    /// Tool names.
    pub fn names(&self) -> Vec<&'static str> {
        self.tools.iter().map(|t| t.name()).collect()
    }
}
