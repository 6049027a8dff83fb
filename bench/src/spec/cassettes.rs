//! A session as `shade chat --record` leaves it: `chat.jsonl` (the conversation's model calls)
//! and `chat.background.jsonl` (suggestions under `prompt_suggestion`/`pipelined_suggestion`,
//! speculated turns under `speculation`). From them: the user's inputs in order, the
//! suggestion shown after each, and the model's answers keyed by (input, the outcomes of the
//! tool results since it) — the outcomes (exit codes, errors: `check::tool_outcome`) must be
//! the recorded ones; the rest of a tool's output (timings, paths) differs run to run and is
//! not compared. A request whose step the recording has, but with other outcomes, is a
//! *drift*: the replay refuses it (an HTTP error) and counts it, and the benchmark fails.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::Serialize;
use serde_json::{json, Value};
use shade_agent::llm::cassette::{background_path, load, CassetteEntry, Chunk, RecordedResponse};
use shade_agent::llm::Message;
use shade_testkit::{is_suggestion_prompt, is_suggestion_request, last_real_user, Reply, Router};

use super::check::outcomes_since_user;
use super::engine::normalise;
use super::script::suggestion_follows;

/// The key of a recorded answer: the user's input, the outcomes of the tool results since it.
pub type AnswerKey = (String, Vec<String>);

/// A model latency profile.
#[derive(Debug, Clone, Copy, Serialize, serde::Deserialize)]
pub struct Latency {
    /// Time to first token of every call.
    pub ttft_ms: u64,
    /// Generation speed (text and tool-call arguments).
    pub tokens_per_s: f64,
    /// Time to first token grows with the prompt: this much per 1,000 prompt tokens (prefill).
    #[serde(default)]
    pub prefill_ms_per_ktok: f64,
}

impl Latency {
    /// A named preset: `local` (a fast local server on a GPU) or `hosted` (a typical hosted
    /// API).
    pub fn preset(name: &str) -> Result<Latency> {
        Ok(match name {
            // A local GPU server prefills ~5,000 tokens/s with no prefix cache assumed.
            "local" => Latency {
                ttft_ms: 150,
                tokens_per_s: 120.0,
                prefill_ms_per_ktok: 200.0,
            },
            // Hosted APIs prefill faster but start later.
            "hosted" => Latency {
                ttft_ms: 900,
                tokens_per_s: 60.0,
                prefill_ms_per_ktok: 50.0,
            },
            other => bail!("unknown latency profile `{other}` (local, hosted)"),
        })
    }
}

/// What the replay derived from one session's cassettes.
#[derive(Debug, Clone, Default)]
pub struct Recorded {
    /// The user's inputs, in order.
    pub inputs: Vec<String>,
    /// The suggestion the model made after an input (the first recorded one).
    pub suggestions: HashMap<String, String>,
    /// The model's answer to (input, outcomes of the tool results since it).
    pub answers: HashMap<AnswerKey, RecordedResponse>,
    /// Summaries of tool outputs over the budget, by the output asked about.
    pub summaries: HashMap<String, String>,
    /// Hand-written equivalents (normalised) → the recorded input they stand for: a live
    /// suggestion the user takes because it is an equivalent is answered as that input.
    pub aliases: HashMap<String, String>,
}

impl Recorded {
    /// Answer each of `equivalents` (recorded input → other phrasings) as its input.
    pub fn with_equivalents(
        mut self,
        equivalents: &std::collections::BTreeMap<String, Vec<String>>,
    ) -> Self {
        // A phrasing that is itself a recorded input (another turn's "commit it") stays that
        // input: the replay cannot tell which turn it would stand for.
        let recorded: std::collections::HashSet<String> =
            self.inputs.iter().map(|i| normalise(i)).collect();
        for (input, others) in equivalents {
            for o in others {
                let o = normalise(o);
                if !recorded.contains(&o) {
                    self.aliases.insert(o, input.clone());
                }
            }
        }
        self
    }

    /// The recorded input `input` stands for.
    fn input_of(&self, input: String) -> String {
        self.aliases
            .get(&normalise(&input))
            .cloned()
            .unwrap_or(input)
    }
}

/// How the agent's request for a summary of a long tool output begins (its system prompt).
const SUMMARY_PROMPT: &str = "You summarise the output of a tool call";

/// What a summary request asks about: its first non-system message.
fn asked(messages: &Value) -> String {
    messages
        .as_array()
        .and_then(|m| m.iter().find(|m| m["role"] != "system"))
        .map(|m| m["content"].as_str().unwrap_or_default().to_string())
        .unwrap_or_default()
}

/// The messages of an entry as a request body, for the same helpers the replay router uses.
fn body(messages: &[Message]) -> Value {
    json!({ "messages": messages })
}

/// Read `dir/chat.jsonl` and the background cassette beside it (`dir` may also name the
/// main cassette file itself).
pub fn read(dir: &Path) -> Result<Recorded> {
    let main_path: PathBuf = if dir.is_dir() {
        dir.join("chat.jsonl")
    } else {
        dir.to_path_buf()
    };
    let main = load(&main_path).with_context(|| format!("reading {}", main_path.display()))?;
    let side = background_path(&main_path);
    let background = if side.exists() {
        load(&side).with_context(|| format!("reading {}", side.display()))?
    } else {
        Vec::new()
    };
    if main.is_empty() {
        bail!("{} holds no model call", main_path.display());
    }
    let mut rec = Recorded {
        inputs: inputs(&main, &background),
        ..Recorded::default()
    };
    let key = |e: &CassetteEntry| {
        let b = body(&e.request.messages);
        (last_real_user(&b), outcomes_since_user(&b))
    };
    for e in &main {
        rec.answers
            .entry(key(e))
            .or_insert_with(|| e.response.clone());
    }
    for e in &background {
        match e.request.prompt_id.as_deref() {
            Some("prompt_suggestion") | Some("pipelined_suggestion") => {
                let text = text_of(&e.response);
                rec.suggestions
                    .entry(suggestion_follows(&body(&e.request.messages)))
                    .or_insert(text);
            }
            Some("speculation") => {
                rec.answers
                    .entry(key(e))
                    .or_insert_with(|| e.response.clone());
            }
            Some("output_summary") => {
                let b = body(&e.request.messages);
                rec.summaries
                    .entry(asked(&b["messages"]))
                    .or_insert_with(|| text_of(&e.response));
            }
            _ => {}
        }
    }
    Ok(rec)
}

/// The real inputs of a request's conversation (suggestion prompts left out).
fn real_inputs(messages: &[Message]) -> Vec<String> {
    messages
        .iter()
        .filter_map(|m| match m {
            Message::User { content } if !is_suggestion_prompt(content) => Some(content.clone()),
            _ => None,
        })
        .collect()
}

/// `known` extended by `window` (a run of consecutive inputs, maybe cut at its start: a
/// cached prefix keeps the last 40 messages) where `window` starts inside `known`'s tail.
fn merge(known: &mut Vec<String>, window: &[String]) {
    if known.is_empty() {
        known.extend_from_slice(window);
        return;
    }
    for offset in 0..known.len() {
        let tail = &known[offset..];
        if tail.len() <= window.len() && window[..tail.len()] == *tail {
            if window.len() > tail.len() {
                known.extend_from_slice(&window[tail.len()..]);
            }
            return;
        }
    }
}

/// The user's inputs in order. Each request shows the inputs before it: a main call all of
/// them; a suggestion or speculation the ones in its cached prefix (a speculation's own last
/// input is only a suggestion, and a turn taken whole from a speculation shows only in the
/// requests after it — the recorder makes one, by asking for a suggestion after the last
/// turn; a user's own recording shows it only if a request completed after that turn).
fn inputs(main: &[CassetteEntry], background: &[CassetteEntry]) -> Vec<String> {
    let mut known = Vec::new();
    for e in main {
        merge(&mut known, &real_inputs(&e.request.messages));
    }
    for e in background {
        let mut seen = real_inputs(&e.request.messages);
        match e.request.prompt_id.as_deref() {
            Some("prompt_suggestion") | Some("pipelined_suggestion") => {}
            Some("speculation") => {
                seen.pop();
            }
            _ => continue,
        }
        merge(&mut known, &seen);
    }
    known
}

fn text_of(r: &RecordedResponse) -> String {
    r.chunks
        .iter()
        .filter_map(|c| match c {
            Chunk::Text(t) => Some(t.as_str()),
            Chunk::Reasoning(_) => None,
        })
        .collect()
}

fn approx_tokens(s: &str) -> u64 {
    (s.len() as u64).div_ceil(4).max(1)
}

/// Counts of a replay: requests answered, and those the recording had no answer for (the
/// run diverged from it).
#[derive(Debug, Default)]
pub struct ReplayStats {
    /// Requests served from the recording.
    pub answered: AtomicU64,
    /// Main-model requests with no recorded answer (the run left the recording).
    pub missed: AtomicU64,
    /// Background (speculative) requests with no recorded answer: a suggestion the user did
    /// not take and whose speculation was not recorded.
    pub unrecorded_speculation: AtomicU64,
    /// Requests refused because a tool result's outcome differs from the recording's at the
    /// same step (the run is no longer the recorded one).
    pub drift: AtomicU64,
    /// What drifted, one line each.
    pub drifts: std::sync::Mutex<Vec<String>>,
}

impl ReplayStats {
    /// The drifts seen, for the error message.
    pub fn drift_lines(&self) -> Vec<String> {
        self.drifts.lock().map(|d| d.clone()).unwrap_or_default()
    }
}

/// The recorded outcomes at the same step (input, number of tool results) as `key`, when
/// they differ from `key`'s: the run drifted from the recording.
fn drifted(rec: &Recorded, key: &AnswerKey) -> Option<Vec<String>> {
    rec.answers
        .keys()
        .find(|(input, outcomes)| *input == key.0 && outcomes.len() == key.1.len())
        .map(|(_, outcomes)| outcomes.clone())
}

/// The model of a replay: answers from the recording with the latency profile.
pub fn router(rec: Arc<Recorded>, latency: Latency, stats: Arc<ReplayStats>) -> Router {
    Arc::new(move |body: &Value| {
        let prompt_tokens = approx_tokens(&body["messages"].to_string());
        let per_token = Duration::from_secs_f64(1.0 / latency.tokens_per_s.max(0.001));
        let ttft = Duration::from_millis(latency.ttft_ms)
            + Duration::from_secs_f64(latency.prefill_ms_per_ktok * prompt_tokens as f64 / 1e6);
        let system = body["messages"][0]["content"].as_str().unwrap_or_default();
        let key = (
            rec.input_of(last_real_user(body)),
            outcomes_since_user(body),
        );
        if !rec.answers.contains_key(&key)
            && !is_suggestion_request(body)
            && !system.starts_with(SUMMARY_PROMPT)
        {
            if let Some(recorded) = drifted(&rec, &key) {
                let line = format!(
                    "{} request after input {:?}: tool results [{}], recorded [{}]",
                    body["model"].as_str().unwrap_or("?"),
                    key.0,
                    key.1.join(", "),
                    recorded.join(", ")
                );
                stats.drift.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut d) = stats.drifts.lock() {
                    d.push(line.clone());
                }
                return Reply {
                    error: Some((422, format!("replay drift: {line}"))),
                    ..Reply::default()
                };
            }
        }
        let (reply, found) = if system.starts_with(SUMMARY_PROMPT) {
            // A long tool output's summary: the recorded one, else a neutral line (the
            // output itself differs run to run; its head and tail still reach the model).
            let text = rec
                .summaries
                .get(&asked(&body["messages"]))
                .cloned()
                .unwrap_or_else(|| "Long output; its first and last lines are below.".into());
            (Reply::text(&text), true)
        } else if is_suggestion_request(body) {
            let after = suggestion_follows(body);
            match rec.suggestions.get(&after) {
                Some(s) => (Reply::text(s), true),
                None => (Reply::text(""), true),
            }
        } else {
            match rec.answers.get(&key) {
                Some(r) => {
                    let mut reply = Reply {
                        chunks: r
                            .chunks
                            .iter()
                            .filter_map(|c| match c {
                                Chunk::Text(t) => Some(t.clone()),
                                Chunk::Reasoning(_) => None,
                            })
                            .collect(),
                        ..Reply::default()
                    };
                    for c in &r.tool_calls {
                        let args = serde_json::from_str(&c.arguments)
                            .unwrap_or_else(|_| Value::String(c.arguments.clone()));
                        reply.tool_calls.push((c.name.clone(), args));
                    }
                    (reply, true)
                }
                None => (Reply::text("(not in the recording)"), false),
            }
        };
        let counter = if found {
            &stats.answered
        } else if body["model"] == "main" {
            &stats.missed
        } else {
            &stats.unrecorded_speculation
        };
        counter.fetch_add(1, Ordering::Relaxed);
        // Tool-call arguments are generated before they arrive; text streams at the rate.
        let call_tokens: u64 = reply
            .tool_calls
            .iter()
            .map(|(n, a)| approx_tokens(n) + approx_tokens(&a.to_string()))
            .sum();
        let text_tokens: u64 = reply.chunks.iter().map(|c| approx_tokens(c)).sum();
        let chunk_delay = if reply.chunks.is_empty() {
            Duration::ZERO
        } else {
            per_token * (text_tokens as u32) / (reply.chunks.len() as u32)
        };
        Reply {
            prompt_tokens,
            delay: ttft + per_token * (call_tokens as u32),
            chunk_delay,
            ..reply
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn step(result: &str) -> Value {
        json!({"model": "main", "messages": [
            {"role": "system", "content": "You are shade"},
            {"role": "user", "content": "run the tests"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": result},
        ]})
    }

    #[test]
    fn equivalents_answer_as_their_input_unless_they_are_a_recorded_input() {
        let rec = Recorded {
            inputs: vec!["commit it".into(), "commit the snake test".into()],
            ..Recorded::default()
        }
        .with_equivalents(
            &[(
                "commit the snake test".to_string(),
                vec!["Commit it.".to_string(), "commit the new test".to_string()],
            )]
            .into_iter()
            .collect(),
        );
        assert_eq!(
            rec.input_of("Commit the new test".into()),
            "commit the snake test"
        );
        assert_eq!(rec.input_of("commit it".into()), "commit it");
        assert_eq!(rec.input_of("something else".into()), "something else");
    }

    #[test]
    fn a_tool_result_other_than_the_recorded_one_is_refused_and_counted() {
        let mut rec = Recorded::default();
        rec.answers.insert(
            ("run the tests".into(), vec!["exit 0".into()]),
            serde_json::from_value(json!({
                "chunks": [{"text": "All tests pass."}],
                "finish_reason": "stop"
            }))
            .unwrap(),
        );
        let stats = Arc::new(ReplayStats::default());
        let route = router(
            Arc::new(rec),
            Latency {
                ttft_ms: 0,
                tokens_per_s: 1e6,
                prefill_ms_per_ktok: 0.0,
            },
            stats.clone(),
        );
        // Another run's output text, the same exit code: answered.
        let ok = route(&step("Exit code: 0\nStdout:\n3 passed in 0.12s"));
        assert!(ok.error.is_none());
        assert_eq!(ok.chunks.concat(), "All tests pass.");
        // The tests failed where the recording's passed: refused, loudly.
        let bad = route(&step("Exit code: 1\nStdout:\nEROFS"));
        let (status, message) = bad.error.expect("a drift must be refused");
        assert_eq!(status, 422);
        assert!(
            message.contains("exit 1") && message.contains("exit 0"),
            "{message}"
        );
        assert_eq!(stats.drift.load(Ordering::Relaxed), 1);
        assert_eq!(stats.drift_lines().len(), 1);
        assert_eq!(stats.answered.load(Ordering::Relaxed), 1);
    }

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn windows_extend_the_known_inputs_only_where_they_overlap() {
        let mut known = Vec::new();
        merge(&mut known, &v(&["a", "b"]));
        assert_eq!(known, v(&["a", "b"]));
        // A prefix of what is known, and a window inside it, add nothing.
        merge(&mut known, &v(&["a"]));
        merge(&mut known, &v(&["b"]));
        assert_eq!(known, v(&["a", "b"]));
        // A window cut at its start (a cached prefix) that goes further extends it.
        merge(&mut known, &v(&["b", "c", "d"]));
        assert_eq!(known, v(&["a", "b", "c", "d"]));
        // One that does not overlap the tail is not guessed at.
        merge(&mut known, &v(&["x", "y"]));
        assert_eq!(known, v(&["a", "b", "c", "d"]));
    }
}
