//! `shade exec` gives its tools the fast model for background work: an edit repaired by the
//! model is recorded in the side cassette (never the main one) and replayed from it.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::Write;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Output, Stdio};
use std::sync::{Arc, Mutex};

use common::cmd::{read_request, shade_in};

/// Serve `bodies` (SSE event payloads, one response each) to consecutive requests; the
/// request bodies come back through the handle.
fn scripted(bodies: Vec<Vec<serde_json::Value>>) -> (String, Arc<Mutex<Vec<serde_json::Value>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    std::thread::spawn(move || {
        for (conn, events) in listener.incoming().zip(bodies) {
            let mut conn = conn.unwrap();
            let (_, body) = read_request(&conn);
            seen2
                .lock()
                .unwrap()
                .push(serde_json::from_slice(&body).unwrap());
            let mut sse = String::from(
                "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n",
            );
            for e in events {
                sse.push_str(&format!("data: {e}\n\n"));
            }
            sse.push_str("data: [DONE]\n\n");
            conn.write_all(sse.as_bytes()).unwrap();
        }
    });
    (url, seen)
}

fn text(t: &str) -> Vec<serde_json::Value> {
    vec![serde_json::json!({"choices":[{"index":0,"delta":{"content":t},"finish_reason":"stop"}]})]
}

fn exec(dir: &Path, config: &Path, args: &[&str]) -> Output {
    shade_in("exec", dir, config)
        .args(args)
        .env("SHADE_STATE_DIR", config.join("state"))
        .env("SHADE_FAST_MODEL", "fast-model")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn background_repair_is_recorded_beside_the_cassette_and_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let config = tempfile::tempdir().unwrap();
    let file = dir.path().join("calc.py");
    let before = "def f(x):\n    return x + 1\n";
    std::fs::write(&file, before).unwrap();
    let args = serde_json::json!({"path": "calc.py", "old_string": "retrun x + 1", "new_string": "return x + 2"});
    let call = vec![
        serde_json::json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"edit","arguments":args.to_string()}}]},"finish_reason":"tool_calls"}]}),
    ];
    let (url, seen) = scripted(vec![
        call,
        text(r#"{"old_string": "return x + 1", "new_string": "return x + 2"}"#),
        text("Changed f to add 2."),
    ]);
    let cassette = config.path().join("run.jsonl");
    let out = exec(
        dir.path(),
        config.path(),
        &[
            "--approval",
            "yolo",
            "--base-url",
            &url,
            "--model",
            "main-model",
            "--record",
            cassette.to_str().unwrap(),
            "make f add 2",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "def f(x):\n    return x + 2\n"
    );
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3);
    assert_eq!(seen[0]["model"], "main-model");
    assert_eq!(seen[1]["model"], "fast-model");
    assert!(seen[1].get("tools").is_none());
    assert_eq!(seen[2]["model"], "main-model");
    // The main cassette holds the conversation only; the repair sits beside it.
    let main = std::fs::read_to_string(&cassette).unwrap();
    assert_eq!(main.lines().count(), 2);
    assert!(!main.contains("edit_correction"));
    let side = std::fs::read_to_string(config.path().join("run.background.jsonl")).unwrap();
    assert_eq!(side.lines().count(), 1);
    assert!(side.contains("\"prompt_id\":\"edit_correction\""), "{side}");

    std::fs::write(&file, before).unwrap();
    let again = exec(
        dir.path(),
        config.path(),
        &[
            "--approval",
            "yolo",
            "--llm",
            &format!("replay:{}", cassette.display()),
            "make f add 2",
        ],
    );
    let err = String::from_utf8_lossy(&again.stderr);
    assert_eq!(again.status.code(), Some(0), "{err}");
    assert!(String::from_utf8_lossy(&again.stdout).contains("repaired"));
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "def f(x):\n    return x + 2\n"
    );
}
