//! A local stand-in for an OpenAI-compatible chat server, for tests and benchmarks: the LLM
//! service is the one part that cannot be reached from here. It speaks the real wire protocol
//! (HTTP/1.1, `POST /v1/chat/completions`, SSE chunks with text and tool-call deltas, usage,
//! `[DONE]`), answers each request from a routing function, so that concurrent requests
//! (a conversation, its suggestion, a speculation) each get their own answer whatever the
//! order they arrive in, and can be made slow on purpose.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use serde_json::{json, Value};

/// One answer of the fake model.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reply {
    /// Wait before the response headers (time to first byte).
    pub delay: Duration,
    /// Text deltas, streamed in order.
    pub chunks: Vec<String>,
    /// Wait before each text delta.
    pub chunk_delay: Duration,
    /// Tool calls: (name, JSON arguments).
    pub tool_calls: Vec<(String, Value)>,
    /// Prompt tokens reported in the usage chunk (cached tokens: half of them).
    pub prompt_tokens: u64,
    /// Answer with this HTTP error status and message instead.
    pub error: Option<(u16, String)>,
    /// `reasoning_content` deltas streamed before the text (as vLLM and llama.cpp send a
    /// thinking model's reasoning).
    pub reasoning: Vec<String>,
    /// Send no `usage` chunk (as some local servers do).
    pub no_usage: bool,
}

impl Reply {
    /// A text answer streamed word by word.
    pub fn text(text: &str) -> Self {
        let mut chunks = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            let cut = rest[1..].find(' ').map(|i| i + 1).unwrap_or(rest.len());
            chunks.push(rest[..cut].to_string());
            rest = &rest[cut..];
        }
        Self {
            chunks,
            prompt_tokens: 100,
            ..Self::default()
        }
    }

    /// A tool call (with optional text before it).
    pub fn tool(name: &str, args: Value) -> Self {
        Self {
            tool_calls: vec![(name.to_string(), args)],
            prompt_tokens: 100,
            ..Self::default()
        }
    }

    /// Add another tool call to the same answer.
    pub fn and_tool(mut self, name: &str, args: Value) -> Self {
        self.tool_calls.push((name.to_string(), args));
        self
    }

    /// An HTTP error.
    pub fn error(status: u16, message: &str) -> Self {
        Self {
            error: Some((status, message.to_string())),
            ..Self::default()
        }
    }

    /// The same answer after `delay`.
    pub fn after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// The same answer with `reasoning` streamed first as `reasoning_content` deltas.
    pub fn reasoning(mut self, reasoning: &str) -> Self {
        self.reasoning = reasoning.split_inclusive(' ').map(str::to_string).collect();
        self
    }

    /// The same answer without a `usage` chunk.
    pub fn without_usage(mut self) -> Self {
        self.no_usage = true;
        self
    }

    /// The same answer with `delay` before each text delta.
    pub fn streamed_every(mut self, delay: Duration) -> Self {
        self.chunk_delay = delay;
        self
    }
}

/// Decides the answer to one request body.
pub type Router = Arc<dyn Fn(&Value) -> Reply + Send + Sync>;

/// A running fake server; it stops accepting when dropped.
pub struct FakeLlm {
    /// `http://127.0.0.1:PORT/v1`.
    pub base_url: String,
    requests: Arc<Mutex<Vec<Value>>>,
    stop: Arc<AtomicBool>,
    port: u16,
}

impl FakeLlm {
    /// Serve on an ephemeral loopback port.
    pub fn start(router: Router) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (reqs, halt) = (requests.clone(), stop.clone());
        thread::spawn(move || {
            let mut seq = 0u64;
            for conn in listener.incoming() {
                if halt.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                seq += 1;
                let (router, reqs) = (router.clone(), reqs.clone());
                thread::spawn(move || serve(conn, seq, &router, &reqs));
            }
        });
        Ok(Self {
            base_url: format!("http://127.0.0.1:{port}/v1"),
            requests,
            stop,
            port,
        })
    }

    /// Every request body received so far, in arrival order.
    pub fn requests(&self) -> Vec<Value> {
        self.requests.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

impl Drop for FakeLlm {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn serve(mut conn: TcpStream, seq: u64, router: &Router, reqs: &Mutex<Vec<Value>>) {
    let Some(body) = read_request(&conn) else {
        return;
    };
    if let Ok(mut r) = reqs.lock() {
        r.push(body.clone());
    }
    let reply = router(&body);
    thread::sleep(reply.delay);
    if let Some((status, message)) = &reply.error {
        let body = json!({"error": {"message": message, "type": "fake_error"}}).to_string();
        let _ = write!(
            conn,
            "HTTP/1.1 {status} Error\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        return;
    }
    let model = body["model"].as_str().unwrap_or("fake").to_string();
    let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n";
    if conn.write_all(head.as_bytes()).is_err() {
        return;
    }
    let id = format!("chatcmpl-{seq}");
    let send = |conn: &mut TcpStream, delta: Value, finish: Value| -> bool {
        let chunk = json!({"id": id, "object": "chat.completion.chunk", "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
        conn.write_all(format!("data: {chunk}\n\n").as_bytes())
            .is_ok()
            && conn.flush().is_ok()
    };
    for text in &reply.reasoning {
        if !send(&mut conn, json!({"reasoning_content": text}), Value::Null) {
            return;
        }
    }
    for text in &reply.chunks {
        thread::sleep(reply.chunk_delay);
        if !send(&mut conn, json!({"content": text}), Value::Null) {
            return; // the client went away (cancelled)
        }
    }
    for (i, (name, args)) in reply.tool_calls.iter().enumerate() {
        let delta = json!({"tool_calls": [{"index": i, "id": format!("call_{seq}_{i}"), "type": "function",
            "function": {"name": name, "arguments": args.to_string()}}]});
        if !send(&mut conn, delta, Value::Null) {
            return;
        }
    }
    let finish = if reply.tool_calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    };
    if !send(&mut conn, json!({}), json!(finish)) {
        return;
    }
    if reply.no_usage {
        let _ = conn.write_all(b"data: [DONE]\n\n");
        let _ = conn.flush();
        return;
    }
    let usage = json!({"id": id, "object": "chat.completion.chunk", "model": model, "choices": [],
        "usage": {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.chunks.len() as u64 + 1,
                  "prompt_tokens_details": {"cached_tokens": reply.prompt_tokens / 2}}});
    let _ = conn.write_all(format!("data: {usage}\n\ndata: [DONE]\n\n").as_bytes());
    let _ = conn.flush();
}

fn read_request(conn: &TcpStream) -> Option<Value> {
    let mut reader = BufReader::new(conn.try_clone().ok()?);
    let mut len = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().ok()?;
            }
        }
    }
    let mut body = vec![0; len];
    reader.read_exact(&mut body).ok()?;
    serde_json::from_slice(&body).ok()
}

/// The text of a message's `content`, whether a string or an array of text parts.
pub fn content_text(message: &Value) -> String {
    match &message["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

/// The last user message of a request body.
pub fn last_user(body: &Value) -> String {
    body["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .map(content_text)
        .unwrap_or_default()
}

/// The last user message that is not a background instruction (suggestion prompts start
/// with `[SUGGESTION MODE`): the user's own last input.
pub fn last_real_user(body: &Value) -> String {
    body["messages"]
        .as_array()
        .and_then(|m| {
            m.iter()
                .rev()
                .filter(|m| m["role"] == "user")
                .map(content_text)
                .find(|t| !is_suggestion_prompt(t))
        })
        .unwrap_or_default()
}

/// Is this the suggestion prompt (or a pipelined one, which ends with it)?
pub fn is_suggestion_prompt(text: &str) -> bool {
    text.contains("[SUGGESTION MODE")
}

/// Does this request ask for a suggestion?
pub fn is_suggestion_request(body: &Value) -> bool {
    is_suggestion_prompt(&last_user(body))
}

/// How many tool results follow the last user message (the step within a turn).
pub fn tool_results_since_user(body: &Value) -> usize {
    body["messages"]
        .as_array()
        .map(|m| {
            m.iter()
                .rev()
                .take_while(|m| m["role"] != "user")
                .filter(|m| m["role"] == "tool")
                .count()
        })
        .unwrap_or(0)
}

/// The content of the last message if it is a tool result.
pub fn last_tool_result(body: &Value) -> Option<String> {
    body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .filter(|m| m["role"] == "tool")
        .map(content_text)
}
