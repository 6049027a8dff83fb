//! `shade exec --suggest`: after the answer, the prompt suggestion `shade chat` would show,
//! for editor plugins and benchmarks. Same guards (except interactivity: the flag is the
//! request), same request, same filter, same telemetry line; nobody can accept or ignore a
//! printed suggestion, so telemetry records it with outcome `shown`.

use std::io::Write;

use shade_agent::background::{prompt_id, BackgroundLlm};
use shade_agent::followup::cache::new_session_id;
use shade_agent::followup::{
    count_model_turns, generate_suggestion, CacheSafeParams, FollowupSettings,
    PromptSuggestionEvent, SuggestionEventOutcome, SuggestionGuards, SuggestionOutcome,
    SuggestionSource, Telemetry,
};
use shade_agent::ApprovalMode;
use shade_llm::{Message, ToolSpec};
use tokio_util::sync::CancellationToken;

/// What the finished run looked like.
pub struct Finished<'a> {
    /// The whole conversation, system prompt first.
    pub conversation: &'a [Message],
    /// The tools the run offered.
    pub tools: &'a [ToolSpec],
    /// The main model.
    pub model: &'a str,
    /// The approval mode (no suggestion in plan mode).
    pub approval: ApprovalMode,
    /// The run ended in a model error.
    pub failed: bool,
}

/// Compute, print and record the suggestion. Prints `suggestion: TEXT` (or with `json` one
/// `{"type":"suggestion",…}` line) on stdout; why there is none goes to stderr (or into the
/// JSON object). Never changes the exit status.
pub async fn suggest(
    bg: &BackgroundLlm,
    settings: FollowupSettings,
    run: Finished<'_>,
    json: bool,
    cancel: &CancellationToken,
) {
    let session = new_session_id();
    let telemetry = if settings.telemetry {
        Telemetry::from_env(session)
    } else {
        Telemetry::disabled()
    };
    let guards = SuggestionGuards {
        enabled: settings.suggestions,
        interactive: true,
        plan_mode: run.approval == ApprovalMode::Plan,
        last_answer_error: run.failed,
        dialog_open: false,
        model_turns: count_model_turns(run.conversation),
    };
    let outcome = match guards.blocked_by() {
        Some(guard) => SuggestionOutcome::Suppressed(guard),
        None => {
            let params = settings
                .cache_sharing
                .then(|| {
                    CacheSafeParams::capture(session, run.conversation, run.tools, run.model, None)
                })
                .flatten();
            let source = match &params {
                Some(p) => SuggestionSource::Cached(p),
                None => SuggestionSource::Standalone(run.conversation),
            };
            generate_suggestion(bg, source, cancel).await
        }
    };
    let id = prompt_id::PROMPT_SUGGESTION;
    let (line, event) = match &outcome {
        SuggestionOutcome::Suggested(text) => {
            let mut event = PromptSuggestionEvent::new(SuggestionEventOutcome::Shown, id);
            event.suggestion_length = Some(text.chars().count());
            let line = if json {
                serde_json::json!({"type": "suggestion", "text": text}).to_string()
            } else {
                format!(
                    "suggestion: {}",
                    shade_fusefs::quote::visible_controls(text)
                )
            };
            (Some(line), event)
        }
        SuggestionOutcome::Suppressed(rule) => {
            if json {
                let line = serde_json::json!({"type": "suggestion", "suppressed": rule});
                (
                    Some(line.to_string()),
                    PromptSuggestionEvent::suppressed(rule, id),
                )
            } else {
                eprintln!("shade: no suggestion ({rule})");
                (None, PromptSuggestionEvent::suppressed(rule, id))
            }
        }
        SuggestionOutcome::Failed(_) if outcome.is_cancelled() => return,
        SuggestionOutcome::Failed(message) => {
            let line = if json {
                Some(serde_json::json!({"type": "suggestion", "error": message}).to_string())
            } else {
                eprintln!("shade: no suggestion: {message}");
                None
            };
            (line, PromptSuggestionEvent::suppressed("error", id))
        }
    };
    if let Some(line) = line {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
    telemetry.record_suggestion(&event);
}
