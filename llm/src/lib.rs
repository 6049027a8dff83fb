//! The model side of shade: wire types, SSE parsing, the OpenAI-compatible client, retries
//! and model switching, errors, local models' text tool calls, and record/replay cassettes.
//! It knows no tools, no lint and no config file: its settings come in as a plain [`LlmConfig`].
#![warn(missing_docs)]

pub mod cassette;
pub mod client;
pub mod config;
pub mod error;
pub mod provider;
pub mod retry;
pub mod sse;
pub mod stream;
pub mod text_calls;
pub mod think;
pub mod types;

pub use client::OpenAiClient;
pub use config::LlmConfig;
pub use error::LlmError;
pub use provider::{BoxFuture, LlmProvider};
pub use types::{
    ChatRequest, Completion, FinishReason, LlmEvent, Message, ToolCall, ToolSpec, Usage,
};
