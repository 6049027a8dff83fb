//! Oversized tool output (the seed's summarizeToolOutput): output over a tool's token budget
//! is kept whole in a log under the state dir, and the model gets the command, the exit
//! status, the first and last lines verbatim, a fast-model summary of the rest, and the log's
//! path, instead of a cut it cannot see past.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use super::text::{cap_line, plural};
use super::ToolContext;
use crate::background::prompt_id;
use crate::llm::Message;

/// Rough tokens of a text of `bytes` bytes (about four bytes a token for code and logs).
pub fn tokens(bytes: u64) -> u64 {
    bytes.div_ceil(4)
}

/// Bytes of the log's start and of its end the summariser reads (plus matching lines between).
const EXCERPT_BYTES: u64 = 64 * 1024;
/// Lines mentioning errors taken from the part between, at most.
const MAX_MIDDLE_LINES: usize = 200;

/// A command's whole output (stdout and stderr as they arrive), in memory while small and
/// spilled to a file under `dir` once it passes `keep` bytes.
pub struct FullLog {
    dir: PathBuf,
    name: String,
    keep: usize,
    state: Mutex<LogState>,
}

#[derive(Default)]
struct LogState {
    memory: Vec<u8>,
    file: Option<(PathBuf, File)>,
    total: u64,
    error: Option<String>,
}

impl FullLog {
    /// A log for one call of `tool`, spilled under `dir` past `keep` bytes.
    pub fn new(dir: &Path, tool: &str, keep: usize) -> Arc<Self> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let millis = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        Arc::new(Self {
            dir: dir.to_path_buf(),
            name: format!("{tool}-{millis}-{}-{seq}.log", std::process::id()),
            keep,
            state: Mutex::new(LogState::default()),
        })
    }

    /// Append a chunk of output.
    pub fn write(&self, bytes: &[u8]) {
        let Ok(mut st) = self.state.lock() else {
            return;
        };
        st.total += bytes.len() as u64;
        if st.error.is_some() {
            return;
        }
        if st.file.is_none() {
            if st.memory.len() + bytes.len() <= self.keep {
                st.memory.extend_from_slice(bytes);
                return;
            }
            match self.create() {
                Ok(pair) => {
                    st.file = Some(pair);
                    let held = std::mem::take(&mut st.memory);
                    self.append(&mut st, &held);
                }
                Err(e) => {
                    st.error = Some(e);
                    return;
                }
            }
        }
        self.append(&mut st, bytes);
    }

    fn append(&self, st: &mut LogState, bytes: &[u8]) {
        if let Some((path, f)) = st.file.as_mut() {
            if let Err(e) = f.write_all(bytes) {
                st.error = Some(format!("cannot write {}: {e}", path.display()));
            }
        }
    }

    fn create(&self) -> Result<(PathBuf, File), String> {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| format!("cannot create {}: {e}", self.dir.display()))?;
        let path = self.dir.join(&self.name);
        // Output can hold secrets: only the user reads it.
        let file = std::fs::OpenOptions::new()
            .create_new(true)
            .read(true)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        Ok((path, file))
    }

    /// Bytes written so far.
    pub fn total(&self) -> u64 {
        self.state.lock().map(|s| s.total).unwrap_or(0)
    }

    /// Make sure the whole output is on disk; its path, or why it could not be kept.
    fn persist(&self) -> Result<PathBuf, String> {
        let mut st = self
            .state
            .lock()
            .map_err(|_| "output log poisoned".to_string())?;
        if st.file.is_none() && st.error.is_none() {
            match self.create() {
                Ok(pair) => {
                    st.file = Some(pair);
                    let held = std::mem::take(&mut st.memory);
                    self.append(&mut st, &held);
                }
                Err(e) => st.error = Some(e),
            }
        }
        if let Some(e) = &st.error {
            return Err(e.clone());
        }
        match st.file.as_mut() {
            Some((path, f)) => {
                f.flush()
                    .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
                Ok(path.clone())
            }
            None => Err("output log missing".into()),
        }
    }

    /// Drop the log (the output fitted the budget).
    fn discard(&self) {
        if let Ok(mut st) = self.state.lock() {
            if let Some((path, _)) = st.file.take() {
                let _ = std::fs::remove_file(path);
            }
            st.memory = Vec::new();
        }
    }
}

/// The parts of a log the model and the summariser see.
struct Excerpt {
    /// First lines, verbatim.
    head: String,
    /// Last lines, verbatim.
    tail: String,
    /// For the summariser: start, matching lines of the middle, end.
    for_summary: String,
}

fn read_range(f: &mut File, from: u64, len: u64) -> std::io::Result<Vec<u8>> {
    f.seek(SeekFrom::Start(from))?;
    let mut buf = Vec::new();
    f.take(len).read_to_end(&mut buf)?;
    Ok(buf)
}

/// Whole lines from the start of `bytes` (the last partial one dropped if any line ends).
fn whole_head(bytes: &[u8]) -> String {
    let end = bytes
        .iter()
        .rposition(|b| *b == b'\n')
        .map_or(bytes.len(), |i| i + 1);
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// Whole lines from the end of `bytes` (the first partial one dropped if any line ends).
fn whole_tail(bytes: &[u8], at_start: bool) -> String {
    let start = if at_start {
        0
    } else {
        bytes.iter().position(|b| *b == b'\n').map_or(0, |i| i + 1)
    };
    String::from_utf8_lossy(&bytes[start..]).into_owned()
}

fn excerpt(path: &Path, total: u64, keep: u64) -> std::io::Result<Excerpt> {
    let mut f = File::open(path)?;
    let head = whole_head(&read_range(&mut f, 0, keep)?);
    let tail_from = total.saturating_sub(keep);
    let tail = whole_tail(&read_range(&mut f, tail_from, keep)?, tail_from == 0);
    let start = whole_head(&read_range(&mut f, 0, EXCERPT_BYTES)?);
    let end_from = total.saturating_sub(EXCERPT_BYTES);
    let end = whole_tail(&read_range(&mut f, end_from, EXCERPT_BYTES)?, end_from == 0);
    let mut middle = Vec::new();
    if total > 2 * EXCERPT_BYTES {
        f.seek(SeekFrom::Start(EXCERPT_BYTES))?;
        let reader = BufReader::new((&mut f).take(end_from - EXCERPT_BYTES));
        let alarming = ["error", "warning", "fail", "panic", "exception", "fatal"];
        for line in reader.split(b'\n') {
            let line = String::from_utf8_lossy(&line?).into_owned();
            let lower = line.to_ascii_lowercase();
            if alarming.iter().any(|w| lower.contains(w)) {
                middle.push(cap_line(&line, 300));
                if middle.len() >= MAX_MIDDLE_LINES {
                    break;
                }
            }
        }
    }
    let mut for_summary = start;
    if total > 2 * EXCERPT_BYTES {
        for_summary.push_str(&format!(
            "\n[… {} bytes between; lines from them that mention errors, warnings or failures: {} …]\n",
            end_from - EXCERPT_BYTES,
            middle.len()
        ));
        for l in &middle {
            for_summary.push_str(l);
            for_summary.push('\n');
        }
        for_summary.push_str("[… end of the output …]\n");
        for_summary.push_str(&end);
    } else if total > EXCERPT_BYTES {
        for_summary.push_str(&end);
    }
    Ok(Excerpt {
        head,
        tail,
        for_summary,
    })
}

/// What a tool call produced, for [`fit`].
pub struct Produced<'a> {
    /// Tool name (for the budget's wording).
    pub tool: &'a str,
    /// The command or call, as the model gave it.
    pub call: &'a str,
    /// The status line (`Exit code: 1`).
    pub status: &'a str,
    /// The tool's ordinary, capped result.
    pub content: String,
}

/// The result the model gets: `produced.content` when the whole output fits `budget` tokens
/// (or `budget` is 0), otherwise a summary with head and tail verbatim and the log's path.
pub async fn fit(
    ctx: &ToolContext,
    budget: usize,
    log: &FullLog,
    produced: Produced<'_>,
    cancel: &CancellationToken,
) -> String {
    let total = log.total();
    if budget == 0 || tokens(total) <= budget as u64 {
        log.discard();
        return produced.content;
    }
    let path = match log.persist() {
        Ok(p) => p,
        Err(e) => {
            return format!(
                "{}\n[The output ({total} bytes) is over the {budget}-token budget but could not \
                 be kept in full: {e}.]",
                produced.content
            )
        }
    };
    // A quarter of the budget for each of the head and the tail (about a token per 4 bytes).
    let keep = (budget as u64).max(256);
    let p = path.clone();
    let parts = match tokio::task::spawn_blocking(move || excerpt(&p, total, keep)).await {
        Ok(Ok(parts)) => parts,
        _ => {
            return format!(
                "{}\n[The full output ({total} bytes) is in {}.]",
                produced.content,
                path.display()
            )
        }
    };
    let summary = summarise(ctx, budget, &produced, &parts.for_summary, cancel).await;
    let mut out = format!(
        "{status}\nCommand: {call}\nOutput: {total} bytes (about {tok} tokens), over the \
         {budget}-token budget of {tool} output. The full output (stdout and stderr as they \
         arrived) is saved in {path}; search it with grep or read parts with sed -n or tail \
         instead of running the command again.\n",
        status = produced.status,
        call = produced.call,
        tok = tokens(total),
        tool = produced.tool,
        path = path.display(),
    );
    match summary {
        Ok(text) => out.push_str(&format!(
            "\nSummary (by the fast model):\n{}\n",
            text.trim()
        )),
        Err(why) => out.push_str(&format!("\n[No summary: {why}.]\n")),
    }
    out.push_str(&format!(
        "\nFirst {}, verbatim:\n{}",
        plural(parts.head.lines().count(), "line"),
        parts.head
    ));
    if !parts.head.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&format!(
        "[…]\nLast {}, verbatim:\n{}",
        plural(parts.tail.lines().count(), "line"),
        parts.tail
    ));
    out
}

async fn summarise(
    ctx: &ToolContext,
    budget: usize,
    produced: &Produced<'_>,
    excerpt: &str,
    cancel: &CancellationToken,
) -> Result<String, String> {
    let Some(bg) = &ctx.background else {
        return Err("no model configured for background work".into());
    };
    let system = "You summarise the output of a tool call for a coding agent that cannot read \
        all of it. Keep what the agent needs to act: errors and warnings with their file:line, \
        failing tests and their messages, counts, the final result. Quote exact error text \
        briefly; drop progress noise. Plain text, no preamble.";
    let user = format!(
        "Tool: {}\nCall: {}\n{}\n\nOutput (start, lines of interest from the middle, end):\n{}",
        produced.tool, produced.call, produced.status, excerpt
    );
    let mut request = bg.request(
        prompt_id::OUTPUT_SUMMARY,
        vec![
            Message::System {
                content: system.into(),
            },
            Message::User { content: user },
        ],
        Vec::new(),
    );
    request.max_tokens = Some((budget / 2).max(256) as u32);
    match bg.complete(&request, cancel).await {
        Ok(c) if !c.text.trim().is_empty() => Ok(c.text),
        Ok(_) => Err("the model returned an empty summary".into()),
        Err(e) => Err(format!("the summary call failed: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_logs_stay_in_memory_and_big_ones_spill() {
        let dir = tempfile::tempdir().expect("tmp");
        let log = FullLog::new(dir.path(), "shell", 10);
        log.write(b"12345");
        assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 0);
        log.write(b"678901\n");
        let path = log.persist().expect("persist");
        assert_eq!(std::fs::read(&path).expect("read"), b"12345678901\n");
        log.discard();
        assert!(!path.exists());
    }

    #[test]
    fn excerpt_keeps_whole_lines_at_both_ends() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("log");
        let text: String = (0..100_000).map(|i| format!("line {i}\n")).collect();
        let text = text.replace("line 50000\n", "error: boom at 50000\n");
        std::fs::write(&path, &text).expect("write");
        let e = excerpt(&path, text.len() as u64, 100).expect("excerpt");
        assert!(e.head.starts_with("line 0\n") && e.head.ends_with('\n'));
        assert!(e.tail.ends_with("line 99999\n") && e.tail.starts_with("line "));
        assert!(e.for_summary.contains("error: boom at 50000"));
        assert!(e.for_summary.len() < 3 * EXCERPT_BYTES as usize);
    }
}
