//! The agent's side: the `diagnostics` tool the model calls, and the post-edit hook that
//! appends new diagnostics of the touched file to `edit`/`write_file` results. Both are on
//! only when the `ToolContext` of a branch carries a [`LintHook`] bound to that branch
//! ([`ToolContext::lint`](crate::tools::ToolContext::lint)); a session sets an unbound one
//! ([`session_hook`]) and [`crate::shadow::Shadow::tool_context`] binds it to each shadow
//! (the `--shadow` session's branch, a speculation's). `None`, or a hook bound to no branch,
//! keeps today's behaviour: in the real tree a checker would write its build output there.

use crate::llm::{BoxFuture, ToolSpec};
use crate::tools::{blocking, parse_args, Tool, ToolContext, ToolError, ToolKind, ToolOutput};
use serde::Deserialize;
use serde_json::{json, Value};
use shade_lint::{BranchView, Diagnostic, LintConfig, LintError, Linter};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub use shade_lint::checker::DEFAULT_BUDGET;
/// Time limit of an explicit `diagnostics` call.
pub const TOOL_TIMEOUT: Duration = Duration::from_secs(120);

/// Lint settings of a branch's tool context: which linter, which branch, how long the
/// post-edit check may take, and the files edited so far.
pub struct LintHook {
    /// The project's linter (shared; it keeps baselines and language servers warm).
    pub linter: Arc<Linter>,
    /// The branch the tools write into; `None` outside any branch (the hook then waits to
    /// be bound by a shadow and does nothing).
    pub view: Option<BranchView>,
    /// Budget of the diagnostics appended after an edit.
    pub budget: Duration,
    /// The model is offered the `diagnostics` tool (the post-edit note points to it).
    pub offered: bool,
    touched: Mutex<BTreeSet<String>>,
}

impl std::fmt::Debug for LintHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LintHook")
            .field("view", &self.view)
            .field("budget", &self.budget)
            .field("offered", &self.offered)
            .finish()
    }
}

impl LintHook {
    /// A hook for the branch `view` (whose mount is the tool context's workspace root),
    /// with the `diagnostics` tool offered.
    pub fn new(linter: Arc<Linter>, view: BranchView, budget: Duration) -> LintHook {
        LintHook {
            linter,
            view: Some(view),
            budget,
            offered: true,
            touched: Mutex::default(),
        }
    }

    /// A hook bound to no branch yet, for a session's base tool context.
    pub fn unbound(linter: Arc<Linter>, budget: Duration, offered: bool) -> LintHook {
        LintHook {
            linter,
            view: None,
            budget,
            offered,
            touched: Mutex::default(),
        }
    }

    /// The same linter and settings bound to `view` (another branch, or none), with no
    /// file edited yet.
    pub fn bound_to(&self, view: Option<BranchView>) -> LintHook {
        LintHook {
            linter: self.linter.clone(),
            view,
            budget: self.budget,
            offered: self.offered,
            touched: Mutex::default(),
        }
    }

    /// The same hook moved to `view` (the same branch mounted elsewhere after a detach),
    /// keeping the files edited so far.
    pub fn moved_to(&self, view: BranchView) -> LintHook {
        let touched = self
            .touched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        LintHook {
            touched: Mutex::new(touched),
            ..self.bound_to(Some(view))
        }
    }

    /// Files edited through the tools so far (project-relative).
    pub fn touched(&self) -> Vec<String> {
        self.touched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    /// New diagnostics in `rel` after an edit, as text for the model (blocking); `None`
    /// when the hook is bound to no branch.
    pub fn after_edit(&self, rel: &str) -> Option<String> {
        let view = self.view.as_ref()?;
        self.touched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(rel.to_string());
        Some(
            match self
                .linter
                .new_diagnostics(view, &[rel.to_string()], self.budget)
            {
                Ok(d) if d.is_empty() => format!("No new diagnostics in {rel}."),
                Ok(d) => format!("New diagnostics in {rel}:\n{}", lines(&d)),
                Err(LintError::Timeout(_)) => format!(
                    "(diagnostics for {rel} not ready within {:.0}s{})",
                    self.budget.as_secs_f64(),
                    if self.offered {
                        "; call `diagnostics` to wait for them"
                    } else {
                        ""
                    }
                ),
                Err(e) => format!("(no diagnostics for {rel}: {e})"),
            },
        )
    }
}

/// An agent session's lint hook on `project`, bound to no branch yet: the checkers detected
/// or configured in `config` (the config file's `[lint]` section), the configured budget.
/// `None` when the project has no usable checker (said in the log: the session works on
/// without lints). `offered`: the session offers the `diagnostics` tool (add
/// [`Diagnostics`] to its tools).
pub fn session_hook(project: &Path, config: &LintConfig, offered: bool) -> Option<Arc<LintHook>> {
    let state = shade_fusefs::StateDir::from_env();
    match Linter::new(project, state, config, None) {
        Ok(linter) => {
            // Its language servers start on their own, for speculations and MCP clients
            // too: the speculation sandbox, whoever asks (they are shared).
            let linter = Arc::new(linter.confine_servers());
            if offered {
                // A session that works in a branch will edit: have the unedited project's
                // result ready by its first edit. Registered here (a stat walk), so the
                // linter going away stops the job and waits for its branch.
                linter.warm_baselines();
            }
            Some(Arc::new(LintHook::unbound(
                linter,
                config.budget(),
                offered,
            )))
        }
        // Most projects without a checker are simply not code shade knows how to check;
        // a configured checker that cannot run is worth a warning.
        Err(e @ LintError::Detect(shade_lint::checker::DetectError::NoneFound(_))) => {
            tracing::info!("no lints for the agent's edits: {e}");
            None
        }
        Err(e) => {
            tracing::warn!("no lints for the agent's edits: {e}");
            None
        }
    }
}

fn lines(d: &[Diagnostic]) -> String {
    d.iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The project-relative path of a tool's `path` argument, if it names a file in the
/// workspace.
fn rel_path(ctx: &ToolContext, path_arg: Option<&str>) -> Option<String> {
    let abs = ctx.workspace.resolve(path_arg?).ok()?;
    let rel = abs.strip_prefix(ctx.workspace.root()).ok()?;
    Some(rel.to_string_lossy().into_owned())
}

/// An edit tool's `path` argument.
pub fn path_arg(args: &Value) -> Option<String> {
    args.get("path").and_then(Value::as_str).map(str::to_owned)
}

/// Wrap an edit tool's run: when the context has a [`LintHook`] and the edit succeeded,
/// append the new diagnostics of the file it touched.
/// `path` is the tool's `path` argument ([`path_arg`]).
pub fn with_diagnostics<'a>(
    ctx: &'a ToolContext,
    path: Option<String>,
    run: BoxFuture<'a, Result<ToolOutput, ToolError>>,
) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
    let Some(hook) = ctx.lint.clone().filter(|h| h.view.is_some()) else {
        return run;
    };
    let rel = rel_path(ctx, path.as_deref());
    Box::pin(async move {
        let mut out = run.await?;
        if let Some(rel) = rel {
            if let Some(note) = blocking(move || Ok(hook.after_edit(&rel))).await? {
                out.content.push_str("\n\n");
                out.content.push_str(&note);
            }
        }
        Ok(out)
    })
}

/// `diagnostics`: the checker's findings the branch's edits introduced, for chosen files or
/// every file edited so far. Read-only (it only runs checkers inside the branch).
#[derive(Debug, Default)]
pub struct Diagnostics;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    #[serde(default)]
    paths: Option<Vec<String>>,
}

impl Tool for Diagnostics {
    fn name(&self) -> &'static str {
        "diagnostics"
    }

    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name().into(),
            description: "Run the project's checker (compiler, linter, language server) on the \
                current state of your edits and list the errors and warnings your edits \
                introduced (not those the project already had). Without `paths`, covers every \
                file you edited."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "paths": {"type": "array", "items": {"type": "string"}, "description": "Files to report on, relative to the workspace root."}
                },
                "additionalProperties": false
            }),
        }
    }

    fn kind(&self) -> ToolKind {
        ToolKind::Read
    }

    fn run<'a>(
        &'a self,
        args: Value,
        ctx: &'a ToolContext,
        _cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let p: Params = parse_args(args)?;
            let hook = ctx.lint.clone().filter(|h| h.view.is_some()).ok_or_else(|| {
                ToolError::Failed(
                    "diagnostics are only available when working in a branch (shadow session or speculation)".into(),
                )
            })?;
            let paths = match p.paths {
                Some(list) => {
                    let mut v = Vec::new();
                    for a in list {
                        v.push(rel_path(ctx, Some(&a)).ok_or_else(|| {
                            ToolError::Failed(format!("{a} is not a file in the workspace"))
                        })?);
                    }
                    v
                }
                None => hook.touched(),
            };
            if paths.is_empty() {
                return Ok(ToolOutput {
                    content: "No files edited yet, so no new diagnostics.".into(),
                    display: "no edited files".into(),
                });
            }
            let n = paths.len();
            let found = blocking(move || {
                let view = hook
                    .view
                    .as_ref()
                    .ok_or_else(|| ToolError::Failed("not in a branch".into()))?;
                hook.linter
                    .new_diagnostics(view, &paths, TOOL_TIMEOUT)
                    .map_err(|e| ToolError::Failed(e.to_string()))
            })
            .await?;
            let display = format!(
                "{} new diagnostic{} in {n} file{}",
                found.len(),
                if found.len() == 1 { "" } else { "s" },
                if n == 1 { "" } else { "s" }
            );
            let content = if found.is_empty() {
                "No new diagnostics.".to_string()
            } else {
                lines(&found)
            };
            Ok(ToolOutput { content, display })
        })
    }
}
