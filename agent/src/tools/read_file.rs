//! `read_file`: read a text file, a page of lines at a time, saying clearly when the result is
//! truncated and how to read more; binary files are detected and not dumped.
//!
//! The file is streamed and only the requested lines are held: a file of empty lines is
//! millions of lines in a few MiB, and shade's own process has no memory limit.

use std::io::{BufRead, BufReader, Read};

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
    let file = files
        .open_file(rel)
        .map(std::fs::File::from)
        .map_err(|e| ToolError::Failed(format!("cannot read {shown}: {e}")))?;
    let len = file
        .metadata()
        .map_err(|e| ToolError::Failed(format!("cannot read {shown}: {e}")))?
        .len();
    if len > MAX_FILE_BYTES {
        return Err(ToolError::Failed(format!(
            "{shown} is too large ({len} bytes, limit {MAX_FILE_BYTES}); use grep or shell (sed -n) to read parts of it"
        )));
    }
    let mut file = file.take(MAX_FILE_BYTES);
    // One byte past the window `looks_binary` looks at: it tells a file cut there from one
    // that ends there.
    let mut head = Vec::with_capacity(8193);
    (&mut file)
        .take(8193)
        .read_to_end(&mut head)
        .map_err(|e| ToolError::Failed(format!("cannot read {shown}: {e}")))?;
    if looks_binary(&head) {
        return Ok(ToolOutput {
            content: format!("{shown} is a binary file ({len} bytes); its content is not shown."),
            display: format!("Read {shown}: binary file, not shown"),
        });
    }
    let offset = p.offset.unwrap_or(1).max(1);
    let limit = p.limit.unwrap_or(DEFAULT_LIMIT).max(1);
    let start = offset - 1;
    let window_end = start.saturating_add(limit);
    // The file is streamed: only the lines of the window are kept (a file of empty lines
    // is millions of them), each cut to what it may show.
    let mut reader = BufReader::with_capacity(64 << 10, std::io::Cursor::new(head).chain(file));
    let mut total = 0usize;
    let mut body = String::new();
    let mut cut_lines = 0;
    let mut ends_with_newline = false;
    let mut line = Vec::new();
    loop {
        if total >= window_end {
            // Past the window only the number of lines is wanted.
            let (rest, newline) = count_lines(&mut reader)
                .map_err(|e| ToolError::Failed(format!("cannot read {shown}: {e}")))?;
            if rest > 0 {
                total += rest;
                ends_with_newline = newline;
            }
            break;
        }
        line.clear();
        let hold = if total < start { 0 } else { LINE_HOLD };
        let Some(newline) = next_line(&mut reader, &mut line, hold)
            .map_err(|e| ToolError::Failed(format!("cannot read {shown}: {e}")))?
        else {
            break;
        };
        ends_with_newline = newline;
        if (start..window_end).contains(&total) {
            if total > start {
                body.push('\n');
            }
            let mut bytes = &line[..line.len().min(LINE_HOLD)];
            if newline && line.len() <= LINE_HOLD {
                bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
            }
            let text = String::from_utf8_lossy(bytes);
            if line.len() > LINE_HOLD || text.chars().count() > MAX_LINE_CHARS {
                cut_lines += 1;
            }
            body.push_str(&cap_line(&text, MAX_LINE_CHARS));
        }
        total += 1;
    }
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
    let end = window_end.min(total);
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
    content.push_str(&body);
    if end == total && ends_with_newline {
        content.push('\n');
    }
    let display = if partial {
        format!("Read {shown} (lines {}-{} of {total})", start + 1, end)
    } else {
        format!("Read {shown} ({})", plural(total, "line"))
    };
    Ok(ToolOutput { content, display })
}

/// The most of one line held: enough for [`MAX_LINE_CHARS`] characters of any width (and
/// a `\r`); a longer line is cut anyway.
const LINE_HOLD: usize = MAX_LINE_CHARS * 4 + 1;

/// The lines left in `r` (a last one without `\n` counts), and whether the last ended
/// with `\n`.
fn count_lines(r: &mut impl BufRead) -> std::io::Result<(usize, bool)> {
    let (mut lines, mut last) = (0usize, None);
    loop {
        let buf = r.fill_buf()?;
        let Some(&end) = buf.last() else {
            return Ok((
                lines + usize::from(last.is_some_and(|b| b != b'\n')),
                last == Some(b'\n'),
            ));
        };
        lines += buf.iter().filter(|&&b| b == b'\n').count();
        last = Some(end);
        let n = buf.len();
        r.consume(n);
    }
}

/// Read one line of `r` into `out` without its `\n`, keeping at most `max + 1` bytes of it
/// (one more than `max` tells a cut line; the rest is read past, not held). `None` at the
/// end; else whether the line ended with `\n`.
fn next_line(r: &mut impl BufRead, out: &mut Vec<u8>, max: usize) -> std::io::Result<Option<bool>> {
    let mut any = false;
    loop {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            return Ok(any.then_some(false));
        }
        any = true;
        let (chunk, newline) = match buf.iter().position(|&b| b == b'\n') {
            Some(at) => (at, true),
            None => (buf.len(), false),
        };
        let room = (max + 1).saturating_sub(out.len());
        out.extend_from_slice(&buf[..chunk.min(room)]);
        r.consume(chunk + usize::from(newline));
        if newline {
            return Ok(Some(true));
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// What the tool showed when it held the whole file and its list of lines: the
    /// streamed reading must show the same.
    fn whole(text: &str, offset: usize, limit: usize) -> String {
        let lines: Vec<&str> = text.lines().collect();
        let end = (offset - 1 + limit).min(lines.len());
        let body: Vec<String> = lines[offset - 1..end]
            .iter()
            .map(|l| cap_line(l, MAX_LINE_CHARS))
            .collect();
        let mut out = body.join("\n");
        if end == lines.len() && text.ends_with('\n') {
            out.push('\n');
        }
        out
    }

    #[test]
    fn streamed_lines_are_the_lines_of_the_whole_text() {
        let long = "é".repeat(3000);
        let cases = [
            "a\nb\nc\n".to_string(),
            "a\r\nb\r\nc".to_string(),
            "\n\n\n".to_string(),
            "x\ry\n z\r".to_string(),
            format!("short\n{long}\nafter\n"),
            format!("{}\n", "z".repeat(9000)),
        ];
        let t = tempfile::tempdir().unwrap();
        let ws = crate::workspace::Workspace::new(t.path()).unwrap();
        for text in &cases {
            std::fs::write(t.path().join("f.txt"), text).unwrap();
            let total = text.lines().count();
            for (offset, limit) in [(1, 2000), (1, 1), (2, 1), (total, 5)] {
                if offset > total {
                    continue;
                }
                let p = Params {
                    path: "f.txt".into(),
                    offset: Some(offset),
                    limit: Some(limit),
                };
                let out = read(&ws, p).unwrap().content;
                let body: String = out
                    .split_inclusive('\n')
                    .skip_while(|l| l.starts_with('['))
                    .collect();
                assert_eq!(
                    body,
                    whole(text, offset, limit),
                    "{text:?} {offset} {limit}"
                );
            }
        }
    }
}
