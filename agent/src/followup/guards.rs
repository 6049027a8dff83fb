//! When a suggestion may be asked for at all (the seed's guard conditions): each one that
//! fails names itself, so the REPL can log why nothing was suggested.

use crate::llm::Message;

/// Suggestions start after this many model turns (an early conversation has no pattern yet).
pub const MIN_MODEL_TURNS: u32 = 2;

/// The state the guards look at, filled in by the caller after an answer
/// (Responding → Idle).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SuggestionGuards {
    /// The `enable_followup_suggestions` setting (and not `--no-suggest`).
    pub enabled: bool,
    /// A person at a terminal (`shade exec --suggest` passes true: it asked explicitly).
    pub interactive: bool,
    /// Approval mode `plan`: the user is reviewing a plan, not typing the next step.
    pub plan_mode: bool,
    /// The last answer ended in an API error: a suggestion would paper over it.
    pub last_answer_error: bool,
    /// An approval prompt or another dialog waits for the user.
    pub dialog_open: bool,
    /// Assistant messages so far ([`count_model_turns`]).
    pub model_turns: u32,
}

impl SuggestionGuards {
    /// The first guard that forbids a suggestion: `disabled`, `non_interactive`, `plan_mode`,
    /// `api_error`, `dialog_open`, `early_conversation` (fewer than 2 model turns); `None`
    /// when a suggestion may be generated.
    pub fn blocked_by(&self) -> Option<&'static str> {
        if !self.enabled {
            Some("disabled")
        } else if !self.interactive {
            Some("non_interactive")
        } else if self.plan_mode {
            Some("plan_mode")
        } else if self.last_answer_error {
            Some("api_error")
        } else if self.dialog_open {
            Some("dialog_open")
        } else if self.model_turns < MIN_MODEL_TURNS {
            Some("early_conversation")
        } else {
            None
        }
    }
}

/// Model turns in a conversation: its assistant messages (one per model call, tool-call
/// turns included, as the peer counts its `model` entries).
pub fn count_model_turns(conversation: &[Message]) -> u32 {
    let n = conversation
        .iter()
        .filter(|m| matches!(m, Message::Assistant { .. }))
        .count();
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open() -> SuggestionGuards {
        SuggestionGuards {
            enabled: true,
            interactive: true,
            plan_mode: false,
            last_answer_error: false,
            dialog_open: false,
            model_turns: 2,
        }
    }

    #[test]
    fn all_guards_open_allows() {
        assert_eq!(open().blocked_by(), None);
        let many = SuggestionGuards {
            model_turns: 40,
            ..open()
        };
        assert_eq!(many.blocked_by(), None);
    }

    #[test]
    fn each_guard_blocks_with_its_name() {
        let cases = [
            (
                SuggestionGuards {
                    enabled: false,
                    ..open()
                },
                "disabled",
            ),
            (
                SuggestionGuards {
                    interactive: false,
                    ..open()
                },
                "non_interactive",
            ),
            (
                SuggestionGuards {
                    plan_mode: true,
                    ..open()
                },
                "plan_mode",
            ),
            (
                SuggestionGuards {
                    last_answer_error: true,
                    ..open()
                },
                "api_error",
            ),
            (
                SuggestionGuards {
                    dialog_open: true,
                    ..open()
                },
                "dialog_open",
            ),
            (
                SuggestionGuards {
                    model_turns: 1,
                    ..open()
                },
                "early_conversation",
            ),
            (
                SuggestionGuards {
                    model_turns: 0,
                    ..open()
                },
                "early_conversation",
            ),
        ];
        for (g, name) in cases {
            assert_eq!(g.blocked_by(), Some(name), "{g:?}");
        }
        // The setting is checked first.
        let all_closed = SuggestionGuards {
            enabled: false,
            interactive: false,
            plan_mode: true,
            last_answer_error: true,
            dialog_open: true,
            model_turns: 0,
        };
        assert_eq!(all_closed.blocked_by(), Some("disabled"));
    }

    #[test]
    fn model_turns_are_assistant_messages() {
        use crate::llm::ToolCall;
        let conv = vec![
            Message::System {
                content: "s".into(),
            },
            Message::User {
                content: "u".into(),
            },
            Message::Assistant {
                content: String::new(),
                tool_calls: vec![ToolCall {
                    id: "a".into(),
                    name: "ls".into(),
                    arguments: "{}".into(),
                }],
            },
            Message::Tool {
                tool_call_id: "a".into(),
                content: "x".into(),
            },
            Message::Assistant {
                content: "done".into(),
                tool_calls: vec![],
            },
        ];
        assert_eq!(count_model_turns(&conv), 2);
        assert_eq!(count_model_turns(&conv[..3]), 1);
        assert_eq!(count_model_turns(&[]), 0);
    }
}
