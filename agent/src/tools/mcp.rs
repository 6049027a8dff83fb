//! Tools of MCP servers (`[mcp_servers.NAME]` in the config file), offered to the model as
//! `mcp__NAME__TOOL`. Servers are started (stdio) or reached (streamable HTTP) once per
//! session; one that fails is left out with a warning and the session goes on. A call is
//! read-only — run without asking, allowed in plan mode and in speculations — only when its
//! server marks the tool `readOnlyHint`; every other call is approved like a command that
//! writes (see [`crate::approval::decide`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, ContentBlock, Implementation,
    ProtocolVersion, Tool as McpToolInfo,
};
use rmcp::service::{Peer, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::config::McpServerConfig;
use super::{Tool, ToolContext, ToolError, ToolKind, ToolOutput};
use crate::llm::{BoxFuture, ToolSpec};

/// Default wait for a server to start and list its tools.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Default limit of one tool call.
const TOOL_TIMEOUT: Duration = Duration::from_secs(600);
/// Longest tool name the chat APIs take.
const MAX_NAME: usize = 64;

type Client = RunningService<RoleClient, ClientConfig>;

/// The connected servers of a session; keep it as long as their tools are offered.
/// [`McpServers::close`] ends them (stdio servers see their input close).
#[derive(Default)]
pub struct McpServers {
    clients: Vec<(String, Client)>,
    /// Each server's tools, ready for the registry.
    pub tools: Vec<Arc<dyn Tool>>,
    /// One line per server left out, saying why.
    pub warnings: Vec<String>,
}

impl McpServers {
    /// Starts or reaches every enabled server of `servers` (concurrently); `project` is a
    /// stdio server's working directory unless it names one.
    pub async fn connect(
        servers: &BTreeMap<String, McpServerConfig>,
        project: &std::path::Path,
    ) -> McpServers {
        let starts = servers
            .iter()
            .filter(|(_, c)| c.enabled != Some(false))
            .map(
                |(name, c)| async move { (name.clone(), c.clone(), start(name, c, project).await) },
            );
        let mut out = McpServers::default();
        for (name, config, started) in futures::future::join_all(starts).await {
            match started {
                Ok((client, listed)) => {
                    let timeout = config
                        .tool_timeout_sec
                        .map(Duration::from_secs)
                        .unwrap_or(TOOL_TIMEOUT);
                    for info in listed {
                        out.tools.push(Arc::new(McpTool::new(
                            &name,
                            info,
                            client.peer().clone(),
                            timeout,
                        )));
                    }
                    out.clients.push((name, client));
                }
                Err(e) => out
                    .warnings
                    .push(format!("MCP server `{name}` left out: {e}")),
            }
        }
        out
    }

    /// Ends every server: stdio ones get end of input (then SIGTERM, then SIGKILL), HTTP
    /// sessions are deleted.
    pub async fn close(self) {
        for (name, client) in self.clients {
            if let Err(e) = client.cancel().await {
                tracing::warn!("closing MCP server {name}: {e}");
            }
        }
    }
}

/// Connects to one server and lists its tools, within its startup timeout.
async fn start(
    name: &str,
    config: &McpServerConfig,
    project: &std::path::Path,
) -> Result<(Client, Vec<McpToolInfo>), String> {
    let limit = config
        .startup_timeout_sec
        .map(Duration::from_secs)
        .unwrap_or(STARTUP_TIMEOUT);
    let connect = async {
        let client = match (&config.command, &config.url) {
            (Some(command), None) => {
                let mut cmd = tokio::process::Command::new(command);
                cmd.args(&config.args)
                    .envs(&config.env)
                    .current_dir(config.cwd.as_deref().unwrap_or(project));
                // A server speaks over its pipes: it gets no terminal (a session of its
                // own) and none of our fds.
                // SAFETY: the hook makes only async-signal-safe system calls.
                unsafe {
                    cmd.pre_exec(|| {
                        shade_fusefs::sandbox::detach_from_terminal()?;
                        shade_fusefs::sandbox::cloexec_inherited_fds();
                        Ok(())
                    });
                }
                let transport = TokioChildProcess::builder(cmd)
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .map_err(|e| format!("cannot start `{command}`: {e}"))?
                    .0;
                identity()
                    .serve(transport)
                    .await
                    .map_err(|e| e.to_string())?
            }
            (None, Some(url)) => identity()
                .serve(StreamableHttpClientTransport::from_config(http_config(
                    url, config,
                )?))
                .await
                .map_err(|e| e.to_string())?,
            _ => return Err("give either `command` (stdio) or `url` (HTTP)".to_string()),
        };
        let tools = client.list_all_tools().await.map_err(|e| e.to_string())?;
        Ok((client, tools))
    };
    tokio::time::timeout(limit, connect).await.map_err(|_| {
        format!(
            "`{name}` did not start within {}s (startup_timeout_sec)",
            limit.as_secs()
        )
    })?
}

/// How shade introduces itself to servers.
fn identity() -> ClientConfig {
    ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("shade", env!("CARGO_PKG_VERSION")),
    )
    .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
}

/// The HTTP transport's settings for `url`: the configured headers and bearer token.
fn http_config(
    url: &str,
    config: &McpServerConfig,
) -> Result<StreamableHttpClientTransportConfig, String> {
    if !url.starts_with("http://") {
        return Err(format!(
            "`{url}`: only http:// MCP servers are supported (no TLS in shade's MCP client yet)"
        ));
    }
    let mut headers = HashMap::new();
    for (k, v) in &config.headers {
        let name =
            http::HeaderName::try_from(k.as_str()).map_err(|e| format!("header {k}: {e}"))?;
        let value =
            http::HeaderValue::try_from(v.as_str()).map_err(|e| format!("header {k}: {e}"))?;
        headers.insert(name, value);
    }
    let mut transport_config =
        StreamableHttpClientTransportConfig::with_uri(url.to_string()).custom_headers(headers);
    if let Some(var) = &config.bearer_token_env_var {
        let token =
            std::env::var(var).map_err(|_| format!("bearer_token_env_var: ${var} is not set"))?;
        transport_config = transport_config.auth_header(token);
    }
    Ok(transport_config)
}

/// One tool of one server, as the model sees it.
pub struct McpTool {
    /// `mcp__SERVER__TOOL` (leaked once per tool: [`Tool::name`] is `'static`).
    name: &'static str,
    server: String,
    info: McpToolInfo,
    peer: Peer<RoleClient>,
    timeout: Duration,
}

impl McpTool {
    fn new(server: &str, info: McpToolInfo, peer: Peer<RoleClient>, timeout: Duration) -> McpTool {
        let name: &'static str = Box::leak(model_name(server, &info.name).into_boxed_str());
        McpTool {
            name,
            server: server.to_string(),
            info,
            peer,
            timeout,
        }
    }

    fn marked_read_only(&self) -> bool {
        self.info
            .annotations
            .as_ref()
            .and_then(|a| a.read_only_hint)
            .unwrap_or(false)
    }
}

/// `mcp__SERVER__TOOL` with characters the chat APIs refuse replaced, at most 64 long.
pub fn model_name(server: &str, tool: &str) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    };
    let mut name = format!("mcp__{}__{}", clean(server), clean(tool));
    name.truncate(MAX_NAME);
    name
}

impl Tool for McpTool {
    fn name(&self) -> &'static str {
        self.name
    }

    fn spec(&self) -> ToolSpec {
        let description = self.info.description.as_deref().unwrap_or("");
        ToolSpec {
            name: self.name.to_string(),
            description: format!("(MCP server `{}`) {description}", self.server),
            parameters: Value::Object((*self.info.input_schema).clone()),
        }
    }

    fn kind(&self) -> ToolKind {
        ToolKind::Mcp
    }

    fn is_read_only(&self, _args: &Value) -> bool {
        self.marked_read_only()
    }

    fn run<'a>(
        &'a self,
        args: Value,
        _ctx: &'a ToolContext,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let arguments = match args {
                Value::Object(map) => map,
                Value::Null => Default::default(),
                other => {
                    return Err(ToolError::InvalidArgs(format!(
                        "expected an object, got {other}"
                    )))
                }
            };
            let params =
                CallToolRequestParams::new(self.info.name.clone()).with_arguments(arguments);
            let call = tokio::time::timeout(self.timeout, self.peer.call_tool(params));
            let result = tokio::select! {
                r = call => r.map_err(|_| ToolError::Failed(format!(
                    "the MCP tool did not answer within {}s", self.timeout.as_secs()
                )))?,
                _ = cancel.cancelled() => return Err(ToolError::Cancelled),
            }
            .map_err(|e| ToolError::Failed(format!("MCP server `{}`: {e}", self.server)))?;
            let text = render(&result.content, result.structured_content.as_ref());
            if result.is_error == Some(true) {
                return Err(ToolError::Failed(text));
            }
            let lines = text.lines().count();
            Ok(ToolOutput {
                content: text,
                display: format!("{} ({})", self.name, super::text::plural(lines, "line")),
            })
        })
    }
}

/// A result's content as text for the model: text blocks as they are, others named.
fn render(content: &[ContentBlock], structured: Option<&Value>) -> String {
    let mut parts: Vec<String> = content
        .iter()
        .map(|c| match c {
            ContentBlock::Text(t) => t.text.clone(),
            other => match serde_json::to_value(other) {
                Ok(v) => format!(
                    "[{} content not shown]",
                    v.get("type").and_then(Value::as_str).unwrap_or("non-text")
                ),
                Err(_) => "[content not shown]".to_string(),
            },
        })
        .collect();
    if parts.is_empty() {
        if let Some(v) = structured {
            parts.push(v.to_string());
        }
    }
    parts.join("\n")
}

#[cfg(test)]
mod tests {
    #[test]
    fn model_names_are_what_chat_apis_take() {
        assert_eq!(
            super::model_name("shade", "create_branch"),
            "mcp__shade__create_branch"
        );
        assert_eq!(
            super::model_name("my server", "a.b/c"),
            "mcp__my_server__a_b_c"
        );
        assert_eq!(super::model_name("s", &"x".repeat(100)).len(), 64);
    }
}
