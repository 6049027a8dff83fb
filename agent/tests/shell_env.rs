//! The shell tool does not hand shade's API key, other secrets, shade's own variables or
//! any variable off its allowlist to the model's commands. (Its own test binary: it sets environment variables, which must
//! not race with other tests.)
#![allow(clippy::unwrap_used)]

use serde_json::json;
use shade_agent::tools::{ToolContext, ToolRegistry};
use shade_agent::Workspace;
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "current_thread")]
async fn api_key_is_not_inherited() {
    std::env::set_var("OPENAI_API_KEY", "sk-should-not-leak");
    std::env::set_var("SHADE_TEST_MARKER", "shade-own");
    std::env::set_var("GITHUB_TOKEN", "ghp-should-not-leak");
    std::env::set_var("PLAIN_TEST_MARKER", "unlisted");
    std::env::set_var("CARGO_TEST_MARKER", "visible");
    let dir = tempfile::tempdir().unwrap();
    let ctx = ToolContext::new(Workspace::new(dir.path()).unwrap());
    let shell = ToolRegistry::standard().get("shell").unwrap();
    let out = shell
        .run(json!({"command": "env"}), &ctx, &CancellationToken::new())
        .await
        .unwrap();
    assert!(
        out.content.contains("CARGO_TEST_MARKER=visible"),
        "{}",
        out.content
    );
    assert!(out.content.contains("PATH="));
    for leak in [
        "sk-should-not-leak",
        "ghp-should-not-leak",
        "shade-own",
        "PLAIN_TEST_MARKER",
    ] {
        assert!(!out.content.contains(leak), "{leak}: {}", out.content);
    }
}

/// `git status` in the shell tool does not rewrite `.git/index` to refresh its stat cache
/// (GIT_OPTIONAL_LOCKS=0): a read-only command leaves the repository byte-identical. Run
/// directly, the same `git status` does rewrite it.
#[tokio::test(flavor = "current_thread")]
async fn read_only_git_does_not_refresh_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let git = |args: &[&str]| {
        let st = std::process::Command::new("git")
            .arg("-C")
            .arg(dir.path())
            .args(args)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env_remove("GIT_OPTIONAL_LOCKS")
            .status()
            .unwrap();
        assert!(st.success(), "git {args:?}");
    };
    git(&["init", "-q"]);
    std::fs::write(dir.path().join("a"), "one\n").unwrap();
    git(&["add", "a"]);
    let index = dir.path().join(".git/index");
    // The index's stat cache goes stale when the file's times change.
    let stale = || {
        let st = std::process::Command::new("touch")
            .args(["-d", "2001-01-01"])
            .arg(dir.path().join("a"))
            .status()
            .unwrap();
        assert!(st.success());
    };
    let ino = || std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&index).unwrap());

    stale();
    let before = ino();
    let ctx = ToolContext::new(Workspace::new(dir.path()).unwrap());
    let shell = ToolRegistry::standard().get("shell").unwrap();
    let out = shell
        .run(
            json!({"command": "GIT_CONFIG_GLOBAL=/dev/null git status --short && env"}),
            &ctx,
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    assert!(
        out.content.contains("GIT_OPTIONAL_LOCKS=0"),
        "{}",
        out.content
    );
    assert_eq!(
        ino(),
        before,
        "the shell tool's git status rewrote the index"
    );

    git(&["status", "--short"]);
    assert_ne!(
        ino(),
        before,
        "git status refreshes a stale index by itself"
    );
}
