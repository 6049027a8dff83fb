//! `web_fetch`: fetch a URL and answer a prompt about it. The page (HTML converted to text,
//! size and time capped) goes to the fast model with the prompt, and the model gets the
//! answer with the URL cited rather than the raw page; with no model for background work it
//! gets the page text. Private, loopback and link-local addresses are refused unless the
//! config allows them: every host is resolved and every address checked, at each redirect,
//! and the connection is pinned to the addresses checked.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use futures::StreamExt;
use reqwest::Url;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::config::WebFetchConfig;
use super::{parse_args, Tool, ToolContext, ToolError, ToolKind, ToolOutput};
use crate::background::prompt_id;
use crate::llm::error::truncate_chars;
use crate::llm::{BoxFuture, Message, ToolSpec};

/// The tool, with its limits.
#[derive(Debug, Clone)]
pub struct WebFetch {
    /// Whole-request time limit.
    pub timeout: Duration,
    /// Bytes downloaded at most.
    pub max_bytes: usize,
    /// Characters of text kept at most (what the model answering the prompt reads).
    pub max_chars: usize,
    /// Redirects followed at most.
    pub max_redirects: usize,
    /// Which private addresses may be fetched.
    pub access: WebFetchConfig,
}

impl Default for WebFetch {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(30),
            max_bytes: 2 * 1024 * 1024,
            max_chars: 50_000,
            max_redirects: 5,
            access: WebFetchConfig::default(),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    url: String,
    prompt: String,
}

impl Tool for WebFetch {
    fn name(&self) -> &'static str {
        "web_fetch"
    }

    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name().into(),
            description: format!(
                "Fetch an http(s) URL and answer `prompt` from its content (HTML is converted \
                 to text; GitHub `blob` links fetch the raw file). Returns the answer with the \
                 URL cited. Limited to {}s, {} KiB and {} redirects; private and local network \
                 addresses are refused unless the user allowed them.",
                self.timeout.as_secs(),
                self.max_bytes / 1024,
                self.max_redirects
            ),
            parameters: json!({
                "type": "object",
                "properties": {
                    "url": {"type": "string", "description": "http:// or https:// URL."},
                    "prompt": {"type": "string", "description": "What to find out from the page (the question it is fetched for)."}
                },
                "required": ["url", "prompt"],
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
        ctx: &'a ToolContext,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let p: Params = parse_args(args)?;
            if p.prompt.trim().is_empty() {
                return Err(ToolError::InvalidArgs(
                    "prompt is empty; say what to find out from the page".into(),
                ));
            }
            let raw = github_raw(p.url.trim());
            let url = Url::parse(&raw)
                .map_err(|e| ToolError::InvalidArgs(format!("`{raw}` is not a URL: {e}")))?;
            check_scheme(&url)?;
            let page = tokio::select! {
                _ = cancel.cancelled() => return Err(ToolError::Cancelled),
                r = tokio::time::timeout(self.timeout, self.fetch(url)) => match r {
                    Ok(r) => r?,
                    Err(_) => return Err(ToolError::Failed(format!(
                        "fetching {raw} took longer than {}s", self.timeout.as_secs()))),
                },
            };
            self.answer(ctx, page, &p.prompt, cancel).await
        })
    }
}

/// A fetched page as text.
struct Page {
    /// Where it was finally fetched from (after redirects).
    url: Url,
    text: String,
    /// Characters of text before the cap.
    total_chars: usize,
    cut: bool,
}

fn check_scheme(url: &Url) -> Result<(), ToolError> {
    match url.scheme() {
        "http" | "https" => Ok(()),
        other => Err(ToolError::InvalidArgs(format!(
            "only http:// and https:// URLs can be fetched, not `{other}:` ({url})"
        ))),
    }
}

impl WebFetch {
    /// Fetch `url`, following at most `max_redirects` redirects, each target checked.
    async fn fetch(&self, mut url: Url) -> Result<Page, ToolError> {
        let mut hops = 0;
        let resp = loop {
            let client = self.client_for(&url).await?;
            let resp = client
                .get(url.clone())
                .send()
                .await
                .map_err(|e| ToolError::Failed(format!("cannot fetch {url}: {e}")))?;
            if !resp.status().is_redirection() {
                break resp;
            }
            let Some(location) = resp
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|v| v.to_str().ok())
            else {
                break resp;
            };
            if hops == self.max_redirects {
                return Err(ToolError::Failed(format!(
                    "{url} redirects more than {} times; not followed",
                    self.max_redirects
                )));
            }
            let next = url.join(location).map_err(|e| {
                ToolError::Failed(format!("{url} redirects to a bad URL `{location}`: {e}"))
            })?;
            check_scheme(&next)?;
            url = next;
            hops += 1;
        };
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
        if !status.is_success() {
            return Err(ToolError::Failed(truncate_chars(
                &format!("HTTP {} {url}\n\n{text}", status.as_u16()),
                2000,
            )));
        }
        Ok(Page {
            url,
            text: truncate_chars(&text, self.max_chars),
            cut: cut || total_chars > self.max_chars,
            total_chars,
        })
    }

    /// A client that reaches `url`'s host only at the addresses that passed the check.
    async fn client_for(&self, url: &Url) -> Result<reqwest::Client, ToolError> {
        let builder = reqwest::Client::builder()
            .user_agent(concat!("shade/", env!("CARGO_PKG_VERSION")))
            .redirect(reqwest::redirect::Policy::none());
        let builder = match self.vet(url).await? {
            Some((domain, addrs)) => builder.resolve_to_addrs(&domain, &addrs),
            None => builder,
        };
        builder
            .build()
            .map_err(|e| ToolError::Failed(format!("cannot build HTTP client: {e}")))
    }

    /// Refuse a host that is, or resolves to, a non-public address (unless allowed). For a
    /// domain, returns the addresses checked, to pin the connection to them.
    async fn vet(&self, url: &Url) -> Result<Option<(String, Vec<SocketAddr>)>, ToolError> {
        let port = url.port_or_known_default().unwrap_or(80);
        let Some(host) = url.host_str().map(str::to_ascii_lowercase) else {
            return Err(ToolError::InvalidArgs(format!("{url} has no host")));
        };
        let literal = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
            .ok();
        let allowed = self.access.allow_private
            || self
                .access
                .allow_hosts
                .iter()
                .any(|h| h.eq_ignore_ascii_case(&host) || *h == format!("{host}:{port}"));
        let refuse = |ip: IpAddr| {
            ToolError::Failed(format!(
                "refused to fetch {url}: {host} is {ip}, a private, loopback or otherwise \
                 non-public address. The user can allow it in the config file: `[web_fetch]` \
                 `allow_private = true`, or `allow_hosts = [\"{host}:{port}\"]`."
            ))
        };
        if let Some(ip) = literal {
            if !allowed && !is_public(ip) {
                return Err(refuse(ip));
            }
            return Ok(None);
        }
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), port))
            .await
            .map_err(|e| ToolError::Failed(format!("cannot resolve {host}: {e}")))?
            .collect();
        if addrs.is_empty() {
            return Err(ToolError::Failed(format!("{host} has no address")));
        }
        if !allowed {
            if let Some(bad) = addrs.iter().find(|a| !is_public(a.ip())) {
                return Err(refuse(bad.ip()));
            }
        }
        Ok(Some((host, addrs)))
    }

    /// The answer to `prompt` from the page, by the fast model; the page text without one.
    async fn answer(
        &self,
        ctx: &ToolContext,
        page: Page,
        prompt: &str,
        cancel: &CancellationToken,
    ) -> Result<ToolOutput, ToolError> {
        let url = page.url.as_str();
        let cut_note = if page.cut {
            format!(
                "\n[Page cut at {} KiB / {} characters of text.]",
                self.max_bytes / 1024,
                self.max_chars
            )
        } else {
            String::new()
        };
        let shown = page.total_chars.min(self.max_chars);
        if let Some(bg) = &ctx.background {
            let system = "You answer a question about one web page for a coding agent, using \
                only the page's text given below. Be precise and brief; quote code, commands, \
                versions and numbers exactly. If the page does not answer the question, say so \
                and say what it does contain. End with the line `Source: <the page's URL>`.";
            let user = format!(
                "Page URL: {url}\nQuestion: {prompt}\n\nPage text:\n<<<\n{}{cut_note}\n>>>",
                page.text
            );
            let messages = vec![
                Message::System {
                    content: system.into(),
                },
                Message::User { content: user },
            ];
            match bg.ask(prompt_id::WEB_FETCH, messages, cancel).await {
                Ok(c) if !c.text.trim().is_empty() => {
                    let mut content = c.text.trim().to_string();
                    if !content.contains(url) {
                        content.push_str(&format!("\n\nSource: {url}"));
                    }
                    return Ok(ToolOutput {
                        content,
                        display: format!("Fetched {url} ({shown} characters), answered"),
                    });
                }
                Ok(_) => tracing::debug!("web_fetch: empty answer from the model"),
                Err(crate::llm::LlmError::Cancelled) => return Err(ToolError::Cancelled),
                Err(e) => tracing::debug!("web_fetch: answer failed: {e}"),
            }
        }
        Ok(ToolOutput {
            content: format!(
                "[No model answered the prompt; the page's text follows.]\nSource: {url}\n\n{}{cut_note}",
                page.text
            ),
            display: format!("Fetched {url} ({shown} characters)"),
        })
    }
}

/// Is `ip` a public unicast address (not loopback, private, link-local, shared, reserved,
/// documentation, multicast or unspecified; IPv4 inside IPv6 judged as IPv4)?
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            !(v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || a == 0
                || (a == 100 && (64..128).contains(&b)) // shared (CGNAT)
                || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
                || (a == 198 && (18..20).contains(&b)) // benchmarking
                || a >= 240)
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public(IpAddr::V4(v4));
            }
            let s = v6.segments();
            // NAT64 (64:ff9b::/96) carries an IPv4 address in its last 32 bits.
            if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] {
                let [.., x, y] = s;
                let v4 = std::net::Ipv4Addr::new(
                    (x >> 8) as u8,
                    (x & 0xff) as u8,
                    (y >> 8) as u8,
                    (y & 0xff) as u8,
                );
                return is_public(IpAddr::V4(v4));
            }
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00 // unique local
                || (s[0] & 0xffc0) == 0xfe80 // link-local
                || (s[0] & 0xffc0) == 0xfec0 // site-local (deprecated)
                || (s[0] == 0x2001 && s[1] == 0xdb8) // documentation
                || s[..6] == [0, 0, 0, 0, 0, 0]) // IPv4-compatible (deprecated)
        }
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
    use super::*;

    #[test]
    fn github_blob_becomes_raw() {
        assert_eq!(
            github_raw("https://github.com/a/b/blob/main/src/x.rs"),
            "https://raw.githubusercontent.com/a/b/main/src/x.rs"
        );
        assert_eq!(github_raw("http://x/y"), "http://x/y");
    }

    #[test]
    fn only_public_addresses_pass() {
        let public = ["93.184.216.34", "2606:4700::1111", "::ffff:8.8.8.8"];
        let private = [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "::",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "64:ff9b::a00:1",
            "::127.0.0.1",
            "240.0.0.1",
        ];
        for ip in public {
            assert!(is_public(ip.parse().expect("ip")), "{ip}");
        }
        for ip in private {
            assert!(!is_public(ip.parse().expect("ip")), "{ip}");
        }
    }
}
