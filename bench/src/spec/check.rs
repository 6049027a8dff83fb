//! Results, not only times: what a turn did (its tool calls' outcomes and the changes it made
//! to the project), so an accepted speculation can be compared with the same turn run live,
//! and a replay can tell when a tool result left the recording.
//!
//! A tool result's *outcome* is what must not differ between two runs of the same step: a
//! shell command's exit code (or signal, or timeout), any other tool's success or error. Its
//! text may differ (timings, paths) and is not compared. A turn's *changes* are the files it
//! created, changed or removed (content and mode), build and cache directories left out, and,
//! in a git repository, the index and HEAD's tree.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};
use serde_json::Value;
use shade_agent::llm::Message;
use shade_testkit::is_suggestion_prompt;

/// Directories whose contents are outputs and caches that differ run to run (build trees,
/// dependency installs, coverage and test caches); `.git` is summarised separately.
const SKIPPED_DIRS: &[&str] = &[
    ".git",
    "target",
    "node_modules",
    "__pycache__",
    ".pytest_cache",
    ".ruff_cache",
    ".mypy_cache",
    ".nyc_output",
    "coverage",
];

/// The outcome of one tool result: `exit N`, `signal N`, `timeout`, `error` or `ok`.
pub fn tool_outcome(content: &str) -> String {
    let first = content.lines().next().unwrap_or("").trim();
    if let Some(code) = first.strip_prefix("Exit code: ") {
        format!("exit {code}")
    } else if let Some(sig) = first.strip_prefix("Killed by signal ") {
        format!("signal {sig}")
    } else if first.starts_with("Error") || first.starts_with("error:") {
        "error".into()
    } else if first.to_ascii_lowercase().contains("timed out") {
        "timeout".into()
    } else {
        "ok".into()
    }
}

/// The outcomes of the tool results after the last real user message of a request body
/// (`{"messages": [...]}`), in order: the signature a replayed answer is keyed by.
pub fn outcomes_since_user(body: &Value) -> Vec<String> {
    let Some(messages) = body["messages"].as_array() else {
        return Vec::new();
    };
    let start = messages
        .iter()
        .rposition(|m| {
            m["role"] == "user" && !is_suggestion_prompt(m["content"].as_str().unwrap_or(""))
        })
        .map_or(0, |i| i + 1);
    messages[start..]
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| tool_outcome(m["content"].as_str().unwrap_or("")))
        .collect()
}

/// `tool: outcome` of every tool call after the last real user message of `conversation`
/// (the turn just run, speculated and live parts alike).
pub fn turn_tools(conversation: &[Message]) -> Vec<String> {
    let start = conversation
        .iter()
        .rposition(|m| matches!(m, Message::User { content } if !is_suggestion_prompt(content)))
        .map_or(0, |i| i + 1);
    let mut names = BTreeMap::new();
    let mut out = Vec::new();
    for m in &conversation[start..] {
        match m {
            Message::Assistant { tool_calls, .. } => {
                for c in tool_calls {
                    names.insert(c.id.clone(), c.name.clone());
                }
            }
            Message::Tool {
                tool_call_id,
                content,
            } => {
                let name = names.get(tool_call_id).map_or("?", String::as_str);
                out.push(format!("{name}: {}", tool_outcome(content)));
            }
            _ => {}
        }
    }
    out
}

/// The state of a project: path → content digest (and mode), plus `.git:*` entries for a
/// repository's index and HEAD.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot(BTreeMap<String, String>);

/// FNV-1a, 64 bits: stable across builds and machines (shards merge).
fn fnv(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) -> Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .flatten()
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        let meta = std::fs::symlink_metadata(&path)?;
        let rel = path
            .strip_prefix(root)
            .unwrap_or(&path)
            .to_string_lossy()
            .into_owned();
        if meta.is_dir() {
            if !SKIPPED_DIRS.contains(&name.as_str()) {
                walk(root, &path, out)?;
            }
        } else if meta.file_type().is_symlink() {
            let target = std::fs::read_link(&path)?;
            out.insert(rel, format!("-> {}", target.display()));
        } else if meta.is_file() {
            let data =
                std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            let exec = meta.permissions().mode() & 0o111 != 0;
            out.insert(
                rel,
                format!("{:016x}{}", fnv(&data), if exec { " x" } else { "" }),
            );
        }
    }
    Ok(())
}

/// `git ARGS` in `dir`, bounded in time; its stdout.
fn git(dir: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new("timeout")
        .args(["-k", "5", "60", "git"])
        .args(args)
        .current_dir(dir)
        .env("GIT_OPTIONAL_LOCKS", "0")
        .output()
        .with_context(|| format!("git {args:?}"))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Snapshot {
    /// Read `project` now.
    pub fn take(project: &Path) -> Result<Snapshot> {
        let mut files = BTreeMap::new();
        walk(project, project, &mut files)?;
        if project.join(".git").exists() {
            files.insert(
                ".git:head-tree".into(),
                git(project, &["rev-parse", "HEAD^{tree}"])?.trim().into(),
            );
            files.insert(
                ".git:commits".into(),
                git(project, &["rev-list", "--count", "HEAD"])?
                    .trim()
                    .into(),
            );
            files.insert(
                ".git:index".into(),
                format!(
                    "{:016x}",
                    fnv(git(project, &["ls-files", "-s"])?.as_bytes())
                ),
            );
        }
        Ok(Snapshot(files))
    }

    /// What changed from `self` to `after`: `path: digest` for created or changed entries,
    /// `path: removed` for removed ones, sorted by path.
    pub fn changes(&self, after: &Snapshot) -> Vec<String> {
        let mut out = Vec::new();
        for (p, d) in &after.0 {
            if self.0.get(p) != Some(d) {
                out.push(format!("{p}: {d}"));
            }
        }
        for p in self.0.keys() {
            if !after.0.contains_key(p) {
                out.push(format!("{p}: removed"));
            }
        }
        out.sort();
        out
    }
}

/// How a turn's result differs from the reference's (the same turn run live): `None` when it
/// does not.
pub fn differs(
    tools: &[String],
    changes: &[String],
    ref_tools: &[String],
    ref_changes: &[String],
) -> Option<String> {
    let mut why = Vec::new();
    if tools != ref_tools {
        why.push(format!(
            "tools [{}] live [{}]",
            tools.join(", "),
            ref_tools.join(", ")
        ));
    }
    if changes != ref_changes {
        let only = |a: &[String], b: &[String]| -> Vec<String> {
            a.iter().filter(|x| !b.contains(x)).cloned().collect()
        };
        why.push(format!(
            "changes only speculated [{}], only live [{}]",
            only(changes, ref_changes).join(", "),
            only(ref_changes, changes).join(", ")
        ));
    }
    (!why.is_empty()).then(|| why.join("; "))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn outcomes_are_exit_codes_and_errors_not_text() {
        assert_eq!(
            tool_outcome("Exit code: 1\nStdout:\nFAIL\nStderr: (empty)"),
            "exit 1"
        );
        assert_eq!(
            tool_outcome("Killed by signal 9\nStdout: (empty)"),
            "signal 9"
        );
        assert_eq!(tool_outcome("Error: no such file"), "error");
        assert_eq!(tool_outcome("add.sh A B prints A+B.\n"), "ok");
        let body = json!({"messages": [
            {"role": "user", "content": "old"},
            {"role": "tool", "content": "Exit code: 3"},
            {"role": "user", "content": "run the tests"},
            {"role": "tool", "content": "fn main() {}"},
            {"role": "tool", "content": "Exit code: 0\nStdout: 12 ms"},
        ]});
        assert_eq!(outcomes_since_user(&body), vec!["ok", "exit 0"]);
    }

    #[test]
    fn changes_and_differences() {
        let dir = std::env::temp_dir().join(format!("shade-check-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("target")).unwrap();
        std::fs::write(dir.join("a"), "1").unwrap();
        std::fs::write(dir.join("b"), "1").unwrap();
        let before = Snapshot::take(&dir).unwrap();
        std::fs::write(dir.join("a"), "2").unwrap();
        std::fs::remove_file(dir.join("b")).unwrap();
        std::fs::write(dir.join("target/out"), "build output").unwrap();
        let after = Snapshot::take(&dir).unwrap();
        let ch = before.changes(&after);
        assert_eq!(ch.len(), 2, "{ch:?}");
        assert!(ch[0].starts_with("a: ") && ch[1] == "b: removed", "{ch:?}");
        let tools = vec!["shell: exit 0".to_string()];
        assert_eq!(differs(&tools, &ch, &tools, &ch), None);
        let other = vec!["shell: exit 1".to_string()];
        let why = differs(&other, &ch, &tools, &[]).unwrap();
        assert!(
            why.contains("exit 1") && why.contains("only speculated [a: "),
            "{why}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
