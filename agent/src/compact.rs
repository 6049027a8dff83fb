//! Context compaction: when a conversation nears the model's context window, the older turns
//! are summarised by the fast model into one message and the recent turns are kept verbatim.
//! The cut is always made just before a user message, so every tool call stays paired with
//! its result (a user message never stands between a call and its answer).

use tokio_util::sync::CancellationToken;

use crate::background::{prompt_id, BackgroundLlm};
use crate::llm::{LlmError, Message};

/// How the summary message starts, so a later compaction (and the reader) can tell it apart.
pub const SUMMARY_HEADER: &str =
    "[Summary of the earlier conversation, written when it was compacted]";

/// Instructions for the summariser.
pub const COMPACTION_PROMPT: &str = "You are compacting a coding-agent conversation that is \
about to exceed the model's context window. Write a summary that lets the agent continue the \
work without the original messages: the user's requests and constraints (quote exact wording \
where it matters), decisions taken, files read or changed (with paths) and what changed in \
them, commands run and their outcomes (failures included), open problems and the next steps \
that were planned. Be factual and dense; use short bullet points; do not invent anything; \
no preamble.";

/// What a compaction did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompactReport {
    /// Messages replaced by the summary.
    pub summarised: usize,
    /// Messages kept verbatim after it.
    pub kept: usize,
}

/// Why nothing was compacted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CompactError {
    /// Only the recent turns exist: there is nothing older to summarise.
    #[error("nothing to compact: the conversation has only {0} recent turn(s)")]
    TooShort(usize),
    /// The summary call failed; the conversation is unchanged.
    #[error("the summary call failed: {0}")]
    Llm(#[from] LlmError),
    /// The model answered with nothing.
    #[error("the model returned an empty summary")]
    EmptySummary,
}

/// Indices of the user messages that start turns (a summary message is not a turn).
fn turn_starts(conversation: &[Message]) -> Vec<usize> {
    conversation
        .iter()
        .enumerate()
        .filter(
            |(_, m)| matches!(m, Message::User { content } if !content.starts_with(SUMMARY_HEADER)),
        )
        .map(|(i, _)| i)
        .collect()
}

/// Summarise everything before the last `keep_turns` user turns into one message.
/// `conversation` starts with the system prompt; it is changed only on success.
pub async fn compact(
    background: &BackgroundLlm,
    conversation: &mut Vec<Message>,
    keep_turns: usize,
    cancel: &CancellationToken,
) -> Result<CompactReport, CompactError> {
    let starts = turn_starts(conversation);
    let keep_turns = keep_turns.max(1);
    if starts.len() <= keep_turns {
        return Err(CompactError::TooShort(starts.len()));
    }
    let cut = starts[starts.len() - keep_turns];
    let first = usize::from(matches!(conversation.first(), Some(Message::System { .. })));
    let older = &conversation[first..cut];
    let transcript = render_transcript(older);
    let messages = vec![
        Message::System {
            content: COMPACTION_PROMPT.to_string(),
        },
        Message::User {
            content: format!("The conversation so far:\n\n{transcript}\n\nWrite the summary now."),
        },
    ];
    let completion = background
        .ask(prompt_id::COMPACTION, messages, cancel)
        .await?;
    let summary = completion.text.trim();
    if summary.is_empty() {
        return Err(CompactError::EmptySummary);
    }
    let summarised = cut - first;
    let mut rebuilt: Vec<Message> = conversation[..first].to_vec();
    rebuilt.push(Message::User {
        content: format!("{SUMMARY_HEADER}\n{summary}"),
    });
    rebuilt.extend_from_slice(&conversation[cut..]);
    let kept = conversation.len() - cut;
    *conversation = rebuilt;
    Ok(CompactReport { summarised, kept })
}

/// A plain-text rendering of messages for the summariser; long tool results are cut in the
/// middle (the summary needs their gist, not every byte).
pub fn render_transcript(messages: &[Message]) -> String {
    const TOOL_RESULT_CAP: usize = 4_000;
    let mut out = String::new();
    for m in messages {
        match m {
            Message::System { content } => out.push_str(&format!("SYSTEM: {content}\n\n")),
            Message::User { content } => out.push_str(&format!("USER: {content}\n\n")),
            Message::Assistant {
                content,
                tool_calls,
            } => {
                if !content.is_empty() {
                    out.push_str(&format!("ASSISTANT: {content}\n"));
                }
                for c in tool_calls {
                    out.push_str(&format!("ASSISTANT CALLS {}({})\n", c.name, c.arguments));
                }
                out.push('\n');
            }
            Message::Tool { content, .. } => {
                let text = if content.chars().count() > TOOL_RESULT_CAP {
                    let head: String = content.chars().take(TOOL_RESULT_CAP / 2).collect();
                    let tail: String = {
                        let v: Vec<char> =
                            content.chars().rev().take(TOOL_RESULT_CAP / 2).collect();
                        v.into_iter().rev().collect()
                    };
                    format!("{head}\n[… cut …]\n{tail}")
                } else {
                    content.clone()
                };
                out.push_str(&format!("TOOL RESULT: {text}\n\n"));
            }
        }
    }
    out
}

/// Every assistant tool call is followed by exactly its results, in order, before the next
/// user or assistant message: what a provider requires of a conversation.
pub fn tool_calls_paired(conversation: &[Message]) -> bool {
    let mut pending: Vec<&str> = Vec::new();
    for m in conversation {
        match m {
            Message::Assistant { tool_calls, .. } => {
                if !pending.is_empty() {
                    return false;
                }
                pending = tool_calls.iter().map(|c| c.id.as_str()).collect();
            }
            Message::Tool { tool_call_id, .. } => {
                match pending.iter().position(|id| id == tool_call_id) {
                    Some(i) => {
                        pending.remove(i);
                    }
                    None => return false,
                }
            }
            Message::User { .. } | Message::System { .. } => {
                if !pending.is_empty() {
                    return false;
                }
            }
        }
    }
    pending.is_empty()
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::llm::provider::EventFn;
    use crate::llm::{BoxFuture, ChatRequest, Completion, FinishReason, LlmProvider, ToolCall};

    struct Summariser(Mutex<Vec<ChatRequest>>);
    impl LlmProvider for Summariser {
        fn complete<'a>(
            &'a self,
            request: &'a ChatRequest,
            _on_event: EventFn<'a>,
            _cancel: &'a CancellationToken,
        ) -> BoxFuture<'a, Result<Completion, LlmError>> {
            if let Ok(mut v) = self.0.lock() {
                v.push(request.clone());
            }
            Box::pin(async {
                Ok(Completion {
                    model: "fast".into(),
                    text: "- user wants add.sh fixed".into(),
                    reasoning: String::new(),
                    tool_calls: vec![],
                    finish_reason: FinishReason::Stop,
                    usage: None,
                })
            })
        }
    }

    fn turn(n: usize) -> Vec<Message> {
        let id = format!("call_{n}");
        vec![
            Message::User {
                content: format!("request {n}"),
            },
            Message::Assistant {
                content: String::new(),
                tool_calls: vec![ToolCall {
                    id: id.clone(),
                    name: "read_file".into(),
                    arguments: "{}".into(),
                }],
            },
            Message::Tool {
                tool_call_id: id,
                content: "x".repeat(10_000),
            },
            Message::Assistant {
                content: format!("done {n}"),
                tool_calls: vec![],
            },
        ]
    }

    #[tokio::test]
    async fn older_turns_become_one_summary_and_pairs_survive() {
        let provider = Arc::new(Summariser(Mutex::new(vec![])));
        let bg = BackgroundLlm::new(provider.clone(), "fast");
        let mut conv = vec![Message::System {
            content: "sys".into(),
        }];
        for n in 0..4 {
            conv.extend(turn(n));
        }
        let cancel = CancellationToken::new();
        let report = compact(&bg, &mut conv, 2, &cancel).await.expect("compact");
        assert_eq!(
            report,
            CompactReport {
                summarised: 8,
                kept: 8
            }
        );
        assert_eq!(conv.len(), 1 + 1 + 8);
        assert!(
            matches!(&conv[1], Message::User { content } if content.starts_with(SUMMARY_HEADER))
        );
        assert!(matches!(&conv[2], Message::User { content } if content == "request 2"));
        assert!(tool_calls_paired(&conv));
        let sent = provider.0.lock().expect("lock")[0].clone();
        assert_eq!(sent.prompt_id.as_deref(), Some(prompt_id::COMPACTION));
        assert!(sent.background);
        // A second compaction does not count the summary as a turn.
        let again = compact(&bg, &mut conv, 2, &cancel).await;
        assert!(matches!(again, Err(CompactError::TooShort(2))));
    }

    #[test]
    fn pairing_check_catches_orphans() {
        let mut t = turn(0);
        assert!(tool_calls_paired(&t));
        t.remove(2);
        assert!(!tool_calls_paired(&t));
    }
}
