//! `web_fetch`: fetch a URL and return readable text (HTML converted to text), with a time
//! limit and a size limit.

use std::time::Duration;

use futures::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::{parse_args, Tool, ToolContext, ToolError, ToolKind, ToolOutput};
use crate::llm::error::truncate_chars;
use crate::llm::{BoxFuture, ToolSpec};

/// The tool, with its limits.
#[derive(Debug, Clone)]
pub struct WebFetch {
    /// Whole-request time limit.
    pub timeout: Duration,
    /// Bytes downloaded at most.
    pub max_bytes: usize,
    /// Characters of text returned at most.
    pub max_chars: usize,
}

impl Default for WebFetch {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(30),
            max_bytes: 2 * 1024 * 1024,
            max_chars: 50_000,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    url: String,
}

impl Tool for WebFetch {
    fn name(&self) -> &'static str {
        "web_fetch"
    }

    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name().into(),
            description: format!(
                "Fetch an http(s) URL and return its content as text (HTML is converted to plain \
                 text; GitHub `blob` links fetch the raw file). Limited to {}s and {} KiB.",
                self.timeout.as_secs(),
                self.max_bytes / 1024
            ),
            parameters: json!({
                "type": "object",
                "properties": {
                    "url": {"type": "string", "description": "http:// or https:// URL."}
                },
                "required": ["url"],
                "additionalProperties": false
            }),
        }
    }

    fn kind(&self) -> ToolKind {
        ToolKind::Fetch
    }

    fn is_read_only(&self, _args: &Value) -> bool {
        true
    }

    fn run<'a>(
        &'a self,
        args: Value,
        _ctx: &'a ToolContext,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let p: Params = parse_args(args)?;
            let url = github_raw(p.url.trim());
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(ToolError::InvalidArgs(format!(
                    "only http:// and https:// URLs can be fetched, not `{url}`"
                )));
            }
            tokio::select! {
                _ = cancel.cancelled() => Err(ToolError::Cancelled),
                r = tokio::time::timeout(self.timeout, self.fetch(&url)) => match r {
                    Ok(r) => r,
                    Err(_) => Err(ToolError::Failed(format!(
                        "fetching {url} took longer than {}s", self.timeout.as_secs()))),
                },
            }
        })
    }
}

impl WebFetch {
    async fn fetch(&self, url: &str) -> Result<ToolOutput, ToolError> {
        let client = reqwest::Client::builder()
            .user_agent(concat!("shade/", env!("CARGO_PKG_VERSION")))
            .redirect(reqwest::redirect::Policy::limited(5))
            .build()
            .map_err(|e| ToolError::Failed(format!("cannot build HTTP client: {e}")))?;
        let resp = client
            .get(url)
            .send()
            .await
            .map_err(|e| ToolError::Failed(format!("cannot fetch {url}: {e}")))?;
        let status = resp.status();
        let ctype = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        let mut body = Vec::new();
        let mut cut = false;
        let mut stream = resp.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk =
                chunk.map_err(|e| ToolError::Failed(format!("reading {url} failed: {e}")))?;
            body.extend_from_slice(&chunk);
            if body.len() >= self.max_bytes {
                body.truncate(self.max_bytes);
                cut = true;
                break;
            }
        }
        let looks_html = ctype.contains("html")
            || (ctype.is_empty() && body.trim_ascii_start().starts_with(b"<"));
        let text = if looks_html {
            html2text::from_read(&body[..], 100)
                .map_err(|e| ToolError::Failed(format!("cannot convert HTML from {url}: {e}")))?
        } else if super::text::looks_binary(&body) {
            return Err(ToolError::Failed(format!(
                "{url} returned binary content ({ctype}); not shown"
            )));
        } else {
            String::from_utf8_lossy(&body).into_owned()
        };
        let total_chars = text.chars().count();
        let mut content = format!("HTTP {} {url}\n\n", status.as_u16());
        content.push_str(&truncate_chars(&text, self.max_chars));
        if cut || total_chars > self.max_chars {
            content.push_str(&format!(
                "\n[Content truncated at {} KiB / {} characters.]",
                self.max_bytes / 1024,
                self.max_chars
            ));
        }
        if !status.is_success() {
            return Err(ToolError::Failed(truncate_chars(&content, 2000)));
        }
        Ok(ToolOutput {
            content,
            display: format!(
                "Fetched {url} ({} characters)",
                total_chars.min(self.max_chars)
            ),
        })
    }
}

/// `https://github.com/o/r/blob/ref/path` → the raw file URL.
fn github_raw(url: &str) -> String {
    if let Some(rest) = url.strip_prefix("https://github.com/") {
        if let Some((repo, path)) = rest.split_once("/blob/") {
            return format!("https://raw.githubusercontent.com/{repo}/{path}");
        }
    }
    url.to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn github_blob_becomes_raw() {
        assert_eq!(
            super::github_raw("https://github.com/a/b/blob/main/src/x.rs"),
            "https://raw.githubusercontent.com/a/b/main/src/x.rs"
        );
        assert_eq!(super::github_raw("http://x/y"), "http://x/y");
    }
}
