//! `shade chat` the way a person uses it: the real binary in a real terminal (tmux), keys in,
//! the screen read back, against a local OpenAI-compatible server that streams its answers
//! and suggests the next input. Telemetry lines are checked after each outcome.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::chat::{exchange, ghost_shown, prompt_line, read_jsonl, wait_ghost, wait_prompt, Chat};
use serde_json::Value;
use shade_testkit::{is_suggestion_request, last_real_user, Reply};

/// The model: answers by the user's last input, suggests by the same.
fn router(body: &Value) -> Reply {
    let user = last_real_user(body);
    if is_suggestion_request(body) {
        let next = match user.as_str() {
            "what is in here?" => "run the tests",
            "run the tests" => "commit this",
            "commit this" => "push it",
            _ => "",
        };
        return Reply::text(next).after(Duration::from_millis(50));
    }
    match user.as_str() {
        "hello" => Reply::text("Hello! Ask me about the project."),
        "what is in here?" => {
            Reply::text("There is a README. Tip: type run the tests to check it.")
        }
        "run the tests" => Reply::text("All 3 tests pass."),
        "commit this" => Reply::text("Committed as abc123."),
        "push it" => Reply::text("Pushed."),
        "tell me a long story" => {
            Reply::text(&"once upon a time ".repeat(40)).streamed_every(Duration::from_millis(150))
        }
        other => Reply::text(&format!("You said: {other}")),
    }
}

#[test]
fn ghost_text_tab_fills_enter_submits_right_fills_typing_dismisses() {
    let chat = Chat::new(router);
    let cassette = chat.state.with_file_name("session.jsonl");
    let tty = chat.start(&["--no-speculate", "--record", cassette.to_str().unwrap()]);

    // First exchange: only one model turn so far, so no suggestion yet (the 2-turn guard).
    tty.say("hello");
    tty.wait_text("Ask me about the project.", 60);
    std::thread::sleep(Duration::from_millis(600));
    assert!(
        !chat.llm.requests().iter().any(is_suggestion_request),
        "a suggestion was requested after a single model turn"
    );

    // Second exchange: the suggestion appears as dim text in the empty prompt.
    tty.say("what is in here?");
    tty.wait_text("Tip: type run the tests", 60);
    wait_ghost(&tty, "run the tests");

    // Tab fills the input without submitting.
    tty.keys(&["Tab"]);
    let s = tty.wait_for("the filled prompt", 10, |s| {
        prompt_line(s).contains("run the tests")
    });
    assert!(
        !s.contains("All 3 tests pass."),
        "Tab must not submit:\n{s}"
    );
    assert!(
        !ghost_shown(&tty, "run the tests") || prompt_line(&tty.screen()).contains("run the tests")
    );
    // Enter submits what was filled.
    tty.keys(&["Enter"]);
    tty.wait_text("All 3 tests pass.", 60);
    let ev = chat.wait_suggestion_events(1);
    assert_eq!(ev[0]["outcome"], "accepted", "{ev:?}");
    assert_eq!(ev[0]["accept_method"], "tab");
    assert_eq!(ev[0]["similarity"], 1.0);
    assert_eq!(ev[0]["suggestion_length"], "run the tests".len());
    assert!(ev[0]["time_to_accept_ms"].is_number());
    assert!(ev[0]["prompt_id"].is_string());

    // The next suggestion: Enter on the empty prompt fills and submits it at once.
    wait_ghost(&tty, "commit this");
    tty.keys(&["Enter"]);
    tty.wait_text("Committed as abc123.", 60);
    let ev = chat.wait_suggestion_events(2);
    assert_eq!(ev[1]["outcome"], "accepted");
    assert_eq!(ev[1]["accept_method"], "enter");

    // Right fills too.
    wait_ghost(&tty, "push it");
    tty.keys(&["Right"]);
    tty.wait_for("the prompt filled by Right", 10, |s| {
        prompt_line(s).contains("push it")
    });
    let ev = chat.wait_suggestion_events(3);
    assert_eq!(ev[2]["accept_method"], "right");
    // Clear the line (Ctrl-U) and type something else instead.
    tty.keys(&["C-u"]);
    tty.say("something else");
    tty.wait_text("You said: something else", 60);
    assert!(tty.alive());

    // The main cassette holds the conversation only; suggestion calls went beside it.
    let main = read_jsonl(&cassette);
    assert_eq!(main.len(), 5, "one entry per conversation turn");
    assert!(main.iter().all(|e| e["request"]["prompt_id"].is_null()));
    let side = read_jsonl(&cassette.with_file_name("session.background.jsonl"));
    assert!(side.len() >= 3, "{side:?}");
    assert!(side
        .iter()
        .all(|e| e["request"]["prompt_id"] == "prompt_suggestion"));
    // Suggestion requests went to the fast model.
    assert!(chat
        .llm
        .requests()
        .iter()
        .filter(|r| is_suggestion_request(r))
        .all(|r| r["model"] == "fast-model"));
}

#[test]
fn typing_dismisses_and_shift_tab_does_not_accept() {
    let chat = Chat::new(router);
    let tty = chat.start(&["--no-speculate"]);
    for q in ["hello", "what is in here?"] {
        tty.say(q);
    }
    tty.wait_text("Tip: type run the tests", 60);
    wait_ghost(&tty, "run the tests");
    // Shift+Tab is not Tab (a bug the peer had): nothing is filled, nothing accepted.
    tty.keys(&["BTab"]);
    std::thread::sleep(Duration::from_millis(400));
    assert!(
        !prompt_line(&tty.screen()).contains("run the tests") || ghost_shown(&tty, "run the tests"),
        "Shift+Tab filled the suggestion:\n{}",
        tty.screen_styled()
    );
    assert!(
        chat.suggestion_events().is_empty(),
        "{:?}",
        chat.suggestion_events()
    );
    // Typing dismisses: the ghost text goes away and the outcome is `ignored`.
    tty.type_text("x");
    let ev = chat.wait_suggestion_events(1);
    assert_eq!(ev[0]["outcome"], "ignored", "{ev:?}");
    assert_eq!(ev[0]["similarity"], 0.0);
    assert!(ev[0]["time_to_ignore_ms"].is_number());
    assert!(!ghost_shown(&tty, "run the tests"));
    // An Enter right after the typed character submits the typed text, not the suggestion
    // (the peer's Enter race).
    tty.say("yz");
    tty.wait_text("You said: xyz", 60);
}

#[test]
fn ctrl_c_cancels_a_streaming_turn_and_the_session_goes_on() {
    let chat = Chat::new(router);
    let tty = chat.start(&["--no-speculate"]);
    tty.say("tell me a long story");
    tty.wait_text("once upon a time once upon", 60);
    tty.keys(&["C-c"]);
    tty.wait_text("(cancelled)", 60);
    wait_prompt(&tty);
    assert!(tty.alive(), "Ctrl-C during a turn must not end the session");
    exchange(&tty, "hello", "Ask me about the project.");
    // Ctrl-C twice on an empty line leaves.
    tty.keys(&["C-c"]);
    tty.wait_text("press Ctrl-C again to exit", 60);
    tty.keys(&["C-c"]);
    for _ in 0..1200 {
        if !tty.alive() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!(
        "two Ctrl-C on an empty line did not exit:\n{}",
        tty.screen()
    );
}

#[test]
fn slash_commands_complete_and_work() {
    let chat = Chat::new(router);
    let tty = chat.start(&["--no-speculate"]);
    tty.type_text("/sta");
    tty.keys(&["Tab"]);
    tty.wait_for("/stats completed", 10, |s| {
        prompt_line(s).contains("/stats")
    });
    tty.keys(&["Enter"]);
    tty.wait_text("no model calls yet", 60);
    wait_prompt(&tty);
    exchange(&tty, "hello", "Ask me about the project.");
    exchange(&tty, "/stats", "background work");
    exchange(&tty, "/approval yolo", "shade [yolo]");
    exchange(&tty, "/model --fast tiny", "fast model: tiny");
    tty.say("/exit");
    for _ in 0..1200 {
        if !tty.alive() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("/exit did not exit");
}

/// `@` completes project paths with Tab (into directories, then the file), the mention is
/// attached for the model and said on screen; `!command` runs and shows its output, and the
/// model then sees it.
#[test]
fn at_mentions_complete_and_bang_commands_run() {
    let chat = Chat::new(router);
    std::fs::create_dir(chat.project.join("src")).unwrap();
    std::fs::write(
        chat.project.join("src/lib.rs"),
        "pub fn one() -> u8 { 1 }\n",
    )
    .unwrap();
    let tty = chat.start(&["--no-speculate", "--no-suggest"]);
    wait_prompt(&tty);
    tty.type_text("explain @sr");
    tty.keys(&["Tab"]);
    tty.wait_for("@src/ completed", 30, |s| {
        prompt_line(s).ends_with("explain @src/")
    });
    tty.type_text("li");
    tty.keys(&["Tab"]);
    tty.wait_for("@src/lib.rs completed", 30, |s| {
        prompt_line(s).contains("explain @src/lib.rs")
    });
    tty.keys(&["Enter"]);
    tty.wait_text("  @ src/lib.rs (1 line)", 60);
    tty.wait_text("You said: explain @src/lib.rs", 60);
    let sent = chat.llm.requests();
    let user = sent.last().unwrap()["messages"][1]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        user.contains("<file path=\"src/lib.rs\">\npub fn one() -> u8 { 1 }\n</file>"),
        "{user}"
    );
    wait_prompt(&tty);
    tty.say("!echo typed-by-$USER-hand | tr a-z A-Z");
    tty.wait_text("TYPED-BY-", 60);
    tty.wait_text("Exit code: 0", 60);
    wait_prompt(&tty);
    tty.say("what did I run?");
    tty.wait_text("You said: what did I run?", 60);
    let sent = chat.llm.requests();
    let msgs = sent.last().unwrap()["messages"].as_array().unwrap().clone();
    assert!(
        msgs.iter().any(|m| m["content"]
            .as_str()
            .is_some_and(|c| c.contains("$ echo typed-by-$USER-hand") && c.contains("TYPED-BY-"))),
        "{msgs:?}"
    );
    // Ctrl-C stops a command of the user's that would outlast the wait below, and the
    // session goes on.
    wait_prompt(&tty);
    tty.type_text("!touch started.flag; sleep 600; echo never-printed");
    tty.keys(&["Enter"]);
    common::wait_until("the command to start", 60, || {
        chat.exists_in_session("started.flag")
    });
    tty.keys(&["C-c"]);
    tty.wait_text("(cancelled)", 60);
    wait_prompt(&tty);
    // (The typed line holds the words; the output would be a line of its own.)
    assert!(!tty.screen().lines().any(|l| l.trim() == "never-printed"));
    assert!(tty.alive());
}

/// A conversation left with Ctrl-D is picked up with `--continue` in a new terminal: the
/// screen says which one and how it ended, and the next turn carries the earlier exchange.
#[test]
fn continue_picks_the_last_conversation_up_in_a_new_terminal() {
    let chat = Chat::new(router);
    let tty = chat.start(&["--no-speculate", "--no-suggest"]);
    exchange(&tty, "hello", "Ask me about the project.");
    tty.keys(&["C-d"]);
    common::wait_until("the first session to end", 60, || !tty.alive());
    drop(tty);

    let tty = chat.start(&["--no-speculate", "--no-suggest", "--continue"]);
    tty.wait_text("resumed conversation", 60);
    tty.wait_text("last answer: Hello! Ask me about the project.", 60);
    tty.say("what is in here?");
    tty.wait_text("There is a README.", 60);
    let sent = chat.llm.requests();
    let msgs = sent.last().unwrap()["messages"].as_array().unwrap().clone();
    let texts: Vec<&str> = msgs
        .iter()
        .map(|m| m["content"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        texts[1..],
        [
            "hello",
            "Hello! Ask me about the project.",
            "what is in here?"
        ]
    );
}
