//! The model side of a session, built the same way for `exec` and `chat`: which provider
//! (`--llm openai` or `replay:FILE`, optionally `--record FILE`), which main and fast models,
//! one token account for foreground and background calls.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use shade_agent::background::{BackgroundLlm, MeteredProvider, TokenStats};
use shade_llm::cassette::{RecordingProvider, ReplayProvider};
use shade_llm::{LlmProvider, OpenAiClient};

use crate::config::{Overrides, Settings};

/// The command-line choices that pick a provider and models, shared by `exec` and `chat`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LlmChoice {
    /// Model provider: `openai` (any OpenAI-compatible server, the default) or `replay:FILE`
    /// to serve a recorded cassette (and its background cassette beside it).
    #[arg(long, default_value = "openai", value_name = "SPEC")]
    pub llm: String,
    /// Record every model call into this cassette file (JSONL); background calls go beside
    /// it, in NAME.background.jsonl.
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
    /// Model (overrides SHADE_MODEL and the config file).
    #[arg(long)]
    pub model: Option<String>,
    /// Model for background work such as suggestions (overrides SHADE_FAST_MODEL and the
    /// config file's `fast_model`; default: the main model).
    #[arg(long)]
    pub fast_model: Option<String>,
    /// Server base URL, e.g. http://127.0.0.1:8000/v1 (overrides OPENAI_BASE_URL).
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,
    /// Config file (default: $XDG_CONFIG_HOME/shade/config.toml).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// A ready model side.
pub struct LlmSetup {
    /// Every call goes through it (metered into `stats`).
    pub provider: Arc<dyn LlmProvider>,
    /// The main model.
    pub model: String,
    /// Background calls (fast model, thinking off, prompt ids).
    pub background: BackgroundLlm,
    /// Tokens per model, background apart.
    pub stats: TokenStats,
    /// The settings in force, read once (when replaying: the model client's are defaults,
    /// the rest from the file).
    pub settings: Settings,
}

/// Build the provider chosen by `--llm` (and `--record`).
pub fn setup(choice: &LlmChoice) -> anyhow::Result<LlmSetup> {
    let (raw, model, fast, settings): (Arc<dyn LlmProvider>, String, String, Settings) =
        if let Some(file) = choice.llm.strip_prefix("replay:") {
            if choice.record.is_some() {
                anyhow::bail!("--record cannot be combined with --llm replay:");
            }
            let replay = ReplayProvider::open(Path::new(file))?;
            let model = choice.model.clone().unwrap_or_else(|| "replay".to_string());
            let fast = choice.fast_model.clone().unwrap_or_else(|| model.clone());
            // Replays use default model settings, but the tools' settings from the file.
            let settings = Settings {
                llm: Default::default(),
                ..crate::config::load(&Overrides {
                    config_file: choice.config.clone(),
                    ..Overrides::default()
                })?
            };
            (Arc::new(replay), model, fast, settings)
        } else if choice.llm == "openai" {
            let settings = crate::config::load(&Overrides {
                base_url: choice.base_url.clone(),
                model: choice.model.clone(),
                fast_model: choice.fast_model.clone(),
                config_file: choice.config.clone(),
            })?;
            let model = settings.llm.main_model()?.to_string();
            let fast = settings.llm.background_model()?.to_string();
            let client = OpenAiClient::new(settings.llm.clone())?;
            let provider: Arc<dyn LlmProvider> = match &choice.record {
                Some(path) => Arc::new(RecordingProvider::create(client, path)?),
                None => Arc::new(client),
            };
            (provider, model, fast, settings)
        } else {
            anyhow::bail!(
                "unknown --llm `{}` (expected `openai` or `replay:FILE`)",
                choice.llm
            );
        };
    let stats = TokenStats::default();
    let provider: Arc<dyn LlmProvider> = Arc::new(MeteredProvider::new(raw, stats.clone()));
    Ok(LlmSetup {
        background: BackgroundLlm::new(provider.clone(), fast),
        provider,
        model,
        stats,
        settings,
    })
}
