//! Asking the (fast) model for the next input. With a saved prefix the request is a fork of
//! the main conversation — same system prompt, same tools, same history, then the suggestion
//! prompt as one more user message — so a prefix-caching server serves all but the last
//! message from its cache. Without one (or with cache sharing off) it is a small standalone
//! request. Either way the answer goes through [`filter_reason`].

use tokio_util::sync::CancellationToken;

use super::cache::CacheSafeParams;
use super::filter::{filter_reason, normalize};
use super::prompt::{pipelined_prompt, SUGGESTION_PROMPT};
use crate::background::{prompt_id, BackgroundLlm};
use crate::llm::{LlmError, Message};

/// Messages of the conversation a standalone request quotes at most.
pub const STANDALONE_MAX_MESSAGES: usize = 12;
/// Characters of one quoted message at most.
pub const STANDALONE_MAX_MESSAGE_CHARS: usize = 1500;
/// Characters of the quoted conversation at most (older messages are dropped first).
pub const STANDALONE_MAX_CHARS: usize = 8000;

/// What the suggestion request is built from.
#[derive(Debug, Clone, Copy)]
pub enum SuggestionSource<'a> {
    /// The session's saved prefix: a forked, cache-sharing request.
    Cached(&'a CacheSafeParams),
    /// The conversation itself (system prompt first or not), when there is no saved prefix or
    /// cache sharing is off: a standalone request without tools.
    Standalone(&'a [Message]),
}

/// What came of a suggestion request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SuggestionOutcome {
    /// Show this (already normalised: no surrounding quotes or whitespace).
    Suggested(String),
    /// The model answered, but the filter rule named here dropped it (`empty` included).
    Suppressed(&'static str),
    /// The request failed (`cancelled` when the token fired).
    Failed(String),
}

impl SuggestionOutcome {
    /// Was the request cancelled (the user typed)? Not worth a log line.
    pub fn is_cancelled(&self) -> bool {
        matches!(self, Self::Failed(m) if m == CANCELLED)
    }

    /// The suggestion, if there is one.
    pub fn suggestion(&self) -> Option<&str> {
        match self {
            Self::Suggested(s) => Some(s),
            _ => None,
        }
    }
}

const CANCELLED: &str = "cancelled";

/// The request [`generate_suggestion`] sends (for tests and for recording what was asked).
pub fn suggestion_request(
    bg: &BackgroundLlm,
    source: SuggestionSource<'_>,
) -> crate::llm::ChatRequest {
    let ask = |content: String| Message::User { content };
    match source {
        SuggestionSource::Cached(params) => bg.request(
            prompt_id::PROMPT_SUGGESTION,
            params.fork_messages(ask(SUGGESTION_PROMPT.to_string())),
            params.tools.clone(),
        ),
        SuggestionSource::Standalone(conversation) => bg.request(
            prompt_id::PROMPT_SUGGESTION,
            vec![ask(format!(
                "{}\n\n{SUGGESTION_PROMPT}",
                condense(conversation)
            ))],
            Vec::new(),
        ),
    }
}

/// Ask for the user's likely next input after an answer. Tool calls in the reply are
/// ignored; the text is normalised and filtered. The caller checks the guards first.
pub async fn generate_suggestion(
    bg: &BackgroundLlm,
    source: SuggestionSource<'_>,
    cancel: &CancellationToken,
) -> SuggestionOutcome {
    let request = suggestion_request(bg, source);
    outcome(bg.complete(&request, cancel).await)
}

/// The suggestion after a speculated turn (`pipelined_suggestion`): the saved prefix, then one
/// user message quoting the accepted suggestion and the speculated answer (its assistant text,
/// joined) before the suggestion prompt. Same filter; no 2-turn guard.
pub async fn generate_pipelined(
    bg: &BackgroundLlm,
    params: &CacheSafeParams,
    suggestion: &str,
    speculated_messages: &[Message],
    cancel: &CancellationToken,
) -> SuggestionOutcome {
    let text = speculated_messages
        .iter()
        .filter_map(|m| match m {
            Message::Assistant { content, .. } if !content.trim().is_empty() => {
                Some(content.trim())
            }
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let request = bg.request(
        prompt_id::PIPELINED_SUGGESTION,
        params.fork_messages(Message::User {
            content: pipelined_prompt(suggestion, &text),
        }),
        params.tools.clone(),
    );
    outcome(bg.complete(&request, cancel).await)
}

fn outcome(result: Result<crate::llm::Completion, LlmError>) -> SuggestionOutcome {
    match result {
        Ok(completion) => judge(&completion.text),
        Err(LlmError::Cancelled) => SuggestionOutcome::Failed(CANCELLED.into()),
        Err(e) => SuggestionOutcome::Failed(e.to_string()),
    }
}

/// Turn the model's text into an outcome: a `{"suggestion": "…"}` object (models asked for
/// JSON elsewhere sometimes answer so) is unwrapped, then normalised and filtered.
pub fn judge(raw: &str) -> SuggestionOutcome {
    let unwrapped = serde_json::from_str::<serde_json::Value>(raw.trim())
        .ok()
        .and_then(|v| {
            v.get("suggestion")
                .and_then(|s| s.as_str())
                .map(str::to_string)
        });
    let text = unwrapped.as_deref().unwrap_or(raw);
    match filter_reason(text) {
        Some(rule) => SuggestionOutcome::Suppressed(rule),
        None => SuggestionOutcome::Suggested(normalize(text).to_string()),
    }
}

/// The recent conversation as plain text for a standalone request: user and assistant text,
/// tool calls by name, tool results cut short; system prompts left out. Newest messages win
/// when it is too long.
pub fn condense(conversation: &[Message]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut total = 0;
    for m in conversation.iter().rev() {
        let line = match m {
            Message::System { .. } => continue,
            Message::User { content } => format!("User: {}", cut(content)),
            Message::Assistant {
                content,
                tool_calls,
            } => {
                let mut s = String::from("Assistant:");
                if !content.trim().is_empty() {
                    s.push(' ');
                    s.push_str(&cut(content));
                }
                for call in tool_calls {
                    s.push_str(&format!(" [called {}]", call.name));
                }
                s
            }
            Message::Tool { content, .. } => {
                format!("Tool result: {}", cut_to(content, 200))
            }
        };
        let n = line.chars().count();
        if parts.len() >= STANDALONE_MAX_MESSAGES
            || (total + n > STANDALONE_MAX_CHARS && !parts.is_empty())
        {
            break;
        }
        total += n;
        parts.push(line);
    }
    parts.reverse();
    format!(
        "The conversation so far (most recent last):\n\n{}",
        parts.join("\n\n")
    )
}

fn cut(s: &str) -> String {
    cut_to(s, STANDALONE_MAX_MESSAGE_CHARS)
}

fn cut_to(s: &str, max: usize) -> String {
    let s = s.trim();
    if s.chars().count() <= max {
        return s.to_string();
    }
    let head: String = s.chars().take(max).collect();
    format!("{head}…")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::ToolCall;

    #[test]
    fn judge_normalises_unwraps_and_filters() {
        assert_eq!(
            judge("  \"run the tests\"\n"),
            SuggestionOutcome::Suggested("run the tests".into())
        );
        assert_eq!(
            judge(r#"{"suggestion": "commit this"}"#),
            SuggestionOutcome::Suggested("commit this".into())
        );
        assert_eq!(
            judge("Looks good to me"),
            SuggestionOutcome::Suppressed("evaluative")
        );
        assert_eq!(judge(""), SuggestionOutcome::Suppressed("empty"));
        assert_eq!(
            judge(r#"{"suggestion": ""}"#),
            SuggestionOutcome::Suppressed("empty")
        );
        assert!(SuggestionOutcome::Failed("cancelled".into()).is_cancelled());
    }

    #[test]
    fn condense_keeps_the_newest_and_leaves_the_system_prompt_out() {
        let mut conv = vec![Message::System {
            content: "SECRET SYSTEM".into(),
        }];
        for i in 0..20 {
            conv.push(Message::User {
                content: format!("question {i}"),
            });
            conv.push(Message::Assistant {
                content: format!("answer {i}"),
                tool_calls: vec![ToolCall {
                    id: format!("c{i}"),
                    name: "read_file".into(),
                    arguments: "{}".into(),
                }],
            });
            conv.push(Message::Tool {
                tool_call_id: format!("c{i}"),
                content: "x".repeat(1000),
            });
        }
        let text = condense(&conv);
        assert!(!text.contains("SECRET"));
        assert!(text.contains("answer 19 [called read_file]"));
        assert!(!text.contains("question 0\n"));
        assert_eq!(text.matches("\n\n").count(), STANDALONE_MAX_MESSAGES);
        assert!(text.chars().count() < STANDALONE_MAX_CHARS + 200);
        assert!(text.ends_with(&format!("Tool result: {}…", "x".repeat(200))));
    }
}
