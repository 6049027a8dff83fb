//! `shade exec` against a local OpenAI-compatible server behaving as small models behind
//! llama.cpp, vLLM or Ollama do: the same tool call forever (loop detection stops it), text
//! repeated forever, tool calls written as fenced JSON in the content, no `usage`, and
//! `reasoning_content` deltas.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;

use common::cmd::{chat_in_home, run_with_input};
use serde_json::{json, Value};
use shade_testkit::{is_suggestion_request, tool_results_since_user, FakeLlm, Reply};

struct Run {
    out: Output,
    requests: Vec<Value>,
    telemetry: Vec<Value>,
    home: tempfile::TempDir,
}

impl Run {
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).into_owned()
    }
    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }
    fn project(&self) -> std::path::PathBuf {
        self.home.path().join("project")
    }
}

/// `shade exec --approval yolo ARGS… PROMPT` in a fresh project against `router`.
fn exec(router: impl Fn(&Value) -> Reply + Send + Sync + 'static, args: &[&str]) -> Run {
    let llm = FakeLlm::start(Arc::new(router)).unwrap();
    let home = tempfile::tempdir().unwrap();
    let project = home.path().join("project");
    std::fs::create_dir(&project).unwrap();
    std::fs::write(project.join("README"), "a project\n").unwrap();
    let state = home.path().join("state");
    let out = Command::new(env!("CARGO_BIN_EXE_shade"))
        .arg("exec")
        .args(["--approval", "yolo"])
        .args(args)
        .arg("plan the work")
        .current_dir(&project)
        .env("HOME", home.path())
        .env("XDG_CONFIG_HOME", home.path().join("config"))
        .env("SHADE_STATE_DIR", &state)
        .env("OPENAI_BASE_URL", &llm.base_url)
        .env("OPENAI_API_KEY", "test-key")
        .env("SHADE_MODEL", "local-model")
        .env_remove("SHADE_FAST_MODEL")
        .env_remove("SHADE_CONFIG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let requests = llm
        .requests()
        .into_iter()
        .filter(|r| !is_suggestion_request(r))
        .collect();
    Run {
        out,
        requests,
        telemetry: read_jsonl(&state.join("telemetry.jsonl")),
        home,
    }
}

fn read_jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn todos() -> Value {
    json!({"todos": [{"id": "1", "content": "read the code", "status": "pending"}]})
}

#[test]
fn the_same_todo_write_forever_is_stopped_after_four_calls_with_one_line() {
    // The model of the report: the same todo_write call, whatever it is told.
    let run = exec(|_body: &Value| Reply::tool("todo_write", todos()), &[]);
    let err = run.stderr();
    assert_eq!(run.out.status.code(), Some(2), "{}\n{err}", run.stdout());
    let reason: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("loop detected"))
        .collect();
    assert_eq!(
        reason,
        ["shade: stopped: the model made the same `todo_write` call 4 times in a row with the same arguments (loop detected)"],
        "{err}"
    );
    // Four model calls, not 34 (nor the turn limit of 50); three todo_writes ran.
    assert_eq!(run.requests.len(), 4, "{err}");
    assert_eq!(run.stdout().matches("  ✓").count(), 3, "{}", run.stdout());
    // The third result told the model it repeats itself.
    let last = &run.requests[3]["messages"];
    let third = last.as_array().unwrap().last().unwrap();
    assert_eq!(third["role"], "tool");
    assert!(
        third["content"]
            .as_str()
            .unwrap()
            .contains("Do not repeat it"),
        "{third}"
    );
    // Telemetry counts it: steered at the third call, stopped at the fourth.
    let loops: Vec<(String, String, u64)> = run
        .telemetry
        .iter()
        .filter(|e| e["event"] == "loop_detected")
        .map(|e| {
            assert_eq!(e["kind"], "tool_call");
            assert_eq!(e["tool"], "todo_write");
            (
                e["action"].as_str().unwrap().to_string(),
                e["model"].as_str().unwrap().to_string(),
                e["repeats"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        loops,
        [
            ("steered".into(), "local-model".into(), 3),
            ("stopped".into(), "local-model".into(), 4)
        ]
    );
}

#[test]
fn a_model_that_takes_the_hint_goes_on() {
    // Three identical calls, then — told it repeats itself — an answer.
    let run = exec(
        |body: &Value| match tool_results_since_user(body) {
            0..=2 => Reply::tool("todo_write", todos()),
            _ => Reply::text("Planned."),
        },
        &[],
    );
    assert_eq!(run.out.status.code(), Some(0), "{}", run.stderr());
    assert!(run.stdout().ends_with("Planned.\n"), "{}", run.stdout());
    assert!(!run.stderr().contains("loop detected"), "{}", run.stderr());
    assert_eq!(run.requests.len(), 4);
}

#[test]
fn text_repeated_over_and_over_is_cut_off() {
    let run = exec(
        |_body: &Value| Reply::text(&"I will now update the todo list. ".repeat(200)),
        &[],
    );
    let err = run.stderr();
    assert_eq!(run.out.status.code(), Some(2), "{err}");
    let line = err
        .lines()
        .find(|l| l.contains("loop detected"))
        .unwrap_or_else(|| panic!("no reason given:\n{err}"));
    assert!(
        line.starts_with("shade: stopped: the model wrote the same text over and over"),
        "{line}"
    );
    // Cut off early: far less than the 6,600 characters the server would have sent.
    assert!(run.stdout().len() < 2_000, "{}", run.stdout().len());
    assert!(run
        .telemetry
        .iter()
        .any(|e| e["event"] == "loop_detected" && e["kind"] == "content"));
}

#[test]
fn a_tool_call_written_as_fenced_json_is_run() {
    let run = exec(
        |body: &Value| {
            match tool_results_since_user(body) {
            0 => Reply::text(
                "I'll write the notes.\n```json\n{\"name\": \"write_file\", \"arguments\": {\"path\": \"NOTES.md\", \"content\": \"notes\\n\"}}\n```\n",
            ),
            _ => Reply::text("Wrote NOTES.md."),
        }
        },
        &[],
    );
    assert_eq!(run.out.status.code(), Some(0), "{}", run.stderr());
    assert_eq!(
        std::fs::read_to_string(run.project().join("NOTES.md")).unwrap(),
        "notes\n"
    );
    assert!(
        run.stdout().ends_with("Wrote NOTES.md.\n"),
        "{}",
        run.stdout()
    );
    // The model sees its call as a call, and its result paired with it.
    let msgs = run.requests[1]["messages"].as_array().unwrap();
    let assistant = &msgs[msgs.len() - 2];
    assert_eq!(assistant["content"], "I'll write the notes.");
    assert_eq!(assistant["tool_calls"][0]["function"]["name"], "write_file");
    let result = &msgs[msgs.len() - 1];
    assert_eq!(result["role"], "tool");
    assert_eq!(result["tool_call_id"], assistant["tool_calls"][0]["id"]);
}

#[test]
fn json_in_the_middle_of_an_answer_stays_text() {
    let answer = "Call it like this:\n```json\n{\"name\": \"write_file\", \"arguments\": {\"path\": \"X\", \"content\": \"x\"}}\n```\nand the file appears.";
    let run = exec(move |_body: &Value| Reply::text(answer), &[]);
    assert_eq!(run.out.status.code(), Some(0), "{}", run.stderr());
    assert!(!run.project().join("X").exists());
    assert_eq!(run.requests.len(), 1);
}

#[test]
fn reasoning_content_is_not_shown_and_missing_usage_is_not_zero() {
    let router = |body: &Value| {
        let reply = match tool_results_since_user(body) {
            0 => Reply::tool("read_file", json!({"path": "README"})),
            _ => Reply::text("The README says: a project."),
        };
        reply
            .reasoning("Let me think about what the user wants here.")
            .without_usage()
    };
    let run = exec(router, &[]);
    assert_eq!(run.out.status.code(), Some(0), "{}", run.stderr());
    let out = run.stdout();
    assert!(out.ends_with("The README says: a project.\n"), "{out}");
    assert!(!out.contains("Let me think"), "reasoning mixed in:\n{out}");
    // Reasoning is not sent back to the model either.
    let msgs = run.requests[1]["messages"].to_string();
    assert!(!msgs.contains("Let me think"), "{msgs}");

    // --json: no usage event claims 0 tokens.
    let run = exec(router, &["--json"]);
    assert_eq!(run.out.status.code(), Some(0), "{}", run.stderr());
    let events: Vec<Value> = run
        .stdout()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(!events.iter().any(|e| e["type"] == "usage"), "{events:?}");
    assert!(events.iter().any(|e| e["type"] == "done"));
}

#[test]
fn stats_say_the_tokens_are_unknown_when_the_server_sends_no_usage() {
    let llm = FakeLlm::start(Arc::new(|_body: &Value| {
        Reply::text("Hello.").without_usage()
    }))
    .unwrap();
    let home = tempfile::tempdir().unwrap();
    let out = run_with_input(
        &mut chat_in_home(home.path(), &llm, "local-model"),
        b"hi\n/stats\n",
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let row = stdout
        .lines()
        .find(|l| l.starts_with("local-model "))
        .unwrap_or_else(|| panic!("no row for the model:\n{stdout}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells, ["local-model", "1", "n/a", "n/a", "n/a"], "{stdout}");
    assert!(
        stdout.contains("local-model: 1 of 1 calls reported no token usage"),
        "{stdout}"
    );
}

#[test]
fn a_llama_cpp_server_without_tool_calls_is_one_clear_error_at_once() {
    let run = exec(
        |_body: &Value| Reply::error(500, "tools param requires --jinja flag"),
        &[],
    );
    let err = run.stderr();
    assert_eq!(run.out.status.code(), Some(125), "{err}");
    assert!(
        err.contains("tools param requires --jinja flag")
            && err.contains("started with --jinja (llama-server --jinja"),
        "{err}"
    );
    // Not retried: the answer would be the same.
    assert_eq!(run.requests.len(), 1, "{err}");
    assert!(!err.contains("retry"), "{err}");
}
