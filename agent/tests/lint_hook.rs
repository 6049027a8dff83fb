//! The agent's lints in a branch: `edit`/`write_file` append the new diagnostics of the file
//! they touched when the tool context has a `LintHook`, and the `diagnostics` tool lists
//! them. Real FUSE branch, real ruff (batch) and `ruff server` (language server).
#![allow(clippy::unwrap_used)]

use serde_json::json;
use shade_agent::tools::diagnostics::{Diagnostics, LintHook};
use shade_agent::tools::{Tool, ToolContext, ToolRegistry};
use shade_agent::workspace::Workspace;
use shade_fusefs::{Branch, BranchOptions, StateDir};
use shade_lint::{BranchView, LintConfig, Linter};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

fn require_fuse_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test mounts FUSE branches and must run as root"
    );
    assert!(
        std::path::Path::new("/dev/fuse").exists(),
        "this test needs /dev/fuse"
    );
}

const PY: &str = "import os\n\n\ndef add(a, b):\n    return a + b\n";

async fn edit_in_branch(checker: &str) {
    require_fuse_root();
    let tmp = tempfile::Builder::new()
        .prefix("shade-lint-hook-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let project = tmp.path().join("project");
    std::fs::create_dir(&project).unwrap();
    std::fs::write(project.join("calc.py"), PY).unwrap();
    let state = StateDir::at(tmp.path().join("state"));
    let branch = Branch::create(
        &project,
        &BranchOptions {
            state: state.clone(),
            id_shift: shade_fusefs::sandbox::branch_id_shift(&Default::default()),
            ..BranchOptions::default()
        },
    )
    .unwrap();
    let cfg = LintConfig::default();
    let linter = Arc::new(Linter::new(&project, state, &cfg, Some(checker)).unwrap());
    let mut ctx = ToolContext::new(Workspace::new(branch.mountpoint()).unwrap());
    let plain = ctx.clone();
    ctx.lint = Some(Arc::new(LintHook::new(
        linter.clone(),
        BranchView::of(&branch),
        Duration::from_secs(60),
    )));
    let tools = ToolRegistry::standard();
    let cancel = CancellationToken::new();
    let edit = tools.get("edit").unwrap();

    let out = edit
        .run(
            json!({"path": "calc.py", "old_string": "a + b", "new_string": "a + c"}),
            &ctx,
            &cancel,
        )
        .await
        .unwrap();
    assert!(
        out.content.ends_with(&format!(
            "New diagnostics in calc.py:\ncalc.py:5:16: error: Undefined name `c` [F821] ({checker})"
        )),
        "{}",
        out.content
    );
    // The unused `os` import was there before: never reported as new.
    assert!(!out.content.contains("F401"), "{}", out.content);

    let out = tools
        .get("write_file")
        .unwrap()
        .run(json!({"path": "calc.py", "content": PY}), &ctx, &cancel)
        .await
        .unwrap();
    assert!(
        out.content.ends_with("No new diagnostics in calc.py."),
        "{}",
        out.content
    );

    // A hook bound to no branch (a session outside any shadow) does nothing, and the
    // model's `diagnostics` call is refused: the checker would write into the real tree.
    let mut unbound = plain.clone();
    unbound.lint = Some(Arc::new(ctx.lint.as_ref().unwrap().bound_to(None)));
    let out = edit
        .run(
            json!({"path": "calc.py", "old_string": "a + b", "new_string": "a + e"}),
            &unbound,
            &cancel,
        )
        .await
        .unwrap();
    assert!(!out.content.contains("diagnostics"), "{}", out.content);
    assert!(Diagnostics.run(json!({}), &unbound, &cancel).await.is_err());
    std::fs::write(branch.mountpoint().join("calc.py"), PY).unwrap();

    // Without a hook, an edit is what it always was.
    let out = edit
        .run(
            json!({"path": "calc.py", "old_string": "a + b", "new_string": "a + d"}),
            &plain,
            &cancel,
        )
        .await
        .unwrap();
    assert!(!out.content.contains("diagnostics"), "{}", out.content);

    // The model asks: every file edited through the hook so far.
    let diags = Diagnostics;
    assert!(diags.is_read_only(&json!({})));
    let out = diags.run(json!({}), &ctx, &cancel).await.unwrap();
    assert_eq!(
        out.content,
        format!("calc.py:5:16: error: Undefined name `d` [F821] ({checker})")
    );
    let out = diags
        .run(json!({"paths": ["../escape.py"]}), &ctx, &cancel)
        .await;
    assert!(out.is_err());

    assert_eq!(
        std::fs::read_to_string(project.join("calc.py")).unwrap(),
        PY
    );
    drop(ctx);
    drop(linter);
    drop(branch);
}

#[tokio::test]
async fn edits_in_a_branch_come_back_with_ruff_findings() {
    edit_in_branch("ruff").await;
}

#[tokio::test]
async fn edits_in_a_branch_come_back_with_language_server_findings() {
    edit_in_branch("ruff-server").await;
}

#[tokio::test]
async fn a_baseline_slower_than_the_budget_finishes_for_the_next_edit() {
    require_fuse_root();
    let tmp = tempfile::Builder::new()
        .prefix("shade-lint-hook-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let project = tmp.path().join("project");
    std::fs::create_dir(&project).unwrap();
    std::fs::write(project.join("calc.py"), PY).unwrap();
    let state = StateDir::at(tmp.path().join("state"));
    let branch = Branch::create(
        &project,
        &BranchOptions {
            state: state.clone(),
            id_shift: shade_fusefs::sandbox::branch_id_shift(&Default::default()),
            ..BranchOptions::default()
        },
    )
    .unwrap();
    let linter = Arc::new(
        Linter::new(
            &project,
            state.clone(),
            &LintConfig::default(),
            Some("ruff"),
        )
        .unwrap(),
    );
    let hook = LintHook::new(linter, BranchView::of(&branch), Duration::ZERO);
    std::fs::write(
        branch.mountpoint().join("calc.py"),
        PY.replace("a + b", "a + q"),
    )
    .unwrap();
    let note = hook.after_edit("calc.py").unwrap();
    assert!(note.contains("not ready within 0s"), "{note}");
    // The baseline job goes on without the caller and lands in the cache.
    let cache = state.root().join("lint/baseline");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::fs::read_dir(&cache).map_or(0, |d| d.count()) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no baseline was stored"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let found = hook
        .linter
        .new_diagnostics(
            hook.view.as_ref().unwrap(),
            &["calc.py".into()],
            Duration::from_secs(60),
        )
        .unwrap();
    let shown: Vec<String> = found.iter().map(|d| d.to_string()).collect();
    assert_eq!(
        shown,
        ["calc.py:5:16: error: Undefined name `q` [F821] (ruff)"]
    );
}
