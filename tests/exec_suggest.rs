//! `shade exec --suggest` through the built binary against the local OpenAI-compatible test
//! server (shade-testkit): the suggestion after the answer, its cache-sharing request, the
//! filter and the guards, telemetry in the state dir, and the background cassette that lets a
//! recorded run replay its suggestion offline.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::Arc;

use common::cmd::shade_in;
use serde_json::{json, Value};
use shade_testkit::{is_suggestion_request, tool_results_since_user, FakeLlm, Reply};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("agent/tests/fixtures")
}

struct Env {
    project: tempfile::TempDir,
    home: tempfile::TempDir,
    state: tempfile::TempDir,
}

impl Env {
    fn new() -> Self {
        let project = tempfile::tempdir().unwrap();
        for f in ["add.sh", "test.sh"] {
            std::fs::copy(
                fixtures().join("add_project").join(f),
                project.path().join(f),
            )
            .unwrap();
        }
        Self {
            project,
            home: tempfile::tempdir().unwrap(),
            state: tempfile::tempdir().unwrap(),
        }
    }

    fn config(&self, text: &str) -> String {
        let path = self.home.path().join("config.toml");
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }

    fn exec(&self, args: &[&str]) -> Output {
        shade_in("exec", self.project.path(), self.home.path())
            .args(args)
            .env("SHADE_STATE_DIR", self.state.path())
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    fn telemetry(&self) -> Vec<Value> {
        match std::fs::read_to_string(self.state.path().join("telemetry.jsonl")) {
            Ok(text) => text
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect(),
            Err(_) => Vec::new(),
        }
    }
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Reads add.sh (one tool call), answers, and suggests `suggestion` when asked for one.
fn server(suggestion: &'static str) -> FakeLlm {
    FakeLlm::start(Arc::new(move |body: &Value| {
        if is_suggestion_request(body) {
            Reply::text(suggestion)
        } else if tool_results_since_user(body) == 0 {
            Reply::tool("read_file", json!({"path": "add.sh"}))
        } else {
            Reply::text("add.sh prints the sum now. Run test.sh to check.")
        }
    }))
    .unwrap()
}

fn live<'a>(llm: &'a FakeLlm, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "--base-url",
        llm.base_url.as_str(),
        "--model",
        "main-m",
        "--fast-model",
        "fast-m",
        "--suggest",
    ];
    args.extend_from_slice(extra);
    args.push("fix add.sh");
    args
}

#[test]
fn live_suggestion_is_printed_logged_recorded_and_replayed() {
    let env = Env::new();
    let llm = server("\"run the tests\"");
    let cassette = env.home.path().join("run.jsonl");
    let out = env.exec(&live(&llm, &["--record", cassette.to_str().unwrap()]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.ends_with("suggestion: run the tests\n"),
        "stdout: {text}"
    );
    assert!(text.contains("add.sh prints the sum now."));

    // The suggestion went to the fast model, as a fork of the main request's prefix.
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 3);
    let (main, fork) = (&reqs[1], &reqs[2]);
    assert_eq!(
        (main["model"].as_str(), fork["model"].as_str()),
        (Some("main-m"), Some("fast-m"))
    );
    let n = main["messages"].as_array().unwrap().len();
    assert_eq!(
        fork["messages"].as_array().unwrap()[..n],
        main["messages"].as_array().unwrap()[..]
    );
    assert_eq!(fork["tools"], main["tools"]);

    // Telemetry: one `shown` line.
    let t = env.telemetry();
    assert_eq!(t.len(), 1, "{t:?}");
    assert_eq!(t[0]["event"], "prompt_suggestion");
    assert_eq!(t[0]["outcome"], "shown");
    assert_eq!(t[0]["prompt_id"], "prompt_suggestion");
    assert_eq!(t[0]["suggestion_length"], 13);

    // The suggestion is in the background cassette, not in the main one.
    let main_lines = std::fs::read_to_string(&cassette).unwrap();
    assert_eq!(main_lines.lines().count(), 2);
    assert!(!main_lines.contains("SUGGESTION MODE"));
    let side = std::fs::read_to_string(env.home.path().join("run.background.jsonl")).unwrap();
    assert_eq!(side.lines().count(), 1);
    assert!(side.contains("\"prompt_id\":\"prompt_suggestion\""));

    // Replayed offline (no server), on a fresh copy of the project, as JSON events.
    drop(llm);
    let again = Env::new();
    let replay = format!("replay:{}", cassette.display());
    let out = again.exec(&["--llm", &replay, "--suggest", "--json", "fix add.sh"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let last: Value = serde_json::from_str(stdout(&out).lines().last().unwrap()).unwrap();
    assert_eq!(last, json!({"type": "suggestion", "text": "run the tests"}));
    assert_eq!(again.telemetry()[0]["outcome"], "shown");
}

#[test]
fn a_filtered_suggestion_names_its_rule() {
    let env = Env::new();
    let llm = server("Looks good to me!");
    let out = env.exec(&live(&llm, &[]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!stdout(&out).contains("suggestion:"), "{}", stdout(&out));
    assert!(stderr(&out).contains("shade: no suggestion (evaluative)"));
    let out = env.exec(&live(&llm, &["--json"]));
    let last: Value = serde_json::from_str(stdout(&out).lines().last().unwrap()).unwrap();
    assert_eq!(
        last,
        json!({"type": "suggestion", "suppressed": "evaluative"})
    );
    let t = env.telemetry();
    assert_eq!(t.len(), 2);
    for e in &t {
        assert_eq!(e["outcome"], "suppressed");
        assert_eq!(e["reason"], "evaluative");
    }
}

#[test]
fn guards_and_settings() {
    // One model turn only: too early, and the server is not asked.
    let env = Env::new();
    let one_turn = FakeLlm::start(Arc::new(|_: &Value| Reply::text("Hello."))).unwrap();
    let out = env.exec(&live(&one_turn, &["--json"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let last: Value = serde_json::from_str(stdout(&out).lines().last().unwrap()).unwrap();
    assert_eq!(last["suppressed"], "early_conversation");
    assert_eq!(one_turn.requests().len(), 1);
    assert_eq!(env.telemetry()[0]["reason"], "early_conversation");

    // Plan mode.
    let llm = server("run the tests");
    let out = env.exec(&live(&llm, &["--approval", "plan", "--json"]));
    let last: Value = serde_json::from_str(stdout(&out).lines().last().unwrap()).unwrap();
    assert_eq!(last["suppressed"], "plan_mode");

    // Switched off in the config file; telemetry off writes nothing.
    let env = Env::new();
    let config = env.config("enable_followup_suggestions = false\ntelemetry = false\n");
    let out = env.exec(&live(&llm, &["--config", &config]));
    assert!(
        stderr(&out).contains("no suggestion (disabled)"),
        "{}",
        stderr(&out)
    );
    assert!(env.telemetry().is_empty());
    assert!(!env.state.path().join("telemetry.jsonl").exists());

    // Cache sharing off: a standalone request without tools.
    let before = llm.requests().len();
    let config = env.config("enable_cache_sharing = false\n");
    let out = env.exec(&live(&llm, &["--config", &config]));
    assert!(
        stdout(&out).ends_with("suggestion: run the tests\n"),
        "{}",
        stdout(&out)
    );
    let reqs = llm.requests();
    let standalone = &reqs[before + 2];
    assert!(standalone.get("tools").is_none());
    assert_eq!(standalone["messages"].as_array().unwrap().len(), 1);

    // Without --suggest nothing is asked and nothing logged.
    let env = Env::new();
    let quiet = server("run the tests");
    let out = env.exec(&["--base-url", &quiet.base_url, "--model", "m", "fix add.sh"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(quiet.requests().len(), 2);
    assert!(!stdout(&out).contains("suggestion"));
    assert!(env.telemetry().is_empty());
}
