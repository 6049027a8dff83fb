//! Agents in branches: the tools of a `Shadow` work in a real FUSE branch while paths stay
//! the project's, its shell runs in the branch sandbox, and abort leaves nothing behind.
//! These tests mount for real and need root and /dev/fuse; they fail loudly without.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use shade_agent::shadow::{Shadow, ShadowOptions};
use shade_agent::tools::{ToolContext, ToolError, ToolOutput, ToolRegistry};
use shade_agent::Workspace;
use shade_fusefs::{AcceptFlags, BranchOptions, StateDir};
use tokio_util::sync::CancellationToken;

struct Fx {
    tmp: tempfile::TempDir,
    project: PathBuf,
    state: StateDir,
    tools: ToolRegistry,
}

fn fx() -> Fx {
    assert!(
        nix_is_root(),
        "these tests mount FUSE branches and create namespaces: run them as root"
    );
    assert!(
        Path::new("/dev/fuse").exists(),
        "these tests need /dev/fuse (modprobe fuse, or --device /dev/fuse)"
    );
    // Not under /tmp: speculative commands get a private /tmp, and the project must not
    // depend on it.
    let tmp = tempfile::Builder::new()
        .prefix("shade-shadow-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let project = tmp.path().join("project");
    std::fs::create_dir(&project).unwrap();
    let project = project.canonicalize().unwrap();
    std::fs::write(project.join("a.txt"), "real a\n").unwrap();
    std::fs::create_dir(project.join("src")).unwrap();
    std::fs::write(project.join("src/lib.rs"), "fn one() {}\n").unwrap();
    let state = StateDir::at(tmp.path().join("state"));
    Fx {
        tmp,
        project,
        state,
        tools: ToolRegistry::standard(),
    }
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid(2) cannot fail.
    unsafe { libc::geteuid() == 0 }
}

impl Fx {
    fn options(&self, mut o: ShadowOptions) -> ShadowOptions {
        o.branch = BranchOptions {
            state: self.state.clone(),
            // As the options it replaces: commands run in the branch.
            id_shift: o.branch.id_shift,
            ..BranchOptions::default()
        };
        o
    }

    fn speculative(&self) -> (Shadow, ToolContext) {
        let mut o = self.options(ShadowOptions::speculative(Duration::from_secs(60)));
        o.cache_dirs = Vec::new();
        self.shadow(o)
    }

    fn shadow(&self, o: ShadowOptions) -> (Shadow, ToolContext) {
        let shadow = Shadow::create(&self.project, o).unwrap();
        let mut base = ToolContext::new(Workspace::new(&self.project).unwrap());
        base.global_memory = None;
        let ctx = shadow.tool_context(&base);
        (shadow, ctx)
    }

    async fn call(
        &self,
        ctx: &ToolContext,
        tool: &str,
        args: serde_json::Value,
    ) -> Result<ToolOutput, ToolError> {
        self.tools
            .get(tool)
            .unwrap()
            .run(args, ctx, &CancellationToken::new())
            .await
    }

    async fn sh(&self, ctx: &ToolContext, command: &str) -> String {
        let out = self
            .call(ctx, "shell", json!({ "command": command }))
            .await
            .unwrap();
        out.content
    }

    /// Nothing of the state dir is mounted and no branch store is left (once the warm
    /// connections dropped branches left in the pool, by design, are let go).
    fn assert_clean(&self) {
        shade_fusefs::drain_branch_pool();
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let root = self.state.root().to_str().unwrap();
        let left: Vec<&str> = info.lines().filter(|l| l.contains(root)).collect();
        assert!(left.is_empty(), "mounts left: {left:#?}");
        let stores = std::fs::read_dir(self.state.branches())
            .map(|d| d.count())
            .unwrap_or(0);
        assert_eq!(stores, 0, "branch stores left");
    }
}

/// Live processes whose command line contains `marker`.
fn alive_with(marker: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            String::from_utf8_lossy(&cmdline).contains(marker) && !stat.contains(") Z")
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_tools_take_and_show_the_projects_real_paths() {
    let f = fx();
    let (shadow, ctx) = f.speculative();
    let mount = shadow.mountpoint().to_str().unwrap().to_string();
    let abs = f.project.join("new.txt");
    let mut outputs = Vec::new();
    outputs.push(
        f.call(
            &ctx,
            "write_file",
            json!({"path": abs.to_str().unwrap(), "content": "hello\n"}),
        )
        .await
        .unwrap(),
    );
    outputs.push(
        f.call(
            &ctx,
            "edit",
            json!({"path": f.project.join("a.txt").to_str().unwrap(), "old_string": "real a", "new_string": "branch a"}),
        )
        .await
        .unwrap(),
    );
    let read = f
        .call(&ctx, "read_file", json!({"path": abs.to_str().unwrap()}))
        .await
        .unwrap();
    assert!(read.content.contains("hello"), "{}", read.content);
    outputs.push(read);
    for (tool, args) in [
        ("ls", json!({"path": f.project.to_str().unwrap()})),
        ("glob", json!({"pattern": "**/*"})),
        ("grep", json!({"pattern": "branch|hello|one"})),
    ] {
        outputs.push(f.call(&ctx, tool, args).await.unwrap());
    }
    let pwd = f.sh(&ctx, "pwd; cat a.txt; ls").await;
    assert!(
        pwd.contains(f.project.to_str().unwrap()),
        "the command does not run at the real path: {pwd}"
    );
    assert!(pwd.contains("branch a"), "{pwd}");
    // Refusals name no mount either.
    let refused = f
        .call(&ctx, "read_file", json!({"path": "/etc/passwd"}))
        .await
        .unwrap_err()
        .to_string();
    for o in &outputs {
        assert!(
            !o.content.contains(&mount),
            "mount path leaked: {}",
            o.content
        );
        assert!(
            !o.display.contains(&mount),
            "mount path leaked: {}",
            o.display
        );
    }
    assert!(!pwd.contains(&mount) && !refused.contains(&mount));
    // Only the branch changed.
    assert!(!abs.exists());
    assert_eq!(
        std::fs::read_to_string(f.project.join("a.txt")).unwrap(),
        "real a\n"
    );
    let changes: Vec<String> = shadow
        .changeset(false)
        .changes
        .iter()
        .map(|c| c.to_string())
        .collect();
    assert_eq!(changes, ["M a.txt", "A new.txt"]);
    let report = shadow.accept(AcceptFlags::default());
    assert!(report.is_ok(), "{report:?}");
    assert_eq!(std::fs::read_to_string(&abs).unwrap(), "hello\n");
    assert_eq!(
        std::fs::read_to_string(f.project.join("a.txt")).unwrap(),
        "branch a\n"
    );
    f.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_speculative_command_writes_only_into_its_branch() {
    let f = fx();
    let (shadow, ctx) = f.speculative();
    let home = std::env::var("HOME").unwrap();
    let tag = std::process::id();
    let var_tmp = format!("/var/tmp/shade-shadow-escape-{tag}");
    let home_file = format!("{home}/shade-shadow-escape-{tag}");
    // Writes outside the project land in the branch's outside layer (issue 29): the
    // command sees them, the host never does.
    let out = f
        .sh(&ctx, &format!("touch {var_tmp} && ls {var_tmp}"))
        .await;
    assert!(out.starts_with("Exit code: 0"), "{out}");
    let out = f
        .sh(&ctx, &format!("echo x > {home_file} && cat {home_file}"))
        .await;
    assert!(out.starts_with("Exit code: 0"), "{out}");
    // System paths stay read-only, with the sandbox's note.
    let out = f.sh(&ctx, "touch /sys/shade-shadow-escape").await;
    assert!(out.starts_with("Exit code: 1"), "{out}");
    assert!(out.contains("Read-only file system"), "{out}");
    assert!(out.contains("system paths"), "{out}");
    // A project-relative escape through `..` is the same path outside: it stays in the
    // layer too.
    let _ = f.sh(&ctx, "touch ../escape").await;
    let out = f.sh(&ctx, "echo made > built.txt && cat built.txt").await;
    assert!(out.starts_with("Exit code: 0"), "{out}");
    assert!(!Path::new(&var_tmp).exists());
    assert!(!Path::new(&home_file).exists());
    assert!(!f.project.parent().unwrap().join("escape").exists());
    assert!(!f.project.join("built.txt").exists());
    let changes: Vec<String> = shadow
        .changeset(true)
        .changes
        .iter()
        .map(|c| c.to_string())
        .collect();
    assert_eq!(changes, ["A built.txt"]);
    drop(shadow);
    f.assert_clean();
}

/// A speculation's shell (read-only sandbox, private /tmp) summarises output over the budget
/// like a plain one: the fast model's summary, head and tail, and the whole output streamed
/// from the sandbox into a log under the state dir; the sandbox's note on a refused write
/// stays after the summary, and the branch gets nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_speculative_commands_big_output_is_summarised_and_kept_whole() {
    use common::{finish_chunk, sse_body, text_chunk, MockServer, Scripted};
    let f = fx();
    let (shadow, base) = f.speculative();
    let server = MockServer::start(vec![Scripted::sse(
        &sse_body(
            &[
                text_chunk("200000 lines; the touch was refused."),
                finish_chunk("stop"),
            ],
            true,
        ),
        &[1000],
    )]);
    let client = shade_llm::OpenAiClient::new(shade_llm::LlmConfig {
        base_url: server.base_url.clone(),
        model: Some("main-model".into()),
        fast_model: Some("fast-model".into()),
        max_retries: 0,
        ..Default::default()
    })
    .unwrap();
    let mut ctx = base.clone();
    ctx.background = Some(shade_agent::background::BackgroundLlm::new(
        Arc::new(client),
        "fast-model",
    ));
    let logs = f.tmp.path().join("state/tool-output");
    ctx.output_dir = logs.clone();
    let outside = format!("/sys/shade-spec-summary-{}", std::process::id());
    let command = format!("seq -f 'spec %06g' 1 200000; touch {outside}; echo end");
    let out = f.sh(&ctx, &command).await;
    assert!(out.starts_with("Exit code: 0\n"), "{out:.300}");
    assert!(out.contains("Summary (by the fast model):\n200000 lines; the touch was refused.\n"));
    assert!(out.contains("First ") && out.contains("spec 000001\nspec 000002\n"));
    assert!(out.contains("spec 200000\n"), "{out}");
    assert!(
        out.ends_with("Note: this command ran in a sandbox where writes outside the project land in the branch's own throw-away layer, but system paths (/proc, /sys, read-only mounts) stay read-only; that write was refused."),
        "{}",
        &out[out.len().saturating_sub(400)..]
    );
    let path = out
        .split("is saved in ")
        .nth(1)
        .unwrap()
        .split(';')
        .next()
        .unwrap();
    assert!(Path::new(path).starts_with(&logs), "{path}");
    let log = std::fs::read_to_string(path).unwrap();
    let stdout: String = (1..=200_000).map(|i| format!("spec {i:06}\n")).collect();
    // stdout and stderr are logged as they arrive: touch's refusal is in there, whole,
    // wherever it fell between two chunks of stdout.
    let start = log.find("touch: ").unwrap();
    let end = start + log[start..].find("Read-only file system\n").unwrap() + 22;
    assert!(!log[start..end].contains("spec "), "{}", &log[start..end]);
    assert_eq!(
        format!("{}{}", &log[..start], &log[end..]),
        stdout + "end\n"
    );
    let asked = server.request(0);
    assert_eq!(asked["model"], "fast-model");
    assert!(asked["messages"][1]["content"]
        .as_str()
        .unwrap()
        .contains(&command));
    assert!(!Path::new(&outside).exists());
    assert!(shadow.changeset(true).changes.is_empty());
    drop(shadow);
    f.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_speculative_command_has_no_network_and_a_private_tmp() {
    let f = fx();
    let (_shadow, ctx) = f.speculative();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let probe = format!("exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected");
    // The same probe reaches the server from a live shadow, so the refusal below is the
    // sandbox's doing.
    let (_live, live_ctx) = f.shadow(f.options(ShadowOptions::live()));
    let out = f.sh(&live_ctx, &probe).await;
    assert!(out.contains("connected"), "{out}");
    let out = f.sh(&ctx, &probe).await;
    assert!(!out.contains("connected"), "{out}");
    let real = format!("/tmp/shade-shadow-real-{}", std::process::id());
    std::fs::write(&real, "x").unwrap();
    let out = f
        .sh(
            &ctx,
            &format!(
                "ls -A /tmp; echo inside > /tmp/inside-{}; if test -e {real}; then echo SEEN; fi",
                std::process::id()
            ),
        )
        .await;
    assert!(out.starts_with("Exit code: 0"), "{out}");
    assert!(!out.contains("SEEN"), "the real /tmp is visible: {out}");
    assert!(!Path::new(&format!("/tmp/inside-{}", std::process::id())).exists());
    std::fs::remove_file(&real).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_speculative_command_is_killed_at_the_time_limit() {
    let f = fx();
    let mut o = f.options(ShadowOptions::speculative(Duration::from_millis(500)));
    o.cache_dirs = Vec::new();
    let (shadow, ctx) = f.shadow(o);
    let marker = format!("shade-limit-{}", std::process::id());
    let sleeper = f.tmp.path().join(&marker);
    std::fs::copy("/bin/sleep", &sleeper).unwrap();
    let out = f
        .sh(&ctx, &format!("{s} 100 & {s} 100", s = sleeper.display()))
        .await;
    assert!(out.starts_with("Timed out after 0.5s"), "{out}");
    assert_eq!(alive_with(&marker), 0);
    assert_eq!(shadow.running_commands(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_caches_get_a_throw_away_branch() {
    let f = fx();
    let cache = f.tmp.path().join("cargo-home");
    std::fs::create_dir_all(cache.join("registry")).unwrap();
    std::fs::write(cache.join("registry/index"), "real index\n").unwrap();
    let mut o = f.options(ShadowOptions::speculative(Duration::from_secs(60)));
    o.cache_dirs = vec![cache.clone()];
    let (shadow, ctx) = f.shadow(o);
    let c = cache.display();
    let out = f
        .sh(&ctx, &format!("cat {c}/registry/index; echo fetched > {c}/registry/index; mkdir {c}/new && cat {c}/registry/index"))
        .await;
    assert!(out.starts_with("Exit code: 0"), "{out}");
    assert!(out.contains("real index\nfetched"), "{out}");
    assert_eq!(
        std::fs::read_to_string(cache.join("registry/index")).unwrap(),
        "real index\n"
    );
    assert!(!cache.join("new").exists());
    // The cache's writes are not the project's: the changeset stays empty.
    assert!(shadow.changeset(true).is_empty());
    drop(shadow);
    f.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_kills_a_running_command_and_leaves_nothing() {
    let f = fx();
    let mut o = f.options(ShadowOptions::speculative(Duration::from_secs(600)));
    o.cache_dirs = vec![f.tmp.path().join("cache")];
    std::fs::create_dir(f.tmp.path().join("cache")).unwrap();
    let (shadow, ctx) = f.shadow(o);
    let marker = format!("shade-abort-{}", std::process::id());
    let sleeper = f.tmp.path().join(&marker);
    std::fs::copy("/bin/sleep", &sleeper).unwrap();
    let tools = f.tools.clone();
    let command = format!(
        "echo partial > part.txt; setsid {s} 300 & {s} 300",
        s = sleeper.display()
    );
    let ctx = Arc::new(ctx);
    let task = {
        let ctx = ctx.clone();
        tokio::spawn(async move {
            tools
                .get("shell")
                .unwrap()
                .run(
                    json!({ "command": command }),
                    &ctx,
                    &CancellationToken::new(),
                )
                .await
        })
    };
    while alive_with(&marker) < 2 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(shadow.running_commands(), 1);
    tokio::task::spawn_blocking(move || shadow.abort())
        .await
        .unwrap();
    assert_eq!(alive_with(&marker), 0, "a process survived the abort");
    let result = task.await.unwrap();
    let err = result.unwrap_err().to_string();
    assert!(err.contains("closed"), "{err}");
    f.assert_clean();
    // The context outlives its shadow but can no longer run anything.
    let out = f.call(&ctx, "shell", json!({"command": "true"})).await;
    assert!(out.unwrap_err().to_string().contains("closed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_shadows_run_commands_side_by_side() {
    let f = fx();
    let mut shadows = Vec::new();
    for _ in 0..100 {
        shadows.push(f.speculative());
    }
    let runs = shadows.iter().enumerate().map(|(i, (_, ctx))| {
        let tools = f.tools.clone();
        let ctx = ctx.clone();
        async move {
            tools
                .get("shell")
                .unwrap()
                .run(
                    json!({ "command": format!("echo {i} > n.txt && cat a.txt") }),
                    &ctx,
                    &CancellationToken::new(),
                )
                .await
                .unwrap()
        }
    });
    let outs = futures::future::join_all(runs).await;
    for o in &outs {
        assert!(o.content.starts_with("Exit code: 0"), "{}", o.content);
    }
    for (i, (shadow, _)) in shadows.iter().enumerate() {
        let n = std::fs::read_to_string(shadow.mountpoint().join("n.txt")).unwrap();
        assert_eq!(n, format!("{i}\n"));
    }
    assert!(!f.project.join("n.txt").exists());
    drop(shadows);
    f.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_shadow_works_on_the_parents_branch_and_closes_before_it() {
    let fx = fx();
    let live = fx.options(ShadowOptions::live());
    let (parent, pctx) = fx.shadow(live);
    fx.call(
        &pctx,
        "write_file",
        json!({"path": "a.txt", "content": "parent a\n"}),
    )
    .await
    .unwrap();
    let mut spec = fx.options(ShadowOptions::speculative(Duration::from_secs(60)));
    spec.cache_dirs = Vec::new();
    let child = parent.base().create_child(spec.clone()).unwrap();
    let mut base = ToolContext::new(Workspace::new(&fx.project).unwrap());
    base.global_memory = None;
    let cctx = child.tool_context(&base);
    // Its commands run at the project's path and see the parent's unaccepted edit.
    let out = fx
        .sh(&cctx, "pwd; cat a.txt; cp a.txt copy.txt; cat src/lib.rs")
        .await;
    assert!(out.contains(fx.project.to_str().unwrap()), "{out}");
    assert!(out.contains("parent a") && out.contains("fn one"), "{out}");
    // Its accept lands in the parent's branch, never in the project.
    let (report, leftover) = child.accept_then_clean(AcceptFlags::default()).unwrap();
    drop(leftover);
    assert_eq!(report.written, 1);
    assert!(!fx.project.join("copy.txt").exists());
    let changes: Vec<String> = parent
        .changeset(false)
        .changes
        .iter()
        .map(|c| c.to_string())
        .collect();
    assert_eq!(changes, ["M a.txt", "A copy.txt"]);
    // A child still open when the parent closes is closed first: its commands refuse, its
    // branch is unmounted, and no child can be made of a closed parent.
    let late = parent.base().create_child(spec.clone()).unwrap();
    let lctx = late.tool_context(&base);
    let base_handle = parent.base();
    parent.abort();
    let err = fx
        .call(&lctx, "shell", json!({"command": "true"}))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("closed"), "{err}");
    assert!(late.changeset(false).changes.is_empty());
    assert!(base_handle.create_child(spec).is_err());
    drop(late);
    fx.assert_clean();
    assert!(!fx.project.join("copy.txt").exists());
    assert_eq!(
        std::fs::read_to_string(fx.project.join("a.txt")).unwrap(),
        "real a\n"
    );
}

/// Issue 31 (scale): an idle shadow lets its connection go (its build caches' too) and
/// takes one again, mounted elsewhere: commands, the file tools of a fresh tool context and
/// the changeset all show its own changes, the cache keeps its throw-away writes between
/// commands, a shadow with a child or a running command stays attached, and the accept
/// writes exactly what it changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_shadow_detaches_and_attaches_elsewhere() {
    let f = fx();
    let cache = f.tmp.path().join("cargo-home");
    std::fs::create_dir_all(&cache).unwrap();
    std::fs::write(cache.join("index"), "real index\n").unwrap();
    let mut o = f.options(ShadowOptions::speculative(Duration::from_secs(60)));
    o.cache_dirs = vec![cache.clone()];
    let (shadow, ctx) = f.shadow(o);
    f.call(
        &ctx,
        "write_file",
        json!({"path": "a.txt", "content": "mine\n"}),
    )
    .await
    .unwrap();
    let c = cache.display();
    let out = f.sh(&ctx, &format!("echo fetched > {c}/index")).await;
    assert!(out.starts_with("Exit code: 0"), "{out}");
    let first = shadow.mountpoint();

    // A second shadow keeps the first's connection busy elsewhere: the first attaches to
    // another one.
    let (other, octx) = f.speculative();
    shadow.detach_idle().unwrap();
    assert!(shadow.is_detached());
    // The old mount (if still mounted, parked) shows the project, not this branch.
    assert_ne!(
        std::fs::read_to_string(first.join("a.txt")).ok().as_deref(),
        Some("mine\n"),
        "the old mount still shows the branch"
    );
    f.call(
        &octx,
        "write_file",
        json!({"path": "a.txt", "content": "other\n"}),
    )
    .await
    .unwrap();
    other.detach_idle().unwrap();
    shadow.attach().unwrap();
    assert!(!shadow.is_detached());

    // A tool context made for the new mount sees the branch; commands run in it.
    let mut base = ToolContext::new(Workspace::new(&f.project).unwrap());
    base.global_memory = None;
    let ctx = shadow.tool_context(&base);
    let read = f
        .call(&ctx, "read_file", json!({"path": "a.txt"}))
        .await
        .unwrap();
    assert!(read.content.contains("mine"), "{}", read.content);
    let out = f
        .sh(&ctx, &format!("cat a.txt {c}/index; echo made > new.txt"))
        .await;
    assert!(out.contains("mine\nfetched"), "{out}");

    // With a child, or a command running, it stays attached.
    let mut spec = f.options(ShadowOptions::speculative(Duration::from_secs(60)));
    spec.cache_dirs = Vec::new();
    let child = shadow.base().create_child(spec).unwrap();
    assert!(shadow.detach_idle().is_err());
    drop(child);
    // The child's connection, pooled, reads through this mount (its lower): it holds the
    // mount busy until the pool lets it go.
    shade_fusefs::drain_branch_pool();
    let runner = ctx.clone();
    let tools = ToolRegistry::standard();
    let sleeper = tokio::spawn(async move {
        tools
            .get("shell")
            .unwrap()
            .run(
                json!({"command": "sleep 2"}),
                &runner,
                &CancellationToken::new(),
            )
            .await
    });
    while shadow.running_commands() == 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(shadow.detach_idle().is_err(), "a command runs in it");
    sleeper.await.unwrap().unwrap();
    shadow.detach_idle().unwrap();

    let changes: Vec<String> = shadow
        .changeset(false)
        .changes
        .iter()
        .map(|c| c.to_string())
        .collect();
    assert_eq!(changes, ["M a.txt", "A new.txt"]);
    shadow.accept(AcceptFlags::default()).unwrap();
    assert_eq!(
        std::fs::read_to_string(f.project.join("a.txt")).unwrap(),
        "mine\n"
    );
    assert_eq!(
        std::fs::read_to_string(cache.join("index")).unwrap(),
        "real index\n"
    );
    drop(other);
    f.assert_clean();
}
