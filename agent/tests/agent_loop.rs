//! The agent loop end to end: replayed cassettes on a temp project, scripted providers for
//! approval, concurrency, malformed calls and limits, and a live mock server for cancellation.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{finish_chunk, sse_body, text_chunk, MockServer, Scripted};
use serde_json::{json, Value};
use shade_agent::approval::{AlwaysYes, ApprovalMode, NoOneToAsk};
use shade_agent::tools::{Tool, ToolContext, ToolError, ToolKind, ToolOutput, ToolRegistry};
use shade_agent::{Agent, AgentEvent, AgentOptions, EventSink, StopReason, Workspace};
use shade_llm::cassette::{RecordingProvider, ReplayProvider};
use shade_llm::{
    BoxFuture, ChatRequest, Completion, FinishReason, LlmConfig, LlmError, LlmEvent, LlmProvider,
    Message, OpenAiClient, ToolCall, ToolSpec,
};
use tokio_util::sync::CancellationToken;

/// The prompt recorded in the fixtures (the exec CLI test uses the same one).
const FIX_PROMPT: &str =
    "add.sh should print the sum of its two arguments, but test.sh fails. Fix it.";

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in ["add.sh", "test.sh"] {
        std::fs::copy(fixtures().join("add_project").join(f), dir.path().join(f)).unwrap();
    }
    dir
}

fn agent(
    dir: &Path,
    provider: Arc<dyn LlmProvider>,
    approval: ApprovalMode,
    tools: ToolRegistry,
) -> Agent {
    let mut ctx = ToolContext::new(Workspace::new(dir).unwrap());
    ctx.global_memory = None;
    let approver: Arc<dyn shade_agent::Approver> = match approval {
        ApprovalMode::Default => Arc::new(NoOneToAsk { mode: approval }),
        _ => Arc::new(AlwaysYes),
    };
    Agent::new(
        provider,
        tools,
        ctx,
        approver,
        AgentOptions {
            model: "test-model".into(),
            max_turns: 10,
            approval,
            temperature: None,
        },
    )
}

fn collector() -> (EventSink, Arc<Mutex<Vec<AgentEvent>>>) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let e2 = events.clone();
    (Arc::new(move |e| e2.lock().unwrap().push(e)), events)
}

fn tool_ends(events: &[AgentEvent]) -> Vec<(String, bool, bool, String)> {
    events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::ToolEnd {
                name,
                ok,
                denied,
                output,
                ..
            } => Some((name.clone(), *ok, *denied, output.clone())),
            _ => None,
        })
        .collect()
}

fn text_of(events: &[AgentEvent]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::TextDelta { text } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

/// Every assistant tool call is answered, in order, before the next assistant message.
fn assert_well_formed(conv: &[Message]) {
    let mut pending: Vec<String> = Vec::new();
    for m in conv {
        match m {
            Message::Assistant { tool_calls, .. } => {
                assert!(pending.is_empty(), "unanswered calls {pending:?}");
                pending = tool_calls.iter().map(|c| c.id.clone()).collect();
            }
            Message::Tool { tool_call_id, .. } => {
                assert_eq!(pending.first(), Some(tool_call_id), "result out of order");
                pending.remove(0);
            }
            _ => assert!(pending.is_empty()),
        }
    }
    assert!(pending.is_empty(), "unanswered calls {pending:?}");
}

// ---------- cassette replay: the full task ----------

#[tokio::test]
async fn replayed_task_reads_edits_runs_and_answers() {
    let dir = project();
    let replay = Arc::new(ReplayProvider::open(&fixtures().join("fix_add.jsonl")).unwrap());
    let a = agent(
        dir.path(),
        replay.clone(),
        ApprovalMode::Yolo,
        ToolRegistry::standard(),
    );
    let (sink, events) = collector();
    let mut conv = a.start_conversation(FIX_PROMPT);
    let out = a
        .run(&mut conv, &sink, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out.stop, StopReason::Completed);
    assert_eq!(out.turns, 4);
    assert_eq!(
        replay.served(),
        replay.len(),
        "every recorded call was used"
    );
    // The right end state.
    let fixed = std::fs::read_to_string(dir.path().join("add.sh")).unwrap();
    assert!(fixed.contains("echo $(( $1 + $2 ))"), "{fixed}");
    let check = std::process::Command::new("sh")
        .arg("test.sh")
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&check.stdout), "PASS\n");
    let events = events.lock().unwrap();
    let ends = tool_ends(&events);
    let names: Vec<&str> = ends.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(names, ["read_file", "read_file", "edit", "shell"]);
    assert!(ends.iter().all(|e| e.1), "{ends:?}");
    assert!(ends[3].3.contains("PASS"));
    assert!(out.final_text.contains("PASS"));
    assert!(text_of(&events).ends_with(&out.final_text));
    assert_well_formed(&conv);
}

#[tokio::test]
async fn replay_fails_loudly_when_the_run_diverges() {
    // Same cassette, but the project differs: the first tool result no longer matches.
    let dir = project();
    std::fs::write(dir.path().join("add.sh"), "echo different\n").unwrap();
    let replay = Arc::new(ReplayProvider::open(&fixtures().join("fix_add.jsonl")).unwrap());
    let a = agent(
        dir.path(),
        replay,
        ApprovalMode::Yolo,
        ToolRegistry::standard(),
    );
    let (sink, events) = collector();
    let mut conv = a.start_conversation(FIX_PROMPT);
    let err = a
        .run(&mut conv, &sink, &CancellationToken::new())
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("does not match the recording"), "{msg}");
    assert!(msg.contains("echo different"), "{msg}");
    assert!(events
        .lock()
        .unwrap()
        .iter()
        .any(|e| matches!(e, AgentEvent::Error { .. })));
}

#[tokio::test]
async fn default_mode_without_a_user_refuses_edits_and_says_so() {
    let dir = project();
    let before = std::fs::read_to_string(dir.path().join("add.sh")).unwrap();
    let replay = Arc::new(ReplayProvider::open(&fixtures().join("refused_edit.jsonl")).unwrap());
    let a = agent(
        dir.path(),
        replay,
        ApprovalMode::Default,
        ToolRegistry::standard(),
    );
    let (sink, events) = collector();
    let mut conv = a.start_conversation(FIX_PROMPT);
    let out = a
        .run(&mut conv, &sink, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out.stop, StopReason::Completed);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("add.sh")).unwrap(),
        before
    );
    let ends = tool_ends(&events.lock().unwrap());
    assert_eq!(ends.len(), 1);
    assert!(ends[0].2, "denied");
    assert!(ends[0].3.contains("no user to ask"), "{}", ends[0].3);
    assert_well_formed(&conv);
}

// ---------- scripted provider ----------

/// Answers with canned completions and keeps the requests.
struct Scripted2 {
    answers: Mutex<std::vec::IntoIter<Completion>>,
    requests: Mutex<Vec<ChatRequest>>,
}

impl Scripted2 {
    fn new(answers: Vec<Completion>) -> Arc<Self> {
        Arc::new(Self {
            answers: Mutex::new(answers.into_iter()),
            requests: Mutex::default(),
        })
    }
    fn last_request(&self) -> ChatRequest {
        self.requests.lock().unwrap().last().unwrap().clone()
    }
}

impl LlmProvider for Scripted2 {
    fn complete<'a>(
        &'a self,
        request: &'a ChatRequest,
        on_event: &'a (dyn Fn(LlmEvent) + Send + Sync),
        _cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<Completion, LlmError>> {
        Box::pin(async move {
            self.requests.lock().unwrap().push(request.clone());
            let next = self.answers.lock().unwrap().next();
            let c = next.ok_or_else(|| LlmError::Malformed("script exhausted".into()))?;
            if !c.text.is_empty() {
                on_event(LlmEvent::Text(c.text.clone()));
            }
            Ok(c)
        })
    }
}

fn calls(calls: &[(&str, &str, &str)]) -> Completion {
    Completion {
        model: "m".into(),
        text: String::new(),
        reasoning: String::new(),
        tool_calls: calls
            .iter()
            .map(|(id, name, args)| ToolCall {
                id: id.to_string(),
                name: name.to_string(),
                arguments: args.to_string(),
            })
            .collect(),
        finish_reason: FinishReason::ToolCalls,
        usage: None,
    }
}

fn answer(text: &str) -> Completion {
    Completion {
        text: text.into(),
        finish_reason: FinishReason::Stop,
        ..calls(&[])
    }
}

fn tool_results(req: &ChatRequest) -> Vec<(String, String)> {
    req.messages
        .iter()
        .filter_map(|m| match m {
            Message::Tool {
                tool_call_id,
                content,
            } => Some((tool_call_id.clone(), content.clone())),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn malformed_calls_and_escapes_become_tool_errors_for_the_model() {
    let dir = project();
    let secret = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(secret.path(), "TOP SECRET").unwrap();
    let p = Scripted2::new(vec![
        calls(&[
            ("a", "read_file", "{\"path\": \"add.sh\""),
            ("b", "no_such_tool", "{}"),
            (
                "c",
                "read_file",
                &json!({"path": secret.path()}).to_string(),
            ),
            ("d", "read_file", "{\"path\": \"../etc/passwd\"}"),
            ("e", "read_file", "[1,2]"),
        ]),
        answer("done"),
    ]);
    let a = agent(
        dir.path(),
        p.clone(),
        ApprovalMode::Yolo,
        ToolRegistry::standard(),
    );
    let (sink, _events) = collector();
    let mut conv = a.start_conversation("x");
    let out = a
        .run(&mut conv, &sink, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out.final_text, "done");
    let results = tool_results(&p.last_request());
    let ids: Vec<&str> = results.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(ids, ["a", "b", "c", "d", "e"]);
    assert!(results[0].1.contains("not valid JSON"), "{}", results[0].1);
    assert!(results[1].1.contains("no tool named `no_such_tool`"));
    assert!(
        results[2].1.contains("outside the workspace"),
        "{}",
        results[2].1
    );
    assert!(results[3].1.contains("outside the workspace"));
    assert!(results[4].1.contains("expected a JSON object"));
    assert!(results.iter().all(|r| !r.1.contains("TOP SECRET")));
    assert_well_formed(&conv);
}

#[tokio::test]
async fn plan_mode_allows_reads_and_refuses_writes() {
    let dir = project();
    let p = Scripted2::new(vec![
        calls(&[
            ("1", "shell", "{\"command\": \"cat add.sh | wc -l\"}"),
            (
                "2",
                "edit",
                "{\"path\": \"add.sh\", \"old_string\": \"-\", \"new_string\": \"+\"}",
            ),
            ("3", "shell", "{\"command\": \"rm add.sh\"}"),
            (
                "4",
                "write_file",
                "{\"path\": \"n.txt\", \"content\": \"x\"}",
            ),
        ]),
        answer("planned"),
    ]);
    let a = agent(
        dir.path(),
        p.clone(),
        ApprovalMode::Plan,
        ToolRegistry::standard(),
    );
    let (sink, events) = collector();
    let mut conv = a.start_conversation("x");
    a.run(&mut conv, &sink, &CancellationToken::new())
        .await
        .unwrap();
    assert!(dir.path().join("add.sh").exists());
    assert!(!dir.path().join("n.txt").exists());
    let ends = tool_ends(&events.lock().unwrap());
    let denied: Vec<bool> = ends.iter().map(|e| e.2).collect();
    assert_eq!(denied, [false, true, true, true]);
    assert!(ends[0].3.contains("Exit code: 0"));
    assert!(ends[1].3.contains("plan mode"));
}

#[tokio::test]
async fn auto_edit_edits_but_does_not_run_writing_commands_unasked() {
    let dir = project();
    let p = Scripted2::new(vec![
        calls(&[
            (
                "1",
                "edit",
                "{\"path\": \"add.sh\", \"old_string\": \"$1 - $2\", \"new_string\": \"$1 + $2\"}",
            ),
            ("2", "shell", "{\"command\": \"touch made-by-shell\"}"),
        ]),
        answer("ok"),
    ]);
    let mut ctx = ToolContext::new(Workspace::new(dir.path()).unwrap());
    ctx.global_memory = None;
    let a = Agent::new(
        p,
        ToolRegistry::standard(),
        ctx,
        Arc::new(NoOneToAsk {
            mode: ApprovalMode::AutoEdit,
        }),
        AgentOptions {
            model: "m".into(),
            approval: ApprovalMode::AutoEdit,
            ..AgentOptions::default()
        },
    );
    let (sink, events) = collector();
    let mut conv = a.start_conversation("x");
    a.run(&mut conv, &sink, &CancellationToken::new())
        .await
        .unwrap();
    assert!(std::fs::read_to_string(dir.path().join("add.sh"))
        .unwrap()
        .contains("$1 + $2"));
    assert!(!dir.path().join("made-by-shell").exists());
    let ends = tool_ends(&events.lock().unwrap());
    assert!(ends[0].1 && !ends[1].1 && ends[1].2);
}

/// A read-only tool that takes a while, to observe concurrency.
struct Slow {
    name: &'static str,
    read_only: bool,
    log: Arc<Mutex<Vec<String>>>,
}

impl Tool for Slow {
    fn name(&self) -> &'static str {
        self.name
    }
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name.into(),
            description: "slow".into(),
            parameters: json!({"type": "object"}),
        }
    }
    fn kind(&self) -> ToolKind {
        if self.read_only {
            ToolKind::Read
        } else {
            ToolKind::Edit
        }
    }
    fn run<'a>(
        &'a self,
        args: Value,
        _ctx: &'a ToolContext,
        _cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let tag = args["tag"].as_str().unwrap_or("").to_string();
            self.log.lock().unwrap().push(format!("start {tag}"));
            // The first read is the slowest, so completion order differs from call order.
            let ms = if tag == "r1" { 400 } else { 300 };
            tokio::time::sleep(Duration::from_millis(ms)).await;
            self.log.lock().unwrap().push(format!("end {tag}"));
            Ok(ToolOutput {
                content: tag.clone(),
                display: tag,
            })
        })
    }
}

#[tokio::test]
async fn read_only_calls_run_concurrently_others_in_order() {
    let dir = project();
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut tools = ToolRegistry::empty();
    tools.add(Arc::new(Slow {
        name: "look",
        read_only: true,
        log: log.clone(),
    }));
    tools.add(Arc::new(Slow {
        name: "change",
        read_only: false,
        log: log.clone(),
    }));
    let p = Scripted2::new(vec![
        calls(&[
            ("1", "look", "{\"tag\": \"r1\"}"),
            ("2", "look", "{\"tag\": \"r2\"}"),
            ("3", "look", "{\"tag\": \"r3\"}"),
            ("4", "change", "{\"tag\": \"w1\"}"),
            ("5", "change", "{\"tag\": \"w2\"}"),
            ("6", "look", "{\"tag\": \"r4\"}"),
        ]),
        answer("ok"),
    ]);
    let a = agent(dir.path(), p.clone(), ApprovalMode::Yolo, tools);
    let (sink, events) = collector();
    let mut conv = a.start_conversation("x");
    let started = Instant::now();
    a.run(&mut conv, &sink, &CancellationToken::new())
        .await
        .unwrap();
    let took = started.elapsed();
    // 3 concurrent reads (~400ms) + 2 writes in order + 1 read = ~1.3s, not 1.9s.
    assert!(took < Duration::from_millis(1700), "{took:?}");
    let log = log.lock().unwrap().clone();
    assert_eq!(&log[..3], ["start r1", "start r2", "start r3"]);
    let tail: Vec<&str> = log[6..].iter().map(String::as_str).collect();
    assert_eq!(
        tail,
        ["start w1", "end w1", "start w2", "end w2", "start r4", "end r4"]
    );
    let ids: Vec<String> = tool_results(&p.last_request())
        .into_iter()
        .map(|r| r.1)
        .collect();
    assert_eq!(
        ids,
        ["r1", "r2", "r3", "w1", "w2", "r4"],
        "results in call order"
    );
    let ends: Vec<String> = tool_ends(&events.lock().unwrap())
        .into_iter()
        .map(|e| e.3)
        .collect();
    assert_eq!(
        ends,
        ["r1", "r2", "r3", "w1", "w2", "r4"],
        "events in call order"
    );
}

#[tokio::test]
async fn stops_at_the_turn_limit() {
    let dir = project();
    let p = Scripted2::new(
        (0..20)
            .map(|i| calls(&[(&format!("c{i}"), "ls", "{}")]))
            .collect(),
    );
    let mut a_opts = AgentOptions {
        model: "m".into(),
        max_turns: 3,
        approval: ApprovalMode::Yolo,
        temperature: None,
    };
    let mut ctx = ToolContext::new(Workspace::new(dir.path()).unwrap());
    ctx.global_memory = None;
    let a = Agent::new(
        p.clone(),
        ToolRegistry::standard(),
        ctx.clone(),
        Arc::new(AlwaysYes),
        a_opts.clone(),
    );
    let (sink, events) = collector();
    let mut conv = a.start_conversation("x");
    let out = a
        .run(&mut conv, &sink, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out.stop, StopReason::TurnLimit);
    assert_eq!(out.turns, 3);
    assert_eq!(p.requests.lock().unwrap().len(), 3);
    assert!(matches!(conv.last(), Some(Message::Tool { .. })));
    assert_well_formed(&conv);
    assert!(matches!(
        events.lock().unwrap().last(),
        Some(AgentEvent::Done {
            reason: StopReason::TurnLimit,
            turns: 3
        })
    ));
    a_opts.max_turns = 0;
    let a0 = Agent::new(
        p,
        ToolRegistry::standard(),
        ctx,
        Arc::new(AlwaysYes),
        a_opts,
    );
    let mut conv = a0.start_conversation("x");
    assert_eq!(
        a0.run(&mut conv, &sink, &CancellationToken::new())
            .await
            .unwrap()
            .stop,
        StopReason::TurnLimit
    );
}

// ---------- live client through the loop ----------

fn client(server: &MockServer) -> OpenAiClient {
    OpenAiClient::new(LlmConfig {
        base_url: server.base_url.clone(),
        model: Some("test-model".into()),
        max_retries: 1,
        base_delay: Duration::from_millis(1),
        idle_timeout: Duration::from_secs(10),
        ..LlmConfig::default()
    })
    .unwrap()
}

#[tokio::test]
async fn cancellation_stops_the_loop_mid_stream() {
    let dir = project();
    let server = MockServer::start(vec![Scripted::sse(
        &sse_body(&[text_chunk("Thinking about "), text_chunk("it")], false),
        &[1000],
    )
    .then(Duration::from_secs(30), "data: [DONE]\n\n")]);
    let a = agent(
        dir.path(),
        Arc::new(client(&server)),
        ApprovalMode::Yolo,
        ToolRegistry::standard(),
    );
    let cancel = CancellationToken::new();
    let c2 = cancel.clone();
    let events = Arc::new(Mutex::new(Vec::new()));
    let e2 = events.clone();
    let sink: EventSink = Arc::new(move |e: AgentEvent| {
        if matches!(e, AgentEvent::TextDelta { .. }) {
            c2.cancel();
        }
        e2.lock().unwrap().push(e);
    });
    let mut conv = a.start_conversation("x");
    let started = Instant::now();
    let out = a.run(&mut conv, &sink, &cancel).await.unwrap();
    assert_eq!(out.stop, StopReason::Cancelled);
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(conv.len(), 2, "no half answer in the conversation");
    assert!(text_of(&events.lock().unwrap()).starts_with("Thinking about"));
}

#[tokio::test]
async fn fatal_model_error_ends_the_run_with_an_error_event() {
    let dir = project();
    let server = MockServer::start(vec![Scripted::status(
        "401 Unauthorized",
        &[],
        r#"{"error":{"message":"Incorrect API key"}}"#,
    )]);
    let a = agent(
        dir.path(),
        Arc::new(client(&server)),
        ApprovalMode::Yolo,
        ToolRegistry::standard(),
    );
    let (sink, events) = collector();
    let mut conv = a.start_conversation("x");
    let err = a
        .run(&mut conv, &sink, &CancellationToken::new())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("Incorrect API key"));
    let events = events.lock().unwrap();
    assert!(matches!(
        events.last(),
        Some(AgentEvent::Done {
            reason: StopReason::Error,
            ..
        })
    ));
}

// ---------- fixture recording (run with --ignored to regenerate) ----------

fn tool_call_chunks(id: &str, index: u64, name: &str, args: &Value) -> Vec<Value> {
    // Arguments split in three pieces, as real servers stream them.
    let text = args.to_string();
    let (a, rest) = text.split_at(text.len() / 3);
    let (b, c) = rest.split_at(rest.len() / 2);
    let mut out = vec![
        json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":index,"id":id,"type":"function","function":{"name":name,"arguments":a}}]}}]}),
    ];
    for piece in [b, c] {
        out.push(json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":index,"function":{"arguments":piece}}]}}]}));
    }
    out
}

fn turn(text: &[&str], tools: &[(&str, &str, Value)], usage: (u64, u64)) -> Scripted {
    let mut chunks: Vec<Value> = text.iter().map(|t| text_chunk(t)).collect();
    for (i, (id, name, args)) in tools.iter().enumerate() {
        chunks.extend(tool_call_chunks(id, i as u64, name, args));
    }
    chunks.push(finish_chunk(if tools.is_empty() {
        "stop"
    } else {
        "tool_calls"
    }));
    chunks
        .push(json!({"choices":[],"usage":{"prompt_tokens":usage.0,"completion_tokens":usage.1}}));
    Scripted::sse(&sse_body(&chunks, true), &[37])
}

async fn record(name: &str, approval: ApprovalMode, prompt: &str, script: Vec<Scripted>) {
    let dir = project();
    let server = MockServer::start(script);
    let path = fixtures().join(name);
    let rec = RecordingProvider::create(client(&server), &path).unwrap();
    let a = agent(
        dir.path(),
        Arc::new(rec),
        approval,
        ToolRegistry::standard(),
    );
    let (sink, _) = collector();
    let mut conv = a.start_conversation(prompt);
    let out = a
        .run(&mut conv, &sink, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out.stop, StopReason::Completed);
}

const PLAN_PROMPT: &str =
    "Where is the sum computed and why does test.sh fail? Plan the fix; do not change anything.";

#[tokio::test]
async fn replayed_plan_mode_exploration_changes_nothing() {
    let dir = project();
    let before = std::fs::read_to_string(dir.path().join("add.sh")).unwrap();
    let replay = Arc::new(ReplayProvider::open(&fixtures().join("explore_plan.jsonl")).unwrap());
    let a = agent(
        dir.path(),
        replay.clone(),
        ApprovalMode::Plan,
        ToolRegistry::standard(),
    );
    let (sink, events) = collector();
    let mut conv = a.start_conversation(PLAN_PROMPT);
    let out = a
        .run(&mut conv, &sink, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out.stop, StopReason::Completed);
    assert_eq!(replay.served(), replay.len());
    assert_eq!(
        std::fs::read_to_string(dir.path().join("add.sh")).unwrap(),
        before
    );
    let ends = tool_ends(&events.lock().unwrap());
    let summary: Vec<(&str, bool, bool)> = ends.iter().map(|e| (e.0.as_str(), e.1, e.2)).collect();
    assert_eq!(
        summary,
        [
            ("todo_write", true, false),
            ("grep", true, false),
            ("glob", true, false),
            ("shell", true, false),
            ("shell", false, true),
        ]
    );
    assert!(
        ends[1].3.contains("add.sh:3: echo $(( $1 - $2 ))"),
        "{}",
        ends[1].3
    );
    assert!(
        ends[3].3.contains("result=$(sh add.sh 2 3)"),
        "{}",
        ends[3].3
    );
    assert!(ends[4].3.contains("plan mode"));
    assert_eq!(a.context().todos.lock().unwrap().len(), 2);
    assert_well_formed(&conv);
}

#[tokio::test]
#[ignore = "regenerates the committed cassettes"]
async fn record_fixtures() {
    record(
        "explore_plan.jsonl",
        ApprovalMode::Plan,
        PLAN_PROMPT,
        vec![
            turn(
                &["I'll plan this first."],
                &[(
                    "call_1",
                    "todo_write",
                    json!({"todos": [
                        {"id": "1", "content": "Find where the sum is computed", "status": "in_progress"},
                        {"id": "2", "content": "Explain why test.sh fails", "status": "pending"}]}),
                )],
                (800, 30),
            ),
            turn(
                &["Searching."],
                &[
                    ("call_2", "grep", json!({"pattern": "\\$\\(\\(", "include": "*.sh"})),
                    ("call_3", "glob", json!({"pattern": "*.sh"})),
                ],
                (900, 30),
            ),
            turn(
                &["Checking how the test calls it; running it would be the next step."],
                &[
                    ("call_4", "shell", json!({"command": "cat test.sh | grep result"})),
                    ("call_5", "shell", json!({"command": "sh test.sh"})),
                ],
                (1000, 30),
            ),
            turn(
                &["The sum is computed on line 3 of add.sh, which uses `-`, so `sh add.sh 2 3` prints -1 and test.sh fails. ", "Plan: change it to `echo $(( $1 + $2 ))` and rerun `sh test.sh` (expected output: PASS)."],
                &[],
                (1100, 40),
            ),
        ],
    )
    .await;
    record(
        "fix_add.jsonl",
        ApprovalMode::Yolo,
        FIX_PROMPT,
        vec![
            turn(
                &["Let me look at ", "both scripts."],
                &[
                    ("call_1", "read_file", json!({"path": "add.sh"})),
                    ("call_2", "read_file", json!({"path": "test.sh"})),
                ],
                (900, 40),
            ),
            turn(
                &["add.sh subtracts instead of adding; ", "fixing the operator."],
                &[(
                    "call_3",
                    "edit",
                    json!({"path": "add.sh", "old_string": "echo $(( $1 - $2 ))", "new_string": "echo $(( $1 + $2 ))"}),
                )],
                (1100, 60),
            ),
            turn(
                &["Now running the test."],
                &[("call_4", "shell", json!({"command": "sh test.sh"}))],
                (1200, 20),
            ),
            turn(
                &["Fixed: add.sh used `-` instead of `+`. ", "`sh test.sh` now prints PASS."],
                &[],
                (1300, 25),
            ),
        ],
    )
    .await;
    record(
        "refused_edit.jsonl",
        ApprovalMode::Default,
        FIX_PROMPT,
        vec![
            turn(
                &["The operator in add.sh is wrong; changing `-` to `+`."],
                &[(
                    "call_1",
                    "edit",
                    json!({"path": "add.sh", "old_string": "echo $(( $1 - $2 ))", "new_string": "echo $(( $1 + $2 ))"}),
                )],
                (900, 50),
            ),
            turn(
                &["I could not edit add.sh: the edit was refused because there is no one to approve it. ", "To fix it, change line 3 of add.sh to `echo $(( $1 + $2 ))`."],
                &[],
                (1000, 40),
            ),
        ],
    )
    .await;
}

#[tokio::test]
async fn a_fork_works_in_its_own_workspace() {
    let real = project();
    let branch = project();
    let p = Scripted2::new(vec![
        calls(&[(
            "1",
            "edit",
            "{\"path\": \"add.sh\", \"old_string\": \"$1 - $2\", \"new_string\": \"$1 + $2\"}",
        )]),
        answer("edited"),
    ]);
    let main = agent(
        real.path(),
        p.clone(),
        ApprovalMode::Default,
        ToolRegistry::standard(),
    );
    let fork = main.fork_onto(Workspace::new(branch.path()).unwrap(), ApprovalMode::Yolo);
    let (sink, _) = collector();
    let mut conv = main.start_conversation("x");
    let mut forked = conv.clone();
    fork.run(&mut forked, &sink, &CancellationToken::new())
        .await
        .unwrap();
    let read = |d: &tempfile::TempDir| std::fs::read_to_string(d.path().join("add.sh")).unwrap();
    assert!(read(&branch).contains("$1 + $2"));
    assert!(
        read(&real).contains("$1 - $2"),
        "the real project is untouched"
    );
    assert_eq!(main.options().approval, ApprovalMode::Default);
    assert_eq!(conv.len(), 2);
    conv.extend_from_slice(&forked[2..]);
    assert_well_formed(&conv);
}

#[tokio::test]
async fn an_answer_cut_at_the_token_limit_is_flagged() {
    let dir = project();
    let mut cut = answer("The fix is to chan");
    cut.finish_reason = FinishReason::Length;
    let p = Scripted2::new(vec![cut]);
    let a = agent(dir.path(), p, ApprovalMode::Yolo, ToolRegistry::standard());
    let (sink, events) = collector();
    let mut conv = a.start_conversation("x");
    let out = a
        .run(&mut conv, &sink, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out.stop, StopReason::Completed);
    assert!(events.lock().unwrap().iter().any(
        |e| matches!(e, AgentEvent::Error { message } if message.contains("output token limit"))
    ));
}

#[tokio::test]
async fn after_a_model_switch_later_turns_stay_on_the_new_model() {
    let dir = project();
    let tool_turn = sse_body(
        &[
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"ls","arguments":"{}"}}]}}]}),
            finish_chunk("tool_calls"),
        ],
        true,
    );
    let server = MockServer::start(vec![
        Scripted::status(
            "400 Bad Request",
            &[],
            r#"{"error":{"message":"maximum context length exceeded"}}"#,
        ),
        Scripted::sse(&tool_turn, &[64]),
        Scripted::sse(
            &sse_body(&[text_chunk("done"), finish_chunk("stop")], true),
            &[64],
        ),
    ]);
    let client = OpenAiClient::new(LlmConfig {
        base_url: server.base_url.clone(),
        large_context_model: Some("big".into()),
        max_retries: 0,
        ..LlmConfig::default()
    })
    .unwrap();
    let a = agent(
        dir.path(),
        Arc::new(client),
        ApprovalMode::Yolo,
        ToolRegistry::standard(),
    );
    let (sink, events) = collector();
    let mut conv = a.start_conversation("x");
    let out = a
        .run(&mut conv, &sink, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out.final_text, "done");
    let models: Vec<String> = (0..3)
        .map(|i| server.request(i)["model"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(models, ["test-model", "big", "big"]);
    assert!(events
        .lock()
        .unwrap()
        .iter()
        .any(|e| matches!(e, AgentEvent::TurnStart { turn: 2, model } if model == "big")));
}

// ---------- call gates (speculation boundaries) ----------

/// Refuses web_fetch and any call to a tool named in `refuse`.
struct RefuseFetch;

impl shade_agent::CallGate for RefuseFetch {
    fn check(&self, call: &shade_agent::GateCall<'_>) -> Option<String> {
        (call.name == "web_fetch").then(|| "web_fetch".to_string())
    }
}

#[tokio::test]
async fn a_gate_keeps_the_calls_before_the_boundary_by_position_and_strips_the_rest() {
    let dir = project();
    let provider = Scripted2::new(vec![
        calls(&[("c1", "read_file", r#"{"path":"add.sh"}"#)]),
        Completion {
            text: "Reading again, then fetching docs.".into(),
            ..calls(&[
                ("c2", "read_file", r#"{"path":"add.sh"}"#),
                ("c3", "web_fetch", r#"{"url":"http://example.com"}"#),
                ("c4", "read_file", r#"{"path":"test.sh"}"#),
            ])
        },
    ]);
    let agent = agent(
        dir.path(),
        provider.clone(),
        ApprovalMode::Yolo,
        ToolRegistry::standard(),
    );
    let (sink, events) = collector();
    let mut conv = agent.start_conversation("look around");
    let out = agent
        .run_gated(
            &mut conv,
            &sink,
            &CancellationToken::new(),
            Some(&RefuseFetch),
        )
        .await
        .unwrap();
    assert_eq!(out.stop, StopReason::Boundary);
    let b = out.boundary.unwrap();
    assert_eq!((b.reason.as_str(), b.kept_calls), ("web_fetch", 1));
    assert_well_formed(&conv);
    // The last reply keeps its text and only the call before the boundary (c2), with its
    // result; c3 and c4 never ran.
    let Message::Assistant {
        content,
        tool_calls,
    } = &conv[conv.len() - 2]
    else {
        panic!("expected the trimmed reply, got {:?}", conv[conv.len() - 2]);
    };
    assert_eq!(content, "Reading again, then fetching docs.");
    assert_eq!(tool_calls.len(), 1);
    assert_eq!(tool_calls[0].id, "c2");
    assert!(
        matches!(conv.last(), Some(Message::Tool { tool_call_id, .. }) if tool_call_id == "c2")
    );
    let ran: Vec<String> = tool_ends(&events.lock().unwrap())
        .into_iter()
        .map(|(n, ..)| n)
        .collect();
    assert_eq!(ran, vec!["read_file", "read_file"]);
}

#[tokio::test]
async fn a_boundary_on_the_first_call_keeps_only_the_text() {
    let dir = project();
    let provider = Scripted2::new(vec![Completion {
        text: "Let me check the docs.".into(),
        ..calls(&[("c1", "web_fetch", r#"{"url":"http://example.com"}"#)])
    }]);
    let agent = agent(
        dir.path(),
        provider,
        ApprovalMode::Yolo,
        ToolRegistry::standard(),
    );
    let (sink, _events) = collector();
    let mut conv = agent.start_conversation("docs?");
    let out = agent
        .run_gated(
            &mut conv,
            &sink,
            &CancellationToken::new(),
            Some(&RefuseFetch),
        )
        .await
        .unwrap();
    assert_eq!(out.stop, StopReason::Boundary);
    assert_eq!(out.boundary.unwrap().kept_calls, 0);
    assert!(
        matches!(conv.last(), Some(Message::Assistant { content, tool_calls })
        if content == "Let me check the docs." && tool_calls.is_empty())
    );
    assert_well_formed(&conv);
}
