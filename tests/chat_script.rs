//! `shade chat` without a terminal: prompts from stdin, one turn each, one conversation;
//! background calls never reach the main cassette.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::Write;
use std::sync::Arc;

use common::cmd::{chat_in_home, run_with_input};

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
    let record = cassette.to_str().unwrap();
    let out = chat(
        home.path(),
        &llm,
        &["--record", record],
        "first\n\nsecond\n/stats\n",
    );
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
    let replay = format!("replay:{}", cassette.display());
    let out = chat(home.path(), &llm, &["--llm", &replay], "first\nsecond\n");
    let before = requests.len();
    assert_eq!(llm.requests().len(), before, "the replay asked the server");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains("Two."), "{stdout}");
}

/// `shade chat` with `args` in `home` (its project), prompts from `input`.
fn chat(home: &std::path::Path, llm: &FakeLlm, args: &[&str], input: &str) -> std::process::Output {
    run_with_input(
        chat_in_home(home, llm, "main-model").args(args),
        input.as_bytes(),
    )
}

/// Each conversation is saved after every turn: `--continue` picks up the latest with its
/// messages, `--resume` a given one by the start of its id, `--sessions` lists them; an
/// unknown id is one clear error before any model call.
#[test]
fn conversations_are_saved_and_picked_up_again() {
    let llm = FakeLlm::start(Arc::new(router)).unwrap();
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let out = chat(h, &llm, &[], "first\n");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = chat(h, &llm, &[], "a new one\n");
    assert!(out.status.success());

    let list = chat(h, &llm, &["--sessions"], "");
    let list = String::from_utf8_lossy(&list.stdout).into_owned();
    let lines: Vec<&str> = list.lines().collect();
    assert_eq!(lines.len(), 2, "{list}");
    assert!(
        lines[0].ends_with("1 prompt  a new one"),
        "newest first: {list}"
    );
    assert!(lines[1].ends_with("1 prompt  first"), "{list}");
    let first_id = lines[1].split_whitespace().next().unwrap().to_string();

    // --continue: the latest conversation goes on.
    let before = llm.requests().len();
    let out = chat(h, &llm, &["--continue"], "second\n");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("resumed conversation"));
    let sent = &llm.requests()[before];
    let msgs = sent["messages"].as_array().unwrap();
    let texts: Vec<String> = msgs
        .iter()
        .map(|m| m["content"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(&texts[1..], ["a new one", "You said: a new one", "second"]);
    assert!(
        texts[0].contains("resumed from a saved session"),
        "{}",
        texts[0]
    );

    // --resume by a prefix of the older id.
    let before = llm.requests().len();
    let out = chat(
        h,
        &llm,
        &["--resume", &first_id[..first_id.len() - 2]],
        "third\n",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sent = &llm.requests()[before];
    let msgs = sent["messages"].as_array().unwrap();
    assert_eq!(msgs[1]["content"], "first");
    assert_eq!(msgs[2]["content"], "One.");
    assert_eq!(msgs.last().unwrap()["content"], "third");

    // The resumed ones were saved in place: still two conversations, now longer.
    let list = chat(h, &llm, &["--sessions"], "");
    let list = String::from_utf8_lossy(&list.stdout).into_owned();
    assert_eq!(list.lines().count(), 2, "{list}");
    assert!(list.contains("2 prompts  first"), "{list}");

    let before = llm.requests().len();
    let out = chat(h, &llm, &["--resume", "nope"], "never sent\n");
    assert_eq!(out.status.code(), Some(125));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no saved conversation nope"), "{err}");
    assert_eq!(llm.requests().len(), before, "no model call for a wrong id");
}

/// `@path` attaches the file (once), a directory's listing, and never anything outside the
/// project; the prompt itself stays as typed.
#[test]
fn mentioned_files_are_attached_and_confined() {
    let llm = FakeLlm::start(Arc::new(router)).unwrap();
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    std::fs::create_dir(h.join("src")).unwrap();
    std::fs::write(h.join("src/lib.rs"), "pub fn answer() -> u32 { 42 }\n").unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "top secret\n").unwrap();
    let prompt = format!(
        "explain @src/lib.rs and @src/, not @{}/secret",
        outside.path().display()
    );
    let out = chat(h, &llm, &[], &format!("{prompt}\n"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("  @ src/lib.rs (1 line)"), "{stdout}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("secret not attached"));
    let sent = &llm.requests()[0];
    let user = sent["messages"][1]["content"].as_str().unwrap();
    assert!(user.starts_with(&prompt), "{user}");
    assert!(
        user.contains("<file path=\"src/lib.rs\">\npub fn answer() -> u32 { 42 }\n</file>"),
        "{user}"
    );
    assert!(
        user.contains("<directory path=\"src\">\nlib.rs\n</directory>"),
        "{user}"
    );
    assert!(!user.contains("top secret"));
}

/// `!command` runs the user's own command where the agent's run, shows its result, and
/// tells the model; with `--shadow` it writes into the branch, never the project.
#[test]
fn bang_commands_run_where_the_agent_runs_and_reach_the_model() {
    let llm = FakeLlm::start(Arc::new(router)).unwrap();
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let out = chat(
        h,
        &llm,
        &[],
        "!echo hello from the user; exit 3\nwhat happened?\n",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("Exit code: 3") && stdout.contains("hello from the user"),
        "{stdout}"
    );
    let sent = &llm.requests()[0];
    let msgs = sent["messages"].as_array().unwrap();
    let note = msgs[1]["content"].as_str().unwrap();
    assert!(
        note.contains("$ echo hello from the user; exit 3"),
        "{note}"
    );
    assert!(note.contains("Exit code: 3") && note.contains("hello from the user"));
    assert_eq!(msgs.last().unwrap()["content"], "what happened?");

    let before = llm.requests().len();
    let out = chat(
        h,
        &llm,
        &["--shadow"],
        "!echo made > made.txt && cat made.txt\n/diff\n",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("Exit code: 0") && stdout.contains("made"),
        "{stdout}"
    );
    assert!(
        stdout.contains("made.txt"),
        "/diff shows the branch's file: {stdout}"
    );
    assert!(!h.join("made.txt").exists(), "the project was written");
    assert_eq!(llm.requests().len(), before, "no model call for a command");
}

/// Serve one chat completion (not streamed, with `usage`), as a search model with a search
/// tool answers; the request body comes back through the handle.
fn search_model() -> (String, std::thread::JoinHandle<Value>) {
    use std::io::{BufRead, BufReader, Read};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let handle = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut reader = BufReader::new(conn.try_clone().unwrap());
        let mut len = 0;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
            if line == "\r\n" {
                break;
            }
        }
        let mut body = vec![0; len];
        reader.read_exact(&mut body).unwrap();
        let answer = serde_json::json!({
            "model": "searcher",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Rust 1.85 is out."}}],
            "citations": ["https://blog.rust-lang.org/"],
            "usage": {"prompt_tokens": 4321, "completion_tokens": 87,
                      "prompt_tokens_details": {"cached_tokens": 4000}}
        })
        .to_string();
        write!(
            conn,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
            answer.len()
        )
        .unwrap();
        serde_json::from_slice(&body).unwrap()
    });
    (url, handle)
}

/// `/stats` counts the tokens of web_search's own model (provider = "openai") as background
/// work under its name.
#[test]
fn stats_show_the_search_models_tokens() {
    let (url, searcher) = search_model();
    let home = tempfile::tempdir().unwrap();
    let config = home.path().join("config/shade");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("config.toml"),
        format!("[web_search]\nprovider = \"openai\"\nurl = \"{url}\"\nmodel = \"searcher\"\napi_key = \"sk-1\"\n"),
    )
    .unwrap();
    let llm = FakeLlm::start(Arc::new(|body: &Value| {
        if shade_testkit::last_tool_result(body).is_some() {
            Reply::text("Rust 1.85.")
        } else {
            Reply::tool("web_search", serde_json::json!({"query": "latest rust"}))
        }
    }))
    .unwrap();
    let out = chat(
        home.path(),
        &llm,
        &["--approval", "yolo"],
        "what is the latest rust?\n/stats\n",
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        searcher.join().unwrap()["messages"][1]["content"],
        "latest rust"
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("searcher (background)"))
        .unwrap_or_else(|| panic!("no search model in /stats:\n{stdout}"));
    let cols: Vec<&str> = line.split_whitespace().collect();
    // model, calls, prompt, cached, output
    assert_eq!(cols[2..], ["1", "4321", "4000", "87"], "{line}");
    // The main model's two calls (100 prompt tokens each from the fake server) plus these.
    assert!(
        stdout.contains("background work (suggestions, speculation, summaries): 4408 tokens"),
        "{stdout}"
    );
}

fn slow_router(body: &Value) -> Reply {
    if shade_testkit::last_tool_result(body).is_some() {
        return Reply::text("Done.");
    }
    match last_real_user(body).as_str() {
        "slow" => Reply::tool(
            "shell",
            serde_json::json!({ "command": "echo x > started; sleep 30" }),
        ),
        _ => Reply::tool("shell", serde_json::json!({ "command": "echo x > made" })),
    }
}

fn holds(dir: &std::path::Path, name: &str) -> bool {
    std::fs::read_dir(dir).is_ok_and(|d| {
        d.flatten().any(|e| {
            e.file_name() == name
                || e.file_type().is_ok_and(|t| t.is_dir()) && holds(&e.path(), name)
        })
    })
}

/// SIGTERM or SIGHUP to a `shade chat --shadow` reading its prompts from a pipe ends the
/// session as the end of input does — during a turn (its command stopped) and while shade
/// waits for the next line — with the branch dropped and unmounted, the project untouched
/// and exit status 128+N. (They used to kill shade with the branch mounted.)
#[test]
fn sigterm_and_sighup_end_a_shadow_script_session_cleanly() {
    for (sig, prompt) in [(libc::SIGTERM, "slow"), (libc::SIGHUP, "quick")] {
        let llm = FakeLlm::start(Arc::new(slow_router)).unwrap();
        let home = tempfile::tempdir().unwrap();
        let h = home.path();
        std::fs::write(h.join("a"), "a\n").unwrap();
        let mut child = chat_in_home(h, &llm, "main-model")
            .args(["--shadow", "--approval", "yolo"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "{prompt}").unwrap();
        let state = h.join("state");
        let started = std::time::Instant::now();
        // During the slow turn: once its command runs. After the quick one: once it has
        // answered and shade waits for the next line (stdin stays open).
        let ready = || match prompt {
            "slow" => holds(&state, "started"),
            _ => llm.requests().len() >= 2 && holds(&state, "made"),
        };
        while !ready() {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(60),
                "the session did not get going"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
        // SAFETY: signalling the child we started.
        unsafe {
            libc::kill(child.id() as i32, sig);
        }
        let out = child.wait_with_output().unwrap();
        drop(stdin);
        let what = format!(
            "signal {sig} ({prompt}): {:?}\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            started.elapsed() < std::time::Duration::from_secs(25),
            "{what}"
        );
        assert_eq!(out.status.code(), Some(128 + sig), "{what}");
        // The session's branch came from the project's branch server, which keeps its
        // connection warm (mounted under the state dir) by design: ended first.
        common::stop_branch_servers(&state);
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(
            !mounts.contains(state.to_str().unwrap()),
            "a branch is still mounted: {what}"
        );
        assert!(
            !h.join("made").exists() && !h.join("started").exists(),
            "{what}"
        );
        assert_eq!(std::fs::read_to_string(h.join("a")).unwrap(), "a\n");
    }
}

/// `/undo` takes back what the session accepted, shell-made changes included (`sed -i`, a
/// formatter), and tells the model.
#[test]
fn undo_takes_back_the_sessions_accept_and_tells_the_model() {
    let llm = FakeLlm::start(Arc::new(router)).unwrap();
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    std::fs::write(h.join("notes.txt"), "one\n").unwrap();
    std::fs::write(h.join("code.c"), "int  x=1 ;\n").unwrap();
    let out = chat(
        h,
        &llm,
        &["--shadow"],
        "!sed -i s/one/two/ notes.txt && tr -s ' ' < code.c > fmt.tmp && mv fmt.tmp code.c\n\
         /accept\n/undo\n/undo\nwhat now?\n",
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("accepted 2 changes"), "{stdout}");
    assert!(stdout.contains("undid accept"), "{stdout}");
    assert!(stdout.contains("restored code.c"), "{stdout}");
    assert!(
        stdout.contains("nothing to undo"),
        "the second /undo: {stdout}"
    );
    assert_eq!(
        std::fs::read_to_string(h.join("notes.txt")).unwrap(),
        "one\n"
    );
    assert_eq!(
        std::fs::read_to_string(h.join("code.c")).unwrap(),
        "int  x=1 ;\n"
    );
    let sent = llm.requests();
    let last = sent.last().unwrap()["messages"].to_string();
    assert!(last.contains("I undid accepted changes"), "{last}");
}
