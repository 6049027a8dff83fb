//! The flows of `shade chat` a daily user of a coding agent meets, in a real terminal (tmux)
//! against the real binary and a local OpenAI-compatible server: inline approvals (yes, no,
//! always, Ctrl-C), a speculation accepted where the approval mode asks, compaction by hand
//! and at the threshold, Ctrl-C while an accepted speculation still runs, and a model server
//! that cannot be reached. Files on disk are checked after each answer.
#![allow(clippy::unwrap_used)]

mod common;

use common::wait_until;

use std::time::Duration;

use common::chat::{wait_ghost, wait_prompt, Chat};
use common::tty::Tty;
use serde_json::{json, Value};
use shade_testkit::{
    is_suggestion_request, last_real_user, last_tool_result, tool_results_since_user, Reply,
};

fn read(chat: &Chat, rel: &str) -> String {
    std::fs::read_to_string(chat.project.join(rel)).unwrap()
}

const QUESTION: &str = "allow the agent to";

/// How often the approval question was asked in the whole session so far.
fn questions(tty: &Tty) -> usize {
    tty.history().matches(QUESTION).count()
}

/// The main model's requests for `user`'s turn (suggestions left out).
fn turn_requests(chat: &Chat, user: &str) -> Vec<Value> {
    chat.llm
        .requests()
        .into_iter()
        .filter(|r| !is_suggestion_request(r) && last_real_user(r) == user)
        .collect()
}

fn approvals_model(body: &Value) -> Reply {
    if is_suggestion_request(body) {
        return Reply::text("");
    }
    let user = last_real_user(body);
    let step = tool_results_since_user(body);
    let result = last_tool_result(body).unwrap_or_default();
    match (user.as_str(), step) {
        ("fix the readme", 0) => Reply::tool(
            "edit",
            json!({"path": "README", "old_string": "a project", "new_string": "the project"}),
        ),
        ("fix the readme", 1) => {
            Reply::tool("write_file", json!({"path": "NEW.md", "content": "new\n"}))
        }
        ("fix the readme", _) if result.contains("declined") => {
            Reply::text("Understood: NEW.md was not created.")
        }
        ("fix the readme", _) => Reply::text("Created NEW.md."),
        ("number the lines", 0) => Reply::tool(
            "edit",
            json!({"path": "README", "old_string": "the project", "new_string": "1 the project"}),
        ),
        ("number the lines", 1) => Reply::tool(
            "edit",
            json!({"path": "README", "old_string": "1 the project\n", "new_string": "1 the project\n2 more\n"}),
        ),
        ("number the lines", _) => Reply::text("Numbered both lines."),
        ("run the script", 0) => Reply::tool("shell", json!({"command": "echo ran > out.txt"})),
        ("run the script", _) => Reply::text(&format!("The script said: {}", result.trim())),
        ("write a draft", 0) => Reply::tool(
            "write_file",
            json!({"path": "DRAFT.md", "content": "draft\n"}),
        ),
        ("write a draft", _) => Reply::text("Wrote the draft."),
        ("think hard", _) => Reply::text("Thought it over.").after(Duration::from_secs(5)),
        (other, _) => Reply::text(&format!("You said: {other}")),
    }
}

#[test]
fn approvals_yes_no_always_and_ctrl_c() {
    common::require_fuse_root();
    let chat = Chat::new(approvals_model);
    let tty = chat.start(&["--no-speculate", "--no-suggest"]);
    tty.say("fix the readme");
    // The edit asks, with its diff in colour before the question.
    tty.wait_text(QUESTION, 60);
    let s = tty.screen();
    assert!(
        s.contains("-a project") && s.contains("+the project"),
        "{s}"
    );
    assert!(
        tty.screen_styled().contains("\x1b[32m+the project"),
        "{}",
        tty.screen_styled()
    );
    assert_eq!(
        read(&chat, "README"),
        "a project\n",
        "written before the answer"
    );
    tty.keys(&["y"]);
    // The write asks next, a new file's diff as git shows it: refuse it.
    tty.wait_for("the second question", 60, |_| questions(&tty) == 2);
    assert!(
        tty.screen().contains("--- /dev/null\n+++ b/NEW.md\n"),
        "{}",
        tty.screen()
    );
    assert_eq!(read(&chat, "README"), "the project\n");
    tty.keys(&["n"]);
    tty.wait_text("Understood: NEW.md was not created.", 60);
    wait_prompt(&tty);
    assert!(!chat.project.join("NEW.md").exists());
    // The model was told the user declined.
    let refused = turn_requests(&chat, "fix the readme");
    assert!(
        last_tool_result(refused.last().unwrap())
            .unwrap()
            .contains("declined"),
        "{refused:?}"
    );

    // "always" for edit: the second edit of the turn runs without a question.
    tty.say("number the lines");
    tty.wait_for("the third question", 60, |_| questions(&tty) == 3);
    tty.keys(&["a"]);
    tty.wait_text("Numbered both lines.", 60);
    wait_prompt(&tty);
    assert_eq!(
        questions(&tty),
        3,
        "asked again after always:\n{}",
        tty.history()
    );
    assert_eq!(read(&chat, "README"), "1 the project\n2 more\n");

    // A writing shell command asks too; yes runs it.
    tty.say("run the script");
    tty.wait_for("the shell question", 60, |_| questions(&tty) == 4);
    assert!(
        tty.screen().contains("echo ran > out.txt"),
        "{}",
        tty.screen()
    );
    assert!(!chat.project.join("out.txt").exists());
    tty.keys(&["y"]);
    tty.wait_text("The script said:", 60);
    wait_prompt(&tty);
    assert_eq!(read(&chat, "out.txt"), "ran\n");

    // Ctrl-C at the question cancels the turn: nothing written, the session goes on.
    tty.say("write a draft");
    tty.wait_for("the draft question", 60, |_| questions(&tty) == 5);
    tty.keys(&["C-c"]);
    tty.wait_text("(cancelled)", 60);
    wait_prompt(&tty);
    assert!(!chat.project.join("DRAFT.md").exists());
    assert!(tty.alive());
    tty.say("hello");
    tty.wait_text("You said: hello", 60);
    wait_prompt(&tty);
    // The cancelled call still got its result, so the next request is well-formed.
    let next = turn_requests(&chat, "hello");
    let messages = next[0]["messages"].as_array().unwrap();
    let calls: Vec<&Value> = messages
        .iter()
        .filter_map(|m| m["tool_calls"].as_array())
        .flatten()
        .collect();
    let results = messages.iter().filter(|m| m["role"] == "tool").count();
    assert_eq!(calls.len(), results, "{messages:#?}");

    // A slow model: the wait shows, and goes once the answer comes.
    tty.say("think hard");
    tty.wait_text("⋯ waiting for main-model", 60);
    tty.wait_text("Thought it over.", 60);
    let s = wait_prompt(&tty);
    assert!(!s.contains("waiting for"), "{s}");
}

const BUGGY: &str = "#!/bin/sh\n# add two numbers\necho $(( $1 - $2 ))\n";
const FIXED: &str = "#!/bin/sh\n# add two numbers\necho $(( $1 + $2 ))\n";
const TEST: &str = "#!/bin/sh\n[ \"$(./add.sh 2 3)\" = 5 ] && echo PASS || echo FAIL\n";

/// A model whose suggestion, once speculated, edits add.sh and runs the test script.
fn fixing_model(body: &Value) -> Reply {
    let user = last_real_user(body);
    if is_suggestion_request(body) {
        if shade_testkit::last_user(body).contains("The user just said") {
            return Reply::text("commit this");
        }
        return Reply::text(match user.as_str() {
            "what is wrong?" => "fix it and run the tests",
            _ => "",
        });
    }
    let step = tool_results_since_user(body);
    let reply = match (user.as_str(), step) {
        ("hello", _) => Reply::text("Hello."),
        ("what is wrong?", _) => Reply::text("add.sh subtracts instead of adding."),
        ("fix it and run the tests", 0) => Reply::tool(
            "edit",
            json!({"path": "add.sh", "old_string": "$1 - $2", "new_string": "$1 + $2"}),
        ),
        ("fix it and run the tests", 1) => Reply::tool(
            "shell",
            json!({"command": "./test.sh > result.txt; cat result.txt"}),
        ),
        ("fix it and run the tests", _) => Reply::text("Fixed add.sh; the test passes."),
        ("touch the readme", 0) => Reply::tool(
            "edit",
            json!({"path": "README", "old_string": "a project", "new_string": "the project"}),
        ),
        ("touch the readme", 1) => {
            Reply::tool("shell", json!({"command": "echo touched > touched.txt"}))
        }
        ("touch the readme", _) => Reply::text("Touched."),
        (other, _) => Reply::text(&format!("You said: {other}")),
    };
    reply.after(Duration::from_millis(200))
}

fn fixing_project(router: fn(&Value) -> Reply) -> Chat {
    common::require_fuse_root();
    let chat = Chat::new(router);
    let p = &chat.project;
    std::fs::write(p.join("add.sh"), BUGGY).unwrap();
    std::fs::write(p.join("test.sh"), TEST).unwrap();
    for f in ["add.sh", "test.sh"] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(p.join(f), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    chat
}

fn speculation_requests(chat: &Chat, user: &str, step: usize) -> usize {
    chat.llm
        .requests()
        .iter()
        .filter(|r| {
            !is_suggestion_request(r)
                && last_real_user(r) == user
                && tool_results_since_user(r) == step
                && r["model"] == "fast-model"
        })
        .count()
}

/// Two exchanges, then the suggestion shows and its speculation finishes its turn.
fn until_speculated(chat: &Chat, flags: &[&str]) -> Tty {
    let tty = chat.start(flags);
    tty.say("hello");
    tty.wait_text("Hello.", 60);
    tty.say("what is wrong?");
    tty.wait_text("subtracts instead of adding", 60);
    wait_ghost(&tty, "fix it and run the tests");
    wait_until("the speculated answer", 60, || {
        speculation_requests(chat, "fix it and run the tests", 2) == 1
    });
    tty
}

const WRITE_QUESTION: &str = "write these changes into the project?";

#[test]
fn a_speculation_accepted_in_default_mode_asks_once_and_yes_writes_it() {
    let chat = fixing_project(fixing_model);
    let tty = until_speculated(&chat, &[]);
    tty.keys(&["Enter"]);
    // What it did, then its changeset with the diff, then one question.
    let s = tty.wait_text(WRITE_QUESTION, 60);
    assert!(s.contains("✓ Edited add.sh"), "{s}");
    assert!(s.contains("the test passes."), "{s}");
    assert!(s.contains("M add.sh") && s.contains("A result.txt"), "{s}");
    assert!(
        s.contains("+echo $(( $1 + $2 ))") && s.contains("+PASS"),
        "{s}"
    );
    assert!(
        tty.screen_styled().contains("\x1b[32m+echo $(( $1 + $2 ))"),
        "the diff is not coloured:\n{}",
        tty.screen_styled()
    );
    assert_eq!(read(&chat, "add.sh"), BUGGY, "written before the answer");
    tty.keys(&["y"]);
    tty.wait_text("2 changes written", 60);
    wait_prompt(&tty);
    assert_eq!(read(&chat, "add.sh"), FIXED);
    assert_eq!(read(&chat, "result.txt"), "PASS\n");
    let h = tty.history();
    assert_eq!(h.matches(WRITE_QUESTION).count(), 1, "{h}");
    assert_eq!(questions(&tty), 0, "a live question was asked too:\n{h}");
    // Nothing ran live.
    assert!(turn_requests(&chat, "fix it and run the tests")
        .iter()
        .all(|r| r["model"] == "fast-model"));
    // The next suggestion shows at once (the speculation computed it).
    wait_ghost(&tty, "commit this");
    tty.keys(&["C-d"]);
    wait_until("the session to end", 60, || !tty.alive());
    chat.assert_nothing_left();
}

#[test]
fn no_to_a_speculation_writes_nothing_and_runs_nothing() {
    let chat = fixing_project(fixing_model);
    let tty = until_speculated(&chat, &[]);
    tty.keys(&["Enter"]);
    tty.wait_text(WRITE_QUESTION, 60);
    tty.keys(&["n"]);
    tty.wait_text("nothing written", 60);
    wait_prompt(&tty);
    assert_eq!(read(&chat, "add.sh"), BUGGY);
    assert!(!chat.project.join("result.txt").exists());
    // No live run behind the user's back, and no suggestion offering the same again.
    assert!(turn_requests(&chat, "fix it and run the tests")
        .iter()
        .all(|r| r["model"] == "fast-model"));
    assert_eq!(questions(&tty), 0);
    assert!(!common::chat::ghost_shown(&tty, "fix it"));
    chat.assert_nothing_left_but_the_session();
    // Up and Enter runs it live, asking at each step.
    tty.keys(&["Up"]);
    tty.wait_for("the recalled prompt", 60, |s| {
        common::chat::prompt_line(s).contains("fix it and run the tests")
    });
    tty.keys(&["Enter"]);
    tty.wait_for("the edit's question", 60, |_| questions(&tty) == 1);
    assert_eq!(read(&chat, "add.sh"), BUGGY);
    tty.keys(&["y"]);
    tty.wait_for("the command's question", 60, |_| questions(&tty) == 2);
    assert_eq!(read(&chat, "add.sh"), FIXED);
    assert!(!chat.project.join("result.txt").exists());
    tty.keys(&["y"]);
    tty.wait_text("the test passes.", 60);
    wait_prompt(&tty);
    assert_eq!(read(&chat, "result.txt"), "PASS\n");
    assert!(turn_requests(&chat, "fix it and run the tests")
        .iter()
        .any(|r| r["model"] == "main-model"));
}

#[test]
fn ctrl_c_at_the_speculation_question_cancels() {
    let chat = fixing_project(fixing_model);
    let tty = until_speculated(&chat, &[]);
    tty.keys(&["Enter"]);
    tty.wait_text(WRITE_QUESTION, 60);
    tty.keys(&["C-c"]);
    tty.wait_text("(cancelled)", 60);
    wait_prompt(&tty);
    assert_eq!(read(&chat, "add.sh"), BUGGY);
    assert!(!chat.project.join("result.txt").exists());
    assert!(turn_requests(&chat, "fix it and run the tests")
        .iter()
        .all(|r| r["model"] == "fast-model"));
    chat.assert_nothing_left_but_the_session();
    assert!(tty.alive());
}

/// A suggestion whose speculation runs a long build that writes as it goes.
fn slow_build_model(body: &Value) -> Reply {
    let user = last_real_user(body);
    if is_suggestion_request(body) {
        return Reply::text(match user.as_str() {
            "what is left?" => "build the release",
            _ => "",
        });
    }
    let step = tool_results_since_user(body);
    match (user.as_str(), step) {
        ("hello", _) => Reply::text("Hello."),
        ("what is left?", _) => Reply::text("Only the release build."),
        ("build the release", 0) => Reply::tool(
            "shell",
            json!({"command": "echo partial > half.txt; sleep 97; echo done >> half.txt"}),
        ),
        ("build the release", _) => Reply::text("Built."),
        (other, _) => Reply::text(&format!("You said: {other}")),
    }
}

fn sleeps_left() -> Vec<String> {
    let out = std::process::Command::new("pgrep")
        .args(["-fa", "sleep 97"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn ctrl_c_while_an_accepted_speculation_runs() {
    common::require_fuse_root();
    let chat = Chat::new(slow_build_model);
    let tty = chat.start(&["--approval", "yolo"]);
    tty.say("hello");
    tty.wait_text("Hello.", 60);
    tty.say("what is left?");
    tty.wait_text("Only the release build.", 60);
    wait_ghost(&tty, "build the release");
    wait_until("the speculative build to start", 60, || {
        !sleeps_left().is_empty()
    });
    // Enter before it finished: the command at work shows while the user waits.
    tty.keys(&["Enter"]);
    tty.wait_text("⋯ shell echo partial > half.txt; sleep 97", 60);
    tty.keys(&["C-c"]);
    tty.wait_text("(cancelled)", 60);
    let s = wait_prompt(&tty);
    assert!(!s.contains("⋯ shell"), "the status line stayed:\n{s}");
    assert!(!s.contains("^C"), "{s}");
    // Nothing half-written landed, the command is gone, the branch unmounted.
    assert!(!chat.project.join("half.txt").exists());
    wait_until("the build to be killed", 60, || sleeps_left().is_empty());
    chat.assert_nothing_left_but_the_session();
    // No suggestion offers the same again; the session goes on.
    assert!(!common::chat::ghost_shown(&tty, "build the release"));
    tty.say("anything else?");
    tty.wait_text("You said: anything else?", 60);
    wait_prompt(&tty);
    assert!(!chat.project.join("half.txt").exists());
    tty.keys(&["C-d"]);
    wait_until("the session to end", 60, || !tty.alive());
    chat.assert_nothing_left();
}

const SUMMARY: &str = "- the user counted one";
const SUMMARY_AGAIN: &str = "- the user counted one to three";
const HEADER: &str = "[Summary of the earlier conversation";

fn is_compaction(body: &Value) -> bool {
    body["messages"][0]["content"]
        .as_str()
        .is_some_and(|s| s.contains("You are compacting"))
}

/// Counts turns; "three" reports a nearly full context. The fast model summarises.
fn counting_model(body: &Value) -> Reply {
    if is_compaction(body) {
        let transcript = shade_testkit::last_user(body);
        if transcript.contains("USER: stall") {
            return Reply::text("never seen").after(Duration::from_secs(600));
        }
        let text = if transcript.contains(HEADER) {
            SUMMARY_AGAIN
        } else {
            SUMMARY
        };
        return Reply::text(text).after(Duration::from_millis(300));
    }
    if is_suggestion_request(body) {
        return Reply::text("");
    }
    let user = last_real_user(body);
    let mut reply = Reply::text(&format!("Noted {user}."));
    if user == "three" || user == "seven" {
        reply.prompt_tokens = 900;
    }
    reply
}

fn compaction_requests(chat: &Chat) -> Vec<Value> {
    chat.llm
        .requests()
        .into_iter()
        .filter(is_compaction)
        .collect()
}

/// The user messages of a request, in order.
fn user_messages(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(shade_testkit::content_text)
        .collect()
}

fn compacting_chat() -> Chat {
    let chat = Chat::new(counting_model);
    let config = chat.project.parent().unwrap().join("config/shade");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("config.toml"),
        "context_window = 1000\ncompact_threshold = 0.5\n",
    )
    .unwrap();
    chat
}

#[test]
fn compaction_at_the_threshold_and_by_hand() {
    let chat = compacting_chat();
    let tty = chat.start(&["--no-speculate", "--no-suggest"]);
    for n in ["one", "two", "three"] {
        tty.say(n);
        tty.wait_text(&format!("Noted {n}."), 60);
        wait_prompt(&tty);
    }
    assert!(compaction_requests(&chat).is_empty());
    // "three" filled 900 of 1000 tokens: the next turn is compacted first, by the fast model.
    tty.say("four");
    tty.wait_text("Noted four.", 60);
    wait_prompt(&tty);
    let h = tty.history();
    assert!(h.contains("context nearly full"), "{h}");
    assert!(
        h.contains("summarised 2 older messages, kept the last 4"),
        "{h}"
    );
    let summaries = compaction_requests(&chat);
    assert_eq!(summaries.len(), 1);
    assert_eq!(summaries[0]["model"], "fast-model");
    let transcript = shade_testkit::last_user(&summaries[0]);
    assert!(transcript.contains("USER: one") && !transcript.contains("USER: two"));
    // The turn went on with the summary in place of the first exchange.
    let four = turn_requests(&chat, "four");
    let users = user_messages(&four[0]);
    assert_eq!(users.len(), 4, "{users:?}");
    assert!(users[0].starts_with(HEADER) && users[0].contains(SUMMARY));
    assert_eq!(users[1..], ["two", "three", "four"]);

    // By hand: /compact summarises all but the last two turns, the summary included.
    tty.say("/compact");
    tty.wait_text(
        "compacted: 3 older messages summarised into one, 4 kept",
        60,
    );
    wait_prompt(&tty);
    assert_eq!(compaction_requests(&chat).len(), 2);
    tty.say("five");
    tty.wait_text("Noted five.", 60);
    wait_prompt(&tty);
    let users = user_messages(&turn_requests(&chat, "five")[0]);
    assert!(users[0].contains(SUMMARY_AGAIN), "{users:?}");
    assert_eq!(users[1..], ["three", "four", "five"]);

    // A summary that does not come: Ctrl-C stops it, the conversation is unchanged.
    tty.say("stall");
    tty.wait_text("Noted stall.", 60);
    tty.say("six");
    tty.wait_text("Noted six.", 60);
    wait_prompt(&tty);
    tty.say("/compact");
    tty.wait_text("Ctrl-C stops", 60);
    wait_until("the stalled summary request", 60, || {
        compaction_requests(&chat).len() == 3
    });
    tty.keys(&["C-c"]);
    tty.wait_text("not compacted: cancelled", 60);
    wait_prompt(&tty);
    tty.say("seven");
    tty.wait_text("Noted seven.", 60);
    let users = user_messages(&turn_requests(&chat, "seven")[0]);
    assert_eq!(
        users[1..],
        ["three", "four", "five", "stall", "six", "seven"]
    );
    wait_prompt(&tty);

    // Ctrl-C while the automatic compaction waits for its summary: the turn is cancelled,
    // with no error about the compaction, and the session goes on.
    tty.say("eight");
    tty.wait_text("summarising older messages", 60);
    wait_until("the second stalled summary request", 60, || {
        compaction_requests(&chat).len() == 4
    });
    tty.keys(&["C-c"]);
    tty.wait_text("(cancelled)", 60);
    wait_prompt(&tty);
    let h = tty.history();
    assert!(!h.contains("could not compact"), "{h}");
    assert!(turn_requests(&chat, "eight").is_empty());
    assert!(tty.alive());
}

#[test]
fn an_unreachable_model_server_is_one_clear_error_and_the_session_goes_on() {
    let chat = Chat::new(|_| Reply::text("never asked"));
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}/v1");
    let tty = chat.start_with(&["--no-speculate"], &[("OPENAI_BASE_URL", url.clone())]);
    tty.say("hello");
    // Retries show on one line that changes; the failure replaces it.
    tty.wait_text("Connection refused (os error 111)\n", 120);
    wait_prompt(&tty);
    let h = tty.history();
    let lines: Vec<&str> = h.lines().filter(|l| l.contains("model server")).collect();
    assert_eq!(
        lines,
        [format!(
            "shade: cannot reach the model server: {url}: Connection refused (os error 111)"
        )],
        "{h}"
    );
    tty.say("/help");
    tty.wait_text("Commands:", 60);
    wait_prompt(&tty);
    // Ctrl-C while it waits to retry: the turn is cancelled at once.
    tty.say("again");
    tty.wait_text("retry 1 in", 60);
    tty.keys(&["C-c"]);
    tty.wait_text("(cancelled)", 60);
    let s = wait_prompt(&tty);
    assert!(!s.contains("retry 1 in"), "{s}");
    assert!(tty.alive());
}

#[test]
fn auto_edit_asks_only_for_commands_and_plan_refuses_edits() {
    common::require_fuse_root();
    let chat = Chat::new(approvals_model);
    let tty = chat.start(&["--no-speculate", "--no-suggest", "--approval", "auto-edit"]);
    // Edits run without a question in auto-edit; the write too.
    tty.say("fix the readme");
    tty.wait_text("Created NEW.md.", 60);
    wait_prompt(&tty);
    assert_eq!(questions(&tty), 0, "{}", tty.history());
    assert_eq!(read(&chat, "README"), "the project\n");
    assert_eq!(read(&chat, "NEW.md"), "new\n");
    // A writing command still asks; no refuses it and the model hears so.
    tty.say("run the script");
    tty.wait_for("the command's question", 60, |_| questions(&tty) == 1);
    tty.keys(&["n"]);
    tty.wait_text("The script said:", 60);
    wait_prompt(&tty);
    assert!(!chat.project.join("out.txt").exists());
    let r = turn_requests(&chat, "run the script");
    assert!(last_tool_result(r.last().unwrap())
        .unwrap()
        .contains("declined"));
    // Plan mode: the edit is refused without a question, the file unchanged.
    tty.say("/approval plan");
    tty.wait_text("shade [plan]>", 60);
    wait_prompt(&tty);
    tty.say("write a draft");
    tty.wait_text("Wrote the draft.", 60);
    wait_prompt(&tty);
    assert_eq!(questions(&tty), 1);
    assert!(
        tty.history().contains("plan mode does not allow edits"),
        "{}",
        tty.history()
    );
    assert!(!chat.project.join("DRAFT.md").exists());
}

#[test]
fn no_question_for_a_speculation_whose_tools_the_user_always_allows() {
    let chat = fixing_project(fixing_model);
    let tty = chat.start(&[]);
    tty.say("touch the readme");
    tty.wait_for("the edit's question", 60, |_| questions(&tty) == 1);
    tty.keys(&["a"]);
    tty.wait_for("the command's question", 60, |_| questions(&tty) == 2);
    tty.keys(&["a"]);
    tty.wait_text("Touched.", 60);
    assert_eq!(read(&chat, "touched.txt"), "touched\n");
    tty.say("what is wrong?");
    tty.wait_text("subtracts instead of adding", 60);
    wait_ghost(&tty, "fix it and run the tests");
    wait_until("the speculated answer", 60, || {
        speculation_requests(&chat, "fix it and run the tests", 2) == 1
    });
    tty.keys(&["Enter"]);
    tty.wait_text("2 changes written", 60);
    wait_prompt(&tty);
    assert!(!tty.history().contains(WRITE_QUESTION), "{}", tty.history());
    assert_eq!(questions(&tty), 2);
    assert_eq!(read(&chat, "add.sh"), FIXED);
    assert_eq!(read(&chat, "result.txt"), "PASS\n");
}

/// A model that writes a file (asking first), then suggests looking at it — slowly, so the
/// suggestion arrives well after the prompt is back.
fn slow_suggestion_model(body: &Value) -> Reply {
    let user = last_real_user(body);
    if is_suggestion_request(body) {
        let next = if user == "write a draft" {
            "show me the draft"
        } else {
            ""
        };
        return Reply::text(next).after(Duration::from_secs(2));
    }
    match (user.as_str(), tool_results_since_user(body)) {
        ("write a draft", 0) => Reply::tool(
            "write_file",
            json!({"path": "DRAFT.md", "content": "draft\n"}),
        ),
        ("write a draft", _) => Reply::text("Wrote the draft."),
        ("show me the draft", _) => Reply::text("It says: draft"),
        (other, _) => Reply::text(&format!("You said: {other}")),
    }
}

#[test]
fn an_enter_typed_after_an_approval_does_not_swallow_the_suggestion() {
    let chat = Chat::new(slow_suggestion_model);
    let tty = chat.start(&["--no-speculate"]);
    tty.say("write a draft");
    tty.wait_text(QUESTION, 60);
    // `y`, then Enter out of habit, at once: the Enter reaches the prompt while the
    // suggestion is still on its way.
    tty.keys(&["y", "Enter"]);
    tty.wait_text("Wrote the draft.", 60);
    assert_eq!(read(&chat, "DRAFT.md"), "draft\n");
    // The suggestion still shows, on the same prompt: the Enter submitted nothing.
    wait_ghost(&tty, "show me the draft");
    let h = tty.history();
    assert_eq!(
        h.lines().filter(|l| l.starts_with("shade>")).count(),
        2,
        "an empty line was submitted:\n{h}"
    );
    // Tab fills it in, Enter sends it.
    tty.keys(&["Tab"]);
    tty.wait_for("the filled prompt", 10, |s| {
        common::chat::prompt_line(s).contains("show me the draft")
    });
    tty.keys(&["Enter"]);
    tty.wait_text("It says: draft", 60);
    assert_eq!(turn_requests(&chat, "show me the draft").len(), 1);
    let ev = chat.wait_suggestion_events(1);
    assert_eq!(ev[0]["outcome"], "accepted", "{ev:?}");
    assert_eq!(ev[0]["accept_method"], "tab", "{ev:?}");
}

#[test]
fn typing_ahead_during_a_turn_waits_for_the_prompt_without_garbling_the_answer() {
    let chat = Chat::new(|body: &Value| {
        let user = last_real_user(body);
        if user == "tell a story" {
            Reply::text(&"once upon a time ".repeat(15)).streamed_every(Duration::from_millis(100))
        } else {
            Reply::text(&format!("You said: {user}"))
        }
    });
    let tty = chat.start(&["--no-speculate", "--no-suggest"]);
    tty.say("tell a story");
    tty.wait_text("once upon a time once", 60);
    // Typed while the answer streams: not echoed into it, submitted once the prompt is back.
    tty.say("next question");
    tty.wait_text("You said: next question", 60);
    let h = tty.history();
    let story = h
        .lines()
        .skip_while(|l| !l.ends_with("tell a story"))
        .nth(1)
        .unwrap();
    assert!(
        story.starts_with("once upon a time once upon a time once"),
        "{h}"
    );
    assert!(
        !h.contains("oncenext") && !h.contains("next question upon"),
        "{h}"
    );
    assert_eq!(h.matches("next question").count(), 2, "{h}");
}

#[test]
fn closing_the_terminal_of_a_shadow_session_mid_turn_leaves_nothing_mounted() {
    common::require_fuse_root();
    let chat = Chat::new(|body: &Value| {
        let user = last_real_user(body);
        match (user.as_str(), tool_results_since_user(body)) {
            ("make a note", 0) => {
                Reply::tool("write_file", json!({"path": "NOTE.md", "content": "hi\n"}))
            }
            ("make a note", _) => Reply::text("Wrote NOTE.md."),
            ("work slowly", 0) => Reply::tool("shell", json!({"command": "sleep 98"})),
            (other, _) => Reply::text(&format!("You said: {other}")),
        }
    });
    let tty = chat.start(&["--shadow", "--approval", "yolo", "--no-suggest"]);
    tty.say("make a note");
    tty.wait_text("Wrote NOTE.md.", 60);
    wait_prompt(&tty);
    // A command at work in the branch when the terminal goes away.
    tty.say("work slowly");
    tty.wait_text("⋯ shell sleep 98", 60);
    drop(tty);
    chat.assert_nothing_left();
    wait_until("the command to be killed", 60, || {
        std::process::Command::new("pgrep")
            .args(["-f", "sleep 98"])
            .status()
            .is_ok_and(|s| !s.success())
    });
    assert!(!chat.project.join("NOTE.md").exists());
}

#[test]
fn a_refused_api_key_is_one_line_and_the_session_goes_on() {
    let chat = Chat::new(|body: &Value| {
        if last_real_user(body) == "hello" {
            Reply::error(401, "Incorrect API key provided")
        } else {
            Reply::text("Fine now.")
        }
    });
    let tty = chat.start(&["--no-speculate", "--no-suggest"]);
    tty.say("hello");
    tty.wait_text("Incorrect API key provided", 60);
    wait_prompt(&tty);
    let h = tty.history();
    let lines: Vec<&str> = h.lines().filter(|l| l.contains("API key")).collect();
    assert_eq!(
        lines,
        ["shade: HTTP 401 from the model server: Incorrect API key provided"],
        "{h}"
    );
    // Not retried: a bad key does not get better.
    assert_eq!(turn_requests(&chat, "hello").len(), 1);
    tty.say("and now?");
    tty.wait_text("Fine now.", 60);
}

#[test]
fn approvals_in_a_shadow_session_write_into_its_branch() {
    common::require_fuse_root();
    let chat = Chat::new(approvals_model);
    let tty = chat.start(&["--shadow", "--no-suggest"]);
    tty.say("fix the readme");
    tty.wait_text(QUESTION, 60);
    assert!(tty.screen().contains("+the project"), "{}", tty.screen());
    tty.keys(&["y"]);
    tty.wait_for("the write's question", 60, |_| questions(&tty) == 2);
    tty.keys(&["y"]);
    tty.wait_text("Created NEW.md.", 60);
    wait_prompt(&tty);
    // Approved, but in the branch: the project is untouched until /accept.
    assert_eq!(read(&chat, "README"), "a project\n");
    assert!(!chat.project.join("NEW.md").exists());
    tty.say("/accept");
    tty.wait_text("accepted 2 changes", 60);
    wait_prompt(&tty);
    assert_eq!(read(&chat, "README"), "the project\n");
    assert_eq!(read(&chat, "NEW.md"), "new\n");
    tty.keys(&["C-d"]);
    wait_until("the session to end", 60, || !tty.alive());
    chat.assert_nothing_left();
}

#[test]
fn a_shadow_session_lists_writes_outside_the_project_and_keeps_only_the_named_one() {
    common::require_fuse_root();
    let chat = Chat::new(|body: &Value| {
        let user = last_real_user(body);
        match (user.as_str(), tool_results_since_user(body)) {
            ("set up git", 0) => Reply::tool(
                "shell",
                json!({"command": "git config --global user.name evil && echo x >> ~/.bashrc && echo fixed > FIX && echo done-$?"}),
            ),
            ("set up git", _) => Reply::text("Configured."),
            (other, _) => Reply::text(&format!("You said: {other}")),
        }
    });
    let home = chat.project.parent().unwrap().to_path_buf();
    std::fs::write(home.join(".bashrc"), "orig\n").unwrap();
    let tty = chat.start(&["--shadow", "--approval", "yolo", "--no-suggest"]);
    tty.say("set up git");
    tty.wait_text("Configured.", 60);
    wait_prompt(&tty);
    assert!(
        chat.llm
            .requests()
            .iter()
            .any(|r| last_tool_result(r).is_some_and(|t| t.contains("done-0"))),
        "the command failed in the branch: {:?}",
        chat.llm.requests().last()
    );
    // The turn ends by saying what the branch holds, outside the project too.
    let h = tty.history();
    assert!(
        h.contains(
            "in the branch: 1 change; outside the project: ~/.bashrc modified, ~/.gitconfig added"
        ),
        "{h}"
    );
    // Nothing reached the host yet.
    assert!(!home.join(".gitconfig").exists());
    assert_eq!(
        std::fs::read_to_string(home.join(".bashrc")).unwrap(),
        "orig\n"
    );
    tty.say("/changes");
    let screen = tty.wait_text("A ~/.gitconfig", 60);
    assert!(
        screen.contains("outside the project:\n  M ~/.bashrc\n  A ~/.gitconfig"),
        "{screen}"
    );
    assert!(screen.contains("A FIX"), "{screen}");
    wait_prompt(&tty);
    tty.say("/accept --keep-outside ~/.gitconfig");
    let screen = tty.wait_text("accepted 1 change", 60);
    assert!(
        screen.contains("kept 1 path outside the project: ~/.gitconfig"),
        "{screen}"
    );
    assert!(
        screen.contains("~/.bashrc"),
        "the dropped write is named: {screen}"
    );
    wait_prompt(&tty);
    assert_eq!(read(&chat, "FIX"), "fixed\n");
    let gitconfig = std::fs::read_to_string(home.join(".gitconfig")).unwrap();
    assert!(gitconfig.contains("name = evil"), "{gitconfig}");
    assert_eq!(
        std::fs::read_to_string(home.join(".bashrc")).unwrap(),
        "orig\n"
    );
    tty.keys(&["C-d"]);
    wait_until("the session to end", 60, || !tty.alive());
    chat.assert_nothing_left();
}

#[test]
fn undo_in_a_terminal_takes_back_a_turn_whose_shell_edited_and_formatted() {
    common::require_fuse_root();
    let chat = Chat::new(|body: &Value| {
        let user = last_real_user(body);
        match (user.as_str(), tool_results_since_user(body)) {
            ("tidy the code", 0) => Reply::tool(
                "shell",
                json!({"command": "sed -i s/one/two/ notes.txt && tr -s ' ' < code.c > fmt.tmp && mv fmt.tmp code.c"}),
            ),
            ("tidy the code", _) => Reply::text("Tidied."),
            (other, _) => Reply::text(&format!("You said: {other}")),
        }
    });
    std::fs::write(chat.project.join("notes.txt"), "one\n").unwrap();
    std::fs::write(chat.project.join("code.c"), "int  x=1 ;\n").unwrap();
    let tty = chat.start(&["--shadow", "--approval", "yolo", "--no-suggest"]);
    tty.say("tidy the code");
    tty.wait_text("Tidied.", 60);
    wait_prompt(&tty);
    tty.say("/accept");
    tty.wait_text("accepted 2 changes", 60);
    wait_prompt(&tty);
    assert_eq!(read(&chat, "notes.txt"), "two\n");
    assert_eq!(read(&chat, "code.c"), "int x=1 ;\n");
    tty.say("/undo");
    let screen = tty.wait_text("undid accept", 60);
    assert!(screen.contains("restored code.c"), "{screen}");
    assert!(screen.contains("restored notes.txt"), "{screen}");
    wait_prompt(&tty);
    assert_eq!(read(&chat, "notes.txt"), "one\n");
    assert_eq!(read(&chat, "code.c"), "int  x=1 ;\n");
    tty.keys(&["C-d"]);
    wait_until("the session to end", 60, || !tty.alive());
    chat.assert_nothing_left();
}
