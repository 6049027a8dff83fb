//! Tool settings read from the config file (`[output_budget]`, `[web_fetch]`, `[web_search]`,
//! `[mcp_servers.NAME]`), kept apart from the model client's so that the registry can be built from them: a tool
//! whose provider is not configured is not offered to the model at all.

use std::collections::BTreeMap;

use serde::Deserialize;

/// All tool settings.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolsConfig {
    /// `[output_budget]`: tokens of output per tool before it is summarised.
    #[serde(default)]
    pub output_budget: OutputBudget,
    /// `[web_fetch]`.
    #[serde(default)]
    pub web_fetch: WebFetchConfig,
    /// `[web_search]`; `None`: no `web_search` tool.
    #[serde(default)]
    pub web_search: Option<WebSearchConfig>,
    /// `[mcp_servers.NAME]`: MCP servers whose tools are offered to the model.
    #[serde(default)]
    pub mcp_servers: BTreeMap<String, McpServerConfig>,
}

/// One MCP server, configured as Codex and Claude Code do: a program to start (stdio:
/// `command`, `args`, `env`, `cwd`) or a streamable HTTP endpoint (`url`, `headers`,
/// `bearer_token_env_var`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// `"stdio"` or `"http"` (Claude Code's field); implied by `command` or `url`.
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    /// The program to start (stdio).
    #[serde(default)]
    pub command: Option<String>,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment variables set for it.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Its working directory (default: the project).
    #[serde(default)]
    pub cwd: Option<std::path::PathBuf>,
    /// The endpoint of a streamable HTTP server (`http://`).
    #[serde(default)]
    pub url: Option<String>,
    /// Headers sent to it.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// An environment variable holding a bearer token for it (Codex's field).
    #[serde(default)]
    pub bearer_token_env_var: Option<String>,
    /// Seconds to wait for the server to start and list its tools (default 30).
    #[serde(default)]
    pub startup_timeout_sec: Option<u64>,
    /// Seconds one tool call may take (default 600).
    #[serde(default)]
    pub tool_timeout_sec: Option<u64>,
    /// `false` keeps it configured but not started.
    #[serde(default)]
    pub enabled: Option<bool>,
}

/// Tokens of output a tool may return before it is summarised by the fast model; 0 never
/// summarises. Only tools listed here honour a budget (unknown keys are refused).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputBudget {
    /// `shell`: the command's stdout and stderr together.
    #[serde(default = "default_shell_budget")]
    pub shell: usize,
}

fn default_shell_budget() -> usize {
    8_000
}

impl Default for OutputBudget {
    fn default() -> Self {
        Self {
            shell: default_shell_budget(),
        }
    }
}

/// `web_fetch` settings.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebFetchConfig {
    /// Fetch from private, loopback and link-local addresses too (an intranet wiki, a local
    /// dev server). Off: the model cannot make shade probe the user's network.
    #[serde(default)]
    pub allow_private: bool,
    /// `host` or `host:port` entries allowed even when they resolve to private addresses.
    #[serde(default)]
    pub allow_hosts: Vec<String>,
}

/// Which kind of search service `[web_search]` talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SearchKind {
    /// A JSON search API (Tavily-style by default: POST `{"query", "max_results"}`, results in
    /// `results[]` with `title`, `url`, `content`).
    Json,
    /// An OpenAI-compatible chat model with a built-in search tool (switched on through
    /// `extra_body`, e.g. DashScope `enable_search`, OpenAI `web_search_options`); sources
    /// are read from the response's `search_results`, `search_info` or `annotations`.
    Openai,
}

/// HTTP method of a JSON search API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// Query in the URL's query string.
    Get,
    /// Query in a JSON body.
    #[default]
    Post,
}

/// `[web_search]`: the search provider.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebSearchConfig {
    /// `json` or `openai`.
    pub provider: SearchKind,
    /// `json`: the search endpoint; `openai`: the base URL up to `/v1`.
    pub url: String,
    /// The key, if the service needs one.
    #[serde(default)]
    pub api_key: Option<String>,
    /// Read the key from this environment variable instead (keeps it out of the file).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// `openai`: the model that searches.
    #[serde(default)]
    pub model: Option<String>,
    /// Results returned at most.
    #[serde(default = "default_max_results")]
    pub max_results: usize,
    /// `json`: GET (query string) or POST (JSON body, the default).
    #[serde(default)]
    pub method: Method,
    /// `json`: name of the query parameter or body field.
    #[serde(default = "default_query_field")]
    pub query_field: String,
    /// `json`: dotted path of the results array in the response (`web.results` for Brave).
    #[serde(default = "default_results_path")]
    pub results_path: String,
    /// Header carrying the key; `Authorization` gets `Bearer KEY`, any other the bare key.
    #[serde(default = "default_key_header")]
    pub key_header: String,
    /// `openai`: fields merged into the request body to switch the model's search on.
    #[serde(default)]
    pub extra_body: Option<toml::Table>,
}

fn default_max_results() -> usize {
    5
}

fn default_query_field() -> String {
    "query".into()
}

fn default_results_path() -> String {
    "results".into()
}

fn default_key_header() -> String {
    "Authorization".into()
}

impl WebSearchConfig {
    /// The key: `api_key`, else the variable named by `api_key_env`.
    pub fn key(&self) -> Option<String> {
        self.api_key.clone().or_else(|| {
            self.api_key_env
                .as_deref()
                .and_then(|v| std::env::var(v).ok())
                .filter(|k| !k.is_empty())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_parse_with_defaults_and_refuse_unknown_keys() {
        let c: ToolsConfig = toml::from_str(
            "[output_budget]\nshell = 100\n[web_fetch]\nallow_hosts = [\"wiki.lan\"]\n\
             [web_search]\nprovider = \"json\"\nurl = \"http://s/search\"\napi_key_env = \"K\"",
        )
        .expect("toml");
        assert_eq!(c.output_budget.shell, 100);
        assert!(!c.web_fetch.allow_private);
        let s = c.web_search.expect("search");
        assert_eq!(
            (s.provider, s.method, s.results_path.as_str()),
            (SearchKind::Json, Method::Post, "results")
        );
        assert_eq!(ToolsConfig::default().output_budget.shell, 8_000);
        assert!(toml::from_str::<ToolsConfig>("[output_budget]\ngrep = 1").is_err());
        assert!(
            toml::from_str::<ToolsConfig>("[web_search]\nprovider = \"bing\"\nurl = \"x\"")
                .is_err()
        );
    }
}
