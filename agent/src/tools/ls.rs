//! `ls`: list one directory (directories first, marked with `/`).

use serde::Deserialize;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::text::plural;
use super::{run_blocking, Tool, ToolContext, ToolError, ToolKind, ToolOutput};
use crate::llm::{BoxFuture, ToolSpec};
use crate::workspace::{Kind, Workspace};

/// Entries returned at most.
pub const MAX_ENTRIES: usize = 1000;

/// The tool.
#[derive(Debug, Default)]
pub struct Ls;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    #[serde(default)]
    path: Option<String>,
}

impl Tool for Ls {
    fn name(&self) -> &'static str {
        "ls"
    }

    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name().into(),
            description:
                "List a directory of the workspace: subdirectories (ending in `/`) first, \
                then files with their sizes."
                    .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Directory. Default: the workspace root."}
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
        run_blocking(args, ctx, list)
    }
}

fn list(ws: &Workspace, p: Params) -> Result<ToolOutput, ToolError> {
    let dir = ws.resolve(p.path.as_deref().unwrap_or("."))?;
    let shown = ws.display(&dir);
    let rd = ws
        .files()
        .and_then(|f| f.read_dir(ws.relative(&dir)))
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                ToolError::Failed(format!("directory not found: {shown}"))
            }
            _ => ToolError::Failed(format!("cannot list {shown}: {e}")),
        })?;
    let mut dirs = Vec::new();
    let mut files = Vec::new();
    for entry in rd {
        let name = entry.name.to_string_lossy().into_owned();
        if name == ".git" {
            continue;
        }
        match entry.kind {
            Kind::Dir => dirs.push(format!("{name}/")),
            _ => files.push((name, entry.len)),
        }
    }
    dirs.sort();
    files.sort();
    let total = dirs.len() + files.len();
    let mut lines: Vec<String> = dirs;
    lines.extend(
        files
            .into_iter()
            .map(|(n, len)| format!("{n} ({len} bytes)")),
    );
    let more = lines.len() > MAX_ENTRIES;
    lines.truncate(MAX_ENTRIES);
    let mut content = if lines.is_empty() {
        format!("{shown} is empty.")
    } else {
        lines.join("\n")
    };
    if more {
        content.push_str(&format!("\n[Showing {MAX_ENTRIES} of {total} entries.]"));
    }
    Ok(ToolOutput {
        content,
        display: format!("Listed {shown} ({})", plural(total, "entry")),
    })
}
