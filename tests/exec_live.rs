//! `shade exec` without `--shadow`: each tool call runs in a branch and is accepted into the
//! project right after it (the default chat session's engine), so what its shell changed —
//! `sed -i` included — is in `shade log` and `shade undo` takes it back, and its writes
//! outside the project never reach the host; `--unconfined` keeps the old direct writes.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::{Output, Stdio};
use std::sync::Arc;

use common::cmd::shade_in;
use common::describe as out;
use serde_json::{json, Value};
use shade_testkit::{last_real_user, tool_results_since_user, FakeLlm, Reply};

fn router(body: &Value) -> Reply {
    match (last_real_user(body).as_str(), tool_results_since_user(body)) {
        ("tidy", 0) => Reply::tool(
            "shell",
            json!({"command": "sed -i s/one/two/ notes.txt && echo leak > \"$HOME/leak.txt\""}),
        ),
        (_, _) => Reply::text("Done."),
    }
}

struct Run {
    project: tempfile::TempDir,
    home: tempfile::TempDir,
    llm: FakeLlm,
}

impl Run {
    fn new() -> Run {
        let project = tempfile::tempdir().unwrap();
        std::fs::write(project.path().join("notes.txt"), "one\n").unwrap();
        Run {
            project,
            home: tempfile::tempdir().unwrap(),
            llm: FakeLlm::start(Arc::new(router)).unwrap(),
        }
    }

    fn shade(&self, sub: &str, args: &[&str]) -> Output {
        shade_in(sub, self.project.path(), self.home.path())
            .args(args)
            .env("SHADE_STATE_DIR", self.home.path().join("state"))
            .env("OPENAI_BASE_URL", &self.llm.base_url)
            .env("SHADE_MODEL", "main-model")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    fn notes(&self) -> String {
        std::fs::read_to_string(self.project.path().join("notes.txt")).unwrap()
    }
}

#[test]
fn exec_accepts_each_tool_call_so_shade_undo_takes_shell_edits_back() {
    common::require_fuse_root();
    let r = Run::new();
    let o = r.shade("exec", &["--approval", "yolo", "tidy"]);
    assert!(o.status.success(), "{}", out(&o));
    assert_eq!(r.notes(), "two\n");
    assert!(
        !r.home.path().join("leak.txt").exists(),
        "the shell wrote into the host's home"
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("dropped with the session, never written to the host")
            && err.contains("leak.txt"),
        "{err}"
    );
    let log = r.shade("log", &["--json"]);
    assert!(log.status.success(), "{}", out(&log));
    let log: Vec<Value> = serde_json::from_slice(&log.stdout).unwrap();
    assert_eq!(log.len(), 1, "{log:?}");
    assert!(
        log[0]["origin"].as_str().unwrap().contains("exec"),
        "{log:?}"
    );
    let u = r.shade("undo", &[]);
    assert!(u.status.success(), "{}", out(&u));
    assert_eq!(r.notes(), "one\n");
    // Nothing of the run is left mounted or stored.
    let branches = r.home.path().join("state/branches");
    let left: Vec<_> = std::fs::read_dir(&branches)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn exec_unconfined_writes_directly_and_records_nothing() {
    common::require_fuse_root();
    let r = Run::new();
    let o = r.shade("exec", &["--unconfined", "--approval", "yolo", "tidy"]);
    assert!(o.status.success(), "{}", out(&o));
    assert_eq!(r.notes(), "two\n");
    // Unconfined: the command really ran on the host.
    assert!(r.home.path().join("leak.txt").exists());
    let log = r.shade("log", &["--json"]);
    let log: Vec<Value> = serde_json::from_slice(&log.stdout).unwrap();
    assert!(log.is_empty(), "{log:?}");
}
