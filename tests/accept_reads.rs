//! Lost updates (issue 19): a branch that read a file, and wrote something after, must not be
//! accepted over an edit the user made to that file meanwhile — even though the branch's own
//! copy of the file was made after the edit. The real binary, real mounts; the command and the
//! test meet at flag files (no timing assumptions).
#![allow(clippy::unwrap_used)]

mod common;

use common::describe as text;

use common::{wait_until, Fixture};
use serde_json::{json, Value};
use shade_testkit::{tool_results_since_user, FakeLlm, Reply};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Arc;

/// `shade run --accept -- sh -c SCRIPT` in the background, with `$READY` and `$GO` naming
/// flag files outside the project: the script touches `$READY` when it has read what it
/// needs, then waits for `$GO`.
fn spawn_run(fx: &Fixture, tag: &str, script: &str) -> (Child, PathBuf, PathBuf) {
    let ready = fx.tmp.path().join(format!("ready-{tag}"));
    let go = fx.tmp.path().join(format!("go-{tag}"));
    let child = fx
        .shade()
        .args(["run", "--accept", "--", "sh", "-c", script])
        .env("READY", &ready)
        .env("GO", &go)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    (child, ready, go)
}

fn wait_flag(p: &Path) {
    wait_until(&format!("{} to appear", p.display()), 60, || p.exists());
}

/// Wait for `$GO`, or for `$READY` to vanish: a failed test's fixture removes both, and the
/// command must then end instead of waiting (with its branch mounted) for ever.
const WAIT: &str =
    "touch \"$READY\"; while [ ! -e \"$GO\" ] && [ -e \"$READY\" ]; do sleep 0.05; done";

#[test]
fn a_file_read_then_rewritten_conflicts_with_the_users_edit_in_between() {
    let fx = Fixture::new();
    fx.write("file", "line1\nline2\n");
    let script = format!("c=$(cat file); {WAIT}; printf '%s\\nAGENT LINE\\n' \"$c\" > file");
    let (child, ready, go) = spawn_run(&fx, "a", &script);
    wait_flag(&ready);
    // The user edits the file after the command read it, before it writes.
    std::fs::write(fx.project.join("file"), "line1\nline2\nUSER EDIT\n").unwrap();
    std::fs::write(&go, "").unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(124), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("file: changed meanwhile"),
        "{}",
        text(&o)
    );
    assert_eq!(fx.read("file"), "line1\nline2\nUSER EDIT\n");
}

#[test]
fn two_concurrent_read_modify_write_runs_never_lose_an_increment() {
    let fx = Fixture::new();
    fx.write("counter", "0\n");
    let script = format!("n=$(cat counter); {WAIT}; echo $((n+1)) > counter");
    let (a, ready_a, go_a) = spawn_run(&fx, "a", &script);
    let (b, ready_b, go_b) = spawn_run(&fx, "b", &script);
    // Both have read 0 before either writes.
    wait_flag(&ready_a);
    wait_flag(&ready_b);
    std::fs::write(&go_a, "").unwrap();
    let oa = a.wait_with_output().unwrap();
    std::fs::write(&go_b, "").unwrap();
    let ob = b.wait_with_output().unwrap();
    let mut codes = [oa.status.code(), ob.status.code()];
    codes.sort();
    assert_eq!(
        codes,
        [Some(0), Some(124)],
        "exactly one accepts:\n{}\n{}",
        text(&oa),
        text(&ob)
    );
    assert_eq!(fx.read("counter"), "1\n");
}

#[test]
fn reads_after_the_last_change_do_not_conflict() {
    // An edit, then a build or test run that reads the tree (like `sed -i … && cargo test`):
    // a user edit of a file read only after the branch's last change is no conflict.
    let fx = Fixture::new();
    fx.write("src.txt", "old\n");
    fx.write("other.txt", "other\n");
    let script = format!("echo new > src.txt; cat other.txt src.txt > /dev/null; {WAIT}");
    let (child, ready, go) = spawn_run(&fx, "a", &script);
    wait_flag(&ready);
    std::fs::write(fx.project.join("other.txt"), "USER EDIT\n").unwrap();
    std::fs::write(&go, "").unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(fx.read("src.txt"), "new\n");
    assert_eq!(fx.read("other.txt"), "USER EDIT\n");
}

#[test]
fn a_listing_acted_on_conflicts_when_the_directory_changed() {
    // `rm` of what a listing showed: the user's new file meanwhile makes the listing stale.
    let fx = Fixture::new();
    fx.write("d/a.o", "a");
    fx.write("d/b.o", "b");
    let script = format!("ls d > /dev/null; {WAIT}; rm d/a.o d/b.o");
    let (child, ready, go) = spawn_run(&fx, "a", &script);
    wait_flag(&ready);
    fx.write("d/c.o", "user");
    std::fs::write(&go, "").unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(124), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("d: entries added or removed meanwhile"),
        "{}",
        text(&o)
    );
    for f in ["d/a.o", "d/b.o", "d/c.o"] {
        assert!(fx.project.join(f).exists(), "{f} went");
    }
}

#[test]
fn the_agent_reading_a_file_the_user_then_edits_does_not_overwrite_the_edit() {
    let fx = Fixture::new();
    fx.write("notes.txt", "first\n");
    let project = fx.project.clone();
    // The model reads notes.txt; while it "thinks", the user edits the file; then the model
    // writes its version, derived from what it read.
    let llm = FakeLlm::start(Arc::new(
        move |body: &Value| match tool_results_since_user(body) {
            0 => Reply::tool("read_file", json!({"path": "notes.txt"})),
            1 => {
                std::fs::write(project.join("notes.txt"), "first\nUSER EDIT\n").unwrap();
                Reply::tool(
                    "write_file",
                    json!({"path": "notes.txt", "content": "first\nAGENT LINE\n"}),
                )
            }
            _ => Reply::text("Done."),
        },
    ))
    .unwrap();
    let config = fx.tmp.path().join("config.toml");
    std::fs::write(&config, "").unwrap();
    let o = fx
        .shade()
        .args([
            "exec",
            "--shadow",
            "--accept",
            "--approval",
            "yolo",
            "--config",
        ])
        .arg(&config)
        .arg("add a line to notes.txt")
        .env("OPENAI_BASE_URL", &llm.base_url)
        .env("OPENAI_API_KEY", "test-key")
        .env("SHADE_MODEL", "main-model")
        .env("XDG_CONFIG_HOME", fx.tmp.path())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(124), "{}", text(&o));
    assert_eq!(fx.read("notes.txt"), "first\nUSER EDIT\n");
}

#[test]
fn a_directory_removed_in_the_branch_keeps_what_the_user_changed_inside_it() {
    // `rm -rf docs` in the branch, while the user edits a file in docs and adds another:
    // accepting would delete the tree as it is then, with the user's work in it.
    for user in ["edit", "add"] {
        let fx = Fixture::new();
        fx.write("docs/a.md", "a\n");
        fx.write("docs/sub/b.md", "b\n");
        let script = format!("rm -rf docs; {WAIT}");
        let (child, ready, go) = spawn_run(&fx, "a", &script);
        wait_flag(&ready);
        match user {
            "edit" => fx.write("docs/sub/b.md", "USER EDIT\n"),
            _ => fx.write("docs/sub/new.md", "USER NEW\n"),
        }
        std::fs::write(&go, "").unwrap();
        let o = child.wait_with_output().unwrap();
        assert_eq!(o.status.code(), Some(124), "{user}: {}", text(&o));
        assert!(fx.project.join("docs/a.md").exists(), "{user}");
        match user {
            "edit" => assert_eq!(fx.read("docs/sub/b.md"), "USER EDIT\n"),
            _ => assert_eq!(fx.read("docs/sub/new.md"), "USER NEW\n"),
        }
    }
    // Without a change inside, the removal is accepted.
    let fx = Fixture::new();
    fx.write("docs/a.md", "a\n");
    let o = fx
        .shade()
        .args(["run", "--accept", "--", "rm", "-rf", "docs"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(!fx.project.join("docs").exists());
}
