//! The model side: wire types, SSE parsing, the OpenAI-compatible client, retries and model
//! switching, configuration, and record/replay cassettes.

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
pub use config::{LlmConfig, Overrides};
pub use error::LlmError;
pub use provider::{BoxFuture, LlmProvider};
pub use types::{
    ChatRequest, Completion, FinishReason, LlmEvent, Message, ToolCall, ToolSpec, Usage,
};
