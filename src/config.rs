//! shade's settings, read once and in one place: defaults, then the config file
//! (`--config`, `$SHADE_CONFIG` or `$XDG_CONFIG_HOME/shade/config.toml`), then the
//! environment, then command-line flags. The library crates get plain structs from here
//! ([`Settings`]): the model client's, the tools', the suggestions' and the lints'.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use shade_agent::followup::FollowupSettings;
use shade_agent::tools::config::{
    McpServerConfig, OutputBudget, ToolsConfig, WebFetchConfig, WebSearchConfig,
};
use shade_fusefs::sandbox::Limits;
use shade_lint::LintConfig;
use shade_llm::config::ThinkingParam;
use shade_llm::{LlmConfig, LlmError};

/// Everything the config file, the environment and the flags set, as the crates take it.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// The model client's settings.
    pub llm: LlmConfig,
    /// The tools' settings (`[output_budget]`, `[web_fetch]`, `[web_search]`, `[mcp_servers]`).
    pub tools: ToolsConfig,
    /// The suggestion and speculation switches.
    pub followup: FollowupSettings,
    /// The `[lint]` section.
    pub lint: LintConfig,
}

/// Read the settings with the usual precedence; a missing default file is fine, a broken
/// one is not.
pub fn load(overrides: &Overrides) -> Result<Settings, LlmError> {
    let file = load_file_config(overrides)?;
    // main set the default file's limits; a file named with --config replaces them.
    let sandbox = file.sandbox.clone().unwrap_or_default();
    let (run, speculation) = sandbox.limits().map_err(LlmError::Config)?;
    shade_fusefs::sandbox::configure_limits(run, speculation);
    install_sandbox(&file);
    let mut llm = LlmConfig::default();
    apply_file(&mut llm, &file);
    apply_env(&mut llm, |k| {
        std::env::var(k).ok().filter(|v| !v.is_empty())
    });
    apply_overrides(&mut llm, overrides);
    Ok(Settings {
        llm,
        tools: tools_config(&file),
        followup: followup_settings(&file),
        lint: file.lint.unwrap_or_default(),
    })
}

/// The `[lint]` section of `config_file` (default: the usual file); a missing default file
/// is an empty section, a broken one an error.
pub fn lint_config(config_file: Option<PathBuf>) -> Result<LintConfig, String> {
    load_file_config(&Overrides {
        config_file,
        ..Default::default()
    })
    .map(|f| {
        install_sandbox(&f);
        f.lint.unwrap_or_default()
    })
    .map_err(|e| e.to_string())
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
    pub lint: Option<LintConfig>,
    /// See `LlmConfig::context_window`.
    pub context_window: Option<u64>,
    /// See `LlmConfig::compact_threshold`.
    pub compact_threshold: Option<f64>,
    /// `[output_budget]`: see [`shade_agent::tools::config::ToolsConfig::output_budget`].
    pub output_budget: Option<OutputBudget>,
    /// `[web_fetch]`: see [`shade_agent::tools::config::ToolsConfig::web_fetch`].
    pub web_fetch: Option<WebFetchConfig>,
    /// `[web_search]`: see [`shade_agent::tools::config::ToolsConfig::web_search`].
    pub web_search: Option<WebSearchConfig>,
    /// `[mcp_servers.NAME]`: see [`shade_agent::tools::config::ToolsConfig::mcp_servers`].
    pub mcp_servers: Option<std::collections::BTreeMap<String, McpServerConfig>>,
    /// `[sandbox]`: what a command may consume (`[sandbox.run]`, `[sandbox.speculation]`,
    /// see [`sandbox_limits`]) and what it gets of shade's environment and home.
    pub sandbox: Option<SandboxConfig>,
    /// `[outside]`: what happens to a command's writes outside the project.
    pub outside: Option<OutsideConfig>,
    /// `[history]`: how much of the accept history (for `shade undo`) is kept.
    pub history: Option<HistoryConfig>,
    /// `[mcp]`: how many branches `shade mcp` keeps at once.
    pub mcp: Option<McpConfig>,
}

/// The `[mcp]` section: each branch is a mount with its own threads, so a client (or a
/// looping model) may not make them without end.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpConfig {
    /// Live branches per MCP session (default 16).
    pub max_branches: Option<usize>,
    /// Live branches of all sessions of one `shade mcp` process (default 64).
    pub max_branches_total: Option<usize>,
}

/// `[mcp]`'s (per session, per process) branch caps of the usual config file, defaults
/// filled in (a missing default file gives the defaults, a broken one an error).
pub fn mcp_branch_caps() -> Result<(usize, usize), String> {
    let m = load_file_config(&Overrides::default())
        .map_err(|e| e.to_string())?
        .mcp
        .unwrap_or_default();
    Ok((
        m.max_branches.unwrap_or(16).max(1),
        m.max_branches_total.unwrap_or(64).max(1),
    ))
}

/// The `[history]` section.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryConfig {
    /// How many of the latest accepts can be undone (default 1000: a default chat session accepts every tool call that changed files; 0 records no history).
    pub keep_accepts: Option<usize>,
    /// At most this much stored earlier content, e.g. "2GiB" (the default).
    pub max_size: Option<String>,
}

/// Puts the file's `[history]` settings in force for every later accept of this process.
pub fn install_history(file: &FileConfig) -> Result<(), String> {
    let h = file.history.clone().unwrap_or_default();
    let mut r = shade_fusefs::accept::history::Retention::default();
    if let Some(k) = h.keep_accepts {
        r.keep = k;
    }
    if let Some(s) = &h.max_size {
        r.max_bytes =
            shade_fusefs::units::parse_size(s).map_err(|e| format!("[history] max_size: {e}"))?;
    }
    shade_fusefs::accept::history::configure(r);
    Ok(())
}

/// The `[outside]` section.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutsideConfig {
    /// Outside paths (or directory prefixes; `~/` is the home) kept whenever the project is
    /// accepted, e.g. an agent's own state directory such as `~/.claude`.
    #[serde(default)]
    pub keep: Vec<String>,
}

/// The `[outside] keep` list of the usual config file (a missing default file is an empty
/// list, a broken one an error).
pub fn outside_keep() -> Result<Vec<String>, String> {
    load_file_config(&Overrides::default())
        .map(|f| f.outside.map(|o| o.keep).unwrap_or_default())
        .map_err(|e| e.to_string())
}

/// The `[sandbox]` section: limits per mode, and the secrets of the environment and the
/// home (see `shade_fusefs::sandbox::env`).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxConfig {
    /// `shade run`'s commands.
    pub run: Option<LimitsConfig>,
    /// Commands nobody asked for yet: speculation, and `shade mcp`'s.
    pub speculation: Option<LimitsConfig>,
    /// Variables the agent's commands get although they look secret (names, or prefixes
    /// ending in `*`).
    #[serde(default)]
    pub pass_env: Vec<String>,
    /// Hide the home's credential files from `shade run` too (they are always hidden from
    /// the agent's commands).
    #[serde(default)]
    pub hide_credentials: bool,
    /// Unix sockets outside the branch that commands may connect to (every other one is
    /// closed): paths, `$VAR` and `~/` expanded, e.g. `"$SSH_AUTH_SOCK"`.
    #[serde(default)]
    pub allow_sockets: Vec<String>,
}

/// One mode's limits as written in the config; what is left out keeps the mode's default.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Processes at once; 0 is the host's default share (never unlimited; past half of
    /// the host's free pids it is lowered, see `shade_fusefs::sandbox::bounded_limits`).
    pub max_processes: Option<u32>,
    /// The private /tmp's size ("512MiB", "1G", bytes; "unlimited": the kernel's default).
    pub tmp_size: Option<Size>,
    /// The private /dev/shm's size (as `tmp_size`).
    pub shm_size: Option<Size>,
    /// File contents the branch may hold ("unlimited": no limit).
    pub branch_size: Option<Size>,
    /// Metadata (entries, symlinks, xattrs) the branch may keep in shade's memory
    /// ("unlimited" keeps the built-in 1 GiB: the daemon stays bounded).
    pub branch_metadata: Option<Size>,
    /// Seconds before the command is killed; 0 is no limit.
    pub time_limit_secs: Option<u64>,
    /// What the branch's outside layer may hold, in memory ("unlimited": on the state
    /// directory's disk, no limit).
    pub outside_size: Option<Size>,
    /// Memory (and swap) the command may use ("4GiB"; "unlimited": no limit of shade's).
    /// As root, its processes together (a cgroup); as a plain user, each process's address
    /// space (`RLIMIT_AS`).
    pub memory: Option<Size>,
    /// The command's CPU weight as root (its cgroup's `cpu.weight`, 1–10000, 100 a plain
    /// process's; 0: no cpu controller setting).
    pub cpu_weight: Option<u32>,
    /// The niceness (0–19) its processes start with and cannot lower.
    pub nice: Option<u8>,
    /// Their scheduling policy: "normal" (shade's own), "batch" or "idle".
    pub scheduler: Option<String>,
    /// Files each of its processes may have open (`RLIMIT_NOFILE`); 0: the host's default
    /// share (processes × files within half of `fs.file-max` at most).
    pub open_files: Option<u64>,
    /// Ptys it may have at once (its devpts's `max=`); 0: the host's default share (less
    /// than an eighth of the ptys sandboxes and containers may still open, half at most).
    pub ptys: Option<u32>,
}

/// A size in the config: a number of bytes or a string such as "512MiB" or "unlimited".
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Size {
    /// Bytes.
    Bytes(u64),
    /// "512MiB", "1G", "unlimited".
    Text(String),
}

impl Size {
    /// `None` for "unlimited".
    fn bytes(&self, key: &str) -> Result<Option<u64>, String> {
        match self {
            Size::Bytes(b) => Ok(Some(*b)),
            Size::Text(t) if t.trim().eq_ignore_ascii_case("unlimited") => Ok(None),
            Size::Text(t) => shade_fusefs::units::parse_size(t)
                .map(Some)
                .map_err(|e| format!("{key}: {e}")),
        }
    }
}

impl LimitsConfig {
    /// `base` with what this section sets.
    fn apply(&self, base: Limits) -> Result<Limits, String> {
        let mut l = base;
        if let Some(n) = self.max_processes {
            l.max_processes = (n > 0).then_some(n);
        }
        for (key, value, slot) in [
            ("tmp_size", &self.tmp_size, &mut l.tmp_size),
            ("shm_size", &self.shm_size, &mut l.shm_size),
            ("branch_size", &self.branch_size, &mut l.branch_size),
            (
                "branch_metadata",
                &self.branch_metadata,
                &mut l.branch_metadata,
            ),
            ("outside_size", &self.outside_size, &mut l.outside_size),
            ("memory", &self.memory, &mut l.memory),
        ] {
            if let Some(v) = value {
                *slot = v.bytes(key)?;
            }
        }
        if let Some(secs) = self.time_limit_secs {
            l.time_limit = (secs > 0).then(|| Duration::from_secs(secs));
        }
        if let Some(w) = self.cpu_weight {
            if w > 10_000 {
                return Err(format!("cpu_weight: {w} is not between 0 and 10000"));
            }
            l.cpu_weight = (w > 0).then_some(w);
        }
        if let Some(n) = self.nice {
            if n > 19 {
                return Err(format!("nice: {n} is not between 0 and 19"));
            }
            l.nice = Some(n);
        }
        if let Some(n) = self.open_files {
            l.open_files = (n > 0).then_some(n);
        }
        if let Some(n) = self.ptys {
            l.ptys = (n > 0).then_some(n);
        }
        if let Some(s) = &self.scheduler {
            l.scheduler = shade_fusefs::sandbox::Scheduler::parse(s.trim()).ok_or_else(|| {
                format!("scheduler: {s:?} is not \"normal\", \"batch\" or \"idle\"")
            })?;
        }
        Ok(l)
    }
}

/// The limits of `shade run` and of speculation/MCP commands that `config_file` (default:
/// the usual file) sets, on top of the built-in ones ([`Limits::RUN`],
/// [`Limits::SPECULATION`]). Only the `[sandbox]` table is read, so a command that needs
/// nothing else of the file is not stopped by a problem elsewhere in it.
pub fn sandbox_limits(config_file: Option<PathBuf>) -> Result<(Limits, Limits), String> {
    let explicit = config_file.is_some();
    let defaults = (Limits::RUN, Limits::SPECULATION);
    let Some(path) = config_file.or_else(default_config_path) else {
        return Ok(defaults);
    };
    if !explicit && !path.exists() {
        return Ok(defaults);
    }
    shade_agent::paths::note_config_file(&path);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut table: toml::Table =
        toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let Some(section) = table.remove("sandbox") else {
        return Ok(defaults);
    };
    let sandbox: SandboxConfig = section
        .try_into()
        .map_err(|e| format!("{}: [sandbox]: {e}", path.display()))?;
    sandbox
        .limits()
        .map_err(|e| format!("{}: {e}", path.display()))
}

impl SandboxConfig {
    /// `shade run`'s limits and speculation's, the built-in ones with what this sets.
    pub fn limits(&self) -> Result<(Limits, Limits), String> {
        let run = self.run.clone().unwrap_or_default().apply(Limits::RUN);
        let spec = self
            .speculation
            .clone()
            .unwrap_or_default()
            .apply(Limits::SPECULATION);
        Ok((
            run.map_err(|e| format!("[sandbox.run] {e}"))?,
            spec.map_err(|e| format!("[sandbox.speculation] {e}"))?,
        ))
    }
}

/// Puts the file's `[sandbox]` settings in force for every later command of this process.
pub fn install_sandbox(file: &FileConfig) {
    let s = file.sandbox.clone().unwrap_or_default();
    shade_fusefs::sandbox::env::configure(shade_fusefs::sandbox::EnvConfig {
        pass_env: s.pass_env,
        hide_credentials: s.hide_credentials,
    });
    // A variable that is not set allows nothing (said in the log; `shade doctor` lists it).
    let sockets = s.allow_sockets.iter().filter_map(|p| {
        shade_fusefs::sandbox::expand_socket(p)
            .map_err(|e| {
                tracing::info!("[sandbox] allow_sockets: {e}");
                shade_fusefs::sandbox::note_unresolved(e);
            })
            .ok()
    });
    shade_fusefs::sandbox::allow_sockets(sockets);
}

/// At start, for every subcommand: the default config file's `[sandbox]` settings (a
/// subcommand given `--config` installs that file's when it reads it). A broken file leaves
/// the defaults, the strict ones, and is said when a subcommand reads it.
pub fn install_default_sandbox() {
    match load_file_config(&Overrides::default()) {
        Ok(file) => {
            install_sandbox(&file);
            if let Err(e) = install_history(&file) {
                eprintln!("shade: warning: {e}; the default history limits apply");
            }
        }
        Err(e) => tracing::debug!("config not read for the sandbox settings: {e}"),
    }
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
    shade_agent::paths::config_dir().map(|d| d.join("config.toml"))
}

/// Merge a parsed config file into the client's settings.
pub fn apply_file(cfg: &mut LlmConfig, f: &FileConfig) {
    set(&mut cfg.base_url, f.base_url.clone());
    set_opt(&mut cfg.api_key, f.api_key.clone());
    set_opt(&mut cfg.model, f.model.clone());
    set_opt(&mut cfg.fast_model, f.fast_model.clone());
    set_opt(&mut cfg.large_context_model, f.large_context_model.clone());
    set_opt(&mut cfg.backup_model, f.backup_model.clone());
    set(&mut cfg.stream, f.stream);
    set(&mut cfg.max_retries, f.max_retries);
    set(
        &mut cfg.base_delay,
        f.base_delay_ms.map(Duration::from_millis),
    );
    set(
        &mut cfg.idle_timeout,
        f.idle_timeout_secs.map(Duration::from_secs),
    );
    set(&mut cfg.thinking_param, f.thinking_param);
    set(&mut cfg.context_window, f.context_window);
    set(&mut cfg.compact_threshold, f.compact_threshold);
}

/// The tools' settings of a parsed config file.
pub fn tools_config(f: &FileConfig) -> ToolsConfig {
    let mut tools = ToolsConfig::default();
    set(&mut tools.output_budget, f.output_budget.clone());
    set(&mut tools.web_fetch, f.web_fetch.clone());
    set_opt(&mut tools.web_search, f.web_search.clone());
    set(&mut tools.mcp_servers, f.mcp_servers.clone());
    tools
}

/// The suggestion switches: the defaults overridden by what the file sets.
pub fn followup_settings(file: &FileConfig) -> FollowupSettings {
    let d = FollowupSettings::default();
    FollowupSettings {
        suggestions: file.enable_followup_suggestions.unwrap_or(d.suggestions),
        cache_sharing: file.enable_cache_sharing.unwrap_or(d.cache_sharing),
        speculation: file.enable_speculation.unwrap_or(d.speculation),
        telemetry: file.telemetry.unwrap_or(d.telemetry),
    }
}

/// Merge environment variables (`get` abstracts `std::env` for tests).
pub fn apply_env(cfg: &mut LlmConfig, get: impl Fn(&str) -> Option<String>) {
    set(&mut cfg.base_url, get("OPENAI_BASE_URL"));
    set_opt(&mut cfg.api_key, get("OPENAI_API_KEY"));
    set_opt(&mut cfg.model, get("SHADE_MODEL"));
    set_opt(&mut cfg.fast_model, get("SHADE_FAST_MODEL"));
}

/// Merge command-line flags.
pub fn apply_overrides(cfg: &mut LlmConfig, o: &Overrides) {
    set(&mut cfg.base_url, o.base_url.clone());
    set_opt(&mut cfg.model, o.model.clone());
    set_opt(&mut cfg.fast_model, o.fast_model.clone());
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
    shade_agent::paths::note_config_file(path);
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
        apply_file(&mut c, &file);
        apply_env(&mut c, |k| {
            (k == "SHADE_MODEL").then(|| "env-model".to_string())
        });
        assert_eq!(c.model.as_deref(), Some("env-model"));
        assert_eq!(c.fast_model.as_deref(), Some("file-fast"));
        apply_overrides(
            &mut c,
            &Overrides {
                model: Some("flag-model".into()),
                ..Overrides::default()
            },
        );
        assert_eq!(c.main_model().ok(), Some("flag-model"));
        assert_eq!(c.base_url, "http://file/v1");
        assert_eq!(c.backup_model.as_deref(), Some("b"));
        let tools: FileConfig = toml::from_str(
            "[output_budget]\nshell = 5\n[web_fetch]\nallow_private = true\n\
             [web_search]\nprovider = \"openai\"\nurl = \"http://s/v1\"\nmodel = \"m\"",
        )
        .expect("tools toml");
        apply_file(&mut c, &tools);
        let t = tools_config(&tools);
        assert_eq!(t.output_budget.shell, 5);
        assert!(t.web_fetch.allow_private);
        assert_eq!(
            t.web_search.as_ref().map(|w| w.url.as_str()),
            Some("http://s/v1")
        );
        assert!(toml::from_str::<FileConfig>("[web_fetch]\nallow_privat = true").is_err());
    }

    #[test]
    fn sandbox_section_parses_and_rejects_typos() {
        let f: FileConfig = toml::from_str(
            "[sandbox]\npass_env = [\"NPM_TOKEN\", \"CARGO_REGISTRIES_*\"]\nhide_credentials = true\n",
        )
        .expect("toml");
        let s = f.sandbox.expect("section");
        assert_eq!(s.pass_env, ["NPM_TOKEN", "CARGO_REGISTRIES_*"]);
        assert!(s.hide_credentials);
        let empty: FileConfig = toml::from_str("[sandbox]\n").expect("toml");
        let s = empty.sandbox.expect("section");
        assert!(s.pass_env.is_empty() && !s.hide_credentials);
        assert!(toml::from_str::<FileConfig>("[sandbox]\npass_envs = []").is_err());
    }

    #[test]
    fn unknown_keys_rejected() {
        assert!(toml::from_str::<FileConfig>("modle = 1").is_err());
    }

    #[test]
    fn followup_defaults_on_and_file_overrides() {
        let empty: FileConfig = toml::from_str("").expect("toml");
        assert_eq!(followup_settings(&empty), FollowupSettings::default());
        let file: FileConfig = toml::from_str(
            "enable_followup_suggestions = false\nenable_cache_sharing = false\nenable_speculation = false\ntelemetry = false\nfast_model = \"small\"",
        )
        .expect("toml");
        let s = followup_settings(&file);
        assert_eq!(
            s,
            FollowupSettings {
                suggestions: false,
                cache_sharing: false,
                speculation: false,
                telemetry: false
            }
        );
        assert!(toml::from_str::<FileConfig>("enable_suggestions = true").is_err());
    }

    #[test]
    fn load_reads_the_named_file() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "telemetry = false\n").expect("write");
        let s = load(&Overrides {
            config_file: Some(path),
            ..Overrides::default()
        })
        .expect("load")
        .followup;
        assert!(!s.telemetry && s.suggestions);
        let missing = load(&Overrides {
            config_file: Some(dir.path().join("nope.toml")),
            ..Overrides::default()
        });
        assert!(missing.is_err());
    }

    #[test]
    fn the_sandbox_tables_set_each_modes_limits_over_the_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        std::fs::write(
            &path,
            "model = \"m\"\n[sandbox.run]\nmax_processes = 100\ntmp_size = \"1G\"\n\
             [sandbox.speculation]\nbranch_size = \"unlimited\"\nshm_size = 4096\n\
             time_limit_secs = 0\nmemory = \"512MiB\"\n",
        )
        .unwrap();
        let (run, spec) = sandbox_limits(Some(path.clone())).unwrap();
        assert_eq!(spec.memory, Some(512 << 20));
        assert_eq!(run.memory, Limits::RUN.memory);
        assert_eq!(run.max_processes, Some(100));
        assert_eq!(run.tmp_size, Some(1 << 30));
        assert_eq!(run.branch_size, None);
        assert_eq!(spec.branch_size, None);
        assert_eq!(spec.shm_size, Some(4096));
        assert_eq!(spec.time_limit, None);
        assert_eq!(spec.max_processes, Some(512));
        assert_eq!(spec.tmp_size, Some(512 << 20));
        // The whole file parses too ([sandbox] is a known section).
        assert!(read_file_config(&path).is_ok());

        std::fs::write(&path, "[sandbox.run]\ntmp_size = \"lots\"\n").unwrap();
        let err = sandbox_limits(Some(path.clone())).unwrap_err();
        assert!(err.contains("[sandbox.run] tmp_size"), "{err}");
        std::fs::write(&path, "[sandbox.run]\nmax_procs = 3\n").unwrap();
        assert!(sandbox_limits(Some(path.clone())).is_err());

        // The CPU share: weight, niceness and policy per mode; out of range is refused.
        std::fs::write(
            &path,
            "[sandbox.run]\ncpu_weight = 0\nnice = 0\nscheduler = \"normal\"\n\
             [sandbox.speculation]\ncpu_weight = 50\nscheduler = \"batch\"\n",
        )
        .unwrap();
        let (run, spec) = sandbox_limits(Some(path.clone())).unwrap();
        assert_eq!(run.cpu_weight, None);
        assert_eq!(run.nice, Some(0));
        assert_eq!(run.scheduler, shade_fusefs::sandbox::Scheduler::Normal);
        assert_eq!(spec.cpu_weight, Some(50));
        assert_eq!(spec.nice, Limits::SPECULATION.nice);
        assert_eq!(spec.scheduler, shade_fusefs::sandbox::Scheduler::Batch);
        assert_eq!(spec.open_files, None);
        assert_eq!(run.open_files, None);
        assert_eq!(run.ptys, None);
        std::fs::write(
            &path,
            "[sandbox.run]\nptys = 16\n[sandbox.speculation]\nptys = 0\n",
        )
        .unwrap();
        let (run, spec) = sandbox_limits(Some(path.clone())).unwrap();
        assert_eq!((run.ptys, spec.ptys), (Some(16), None));
        for bad in ["nice = 20", "cpu_weight = 10001", "scheduler = \"fifo\""] {
            std::fs::write(&path, format!("[sandbox.run]\n{bad}\n")).unwrap();
            assert!(sandbox_limits(Some(path.clone())).is_err(), "{bad}");
        }
        // No file: the built-in limits.
        let none = sandbox_limits(Some(dir.path().join("absent.toml")));
        assert!(
            none.is_err(),
            "an explicit file that is missing is an error"
        );
    }

    #[test]
    fn outside_keep_list_parses_and_rejects_unknown_keys() {
        let f: FileConfig =
            toml::from_str("[outside]\nkeep = [\"~/.claude\", \"/etc/hosts\"]\n").expect("parse");
        assert_eq!(
            f.outside.expect("section").keep,
            vec!["~/.claude".to_string(), "/etc/hosts".to_string()]
        );
        assert!(toml::from_str::<FileConfig>("[outside]\nkept = []\n").is_err());
    }
}
