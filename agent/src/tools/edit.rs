//! `edit`: exact string replacement with an expected count, so the model's edit lands
//! exactly where it meant or fails with a reason it can act on.

use serde::Deserialize;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::text::plural;
use super::{parse_args, run_blocking, Tool, ToolContext, ToolError, ToolKind, ToolOutput};
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

#[derive(Deserialize)]
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
        let c = compute(&ctx.workspace, &p).ok()?;
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
        let path = crate::lint::tool::path_arg(&args);
        crate::lint::tool::with_diagnostics(ctx, path, run_blocking(args, ctx, apply))
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
}

fn compute(ws: &crate::workspace::Workspace, p: &Params) -> Result<Change, ToolError> {
    let path = ws.resolve(&p.path)?;
    let shown = ws.display(&path);
    if p.old_string == p.new_string {
        return Err(EditError::NoChange.into());
    }
    let exists = path.exists();
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
        });
    }
    if !exists {
        return Err(EditError::FileMissing(shown).into());
    }
    if !path.is_file() {
        return Err(ToolError::Failed(format!("{shown} is not a regular file")));
    }
    let current = std::fs::read_to_string(&path)
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
    let new = current.replace(&p.old_string, &p.new_string);
    Ok(Change {
        path,
        shown,
        old: Some(current),
        new,
        replacements: found,
    })
}

fn apply(ws: &crate::workspace::Workspace, p: Params) -> Result<ToolOutput, ToolError> {
    let c = compute(ws, &p)?;
    let shown = &c.shown;
    if c.old.is_none() {
        if let Some(parent) = c.path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| ToolError::Failed(format!("cannot create {shown}: {e}")))?;
        }
    }
    std::fs::write(&c.path, &c.new)
        .map_err(|e| ToolError::Failed(format!("cannot write {shown}: {e}")))?;
    if c.old.is_none() {
        let lines = plural(c.new.lines().count(), "line");
        return Ok(ToolOutput {
            content: format!("Created {shown} ({lines})."),
            display: format!("Created {shown} ({lines})"),
        });
    }
    let removed = p.old_string.lines().count() * c.replacements;
    let added = p.new_string.lines().count() * c.replacements;
    let reps = plural(c.replacements, "replacement");
    Ok(ToolOutput {
        content: format!("Edited {shown}: {reps}."),
        display: format!("Edited {shown} ({reps}, -{removed} +{added} lines)"),
    })
}
