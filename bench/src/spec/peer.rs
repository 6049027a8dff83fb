//! The peer's (qwen-code's) speculation strategy as its source specifies it, played through
//! shade's engine with one extra gate: reads and edits run (edits in the branch, the
//! copy-on-write place), and the first shell command that is not read-only is a boundary
//! (`shell:<first 50 chars>`), where shade's own gate would run it in the sandbox. On accept
//! the finished part is kept and the turn continues live from the boundary.

use serde_json::Value;
use shade_agent::tools::{shell_classify, ToolKind};
use shade_agent::{CallGate, GateCall};

/// Characters of a command kept in the boundary name (as the peer does).
const COMMAND_IN_REASON: usize = 50;

/// The peer's extra rule: shell only when read-only.
#[derive(Debug, Default)]
pub struct PeerGate;

impl CallGate for PeerGate {
    fn check(&self, call: &GateCall<'_>) -> Option<String> {
        let tool = call.tool?;
        if tool.kind() != ToolKind::Execute {
            return None;
        }
        let command = call
            .args
            .and_then(|a| a.get("command"))
            .and_then(Value::as_str)
            .unwrap_or("");
        let verdict = shell_classify::classify_in(command, call.ctx.workspace.root());
        if verdict.read_only && !verdict.needs_network {
            None
        } else {
            Some(format!(
                "shell:{}",
                command.chars().take(COMMAND_IN_REASON).collect::<String>()
            ))
        }
    }
}
