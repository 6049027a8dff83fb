//! Approval modes: which tool calls run, which need the user's yes, which are refused.

use std::str::FromStr;

use crate::llm::BoxFuture;
use crate::tools::ToolKind;

/// How much the agent may do without asking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ApprovalMode {
    /// Ask before edits and before shell commands that may write.
    #[default]
    Default,
    /// Edits allowed; shell commands that may write still ask.
    AutoEdit,
    /// Everything allowed.
    Yolo,
    /// Read-only: no edits, no writing shell commands.
    Plan,
}

impl FromStr for ApprovalMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "default" => Ok(Self::Default),
            "auto-edit" | "auto_edit" | "autoedit" => Ok(Self::AutoEdit),
            "yolo" => Ok(Self::Yolo),
            "plan" => Ok(Self::Plan),
            other => Err(format!(
                "unknown approval mode `{other}` (expected default, auto-edit, yolo or plan)"
            )),
        }
    }
}

impl std::fmt::Display for ApprovalMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Default => "default",
            Self::AutoEdit => "auto-edit",
            Self::Yolo => "yolo",
            Self::Plan => "plan",
        })
    }
}

/// The verdict for one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Run it.
    Allow,
    /// Ask the user; the text says what would happen.
    Ask(String),
    /// Refuse; the text says why.
    Deny(String),
}

/// Decide for a call of a tool of `kind`; `read_only` is the tool's verdict on these arguments.
pub fn decide(mode: ApprovalMode, kind: ToolKind, read_only: bool, summary: &str) -> Decision {
    let writes = match kind {
        ToolKind::Read | ToolKind::Fetch | ToolKind::Meta => false,
        ToolKind::Execute | ToolKind::Mcp => !read_only,
        ToolKind::Edit | ToolKind::Memory => true,
    };
    if !writes {
        return Decision::Allow;
    }
    if kind == ToolKind::Mcp {
        // Another program's tool: auto-edit covers file edits only.
        return match mode {
            ApprovalMode::Yolo => Decision::Allow,
            ApprovalMode::Plan => Decision::Deny(format!(
                "plan mode allows only MCP tools their server marks read-only, and `{summary}` is not"
            )),
            _ => Decision::Ask(format!("call the MCP tool `{summary}`")),
        };
    }
    let is_shell = kind == ToolKind::Execute;
    match (mode, is_shell) {
        (ApprovalMode::Yolo, _) | (ApprovalMode::AutoEdit, false) => Decision::Allow,
        (ApprovalMode::Plan, true) => Decision::Deny(format!(
            "plan mode allows only read-only commands, and `{summary}` may write"
        )),
        (ApprovalMode::Plan, false) => {
            Decision::Deny(format!("plan mode does not allow edits (`{summary}`)"))
        }
        (_, true) => Decision::Ask(format!("run a command that may write: `{summary}`")),
        (_, false) => Decision::Ask(format!("change files: `{summary}`")),
    }
}

/// [`decide`] for a call that may also write what outlives every branch and reaches
/// every later session (`lasting`: the global memory, read into each session's prompt).
/// Such a write never passes through a branch or an accept, and text a model saved there
/// steers all sessions after it (a prompt injection that stays): it is asked in every
/// mode, yolo and auto-edit included, and refused in plan mode.
pub fn decide_call(
    mode: ApprovalMode,
    kind: ToolKind,
    read_only: bool,
    lasting: bool,
    summary: &str,
) -> Decision {
    if !lasting {
        return decide(mode, kind, read_only, summary);
    }
    match mode {
        ApprovalMode::Plan => Decision::Deny(format!(
            "plan mode does not allow saving to the global memory (`{summary}`)"
        )),
        _ => Decision::Ask(format!(
            "save to your global memory, which every later session reads: `{summary}`"
        )),
    }
}

/// The user's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Go ahead.
    Yes,
    /// Do not; the text goes back to the model.
    No(String),
}

/// What the user is asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApprovalRequest<'a> {
    /// Tool name.
    pub tool: &'a str,
    /// What would happen (from `Decision::Ask`).
    pub what: &'a str,
    /// A unified diff of the file change, when the tool can compute one.
    pub preview: Option<&'a str>,
}

/// Something that can ask the user.
pub trait Approver: Send + Sync {
    /// Ask whether the call described by `request` may run.
    fn ask<'a>(&'a self, request: ApprovalRequest<'a>) -> BoxFuture<'a, Answer>;
}

/// For runs with nobody to ask (`shade exec` without a terminal): refuses and says so.
#[derive(Debug, Clone)]
pub struct NoOneToAsk {
    /// The mode, for the message.
    pub mode: ApprovalMode,
}

impl Approver for NoOneToAsk {
    fn ask<'a>(&'a self, request: ApprovalRequest<'a>) -> BoxFuture<'a, Answer> {
        let mode = self.mode;
        let what = request.what;
        Box::pin(async move {
            Answer::No(format!(
                "Refused without running: approval mode `{mode}` asks before you {what}, and there \
                 is no user to ask in this non-interactive run. Do not retry it; finish what you \
                 can without it and tell the user what you would have done (they can rerun with \
                 --approval auto-edit or yolo)."
            ))
        })
    }
}

/// Says yes to everything (tests, scripted runs).
#[derive(Debug, Clone, Default)]
pub struct AlwaysYes;

impl Approver for AlwaysYes {
    fn ask<'a>(&'a self, _request: ApprovalRequest<'a>) -> BoxFuture<'a, Answer> {
        Box::pin(async { Answer::Yes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        use ApprovalMode::*;
        use ToolKind::*;
        let d = |m, k, ro| decide(m, k, ro, "x");
        assert_eq!(d(Default, Read, true), Decision::Allow);
        assert!(matches!(d(Default, Edit, false), Decision::Ask(_)));
        assert!(matches!(d(Default, Execute, false), Decision::Ask(_)));
        assert_eq!(d(Default, Execute, true), Decision::Allow);
        assert_eq!(d(AutoEdit, Edit, false), Decision::Allow);
        assert!(matches!(d(AutoEdit, Execute, false), Decision::Ask(_)));
        assert_eq!(d(Yolo, Execute, false), Decision::Allow);
        assert!(matches!(d(Plan, Edit, false), Decision::Deny(_)));
        assert!(matches!(d(Plan, Execute, false), Decision::Deny(_)));
        assert_eq!(d(Plan, Execute, true), Decision::Allow);
        assert!(matches!(d(Plan, Memory, false), Decision::Deny(_)));
        // MCP tools: read-only ones as reads, the others asked even in auto-edit.
        assert!(matches!(d(Default, Mcp, true), Decision::Allow));
        assert!(matches!(d(Plan, Mcp, true), Decision::Allow));
        assert!(matches!(d(Default, Mcp, false), Decision::Ask(_)));
        assert!(matches!(d(AutoEdit, Mcp, false), Decision::Ask(_)));
        assert!(matches!(d(Yolo, Mcp, false), Decision::Allow));
        assert!(matches!(d(Plan, Mcp, false), Decision::Deny(_)));
        // What outlives the branch (the global memory) is asked in every mode.
        for m in [Default, AutoEdit, Yolo] {
            assert!(matches!(
                decide_call(m, Memory, false, true, "x"),
                Decision::Ask(_)
            ));
        }
        assert!(matches!(
            decide_call(Plan, Memory, false, true, "x"),
            Decision::Deny(_)
        ));
        assert_eq!(
            decide_call(Yolo, Memory, false, false, "x"),
            Decision::Allow
        );
        assert_eq!("auto-edit".parse::<ApprovalMode>(), Ok(AutoEdit));
        assert!("nope".parse::<ApprovalMode>().is_err());
    }
}
