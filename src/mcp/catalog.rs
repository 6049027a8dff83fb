//! The tools `shade mcp` offers: their names, descriptions for models, input schemas and
//! annotations. The file tools and the command runner are the agent's own tools
//! (`shade_agent::tools`) with a `branch` argument added; the rest are branch operations.

use std::sync::Arc;

use rmcp::model::{JsonObject, Tool as McpTool, ToolAnnotations};
use serde_json::{json, Value};
use shade_agent::tools::diagnostics::Diagnostics;
use shade_agent::tools::{edit, glob, grep, ls, read_file, shell, write_file, Tool};

/// What an MCP tool does when called.
#[derive(Clone)]
pub enum Action {
    /// `create_branch`.
    Create,
    /// `list_branches`.
    List,
    /// One of the agent's tools, run in the branch named by the `branch` argument.
    Agent(Arc<dyn Tool>),
    /// `list_changes`.
    Changes,
    /// `diff`.
    Diff,
    /// `check_command`.
    CheckCommand,
    /// `accept_branch`.
    Accept,
    /// `abort_branch`.
    Abort,
    /// `compare_branches`.
    Compare,
    /// `undo_accept`.
    Undo,
}

/// One tool as offered to the client.
#[derive(Clone)]
pub struct Entry {
    /// What the client sees.
    pub tool: McpTool,
    /// What a call does.
    pub action: Action,
}

/// What every description of a tool working in a branch ends with. It ends rather than
/// starts them: clients cut descriptions short (qwen-code at ~160 characters), and each must
/// begin with what its tool does.
const IN_A_BRANCH: &str = "It works in a shade branch (see create_branch), never on the \
    user's files: paths are the project's own (relative to the project root, or absolute under \
    it), \"the workspace\" above is the project as the branch shows it, and writes stay in the \
    branch until accept_branch.";

/// The `branch` argument every branch tool takes.
fn branch_property() -> Value {
    json!({"type": "string", "description": "The branch id returned by create_branch (e.g. \"b1\")."})
}

/// The annotations of a tool; open-world is always false (no network, nothing outside the
/// project's branch).
fn annotations(
    title: &str,
    read_only: bool,
    destructive: bool,
    idempotent: bool,
) -> ToolAnnotations {
    let a = ToolAnnotations::with_title(title)
        .read_only(read_only)
        .open_world(false);
    if read_only {
        a
    } else {
        a.destructive(destructive).idempotent(idempotent)
    }
}

fn object(schema: Value) -> Arc<JsonObject> {
    match schema {
        Value::Object(map) => Arc::new(map),
        _ => Arc::new(JsonObject::new()),
    }
}

/// An MCP tool with `name`, `description` and JSON `schema`.
fn tool(name: &str, description: String, schema: Value, annotations: ToolAnnotations) -> McpTool {
    let mut t = McpTool::new(name.to_string(), description, object(schema));
    t.annotations = Some(annotations);
    t
}

/// `entry` with the schema of its results' `structuredContent` (the server sends one with
/// every successful result of such a tool).
fn returning(mut entry: Entry, properties: Value, required: &[&str]) -> Entry {
    entry.tool.output_schema = Some(object(json!({
        "type": "object",
        "properties": properties,
        "required": required,
    })));
    entry
}

/// A change as `structuredContent` gives it (as `shade exec --json` does).
fn change_schema() -> Value {
    json!({"type": "array", "items": {"type": "object", "properties": {
        "kind": {"type": "string"}, "path": {"type": "string"}}}})
}

fn branch_id_schema() -> Value {
    json!({"type": "string", "description": "The branch id."})
}

/// `schema` with a required `branch` property added in front.
fn with_branch(schema: &Value) -> Value {
    let mut props = serde_json::Map::new();
    props.insert("branch".into(), branch_property());
    if let Some(p) = schema.get("properties").and_then(Value::as_object) {
        props.extend(p.clone());
    }
    let mut required = vec![json!("branch")];
    if let Some(r) = schema.get("required").and_then(Value::as_array) {
        required.extend(r.iter().cloned());
    }
    json!({
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": false,
    })
}

/// One of the agent's tools, offered under `name` as working in a branch.
fn agent_tool(
    name: &str,
    agent: Arc<dyn Tool>,
    description: Option<String>,
    annotations: ToolAnnotations,
) -> Entry {
    let spec = agent.spec();
    let text = description.unwrap_or(spec.description);
    Entry {
        tool: tool(
            name,
            format!("{text} {IN_A_BRANCH}"),
            with_branch(&spec.parameters),
            annotations,
        ),
        action: Action::Agent(agent),
    }
}

fn branch_only_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"branch": branch_property()},
        "required": ["branch"],
        "additionalProperties": false,
    })
}

/// Every tool of `shade mcp`, in the order they are listed. `time_limit_secs` is the
/// session's limit on one command.
pub fn all(time_limit_secs: u64) -> Vec<Entry> {
    let runner = shell::Shell {
        max_timeout: std::time::Duration::from_secs(time_limit_secs),
        ..Default::default()
    };
    let run_description = format!(
        "Run a bash command in the branch, at the project's real path, and return its exit \
         code, stdout and stderr (head and tail of long output). Use it to build, test, lint or \
         try changes. It runs sandboxed like a speculative run: no network, the rest of the file \
         system read-only, a private empty /tmp, no stdin; everything it writes inside the project \
         lands in the branch (build output such as target/ too, which accept leaves out), build \
         caches outside the project (~/.cargo, ~/.cache, …) are readable and their writes thrown \
         away. Default timeout {}s, at most {}s (timeout_ms).",
        runner.default_timeout.as_secs(),
        runner.max_timeout.as_secs()
    );
    vec![
        returning(
            Entry {
                tool: tool(
                    "create_branch",
                    "Create a branch of the project and return its id. A branch is a copy-on-write view \
                     of the whole project (created in milliseconds, nothing copied): read, write and edit \
                     files and run commands in it with the other tools; nothing reaches the user's files \
                     until accept_branch, and abort_branch (or the end of this session) drops it. Use one \
                     branch per independent attempt; several can live at once (up to the session's \
                     limit, `[mcp] max_branches` in shade's config: abort or accept one to make room)."
                        .into(),
                    json!({"type": "object", "properties": {}, "additionalProperties": false}),
                    annotations("Create a branch", false, false, false),
                ),
                action: Action::Create,
            },
            json!({"branch": branch_id_schema(), "project": {"type": "string"}}),
            &["branch", "project"],
        ),
        returning(
            Entry {
                tool: tool(
                    "list_branches",
                    "List the live branches of this session with how many paths each has changed.".into(),
                    json!({"type": "object", "properties": {}, "additionalProperties": false}),
                    annotations("List branches", true, false, true),
                ),
                action: Action::List,
            },
            json!({"branches": {"type": "array", "items": {"type": "object", "properties": {"branch": branch_id_schema(), "changed": {"type": "integer"}}}}}),
            &["branches"],
        ),
        agent_tool("read_file", Arc::new(read_file::ReadFile), None, annotations("Read a file in a branch", true, false, true)),
        // Writes and edits change only the branch (the project's file is untouched until
        // accept), hence not destructive.
        agent_tool("write_file", Arc::new(write_file::WriteFile), None, annotations("Write a file in a branch", false, false, true)),
        agent_tool("edit", Arc::new(edit::Edit), None, annotations("Edit a file in a branch", false, false, false)),
        agent_tool("grep", Arc::new(grep::Grep), None, annotations("Search a branch", true, false, true)),
        agent_tool("glob", Arc::new(glob::Glob), None, annotations("Find files in a branch", true, false, true)),
        agent_tool("ls", Arc::new(ls::Ls), None, annotations("List a directory in a branch", true, false, true)),
        returning(
            agent_tool("run_command", Arc::new(runner), Some(run_description), annotations("Run a command in a branch", false, false, false)),
            json!({
                "branch": branch_id_schema(),
                "exit_code": {"type": ["integer", "null"], "description": "null: killed, timed out or not started."},
                "output": {"type": "string"},
            }),
            &["branch", "exit_code", "output"],
        ),
        returning(
            Entry {
                tool: tool(
                    "list_changes",
                    "List what the branch changed compared with the project, one path per line as \
                     `git status --short` does: A added, M modified, D deleted, R old -> new renamed. \
                     Build output under ignored paths (target/, node_modules/, …) is not listed: accept \
                     leaves it out."
                        .into(),
                    branch_only_schema(),
                    annotations("List a branch's changes", true, false, true),
                ),
                action: Action::Changes,
            },
            json!({"branch": branch_id_schema(), "changes": change_schema(), "outside": {"type": "array", "items": {"type": "string"}}}),
            &["branch", "changes", "outside"],
        ),
        returning(
            Entry {
                tool: tool(
                    "diff",
                    "Show the unified diff of everything the branch changed (what accept_branch would \
                     write into the project), paths relative to the project root."
                        .into(),
                    branch_only_schema(),
                    annotations("Diff a branch", true, false, true),
                ),
                action: Action::Diff,
            },
            json!({"branch": branch_id_schema(), "diff": {"type": "string"}}),
            &["branch", "diff"],
        ),
        returning(
            Entry {
                tool: tool(
                    "compare_branches",
                    "Compare two branches, e.g. two attempts at the same task: what each changed, \
                     the size of each one's diff, and the unified diff from the first branch's \
                     version of every path either changed to the second's. Reads only; run the \
                     tests in each with run_command to check them."
                        .into(),
                    json!({
                        "type": "object",
                        "properties": {
                            "branch": branch_property(),
                            "other": {"type": "string", "description": "The branch to compare it with."},
                        },
                        "required": ["branch", "other"],
                        "additionalProperties": false,
                    }),
                    annotations("Compare two branches", true, false, true),
                ),
                action: Action::Compare,
            },
            json!({
                "branches": {"type": "array", "items": {"type": "object", "properties": {
                    "branch": branch_id_schema(),
                    "changes": change_schema(),
                    "diff_lines": {"type": "integer", "description": "Lines added plus removed against the project."},
                }}},
                "same": {"type": "boolean", "description": "Both branches hold the same version of every changed path."},
                "diff": {"type": "string", "description": "From the first branch's versions to the second's."},
            }),
            &["branches", "same", "diff"],
        ),
        agent_tool(
            "lint",
            Arc::new(Diagnostics),
            Some(
                "Run the project's checker (cargo check, ruff, eslint, tsc, a language server, or the \
                 [lint] command of shade's config) on the branch and list only the errors and \
                 warnings the branch's edits introduced, not those the project already had. Without \
                 `paths`, covers every file edited in the branch with write_file or edit (their \
                 results already end with the new diagnostics of the file, when ready in time)."
                    .into(),
            ),
            annotations("Lint a branch's edits", true, false, true),
        ),
        returning(
            Entry {
                tool: tool(
                    "check_command",
                    "Say whether a shell command is read-only (only reads files; shade's agent runs such \
                     commands without asking) and, if not, the first construct that makes it write, run \
                     arbitrary code or use the network. The command is parsed, never run."
                        .into(),
                    json!({
                        "type": "object",
                        "properties": {"command": {"type": "string", "description": "The shell command line."}},
                        "required": ["command"],
                        "additionalProperties": false,
                    }),
                    annotations("Classify a shell command", true, false, true),
                ),
                action: Action::CheckCommand,
            },
            json!({"read_only": {"type": "boolean"}}),
            &["read_only"],
        ),
        returning(
            Entry {
                tool: tool(
                    "accept_branch",
                    "Write the branch's changes into the user's real project, all or nothing, then close \
                     the branch. Refused, with nothing written and the branch kept, if any path the \
                     branch changed or read was changed in the project meanwhile (the paths are listed: \
                     read them again in a new branch, or abort); likewise if it changed code for the host by \
                     where it lies (with the home as the project: ~/.bashrc, ~/.ssh, shade's config…), which \
                     only the user writes. Ignored build output (target/, …) is \
                     not written. Call it only when the user wants the changes applied; the user is asked \
                     to confirm where the client supports it. From the start of the call the branch is \
                     frozen: its running commands are killed and other calls on it refused, and exactly \
                     the changes listed (and confirmed) are written — if the branch differs from that \
                     list by then, nothing is written."
                        .into(),
                    branch_only_schema(),
                    annotations("Accept a branch into the project", false, true, false),
                ),
                action: Action::Accept,
            },
            json!({"branch": branch_id_schema(), "accepted": {"type": "boolean"}, "changes": change_schema()}),
            &["branch", "accepted", "changes"],
        ),
        returning(
            Entry {
                tool: tool(
                    "undo_accept",
                    "Undo an accept: put every path it changed in the user's real project back as it \
                     was before (files it created are deleted, deleted or overwritten files restored, \
                     renames, modes and links reversed), all or nothing. Without `id`, the newest \
                     accept of this session not undone yet. Refused, with nothing written, if the user \
                     or a later accept changed any of those paths since (they are listed); with \
                     `keep_mine` those paths are left as they are and the rest is undone. The undo is \
                     itself recorded and can be undone by calling this again with its id. Only this \
                     session's own accepts are undone as asked: an accept it did not make (the user's \
                     own `shade run --accept`, another client's) is undone only if the user confirms \
                     it when asked, and refused where the client cannot ask. Call it only when the \
                     user wants the changes taken back."
                        .into(),
                    json!({
                        "type": "object",
                        "properties": {
                            "id": {"type": "string", "description": "The accept's id, as accept_branch reported it (default: this session's newest accept not undone)."},
                            "keep_mine": {"type": "boolean", "description": "Leave paths changed since the accept as they are and undo the rest (default false: refuse)."},
                        },
                        "additionalProperties": false,
                    }),
                    annotations("Undo an accept in the project", false, true, false),
                ),
                action: Action::Undo,
            },
            json!({
                "id": {"type": "string"},
                "restored": {"type": "array", "items": {"type": "string"}},
                "removed": {"type": "array", "items": {"type": "string"}},
                "kept": {"type": "array", "items": {"type": "object", "properties": {
                    "path": {"type": "string"}, "reason": {"type": "string"}}}},
                "undo_id": {"type": ["string", "null"]},
            }),
            &["id", "restored", "removed", "kept"],
        ),
        returning(
            Entry {
                tool: tool(
                    "abort_branch",
                    "Drop the branch and everything in it: running commands are killed, its changes \
                     discarded. The user's project is not touched."
                        .into(),
                    branch_only_schema(),
                    annotations("Abort a branch", false, true, true),
                ),
                action: Action::Abort,
            },
            json!({"branch": branch_id_schema(), "aborted": {"type": "boolean"}}),
            &["branch", "aborted"],
        ),
    ]
}
