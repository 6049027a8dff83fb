//! `[mcp_servers]`: shade's own agent uses the tools of an MCP server — here the real
//! `shade mcp`, started over stdio — called by a scripted model. A tool the server marks
//! read-only runs without asking; one that is not is approved like a command that writes.
#![allow(clippy::unwrap_used)]

mod common;

use common::describe as out;

use common::cmd::{run_with_input, tool_results};
use common::{assert_no_shade_mounts, Fixture};
use serde_json::{json, Value};
use shade_testkit::{tool_results_since_user, FakeLlm, Reply};
use std::process::Output;
use std::sync::Arc;

/// Check a command (read-only), create a branch (not read-only), then answer.
fn model(body: &Value) -> Reply {
    match tool_results_since_user(body) {
        0 => Reply::tool(
            "mcp__shade__check_command",
            json!({"command": "rm -rf build"}),
        ),
        1 => Reply::tool("mcp__shade__create_branch", json!({})),
        _ => Reply::text("Done."),
    }
}

fn tool_names(body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_string())
        .collect()
}

/// The tool results of the run's last model request.
fn exec(fx: &Fixture, llm: &FakeLlm, approval: &str) -> Output {
    let config = fx.tmp.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[mcp_servers.shade]\ncommand = {:?}\nargs = [\"mcp\", \"--no-lint\"]\nenv = {{ SHADE_STATE_DIR = {:?} }}\n\n[mcp_servers.broken]\ncommand = \"/nonexistent/mcp-server\"\n",
            env!("CARGO_BIN_EXE_shade"),
            fx.state.root().display().to_string(),
        ),
    )
    .unwrap();
    fx.shade()
        .args(["exec", "--approval", approval, "--config"])
        .arg(&config)
        .arg("check and branch")
        .env("OPENAI_BASE_URL", &llm.base_url)
        .env("OPENAI_API_KEY", "test-key")
        .env("SHADE_MODEL", "main-model")
        .env("SHADE_LOG", "error")
        .output()
        .unwrap()
}

#[test]
fn mcp_tools_are_offered_called_and_approved_like_writes() {
    let fx = Fixture::new();
    fx.write("a.txt", "a\n");

    // Default approval, no terminal: the read-only tool runs, the other is refused.
    let llm = FakeLlm::start(Arc::new(model)).unwrap();
    let o = exec(&fx, &llm, "default");
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    let names = tool_names(&llm.requests()[0]);
    for t in [
        "mcp__shade__check_command",
        "mcp__shade__create_branch",
        "read_file",
    ] {
        assert!(names.contains(&t.to_string()), "{t} not offered: {names:?}");
    }
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("MCP server `broken` left out"),
        "a server that cannot start is said: {}",
        out(&o)
    );
    let results = tool_results(&llm);
    assert_eq!(results.len(), 2, "{results:#?}");
    assert!(results[0].contains("\"read_only\":false"), "{}", results[0]);
    assert!(results[0].contains("rm"), "{}", results[0]);
    assert!(
        results[1].contains("Refused without running")
            && results[1].contains("call the MCP tool `mcp__shade__create_branch`"),
        "create_branch must not run unapproved: {}",
        results[1]
    );

    // Yolo: both run.
    let llm = FakeLlm::start(Arc::new(model)).unwrap();
    let o = exec(&fx, &llm, "yolo");
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    let results = tool_results(&llm);
    assert!(results[1].contains("Created branch b1"), "{results:#?}");
    // The server was closed with the run: its branch is gone, the project untouched.
    common::wait_until("the MCP server's branch to be dropped", 30, || {
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        !mounts.contains(&fx.state.root().to_string_lossy().to_string())
    });
    assert_no_shade_mounts(&fx.state);
    assert_eq!(fx.read("a.txt"), "a\n");
}

/// `shade chat` (reading prompts from stdin) has the same tools, and closes the server
/// when it ends: the branch the server made is unmounted by the server itself.
#[test]
fn chat_offers_mcp_tools_and_closes_the_servers() {
    let fx = Fixture::new();
    let config = fx.tmp.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "enable_followup_suggestions = false\n\n[mcp_servers.shade]\ncommand = {:?}\nargs = [\"mcp\", \"--no-lint\"]\nenv = {{ SHADE_STATE_DIR = {:?} }}\n",
            env!("CARGO_BIN_EXE_shade"),
            fx.state.root().display().to_string(),
        ),
    )
    .unwrap();
    let llm = FakeLlm::start(Arc::new(model)).unwrap();
    let o = run_with_input(
        fx.shade()
            .args(["chat", "--approval", "yolo", "--no-suggest", "--config"])
            .arg(&config)
            .env("OPENAI_BASE_URL", &llm.base_url)
            .env("OPENAI_API_KEY", "test-key")
            .env("SHADE_MODEL", "main-model")
            .env("SHADE_LOG", "error"),
        b"check and branch\n",
    );
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    let results = tool_results(&llm);
    assert!(results[0].contains("\"read_only\":false"), "{results:#?}");
    assert!(results[1].contains("Created branch b1"), "{results:#?}");
    assert_no_shade_mounts(&fx.state);
}
