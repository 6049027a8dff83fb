//! A live suggester over a replayed session: suggestion requests (`prompt_suggestion`,
//! `pipelined_suggestion`) go to a real OpenAI-compatible server, everything else to the
//! replay. The suggester sees the conversation up to the turn just answered, never the input
//! the user typed next (that is held out in the cassette and only used to score it), so the
//! share of its suggestions the user takes is a measured hit rate. Every call's tokens are
//! counted here by kind, as the server reports them (llama.cpp's server counts with the
//! model's own tokenizer) or, for the replay, as it estimates them (characters / 4).

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use shade_agent::llm::provider::EventFn;
use shade_agent::llm::{BoxFuture, ChatRequest, Completion, LlmError, LlmProvider};
use tokio_util::sync::CancellationToken;

/// Output tokens a live suggester may spend on one suggestion.
const SUGGESTION_TOKENS: u32 = 64;

/// Tokens of one kind of call.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct Tokens {
    /// Calls.
    pub calls: u64,
    /// Input tokens.
    pub prompt: u64,
    /// Output tokens.
    pub completion: u64,
}

impl Tokens {
    fn add(&mut self, c: &Completion) {
        self.calls += 1;
        if let Some(u) = &c.usage {
            self.prompt += u.prompt_tokens;
            self.completion += u.completion_tokens;
        }
    }

    /// Sum of two.
    pub fn plus(self, o: Tokens) -> Tokens {
        Tokens {
            calls: self.calls + o.calls,
            prompt: self.prompt + o.prompt,
            completion: self.completion + o.completion,
        }
    }
}

/// Tokens of a session run by kind: the main conversation, suggestions, speculations, the
/// rest of the background work (summaries).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct TokenUse {
    /// The user's turns (live and continued after a boundary).
    pub main: Tokens,
    /// Suggestions (shown or not).
    pub suggestion: Tokens,
    /// Speculated turns.
    pub speculation: Tokens,
    /// Other background calls.
    pub other: Tokens,
}

/// Routes suggestion requests to `live` (as model `live_model`) when there is one, the rest to
/// `replay`, and counts every call's tokens.
pub struct Routed {
    replay: Arc<dyn LlmProvider>,
    live: Option<(Arc<dyn LlmProvider>, String)>,
    used: Mutex<TokenUse>,
}

impl Routed {
    /// A router; `live` is `(provider, model)` of the suggester.
    pub fn new(replay: Arc<dyn LlmProvider>, live: Option<(Arc<dyn LlmProvider>, String)>) -> Self {
        Routed {
            replay,
            live,
            used: Mutex::new(TokenUse::default()),
        }
    }

    /// The tokens counted so far.
    pub fn used(&self) -> TokenUse {
        self.used.lock().map(|u| *u).unwrap_or_default()
    }
}

fn is_suggestion(r: &ChatRequest) -> bool {
    matches!(
        r.prompt_id.as_deref(),
        Some("prompt_suggestion" | "pipelined_suggestion")
    )
}

impl LlmProvider for Routed {
    fn complete<'a>(
        &'a self,
        request: &'a ChatRequest,
        on_event: EventFn<'a>,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<Completion, LlmError>> {
        Box::pin(async move {
            let completion = match (&self.live, is_suggestion(request)) {
                (Some((live, model)), true) => {
                    let mut r = request.clone();
                    r.model = model.clone();
                    // A suggestion is at most 12 words (longer ones are filtered out): a small
                    // model that rambles on is cut where nothing it says could count.
                    r.max_tokens = Some(
                        r.max_tokens
                            .map_or(SUGGESTION_TOKENS, |m| m.min(SUGGESTION_TOKENS)),
                    );
                    live.complete(&r, on_event, cancel).await?
                }
                _ => self.replay.complete(request, on_event, cancel).await?,
            };
            if let Ok(mut u) = self.used.lock() {
                let slot = match request.prompt_id.as_deref() {
                    None => &mut u.main,
                    Some("speculation") => &mut u.speculation,
                    Some(_) if is_suggestion(request) => &mut u.suggestion,
                    Some(_) => &mut u.other,
                };
                slot.add(&completion);
            }
            Ok(completion)
        })
    }
}
