//! A tiny HTTP/1.1 server on 127.0.0.1 that plays scripted responses (written byte for byte,
//! with pauses) and records the requests it got: the real wire protocol, no network.
#![allow(dead_code, clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// One scripted response: raw pieces written in order, with a pause before each.
#[derive(Clone)]
pub struct Scripted {
    pub pieces: Vec<(Duration, Vec<u8>)>,
}

impl Scripted {
    /// An SSE response whose body is `body`, cut into the given piece sizes (cycled).
    pub fn sse(body: &str, cuts: &[usize]) -> Self {
        let mut pieces = vec![(
            Duration::ZERO,
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n".to_vec(),
        )];
        let bytes = body.as_bytes();
        let mut i = 0;
        let mut k = 0;
        while i < bytes.len() {
            let n = cuts[k % cuts.len()].max(1).min(bytes.len() - i);
            pieces.push((Duration::ZERO, bytes[i..i + n].to_vec()));
            i += n;
            k += 1;
        }
        Self { pieces }
    }

    /// A complete response with a status line, headers and body.
    pub fn status(status: &str, headers: &[(&str, &str)], body: &str) -> Self {
        let mut head = format!(
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n",
            body.len()
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        head.push_str(body);
        Self {
            pieces: vec![(Duration::ZERO, head.into_bytes())],
        }
    }

    /// Append a pause then more bytes.
    pub fn then(mut self, pause: Duration, bytes: &str) -> Self {
        self.pieces.push((pause, bytes.as_bytes().to_vec()));
        self
    }
}

/// The server handle.
pub struct MockServer {
    pub base_url: String,
    pub requests: Arc<Mutex<Vec<serde_json::Value>>>,
    /// The request bodies as sent, byte for byte.
    pub raw: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl MockServer {
    /// Serve `script` to consecutive chat-completion POSTs; extra connections get a 599 error.
    pub fn start(script: Vec<Scripted>) -> Self {
        Self::start_with(script, true)
    }

    /// Serve `script` to consecutive requests of any method and path (web_fetch tests).
    pub fn start_get(script: Vec<Scripted>) -> Self {
        Self::start_with(script, false)
    }

    fn start_with(script: Vec<Scripted>, chat: bool) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let reqs = requests.clone();
        let raw = Arc::new(Mutex::new(Vec::new()));
        let raws = raw.clone();
        thread::spawn(move || {
            let mut script = script.into_iter();
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                let (body, bytes) = read_request(&mut conn, chat);
                reqs.lock().unwrap().push(body);
                raws.lock().unwrap().push(bytes);
                let resp = script.next().unwrap_or_else(|| {
                    Scripted::status("599 Unscripted", &[], "no more scripted responses")
                });
                thread::spawn(move || {
                    for (pause, bytes) in resp.pieces {
                        thread::sleep(pause);
                        if conn.write_all(&bytes).is_err() || conn.flush().is_err() {
                            return;
                        }
                    }
                    let _ = conn.shutdown(std::net::Shutdown::Both);
                });
            }
        });
        Self {
            base_url: format!("http://{addr}/v1"),
            requests,
            raw,
        }
    }

    pub fn request_count(&self) -> usize {
        self.requests.lock().unwrap().len()
    }

    pub fn request(&self, i: usize) -> serde_json::Value {
        self.requests.lock().unwrap()[i].clone()
    }
}

fn read_request(conn: &mut TcpStream, chat: bool) -> (serde_json::Value, Vec<u8>) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut len = 0usize;
    let mut first = true;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return (serde_json::Value::Null, Vec::new());
        }
        if first && chat {
            assert!(
                line.starts_with("POST /v1/chat/completions "),
                "unexpected request line {line:?}"
            );
            first = false;
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().unwrap();
            }
        }
    }
    let mut body = vec![0; len];
    reader.read_exact(&mut body).unwrap();
    let value = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
    (value, body)
}

/// `data: {json}\n\n` for each chunk, then `data: [DONE]`.
pub fn sse_body(chunks: &[serde_json::Value], done: bool) -> String {
    let mut s = String::from(": keep-alive\n\n");
    for c in chunks {
        s.push_str(&format!("data: {c}\n\n"));
    }
    if done {
        s.push_str("data: [DONE]\n\n");
    }
    s
}

/// A text delta chunk.
pub fn text_chunk(t: &str) -> serde_json::Value {
    serde_json::json!({"id":"x","object":"chat.completion.chunk","model":"served-model","choices":[{"index":0,"delta":{"content":t},"finish_reason":null}]})
}

/// A finish chunk.
pub fn finish_chunk(reason: &str) -> serde_json::Value {
    serde_json::json!({"id":"x","choices":[{"index":0,"delta":{},"finish_reason":reason}]})
}
