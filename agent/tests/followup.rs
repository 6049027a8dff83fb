//! Prompt suggestions against a real local HTTP server speaking the OpenAI wire protocol: the
//! suggestion request repeats the main request's prefix byte for byte (so a prefix-caching
//! server hits), the standalone and pipelined requests, and what comes back through the filter.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::{finish_chunk, sse_body, text_chunk, MockServer, Scripted};
use serde_json::{json, Value};
use shade_agent::approval::{ApprovalMode, NoOneToAsk};
use shade_agent::background::BackgroundLlm;
use shade_agent::followup::cache::new_session_id;
use shade_agent::followup::{
    generate_pipelined, generate_suggestion, CacheSafeParams, SuggestionOutcome, SuggestionSource,
    SUGGESTION_PROMPT,
};
use shade_agent::{Agent, AgentOptions, EventSink, ToolContext, ToolRegistry, Workspace};
use shade_llm::{LlmConfig, Message, OpenAiClient};
use tokio_util::sync::CancellationToken;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn client(server: &MockServer) -> OpenAiClient {
    OpenAiClient::new(LlmConfig {
        base_url: server.base_url.clone(),
        model: Some("main-model".into()),
        max_retries: 0,
        base_delay: Duration::from_millis(1),
        idle_timeout: Duration::from_secs(10),
        ..LlmConfig::default()
    })
    .unwrap()
}

fn sse_text(text: &str) -> Scripted {
    Scripted::sse(
        &sse_body(&[text_chunk(text), finish_chunk("stop")], true),
        &[7],
    )
}

fn sse_tool_call(id: &str, name: &str, args: &str) -> Scripted {
    let call = json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":id,"type":"function",
        "function":{"name":name,"arguments":args}}]},"finish_reason":null}]});
    Scripted::sse(&sse_body(&[call, finish_chunk("tool_calls")], true), &[11])
}

/// The bytes of the JSON array that is the value of `"key"` in `body` (brackets included),
/// found by scanning, so the comparison is on the exact bytes sent.
fn array_span<'a>(body: &'a [u8], key: &str) -> &'a [u8] {
    let needle = format!("\"{key}\":[");
    let start = body
        .windows(needle.len())
        .position(|w| w == needle.as_bytes())
        .unwrap_or_else(|| panic!("no {key} in {}", String::from_utf8_lossy(body)))
        + needle.len()
        - 1;
    let (mut depth, mut in_str, mut esc) = (0i32, false, false);
    for (i, &b) in body[start..].iter().enumerate() {
        if in_str {
            match (esc, b) {
                (true, _) => esc = false,
                (false, b'\\') => esc = true,
                (false, b'"') => in_str = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_str = true,
            b'[' | b'{' => depth += 1,
            b']' | b'}' => {
                depth -= 1;
                if depth == 0 {
                    return &body[start..=start + i];
                }
            }
            _ => {}
        }
    }
    panic!("unterminated {key} array");
}

struct Session {
    server: MockServer,
    conversation: Vec<Message>,
    params: CacheSafeParams,
    bg: BackgroundLlm,
    _dir: tempfile::TempDir,
}

/// One main turn (a tool call, then the answer) through `Agent::run`, then the saved prefix.
async fn main_turn(more: Vec<Scripted>) -> Session {
    let dir = tempfile::tempdir().unwrap();
    for f in ["add.sh", "test.sh"] {
        std::fs::copy(fixtures().join("add_project").join(f), dir.path().join(f)).unwrap();
    }
    let mut script = vec![
        sse_tool_call("call_1", "read_file", r#"{"path":"add.sh"}"#),
        sse_text("add.sh now prints the sum. Tip: type run the tests to check it."),
    ];
    script.extend(more);
    let server = MockServer::start(script);
    let provider = Arc::new(client(&server));
    let mut ctx = ToolContext::new(Workspace::new(dir.path()).unwrap());
    ctx.global_memory = None;
    let tools = ToolRegistry::standard();
    let agent = Agent::new(
        provider.clone(),
        tools.clone(),
        ctx,
        Arc::new(NoOneToAsk {
            mode: ApprovalMode::Default,
        }),
        AgentOptions {
            model: "main-model".into(),
            ..AgentOptions::default()
        },
    );
    let sink: EventSink = Arc::new(|_| {});
    let mut conversation = agent.start_conversation("fix add.sh");
    let out = agent
        .run(&mut conversation, &sink, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out.turns, 2);
    assert_eq!(server.request_count(), 2);
    let params = CacheSafeParams::capture(
        new_session_id(),
        &conversation,
        &tools.specs(),
        "main-model",
        None,
    )
    .expect("a finished turn is a fork point");
    Session {
        bg: BackgroundLlm::new(provider, "fast-model"),
        server,
        conversation,
        params,
        _dir: dir,
    }
}

#[tokio::test]
async fn suggestion_request_repeats_the_main_prefix_byte_for_byte() {
    let s = main_turn(vec![sse_text("\"run the tests\"")]).await;
    let got = generate_suggestion(
        &s.bg,
        SuggestionSource::Cached(&s.params),
        &CancellationToken::new(),
    )
    .await;
    assert_eq!(got, SuggestionOutcome::Suggested("run the tests".into()));
    assert_eq!(s.server.request_count(), 3);

    let raw = s.server.raw.lock().unwrap().clone();
    let (main, fork) = (&raw[1], &raw[2]);
    // Messages: the main request's array, without its closing bracket, starts the fork's.
    let main_messages = array_span(main, "messages");
    let fork_messages = array_span(fork, "messages");
    let open = &main_messages[..main_messages.len() - 1];
    assert!(
        fork_messages.starts_with(open) && fork_messages[open.len()] == b',',
        "fork messages do not extend the main request's bytes:\nmain: {}\nfork: {}",
        String::from_utf8_lossy(main_messages),
        String::from_utf8_lossy(fork_messages)
    );
    // Tools: the same bytes.
    assert_eq!(
        String::from_utf8_lossy(array_span(main, "tools")),
        String::from_utf8_lossy(array_span(fork, "tools"))
    );
    // And as parsed JSON: the prefix, the final answer, then the one suggestion message.
    let (main, fork) = (s.server.request(1), s.server.request(2));
    let n = main["messages"].as_array().unwrap().len();
    let fm = fork["messages"].as_array().unwrap();
    assert_eq!(n, 4, "system, user, tool call, tool result");
    assert_eq!(fm[..n], main["messages"].as_array().unwrap()[..]);
    assert_eq!(fm.len(), n + 2);
    assert_eq!(fm[n]["role"], "assistant");
    assert_eq!(
        fm[n + 1],
        json!({"role": "user", "content": SUGGESTION_PROMPT})
    );
    assert_eq!(fork["tools"], main["tools"]);
    assert!(!fork["tools"].as_array().unwrap().is_empty());
    assert_eq!(fork["model"], "fast-model");
    assert_eq!(main["model"], "main-model");
    // The main conversation is untouched by the suggestion.
    assert_eq!(s.conversation.len(), 5);
}

#[tokio::test]
async fn standalone_request_has_no_tools_and_one_user_message() {
    let s = main_turn(vec![sse_text("I'll run the tests now")]).await;
    let got = generate_suggestion(
        &s.bg,
        SuggestionSource::Standalone(&s.conversation),
        &CancellationToken::new(),
    )
    .await;
    assert_eq!(got, SuggestionOutcome::Suppressed("ai_voice"));
    let req = s.server.request(2);
    assert!(req.get("tools").is_none(), "{req}");
    let messages = req["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0]["role"], "user");
    let content = messages[0]["content"].as_str().unwrap();
    assert!(content.contains("User: fix add.sh"));
    assert!(content.contains("[called read_file]"));
    assert!(content.contains("Tip: type run the tests to check it."));
    assert!(content.ends_with(SUGGESTION_PROMPT));
    assert!(!content.contains("You are"), "no system prompt quoted");
}

#[tokio::test]
async fn pipelined_suggestion_forks_the_prefix_and_quotes_the_speculated_turn() {
    let s = main_turn(vec![sse_text("push it")]).await;
    let speculated = vec![
        Message::User {
            content: "commit this".into(),
        },
        Message::Assistant {
            content: "Committed as abc123.".into(),
            tool_calls: vec![],
        },
    ];
    let got = generate_pipelined(
        &s.bg,
        &s.params,
        "commit this",
        &speculated,
        &CancellationToken::new(),
    )
    .await;
    assert_eq!(got, SuggestionOutcome::Suggested("push it".into()));
    let (main, fork) = (s.server.request(1), s.server.request(2));
    let n = main["messages"].as_array().unwrap().len();
    let fm = fork["messages"].as_array().unwrap();
    assert_eq!(fm[..n], main["messages"].as_array().unwrap()[..]);
    let last = fm.last().unwrap()["content"].as_str().unwrap();
    assert!(last.starts_with(
        "The user just said: \"commit this\"\nThe assistant responded: Committed as abc123.\n"
    ));
    assert!(last.ends_with(SUGGESTION_PROMPT));
    assert_eq!(fork["tools"], main["tools"]);
}

#[tokio::test]
async fn tool_calls_are_ignored_and_errors_reported() {
    let s = main_turn(vec![
        sse_tool_call("call_9", "shell", r#"{"command":"git commit"}"#),
        Scripted::status(
            "400 Bad Request",
            &[("Content-Type", "application/json")],
            r#"{"error":{"message":"model not found"}}"#,
        ),
    ])
    .await;
    let cancel = CancellationToken::new();
    let got = generate_suggestion(&s.bg, SuggestionSource::Cached(&s.params), &cancel).await;
    assert_eq!(got, SuggestionOutcome::Suppressed("empty"));
    let got = generate_suggestion(&s.bg, SuggestionSource::Cached(&s.params), &cancel).await;
    match got {
        SuggestionOutcome::Failed(m) => assert!(m.contains("model not found"), "{m}"),
        other => panic!("expected a failure, got {other:?}"),
    }
    // A cancelled request says so.
    cancel.cancel();
    let got = generate_suggestion(&s.bg, SuggestionSource::Cached(&s.params), &cancel).await;
    assert!(got.is_cancelled(), "{got:?}");
    let _: Value = s.server.request(3);
}
