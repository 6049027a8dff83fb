//! `shade exec` end to end through the built binary: replayed cassettes on a temp project,
//! approval refusals without a terminal, JSONL events, and record → replay against a local
//! OpenAI-compatible server.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::cmd::{read_request, run_with_input, shade_in};

const PROMPT: &str = "add.sh should print the sum of its two arguments, but test.sh fails. Fix it.";

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("agent/tests/fixtures")
}

struct Project {
    dir: tempfile::TempDir,
    config: tempfile::TempDir,
}

impl Project {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        for f in ["add.sh", "test.sh"] {
            std::fs::copy(fixtures().join("add_project").join(f), dir.path().join(f)).unwrap();
        }
        Self {
            dir,
            config: tempfile::tempdir().unwrap(),
        }
    }

    fn exec(&self, args: &[&str]) -> Output {
        shade_in("exec", self.dir.path(), self.config.path())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    fn read(&self, f: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(f)).unwrap()
    }
}

fn replay(name: &str) -> String {
    format!("replay:{}", fixtures().join(name).display())
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn yolo_replay_fixes_the_project() {
    let p = Project::new();
    let out = p.exec(&[
        "--approval",
        "yolo",
        "--llm",
        &replay("fix_add.jsonl"),
        PROMPT,
    ]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    assert!(p.read("add.sh").contains("echo $(( $1 + $2 ))"));
    let tool_lines: Vec<&str> = text.lines().filter(|l| l.starts_with("  ✓")).collect();
    assert_eq!(
        tool_lines,
        [
            "  ✓ Read add.sh (3 lines)",
            "  ✓ Read test.sh (3 lines)",
            "  ✓ Edited add.sh (1 replacement, -1 +1 lines)",
            "  ✓ $ sh test.sh → exit code: 0 (1 line of output)",
        ]
    );
    assert!(text.starts_with("Let me look at both scripts.\n"));
    assert!(
        text.ends_with("`sh test.sh` now prints PASS.\n"),
        "{text:?}"
    );
}

#[test]
fn default_mode_without_stdin_refuses_and_says_so() {
    let p = Project::new();
    let before = p.read("add.sh");
    let out = p.exec(&["--llm", &replay("refused_edit.jsonl"), PROMPT]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    assert_eq!(p.read("add.sh"), before, "nothing was edited");
    let refused = text.lines().find(|l| l.starts_with("  ⊘")).unwrap();
    assert!(refused.contains("edit add.sh refused"), "{refused}");
    assert!(refused.contains("approval mode `default`"), "{refused}");
    assert!(refused.contains("no user to ask"), "{refused}");
}

#[test]
fn json_mode_prints_one_event_per_line() {
    let p = Project::new();
    let out = p.exec(&[
        "--json",
        "--approval",
        "yolo",
        "--llm",
        &replay("fix_add.jsonl"),
        PROMPT,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let events: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds.iter().filter(|k| **k == "tool_start").count(), 4);
    assert_eq!(kinds.iter().filter(|k| **k == "tool_end").count(), 4);
    assert_eq!(kinds.iter().filter(|k| **k == "turn_start").count(), 4);
    assert!(kinds.contains(&"usage"));
    assert_eq!(events.last().unwrap()["type"], "done");
    assert_eq!(events.last().unwrap()["reason"], "completed");
    let shell = events
        .iter()
        .find(|e| e["type"] == "tool_end" && e["name"] == "shell")
        .unwrap();
    assert!(shell["output"].as_str().unwrap().contains("PASS"));
}

#[test]
fn replay_mismatch_and_missing_model_fail_clearly() {
    let p = Project::new();
    let out = p.exec(&["--llm", &replay("fix_add.jsonl"), "a different prompt"]);
    assert_eq!(out.status.code(), Some(125));
    let err = stderr(&out);
    assert!(err.contains("does not match the recording"), "{err}");
    assert_eq!(
        err.matches("does not match").count(),
        1,
        "reported once: {err}"
    );

    let out = p.exec(&["hello"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(
        stderr(&out).contains("no model configured"),
        "{}",
        stderr(&out)
    );

    let out = p.exec(&["--approval", "sometimes", "hello"]);
    assert_eq!(out.status.code(), Some(2), "clap usage error");
}

/// Requests a test server received: (lower-cased headers, body).
type Seen = Arc<Mutex<Vec<(String, String)>>>;

/// Serve `n` identical SSE answers on 127.0.0.1; returns the base URL and the received
/// requests' lower-cased header blocks and bodies.
fn sse_server(n: usize) -> (String, Seen) {
    sse_server_with(n, None)
}

fn sse_server_with(n: usize, stall: Option<Duration>) -> (String, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().take(n) {
            let mut conn = conn.unwrap();
            let (head, body) = read_request(&conn);
            seen2
                .lock()
                .unwrap()
                .push((head, String::from_utf8_lossy(&body).into_owned()));
            if let Some(pause) = stall {
                let start = concat!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n",
                    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Working\"}}]}\n\n"
                );
                conn.write_all(start.as_bytes()).unwrap();
                std::thread::sleep(pause);
                continue;
            }
            let sse = concat!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n",
                ": ping\n\n",
                "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"hidden thoughts\"}}]}\n\n",
                "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello from \"}}]}\n\n",
                "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"the mock.\"},\"finish_reason\":\"stop\"}]}\n\n",
                "data: [DONE]\n\n"
            );
            conn.write_all(sse.as_bytes()).unwrap();
        }
    });
    (format!("http://{addr}/v1"), seen)
}

#[test]
fn records_a_live_run_and_replays_it() {
    let p = Project::new();
    let (url, _) = sse_server(1);
    let cassette = p.config.path().join("run.jsonl");
    let out = p.exec(&[
        "--base-url",
        &url,
        "--model",
        "local-model",
        "--record",
        cassette.to_str().unwrap(),
        "say hello",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "Hello from the mock.\n");
    assert!(!stdout(&out).contains("hidden"), "reasoning is not shown");
    let recorded = std::fs::read_to_string(&cassette).unwrap();
    assert_eq!(recorded.lines().count(), 1);
    assert!(recorded.contains("\"local-model\""));

    let again = p.exec(&[
        "--llm",
        &format!("replay:{}", cassette.display()),
        "say hello",
    ]);
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert_eq!(stdout(&again), "Hello from the mock.\n");
}

#[test]
fn config_file_and_env_reach_the_server() {
    let p = Project::new();
    let (url, seen) = sse_server(1);
    let cfg = p.config.path().join("shade/config.toml");
    std::fs::create_dir_all(cfg.parent().unwrap()).unwrap();
    std::fs::write(
        &cfg,
        format!("base_url = \"{url}\"\nmodel = \"from-file\"\n"),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_shade"))
        .args(["exec", "say hello"])
        .current_dir(p.dir.path())
        .env("XDG_CONFIG_HOME", p.config.path())
        .env("HOME", p.config.path())
        .env("OPENAI_API_KEY", "sk-from-env")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("SHADE_MODEL")
        .env_remove("SHADE_CONFIG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "Hello from the mock.\n");
    let seen = seen.lock().unwrap();
    let (head, body) = &seen[0];
    assert!(head.contains("authorization: bearer sk-from-env"), "{head}");
    let body: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(body["model"], "from-file");
    assert_eq!(body["stream"], true);
    assert!(body["tools"].as_array().unwrap().len() >= 10);
}

/// The project's AGENTS.md (and a CLAUDE.md symlinked to it, once), the user's own
/// AGENTS.md and the environment reach the model in the system message.
#[test]
fn project_instructions_reach_the_model() {
    let p = Project::new();
    std::fs::write(
        p.dir.path().join("AGENTS.md"),
        "Run ./test.sh after every edit.\n",
    )
    .unwrap();
    std::os::unix::fs::symlink("AGENTS.md", p.dir.path().join("CLAUDE.md")).unwrap();
    let global = p.config.path().join("shade/AGENTS.md");
    std::fs::create_dir_all(global.parent().unwrap()).unwrap();
    std::fs::write(&global, "Answer in English.\n").unwrap();
    let (url, seen) = sse_server(1);
    let out = p.exec(&["--base-url", &url, "--model", "m", "say hello"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let seen = seen.lock().unwrap();
    let body: serde_json::Value = serde_json::from_str(&seen[0].1).unwrap();
    let system = body["messages"][0]["content"].as_str().unwrap();
    assert_eq!(body["messages"][0]["role"], "system");
    let project = p.dir.path().canonicalize().unwrap();
    assert!(
        system.contains(&format!("Working directory: {}", project.display())),
        "{system}"
    );
    assert_eq!(
        system.matches("Run ./test.sh after every edit.").count(),
        1,
        "{system}"
    );
    let (user_at, project_at) = (
        system
            .find("Answer in English.")
            .expect("the user's AGENTS.md"),
        system.find("Run ./test.sh").unwrap(),
    );
    assert!(
        user_at < project_at,
        "the project's file comes last: {system}"
    );
}

#[test]
fn ctrl_c_stops_a_stalled_stream() {
    let p = Project::new();
    let (url, _) = sse_server_with(1, Some(Duration::from_secs(30)));
    let mut child = Command::new(env!("CARGO_BIN_EXE_shade"))
        .args(["exec", "--base-url", &url, "--model", "m", "do something"])
        .current_dir(p.dir.path())
        .env("XDG_CONFIG_HOME", p.config.path())
        .env("HOME", p.config.path())
        .env_remove("OPENAI_API_KEY")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for the first streamed word, then interrupt.
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 7];
    stdout.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"Working");
    let started = Instant::now();
    // SAFETY: signalling our own child.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGINT);
    }
    let status = child.wait().unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(status.code(), Some(130));
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(err.contains("cancelled"), "{err}");
}

/// Run `shade exec ARGS` on a pseudo-terminal (util-linux `script`), typing `input`.
fn exec_on_tty(p: &Project, args: &str, input: &str) -> Output {
    assert!(
        Command::new("script").arg("--version").output().is_ok(),
        "`script` (bsdutils) is missing: run scripts/setup.sh test"
    );
    let cmd = format!("{} exec {args}", env!("CARGO_BIN_EXE_shade"));
    run_with_input(
        Command::new("script")
            .args(["-qec", &cmd, "/dev/null"])
            .current_dir(p.dir.path())
            .env("XDG_CONFIG_HOME", p.config.path())
            .env("HOME", p.config.path()),
        input.as_bytes(),
    )
}

#[test]
fn default_mode_on_a_terminal_asks_and_obeys() {
    let p = Project::new();
    let args = format!(
        "--llm replay:{} '{PROMPT}'",
        fixtures().join("fix_add.jsonl").display()
    );
    let out = exec_on_tty(&p, &args, "y\ny\n");
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("allow the agent to change files: `edit add.sh`? [y/N]"));
    // The diff is shown before the question.
    assert!(text.contains("-echo $(( $1 - $2 ))"), "{text}");
    assert!(text.contains("+echo $(( $1 + $2 ))"), "{text}");
    assert!(text.contains("allow the agent to run a command that may write: `shell sh test.sh`?"));
    assert!(p.read("add.sh").contains("$1 + $2"));

    let p = Project::new();
    let out = exec_on_tty(&p, &args, "n\n");
    assert!(stdout(&out).contains("⊘ edit add.sh refused: The user declined"));
    assert!(
        p.read("add.sh").contains("$1 - $2"),
        "declined edit not applied"
    );
}
