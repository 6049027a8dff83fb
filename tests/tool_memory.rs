//! The agent's file tools on a file a command may have made any size (a sparse one costs
//! the branch nothing): shade's own process — which has no memory limit — must not read it
//! whole. The real `shade exec` greps a 1000 MiB sparse file through its branch; its peak
//! resident size (`VmHWM`, read from /proc while it runs) stays far below the file's size,
//! and the result says how much of the file was searched (up to the hole, which reads as
//! NULs). Needs root and /dev/fuse.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::Stdio;
use std::sync::{Arc, Mutex};

use common::cmd::shade_in;
use serde_json::{json, Value};
use shade_testkit::{last_real_user, last_tool_result, tool_results_since_user, FakeLlm, Reply};

/// Size of the sparse file.
const BIG: u64 = 1000 << 20;

/// `VmHWM` of process `pid` in MiB.
fn peak_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib >> 10
}

#[test]
fn grep_of_a_huge_sparse_file_keeps_shade_memory_bounded() {
    common::require_fuse_root();
    let project = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    // Text at the head (so it is not skipped as binary), then a hole to 1000 MiB.
    let mut head = "needle\n".to_string();
    head.push_str(&"text line\n".repeat(2000));
    let big = project.path().join("big.txt");
    std::fs::write(&big, head).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&big)
        .unwrap()
        .set_len(BIG)
        .unwrap();
    let pid: Arc<Mutex<Option<u32>>> = Arc::default();
    let peak: Arc<Mutex<Option<u64>>> = Arc::default();
    let (pid_r, peak_r) = (pid.clone(), peak.clone());
    let llm = FakeLlm::start(Arc::new(move |body: &Value| {
        match (last_real_user(body).as_str(), tool_results_since_user(body)) {
            ("search", 0) => Reply::tool("grep", json!({"pattern": "needle"})),
            ("search", _) => {
                // The grep has run; the process is still alive, waiting for this answer.
                if let Some(p) = *pid_r.lock().unwrap() {
                    *peak_r.lock().unwrap() = Some(peak_mib(p));
                }
                Reply::text("Searched.")
            }
            (other, _) => Reply::text(&format!("You said: {other}")),
        }
    }))
    .unwrap();
    let child = shade_in("exec", project.path(), home.path())
        .args(["--approval", "yolo", "search"])
        .env("SHADE_STATE_DIR", home.path().join("state"))
        .env("OPENAI_BASE_URL", &llm.base_url)
        .env("SHADE_MODEL", "main-model")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    *pid.lock().unwrap() = Some(child.id());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", common::describe(&out));
    let peak = peak
        .lock()
        .unwrap()
        .expect("the model was asked after the grep");
    eprintln!("shade exec peak RSS after the grep: {peak} MiB");
    assert!(
        peak < 300,
        "shade's peak resident size was {peak} MiB after grepping a {} MiB file",
        BIG >> 20
    );
    let result = llm
        .requests()
        .iter()
        .filter_map(last_tool_result)
        .next_back()
        .unwrap();
    assert!(result.contains("big.txt:1: needle"), "{result}");
    assert!(result.contains("only up to a NUL byte"), "{result}");
}

/// Calls tool `name` of `shade mcp`; (is_error, its text).
async fn mcp_call(
    client: &rmcp::service::Peer<rmcp::RoleClient>,
    name: &str,
    args: Value,
) -> (bool, String) {
    let Value::Object(args) = args else {
        panic!("arguments must be an object")
    };
    let params = rmcp::model::CallToolRequestParams::new(name.to_string()).with_arguments(args);
    let result = client.call_tool(params).await.unwrap();
    let text = result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n");
    (result.is_error == Some(true), text)
}

/// The red team's route: a file of empty lines (4 M lines here; the red team's 20 M took 8
/// calls to 2.5 GiB), and parallel read_file and edit calls on it from one client. Each
/// call holds only the lines it shows, and in-process calls in flight are capped: `shade
/// mcp`'s peak resident size grows by less than 8 lists of the file's lines (8 x 64 MiB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_reads_of_many_short_lines_keep_mcp_memory_bounded() {
    use rmcp::ServiceExt;
    let fx = common::Fixture::new();
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_shade"));
    cmd.args(["mcp", "--no-lint"])
        .current_dir(&fx.project)
        .env("SHADE_STATE_DIR", fx.state.root());
    let transport = rmcp::transport::TokioChildProcess::new(cmd).unwrap();
    let pid = transport.id().unwrap();
    let client = ().serve(transport).await.unwrap();
    let (err, text) = mcp_call(client.peer(), "create_branch", json!({})).await;
    assert!(!err, "{text}");
    let id = text
        .split_whitespace()
        .nth(2)
        .unwrap()
        .trim_end_matches(|c: char| !c.is_alphanumeric())
        .to_string();
    let make = "head -c 4000000 /dev/zero | tr '\\0' '\\n' > nl.txt && ls -l nl.txt";
    let (err, text) = mcp_call(
        client.peer(),
        "run_command",
        json!({"branch": id, "command": make}),
    )
    .await;
    assert!(!err && text.contains("4000000"), "{text}");
    let before = peak_mib(pid);
    let spawn = |name: &'static str, args: Value| {
        let peer = client.peer().clone();
        tokio::spawn(async move { mcp_call(&peer, name, args).await })
    };
    let reads: Vec<_> = (0..8)
        .map(|_| {
            spawn(
                "read_file",
                json!({"branch": id, "path": "nl.txt", "limit": 1}),
            )
        })
        .collect();
    // An old_string that is not in the file: edit's rule repair looks line by line.
    let edits: Vec<_> = (0..2)
        .map(|_| {
            spawn(
                "edit",
                json!({"branch": id, "path": "nl.txt", "old_string": "  x  \n", "new_string": "y\n"}),
            )
        })
        .collect();
    let mut read_answers = Vec::new();
    for r in reads {
        read_answers.push(r.await.unwrap());
    }
    let mut edit_answers = Vec::new();
    for e in edits {
        edit_answers.push(e.await.unwrap());
    }
    let (reads, edits) = (read_answers, edit_answers);
    let after = peak_mib(pid);
    eprintln!("shade mcp peak RSS: {before} MiB -> {after} MiB over 8 reads and 2 edits");
    for (err, text) in &reads {
        assert!(!err, "{text}");
        assert!(
            text.contains("showing lines 1-1 of 4000000 total lines"),
            "{text}"
        );
    }
    for (err, text) in &edits {
        assert!(err, "{text}");
        assert!(text.contains("not found"), "{text}");
    }
    assert!(
        after.saturating_sub(before) < 100,
        "shade mcp's peak resident size grew from {before} to {after} MiB"
    );
    client.cancel().await.unwrap();
    common::assert_no_shade_mounts(&fx.state);
}
