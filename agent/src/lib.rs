//! The shade agent: the coding tools and their approvals, the query loop, prompt suggestions,
//! speculation, compaction, sessions and shadows (agents in branches). It drives a model
//! through `shade-llm`, classifies commands with `shade-classify` and lints with `shade-lint`.
//!
//! - [`query_loop::Agent`] runs a conversation: it streams the model's reply, runs the tool
//!   calls through the approval gate ([`approval`]), feeds every result back and repeats,
//!   reporting [`events::AgentEvent`]s to an [`EventSink`].
//! - Tools ([`tools::ToolRegistry::standard`]) work inside a [`workspace::Workspace`] — the
//!   project or a branch mount — which refuses paths leading out of it.
//! - Any [`llm::LlmProvider`] can drive it: the live [`llm::OpenAiClient`] (SSE streaming,
//!   retries, model switching), [`llm::cassette::RecordingProvider`] around it, or
//!   [`llm::cassette::ReplayProvider`] serving a recorded cassette (JSONL, one
//!   `{"request": {"messages": …}, "response": {"chunks": [{"text": …}], "tool_calls": …,
//!   "finish_reason": …}}` per model call; system messages are not compared on replay).
//!
//! Configuration comes in as plain structs ([`llm::LlmConfig`], [`tools::config::ToolsConfig`],
//! [`followup::FollowupSettings`], [`shade_lint::LintConfig`]): the CLI reads the config file,
//! the environment and the flags once and hands them down.
//!
//! ```no_run
//! use std::sync::Arc;
//! use shade_agent::approval::{AlwaysYes, ApprovalMode};
//! use shade_agent::llm::cassette::ReplayProvider;
//! use shade_agent::{Agent, AgentOptions, EventSink, ToolContext, ToolRegistry, Workspace};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let provider = Arc::new(ReplayProvider::open("run.jsonl".as_ref())?);
//! let ctx = ToolContext::new(Workspace::new("/path/to/branch/mount")?);
//! let options = AgentOptions { model: "qwen-plus".into(), approval: ApprovalMode::Yolo, ..Default::default() };
//! let agent = Agent::new(provider, ToolRegistry::standard(), ctx, Arc::new(AlwaysYes), options);
//! let events: EventSink = Arc::new(|e| println!("{}", serde_json::to_string(&e).unwrap_or_default()));
//! let mut conversation = agent.start_conversation("fix the failing test");
//! let outcome = agent.run(&mut conversation, &events, &Default::default()).await?;
//! println!("{:?} after {} turns", outcome.stop, outcome.turns);
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

pub mod approval;
pub mod background;
pub mod compact;
pub mod events;
pub mod followup;
pub mod housekeeping;
pub mod instructions;
pub mod loop_detect;
pub mod mentions;
pub mod paths;
pub mod prompt;
pub mod query_loop;
pub mod runner;
pub mod sessions;
pub mod shadow;
pub mod speculation;
pub mod tools;
pub mod workspace;

/// The model side (the `shade-llm` crate), re-exported: the agent's API speaks its types.
pub use shade_llm as llm;

pub use approval::{ApprovalMode, Approver};
pub use events::{AgentEvent, StopReason};
pub use query_loop::{
    Agent, AgentError, AgentOptions, Boundary, CallGate, EventSink, GateCall, RunOutcome,
};
pub use shadow::{Shadow, ShadowBase, ShadowOptions};
pub use tools::{ToolContext, ToolRegistry};
pub use workspace::Workspace;
