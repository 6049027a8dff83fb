//! The live OpenAI-compatible Chat Completions client (vLLM, llama.cpp server, DashScope,
//! OpenAI): builds prefix-cache-friendly requests, streams SSE, falls back to plain JSON.

use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::config::{LlmConfig, ThinkingParam};
use super::error::{describe_error_body, LlmError};
use super::provider::{BoxFuture, EventFn, LlmProvider};
use super::retry::{parse_retry_after, with_retries, AttemptFailure, ModelPlan, RetryPolicy};
use super::sse::SseParser;
use super::stream::{parse_full_response, ChunkAssembler};
use super::types::{ChatRequest, Completion, LlmEvent, Message};

/// Error bodies are read up to this size (an HTML error page can be large).
const MAX_ERROR_BODY: usize = 64 * 1024;
/// Non-streaming bodies are read up to this size.
const MAX_BODY: usize = 32 * 1024 * 1024;

/// HTTP client for one configured server.
#[derive(Debug, Clone)]
pub struct OpenAiClient {
    http: reqwest::Client,
    config: LlmConfig,
}

impl OpenAiClient {
    /// Build a client; fails only if the TLS stack cannot be initialised.
    pub fn new(config: LlmConfig) -> Result<Self, LlmError> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(30))
            .user_agent(concat!("shade/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| LlmError::Config(format!("cannot build HTTP client: {e}")))?;
        Ok(Self { http, config })
    }

    /// The configuration in use.
    pub fn config(&self) -> &LlmConfig {
        &self.config
    }

    fn endpoint(&self) -> String {
        format!(
            "{}/chat/completions",
            self.config.base_url.trim_end_matches('/')
        )
    }

    /// The JSON body for `request` sent to `model`. Deterministic (same input → same bytes),
    /// so consecutive turns share a cacheable prefix.
    pub fn request_body(&self, request: &ChatRequest, model: &str) -> Value {
        let dashscope = self.config.is_dashscope();
        // A background fork (suggestion, speculation) ends with its own user message: mark the
        // user message the main request marked instead, so the fork's prefix stays the same
        // bytes as the main request's and the cache entry written by it is hit.
        let searched = match (&request.prompt_id, request.messages.last()) {
            (Some(_), Some(Message::User { .. })) => {
                &request.messages[..request.messages.len() - 1]
            }
            _ => &request.messages[..],
        };
        let last_user = searched
            .iter()
            .rposition(|m| matches!(m, Message::User { .. }));
        let messages: Vec<Value> = request
            .messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                // DashScope's explicit context cache: mark the stable system prompt and the
                // most recent user message (as Model Studio recommends for agents), so later
                // turns of the same prompt hit the cache for everything up to it.
                let mark =
                    dashscope && (matches!(m, Message::System { .. }) || Some(i) == last_user);
                wire_message(m, mark)
            })
            .collect();
        let mut body = json!({
            "model": model,
            "messages": messages,
        });
        if !request.tools.is_empty() {
            body["tools"] = request
                .tools
                .iter()
                .map(|t| {
                    json!({"type": "function", "function": {
                        "name": t.name, "description": t.description, "parameters": t.parameters}})
                })
                .collect();
        }
        if self.config.stream {
            body["stream"] = json!(true);
            body["stream_options"] = json!({"include_usage": true});
        }
        if let Some(t) = request.temperature {
            body["temperature"] = json!(t);
        }
        if let Some(m) = request.max_tokens {
            body["max_tokens"] = json!(m);
        }
        if request.background {
            let param = match self.config.thinking_param {
                ThinkingParam::Auto if dashscope => ThinkingParam::EnableThinking,
                other => other,
            };
            match param {
                ThinkingParam::EnableThinking => body["enable_thinking"] = json!(false),
                ThinkingParam::ChatTemplateKwargs => {
                    body["chat_template_kwargs"] = json!({"enable_thinking": false})
                }
                ThinkingParam::Auto | ThinkingParam::None => {}
            }
        }
        body
    }

    fn plan(&self, request: &ChatRequest) -> ModelPlan {
        ModelPlan {
            primary: request.model.clone(),
            large_context: self.config.large_context_model.clone(),
            backup: self.config.backup_model.clone(),
        }
    }

    fn policy(&self) -> RetryPolicy {
        RetryPolicy {
            max_retries: self.config.max_retries,
            base_delay: self.config.base_delay,
            max_delay: self.config.max_delay,
        }
    }

    async fn attempt(
        &self,
        request: &ChatRequest,
        model: String,
        on_event: EventFn<'_>,
        cancel: &CancellationToken,
    ) -> Result<Completion, AttemptFailure> {
        let body = self.request_body(request, &model);
        let bytes = serde_json::to_vec(&body)
            .map_err(|e| LlmError::Malformed(format!("cannot encode request: {e}")))?;
        let mut builder = self
            .http
            .post(self.endpoint())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(bytes);
        if let Some(key) = &self.config.api_key {
            builder = builder.bearer_auth(key);
        }
        let send = tokio::time::timeout(self.config.idle_timeout, builder.send());
        let response = tokio::select! {
            _ = cancel.cancelled() => return Err(LlmError::Cancelled.into()),
            r = send => match r {
                Err(_) => return Err(LlmError::Timeout(self.config.idle_timeout).into()),
                Ok(Err(e)) => return Err(LlmError::Connect(send_failure(&e, &self.config.base_url)).into()),
                Ok(Ok(resp)) => resp,
            },
        };
        let status = response.status();
        if !status.is_success() {
            let retry_after = parse_retry_after(response.headers());
            let body = read_capped(response, MAX_ERROR_BODY, cancel).await?;
            return Err(LlmError::Http {
                status: status.as_u16(),
                message: describe_error_body(&String::from_utf8_lossy(&body)),
                retry_after,
            }
            .into());
        }
        let is_sse = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.contains("text/event-stream"));
        if !is_sse {
            // Non-streaming fallback: streaming disabled, or the server ignored `stream`.
            let body = read_capped(response, MAX_BODY, cancel).await?;
            let value: Value = serde_json::from_slice(&body).map_err(|e| {
                LlmError::Malformed(format!(
                    "response is neither SSE nor JSON ({e}): {}",
                    describe_error_body(&String::from_utf8_lossy(&body))
                ))
            })?;
            let completion = parse_full_response(&model, &value)?;
            if !completion.reasoning.is_empty() {
                on_event(LlmEvent::Reasoning(completion.reasoning.clone()));
            }
            if !completion.text.is_empty() {
                on_event(LlmEvent::Text(completion.text.clone()));
            }
            return Ok(completion);
        }
        self.read_stream(response, &model, on_event, cancel).await
    }

    async fn read_stream(
        &self,
        response: reqwest::Response,
        model: &str,
        on_event: EventFn<'_>,
        cancel: &CancellationToken,
    ) -> Result<Completion, AttemptFailure> {
        let mut asm = ChunkAssembler::new(model);
        let mut parser = SseParser::new();
        let mut stream = response.bytes_stream();
        let mut saw_done = false;
        let fail = |asm: &ChunkAssembler, error: LlmError| AttemptFailure {
            error,
            produced_output: asm.produced_output(),
        };
        'read: loop {
            let next = tokio::select! {
                _ = cancel.cancelled() => return Err(fail(&asm, LlmError::Cancelled)),
                n = tokio::time::timeout(self.config.idle_timeout, stream.next()) => n,
            };
            let eof = matches!(next, Ok(None));
            let events = match next {
                Err(_) => return Err(fail(&asm, LlmError::Timeout(self.config.idle_timeout))),
                Ok(None) => parser.finish().into_iter().collect(),
                Ok(Some(Err(e))) => {
                    return Err(fail(
                        &asm,
                        LlmError::Truncated(format!("read failed: {}", error_chain(&e))),
                    ))
                }
                Ok(Some(Ok(bytes))) => parser.feed(&bytes),
            };
            for ev in events {
                let data = ev.data.trim();
                if ev.event.as_deref() == Some("error") {
                    return Err(fail(&asm, LlmError::Provider(describe_error_body(data))));
                }
                if data == "[DONE]" {
                    saw_done = true;
                    break 'read;
                }
                if data.is_empty() {
                    continue;
                }
                let chunk: Value = serde_json::from_str(data).map_err(|e| {
                    fail(
                        &asm,
                        LlmError::Malformed(format!(
                            "stream chunk is not JSON ({e}): {}",
                            super::error::truncate_chars(data, 200)
                        )),
                    )
                })?;
                let out = asm.push_chunk(&chunk).map_err(|e| fail(&asm, e))?;
                for e in out {
                    on_event(e);
                }
            }
            if eof {
                break;
            }
        }
        let produced = asm.produced_output();
        asm.finish(saw_done).map_err(|error| AttemptFailure {
            error,
            produced_output: produced,
        })
    }
}

impl LlmProvider for OpenAiClient {
    fn complete<'a>(
        &'a self,
        request: &'a ChatRequest,
        on_event: EventFn<'a>,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<Completion, LlmError>> {
        Box::pin(async move {
            let plan = self.plan(request);
            with_retries(self.policy(), &plan, on_event, cancel, |model| {
                self.attempt(request, model, on_event, cancel)
            })
            .await
        })
    }
}

fn wire_message(m: &Message, cache_mark: bool) -> Value {
    let content = |text: &str| -> Value {
        if cache_mark {
            json!([{"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}])
        } else {
            json!(text)
        }
    };
    match m {
        Message::System { content: c } => json!({"role": "system", "content": content(c)}),
        Message::User { content: c } => json!({"role": "user", "content": content(c)}),
        Message::Assistant {
            content: c,
            tool_calls,
        } => {
            let mut v = json!({"role": "assistant"});
            v["content"] = if c.is_empty() && !tool_calls.is_empty() {
                Value::Null
            } else {
                json!(c)
            };
            if !tool_calls.is_empty() {
                v["tool_calls"] = tool_calls
                    .iter()
                    .map(|t| {
                        json!({"id": t.id, "type": "function",
                               "function": {"name": t.name, "arguments": t.arguments}})
                    })
                    .collect();
            }
            v
        }
        Message::Tool {
            tool_call_id,
            content: c,
        } => json!({"role": "tool", "tool_call_id": tool_call_id, "content": content(c)}),
    }
}

async fn read_capped(
    response: reqwest::Response,
    cap: usize,
    cancel: &CancellationToken,
) -> Result<Vec<u8>, AttemptFailure> {
    let mut stream = response.bytes_stream();
    let mut out = Vec::new();
    loop {
        let next = tokio::select! {
            _ = cancel.cancelled() => return Err(LlmError::Cancelled.into()),
            n = stream.next() => n,
        };
        match next {
            None => break,
            Some(Err(e)) => {
                if out.is_empty() {
                    return Err(LlmError::Connect(error_chain(&e)).into());
                }
                break;
            }
            Some(Ok(b)) => {
                out.extend_from_slice(&b);
                if out.len() >= cap {
                    out.truncate(cap);
                    break;
                }
            }
        }
    }
    Ok(out)
}

/// Why a request could not be sent, as one short line a user can act on: the server's
/// address and the innermost cause ("Connection refused (os error 111)"), not reqwest's
/// whole chain.
fn send_failure(e: &reqwest::Error, base_url: &str) -> String {
    let mut cause = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        cause = inner.to_string();
        src = inner.source();
    }
    format!("{base_url}: {cause}")
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}
