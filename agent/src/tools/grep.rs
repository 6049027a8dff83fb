//! `grep`: regex search over the workspace, honouring .gitignore (the `ignore` crate, as
//! ripgrep does), skipping binary files.
//!
//! Files are streamed, never held whole: a command in the branch may make a file of any
//! size (a sparse one costs it nothing) and shade's own process has no memory limit. A
//! line is looked at up to [`LINE_MAX`] bytes, a file up to [`FILE_MAX`], a call up to
//! [`CALL_BUDGET`] in all (each said in the result); a file is read once whatever number of
//! hard links it has, and only up to its first NUL byte (binary from there on).

use std::io::{BufRead, BufReader, Read};
use std::ops::ControlFlow;
use std::os::unix::fs::MetadataExt;

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

/// The most one grep call reads, all files together: the walk is otherwise unbounded (a
/// command may make many large files, or one sparse file and thousands of hard links to it)
/// and runs in shade's own process. Past it the call stops and says where.
pub const CALL_BUDGET: u64 = 256 << 20;

/// The most the matches of one call hold (whatever `max_results` asks).
pub const OUTPUT_MAX: usize = 1 << 20;

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
    search_within(ws, p, cancel, CALL_BUDGET).map(|(out, _)| out)
}

/// What one call read: for the tests, which assert on work done rather than on time.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Work {
    /// Bytes read from files.
    bytes: u64,
    /// Files opened and read from.
    files: usize,
}

/// A file being searched: counts what is read against the call's budget and ends the file
/// (reads as EOF) at its own limit, at the budget, or at a block holding a NUL byte (from
/// there on the file is binary: a hole of a sparse file reads as NULs, so a hole costs one
/// block, not its size).
struct Guarded<'a, R> {
    inner: R,
    /// What this file may still read (the smaller of [`FILE_MAX`] and the budget left).
    left: u64,
    /// Bytes read by the call so far.
    total: &'a mut u64,
    /// Ended at a NUL byte.
    binary: bool,
    /// Ended at `left` with the file not yet at its end (unknown until the next byte).
    cut: bool,
}

impl<R: Read> Read for Guarded<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.binary || self.cut || buf.is_empty() {
            return Ok(0);
        }
        if self.left == 0 {
            // One byte more tells a file cut here from one ending here.
            let mut probe = [0u8; 1];
            if self.inner.read(&mut probe)? > 0 {
                self.cut = true;
            }
            return Ok(0);
        }
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        self.left -= n as u64;
        *self.total += n as u64;
        if buf[..n].contains(&0) {
            self.binary = true;
            return Ok(0);
        }
        Ok(n)
    }
}

fn search_within(
    ws: &crate::workspace::Workspace,
    p: Params,
    cancel: &CancellationToken,
    budget: u64,
) -> Result<(ToolOutput, Work), ToolError> {
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
    let mut hit_bytes = 0usize;
    let mut files_with_hits = 0;
    let mut more = false;
    let files = ws
        .files()
        .map_err(|e| ToolError::Failed(format!("cannot search: {e}")))?;
    let mut cancelled = false;
    let mut partial = Vec::new();
    let mut binary_tail = Vec::new();
    // Files already searched, by (device, inode): a hard link is the same content, and a
    // command may make any number of them for the price of one file.
    let mut seen: std::collections::HashSet<(u64, u64)> = std::collections::HashSet::new();
    let mut links = 0usize;
    let mut work = Work::default();
    // Set to the file at which the budget ran out.
    let mut out_of_budget: Option<String> = None;
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
        let Ok(file) = entry.open() else {
            return ControlFlow::Continue(());
        };
        let Ok(meta) = file.metadata() else {
            return ControlFlow::Continue(());
        };
        if !seen.insert((meta.dev(), meta.ino())) {
            links += 1;
            return ControlFlow::Continue(());
        }
        if work.bytes >= budget {
            out_of_budget = Some(rel);
            return ControlFlow::Break(());
        }
        work.files += 1;
        let mut guarded = Guarded {
            inner: file,
            left: FILE_MAX.min(budget - work.bytes),
            total: &mut work.bytes,
            binary: false,
            cut: false,
        };
        // One byte past the window `looks_binary` looks at: it tells a file cut there
        // from one that ends there.
        let mut head = Vec::with_capacity(8193);
        if (&mut guarded).take(8193).read_to_end(&mut head).is_err()
            || guarded.binary
            || looks_binary(&head)
        {
            return ControlFlow::Continue(());
        }
        let mut reader =
            BufReader::with_capacity(64 << 10, std::io::Cursor::new(head).chain(guarded));
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
                if hits.len() >= max || hit_bytes >= OUTPUT_MAX {
                    more = true;
                    return ControlFlow::Break(());
                }
                file_hit = true;
                let hit = format!("{rel}:{i}: {}", cap_line(text.trim_end(), 300));
                hit_bytes += hit.len() + 1;
                hits.push(hit);
            }
        }
        if file_hit {
            files_with_hits += 1;
        }
        let (_, guarded) = reader.into_inner().into_inner();
        if guarded.binary {
            binary_tail.push(rel);
        } else if guarded.cut {
            if guarded.left == 0 && work.bytes >= budget {
                out_of_budget = Some(rel);
                return ControlFlow::Break(());
            }
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
    let mut notes = String::new();
    if !partial.is_empty() {
        notes.push_str(&format!(
            "\n[Searched only the first {} MiB of {}: {}; use shell (grep) for the rest.]",
            FILE_MAX >> 20,
            plural(partial.len(), "larger file"),
            partial.join(", ")
        ));
    }
    if !binary_tail.is_empty() {
        notes.push_str(&format!(
            "\n[Searched {} only up to a NUL byte (binary data from there on): {}.]",
            plural(binary_tail.len(), "file"),
            binary_tail.join(", ")
        ));
    }
    if links > 0 {
        notes.push_str(&format!(
            "\n[Skipped {}: the same file as one already searched.]",
            plural(links, "hard link")
        ));
    }
    if let Some(at) = &out_of_budget {
        notes.push_str(&format!(
            "\n[Stopped at {at}: one grep call reads at most {} MiB in all and this one did; \
             files from there on (in walk order) were not searched. Narrow path or include, or \
             use shell (grep).]",
            budget >> 20
        ));
    }
    if hits.is_empty() {
        return Ok((
            ToolOutput {
                content: format!("No matches for /{}/.{notes}", p.pattern),
                display: format!("grep /{}/: no matches", p.pattern),
            },
            work,
        ));
    }
    let mut content = hits.join("\n");
    content.push_str(&notes);
    if more {
        content.push_str(&format!(
            "\n[Stopped at {} matches ({} KiB); narrow the pattern or path, or raise max_results.]",
            hits.len(),
            hit_bytes >> 10
        ));
    }
    Ok((
        ToolOutput {
            content,
            display: format!(
                "grep /{}/: {summary}{}",
                p.pattern,
                if more || out_of_budget.is_some() {
                    "+"
                } else {
                    ""
                }
            ),
        },
        work,
    ))
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

    /// Bytes this thread has read so far (`rchar`): the work a call did, counted by the
    /// kernel whatever the code under test counts.
    fn thread_read() -> u64 {
        let io = std::fs::read_to_string("/proc/thread-self/io").unwrap();
        let line = io.lines().find(|l| l.starts_with("rchar:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    fn params(pattern: &str) -> Params {
        Params {
            pattern: pattern.into(),
            path: None,
            include: None,
            case_insensitive: false,
            max_results: None,
        }
    }

    /// The red team's route: one text head, a sparse hole to 64 MiB (8 KiB of disk), and
    /// many hard links to it. Read once, and only up to the hole.
    #[test]
    fn hard_links_and_holes_cost_one_block() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("d")).unwrap();
        let f = t.path().join("d/t");
        let mut head = b"needle\n".to_vec();
        head.extend(std::iter::repeat_n(b'a', 8193));
        head.push(b'\n');
        std::fs::write(&f, &head).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&f)
            .unwrap()
            .set_len(64 << 20)
            .unwrap();
        for i in 0..50 {
            std::fs::hard_link(&f, t.path().join(format!("d/l{i:02}"))).unwrap();
        }
        let ws = crate::workspace::Workspace::new(t.path()).unwrap();
        let before = thread_read();
        let out = search(&ws, params("needle"), &CancellationToken::new()).unwrap();
        let read = thread_read() - before;
        assert!(
            read < 1 << 20,
            "read {read} bytes for one 64 MiB file and 50 links"
        );
        assert_eq!(
            out.content.matches(":1: needle").count(),
            1,
            "{}",
            out.content
        );
        assert!(
            out.content.contains("Skipped 50 hard links"),
            "{}",
            out.content
        );
        assert!(out.content.contains("up to a NUL byte"), "{}", out.content);
    }

    /// Many distinct large text files: the call stops at its budget and says so.
    #[test]
    fn a_call_reads_at_most_its_budget() {
        let t = tempfile::tempdir().unwrap();
        let text = "some text line\n".repeat(1 << 16); // 960 KiB
        for i in 0..8 {
            std::fs::write(t.path().join(format!("f{i}.txt")), &text).unwrap();
        }
        let ws = crate::workspace::Workspace::new(t.path()).unwrap();
        let budget = 3 << 20;
        let before = thread_read();
        let (out, work) =
            search_within(&ws, params("needle"), &CancellationToken::new(), budget).unwrap();
        let read = thread_read() - before;
        assert!(work.bytes <= budget, "{work:?}");
        assert!(work.files <= 4, "{work:?}");
        assert!(
            read < budget + (256 << 10),
            "read {read} bytes, budget {budget}"
        );
        assert!(
            out.content.contains("[Stopped at f3.txt"),
            "{}",
            out.content
        );
        assert!(out.content.contains("at most 3 MiB"), "{}", out.content);
    }

    /// Matches of a file of short matching lines stop at the output cap, whatever
    /// `max_results` asks.
    #[test]
    fn matches_are_capped_in_bytes() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("a.txt"), "x\n".repeat(2 << 20)).unwrap();
        let ws = crate::workspace::Workspace::new(t.path()).unwrap();
        let mut p = params("x");
        p.max_results = Some(usize::MAX);
        let out = search(&ws, p, &CancellationToken::new()).unwrap();
        assert!(
            out.content.len() < OUTPUT_MAX + 4096,
            "{}",
            out.content.len()
        );
        assert!(out.content.contains("[Stopped at"), "no note");
    }

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
