//! Background model calls: prompt suggestions, speculation, compaction, edit repair, output
//! summaries. They share one recipe — the fast model, thinking off, an internal prompt id that
//! keeps them out of the transcript and of the main cassette — and one token account, so that
//! `/stats` shows what the user pays for work they never see.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::llm::{
    BoxFuture, ChatRequest, Completion, LlmError, LlmEvent, LlmProvider, Message, ToolSpec, Usage,
};

/// The internal prompt ids (the seed's `INTERNAL_PROMPT_IDS`), one per kind of background work.
pub mod prompt_id {
    /// Next-input suggestion after an answer.
    pub const PROMPT_SUGGESTION: &str = "prompt_suggestion";
    /// A cache-sharing fork of the conversation that answers one question.
    pub const FORKED_QUERY: &str = "forked_query";
    /// The speculation engine's forked agent turns.
    pub const SPECULATION: &str = "speculation";
    /// The suggestion computed from a finished speculation.
    pub const PIPELINED_SUGGESTION: &str = "pipelined_suggestion";
    /// Summarising older turns when the context fills up.
    pub const COMPACTION: &str = "compaction";
    /// Repairing an `edit` whose `old_string` did not match.
    pub const EDIT_CORRECTION: &str = "edit_correction";
    /// Correcting over-escaped `write_file` content.
    pub const CONTENT_CORRECTION: &str = "content_correction";
    /// Summarising a tool's oversized output.
    pub const OUTPUT_SUMMARY: &str = "output_summary";
    /// Answering a prompt about a fetched page.
    pub const WEB_FETCH: &str = "web_fetch";
}

/// A handle for background calls: which provider and which (fast) model.
#[derive(Clone)]
pub struct BackgroundLlm {
    provider: Arc<dyn LlmProvider>,
    model: String,
}

impl std::fmt::Debug for BackgroundLlm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackgroundLlm")
            .field("model", &self.model)
            .finish()
    }
}

impl BackgroundLlm {
    /// Background calls through `provider` to `model` (the fast model, or the main one when
    /// no fast model is configured).
    pub fn new(provider: Arc<dyn LlmProvider>, model: impl Into<String>) -> Self {
        Self {
            provider,
            model: model.into(),
        }
    }

    /// The model background calls go to.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The same handle pointed at another model (`/model --fast NAME`).
    pub fn with_model(&self, model: impl Into<String>) -> Self {
        Self {
            provider: self.provider.clone(),
            model: model.into(),
        }
    }

    /// The provider, for callers that run whole forked agents (speculation).
    pub fn provider(&self) -> &Arc<dyn LlmProvider> {
        &self.provider
    }

    /// A background request: `tools` may be the conversation's own tool list, so that a
    /// forked request keeps the main request's cacheable prefix byte for byte.
    pub fn request(&self, id: &str, messages: Vec<Message>, tools: Vec<ToolSpec>) -> ChatRequest {
        ChatRequest {
            model: self.model.clone(),
            messages,
            tools,
            temperature: None,
            max_tokens: None,
            background: true,
            prompt_id: Some(id.to_string()),
        }
    }

    /// One background call without tools; streamed output is not shown anywhere.
    pub async fn ask(
        &self,
        id: &str,
        messages: Vec<Message>,
        cancel: &CancellationToken,
    ) -> Result<Completion, LlmError> {
        let request = self.request(id, messages, Vec::new());
        self.complete(&request, cancel).await
    }

    /// Send a prepared background request.
    pub async fn complete(
        &self,
        request: &ChatRequest,
        cancel: &CancellationToken,
    ) -> Result<Completion, LlmError> {
        let quiet = |_e: LlmEvent| {};
        self.provider.complete(request, &quiet, cancel).await
    }
}

/// Tokens of one model, split by who asked.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ModelTokens {
    /// Calls made for the conversation itself.
    pub foreground: Usage,
    /// Calls made in the background (suggestions, speculation, repairs…).
    pub background: Usage,
    /// Number of foreground calls.
    pub foreground_calls: u64,
    /// Number of background calls.
    pub background_calls: u64,
    /// Calls whose answer carried no `usage` (some local servers send none): their tokens
    /// are unknown, not zero.
    pub unreported_calls: u64,
}

/// Token use of a session, per model — what `/stats` prints.
#[derive(Debug, Clone, Default)]
pub struct TokenStats {
    inner: Arc<Mutex<BTreeMap<String, ModelTokens>>>,
}

impl TokenStats {
    /// Count one call's usage.
    pub fn record(&self, model: &str, background: bool, usage: &Usage) {
        if let Ok(mut map) = self.inner.lock() {
            let entry = map.entry(model.to_string()).or_default();
            let (slot, calls) = if background {
                (&mut entry.background, &mut entry.background_calls)
            } else {
                (&mut entry.foreground, &mut entry.foreground_calls)
            };
            slot.prompt_tokens += usage.prompt_tokens;
            slot.completion_tokens += usage.completion_tokens;
            slot.cached_tokens += usage.cached_tokens;
            *calls += 1;
        }
    }

    /// Count a call whose answer reported no token usage.
    pub fn record_unreported(&self, model: &str, background: bool) {
        self.record(model, background, &Usage::default());
        if let Ok(mut map) = self.inner.lock() {
            map.entry(model.to_string()).or_default().unreported_calls += 1;
        }
    }

    /// A copy of the counts, per model.
    pub fn snapshot(&self) -> BTreeMap<String, ModelTokens> {
        self.inner.lock().map(|m| m.clone()).unwrap_or_default()
    }
}

/// Wraps a provider and counts every call's tokens in a [`TokenStats`], background calls
/// (those with a prompt id) apart.
pub struct MeteredProvider {
    inner: Arc<dyn LlmProvider>,
    stats: TokenStats,
}

impl MeteredProvider {
    /// Count calls through `inner` into `stats`.
    pub fn new(inner: Arc<dyn LlmProvider>, stats: TokenStats) -> Self {
        Self { inner, stats }
    }
}

impl LlmProvider for MeteredProvider {
    fn complete<'a>(
        &'a self,
        request: &'a ChatRequest,
        on_event: crate::llm::provider::EventFn<'a>,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<Completion, LlmError>> {
        Box::pin(async move {
            let completion = self.inner.complete(request, on_event, cancel).await?;
            match &completion.usage {
                Some(usage) => {
                    self.stats
                        .record(&completion.model, request.prompt_id.is_some(), usage)
                }
                None => self
                    .stats
                    .record_unreported(&completion.model, request.prompt_id.is_some()),
            }
            Ok(completion)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::FinishReason;

    struct Fixed;
    impl LlmProvider for Fixed {
        fn complete<'a>(
            &'a self,
            request: &'a ChatRequest,
            on_event: crate::llm::provider::EventFn<'a>,
            _cancel: &'a CancellationToken,
        ) -> BoxFuture<'a, Result<Completion, LlmError>> {
            Box::pin(async move {
                on_event(LlmEvent::Text("ok".into()));
                Ok(Completion {
                    model: request.model.clone(),
                    text: "ok".into(),
                    reasoning: String::new(),
                    tool_calls: vec![],
                    finish_reason: FinishReason::Stop,
                    usage: Some(Usage {
                        prompt_tokens: 10,
                        completion_tokens: 2,
                        cached_tokens: 8,
                    }),
                })
            })
        }
    }

    #[tokio::test]
    async fn background_calls_are_tagged_and_counted_apart() {
        let stats = TokenStats::default();
        let metered: Arc<dyn LlmProvider> =
            Arc::new(MeteredProvider::new(Arc::new(Fixed), stats.clone()));
        let bg = BackgroundLlm::new(metered.clone(), "fast");
        let cancel = CancellationToken::new();
        let req = bg.request(prompt_id::PROMPT_SUGGESTION, vec![], vec![]);
        assert!(req.background);
        assert_eq!(req.prompt_id.as_deref(), Some("prompt_suggestion"));
        bg.ask(prompt_id::PROMPT_SUGGESTION, vec![], &cancel)
            .await
            .expect("bg");
        let fg = ChatRequest {
            model: "main".into(),
            ..Default::default()
        };
        metered
            .complete(&fg, &|_e: LlmEvent| {}, &cancel)
            .await
            .expect("fg");
        let snap = stats.snapshot();
        assert_eq!(snap["fast"].background_calls, 1);
        assert_eq!(snap["fast"].background.cached_tokens, 8);
        assert_eq!(snap["fast"].foreground_calls, 0);
        assert_eq!(snap["main"].foreground.prompt_tokens, 10);
    }
}
