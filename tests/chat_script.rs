//! `shade chat` without a terminal: prompts from stdin, one turn each, one conversation;
//! background calls never reach the main cassette.
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;

use serde_json::Value;
use shade_testkit::{is_suggestion_request, last_real_user, FakeLlm, Reply};

fn router(body: &Value) -> Reply {
    if is_suggestion_request(body) {
        return Reply::text("run the tests");
    }
    match last_real_user(body).as_str() {
        "first" => Reply::text("One."),
        "second" => Reply::text("Two."),
        other => Reply::text(&format!("You said: {other}")),
    }
}

#[test]
fn stdin_lines_are_turns_of_one_conversation_and_recording_keeps_only_them() {
    let llm = FakeLlm::start(Arc::new(router)).unwrap();
    let home = tempfile::tempdir().unwrap();
    let cassette = home.path().join("run.jsonl");
    let mut child = Command::new(env!("CARGO_BIN_EXE_shade"))
        .args(["chat", "--record"])
        .arg(&cassette)
        .current_dir(home.path())
        .env("HOME", home.path())
        .env("XDG_CONFIG_HOME", home.path().join("config"))
        .env("SHADE_STATE_DIR", home.path().join("state"))
        .env("OPENAI_BASE_URL", &llm.base_url)
        .env("SHADE_MODEL", "main-model")
        .env_remove("SHADE_FAST_MODEL")
        .env_remove("SHADE_CONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"first\n\nsecond\n/stats\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("One.") && stdout.contains("Two."),
        "{stdout}"
    );
    assert!(
        stdout.contains("main-model"),
        "/stats output missing:\n{stdout}"
    );
    let requests = llm.requests();
    // Without a terminal there are no suggestions (the interactivity guard).
    assert!(!requests.iter().any(is_suggestion_request));
    assert_eq!(requests.len(), 2);
    // The second turn carries the first exchange: one conversation.
    let msgs = requests[1]["messages"].as_array().unwrap();
    let roles: Vec<&str> = msgs.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "user"]);
    assert_eq!(msgs[2]["content"], "One.");
    // The cassette replays the same session offline.
    let replay = Command::new(env!("CARGO_BIN_EXE_shade"))
        .arg("chat")
        .arg("--llm")
        .arg(format!("replay:{}", cassette.display()))
        .current_dir(home.path())
        .env("HOME", home.path())
        .env("XDG_CONFIG_HOME", home.path().join("config"))
        .env("SHADE_STATE_DIR", home.path().join("state"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut replay = replay;
    replay
        .stdin
        .take()
        .unwrap()
        .write_all(b"first\nsecond\n")
        .unwrap();
    let out = replay.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains("Two."), "{stdout}");
}
