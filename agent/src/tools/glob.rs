//! `glob`: find files by name pattern, honouring .gitignore.

use std::ops::ControlFlow;

use serde::Deserialize;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::text::plural;
use super::{run_blocking, Tool, ToolContext, ToolError, ToolKind, ToolOutput};
use crate::llm::{BoxFuture, ToolSpec};
use crate::workspace::{Kind, Workspace};

/// Paths returned at most.
pub const MAX_RESULTS: usize = 500;

/// The tool.
#[derive(Debug, Default)]
pub struct Glob;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    pattern: String,
    #[serde(default)]
    path: Option<String>,
}

impl Tool for Glob {
    fn name(&self) -> &'static str {
        "glob"
    }

    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name().into(),
            description: "Find files whose path (relative to the search directory) matches a glob \
                such as `**/*.rs` or `src/*.toml`. Ignored files (.gitignore) are skipped."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "description": "Glob pattern; `**` crosses directories."},
                    "path": {"type": "string", "description": "Directory to search. Default: the workspace root."}
                },
                "required": ["pattern"],
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
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        let cancel = cancel.clone();
        run_blocking(args, ctx, move |ws, p| find(ws, p, &cancel))
    }
}

/// Walk from the search directory and keep the files whose relative path matches.
fn find(ws: &Workspace, p: Params, cancel: &CancellationToken) -> Result<ToolOutput, ToolError> {
    let matcher = globset::GlobBuilder::new(&p.pattern)
        .literal_separator(true)
        .build()
        .map_err(|e| ToolError::InvalidArgs(format!("bad glob: {e}")))?
        .compile_matcher();
    let start = ws.resolve(p.path.as_deref().unwrap_or("."))?;
    let mut found = Vec::new();
    let mut more = false;
    let files = ws
        .files()
        .map_err(|e| ToolError::Failed(format!("cannot search: {e}")))?;
    let base = ws.relative(&start).to_path_buf();
    let mut cancelled = false;
    // A start that is missing (or leads out) has no files, as before.
    let _ = files.walk(&base, &mut |entry| {
        if cancel.is_cancelled() {
            cancelled = true;
            return ControlFlow::Break(());
        }
        if entry.kind != Kind::File {
            return ControlFlow::Continue(());
        }
        let Ok(rel) = entry.rel.strip_prefix(&base) else {
            return ControlFlow::Continue(());
        };
        if matcher.is_match(rel) {
            if found.len() >= MAX_RESULTS {
                more = true;
                return ControlFlow::Break(());
            }
            found.push(ws.display(&ws.root().join(entry.rel)));
        }
        ControlFlow::Continue(())
    });
    if cancelled {
        return Err(ToolError::Cancelled);
    }
    if found.is_empty() {
        return Ok(ToolOutput {
            content: format!("No files match `{}`.", p.pattern),
            display: format!("glob {}: no files", p.pattern),
        });
    }
    let n = plural(found.len(), "file");
    let mut content = found.join("\n");
    if more {
        content.push_str(&format!(
            "\n[Stopped at {MAX_RESULTS} files; use a narrower pattern.]"
        ));
    }
    Ok(ToolOutput {
        content,
        display: format!("glob {}: {n}{}", p.pattern, if more { "+" } else { "" }),
    })
}
