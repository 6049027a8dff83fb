//! Each tool on a temporary project: results, errors the model can act on, path confinement.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use shade_agent::tools::edit::EditError;
use shade_agent::tools::{ToolContext, ToolError, ToolOutput, ToolRegistry};
use shade_agent::workspace::{PathError, Workspace};
use tokio_util::sync::CancellationToken;

struct Fixture {
    dir: tempfile::TempDir,
    ctx: ToolContext,
    tools: ToolRegistry,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::new(dir.path()).unwrap();
        let mut ctx = ToolContext::new(ws);
        ctx.global_memory = Some(dir.path().join("global-config/SHADE.md"));
        ctx.output_dir = dir.path().join("state/tool-output");
        Self {
            dir,
            ctx,
            tools: ToolRegistry::standard(),
        }
    }

    fn path(&self, rel: &str) -> std::path::PathBuf {
        self.dir.path().join(rel)
    }

    fn write(&self, rel: &str, content: &str) {
        let p = self.path(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }

    fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.path(rel)).unwrap()
    }

    async fn call(&self, tool: &str, args: Value) -> Result<ToolOutput, ToolError> {
        self.call_cancel(tool, args, &CancellationToken::new())
            .await
    }

    async fn call_cancel(
        &self,
        tool: &str,
        args: Value,
        cancel: &CancellationToken,
    ) -> Result<ToolOutput, ToolError> {
        let t = self.tools.get(tool).unwrap();
        t.run(args, &self.ctx, cancel).await
    }
}

#[tokio::test]
async fn read_file_pages_with_a_notice_and_detects_binary() {
    let f = Fixture::new();
    let text: String = (1..=30).map(|i| format!("line {i}\n")).collect();
    f.write("big.txt", &text);
    let out = f
        .call(
            "read_file",
            json!({"path": "big.txt", "offset": 11, "limit": 5}),
        )
        .await
        .unwrap();
    assert!(out.content.contains("showing lines 11-15 of 30"));
    assert!(out.content.contains("offset: 16"), "{}", out.content);
    assert!(out
        .content
        .ends_with("line 11\nline 12\nline 13\nline 14\nline 15"));
    assert_eq!(out.display, "Read big.txt (lines 11-15 of 30)");
    let all = f
        .call("read_file", json!({"path": "big.txt"}))
        .await
        .unwrap();
    assert_eq!(all.content, text, "a whole small file comes back exactly");

    std::fs::write(f.path("img.bin"), [0u8, 159, 146, 150, 0, 1]).unwrap();
    let bin = f
        .call("read_file", json!({"path": "img.bin"}))
        .await
        .unwrap();
    assert!(bin.content.contains("binary file"));

    let missing = f.call("read_file", json!({"path": "nope.txt"})).await;
    assert!(matches!(missing, Err(ToolError::Failed(ref m)) if m.contains("not found")));
    std::fs::create_dir(f.path("d")).unwrap();
    let dir = f.call("read_file", json!({"path": "d"})).await;
    assert!(matches!(dir, Err(ToolError::Failed(ref m)) if m.contains("directory")));
    let bad = f.call("read_file", json!({"file": "x"})).await;
    assert!(matches!(bad, Err(ToolError::InvalidArgs(_))), "{bad:?}");
}

#[tokio::test]
async fn edit_replaces_exactly_with_distinct_errors() {
    let f = Fixture::new();
    f.write("a.rs", "let x = 1;\nlet y = 1;\n");
    let out = f
        .call(
            "edit",
            json!({"path": "a.rs", "old_string": "x = 1", "new_string": "x = 2"}),
        )
        .await
        .unwrap();
    assert_eq!(f.read("a.rs"), "let x = 2;\nlet y = 1;\n");
    assert!(out.display.starts_with("Edited a.rs"));

    let count = f
        .call(
            "edit",
            json!({"path": "a.rs", "old_string": "let", "new_string": "const"}),
        )
        .await;
    assert_eq!(
        count,
        Err(ToolError::Edit(EditError::CountMismatch {
            path: "a.rs".into(),
            expected: 1,
            found: 2
        }))
    );
    f.call(
        "edit",
        json!({"path": "a.rs", "old_string": "let", "new_string": "const", "expected_replacements": 2}),
    )
    .await
    .unwrap();
    assert_eq!(f.read("a.rs"), "const x = 2;\nconst y = 1;\n");

    let nf = f
        .call(
            "edit",
            json!({"path": "a.rs", "old_string": "zzz", "new_string": "q"}),
        )
        .await;
    assert_eq!(nf, Err(ToolError::Edit(EditError::NotFound("a.rs".into()))));
    let missing = f
        .call(
            "edit",
            json!({"path": "b.rs", "old_string": "a", "new_string": "b"}),
        )
        .await;
    assert_eq!(
        missing,
        Err(ToolError::Edit(EditError::FileMissing("b.rs".into())))
    );
    f.call(
        "edit",
        json!({"path": "new/c.rs", "old_string": "", "new_string": "fn c() {}\n"}),
    )
    .await
    .unwrap();
    assert_eq!(f.read("new/c.rs"), "fn c() {}\n");
    let exists = f
        .call(
            "edit",
            json!({"path": "new/c.rs", "old_string": "", "new_string": "x"}),
        )
        .await;
    assert!(matches!(
        exists,
        Err(ToolError::Edit(EditError::AlreadyExists(_)))
    ));
    // Error texts tell the model what to do next.
    assert!(nf.unwrap_err().to_string().contains("read the file again"));
}

#[tokio::test]
async fn write_file_creates_parents() {
    let f = Fixture::new();
    let out = f
        .call(
            "write_file",
            json!({"path": "x/y/z.txt", "content": "a\nb\n"}),
        )
        .await
        .unwrap();
    assert_eq!(f.read("x/y/z.txt"), "a\nb\n");
    assert_eq!(out.display, "Created x/y/z.txt (2 lines)");
    let again = f
        .call("write_file", json!({"path": "x/y/z.txt", "content": "c"}))
        .await
        .unwrap();
    assert!(again.display.starts_with("Overwrote"));
}

#[tokio::test]
async fn grep_glob_ls_respect_gitignore() {
    let f = Fixture::new();
    f.write(".gitignore", "target/\n*.log\n");
    f.write("src/main.rs", "fn main() {\n    helper();\n}\n");
    f.write("src/util/helper.rs", "pub fn helper() {}\n");
    f.write("target/debug/gen.rs", "fn helper() {}\n");
    f.write("run.log", "helper\n");
    let g = f
        .call("grep", json!({"pattern": "helper\\("}))
        .await
        .unwrap();
    assert_eq!(
        g.content,
        "src/main.rs:2:     helper();\nsrc/util/helper.rs:1: pub fn helper() {}"
    );
    assert_eq!(g.display, "grep /helper\\(/: 2 matches in 2 files");
    let gi = f
        .call("grep", json!({"pattern": "HELPER", "case_insensitive": true, "include": "*.rs", "path": "src/util"}))
        .await
        .unwrap();
    assert_eq!(gi.content, "src/util/helper.rs:1: pub fn helper() {}");
    let none = f
        .call("grep", json!({"pattern": "nothing_here"}))
        .await
        .unwrap();
    assert!(none.content.starts_with("No matches"));
    let bad = f.call("grep", json!({"pattern": "("})).await;
    assert!(matches!(bad, Err(ToolError::InvalidArgs(_))));

    let gl = f.call("glob", json!({"pattern": "**/*.rs"})).await.unwrap();
    assert_eq!(gl.content, "src/main.rs\nsrc/util/helper.rs");
    let ls = f.call("ls", json!({})).await.unwrap();
    assert!(
        ls.content.starts_with("src/\ntarget/\n.gitignore"),
        "{}",
        ls.content
    );
}

#[tokio::test]
async fn shell_reports_exit_code_output_and_caps() {
    let f = Fixture::new();
    let out = f
        .call(
            "shell",
            json!({"command": "echo out; echo err >&2; exit 3"}),
        )
        .await
        .unwrap();
    assert_eq!(out.content, "Exit code: 3\nStdout:\nout\nStderr:\nerr");
    assert!(out.display.contains("exit code: 3"), "{}", out.display);
    // A FIFO is not read (it would block forever).
    let fifo = f.path("pipe");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let r = f.call("read_file", json!({"path": "pipe"})).await;
    assert!(matches!(r, Err(ToolError::Failed(ref m)) if m.contains("not a regular file")));
    // Runs in the workspace root.
    let pwd = f.call("shell", json!({"command": "pwd"})).await.unwrap();
    assert!(pwd
        .content
        .contains(f.ctx.workspace.root().to_str().unwrap()));
    // With summaries off, big output is cut, head and tail kept.
    let uncapped = shade_agent::tools::shell::Shell {
        output_budget: 0,
        ..Default::default()
    };
    let big = shade_agent::tools::Tool::run(
        &uncapped,
        json!({"command": "seq 1 100000"}),
        &f.ctx,
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    assert!(big.content.len() < 40_000, "{}", big.content.len());
    assert!(big.content.contains("bytes omitted"));
    assert!(big.content.contains("\n100000"), "tail is kept");
}

fn alive(pid: u32) -> bool {
    // A zombie counts as dead.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.contains(") Z "))
        .unwrap_or(false)
}

fn wait_dead(pid: u32) -> bool {
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        if !alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[tokio::test]
async fn shell_timeout_kills_the_process_group() {
    let f = Fixture::new();
    let started = Instant::now();
    let out = f
        .call(
            "shell",
            json!({"command": "sleep 30 & echo $! > bg.pid; sleep 30", "timeout_ms": 300}),
        )
        .await
        .unwrap();
    assert!(out.content.starts_with("Timed out"), "{}", out.content);
    assert!(started.elapsed() < Duration::from_secs(10));
    let pid: u32 = f.read("bg.pid").trim().parse().unwrap();
    assert!(
        wait_dead(pid),
        "background child {pid} survived the timeout"
    );
}

#[tokio::test]
async fn shell_cancel_kills_the_process_group() {
    let f = Fixture::new();
    let cancel = CancellationToken::new();
    let c2 = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        c2.cancel();
    });
    let started = Instant::now();
    let out = f
        .call_cancel(
            "shell",
            json!({"command": "sleep 30 & echo $! > bg.pid; sleep 30"}),
            &cancel,
        )
        .await;
    assert_eq!(out, Err(ToolError::Cancelled));
    assert!(started.elapsed() < Duration::from_secs(10));
    let pid: u32 = f.read("bg.pid").trim().parse().unwrap();
    assert!(wait_dead(pid), "background child {pid} survived the cancel");
}

#[tokio::test]
async fn todo_write_validates() {
    let f = Fixture::new();
    let ok = f
        .call(
            "todo_write",
            json!({"todos": [
                {"id": "1", "content": "read", "status": "completed"},
                {"id": "2", "content": "fix", "status": "in_progress"},
                {"id": "3", "content": "test", "status": "pending"}]}),
        )
        .await
        .unwrap();
    assert_eq!(ok.display, "Todos: 1/3 done");
    assert!(ok.content.contains("[~] 2 fix"));
    assert_eq!(f.ctx.todos.lock().unwrap().len(), 3);
    let two = f
        .call(
            "todo_write",
            json!({"todos": [
                {"id": "1", "content": "a", "status": "in_progress"},
                {"id": "2", "content": "b", "status": "in_progress"}]}),
        )
        .await;
    assert!(matches!(two, Err(ToolError::InvalidArgs(_))));
    let bad_status = f
        .call(
            "todo_write",
            json!({"todos": [{"id": "1", "content": "a", "status": "doing"}]}),
        )
        .await;
    assert!(matches!(bad_status, Err(ToolError::InvalidArgs(_))));
}

#[tokio::test]
async fn memory_saves_to_project_and_global_files() {
    let f = Fixture::new();
    let no_scope = f.call("memory", json!({"fact": "uses tabs"})).await;
    assert!(
        matches!(no_scope, Err(ToolError::Failed(ref m)) if m.contains("Please specify where"))
    );
    f.call("memory", json!({"fact": "uses tabs", "scope": "project"}))
        .await
        .unwrap();
    f.call(
        "memory",
        json!({"fact": "- run tests with make", "scope": "project"}),
    )
    .await
    .unwrap();
    assert_eq!(
        f.read("SHADE.md"),
        "## Shade Added Memories\n- uses tabs\n- run tests with make\n"
    );
    let g = f
        .call(
            "memory",
            json!({"fact": "prefers short answers", "scope": "global"}),
        )
        .await
        .unwrap();
    assert!(g.display.contains("global memory"));
    assert!(f
        .read("global-config/SHADE.md")
        .contains("- prefers short answers"));
    let prompt = shade_agent::prompt::system_prompt(&f.ctx);
    assert!(prompt.contains("prefers short answers") && prompt.contains("uses tabs"));
    let empty = f
        .call("memory", json!({"fact": "  ", "scope": "global"}))
        .await;
    assert!(matches!(empty, Err(ToolError::InvalidArgs(_))));
}

#[tokio::test]
async fn web_fetch_converts_html_with_limits() {
    use common::{MockServer, Scripted};
    use shade_agent::tools::config::WebFetchConfig;
    use shade_agent::tools::web_fetch::WebFetch;
    let html = "<html><head><title>T</title><script>var x=1;</script></head><body><h1>Hello</h1><p>World &amp; more</p></body></html>";
    let server = MockServer::start_get(vec![
        Scripted::status("200 OK", &[("Content-Type", "text/html")], html),
        Scripted::status(
            "200 OK",
            &[("Content-Type", "text/plain")],
            &"x".repeat(5000),
        ),
        Scripted::status("404 Not Found", &[("Content-Type", "text/plain")], "gone"),
    ]);
    let base = server.base_url.trim_end_matches("/v1").to_string();
    let f = Fixture::new();
    // The page is on loopback: allowed by config here. No background model: the page text.
    let local = WebFetch {
        access: WebFetchConfig {
            allow_private: true,
            ..Default::default()
        },
        ..Default::default()
    };
    let fetch = |tool: &WebFetch, url: String| {
        let tool = tool.clone();
        let ctx = f.ctx.clone();
        async move {
            use shade_agent::tools::Tool;
            tool.run(
                json!({"url": url, "prompt": "what does it say?"}),
                &ctx,
                &CancellationToken::new(),
            )
            .await
        }
    };
    let out = fetch(&local, format!("{base}/page")).await.unwrap();
    assert!(
        out.content.contains("Hello") && out.content.contains("World & more"),
        "{}",
        out.content
    );
    assert!(out.content.contains(&format!("Source: {base}/page")));
    assert!(!out.content.contains("<h1>") && !out.content.contains("var x"));
    let capped_tool = WebFetch {
        max_bytes: 1000,
        ..local.clone()
    };
    let capped = fetch(&capped_tool, format!("{base}/big")).await.unwrap();
    assert!(capped.content.contains("[Page cut"), "{}", capped.content);
    assert!(capped.content.len() < 1300);
    let missing = fetch(&local, format!("{base}/gone")).await;
    assert!(matches!(missing, Err(ToolError::Failed(ref m)) if m.contains("HTTP 404")));
    let file = fetch(&local, "file:///etc/passwd".into()).await;
    assert!(matches!(file, Err(ToolError::InvalidArgs(_))));
    let no_prompt = f
        .call("web_fetch", json!({"url": format!("{base}/page")}))
        .await;
    assert!(matches!(no_prompt, Err(ToolError::InvalidArgs(ref m)) if m.contains("prompt")));
}

#[tokio::test]
async fn every_path_tool_refuses_escapes() {
    let f = Fixture::new();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "TOP SECRET\n").unwrap();
    std::os::unix::fs::symlink(outside.path(), f.path("link")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret.txt"), f.path("s.txt")).unwrap();
    let abs_secret = outside.path().join("secret.txt").display().to_string();
    let cases = vec![
        ("read_file", json!({"path": "../secret.txt"})),
        ("read_file", json!({"path": abs_secret})),
        ("read_file", json!({"path": "link/secret.txt"})),
        ("read_file", json!({"path": "s.txt"})),
        (
            "write_file",
            json!({"path": "link/new.txt", "content": "x"}),
        ),
        (
            "write_file",
            json!({"path": "/tmp/../etc/shade-test", "content": "x"}),
        ),
        (
            "edit",
            json!({"path": "s.txt", "old_string": "TOP", "new_string": "NO"}),
        ),
        (
            "edit",
            json!({"path": "link/created.txt", "old_string": "", "new_string": "x"}),
        ),
        ("grep", json!({"pattern": "SECRET", "path": ".."})),
        ("glob", json!({"pattern": "*", "path": "link"})),
        ("ls", json!({"path": "sub/../../"})),
    ];
    for (tool, args) in cases {
        let res = f.call(tool, args.clone()).await;
        match res {
            Err(ToolError::Path(PathError::Outside { .. })) => {}
            other => panic!("{tool} {args} was not refused: {other:?}"),
        }
    }
    assert_eq!(
        std::fs::read_to_string(outside.path().join("secret.txt")).unwrap(),
        "TOP SECRET\n"
    );
    assert!(!outside.path().join("new.txt").exists());
    assert!(!outside.path().join("created.txt").exists());
    assert!(!Path::new("/etc/shade-test").exists());
    // grep over the root does not follow the symlinked directory out either.
    let g = f.call("grep", json!({"pattern": "SECRET"})).await.unwrap();
    assert!(!g.content.contains("TOP SECRET"), "{}", g.content);
}

#[tokio::test]
async fn edit_write_and_memory_preview_their_diff_without_writing() {
    let f = Fixture::new();
    f.write("a.txt", "one\ntwo\n");
    let edit = f.tools.get("edit").unwrap();
    let d = edit
        .preview(
            &json!({"path": "a.txt", "old_string": "two", "new_string": "2"}),
            &f.ctx,
        )
        .unwrap();
    assert!(d.contains("--- a/a.txt\n+++ b/a.txt\n"), "{d}");
    assert!(d.contains("\n-two\n+2\n"), "{d}");
    assert_eq!(f.read("a.txt"), "one\ntwo\n", "a preview writes nothing");
    assert!(edit
        .preview(
            &json!({"path": "a.txt", "old_string": "zzz", "new_string": "2"}),
            &f.ctx
        )
        .is_none());
    let write = f.tools.get("write_file").unwrap();
    let d = write
        .preview(&json!({"path": "new.txt", "content": "hello\n"}), &f.ctx)
        .unwrap();
    assert!(d.contains("+hello"), "{d}");
    // A file that does not exist yet, as git shows it.
    assert!(d.starts_with("--- /dev/null\n+++ b/new.txt\n"), "{d}");
    assert!(!f.path("new.txt").exists());
    let d = write
        .preview(&json!({"path": "a.txt", "content": "one\n"}), &f.ctx)
        .unwrap();
    assert!(d.starts_with("--- a/a.txt\n+++ b/a.txt\n"), "{d}");
    let memory = f.tools.get("memory").unwrap();
    let d = memory
        .preview(&json!({"fact": "tabs", "scope": "project"}), &f.ctx)
        .unwrap();
    assert!(d.contains("+## Shade Added Memories\n+- tabs"), "{d}");
    let read = f.tools.get("read_file").unwrap();
    assert!(read.preview(&json!({"path": "a.txt"}), &f.ctx).is_none());
}
