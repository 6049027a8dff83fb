//! The chat cassette `scripts/demo.sh` replays offline: a question about `examples/hello`,
//! the suggestion shown as ghost text, its speculation (an edit and `cargo run` in a branch)
//! accepted, and the next suggestion. `replays_the_demo_cassette` keeps it in step with the
//! code; when it fails after a change to prompts or tools, record it again with
//! `cargo test --test demo_cassette -- --ignored` (as root).
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::chat::{wait_ghost, Chat};
use common::tty::Tty;
use serde_json::{json, Value};
use shade_testkit::{
    is_suggestion_request, last_real_user, last_user, tool_results_since_user, Reply,
};

const QUESTION: &str = "what does this program print?";
const SUGGESTION: &str = "change it to greet shade and run it";

fn cassette_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/cassettes")
}

fn model(body: &Value) -> Reply {
    if is_suggestion_request(body) {
        if last_user(body).contains("The user just said") {
            return Reply::text("commit this");
        }
        return Reply::text(SUGGESTION);
    }
    let reply = match (last_real_user(body).as_str(), tool_results_since_user(body)) {
        (QUESTION, 0) => Reply::tool("read_file", json!({"path": "src/main.rs"})),
        (QUESTION, _) => Reply::text(
            "It prints `Hello, world!`, but its test expects a greeting for shade. \
             Tip: change it to greet shade and run it.",
        ),
        (SUGGESTION, 0) => Reply::tool(
            "edit",
            json!({"path": "src/main.rs", "old_string": "greeting(\"world\")", "new_string": "greeting(\"shade\")"}),
        ),
        (SUGGESTION, 1) => Reply::tool("shell", json!({"command": "cargo run --offline -q"})),
        (SUGGESTION, _) => Reply::text("Done: it now prints `Hello, shade!`."),
        (other, _) => Reply::text(&format!("(not in the demo: {other})")),
    };
    reply.after(Duration::from_millis(150))
}

/// A fresh copy of examples/hello.
fn hello(into: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/hello");
    let dst = into.join("hello");
    std::fs::create_dir_all(dst.join("src")).unwrap();
    for f in ["Cargo.toml", ".gitignore", "src/main.rs"] {
        std::fs::copy(src.join(f), dst.join(f)).unwrap();
    }
    dst
}

/// The demo's keys: ask, take the suggestion once its speculation had time to run, leave.
fn play(tty: &Tty) {
    tty.wait_text("/help for commands", 20);
    tty.say(QUESTION);
    tty.wait_text("Tip: change it", 30);
    wait_ghost(tty, SUGGESTION);
    // Let the speculation build and run the program in its branch.
    std::thread::sleep(Duration::from_secs(8));
    tty.keys(&["Enter"]);
    tty.wait_text("it now prints", 60);
    tty.wait_text("speculated ahead", 60);
    wait_ghost(tty, "commit this");
    tty.keys(&["C-d"]);
    for _ in 0..200 {
        if !tty.alive() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the demo session did not end:\n{}", tty.screen());
}

#[test]
#[ignore = "records examples/cassettes/chat*.jsonl; run by hand after prompt or tool changes"]
fn record_the_demo_cassette() {
    common::require_fuse_root();
    let chat = Chat::new(model);
    let project = hello(chat.project.parent().unwrap());
    std::fs::create_dir_all(cassette_dir()).unwrap();
    let cassette = cassette_dir().join("chat.jsonl");
    let bin = env!("CARGO_BIN_EXE_shade");
    let tty = Tty::start(
        &[
            bin,
            "chat",
            "--approval",
            "yolo",
            "--record",
            cassette.to_str().unwrap(),
        ],
        &project,
        &chat.env(),
    );
    play(&tty);
    assert!(std::fs::read_to_string(project.join("src/main.rs"))
        .unwrap()
        .contains("greeting(\"shade\")"));
}

#[test]
fn replays_the_demo_cassette() {
    common::require_fuse_root();
    let home = tempfile::tempdir().unwrap();
    let project = hello(home.path());
    let cassette = cassette_dir().join("chat.jsonl");
    let env = vec![
        ("HOME", home.path().display().to_string()),
        (
            "XDG_CONFIG_HOME",
            home.path().join("config").display().to_string(),
        ),
        (
            "SHADE_STATE_DIR",
            home.path().join("state").display().to_string(),
        ),
    ];
    let bin = env!("CARGO_BIN_EXE_shade");
    let llm = format!("replay:{}", cassette.display());
    let tty = Tty::start(
        &[bin, "chat", "--approval", "yolo", "--llm", &llm],
        &project,
        &env,
    );
    play(&tty);
    let main = std::fs::read_to_string(project.join("src/main.rs")).unwrap();
    assert!(main.contains("greeting(\"shade\")"), "{main}");
    // The build ran in the branch: its target/ did not come back with the accept.
    assert!(!project.join("target").exists());
}
