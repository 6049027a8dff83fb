//! `edit`: exact string replacement with an expected count, so the model's edit lands
//! exactly where it meant or fails with a reason it can act on. An `old_string` that misses
//! by escaping or whitespace is repaired (rules, then the fast model: see [`super::repair`])
//! when the repair matches exactly as often as expected; the result says so.

use serde::Deserialize;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::repair::{self, EditFix};
use super::text::{cap_middle, plural};
use super::{
    blocking, parse_args, run_blocking, Prepared, Tool, ToolContext, ToolError, ToolKind,
    ToolOutput,
};
use crate::llm::{BoxFuture, ToolSpec};

/// The distinct ways an edit can fail.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EditError {
    /// The file does not exist (and `old_string` was not empty, so this is not a creation).
    #[error("file not found: {0}; to create a new file use an empty old_string or write_file")]
    FileMissing(String),
    /// `old_string` does not occur.
    #[error("old_string was not found in {0} (0 occurrences); read the file again and copy the exact text, including whitespace and indentation")]
    NotFound(String),
    /// It occurs, but not as often as expected.
    #[error("expected {expected} replacement(s) in {path} but old_string occurs {found} times; make old_string more specific or set expected_replacements to {found}")]
    CountMismatch {
        /// File.
        path: String,
        /// `expected_replacements`.
        expected: usize,
        /// Actual occurrences.
        found: usize,
    },
    /// Creating a file that already exists.
    #[error("{0} already exists; an empty old_string only creates new files")]
    AlreadyExists(String),
    /// old and new are identical.
    #[error("old_string and new_string are identical; nothing to change")]
    NoChange,
}

/// The tool.
#[derive(Debug, Default)]
pub struct Edit;

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct Params {
    path: String,
    old_string: String,
    new_string: String,
    #[serde(default)]
    expected_replacements: Option<usize>,
}

impl Tool for Edit {
    fn name(&self) -> &'static str {
        "edit"
    }

    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name().into(),
            description: "Replace exact text in a file. `old_string` must match the file exactly \
                (whitespace included) and occur exactly `expected_replacements` times (default 1); \
                every occurrence is replaced. An empty `old_string` creates a new file with \
                `new_string` as content."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "File path, relative to the workspace root."},
                    "old_string": {"type": "string", "description": "Exact text to replace (include enough context to be unique)."},
                    "new_string": {"type": "string", "description": "Replacement text."},
                    "expected_replacements": {"type": "integer", "minimum": 1, "description": "How many occurrences to replace. Default 1."}
                },
                "required": ["path", "old_string", "new_string"],
                "additionalProperties": false
            }),
        }
    }

    fn kind(&self) -> ToolKind {
        ToolKind::Edit
    }

    fn preview(&self, args: &Value, ctx: &ToolContext) -> Option<String> {
        let p: Params = parse_args(args.clone()).ok()?;
        let (c, _) = compute_repaired(&ctx.workspace, p).ok()?;
        Some(super::diff::unified(
            &c.shown,
            c.old.as_deref().unwrap_or(""),
            &c.new,
        ))
    }

    fn run<'a>(
        &'a self,
        args: Value,
        ctx: &'a ToolContext,
        _cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        let path = super::diagnostics::path_arg(&args);
        super::diagnostics::with_diagnostics(ctx, path, run_blocking(args, ctx, apply))
    }

    fn prepare<'a>(
        &'a self,
        args: Value,
        ctx: &'a ToolContext,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Prepared> {
        Box::pin(async move {
            let unchanged = Prepared {
                args: args.clone(),
                note: None,
            };
            let Ok(p) = parse_args::<Params>(args) else {
                return unchanged;
            };
            let ws = ctx.workspace.clone();
            let rules = {
                let p = p.clone();
                blocking(move || Ok(rule_repair(&ws, &p))).await
            };
            let fix = match rules {
                Ok(Repair::AsGiven(_)) | Err(_) => return unchanged,
                Ok(Repair::Fixed(fix)) => fix,
                Ok(Repair::Missed {
                    current, expected, ..
                }) => {
                    let Some(bg) = &ctx.background else {
                        return unchanged;
                    };
                    let shown = match ctx.workspace.resolve(&p.path) {
                        Ok(path) => ctx.workspace.display(&path),
                        Err(_) => return unchanged,
                    };
                    let found = repair::edit_by_model(
                        bg,
                        &shown,
                        &current,
                        &p.old_string,
                        &p.new_string,
                        expected,
                        cancel,
                    )
                    .await;
                    match found {
                        Some(fix) => fix,
                        None => return unchanged,
                    }
                }
            };
            let note = note(&fix);
            let mut fixed = serde_json::Map::new();
            fixed.insert("path".into(), Value::String(p.path));
            fixed.insert("old_string".into(), Value::String(fix.old));
            fixed.insert("new_string".into(), Value::String(fix.new));
            if let Some(n) = p.expected_replacements {
                fixed.insert("expected_replacements".into(), json!(n));
            }
            Prepared {
                args: Value::Object(fixed),
                note: Some(note),
            }
        })
    }
}

/// What the rules made of an edit.
enum Repair {
    /// The edit as given: it matches, or fails for a reason no repair addresses.
    AsGiven(Result<Change, ToolError>),
    /// A rule repaired it.
    Fixed(EditFix),
    /// `old_string` misses and no rule helps: the model may, from this content.
    Missed {
        current: String,
        expected: usize,
        error: ToolError,
    },
}

fn rule_repair(ws: &crate::workspace::Workspace, p: &Params) -> Repair {
    let error = match compute(ws, p) {
        Err(e @ ToolError::Edit(EditError::NotFound(_) | EditError::CountMismatch { .. })) => e,
        other => return Repair::AsGiven(other),
    };
    let expected = p.expected_replacements.unwrap_or(1);
    let current = match ws.resolve(&p.path).map(|path| {
        ws.files().and_then(|f| {
            f.read_at_most(ws.relative(&path), super::read_file::MAX_FILE_BYTES)
                .and_then(|b| {
                    String::from_utf8(b).map_err(|e| {
                        std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string())
                    })
                })
        })
    }) {
        Ok(Ok(current)) => current,
        _ => return Repair::AsGiven(Err(error)),
    };
    match repair::edit_by_rule(&current, &p.old_string, &p.new_string, expected) {
        Some(fix) => Repair::Fixed(fix),
        None => Repair::Missed {
            current,
            expected,
            error,
        },
    }
}

/// The line added to the result of a repaired edit.
fn note(fix: &EditFix) -> String {
    format!(
        "Note: old_string did not occur as given ({}); it was repaired to this text, which \
         was replaced:\n{}",
        fix.how,
        cap_middle(&fix.old, 1000)
    )
}

/// The edit as given, or repaired by rule (with the note saying how).
fn compute_repaired(
    ws: &crate::workspace::Workspace,
    p: Params,
) -> Result<(Change, Option<String>), ToolError> {
    match rule_repair(ws, &p) {
        Repair::AsGiven(change) => change.map(|c| (c, None)),
        Repair::Missed { error, .. } => Err(error),
        Repair::Fixed(fix) => {
            let note = note(&fix);
            let fixed = Params {
                old_string: fix.old,
                new_string: fix.new,
                ..p
            };
            Ok((compute(ws, &fixed)?, Some(note)))
        }
    }
}

/// An edit worked out but not yet written.
struct Change {
    path: std::path::PathBuf,
    shown: String,
    /// `None`: the file is created.
    old: Option<String>,
    new: String,
    replacements: usize,
    /// The `old_string` / `new_string` applied (after any repair).
    old_string: String,
    new_string: String,
}

fn compute(ws: &crate::workspace::Workspace, p: &Params) -> Result<Change, ToolError> {
    let path = ws.resolve(&p.path)?;
    let shown = ws.display(&path);
    if p.old_string == p.new_string {
        return Err(EditError::NoChange.into());
    }
    let files = ws
        .files()
        .map_err(|e| ToolError::Failed(format!("cannot read {shown}: {e}")))?;
    let meta = files.metadata(ws.relative(&path)).ok();
    let exists = meta.is_some();
    if p.old_string.is_empty() {
        if exists {
            return Err(EditError::AlreadyExists(shown).into());
        }
        return Ok(Change {
            path,
            shown,
            old: None,
            new: p.new_string.clone(),
            replacements: 0,
            old_string: String::new(),
            new_string: p.new_string.clone(),
        });
    }
    if !exists {
        return Err(EditError::FileMissing(shown).into());
    }
    if !meta.is_some_and(|m| m.is_file()) {
        return Err(ToolError::Failed(format!("{shown} is not a regular file")));
    }
    // No larger than read_file shows: the edit holds the file twice over.
    let current = files
        .read_at_most(ws.relative(&path), super::read_file::MAX_FILE_BYTES)
        .and_then(|b| {
            String::from_utf8(b).map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, "not valid UTF-8")
            })
        })
        .map_err(|e| ToolError::Failed(format!("cannot read {shown} as text: {e}")))?;
    let expected = p.expected_replacements.unwrap_or(1);
    if expected == 0 {
        return Err(ToolError::InvalidArgs(
            "expected_replacements must be at least 1".into(),
        ));
    }
    let found = current.matches(&p.old_string).count();
    if found == 0 {
        return Err(EditError::NotFound(shown).into());
    }
    if found != expected {
        return Err(EditError::CountMismatch {
            path: shown,
            expected,
            found,
        }
        .into());
    }
    // The result is worked out in memory: a short old_string found millions of times
    // (a file of empty lines) times a long new_string would be any size.
    let new_len = (current.len() - found * p.old_string.len())
        .saturating_add(found.saturating_mul(p.new_string.len()));
    if new_len as u64 > super::read_file::MAX_FILE_BYTES {
        return Err(ToolError::Failed(format!(
            "the edit would make {shown} {new_len} bytes, more than the {} an edit writes; \
             use shell to make it",
            super::read_file::MAX_FILE_BYTES
        )));
    }
    let new = current.replace(&p.old_string, &p.new_string);
    Ok(Change {
        path,
        shown,
        old: Some(current),
        new,
        replacements: found,
        old_string: p.old_string.clone(),
        new_string: p.new_string.clone(),
    })
}

fn apply(ws: &crate::workspace::Workspace, p: Params) -> Result<ToolOutput, ToolError> {
    let (c, repaired) = compute_repaired(ws, p)?;
    let shown = &c.shown;
    let files = ws
        .files()
        .map_err(|e| ToolError::Failed(format!("cannot write {shown}: {e}")))?;
    let rel = ws.relative(&c.path);
    if c.old.is_none() {
        if let Some(parent) = rel.parent() {
            files
                .create_dir_all(parent)
                .map_err(|e| ToolError::Failed(format!("cannot create {shown}: {e}")))?;
        }
    }
    files
        .write(rel, c.new.as_bytes())
        .map_err(|e| ToolError::Failed(format!("cannot write {shown}: {e}")))?;
    if c.old.is_none() {
        let lines = plural(c.new.lines().count(), "line");
        return Ok(ToolOutput {
            content: format!("Created {shown} ({lines})."),
            display: format!("Created {shown} ({lines})"),
        });
    }
    let removed = c.old_string.lines().count() * c.replacements;
    let added = c.new_string.lines().count() * c.replacements;
    let reps = plural(c.replacements, "replacement");
    let mut content = format!("Edited {shown}: {reps}.");
    let mut display = format!("Edited {shown} ({reps}, -{removed} +{added} lines)");
    if let Some(note) = repaired {
        content = format!("{content}\n{note}");
        display.push_str(", repaired");
    }
    Ok(ToolOutput { content, display })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A one-byte old_string found a million times, times a long new_string: refused
    /// before the result is made, not written.
    #[test]
    fn an_edit_cannot_multiply_a_file() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("f.txt"), "\n".repeat(1 << 20)).unwrap();
        let ws = crate::workspace::Workspace::new(t.path()).unwrap();
        let p = Params {
            path: "f.txt".into(),
            old_string: "\n".into(),
            new_string: "y".repeat(64),
            expected_replacements: Some(1 << 20),
        };
        let err = compute(&ws, &p).err().unwrap();
        assert!(err.to_string().contains("more than the"), "{err}");
        assert_eq!(
            std::fs::metadata(t.path().join("f.txt")).unwrap().len(),
            1 << 20
        );
    }
}
