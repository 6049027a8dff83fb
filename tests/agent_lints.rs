//! The agent's lints, end to end: the real `shade` binary working in a branch (`exec
//! --shadow`, `chat --shadow`, a speculation in `chat`) against real projects with real
//! checkers (cargo on a crate with a registry dependency, built offline; ruff), the model
//! a local fake server. What the model reads back after an edit must be exactly the
//! diagnostic the edit introduced, not the warning the project already had; the
//! `diagnostics` tool must answer; the real tree must stay as it was until accept.
#![allow(clippy::unwrap_used)]

mod common;

use common::describe as out;

use common::wait_until;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::chat::{wait_ghost, Chat};
use common::cmd::tool_results;
use common::{assert_no_shade_mounts, snapshot, Fixture};
use serde_json::{json, Value};
use shade_testkit::{
    is_suggestion_request, last_real_user, last_tool_result, tool_results_since_user, FakeLlm,
    Reply,
};

/// A budget no checker here comes near: the tests are about what is reported, not when.
const CONFIG: &str = "[lint]\nbudget_ms = 600000\n";

/// The example crate (memchr from the registry; one unused variable, `verbose`, in main.rs).
fn rust_fixture() -> Fixture {
    let fx = Fixture::new();
    copy_tree(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/lint-demo"),
        &fx.project,
    );
    fx
}

fn copy_tree(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_name() == "target" {
            continue;
        }
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&dst).unwrap();
            copy_tree(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), &dst).unwrap();
        }
    }
}

/// main.rs with a new function that returns the wrong type (line 14), called from main.
const MAIN_BROKEN: &str = "\
//! Counts lines of its input with memchr; has one warning on purpose (`verbose`).

mod stats;

fn main() {
    let verbose = std::env::args().any(|a| a == \"-v\");
    let mut input = Vec::new();
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut input);
    let lines = stats::count_lines(&input) + width();
    println!(\"{lines} lines, longest {}\", stats::longest_line(&input));
}

fn width() -> usize {
    \"wide\"
}
";

const TYPE_ERROR: &str = "src/main.rs:14:5: error: mismatched types [E0308] (cargo)";

/// The model of the Rust session: write the broken main.rs, ask for diagnostics, fix it.
fn rust_model(body: &Value) -> Reply {
    match tool_results_since_user(body) {
        0 => Reply::tool(
            "write_file",
            json!({"path": "src/main.rs", "content": MAIN_BROKEN}),
        ),
        1 => Reply::tool("diagnostics", json!({})),
        2 => Reply::tool(
            "edit",
            json!({"path": "src/main.rs", "old_string": "    \"wide\"", "new_string": "    4"}),
        ),
        _ => Reply::text("Done."),
    }
}

/// The tool results the model received, in order (from the last request of the run).
fn tool_names(body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .map(|t| {
            t.iter()
                .map(|t| t["function"]["name"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}

fn exec_shadow(fx: &Fixture, llm: &FakeLlm, config: &Path, extra: &[&str]) -> Output {
    fx.shade()
        .args(["exec", "--shadow", "--approval", "yolo", "--config"])
        .arg(config)
        .args(extra)
        .arg("give main a width")
        .env("OPENAI_BASE_URL", &llm.base_url)
        .env("OPENAI_API_KEY", "test-key")
        .env("SHADE_MODEL", "main-model")
        .env("SHADE_LOG", "error")
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .unwrap()
}

#[test]
fn exec_shadow_hands_the_model_exactly_the_type_error_its_edit_made() {
    let fx = rust_fixture();
    let config = fx.tmp.path().join("config.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let before = snapshot(&fx.project);

    let llm = FakeLlm::start(Arc::new(rust_model)).unwrap();
    let o = exec_shadow(&fx, &llm, &config, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    // A shadow session offers the tool.
    assert!(
        tool_names(&llm.requests()[0]).contains(&"diagnostics".to_string()),
        "{:?}",
        tool_names(&llm.requests()[0])
    );
    let results = tool_results(&llm);
    assert_eq!(results.len(), 3, "{results:#?}");
    // After the write: the type error, and not `verbose`, which the project already had in
    // the same file.
    assert_eq!(
        results[0],
        format!(
            "Overwrote src/main.rs (15 lines).\n\nNew diagnostics in src/main.rs:\n{TYPE_ERROR}"
        )
    );
    // The model asks: every file it edited.
    assert_eq!(results[1], TYPE_ERROR);
    // The fix leaves nothing new.
    assert!(
        results[2].ends_with(".\n\nNo new diagnostics in src/main.rs."),
        "{}",
        results[2]
    );
    // The project's one change; what cargo wrote in its home (its global cache) is listed
    // apart, as outside the project, and not accepted.
    let stdout = String::from_utf8_lossy(&o.stdout);
    let project_part = stdout
        .split("outside the project")
        .next()
        .unwrap_or_default();
    assert!(
        project_part.ends_with("Done.\nM src/main.rs\n"),
        "{}",
        out(&o)
    );
    // Dropped: the real tree is as it was (no edit, no target/ from the branch's cargo).
    assert_eq!(snapshot(&fx.project), before);
    assert_no_shade_mounts(&fx.state);

    // Accepted: the edit lands, the branch's build output does not.
    let llm = FakeLlm::start(Arc::new(rust_model)).unwrap();
    let o = exec_shadow(&fx, &llm, &config, &["--accept"]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    assert_eq!(tool_results(&llm)[1], TYPE_ERROR);
    assert_eq!(
        fx.read("src/main.rs"),
        MAIN_BROKEN.replace("    \"wide\"", "    4")
    );
    assert!(!fx.project.join("target").exists(), "{}", out(&o));
    assert_no_shade_mounts(&fx.state);
}

const PY: &str = "import os\n\n\ndef add(a, b):\n    return a + b\n";
const F821: &str = "calc.py:5:16: error: Undefined name `c` [F821] (ruff)";

fn py_files(project: &Path) {
    std::fs::write(project.join("calc.py"), PY).unwrap();
    std::fs::write(
        project.join("pyproject.toml"),
        "[project]\nname = \"calc\"\nversion = \"0.1\"\n",
    )
    .unwrap();
    let config = project.parent().unwrap().join("config/shade");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("config.toml"), CONFIG).unwrap();
}

fn read(p: PathBuf) -> String {
    std::fs::read_to_string(p).unwrap()
}

/// A speculation edits in its branch and reads the finding back before the user accepts;
/// the plain session offers no `diagnostics` tool (its live turns have no branch).
#[test]
fn a_speculation_reads_its_edits_findings_and_accept_brings_the_edit() {
    common::require_fuse_root();
    let chat = Chat::new(|body: &Value| {
        let user = last_real_user(body);
        if is_suggestion_request(body) {
            let next = if user == "what is wrong?" {
                "use c"
            } else {
                ""
            };
            return Reply::text(next);
        }
        match (user.as_str(), tool_results_since_user(body)) {
            ("hello", _) => Reply::text("Hello."),
            ("what is wrong?", _) => Reply::text("add should use c."),
            ("use c", 0) => Reply::tool(
                "edit",
                json!({"path": "calc.py", "old_string": "a + b", "new_string": "a + c"}),
            ),
            ("use c", _) => Reply::text("c is undefined now."),
            (other, _) => Reply::text(&format!("You said: {other}")),
        }
    });
    py_files(&chat.project);
    let tty = chat.start(&["--approval", "yolo"]);
    tty.say("hello");
    tty.wait_text("Hello.", 60);
    tty.say("what is wrong?");
    tty.wait_text("add should use c.", 60);
    wait_ghost(&tty, "use c");
    let speculated = |r: &Value| {
        !is_suggestion_request(r) && last_real_user(r) == "use c" && r["model"] == "fast-model"
    };
    wait_until("the speculation's answer", 60, || {
        chat.llm
            .requests()
            .iter()
            .any(|r| speculated(r) && tool_results_since_user(r) == 1)
    });
    let reqs = chat.llm.requests();
    let after_edit = reqs
        .iter()
        .find(|r| speculated(r) && tool_results_since_user(r) == 1)
        .unwrap();
    let result = last_tool_result(after_edit).unwrap();
    assert!(
        result.ends_with(&format!("\n\nNew diagnostics in calc.py:\n{F821}")),
        "{result}"
    );
    // The unused import was there before.
    assert!(!result.contains("F401"), "{result}");
    assert!(!tool_names(after_edit).contains(&"diagnostics".to_string()));
    // Nothing reached the real tree yet.
    assert_eq!(read(chat.project.join("calc.py")), PY);
    // Accept: Enter on the suggestion.
    tty.keys(&["Enter"]);
    tty.wait_text("c is undefined now.", 60);
    tty.wait_text("speculated ahead: 1 change written", 60);
    assert_eq!(
        read(chat.project.join("calc.py")),
        PY.replace("a + b", "a + c")
    );
    assert!(!chat.project.join(".ruff_cache").exists());
    tty.keys(&["C-d"]);
    wait_until("the session to end", 60, || !tty.alive());
}

/// `chat --shadow` without a terminal: the edit comes back with its finding, the
/// `diagnostics` tool answers, /accept writes the branch.
#[test]
fn chat_shadow_lints_in_its_branch_until_accept() {
    common::require_fuse_root();
    let chat = Chat::new(|body: &Value| {
        match (last_real_user(body).as_str(), tool_results_since_user(body)) {
            ("use c", 0) => Reply::tool(
                "edit",
                json!({"path": "calc.py", "old_string": "a + b", "new_string": "a + c"}),
            ),
            ("use c", 1) => Reply::tool("diagnostics", json!({"paths": ["calc.py"]})),
            (_, _) => Reply::text("c is undefined now."),
        }
    });
    py_files(&chat.project);
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_shade"))
        .args(["chat", "--shadow", "--approval", "yolo", "--no-suggest"])
        .current_dir(&chat.project)
        .envs(chat.env())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"use c\n/diff\n/accept\n").unwrap();
    }
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    let reqs = chat.llm.requests();
    assert!(tool_names(&reqs[0]).contains(&"diagnostics".to_string()));
    let results: Vec<String> = reqs.last().unwrap()["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(shade_testkit::content_text)
        .collect();
    assert_eq!(results.len(), 2, "{results:#?}");
    assert!(
        results[0].ends_with(&format!("\n\nNew diagnostics in calc.py:\n{F821}")),
        "{}",
        results[0]
    );
    assert_eq!(results[1], F821);
    // /accept wrote the edit, and only the edit (not ruff's cache).
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("accepted 1 change\n"),
        "{}",
        out(&o)
    );
    assert_eq!(
        read(chat.project.join("calc.py")),
        PY.replace("a + b", "a + c")
    );
    assert!(!chat.project.join(".ruff_cache").exists(), "{}", out(&o));
    assert_no_shade_mounts(&shade_fusefs::StateDir::at(chat.state.clone()));
}

/// A budget of 0: the edit's result says the findings are not ready (pointing at the tool),
/// and the session ends while the baseline still runs in its own branch: that checker is
/// killed and its branch unmounted, nothing left behind.
#[test]
fn a_session_ending_mid_baseline_leaves_no_branch_behind() {
    let fx = rust_fixture();
    let config = fx.tmp.path().join("config.toml");
    std::fs::write(&config, "[lint]\nbudget_ms = 0\n").unwrap();
    let llm = FakeLlm::start(Arc::new(|body: &Value| {
        match tool_results_since_user(body) {
            0 => Reply::tool(
                "write_file",
                json!({"path": "src/main.rs", "content": MAIN_BROKEN}),
            ),
            _ => Reply::text("Done."),
        }
    }))
    .unwrap();
    let o = exec_shadow(&fx, &llm, &config, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    assert_eq!(
        tool_results(&llm),
        ["Overwrote src/main.rs (15 lines).\n\n(diagnostics for src/main.rs not ready within 0s; \
          call `diagnostics` to wait for them)"]
    );
    assert_no_shade_mounts(&fx.state);
    let left = std::fs::read_dir(fx.state.branches())
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(left, 0, "a branch store was left behind");
}

/// A session working in a branch starts checking the unedited project when it starts, so
/// the first edit does not wait for it: the model here answers only once that result is in
/// the cache (it never edits), which never happens if the check waits for an edit.
#[test]
fn a_shadow_session_checks_the_unedited_project_before_the_first_edit() {
    common::require_fuse_root();
    let fx = rust_fixture();
    let config = fx.tmp.path().join("config.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let cache = fx.state.root().join("lint/baseline");
    let seen = cache.clone();
    let llm = FakeLlm::start(Arc::new(move |_body: &Value| {
        let ready = || {
            std::fs::read_dir(&seen)
                .map(|d| {
                    d.flatten()
                        .any(|e| e.file_name().to_string_lossy().ends_with(".json"))
                })
                .unwrap_or(false)
        };
        let deadline = Instant::now() + Duration::from_secs(300);
        while !ready() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        Reply::text(if ready() {
            "Baseline seen."
        } else {
            "No baseline."
        })
    }))
    .unwrap();
    let o = exec_shadow(&fx, &llm, &config, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).starts_with("Baseline seen."),
        "{}",
        out(&o)
    );
    assert_no_shade_mounts(&fx.state);
}
