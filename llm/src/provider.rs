//! The one interface the agent loop talks to: a live client, a recorder around it, or a
//! cassette replay all look the same.

use std::future::Future;
use std::pin::Pin;

use tokio_util::sync::CancellationToken;

use super::error::LlmError;
use super::types::{ChatRequest, Completion, LlmEvent};

/// A boxed, sendable future (keeps the trait object-safe).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Callback receiving streamed output and retry notices.
pub type EventFn<'a> = &'a (dyn Fn(LlmEvent) + Send + Sync);

/// Something that answers chat requests.
pub trait LlmProvider: Send + Sync {
    /// Run one logical model call (retries and model switches included), streaming its output
    /// to `on_event`; stops promptly with `LlmError::Cancelled` when `cancel` fires.
    fn complete<'a>(
        &'a self,
        request: &'a ChatRequest,
        on_event: EventFn<'a>,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<Completion, LlmError>>;
}
