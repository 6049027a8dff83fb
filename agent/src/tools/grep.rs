//! `grep`: regex search over the workspace, honouring .gitignore (the `ignore` crate, as
//! ripgrep does), skipping binary files.
//!
//! Files are streamed, never held whole: a command in the branch may make a file of any
//! size (a sparse one costs it nothing) and shade's own process has no memory limit. A
//! line is looked at up to [`LINE_MAX`] bytes, a file up to [`FILE_MAX`] (said in the
//! result).

use std::io::{BufRead, BufReader, Read};
use std::ops::ControlFlow;

use serde::Deserialize;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::text::{cap_line, looks_binary, plural};
use super::{run_blocking, Tool, ToolContext, ToolError, ToolKind, ToolOutput};
use crate::llm::{BoxFuture, ToolSpec};
use crate::workspace::Kind;

/// The most of one line grep holds: a longer line is matched on its first `LINE_MAX` bytes.
pub const LINE_MAX: usize = 1 << 20;

/// The most grep reads of one file; the rest is not searched (the result says so).
pub const FILE_MAX: u64 = 64 << 20;

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
    let mut partial = Vec::new();
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
        let Ok(mut file) = entry.open() else {
            return ControlFlow::Continue(());
        };
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        // One byte past the window `looks_binary` looks at: it tells a file cut there
        // from one that ends there.
        let mut head = Vec::with_capacity(8193);
        if (&mut file).take(8193).read_to_end(&mut head).is_err() || looks_binary(&head) {
            return ControlFlow::Continue(());
        }
        let mut reader = BufReader::with_capacity(
            64 << 10,
            std::io::Cursor::new(head).chain(file).take(FILE_MAX),
        );
        let mut file_hit = false;
        let mut line = Vec::new();
        let mut i = 0usize;
        loop {
            line.clear();
            match read_line_capped(&mut reader, &mut line, LINE_MAX) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            i += 1;
            if i.is_multiple_of(4096) && cancel.is_cancelled() {
                cancelled = true;
                return ControlFlow::Break(());
            }
            let text = String::from_utf8_lossy(&line);
            let text = text.strip_suffix('\n').unwrap_or(&text);
            let text = text.strip_suffix('\r').unwrap_or(text);
            if re.is_match(text) {
                if hits.len() >= max {
                    more = true;
                    return ControlFlow::Break(());
                }
                file_hit = true;
                hits.push(format!("{rel}:{i}: {}", cap_line(text.trim_end(), 300)));
            }
        }
        if file_hit {
            files_with_hits += 1;
        }
        if len > FILE_MAX {
            partial.push(rel);
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
    let partial_note = if partial.is_empty() {
        String::new()
    } else {
        format!(
            "\n[Searched only the first {} MiB of {}: {}; use shell (grep) for the rest.]",
            FILE_MAX >> 20,
            plural(partial.len(), "larger file"),
            partial.join(", ")
        )
    };
    if hits.is_empty() {
        return Ok(ToolOutput {
            content: format!("No matches for /{}/.{partial_note}", p.pattern),
            display: format!("grep /{}/: no matches", p.pattern),
        });
    }
    let mut content = hits.join("\n");
    content.push_str(&partial_note);
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

/// Append one line of `r` (with its `\n`) to `out`, keeping at most `max` bytes of it
/// (the rest is read past, not held). The bytes read, 0 at the end.
fn read_line_capped(r: &mut impl BufRead, out: &mut Vec<u8>, max: usize) -> std::io::Result<usize> {
    let mut total = 0;
    loop {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            return Ok(total);
        }
        let (chunk, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(at) => (at + 1, true),
            None => (buf.len(), false),
        };
        let room = max.saturating_sub(out.len());
        out.extend_from_slice(&buf[..chunk.min(room)]);
        r.consume(chunk);
        total += chunk;
        if done {
            return Ok(total);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn long_lines_are_cut_not_held() {
        let mut data = vec![b'a'; 10_000];
        data.extend_from_slice(b"\nshort\nlast");
        let mut r = std::io::BufReader::with_capacity(64, &data[..]);
        let mut line = Vec::new();
        assert_eq!(read_line_capped(&mut r, &mut line, 100).unwrap(), 10_001);
        assert_eq!(line.len(), 100);
        line.clear();
        assert_eq!(read_line_capped(&mut r, &mut line, 100).unwrap(), 6);
        assert_eq!(line, b"short\n");
        line.clear();
        assert_eq!(read_line_capped(&mut r, &mut line, 100).unwrap(), 4);
        assert_eq!(line, b"last");
        line.clear();
        assert_eq!(read_line_capped(&mut r, &mut line, 100).unwrap(), 0);
    }
}
