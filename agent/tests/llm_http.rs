//! The client against a local server speaking the real wire protocol.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{finish_chunk, sse_body, text_chunk, MockServer, Scripted};
use serde_json::json;
use shade_llm::{
    ChatRequest, FinishReason, LlmConfig, LlmError, LlmEvent, LlmProvider, Message, OpenAiClient,
    ToolSpec,
};
use tokio_util::sync::CancellationToken;

fn config(base_url: &str) -> LlmConfig {
    LlmConfig {
        base_url: base_url.to_string(),
        api_key: Some("sk-test".into()),
        model: Some("main".into()),
        max_retries: 2,
        base_delay: Duration::from_millis(5),
        max_delay: Duration::from_millis(20),
        idle_timeout: Duration::from_secs(5),
        ..LlmConfig::default()
    }
}

fn request() -> ChatRequest {
    ChatRequest {
        model: "main".into(),
        messages: vec![
            Message::System {
                content: "sys".into(),
            },
            Message::User {
                content: "hi".into(),
            },
        ],
        tools: vec![ToolSpec {
            name: "read_file".into(),
            description: "read".into(),
            parameters: json!({"type":"object"}),
        }],
        temperature: None,
        max_tokens: None,
        background: false,
        prompt_id: None,
    }
}

type Events = Arc<Mutex<Vec<LlmEvent>>>;

async fn call(
    cfg: LlmConfig,
    cancel: &CancellationToken,
) -> (Result<shade_llm::Completion, LlmError>, Events) {
    let client = OpenAiClient::new(cfg).unwrap();
    let events: Events = Arc::default();
    let ev = events.clone();
    let sink = move |e: LlmEvent| ev.lock().unwrap().push(e);
    let req = request();
    let res = client.complete(&req, &sink, cancel).await;
    (res, events)
}

fn texts(events: &Events) -> String {
    events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            LlmEvent::Text(t) => Some(t.as_str()),
            _ => None,
        })
        .collect()
}

fn tool_calls_stream() -> String {
    let chunks = vec![
        json!({"choices":[{"index":0,"delta":{"role":"assistant","reasoning_content":"secret plan"}}]}),
        text_chunk("Reading "),
        text_chunk("both."),
        json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"read_file","arguments":""}}]}}]}),
        json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"path\": \"sr"}}]}}]}),
        json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"read_file","arguments":"{\"path\""}}]}}]}),
        json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"c/a.rs\"}"}}]}}]}),
        json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":": \"b.rs\"}"}}]}}]}),
        finish_chunk("tool_calls"),
        json!({"choices":[],"usage":{"prompt_tokens":120,"completion_tokens":30,"prompt_tokens_details":{"cached_tokens":100}}}),
    ];
    sse_body(&chunks, true)
}

#[tokio::test]
async fn streams_text_and_assembles_split_tool_calls_at_any_cut() {
    for cuts in [vec![1], vec![7, 3], vec![64], vec![100_000]] {
        let server = MockServer::start(vec![Scripted::sse(&tool_calls_stream(), &cuts)]);
        let (res, events) = call(config(&server.base_url), &CancellationToken::new()).await;
        let c = res.unwrap_or_else(|e| panic!("cuts {cuts:?}: {e}"));
        assert_eq!(c.text, "Reading both.");
        assert_eq!(texts(&events), "Reading both.");
        assert_eq!(c.reasoning, "secret plan");
        assert!(!c.text.contains("secret"));
        assert_eq!(c.finish_reason, FinishReason::ToolCalls);
        assert_eq!(c.tool_calls.len(), 2);
        assert_eq!(c.tool_calls[0].id, "call_a");
        assert_eq!(c.tool_calls[0].arguments, r#"{"path": "src/a.rs"}"#);
        assert_eq!(c.tool_calls[1].arguments, r#"{"path": "b.rs"}"#);
        assert_eq!(c.usage.as_ref().map(|u| u.cached_tokens), Some(100));
        // The request is what an OpenAI-compatible server expects.
        let body = server.request(0);
        assert_eq!(body["stream"], json!(true));
        assert_eq!(body["model"], json!("main"));
        assert_eq!(body["messages"][1], json!({"role":"user","content":"hi"}));
        assert_eq!(body["tools"][0]["function"]["name"], json!("read_file"));
        assert!(body.get("enable_thinking").is_none());
    }
}

#[tokio::test]
async fn retries_429_honouring_retry_after_then_succeeds() {
    let server = MockServer::start(vec![
        Scripted::status(
            "429 Too Many Requests",
            &[
                ("Retry-After", "0.05"),
                ("Content-Type", "application/json"),
            ],
            r#"{"error":{"message":"Rate limit reached","type":"requests"}}"#,
        ),
        Scripted::sse(
            &sse_body(&[text_chunk("ok"), finish_chunk("stop")], true),
            &[5],
        ),
    ]);
    let started = Instant::now();
    let (res, events) = call(config(&server.base_url), &CancellationToken::new()).await;
    assert_eq!(res.unwrap().text, "ok");
    assert!(
        started.elapsed() >= Duration::from_millis(50),
        "Retry-After not honoured"
    );
    assert_eq!(server.request_count(), 2);
    let retries: Vec<_> = events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            LlmEvent::Retry {
                reason, delay_ms, ..
            } => Some((reason.clone(), *delay_ms)),
            _ => None,
        })
        .collect();
    assert_eq!(retries.len(), 1);
    assert!(retries[0].0.contains("429") && retries[0].0.contains("Rate limit reached"));
    assert!(retries[0].1 >= 50);
}

#[tokio::test]
async fn rate_limit_switches_to_backup_model() {
    let server = MockServer::start(vec![
        Scripted::status("429 Too Many Requests", &[], "slow down"),
        Scripted::sse(
            &sse_body(&[text_chunk("ok"), finish_chunk("stop")], true),
            &[50],
        ),
    ]);
    let cfg = LlmConfig {
        backup_model: Some("backup".into()),
        ..config(&server.base_url)
    };
    let (res, _) = call(cfg, &CancellationToken::new()).await;
    assert!(res.is_ok());
    assert_eq!(server.request(1)["model"], json!("backup"));
}

#[tokio::test]
async fn context_too_long_switches_to_larger_model() {
    let server = MockServer::start(vec![
        Scripted::status(
            "400 Bad Request",
            &[],
            r#"{"error":{"message":"This model's maximum context length is 8192 tokens","code":"context_length_exceeded"}}"#,
        ),
        Scripted::sse(
            &sse_body(&[text_chunk("ok"), finish_chunk("stop")], true),
            &[50],
        ),
    ]);
    let cfg = LlmConfig {
        large_context_model: Some("big".into()),
        ..config(&server.base_url)
    };
    let (res, events) = call(cfg, &CancellationToken::new()).await;
    assert!(res.is_ok());
    assert_eq!(server.request(1)["model"], json!("big"));
    assert!(events
        .lock()
        .unwrap()
        .iter()
        .any(|e| matches!(e, LlmEvent::ModelSwitch { to, .. } if to == "big")));
}

#[tokio::test]
async fn html_500_becomes_a_clear_error_after_bounded_retries() {
    let html = "<!DOCTYPE html><html><head><title>500 Internal Server Error</title></head><body><h1>Internal Server Error</h1><p>nginx</p></body></html>";
    let server = MockServer::start(vec![
        Scripted::status(
            "500 Internal Server Error",
            &[("Content-Type", "text/html")],
            html,
        ),
        Scripted::status(
            "500 Internal Server Error",
            &[("Content-Type", "text/html")],
            html,
        ),
        Scripted::status(
            "500 Internal Server Error",
            &[("Content-Type", "text/html")],
            html,
        ),
    ]);
    let (res, _) = call(config(&server.base_url), &CancellationToken::new()).await;
    let err = res.unwrap_err();
    assert_eq!(server.request_count(), 3, "1 attempt + 2 retries");
    let text = err.to_string();
    assert!(text.contains("HTTP 500"), "{text}");
    assert!(text.contains("Internal Server Error nginx"), "{text}");
    assert!(!text.contains('<'), "{text}");
}

#[tokio::test]
async fn auth_error_is_not_retried() {
    let server = MockServer::start(vec![Scripted::status(
        "401 Unauthorized",
        &[],
        r#"{"error":{"message":"Incorrect API key provided"}}"#,
    )]);
    let (res, _) = call(config(&server.base_url), &CancellationToken::new()).await;
    assert!(
        matches!(res, Err(LlmError::Http { status: 401, ref message, .. }) if message == "Incorrect API key provided")
    );
    assert_eq!(server.request_count(), 1);
}

#[tokio::test]
async fn truncated_stream_after_output_is_an_error_not_a_retry() {
    let server = MockServer::start(vec![Scripted::sse(
        &sse_body(&[text_chunk("partial ans")], false),
        &[9],
    )]);
    let (res, events) = call(config(&server.base_url), &CancellationToken::new()).await;
    assert!(matches!(res, Err(LlmError::Truncated(_))), "{res:?}");
    assert_eq!(texts(&events), "partial ans");
    assert_eq!(server.request_count(), 1);
}

#[tokio::test]
async fn truncated_stream_before_output_is_retried() {
    let server = MockServer::start(vec![
        Scripted::sse(": only a comment\n\n", &[100]),
        Scripted::sse(
            &sse_body(&[text_chunk("fine"), finish_chunk("stop")], true),
            &[3],
        ),
    ]);
    let (res, _) = call(config(&server.base_url), &CancellationToken::new()).await;
    assert_eq!(res.unwrap().text, "fine");
    assert_eq!(server.request_count(), 2);
}

#[tokio::test]
async fn bad_json_chunk_is_a_clear_error() {
    let server = MockServer::start(vec![Scripted::sse(
        "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {not json\n\n",
        &[100],
    )]);
    let (res, _) = call(config(&server.base_url), &CancellationToken::new()).await;
    let err = res.unwrap_err();
    assert!(matches!(err, LlmError::Malformed(_)), "{err:?}");
    assert!(err.to_string().contains("{not json"));
}

#[tokio::test]
async fn non_streaming_fallback() {
    let body = json!({"id":"x","model":"served","choices":[{"index":0,"message":{"role":"assistant","content":"plain answer"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2}});
    let server = MockServer::start(vec![
        Scripted::status(
            "200 OK",
            &[("Content-Type", "application/json")],
            &body.to_string(),
        ),
        Scripted::status(
            "200 OK",
            &[("Content-Type", "application/json")],
            &body.to_string(),
        ),
    ]);
    // The server ignores `stream: true` and answers JSON: still understood.
    let (res, events) = call(config(&server.base_url), &CancellationToken::new()).await;
    assert_eq!(res.unwrap().text, "plain answer");
    assert_eq!(texts(&events), "plain answer");
    // Streaming switched off: the request says so.
    let cfg = LlmConfig {
        stream: false,
        ..config(&server.base_url)
    };
    let (res, _) = call(cfg, &CancellationToken::new()).await;
    assert_eq!(res.unwrap().model, "served");
    assert!(server.request(1).get("stream").is_none());
}

#[tokio::test]
async fn cancellation_stops_mid_stream() {
    let server = MockServer::start(vec![Scripted::sse(
        &sse_body(&[text_chunk("first ")], false),
        &[1000],
    )
    .then(Duration::from_secs(20), "data: [DONE]\n\n")]);
    let cancel = CancellationToken::new();
    let client = OpenAiClient::new(config(&server.base_url)).unwrap();
    let c2 = cancel.clone();
    let sink = move |e: LlmEvent| {
        if matches!(e, LlmEvent::Text(_)) {
            c2.cancel();
        }
    };
    let req = request();
    let started = Instant::now();
    let res = client.complete(&req, &sink, &cancel).await;
    assert_eq!(res.unwrap_err(), LlmError::Cancelled);
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn connection_refused_is_retried_then_reported() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let (res, events) = call(
        config(&format!("http://127.0.0.1:{port}/v1")),
        &CancellationToken::new(),
    )
    .await;
    assert!(matches!(res, Err(LlmError::Connect(_))), "{res:?}");
    assert_eq!(
        events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| matches!(e, LlmEvent::Retry { .. }))
            .count(),
        2
    );
}

#[test]
fn dashscope_requests_mark_cache_and_disable_thinking_for_background() {
    let client = OpenAiClient::new(LlmConfig {
        base_url: "https://dashscope.aliyuncs.com/compatible-mode/v1".into(),
        ..LlmConfig::default()
    })
    .unwrap();
    let mut req = request();
    req.background = true;
    let body = client.request_body(&req, "qwen-plus");
    assert_eq!(body["enable_thinking"], json!(false));
    assert_eq!(
        body["messages"][0]["content"][0]["cache_control"],
        json!({"type":"ephemeral"})
    );
    assert_eq!(body["messages"][1]["content"][0]["text"], json!("hi"));
    // Later turns keep the marker on the user prompt; tool results stay plain strings.
    req.messages.push(Message::Assistant {
        content: String::new(),
        tool_calls: vec![shade_llm::ToolCall {
            id: "c".into(),
            name: "ls".into(),
            arguments: "{}".into(),
        }],
    });
    req.messages.push(Message::Tool {
        tool_call_id: "c".into(),
        content: "out".into(),
    });
    let body = client.request_body(&req, "qwen-plus");
    assert_eq!(
        body["messages"][1]["content"][0]["cache_control"]["type"],
        json!("ephemeral")
    );
    assert_eq!(body["messages"][2]["content"], serde_json::Value::Null);
    assert_eq!(
        body["messages"][2]["tool_calls"][0]["function"]["name"],
        json!("ls")
    );
    assert_eq!(
        body["messages"][3],
        json!({"role":"tool","tool_call_id":"c","content":"out"})
    );
    // A background fork (a suggestion) appends its own user message: the marker stays where
    // the main request had it, so the fork's prefix is the same bytes and hits the cache.
    let main = client.request_body(&req, "qwen-plus");
    let mut fork = req.clone();
    fork.prompt_id = Some("prompt_suggestion".into());
    fork.messages.push(Message::User {
        content: "[SUGGESTION MODE: …]".into(),
    });
    let forked = client.request_body(&fork, "qwen-plus");
    let n = req.messages.len();
    assert_eq!(
        forked["messages"].as_array().unwrap()[..n],
        main["messages"].as_array().unwrap()[..]
    );
    assert_eq!(
        forked["messages"][n]["content"],
        json!("[SUGGESTION MODE: …]")
    );
    // Elsewhere: plain strings, no unknown parameters.
    let plain = OpenAiClient::new(LlmConfig::default()).unwrap();
    let body = plain.request_body(&req, "gpt");
    assert!(body.get("enable_thinking").is_none());
    assert_eq!(body["messages"][0]["content"], json!("sys"));
    // vLLM serving a thinking model: the chat-template switch, only for background calls.
    let vllm = OpenAiClient::new(LlmConfig {
        thinking_param: shade_llm::config::ThinkingParam::ChatTemplateKwargs,
        ..LlmConfig::default()
    })
    .unwrap();
    let body = vllm.request_body(&req, "qwen3");
    assert_eq!(
        body["chat_template_kwargs"],
        json!({"enable_thinking": false})
    );
    req.background = false;
    assert!(vllm
        .request_body(&req, "qwen3")
        .get("chat_template_kwargs")
        .is_none());
}

#[tokio::test]
async fn error_event_in_stream_is_reported() {
    let server = MockServer::start(vec![Scripted::sse(
        "event: error\ndata: {\"error\":{\"message\":\"model crashed\"}}\n\n",
        &[10],
    )]);
    let cfg = LlmConfig {
        max_retries: 0,
        ..config(&server.base_url)
    };
    let (res, _) = call(cfg, &CancellationToken::new()).await;
    assert_eq!(res, Err(LlmError::Provider("model crashed".into())));
}
