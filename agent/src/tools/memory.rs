//! `memory`: save a fact to long-term memory, in the project memory file (`SHADE.md` at the
//! workspace root) or the global one (under the XDG config dir), inside a
//! `## Shade Added Memories` section — the memory-tool design of the tools seed.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::{blocking, parse_args, Tool, ToolContext, ToolError, ToolKind, ToolOutput};
use crate::llm::{BoxFuture, ToolSpec};
use crate::workspace::Workspace;

/// Default memory file name (project and global).
pub const FILE_NAME: &str = "SHADE.md";
/// Heading under which saved facts go.
pub const SECTION_HEADER: &str = "## Shade Added Memories";

/// The tool.
#[derive(Debug, Default)]
pub struct Memory;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    fact: String,
    #[serde(default)]
    scope: Option<Scope>,
}

/// Which memory file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Shared by all projects.
    Global,
    /// This project only.
    Project,
}

impl Scope {
    fn as_str(self) -> &'static str {
        match self {
            Scope::Global => "global",
            Scope::Project => "project",
        }
    }
}

/// Path of the memory file for `scope`, or why there is none.
pub fn memory_path(ctx: &ToolContext, scope: Scope) -> Result<PathBuf, ToolError> {
    match scope {
        Scope::Project => Ok(ctx.workspace.resolve(&ctx.memory_file_name)?),
        Scope::Global => ctx.global_memory.clone().ok_or_else(|| {
            ToolError::Failed("no global memory file (no HOME or XDG_CONFIG_HOME)".into())
        }),
    }
}

impl Tool for Memory {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name().into(),
            description: "Save a specific fact to long-term memory. Use it when the user asks you \
                to remember something, or states a clear, concise fact worth keeping for future \
                sessions."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "fact": {"type": "string", "description": "The fact to remember: a clear, self-contained statement."},
                    "scope": {"type": "string", "enum": ["global", "project"],
                        "description": "\"global\" saves to the user-level memory file (all projects); \"project\" saves to SHADE.md in this project."}
                },
                "required": ["fact"],
                "additionalProperties": false
            }),
        }
    }

    fn kind(&self) -> ToolKind {
        ToolKind::Memory
    }

    fn outlives_the_branch(&self, args: &Value) -> bool {
        // The project's memory is a file of the branch; the global one is not.
        parse_args::<Params>(args.clone()).is_ok_and(|p| p.scope == Some(Scope::Global))
    }

    fn preview(&self, args: &Value, ctx: &ToolContext) -> Option<String> {
        let p: Params = parse_args(args.clone()).ok()?;
        let scope = p.scope?;
        let path = memory_path(ctx, scope).ok()?;
        let old = read_memory(ctx, scope, &path).unwrap_or_default();
        let new = compute_new_content(&old, &p.fact);
        Some(super::diff::unified(
            &ctx.workspace.shown(&path).display().to_string(),
            &old,
            &new,
        ))
    }

    fn run<'a>(
        &'a self,
        args: Value,
        ctx: &'a ToolContext,
        _cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let p: Params = parse_args(args)?;
            if p.fact.trim().is_empty() {
                return Err(ToolError::InvalidArgs(
                    "Parameter \"fact\" must be a non-empty string.".into(),
                ));
            }
            let Some(scope) = p.scope else {
                let show = |s| {
                    memory_path(ctx, s)
                        .map(|p| ctx.workspace.shown(&p).display().to_string())
                        .unwrap_or_else(|e| e.to_string())
                };
                return Err(ToolError::Failed(format!(
                    "Please specify where to save this memory (scope):\nGlobal: {} (shared across all projects)\nProject: {} (current project only)",
                    show(Scope::Global),
                    show(Scope::Project)
                )));
            };
            let path = memory_path(ctx, scope)?;
            let fact = p.fact.clone();
            match scope {
                Scope::Global => blocking(move || add_entry(&path, &fact)).await?,
                Scope::Project => {
                    let ws = ctx.workspace.clone();
                    blocking(move || add_project_entry(&ws, &path, &fact)).await?
                }
            }
            let message = format!(
                "Okay, I've remembered that in {} memory: \"{}\"",
                scope.as_str(),
                p.fact.trim()
            );
            Ok(ToolOutput {
                content: json!({"success": true, "message": message}).to_string(),
                display: message,
            })
        })
    }
}

/// Append `fact` as a list item under the memory section of `path`, creating the file, its
/// directory and the section as needed.
pub fn add_entry(path: &Path, fact: &str) -> Result<(), ToolError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| ToolError::Failed(format!("Failed to save memory: {e}")))?;
    }
    let content = match std::fs::read_to_string(path) {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(ToolError::Failed(format!("Failed to save memory: {e}"))),
    };
    std::fs::write(path, compute_new_content(&content, fact))
        .map_err(|e| ToolError::Failed(format!("Failed to save memory: {e}")))
}

/// The memory file of `scope` at `path`: the project's through the workspace's root
/// descriptor (a command may have made it a link), the global one by its path.
fn read_memory(ctx: &ToolContext, scope: Scope, path: &Path) -> std::io::Result<String> {
    match scope {
        Scope::Global => std::fs::read_to_string(path),
        Scope::Project => ctx
            .workspace
            .files()?
            .read_to_string(ctx.workspace.relative(path)),
    }
}

/// [`add_entry`] for the project's memory file (resolved in `ws`), written beneath the
/// workspace's root descriptor so no link a command planted leads out.
fn add_project_entry(ws: &Workspace, path: &Path, fact: &str) -> Result<(), ToolError> {
    let fail = |e: std::io::Error| ToolError::Failed(format!("Failed to save memory: {e}"));
    let files = ws.files().map_err(fail)?;
    let rel = ws.relative(path);
    if let Some(dir) = rel.parent() {
        files.create_dir_all(dir).map_err(fail)?;
    }
    let content = match files.read_to_string(rel) {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(fail(e)),
    };
    files
        .write(rel, compute_new_content(&content, fact).as_bytes())
        .map_err(fail)
}

/// The memory file after adding `fact` (pure, for previews and tests).
pub fn compute_new_content(content: &str, fact: &str) -> String {
    let mut processed = fact.trim();
    // Leading dashes would read as nested list markers.
    loop {
        let stripped = processed.trim_start_matches('-');
        if stripped.len() == processed.len() {
            break;
        }
        processed = stripped.trim_start();
    }
    let item = format!("- {}", processed.trim());
    match content.find(SECTION_HEADER) {
        None => {
            let sep = if content.is_empty() || content.ends_with("\n\n") {
                ""
            } else if content.ends_with('\n') {
                "\n"
            } else {
                "\n\n"
            };
            format!("{content}{sep}{SECTION_HEADER}\n{item}\n")
        }
        Some(idx) => {
            let start = idx + SECTION_HEADER.len();
            let end = content[start..]
                .find("\n## ")
                .map(|i| start + i)
                .unwrap_or(content.len());
            let before = content[..start].trim_end();
            let mut section = content[start..end].trim_end().to_string();
            let after = &content[end..];
            section.push('\n');
            section.push_str(&item);
            format!("{before}\n{}\n{after}", section.trim_start())
                .trim_end()
                .to_string()
                + "\n"
        }
    }
}

/// The memory files' contents for the system prompt (global first, then project).
pub fn load_memories(ctx: &ToolContext) -> String {
    let mut out = String::new();
    for scope in [Scope::Global, Scope::Project] {
        let Ok(path) = memory_path(ctx, scope) else {
            continue;
        };
        if let Ok(text) = read_memory(ctx, scope, &path) {
            if !text.trim().is_empty() {
                out.push_str(&format!(
                    "\n--- {} memory ({}) ---\n{}\n",
                    scope.as_str(),
                    ctx.workspace.shown(&path).display(),
                    text.trim_end()
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_section_then_items() {
        let a = compute_new_content("", "uses tabs");
        assert_eq!(a, "## Shade Added Memories\n- uses tabs\n");
        let b = compute_new_content(&a, "-- - run tests with nextest ");
        assert_eq!(
            b,
            "## Shade Added Memories\n- uses tabs\n- run tests with nextest\n"
        );
        let c = compute_new_content("# Project\nNotes", "x");
        assert_eq!(c, "# Project\nNotes\n\n## Shade Added Memories\n- x\n");
        let d = compute_new_content(
            "# P\n\n## Shade Added Memories\n- a\n\n## Other\ntext\n",
            "b",
        );
        assert_eq!(
            d,
            "# P\n\n## Shade Added Memories\n- a\n- b\n\n## Other\ntext\n"
        );
    }
}
