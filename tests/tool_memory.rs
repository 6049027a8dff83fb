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
    assert!(
        result.contains("only up to a NUL byte"),
        "{result}"
    );
}
