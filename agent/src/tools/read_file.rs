//! `read_file`: read a text file, a page of lines at a time, saying clearly when the result is
//! truncated and how to read more; binary files are detected and not dumped.

use serde::Deserialize;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::text::{cap_line, looks_binary, plural};
use super::{run_blocking, Tool, ToolContext, ToolError, ToolKind, ToolOutput};
use crate::llm::{BoxFuture, ToolSpec};

/// Lines returned when no limit is given.
pub const DEFAULT_LIMIT: usize = 2000;
/// Longer lines are cut.
pub const MAX_LINE_CHARS: usize = 2000;
/// Files above this size are refused (read a range with grep/shell instead).
pub const MAX_FILE_BYTES: u64 = 20 * 1024 * 1024;

/// The tool.
#[derive(Debug, Default)]
pub struct ReadFile;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    path: String,
    #[serde(default)]
    offset: Option<usize>,
    #[serde(default)]
    limit: Option<usize>,
}

impl Tool for ReadFile {
    fn name(&self) -> &'static str {
        "read_file"
    }

    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name().into(),
            description: "Read a text file in the workspace. Returns its lines exactly (no line \
                numbers added). Large files are returned a page at a time: use `offset` (1-based \
                first line) and `limit` (number of lines) to read further."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "File path, relative to the workspace root."},
                    "offset": {"type": "integer", "minimum": 1, "description": "First line to read (1-based). Default 1."},
                    "limit": {"type": "integer", "minimum": 1, "description": "Maximum number of lines. Default 2000."}
                },
                "required": ["path"],
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
        run_blocking(args, ctx, read)
    }
}

fn read(ws: &crate::workspace::Workspace, p: Params) -> Result<ToolOutput, ToolError> {
    let path = ws.resolve(&p.path)?;
    let shown = ws.display(&path);
    let files = ws
        .files()
        .map_err(|e| ToolError::Failed(format!("cannot read {shown}: {e}")))?;
    let rel = ws.relative(&path);
    let meta = files.metadata(rel).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => ToolError::Failed(format!("file not found: {shown}")),
        _ => ToolError::Failed(format!("cannot read {shown}: {e}")),
    })?;
    if meta.is_dir() {
        return Err(ToolError::Failed(format!(
            "{shown} is a directory; use `ls` to list it"
        )));
    }
    if !meta.is_file() {
        return Err(ToolError::Failed(format!(
            "{shown} is not a regular file (device, socket or pipe); not read"
        )));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(ToolError::Failed(format!(
            "{shown} is too large ({} bytes, limit {MAX_FILE_BYTES}); use grep or shell (sed -n) to read parts of it",
            meta.len()
        )));
    }
    // Bounded on the descriptor it reads: the file may have grown or been swapped since.
    let bytes = files
        .read_at_most(rel, MAX_FILE_BYTES)
        .map_err(|e| ToolError::Failed(format!("cannot read {shown}: {e}")))?;
    if looks_binary(&bytes) {
        return Ok(ToolOutput {
            content: format!(
                "{shown} is a binary file ({} bytes); its content is not shown.",
                bytes.len()
            ),
            display: format!("Read {shown}: binary file, not shown"),
        });
    }
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    let total = lines.len();
    let offset = p.offset.unwrap_or(1).max(1);
    let limit = p.limit.unwrap_or(DEFAULT_LIMIT).max(1);
    if total == 0 {
        return Ok(ToolOutput {
            content: format!("{shown} is empty."),
            display: format!("Read {shown}: empty file"),
        });
    }
    if offset > total {
        return Err(ToolError::Failed(format!(
            "offset {offset} is past the end of {shown}, which has {}",
            plural(total, "line")
        )));
    }
    let start = offset - 1;
    let end = (start + limit).min(total);
    let mut cut_lines = 0;
    let body: Vec<String> = lines[start..end]
        .iter()
        .map(|l| {
            if l.chars().count() > MAX_LINE_CHARS {
                cut_lines += 1;
            }
            cap_line(l, MAX_LINE_CHARS)
        })
        .collect();
    let mut content = String::new();
    let partial = start > 0 || end < total;
    if partial {
        content.push_str(&format!(
            "[File content truncated: showing lines {}-{} of {} total lines.",
            start + 1,
            end,
            total
        ));
        if end < total {
            content.push_str(&format!(
                " To read more, call read_file with offset: {} (and optionally limit).",
                end + 1
            ));
        }
        content.push_str("]\n");
    }
    if cut_lines > 0 {
        content.push_str(&format!(
            "[{} longer than {MAX_LINE_CHARS} characters were cut.]\n",
            plural(cut_lines, "line")
        ));
    }
    content.push_str(&body.join("\n"));
    if end == total && text.ends_with('\n') {
        content.push('\n');
    }
    let display = if partial {
        format!("Read {shown} (lines {}-{} of {total})", start + 1, end)
    } else {
        format!("Read {shown} ({})", plural(total, "line"))
    };
    Ok(ToolOutput { content, display })
}
