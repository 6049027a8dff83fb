//! The shell tool does not hand shade's API key to the model's commands. (Its own test
//! binary: it sets an environment variable, which must not race with other tests.)
#![allow(clippy::unwrap_used)]

use serde_json::json;
use shade_agent::tools::{ToolContext, ToolRegistry};
use shade_agent::Workspace;
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "current_thread")]
async fn api_key_is_not_inherited() {
    std::env::set_var("OPENAI_API_KEY", "sk-should-not-leak");
    std::env::set_var("SHADE_TEST_MARKER", "visible");
    let dir = tempfile::tempdir().unwrap();
    let ctx = ToolContext::new(Workspace::new(dir.path()).unwrap());
    let shell = ToolRegistry::standard().get("shell").unwrap();
    let out = shell
        .run(json!({"command": "env"}), &ctx, &CancellationToken::new())
        .await
        .unwrap();
    assert!(out.content.contains("SHADE_TEST_MARKER=visible"));
    assert!(!out.content.contains("sk-should-not-leak"));
}
