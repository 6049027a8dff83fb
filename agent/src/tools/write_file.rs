//! `write_file`: create or overwrite a whole file (parents created as needed).

use serde::Deserialize;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::text::plural;
use super::{parse_args, run_blocking, Tool, ToolContext, ToolError, ToolKind, ToolOutput};
use crate::llm::{BoxFuture, ToolSpec};
use crate::workspace::Workspace;

/// The tool.
#[derive(Debug, Default)]
pub struct WriteFile;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    path: String,
    content: String,
}

impl Tool for WriteFile {
    fn name(&self) -> &'static str {
        "write_file"
    }

    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name().into(),
            description:
                "Write a whole file in the workspace, creating it (and missing parent \
                directories) or replacing its content. Prefer `edit` for changes to existing files."
                    .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "File path, relative to the workspace root."},
                    "content": {"type": "string", "description": "The complete new content."}
                },
                "required": ["path", "content"],
                "additionalProperties": false
            }),
        }
    }

    fn kind(&self) -> ToolKind {
        ToolKind::Edit
    }

    fn preview(&self, args: &Value, ctx: &ToolContext) -> Option<String> {
        let p: Params = parse_args(args.clone()).ok()?;
        let path = ctx.workspace.resolve(&p.path).ok()?;
        let old = std::fs::read_to_string(&path).unwrap_or_default();
        Some(super::diff::unified(
            &ctx.workspace.display(&path),
            &old,
            &p.content,
        ))
    }

    fn run<'a>(
        &'a self,
        args: Value,
        ctx: &'a ToolContext,
        _cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        let path = crate::lint::tool::path_arg(&args);
        crate::lint::tool::with_diagnostics(ctx, path, run_blocking(args, ctx, write))
    }
}

fn write(ws: &Workspace, p: Params) -> Result<ToolOutput, ToolError> {
    let path = ws.resolve(&p.path)?;
    let shown = ws.display(&path);
    if path.is_dir() {
        return Err(ToolError::Failed(format!("{shown} is a directory")));
    }
    let existed = path.exists();
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| {
            ToolError::Failed(format!("cannot create directories for {shown}: {e}"))
        })?;
    }
    std::fs::write(&path, &p.content)
        .map_err(|e| ToolError::Failed(format!("cannot write {shown}: {e}")))?;
    let lines = plural(p.content.lines().count(), "line");
    let what = if existed { "Overwrote" } else { "Created" };
    Ok(ToolOutput {
        content: format!("{what} {shown} ({lines})."),
        display: format!("{what} {shown} ({lines})"),
    })
}
