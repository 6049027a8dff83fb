//! The provider-neutral shapes of a chat exchange: what the loop sends and what comes back.

use serde::{Deserialize, Serialize};

/// One message of the conversation, in the order the model sees it.
///
/// Kept close to the OpenAI wire form so that a recorded cassette reads like the request that
/// was sent, and so that a forked conversation (speculation) keeps a byte-identical prefix.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum Message {
    /// Instructions; stable across turns so that the provider's prefix cache hits.
    System {
        /// The prompt text.
        content: String,
    },
    /// What the user typed.
    User {
        /// The prompt text.
        content: String,
    },
    /// A model reply: text and/or tool calls.
    Assistant {
        /// Visible text (reasoning is never stored here).
        #[serde(default, skip_serializing_if = "String::is_empty")]
        content: String,
        /// Tool calls the model asked for, in its order.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
    },
    /// The result of one tool call, paired by id.
    Tool {
        /// The id of the call this answers.
        tool_call_id: String,
        /// What the model reads.
        content: String,
    },
}

/// A tool call as assembled from the stream: the arguments are the raw JSON text the model
/// produced (possibly invalid — the tool layer reports that back to the model).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Provider-assigned id, echoed in the tool result.
    pub id: String,
    /// Tool name.
    pub name: String,
    /// JSON arguments as text.
    pub arguments: String,
}

/// A tool as offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Name the model calls it by.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON schema of its arguments.
    pub parameters: serde_json::Value,
}

/// Everything needed for one model call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    /// Model name; the retry layer may switch it (see `ModelSwitch`).
    pub model: String,
    /// The conversation, system prompt first.
    pub messages: Vec<Message>,
    /// Tools offered; empty means none.
    #[serde(default)]
    pub tools: Vec<ToolSpec>,
    /// Sampling temperature, if set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Output token cap, if set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Background work (suggestions, summaries): uses the fast model and disables thinking.
    #[serde(default)]
    pub background: bool,
    /// Internal prompt id of background work (`prompt_suggestion`, `speculation`, …; see
    /// `shade_agent::background::prompt_id`): such calls stay out of the transcript and of the main
    /// conversation's cassette, but are counted in token statistics. `None`: the conversation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_id: Option<String>,
}

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// Natural end of the answer.
    Stop,
    /// The model wants tool results.
    ToolCalls,
    /// Output token cap reached.
    Length,
    /// Filtered by the provider.
    ContentFilter,
    /// Anything else the provider said.
    Other(String),
}

impl FinishReason {
    /// Map the wire string.
    pub fn from_wire(s: &str) -> Self {
        match s {
            "stop" | "end_turn" => Self::Stop,
            "tool_calls" | "function_call" | "tool_use" => Self::ToolCalls,
            "length" | "max_tokens" => Self::Length,
            "content_filter" => Self::ContentFilter,
            other => Self::Other(other.to_string()),
        }
    }
}

/// Token accounting as reported by the provider.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Input tokens.
    pub prompt_tokens: u64,
    /// Output tokens.
    pub completion_tokens: u64,
    /// Input tokens served from the provider's prefix cache, when reported.
    #[serde(default)]
    pub cached_tokens: u64,
}

/// The assembled result of one model call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    /// Model that actually answered (after any switch).
    pub model: String,
    /// Visible text.
    pub text: String,
    /// Reasoning/thinking text: kept for logs, never shown as the answer nor sent back.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reasoning: String,
    /// Tool calls in the model's order.
    #[serde(default)]
    pub tool_calls: Vec<ToolCall>,
    /// Why it stopped.
    pub finish_reason: FinishReason,
    /// Token usage, if the provider sent it.
    #[serde(default)]
    pub usage: Option<Usage>,
}

/// Incremental output while a call is in flight, plus retry notices from the resilience layer.
#[derive(Debug, Clone, PartialEq)]
pub enum LlmEvent {
    /// Visible text.
    Text(String),
    /// Reasoning text (callers must not show it as the answer).
    Reasoning(String),
    /// A failed attempt will be retried after `delay_ms`.
    Retry {
        /// 1-based attempt number that failed.
        attempt: u32,
        /// Wait before the next attempt.
        delay_ms: u64,
        /// Why it failed.
        reason: String,
    },
    /// The model was switched (context too long or rate limited).
    ModelSwitch {
        /// Previous model.
        from: String,
        /// New model.
        to: String,
        /// Why.
        reason: String,
    },
}
