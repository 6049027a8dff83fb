//! `grep`: regex search over the workspace, honouring .gitignore (the `ignore` crate, as
//! ripgrep does), skipping binary files.

use std::io::BufRead;
use std::ops::ControlFlow;

use serde::Deserialize;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::text::{cap_line, looks_binary, plural};
use super::{run_blocking, Tool, ToolContext, ToolError, ToolKind, ToolOutput};
use crate::llm::{BoxFuture, ToolSpec};
use crate::workspace::Kind;

/// Matches returned when no limit is given.
pub const DEFAULT_MAX_RESULTS: usize = 200;

/// The tool.
#[derive(Debug, Default)]
pub struct Grep;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    pattern: String,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    include: Option<String>,
    #[serde(default)]
    case_insensitive: bool,
    #[serde(default)]
    max_results: Option<usize>,
}

impl Tool for Grep {
    fn name(&self) -> &'static str {
        "grep"
    }

    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name().into(),
            description: "Search file contents with a regular expression (Rust regex syntax). \
                Files ignored by .gitignore and binary files are skipped. Returns `path:line: text`."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "description": "Regular expression."},
                    "path": {"type": "string", "description": "Directory or file to search. Default: the workspace root."},
                    "include": {"type": "string", "description": "Only files whose path matches this glob, e.g. `*.rs` or `src/**/*.ts`."},
                    "case_insensitive": {"type": "boolean"},
                    "max_results": {"type": "integer", "minimum": 1, "description": "Default 200."}
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
        run_blocking(args, ctx, move |ws, p| search(ws, p, &cancel))
    }
}

fn search(
    ws: &crate::workspace::Workspace,
    p: Params,
    cancel: &CancellationToken,
) -> Result<ToolOutput, ToolError> {
    let re = regex::RegexBuilder::new(&p.pattern)
        .case_insensitive(p.case_insensitive)
        .build()
        .map_err(|e| ToolError::InvalidArgs(format!("bad regex: {e}")))?;
    let include = match &p.include {
        Some(g) => Some(
            globset::GlobBuilder::new(g)
                .literal_separator(false)
                .build()
                .map_err(|e| ToolError::InvalidArgs(format!("bad include glob: {e}")))?
                .compile_matcher(),
        ),
        None => None,
    };
    let start = ws.resolve(p.path.as_deref().unwrap_or("."))?;
    let max = p.max_results.unwrap_or(DEFAULT_MAX_RESULTS).max(1);
    let mut hits = Vec::new();
    let mut files_with_hits = 0;
    let mut more = false;
    let files = ws
        .files()
        .map_err(|e| ToolError::Failed(format!("cannot search: {e}")))?;
    let mut cancelled = false;
    // A start that is missing (or leads out) has no matches, as before.
    let _ = files.walk(ws.relative(&start), &mut |entry| {
        if cancel.is_cancelled() {
            cancelled = true;
            return ControlFlow::Break(());
        }
        if entry.kind != Kind::File {
            return ControlFlow::Continue(());
        }
        let rel = ws.display(&ws.root().join(entry.rel));
        if let Some(m) = &include {
            if !m.is_match(&rel) && !m.is_match(entry.file_name()) {
                return ControlFlow::Continue(());
            }
        }
        let Ok(bytes) = entry.read() else {
            return ControlFlow::Continue(());
        };
        if looks_binary(&bytes) {
            return ControlFlow::Continue(());
        }
        let mut file_hit = false;
        for (i, line) in bytes.lines().enumerate() {
            let Ok(line) = line else {
                return ControlFlow::Continue(());
            };
            if re.is_match(&line) {
                if hits.len() >= max {
                    more = true;
                    return ControlFlow::Break(());
                }
                file_hit = true;
                hits.push(format!(
                    "{rel}:{}: {}",
                    i + 1,
                    cap_line(line.trim_end(), 300)
                ));
            }
        }
        if file_hit {
            files_with_hits += 1;
        }
        ControlFlow::Continue(())
    });
    if cancelled {
        return Err(ToolError::Cancelled);
    }
    let summary = format!(
        "{} in {}",
        plural(hits.len(), "match"),
        plural(files_with_hits, "file")
    );
    if hits.is_empty() {
        return Ok(ToolOutput {
            content: format!("No matches for /{}/.", p.pattern),
            display: format!("grep /{}/: no matches", p.pattern),
        });
    }
    let mut content = hits.join("\n");
    if more {
        content.push_str(&format!(
            "\n[Stopped at {max} matches; narrow the pattern or path, or raise max_results.]"
        ));
    }
    Ok(ToolOutput {
        content,
        display: format!(
            "grep /{}/: {summary}{}",
            p.pattern,
            if more { "+" } else { "" }
        ),
    })
}
