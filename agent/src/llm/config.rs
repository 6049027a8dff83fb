//! Where the client's settings come from: defaults, then the config file
//! (`$XDG_CONFIG_HOME/shade/config.toml`), then the environment, then command-line flags.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::error::LlmError;
use crate::tools::config::{
    McpServerConfig, OutputBudget, ToolsConfig, WebFetchConfig, WebSearchConfig,
};

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
    /// The tools' settings, read from the same file.
    pub tools: ToolsConfig,
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
            tools: ToolsConfig::default(),
        }
    }
}

/// The config file's shape (all optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// See `LlmConfig::base_url`.
    pub base_url: Option<String>,
    /// See `LlmConfig::api_key`.
    pub api_key: Option<String>,
    /// See `LlmConfig::model`.
    pub model: Option<String>,
    /// See `LlmConfig::fast_model`.
    pub fast_model: Option<String>,
    /// See `LlmConfig::large_context_model`.
    pub large_context_model: Option<String>,
    /// See `LlmConfig::backup_model`.
    pub backup_model: Option<String>,
    /// See `LlmConfig::stream`.
    pub stream: Option<bool>,
    /// See `LlmConfig::max_retries`.
    pub max_retries: Option<u32>,
    /// Milliseconds; see `LlmConfig::base_delay`.
    pub base_delay_ms: Option<u64>,
    /// Seconds; see `LlmConfig::idle_timeout`.
    pub idle_timeout_secs: Option<u64>,
    /// See `LlmConfig::thinking_param`.
    pub thinking_param: Option<ThinkingParam>,
    /// Prompt suggestions after answers (default true; see `followup::FollowupSettings`).
    pub enable_followup_suggestions: Option<bool>,
    /// Suggestions and speculation fork the conversation's cached prefix (default true).
    pub enable_cache_sharing: Option<bool>,
    /// Speculate on a shown suggestion (default true).
    pub enable_speculation: Option<bool>,
    /// Local telemetry in the state dir's `telemetry.jsonl` (default true).
    pub telemetry: Option<bool>,
    /// The `[lint]` section (checkers, language servers, the post-edit budget).
    pub lint: Option<crate::lint::LintConfig>,
    /// See `LlmConfig::context_window`.
    pub context_window: Option<u64>,
    /// See `LlmConfig::compact_threshold`.
    pub compact_threshold: Option<f64>,
    /// `[output_budget]`: see [`ToolsConfig::output_budget`].
    pub output_budget: Option<OutputBudget>,
    /// `[web_fetch]`: see [`ToolsConfig::web_fetch`].
    pub web_fetch: Option<WebFetchConfig>,
    /// `[web_search]`: see [`ToolsConfig::web_search`].
    pub web_search: Option<WebSearchConfig>,
    /// `[mcp_servers.NAME]`: see [`ToolsConfig::mcp_servers`].
    pub mcp_servers: Option<std::collections::BTreeMap<String, McpServerConfig>>,
}

/// Values given on the command line; they win over everything else.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--base-url`.
    pub base_url: Option<String>,
    /// `--model`.
    pub model: Option<String>,
    /// `--fast-model`.
    pub fast_model: Option<String>,
    /// `--config`: read this file instead of the default one.
    pub config_file: Option<PathBuf>,
}

/// The default config file: `$SHADE_CONFIG`, else `$XDG_CONFIG_HOME/shade/config.toml`,
/// else `~/.config/shade/config.toml`.
pub fn default_config_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SHADE_CONFIG") {
        return Some(PathBuf::from(p));
    }
    config_dir().map(|d| d.join("config.toml"))
}

/// shade's directory under the XDG config dir (also home of the global memory file).
pub fn config_dir() -> Option<PathBuf> {
    let base = match std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        Some(x) => PathBuf::from(x),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".config"),
    };
    Some(base.join("shade"))
}

impl LlmConfig {
    /// Load with the usual precedence; a missing default file is fine, a broken one is not.
    pub fn load(overrides: &Overrides) -> Result<Self, LlmError> {
        let mut cfg = Self::default();
        cfg.apply_file(&load_file_config(overrides)?);
        cfg.apply_env(|k| std::env::var(k).ok().filter(|v| !v.is_empty()));
        cfg.apply_overrides(overrides);
        Ok(cfg)
    }

    /// Merge a parsed config file.
    pub fn apply_file(&mut self, f: &FileConfig) {
        set(&mut self.base_url, f.base_url.clone());
        set_opt(&mut self.api_key, f.api_key.clone());
        set_opt(&mut self.model, f.model.clone());
        set_opt(&mut self.fast_model, f.fast_model.clone());
        set_opt(&mut self.large_context_model, f.large_context_model.clone());
        set_opt(&mut self.backup_model, f.backup_model.clone());
        set(&mut self.stream, f.stream);
        set(&mut self.max_retries, f.max_retries);
        set(
            &mut self.base_delay,
            f.base_delay_ms.map(Duration::from_millis),
        );
        set(
            &mut self.idle_timeout,
            f.idle_timeout_secs.map(Duration::from_secs),
        );
        set(&mut self.thinking_param, f.thinking_param);
        set(&mut self.context_window, f.context_window);
        set(&mut self.compact_threshold, f.compact_threshold);
        set(&mut self.tools.output_budget, f.output_budget.clone());
        set(&mut self.tools.web_fetch, f.web_fetch.clone());
        set_opt(&mut self.tools.web_search, f.web_search.clone());
        set(&mut self.tools.mcp_servers, f.mcp_servers.clone());
    }

    /// Merge environment variables (`get` abstracts `std::env` for tests).
    pub fn apply_env(&mut self, get: impl Fn(&str) -> Option<String>) {
        set(&mut self.base_url, get("OPENAI_BASE_URL"));
        set_opt(&mut self.api_key, get("OPENAI_API_KEY"));
        set_opt(&mut self.model, get("SHADE_MODEL"));
        set_opt(&mut self.fast_model, get("SHADE_FAST_MODEL"));
    }

    /// Merge command-line flags.
    pub fn apply_overrides(&mut self, o: &Overrides) {
        set(&mut self.base_url, o.base_url.clone());
        set_opt(&mut self.model, o.model.clone());
        set_opt(&mut self.fast_model, o.fast_model.clone());
    }

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

/// The config file `--config` names, or the default one; a missing default file reads as
/// empty, a broken or missing explicit one is an error.
pub fn load_file_config(overrides: &Overrides) -> Result<FileConfig, LlmError> {
    let explicit = overrides.config_file.is_some();
    match overrides.config_file.clone().or_else(default_config_path) {
        Some(path) if explicit || path.exists() => read_file_config(&path),
        _ => Ok(FileConfig::default()),
    }
}

fn read_file_config(path: &Path) -> Result<FileConfig, LlmError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| LlmError::Config(format!("cannot read {}: {e}", path.display())))?;
    toml::from_str(&text).map_err(|e| LlmError::Config(format!("{}: {e}", path.display())))
}

fn set<T>(slot: &mut T, v: Option<T>) {
    if let Some(v) = v {
        *slot = v;
    }
}

fn set_opt<T>(slot: &mut Option<T>, v: Option<T>) {
    if v.is_some() {
        *slot = v;
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
    fn precedence_file_env_flags() {
        let mut c = LlmConfig::default();
        let file: FileConfig = toml::from_str(
            "model = \"file-model\"\nfast_model = \"file-fast\"\nbase_url = \"http://file/v1\"\nbackup_model = \"b\"",
        )
        .expect("toml");
        c.apply_file(&file);
        c.apply_env(|k| (k == "SHADE_MODEL").then(|| "env-model".to_string()));
        assert_eq!(c.model.as_deref(), Some("env-model"));
        assert_eq!(c.fast_model.as_deref(), Some("file-fast"));
        c.apply_overrides(&Overrides {
            model: Some("flag-model".into()),
            ..Overrides::default()
        });
        assert_eq!(c.main_model().ok(), Some("flag-model"));
        assert_eq!(c.base_url, "http://file/v1");
        assert_eq!(c.backup_model.as_deref(), Some("b"));
        let tools: FileConfig = toml::from_str(
            "[output_budget]\nshell = 5\n[web_fetch]\nallow_private = true\n\
             [web_search]\nprovider = \"openai\"\nurl = \"http://s/v1\"\nmodel = \"m\"",
        )
        .expect("tools toml");
        c.apply_file(&tools);
        assert_eq!(c.tools.output_budget.shell, 5);
        assert!(c.tools.web_fetch.allow_private);
        assert_eq!(
            c.tools.web_search.as_ref().map(|w| w.url.as_str()),
            Some("http://s/v1")
        );
        assert!(toml::from_str::<FileConfig>("[web_fetch]\nallow_privat = true").is_err());
    }

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
    fn unknown_keys_rejected_and_dashscope_detected() {
        assert!(toml::from_str::<FileConfig>("modle = 1").is_err());
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
