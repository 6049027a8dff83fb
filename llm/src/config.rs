//! The client's settings: a plain struct with defaults. Whoever reads the config file, the
//! environment and the flags (the CLI) fills it in and hands it down.

use std::time::Duration;

use serde::Deserialize;

use super::error::LlmError;

/// How to turn thinking off for background calls: providers spell it differently, and an
/// unknown parameter is a 400 on OpenAI, so it is only sent where it is understood.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ThinkingParam {
    /// Pick from the host: DashScope → `enable_thinking`, others → nothing.
    Auto,
    /// Top-level `enable_thinking` (DashScope, SiliconFlow).
    EnableThinking,
    /// `chat_template_kwargs.enable_thinking` (vLLM / SGLang serving Qwen3-style models).
    ChatTemplateKwargs,
    /// Never send a thinking switch.
    None,
}

/// Settings of the OpenAI-compatible client.
#[derive(Debug, Clone, PartialEq)]
pub struct LlmConfig {
    /// Base URL up to and including `/v1` (requests go to `{base}/chat/completions`).
    pub base_url: String,
    /// Bearer token; local servers often need none.
    pub api_key: Option<String>,
    /// Main model.
    pub model: Option<String>,
    /// Model for background work (suggestions, summaries); falls back to `model`.
    pub fast_model: Option<String>,
    /// Used when a request is larger than the main model's context window.
    pub large_context_model: Option<String>,
    /// Used when the main model is rate limited.
    pub backup_model: Option<String>,
    /// Ask for SSE streaming (off: plain JSON responses).
    pub stream: bool,
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// First backoff delay.
    pub base_delay: Duration,
    /// Cap of one backoff delay (also caps `Retry-After`).
    pub max_delay: Duration,
    /// Longest silence tolerated inside a stream.
    pub idle_timeout: Duration,
    /// How to disable thinking.
    pub thinking_param: ThinkingParam,
    /// The main model's context window in tokens: `shade chat` compacts older turns when a
    /// request's prompt passes `compact_threshold` of it.
    pub context_window: u64,
    /// Fraction of the context window that triggers compaction.
    pub compact_threshold: f64,
}

impl Default for LlmConfig {
    fn default() -> Self {
        Self {
            base_url: "https://api.openai.com/v1".to_string(),
            api_key: None,
            model: None,
            fast_model: None,
            large_context_model: None,
            backup_model: None,
            stream: true,
            max_retries: 4,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(120),
            thinking_param: ThinkingParam::Auto,
            context_window: 128_000,
            compact_threshold: 0.8,
        }
    }
}

impl LlmConfig {
    /// The model for foreground calls, or a clear error saying how to set one.
    pub fn main_model(&self) -> Result<&str, LlmError> {
        self.model.as_deref().ok_or_else(|| {
            LlmError::Config(
                "no model configured: set SHADE_MODEL, `model` in the config file, or --model"
                    .into(),
            )
        })
    }

    /// The model for background calls.
    pub fn background_model(&self) -> Result<&str, LlmError> {
        match self.fast_model.as_deref() {
            Some(m) => Ok(m),
            None => self.main_model(),
        }
    }

    /// A request for background work (suggestions, summaries, classifiers): the fast model,
    /// thinking disabled, same wire path as foreground calls.
    pub fn background_request(
        &self,
        messages: Vec<super::types::Message>,
    ) -> Result<super::types::ChatRequest, LlmError> {
        Ok(super::types::ChatRequest {
            model: self.background_model()?.to_string(),
            messages,
            tools: Vec::new(),
            temperature: None,
            max_tokens: None,
            background: true,
            prompt_id: None,
        })
    }

    /// Is the server Alibaba Cloud DashScope (prefix-cache markers, `enable_thinking`)?
    pub fn is_dashscope(&self) -> bool {
        host_of(&self.base_url).is_some_and(|h| h.contains("dashscope"))
    }
}

/// Host part of a URL, without parsing crates.
pub fn host_of(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split(['/', '?', '#']).next()?;
    let host = authority.rsplit('@').next()?;
    let host = host.split(':').next()?;
    Some(host.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn background_requests_use_the_fast_model() {
        let mut c = LlmConfig {
            model: Some("big".into()),
            ..LlmConfig::default()
        };
        let r = c.background_request(vec![]).expect("request");
        assert_eq!((r.model.as_str(), r.background), ("big", true));
        c.fast_model = Some("small".into());
        assert_eq!(
            c.background_request(vec![]).expect("request").model,
            "small"
        );
        assert!(LlmConfig::default().background_request(vec![]).is_err());
    }

    #[test]
    fn dashscope_detected() {
        let c = LlmConfig {
            base_url: "https://dashscope.aliyuncs.com/compatible-mode/v1".into(),
            ..LlmConfig::default()
        };
        assert!(c.is_dashscope());
        assert!(!LlmConfig::default().is_dashscope());
        assert_eq!(
            host_of("http://u:p@127.0.0.1:8080/v1").as_deref(),
            Some("127.0.0.1")
        );
    }
}
