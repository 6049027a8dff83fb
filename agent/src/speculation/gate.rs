//! The speculation tool gate: which calls a speculative run may make. Reads run; edits and
//! writing shell commands run *inside the branch* (its sandbox: network off, private /tmp,
//! nothing outside the branch writable), where the peer had to stop; anything that needs the
//! network, the user, or a tool it does not know is a boundary. Whatever the approval mode
//! would have asked about live is noted, so that accept can ask once, with the changeset.

use std::collections::BTreeSet;
use std::sync::Mutex;

use serde_json::Value;

use crate::approval::{decide, ApprovalMode, Decision};
use crate::query_loop::{CallGate, GateCall};
use crate::tools::ToolKind;
use crate::workspace::PathError;
use shade_classify as shell_classify;

/// Messages a speculation may add at most (the seed's MAX_SPECULATION_MESSAGES).
pub const MAX_SPECULATION_MESSAGES: usize = 100;

/// Characters of a command kept in a `shell:` boundary name.
const COMMAND_IN_REASON: usize = 50;

/// The gate for one speculation.
#[derive(Debug)]
pub struct SpeculationGate {
    /// The user's approval mode: plan mode makes every edit a boundary; the others decide
    /// what accept must ask about.
    mode: ApprovalMode,
    /// Tools whose calls the mode would have asked about.
    would_ask: Mutex<BTreeSet<String>>,
}

impl SpeculationGate {
    /// A gate for a session in `mode`.
    pub fn new(mode: ApprovalMode) -> Self {
        Self {
            mode,
            would_ask: Mutex::new(BTreeSet::new()),
        }
    }

    /// Did the speculation do something the mode would have asked about live (an edit in
    /// default mode, a writing command outside yolo)?
    pub fn would_ask(&self) -> bool {
        !self.asked_tools().is_empty()
    }

    /// The tools it called that the mode would have asked about live, by name: accept need
    /// not ask about those the user already allowed for the session.
    pub fn asked_tools(&self) -> Vec<String> {
        self.would_ask
            .lock()
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    fn note(&self, tool: &str, kind: ToolKind, read_only: bool, summary: &str) {
        if matches!(
            decide(self.mode, kind, read_only, summary),
            Decision::Ask(_)
        ) {
            if let Ok(mut s) = self.would_ask.lock() {
                s.insert(tool.to_string());
            }
        }
    }
}

/// The path arguments of the file tools.
fn path_args(args: &Value) -> impl Iterator<Item = &str> {
    ["path", "file_path", "dir", "directory"]
        .into_iter()
        .filter_map(|k| args.get(k).and_then(Value::as_str))
}

impl CallGate for SpeculationGate {
    fn check(&self, call: &GateCall<'_>) -> Option<String> {
        let Some(tool) = call.tool else {
            return Some(format!("unknown tool {}", call.name));
        };
        let Some(args) = call.args else {
            // Bad JSON: the "call" is an error result for the model, harmless to give.
            return None;
        };
        for p in path_args(args) {
            if matches!(
                call.ctx.workspace.resolve(p),
                Err(PathError::Outside { .. })
            ) {
                return Some(format!("{}: path outside the project", call.name));
            }
        }
        let summary = tool.describe(args);
        match tool.kind() {
            ToolKind::Read => None,
            ToolKind::Edit => {
                if self.mode == ApprovalMode::Plan {
                    return Some(format!("{}: edits in plan mode", call.name));
                }
                self.note(call.name, ToolKind::Edit, false, &summary);
                None
            }
            ToolKind::Execute => {
                let command = args.get("command").and_then(Value::as_str).unwrap_or("");
                let verdict = shell_classify::classify_in(command, call.ctx.workspace.root());
                let short = || -> String { command.chars().take(COMMAND_IN_REASON).collect() };
                if verdict.needs_network {
                    return Some(format!("shell: {}", short()));
                }
                if verdict.read_only {
                    return None;
                }
                if self.mode == ApprovalMode::Plan {
                    return Some(format!("shell: {}", short()));
                }
                self.note(call.name, ToolKind::Execute, false, &summary);
                None
            }
            // An MCP tool acts outside the branch: only one its server marks read-only may
            // run ahead of the user.
            ToolKind::Mcp if tool.is_read_only(args) => None,
            ToolKind::Fetch | ToolKind::Memory | ToolKind::Meta | ToolKind::Mcp => {
                Some(call.name.to_string())
            }
        }
    }

    fn message_limit(&self) -> Option<usize> {
        Some(MAX_SPECULATION_MESSAGES)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::tools::{Tool, ToolContext};
    use std::sync::Arc;

    /// Lints are reads: the `diagnostics` call runs in a speculation whatever the mode (plan
    /// included) and gives accept nothing to ask about.
    #[test]
    fn diagnostics_is_read_only_for_the_gate() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = ToolContext::new(crate::workspace::Workspace::new(dir.path()).unwrap());
        let tool: Arc<dyn Tool> = Arc::new(crate::tools::diagnostics::Diagnostics);
        for args in [
            serde_json::json!({}),
            serde_json::json!({"paths": ["a.rs"]}),
        ] {
            for mode in [
                ApprovalMode::Default,
                ApprovalMode::AutoEdit,
                ApprovalMode::Yolo,
                ApprovalMode::Plan,
            ] {
                let gate = SpeculationGate::new(mode);
                let call = GateCall {
                    name: "diagnostics",
                    tool: Some(&tool),
                    args: Some(&args),
                    read_only: tool.is_read_only(&args),
                    ctx: &ctx,
                };
                assert_eq!(gate.check(&call), None, "{mode:?}");
                assert!(!gate.would_ask(), "{mode:?}");
            }
        }
    }

    /// A stand-in for an MCP server's tool, read-only or not as its server says.
    struct ServerTool(bool);

    impl Tool for ServerTool {
        fn name(&self) -> &'static str {
            "mcp__srv__t"
        }
        fn spec(&self) -> crate::llm::ToolSpec {
            crate::llm::ToolSpec {
                name: "mcp__srv__t".into(),
                description: String::new(),
                parameters: serde_json::json!({"type": "object"}),
            }
        }
        fn kind(&self) -> ToolKind {
            ToolKind::Mcp
        }
        fn is_read_only(&self, _args: &serde_json::Value) -> bool {
            self.0
        }
        fn run<'a>(
            &'a self,
            _args: serde_json::Value,
            _ctx: &'a ToolContext,
            _cancel: &'a tokio_util::sync::CancellationToken,
        ) -> crate::llm::BoxFuture<'a, Result<crate::tools::ToolOutput, crate::tools::ToolError>>
        {
            Box::pin(async { Err(crate::tools::ToolError::Failed("not run".into())) })
        }
    }

    /// An MCP call is a boundary for a speculation unless its server marks it read-only.
    #[test]
    fn mcp_calls_are_boundaries_unless_read_only() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = ToolContext::new(crate::workspace::Workspace::new(dir.path()).unwrap());
        let args = serde_json::json!({});
        for (read_only, stops) in [(true, false), (false, true)] {
            let tool: Arc<dyn Tool> = Arc::new(ServerTool(read_only));
            let gate = SpeculationGate::new(ApprovalMode::Yolo);
            let call = GateCall {
                name: "mcp__srv__t",
                tool: Some(&tool),
                args: Some(&args),
                read_only,
                ctx: &ctx,
            };
            assert_eq!(gate.check(&call).is_some(), stops, "read_only {read_only}");
        }
    }
}
