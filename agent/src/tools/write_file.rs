//! `write_file`: create or overwrite a whole file (parents created as needed). Content that
//! arrives escaped one level too many (`\n` as two characters) is corrected first, by rule
//! where the rule can tell and by the fast model where it cannot (see [`super::repair`]).

use serde::Deserialize;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::repair::{self, Escaping};
use super::text::plural;
use super::{
    parse_args, run_blocking, Prepared, Tool, ToolContext, ToolError, ToolKind, ToolOutput,
};
use crate::llm::{BoxFuture, ToolSpec};
use crate::workspace::Workspace;

/// The tool.
#[derive(Debug, Default)]
pub struct WriteFile;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    path: String,
    content: String,
}

impl Tool for WriteFile {
    fn name(&self) -> &'static str {
        "write_file"
    }

    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name().into(),
            description:
                "Write a whole file in the workspace, creating it (and missing parent \
                directories) or replacing its content. Prefer `edit` for changes to existing files."
                    .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "File path, relative to the workspace root."},
                    "content": {"type": "string", "description": "The complete new content."}
                },
                "required": ["path", "content"],
                "additionalProperties": false
            }),
        }
    }

    fn kind(&self) -> ToolKind {
        ToolKind::Edit
    }

    fn preview(&self, args: &Value, ctx: &ToolContext) -> Option<String> {
        let p: Params = parse_args(args.clone()).ok()?;
        let path = ctx.workspace.resolve(&p.path).ok()?;
        let (content, _) = by_rule(p.content);
        let shown = ctx.workspace.display(&path);
        let old = ctx
            .workspace
            .files()
            .and_then(|f| f.read_to_string(ctx.workspace.relative(&path)));
        match old {
            Ok(old) => Some(super::diff::unified(&shown, &old, &content)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Some(super::diff::created(&shown, &content))
            }
            Err(_) => Some(super::diff::unified(&shown, "", &content)),
        }
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
            let (content, note) = match repair::judge_content(&p.content) {
                Escaping::Clean => return unchanged,
                Escaping::Over(decoded) => (decoded, NOTE_RULE),
                Escaping::Unsure(decoded) => {
                    let Some(bg) = &ctx.background else {
                        return unchanged;
                    };
                    if !repair::content_is_over_escaped(bg, &p.path, &p.content, cancel).await {
                        return unchanged;
                    }
                    (decoded, NOTE_MODEL)
                }
            };
            Prepared {
                args: json!({"path": p.path, "content": content}),
                note: Some(note.to_string()),
            }
        })
    }

    fn run<'a>(
        &'a self,
        args: Value,
        ctx: &'a ToolContext,
        _cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        let path = super::diagnostics::path_arg(&args);
        super::diagnostics::with_diagnostics(ctx, path, run_blocking(args, ctx, write))
    }
}

const NOTE_RULE: &str = "Note: the content arrived over-escaped (line breaks as \\n); one level \
    of escaping was undone before writing.";
const NOTE_MODEL: &str = "Note: the content looked over-escaped and the fast model confirmed it; \
    one level of escaping was undone before writing.";

/// The content corrected where the rule is sure, and the note saying so.
fn by_rule(content: String) -> (String, Option<&'static str>) {
    match repair::judge_content(&content) {
        Escaping::Over(decoded) => (decoded, Some(NOTE_RULE)),
        Escaping::Clean | Escaping::Unsure(_) => (content, None),
    }
}

fn write(ws: &Workspace, p: Params) -> Result<ToolOutput, ToolError> {
    let (content, note) = by_rule(p.content);
    let path = ws.resolve(&p.path)?;
    let shown = ws.display(&path);
    let files = ws
        .files()
        .map_err(|e| ToolError::Failed(format!("cannot write {shown}: {e}")))?;
    let rel = ws.relative(&path);
    let meta = files.metadata(rel).ok();
    if meta.as_ref().is_some_and(|m| m.is_dir()) {
        return Err(ToolError::Failed(format!("{shown} is a directory")));
    }
    let existed = meta.is_some();
    if let Some(parent) = rel.parent() {
        files.create_dir_all(parent).map_err(|e| {
            ToolError::Failed(format!("cannot create directories for {shown}: {e}"))
        })?;
    }
    files
        .write(rel, content.as_bytes())
        .map_err(|e| ToolError::Failed(format!("cannot write {shown}: {e}")))?;
    let lines = plural(content.lines().count(), "line");
    let what = if existed { "Overwrote" } else { "Created" };
    let mut out = ToolOutput {
        content: format!("{what} {shown} ({lines})."),
        display: format!("{what} {shown} ({lines})"),
    };
    if let Some(note) = note {
        out.content = format!("{}\n{note}", out.content);
        out.display.push_str(", unescaped");
    }
    Ok(out)
}
