//! The shade agent: LLM client, tools, query loop (see DESIGN.md "The agent").
//!
//! Entry points: [`query_loop::Agent`] runs a conversation over a [`workspace::Workspace`]
//! with the [`tools::ToolRegistry`], talking to any [`llm::LlmProvider`] (live
//! [`llm::OpenAiClient`], [`llm::cassette::RecordingProvider`] or
//! [`llm::cassette::ReplayProvider`]) and reporting [`events::AgentEvent`]s.

pub mod approval;
pub mod events;
pub mod llm;
pub mod prompt;
pub mod query_loop;
pub mod tools;
pub mod workspace;

pub use approval::{ApprovalMode, Approver};
pub use events::{AgentEvent, StopReason};
pub use query_loop::{Agent, AgentError, AgentOptions, EventSink, RunOutcome};
pub use tools::{ToolContext, ToolRegistry};
pub use workspace::Workspace;
