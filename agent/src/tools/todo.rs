//! `todo_write`: the model's structured task list for multi-step work (replaced whole on
//! every call; at most one item in progress).

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::{parse_args, Tool, ToolContext, ToolError, ToolKind, ToolOutput};
use crate::llm::{BoxFuture, ToolSpec};

/// State of one item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TodoStatus {
    /// Not started.
    Pending,
    /// Being worked on (at most one).
    InProgress,
    /// Done.
    Completed,
}

/// One task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TodoItem {
    /// Stable id chosen by the model.
    pub id: String,
    /// What to do.
    pub content: String,
    /// Where it stands.
    pub status: TodoStatus,
}

/// The tool.
#[derive(Debug, Default)]
pub struct TodoWrite;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    todos: Vec<TodoItem>,
}

impl Tool for TodoWrite {
    fn name(&self) -> &'static str {
        "todo_write"
    }

    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name().into(),
            description: "Create or update the task list for the current work. Send the whole \
                list every time. Use it for tasks of three or more steps; keep exactly one item \
                in_progress while working and mark items completed as soon as they are done."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "todos": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "id": {"type": "string"},
                                "content": {"type": "string"},
                                "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]}
                            },
                            "required": ["id", "content", "status"],
                            "additionalProperties": false
                        }
                    }
                },
                "required": ["todos"],
                "additionalProperties": false
            }),
        }
    }

    fn kind(&self) -> ToolKind {
        ToolKind::Meta
    }

    fn run<'a>(
        &'a self,
        args: Value,
        ctx: &'a ToolContext,
        _cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let p: Params = parse_args(args)?;
            let mut ids = std::collections::HashSet::new();
            for t in &p.todos {
                if t.content.trim().is_empty() {
                    return Err(ToolError::InvalidArgs(format!(
                        "todo `{}` has empty content",
                        t.id
                    )));
                }
                if !ids.insert(t.id.as_str()) {
                    return Err(ToolError::InvalidArgs(format!(
                        "duplicate todo id `{}`",
                        t.id
                    )));
                }
            }
            let in_progress = p
                .todos
                .iter()
                .filter(|t| t.status == TodoStatus::InProgress)
                .count();
            if in_progress > 1 {
                return Err(ToolError::InvalidArgs(format!(
                    "{in_progress} items are in_progress; at most one may be"
                )));
            }
            let done = p
                .todos
                .iter()
                .filter(|t| t.status == TodoStatus::Completed)
                .count();
            let rendered: Vec<String> = p
                .todos
                .iter()
                .map(|t| {
                    let mark = match t.status {
                        TodoStatus::Pending => "[ ]",
                        TodoStatus::InProgress => "[~]",
                        TodoStatus::Completed => "[x]",
                    };
                    format!("{mark} {} {}", t.id, t.content)
                })
                .collect();
            let total = p.todos.len();
            *ctx.todos
                .lock()
                .map_err(|_| ToolError::Failed("todo list poisoned".into()))? = p.todos;
            Ok(ToolOutput {
                content: format!("Todo list updated:\n{}", rendered.join("\n")),
                display: format!("Todos: {done}/{total} done"),
            })
        })
    }
}
