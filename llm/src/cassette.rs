//! Record/replay of model calls, so agent runs and speculation benchmarks are reproducible
//! offline. A cassette is JSONL: one `{"request": …, "response": …}` object per model call,
//! the response kept as the streamed chunks plus the assembled tool calls.
//!
//! Replay serves entries strictly in order and fails loudly when the conversation sent does
//! not match the recorded one (system prompts are not compared: they may mention the machine).
//!
//! Background calls (requests with a prompt id: suggestions, speculation, repairs) never go
//! into the main cassette: they are recorded beside it, in `NAME.background.jsonl`, and served
//! on replay by prompt id and content rather than by position, because when they happen
//! depends on timing (a suggestion may be cancelled by the user typing).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::error::{truncate_chars, LlmError};
use super::provider::{BoxFuture, EventFn, LlmProvider};
use super::types::{ChatRequest, Completion, FinishReason, LlmEvent, Message, ToolCall, Usage};

/// One recorded model call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CassetteEntry {
    /// What was asked.
    pub request: RecordedRequest,
    /// What came back.
    pub response: RecordedResponse,
}

/// The request side of an entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedRequest {
    /// Model asked for (informational; not matched).
    #[serde(default)]
    pub model: String,
    /// The conversation (system messages are not matched on replay).
    pub messages: Vec<Message>,
    /// Names of the tools offered (informational).
    #[serde(default)]
    pub tools: Vec<String>,
    /// The internal prompt id of a background call (only in background cassettes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_id: Option<String>,
}

/// One streamed piece.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Chunk {
    /// Visible text delta.
    Text(String),
    /// Reasoning delta.
    Reasoning(String),
}

/// The response side of an entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedResponse {
    /// Streamed deltas in order.
    #[serde(default)]
    pub chunks: Vec<Chunk>,
    /// Assembled tool calls.
    #[serde(default)]
    pub tool_calls: Vec<ToolCall>,
    /// Why the model stopped.
    pub finish_reason: FinishReason,
    /// Usage, if reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Model that answered, if different from the request's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

impl RecordedResponse {
    fn to_completion(&self, requested_model: &str) -> Completion {
        let mut text = String::new();
        let mut reasoning = String::new();
        for c in &self.chunks {
            match c {
                Chunk::Text(t) => text.push_str(t),
                Chunk::Reasoning(r) => reasoning.push_str(r),
            }
        }
        Completion {
            model: self
                .model
                .clone()
                .unwrap_or_else(|| requested_model.to_string()),
            text,
            reasoning,
            tool_calls: self.tool_calls.clone(),
            finish_reason: self.finish_reason.clone(),
            usage: self.usage.clone(),
        }
    }
}

/// Read a cassette file.
pub fn load(path: &Path) -> Result<Vec<CassetteEntry>, LlmError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| LlmError::Cassette(format!("cannot read {}: {e}", path.display())))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l)
                .map_err(|e| LlmError::Cassette(format!("{} line {}: {e}", path.display(), i + 1)))
        })
        .collect()
}

/// Where background calls recorded beside the cassette `path` go: `run.jsonl` →
/// `run.background.jsonl`.
pub fn background_path(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let stem = name
        .as_deref()
        .map(|n| n.strip_suffix(".jsonl").unwrap_or(n))
        .unwrap_or("cassette");
    path.with_file_name(format!("{stem}.background.jsonl"))
}

/// Serves recorded responses in order.
#[derive(Debug)]
pub struct ReplayProvider {
    source: String,
    entries: Vec<CassetteEntry>,
    next: Mutex<usize>,
    /// Background entries and whether each has been served.
    background: Mutex<Vec<(CassetteEntry, bool)>>,
}

impl ReplayProvider {
    /// Replay the cassette at `path` (and its background cassette beside it, if any).
    pub fn open(path: &Path) -> Result<Self, LlmError> {
        let mut replay = Self::from_entries(path.display().to_string(), load(path)?);
        let side = background_path(path);
        if side.exists() {
            replay = replay.with_background(load(&side)?);
        }
        Ok(replay)
    }

    /// Replay entries already in memory (`source` names them in errors).
    pub fn from_entries(source: String, entries: Vec<CassetteEntry>) -> Self {
        Self {
            source,
            entries,
            next: Mutex::new(0),
            background: Mutex::new(Vec::new()),
        }
    }

    /// Also serve these background entries (matched by prompt id and conversation).
    pub fn with_background(self, entries: Vec<CassetteEntry>) -> Self {
        Self {
            background: Mutex::new(entries.into_iter().map(|e| (e, false)).collect()),
            ..self
        }
    }

    /// The first unserved background entry recorded for this prompt id and conversation.
    fn take_background(&self, request: &ChatRequest, id: &str) -> Result<CassetteEntry, LlmError> {
        let mut entries = self
            .background
            .lock()
            .map_err(|_| LlmError::Cassette("replay state poisoned".into()))?;
        let found = entries.iter_mut().find(|(e, served)| {
            !*served
                && e.request.prompt_id.as_deref() == Some(id)
                && mismatch(&e.request.messages, &request.messages).is_none()
        });
        match found {
            Some((entry, served)) => {
                *served = true;
                Ok(entry.clone())
            }
            None => {
                // Say how the nearest unserved recording of this kind differs.
                let nearest = entries
                    .iter()
                    .filter(|(e, served)| !*served && e.request.prompt_id.as_deref() == Some(id))
                    .filter_map(|(e, _)| mismatch(&e.request.messages, &request.messages))
                    .next()
                    .unwrap_or_else(|| "none left unserved".into());
                Err(LlmError::Cassette(format!(
                    "{}: no recorded `{id}` background call matches this conversation; the \
                     nearest: {nearest}",
                    self.source
                )))
            }
        }
    }

    /// How many entries have been served.
    pub fn served(&self) -> usize {
        self.next.lock().map(|n| *n).unwrap_or(0)
    }

    /// How many entries the cassette holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Does the cassette hold no entry?
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn take(&self, request: &ChatRequest) -> Result<&CassetteEntry, LlmError> {
        let mut next = self
            .next
            .lock()
            .map_err(|_| LlmError::Cassette("replay state poisoned".into()))?;
        let index = *next;
        let entry = self.entries.get(index).ok_or_else(|| {
            LlmError::Cassette(format!(
                "{}: request #{} has no recording (the cassette holds {})",
                self.source,
                index + 1,
                self.entries.len()
            ))
        })?;
        if let Some(diff) = mismatch(&entry.request.messages, &request.messages) {
            return Err(LlmError::Cassette(format!(
                "{}: request #{} does not match the recording: {diff}",
                self.source,
                index + 1
            )));
        }
        *next += 1;
        Ok(entry)
    }
}

fn comparable(messages: &[Message]) -> Vec<&Message> {
    messages
        .iter()
        .filter(|m| !matches!(m, Message::System { .. }))
        .collect()
}

/// Describe the first difference between recorded and actual conversations, if any.
pub fn mismatch(recorded: &[Message], actual: &[Message]) -> Option<String> {
    let (r, a) = (comparable(recorded), comparable(actual));
    let show = |m: Option<&&Message>| match m {
        Some(m) => truncate_chars(&serde_json::to_string(m).unwrap_or_default(), 400),
        None => "(nothing)".to_string(),
    };
    for i in 0..r.len().max(a.len()) {
        if r.get(i) != a.get(i) {
            return Some(format!(
                "message {} (not counting system) differs:\n  recorded: {}\n  actual:   {}",
                i + 1,
                show(r.get(i)),
                show(a.get(i))
            ));
        }
    }
    None
}

impl LlmProvider for ReplayProvider {
    fn complete<'a>(
        &'a self,
        request: &'a ChatRequest,
        on_event: EventFn<'a>,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<Completion, LlmError>> {
        Box::pin(async move {
            let entry = match &request.prompt_id {
                Some(id) => self.take_background(request, id)?,
                None => self.take(request)?.clone(),
            };
            for chunk in &entry.response.chunks {
                if cancel.is_cancelled() {
                    return Err(LlmError::Cancelled);
                }
                on_event(match chunk {
                    Chunk::Text(t) => LlmEvent::Text(t.clone()),
                    Chunk::Reasoning(r) => LlmEvent::Reasoning(r.clone()),
                });
                tokio::task::yield_now().await;
            }
            if cancel.is_cancelled() {
                return Err(LlmError::Cancelled);
            }
            Ok(entry.response.to_completion(&request.model))
        })
    }
}

/// Wraps a provider and appends every successful call to a cassette file (background calls
/// to the background cassette beside it, created on first use).
pub struct RecordingProvider<P> {
    inner: P,
    path: PathBuf,
    file: Mutex<std::fs::File>,
    background: Mutex<Option<std::fs::File>>,
}

impl<P: LlmProvider> RecordingProvider<P> {
    /// Record calls through `inner` into `path` (truncated first; a stale background cassette
    /// beside it is removed).
    pub fn create(inner: P, path: &Path) -> Result<Self, LlmError> {
        let file = std::fs::File::create(path)
            .map_err(|e| LlmError::Cassette(format!("cannot create {}: {e}", path.display())))?;
        let side = background_path(path);
        match std::fs::remove_file(&side) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(LlmError::Cassette(format!(
                    "cannot remove {}: {e}",
                    side.display()
                )))
            }
            _ => {}
        }
        Ok(Self {
            inner,
            path: path.to_path_buf(),
            file: Mutex::new(file),
            background: Mutex::new(None),
        })
    }

    fn append(&self, entry: &CassetteEntry) -> Result<(), LlmError> {
        let mut line = serde_json::to_string(entry)
            .map_err(|e| LlmError::Cassette(format!("cannot encode entry: {e}")))?;
        line.push('\n');
        let poisoned = || LlmError::Cassette("recorder poisoned".into());
        if entry.request.prompt_id.is_some() {
            let side = background_path(&self.path);
            let mut slot = self.background.lock().map_err(|_| poisoned())?;
            if slot.is_none() {
                *slot = Some(std::fs::File::create(&side).map_err(|e| {
                    LlmError::Cassette(format!("cannot create {}: {e}", side.display()))
                })?);
            }
            if let Some(f) = slot.as_mut() {
                f.write_all(line.as_bytes())
                    .and_then(|_| f.flush())
                    .map_err(|e| {
                        LlmError::Cassette(format!("cannot write {}: {e}", side.display()))
                    })?;
            }
            return Ok(());
        }
        let mut f = self.file.lock().map_err(|_| poisoned())?;
        f.write_all(line.as_bytes())
            .and_then(|_| f.flush())
            .map_err(|e| LlmError::Cassette(format!("cannot write {}: {e}", self.path.display())))
    }
}

impl<P: LlmProvider> LlmProvider for RecordingProvider<P> {
    fn complete<'a>(
        &'a self,
        request: &'a ChatRequest,
        on_event: EventFn<'a>,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<Completion, LlmError>> {
        Box::pin(async move {
            let chunks = Mutex::new(Vec::new());
            let tee = |e: LlmEvent| {
                let chunk = match &e {
                    LlmEvent::Text(t) => Some(Chunk::Text(t.clone())),
                    LlmEvent::Reasoning(r) => Some(Chunk::Reasoning(r.clone())),
                    // A retried attempt's partial output is never kept: retries only happen
                    // before any output.
                    _ => None,
                };
                if let (Some(c), Ok(mut v)) = (chunk, chunks.lock()) {
                    v.push(c);
                }
                on_event(e);
            };
            let completion = self.inner.complete(request, &tee, cancel).await?;
            let chunks = chunks.into_inner().unwrap_or_default();
            self.append(&CassetteEntry {
                request: RecordedRequest {
                    model: request.model.clone(),
                    messages: request.messages.clone(),
                    tools: request.tools.iter().map(|t| t.name.clone()).collect(),
                    prompt_id: request.prompt_id.clone(),
                },
                response: RecordedResponse {
                    chunks,
                    tool_calls: completion.tool_calls.clone(),
                    finish_reason: completion.finish_reason.clone(),
                    usage: completion.usage.clone(),
                    model: (completion.model != request.model).then(|| completion.model.clone()),
                },
            })?;
            Ok(completion)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(messages: Vec<Message>) -> ChatRequest {
        ChatRequest {
            model: "m".into(),
            messages,
            tools: vec![],
            temperature: None,
            max_tokens: None,
            background: false,
            prompt_id: None,
        }
    }

    fn entry(user: &str, answer: &str) -> CassetteEntry {
        CassetteEntry {
            request: RecordedRequest {
                model: "m".into(),
                messages: vec![Message::User {
                    content: user.into(),
                }],
                tools: vec![],
                prompt_id: None,
            },
            response: RecordedResponse {
                chunks: vec![Chunk::Text(answer.into())],
                tool_calls: vec![],
                finish_reason: FinishReason::Stop,
                usage: None,
                model: None,
            },
        }
    }

    #[tokio::test]
    async fn serves_in_order_and_fails_on_mismatch_and_exhaustion() {
        let p = ReplayProvider::from_entries("t".into(), vec![entry("hi", "hello")]);
        let cancel = CancellationToken::new();
        let sink = |_e: LlmEvent| {};
        let wrong = req(vec![Message::User {
            content: "bye".into(),
        }]);
        let err = p.complete(&wrong, &sink, &cancel).await;
        assert!(matches!(err, Err(LlmError::Cassette(ref m)) if m.contains("does not match")));
        let right = req(vec![
            Message::System {
                content: "anything".into(),
            },
            Message::User {
                content: "hi".into(),
            },
        ]);
        let c = p.complete(&right, &sink, &cancel).await.expect("replay");
        assert_eq!(c.text, "hello");
        let err = p.complete(&right, &sink, &cancel).await;
        assert!(matches!(err, Err(LlmError::Cassette(ref m)) if m.contains("no recording")));
    }

    #[test]
    fn entry_round_trips_as_one_json_line() {
        let e = entry("a", "b");
        let line = serde_json::to_string(&e).expect("encode");
        assert!(!line.contains('\n'));
        assert_eq!(
            serde_json::from_str::<CassetteEntry>(&line).expect("decode"),
            e
        );
    }

    #[tokio::test]
    async fn background_calls_are_recorded_beside_and_replayed_by_content() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("run.jsonl");
        let source = ReplayProvider::from_entries("src".into(), vec![entry("hi", "hello")])
            .with_background(vec![
                CassetteEntry {
                    request: RecordedRequest {
                        prompt_id: Some("prompt_suggestion".into()),
                        ..entry("b", "").request
                    },
                    ..entry("b", "run the tests")
                },
                CassetteEntry {
                    request: RecordedRequest {
                        prompt_id: Some("prompt_suggestion".into()),
                        ..entry("a", "").request
                    },
                    ..entry("a", "commit this")
                },
            ]);
        let rec = RecordingProvider::create(source, &path).expect("recorder");
        let cancel = CancellationToken::new();
        let sink = |_e: LlmEvent| {};
        let bg = |user: &str| ChatRequest {
            prompt_id: Some("prompt_suggestion".into()),
            background: true,
            ..req(vec![Message::User {
                content: user.into(),
            }])
        };
        // Served by content, not position.
        let a = rec.complete(&bg("a"), &sink, &cancel).await.expect("a");
        assert_eq!(a.text, "commit this");
        let main = req(vec![Message::User {
            content: "hi".into(),
        }]);
        assert_eq!(
            rec.complete(&main, &sink, &cancel)
                .await
                .expect("main")
                .text,
            "hello"
        );
        assert!(rec.complete(&bg("a"), &sink, &cancel).await.is_err());
        // The main cassette holds only the conversation; the background one the rest.
        assert_eq!(load(&path).expect("main").len(), 1);
        let side = load(&background_path(&path)).expect("side");
        assert_eq!(side.len(), 1);
        assert_eq!(
            side[0].request.prompt_id.as_deref(),
            Some("prompt_suggestion")
        );
        let replay = ReplayProvider::open(&path).expect("open");
        assert_eq!(
            replay
                .complete(&bg("a"), &sink, &cancel)
                .await
                .expect("re")
                .text,
            "commit this"
        );
        assert_eq!(
            background_path(Path::new("/x/y.jsonl")),
            Path::new("/x/y.background.jsonl")
        );
    }
}
