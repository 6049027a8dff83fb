//! What a run reports as it goes, typed so that a CLI renders it, `--json` prints it as JSONL,
//! and tests assert on it. Reasoning never appears here: it is not for the user.

use serde::Serialize;
use serde_json::Value;

/// Why a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model answered without asking for tools.
    Completed,
    /// The turn limit was reached.
    TurnLimit,
    /// The caller cancelled.
    Cancelled,
    /// A model call failed for good.
    Error,
    /// A call gate (speculation) stopped the run before a call it may not make; the calls
    /// before it ran and have their results.
    Boundary,
    /// The model repeated itself (the same tool call, or the same text, over and over) and
    /// was stopped; see [`crate::loop_detect`].
    LoopDetected,
}

/// One event of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AgentEvent {
    /// A model call starts.
    TurnStart {
        /// 1-based turn number.
        turn: u32,
        /// Model asked for.
        model: String,
    },
    /// Visible answer text.
    TextDelta {
        /// The delta.
        text: String,
    },
    /// A tool call starts (after approval).
    ToolStart {
        /// Call id.
        id: String,
        /// Tool name.
        name: String,
        /// Short description (`read_file src/main.rs`).
        summary: String,
        /// Parsed arguments (`null` when they were not valid JSON).
        args: Value,
    },
    /// A tool call has its result (every call gets exactly one, refusals and errors included).
    ToolEnd {
        /// Call id.
        id: String,
        /// Tool name.
        name: String,
        /// Did it succeed?
        ok: bool,
        /// Refused by the approval mode or the user (not run at all).
        denied: bool,
        /// One line for the user.
        display: String,
        /// What the model receives.
        output: String,
    },
    /// Tokens used by one model call.
    Usage {
        /// Model that answered.
        model: String,
        /// Input tokens.
        prompt_tokens: u64,
        /// Output tokens.
        completion_tokens: u64,
        /// Input tokens served from cache.
        cached_tokens: u64,
    },
    /// A model call failed and will be retried.
    Retry {
        /// 1-based retry number.
        attempt: u32,
        /// Wait before it.
        delay_ms: u64,
        /// The error.
        reason: String,
    },
    /// The model was switched.
    ModelSwitch {
        /// Old model.
        from: String,
        /// New model.
        to: String,
        /// Why.
        reason: String,
    },
    /// Something failed; the run may go on (tool errors are in `ToolEnd`) or stop.
    Error {
        /// What happened.
        message: String,
    },
    /// The run ended.
    Done {
        /// Why.
        reason: StopReason,
        /// Model calls made.
        turns: u32,
    },
}
