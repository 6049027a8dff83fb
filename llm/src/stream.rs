//! Assembles Chat Completions stream chunks (and non-streaming bodies) into a `Completion`:
//! text and reasoning deltas, tool calls whose id/name/arguments arrive in pieces, the
//! finish reason and usage.

use std::collections::BTreeMap;

use serde_json::Value;

use super::error::LlmError;
use super::think::{Piece, ThinkSplitter};
use super::types::{Completion, FinishReason, LlmEvent, ToolCall, Usage};

#[derive(Debug, Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// Accumulates one streamed answer.
#[derive(Debug, Default)]
pub struct ChunkAssembler {
    model: String,
    text: String,
    reasoning: String,
    calls: BTreeMap<u64, PartialCall>,
    last_index: Option<u64>,
    finish_reason: Option<FinishReason>,
    usage: Option<Usage>,
    think: ThinkSplitter,
}

impl ChunkAssembler {
    /// Start assembling an answer for `model` (replaced by the model the server names).
    pub fn new(model: &str) -> Self {
        Self {
            model: model.to_string(),
            ..Self::default()
        }
    }

    /// Has the model said why it stopped?
    pub fn finished(&self) -> bool {
        self.finish_reason.is_some()
    }

    /// Has anything visible been produced (then a retry would duplicate output)?
    pub fn produced_output(&self) -> bool {
        !self.text.is_empty() || !self.calls.is_empty()
    }

    /// Take one parsed `data:` payload; returns the events to show.
    pub fn push_chunk(&mut self, chunk: &Value) -> Result<Vec<LlmEvent>, LlmError> {
        if let Some(err) = chunk.get("error") {
            let msg = err
                .get("message")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| err.to_string());
            return Err(LlmError::Provider(msg));
        }
        if !chunk.is_object() {
            return Err(LlmError::Malformed(format!(
                "stream chunk is not a JSON object: {}",
                super::error::truncate_chars(&chunk.to_string(), 200)
            )));
        }
        if let Some(m) = chunk.get("model").and_then(Value::as_str) {
            if !m.is_empty() {
                self.model = m.to_string();
            }
        }
        if let Some(u) = chunk.get("usage").filter(|u| !u.is_null()) {
            self.usage = Some(parse_usage(u));
        }
        let mut events = Vec::new();
        let choices = match chunk.get("choices") {
            None | Some(Value::Null) => return Ok(events),
            Some(Value::Array(a)) => a,
            Some(other) => {
                return Err(LlmError::Malformed(format!(
                    "`choices` is not an array: {other}"
                )))
            }
        };
        for choice in choices {
            // Only the first choice matters (we never ask for n > 1).
            if choice.get("index").and_then(Value::as_u64).unwrap_or(0) != 0 {
                continue;
            }
            let delta = choice.get("delta").or_else(|| choice.get("message"));
            if let Some(delta) = delta {
                self.push_delta(delta, &mut events)?;
            }
            if let Some(fr) = choice.get("finish_reason").and_then(Value::as_str) {
                self.finish_reason = Some(FinishReason::from_wire(fr));
            }
        }
        Ok(events)
    }

    fn push_delta(&mut self, delta: &Value, events: &mut Vec<LlmEvent>) -> Result<(), LlmError> {
        for key in ["reasoning_content", "reasoning"] {
            if let Some(r) = delta.get(key).and_then(Value::as_str) {
                if !r.is_empty() {
                    self.reasoning.push_str(r);
                    events.push(LlmEvent::Reasoning(r.to_string()));
                }
            }
        }
        if let Some(c) = delta.get("content").and_then(Value::as_str) {
            let pieces = self.think.push(c);
            self.apply_pieces(pieces, events);
        }
        match delta.get("tool_calls") {
            None | Some(Value::Null) => {}
            Some(Value::Array(calls)) => {
                for call in calls {
                    self.push_tool_delta(call)?;
                }
            }
            Some(other) => {
                return Err(LlmError::Malformed(format!(
                    "`tool_calls` is not an array: {other}"
                )))
            }
        }
        Ok(())
    }

    fn apply_pieces(&mut self, pieces: Vec<Piece>, events: &mut Vec<LlmEvent>) {
        for p in pieces {
            match p {
                Piece::Text(t) => {
                    self.text.push_str(&t);
                    events.push(LlmEvent::Text(t));
                }
                Piece::Reasoning(r) => {
                    self.reasoning.push_str(&r);
                    events.push(LlmEvent::Reasoning(r));
                }
            }
        }
    }

    fn push_tool_delta(&mut self, call: &Value) -> Result<(), LlmError> {
        let id = call.get("id").and_then(Value::as_str).unwrap_or("");
        // `index` is required by OpenAI but missing from some servers: then a new id starts a
        // new call and a delta without id continues the last one.
        let index = match call.get("index").and_then(Value::as_u64) {
            Some(i) => i,
            None => match self.last_index {
                Some(last)
                    if id.is_empty()
                        || self.calls.get(&last).map(|c| c.id.as_str()) == Some(id) =>
                {
                    last
                }
                _ => self.calls.len() as u64,
            },
        };
        self.last_index = Some(index);
        let entry = self.calls.entry(index).or_default();
        if !id.is_empty() && entry.id.is_empty() {
            entry.id = id.to_string();
        }
        let func = call.get("function").unwrap_or(&Value::Null);
        if let Some(name) = func.get("name").and_then(Value::as_str) {
            // Some servers repeat the full name on every delta; others send it once.
            if entry.name.is_empty() {
                entry.name = name.to_string();
            } else if entry.name != name {
                entry.name.push_str(name);
            }
        }
        match func.get("arguments") {
            Some(Value::String(a)) => entry.arguments.push_str(a),
            // A few servers send already-parsed arguments.
            Some(v @ Value::Object(_)) => entry.arguments.push_str(&v.to_string()),
            _ => {}
        }
        Ok(())
    }

    /// The stream ended (after `[DONE]` or EOF). `saw_done` tells whether the terminator came.
    pub fn finish(mut self, saw_done: bool) -> Result<Completion, LlmError> {
        let pieces = self.think.finish();
        let mut ignored = Vec::new();
        self.apply_pieces(pieces, &mut ignored);
        let finish_reason = match self.finish_reason.take() {
            Some(f) => f,
            None if saw_done => {
                if self.calls.is_empty() {
                    FinishReason::Stop
                } else {
                    FinishReason::ToolCalls
                }
            }
            None => {
                return Err(LlmError::Truncated(format!(
                    "got {} characters of text and {} tool call(s), then the connection closed",
                    self.text.chars().count(),
                    self.calls.len()
                )))
            }
        };
        let mut tool_calls = Vec::with_capacity(self.calls.len());
        for (index, c) in self.calls {
            if c.name.is_empty() {
                return Err(LlmError::Malformed(format!(
                    "tool call #{index} has no function name"
                )));
            }
            let id = if c.id.is_empty() {
                format!("call_{index}")
            } else {
                c.id
            };
            tool_calls.push(ToolCall {
                id,
                name: c.name,
                arguments: c.arguments,
            });
        }
        Ok(Completion {
            model: self.model,
            text: self.text,
            reasoning: self.reasoning,
            tool_calls,
            finish_reason,
            usage: self.usage,
        })
    }
}

/// Parse a complete non-streaming response body.
pub fn parse_full_response(model: &str, body: &Value) -> Result<Completion, LlmError> {
    let mut asm = ChunkAssembler::new(model);
    let choices_ok = body.get("choices").and_then(Value::as_array).is_some();
    if !choices_ok && body.get("error").is_none() {
        return Err(LlmError::Malformed(format!(
            "response has no `choices`: {}",
            super::error::truncate_chars(&body.to_string(), 200)
        )));
    }
    asm.push_chunk(body)?;
    asm.finish(true)
}

fn parse_usage(u: &Value) -> Usage {
    let n = |p: &str| u.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    Usage {
        prompt_tokens: n("/prompt_tokens"),
        completion_tokens: n("/completion_tokens"),
        cached_tokens: n("/prompt_tokens_details/cached_tokens"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn assembles_two_tool_calls_with_split_arguments() {
        let mut a = ChunkAssembler::new("m");
        let chunks = [
            json!({"choices":[{"index":0,"delta":{"role":"assistant","content":"Let me look."}}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"read_file","arguments":"{\"pa"}}]}}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"th\":\"a.txt\"}"}}]}}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"c2","function":{"name":"ls","arguments":""}}]}}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"{}"}}]}}]}),
            json!({"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}),
            json!({"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":8}}}),
        ];
        for c in &chunks {
            a.push_chunk(c).expect("chunk");
        }
        let done = a.finish(true).expect("finish");
        assert_eq!(done.text, "Let me look.");
        assert_eq!(done.finish_reason, FinishReason::ToolCalls);
        assert_eq!(done.tool_calls.len(), 2);
        assert_eq!(done.tool_calls[0].arguments, "{\"path\":\"a.txt\"}");
        assert_eq!(done.tool_calls[1].name, "ls");
        assert_eq!(done.usage.map(|u| u.cached_tokens), Some(8));
    }

    #[test]
    fn malformed_chunks_are_errors_or_ignored_never_panics() {
        let junk = [
            json!(null),
            json!([1, 2]),
            json!("text"),
            json!({"choices": {"0": 1}}),
            json!({"choices": [null, 1, "x"]}),
            json!({"choices": [{"delta": {"content": 5, "tool_calls": "no"}}]}),
            json!({"choices": [{"delta": {"tool_calls": [null, 3, {"index": "a"}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": u64::MAX, "function": {"name": 1, "arguments": [1]}}]}}]}),
            json!({"choices": [{"finish_reason": 7, "delta": {"reasoning_content": {}}}]}),
            json!({"usage": "lots", "model": 3}),
            json!({"error": "plain string"}),
        ];
        for j in &junk {
            let mut a = ChunkAssembler::new("m");
            let _ = a.push_chunk(j);
            let _ = a.finish(true);
        }
        // Random bytes through the SSE parser and the error describer.
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..500 {
            let len = rng.usize(0..200);
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    *rng.choice(b"data: {}[]\"\n\r:<>\xc3\xa9\xff")
                        .unwrap_or(&b'x')
                })
                .collect();
            let mut p = crate::sse::SseParser::new();
            for ev in p.feed(&bytes).into_iter().chain(p.finish()) {
                if let Ok(v) = serde_json::from_str::<Value>(&ev.data) {
                    let mut a = ChunkAssembler::new("m");
                    let _ = a.push_chunk(&v);
                }
            }
            let _ = crate::error::describe_error_body(&String::from_utf8_lossy(&bytes));
        }
    }

    #[test]
    fn eof_without_finish_is_truncation() {
        let mut a = ChunkAssembler::new("m");
        a.push_chunk(&json!({"choices":[{"delta":{"content":"hal"}}]}))
            .expect("chunk");
        assert!(matches!(a.finish(false), Err(LlmError::Truncated(_))));
    }

    #[test]
    fn error_inside_stream() {
        let mut a = ChunkAssembler::new("m");
        let e = a.push_chunk(&json!({"error":{"message":"boom"}}));
        assert_eq!(e, Err(LlmError::Provider("boom".into())));
    }

    #[test]
    fn non_streaming_body() {
        let body = json!({"model":"x","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"t","type":"function","function":{"name":"ls","arguments":"{}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":1,"completion_tokens":2}});
        let c = parse_full_response("m", &body).expect("parse");
        assert_eq!(c.model, "x");
        assert_eq!(c.tool_calls[0].id, "t");
        assert!(parse_full_response("m", &json!({"foo":1})).is_err());
    }
}
