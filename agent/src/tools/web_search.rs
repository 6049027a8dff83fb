//! `web_search`: search the web through the provider configured in `[web_search]` — a JSON
//! search API with a key, or an OpenAI-compatible model with a search tool — and return the
//! results as title / URL / snippet. Without a provider the tool is not registered at all,
//! so the model is never offered a tool that can only fail.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::config::{Method, SearchKind, WebSearchConfig};
use super::{parse_args, Tool, ToolContext, ToolError, ToolKind, ToolOutput};
use crate::llm::error::truncate_chars;
use crate::llm::{BoxFuture, ToolSpec, Usage};

/// The tool, bound to its provider.
#[derive(Debug, Clone)]
pub struct WebSearch {
    /// The provider.
    pub config: WebSearchConfig,
    /// Whole-request time limit.
    pub timeout: Duration,
}

impl WebSearch {
    /// A search tool for `config`.
    pub fn new(config: WebSearchConfig) -> Self {
        Self {
            config,
            timeout: Duration::from_secs(60),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    query: String,
}

/// One search result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    /// Page title.
    pub title: String,
    /// Page address.
    pub url: String,
    /// A few words from the page.
    pub snippet: String,
}

/// Characters of a snippet kept.
const SNIPPET_CHARS: usize = 400;

impl Tool for WebSearch {
    fn name(&self) -> &'static str {
        "web_search"
    }

    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name().into(),
            description: format!(
                "Search the web. Returns up to {} results as title, URL and snippet (and the \
                 search service's short answer when it gives one). Use web_fetch on a result's \
                 URL to read the page.",
                self.config.max_results
            ),
            parameters: json!({
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "The search query."}
                },
                "required": ["query"],
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
            let query = p.query.trim();
            if query.is_empty() {
                return Err(ToolError::InvalidArgs("query is empty".into()));
            }
            let work = async {
                match self.config.provider {
                    SearchKind::Json => self.json_api(query).await,
                    SearchKind::Openai => self.openai(query, ctx).await,
                }
            };
            let (answer, mut hits) = tokio::select! {
                _ = cancel.cancelled() => return Err(ToolError::Cancelled),
                r = tokio::time::timeout(self.timeout, work) => match r {
                    Ok(r) => r?,
                    Err(_) => return Err(ToolError::Failed(format!(
                        "the search took longer than {}s", self.timeout.as_secs()))),
                },
            };
            hits.truncate(self.config.max_results);
            Ok(render(query, answer.as_deref(), &hits))
        })
    }
}

fn render(query: &str, answer: Option<&str>, hits: &[Hit]) -> ToolOutput {
    let mut content = format!("Search results for \"{query}\":\n");
    if let Some(a) = answer.filter(|a| !a.trim().is_empty()) {
        content.push_str(&format!(
            "\nAnswer from the search service: {}\n",
            truncate_chars(a.trim(), 2000)
        ));
    }
    if hits.is_empty() {
        content.push_str("\nNo results.\n");
    }
    for (i, h) in hits.iter().enumerate() {
        content.push_str(&format!("\n{}. {}\n   {}\n", i + 1, h.title, h.url));
        if !h.snippet.is_empty() {
            content.push_str(&format!("   {}\n", h.snippet));
        }
    }
    ToolOutput {
        content,
        display: format!(
            "Searched \"{}\" ({})",
            truncate_chars(query, 60),
            super::text::plural(hits.len(), "result")
        ),
    }
}

fn client() -> Result<reqwest::Client, ToolError> {
    reqwest::Client::builder()
        .user_agent(concat!("shade/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| ToolError::Failed(format!("cannot build HTTP client: {e}")))
}

fn json_body(req: reqwest::RequestBuilder, body: &Value) -> reqwest::RequestBuilder {
    req.header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body.to_string())
}

fn text_of(v: &Value, keys: &[&str]) -> String {
    keys.iter()
        .find_map(|k| v.get(*k).and_then(Value::as_str))
        .map(|s| {
            truncate_chars(
                &s.split_whitespace().collect::<Vec<_>>().join(" "),
                SNIPPET_CHARS,
            )
        })
        .unwrap_or_default()
}

/// Results from an array of objects with title / url / snippet-ish fields.
fn hits_from(items: &Value) -> Vec<Hit> {
    let mut hits: Vec<Hit> = Vec::new();
    for item in items.as_array().into_iter().flatten() {
        let url = text_of(item, &["url", "link", "href"]);
        if url.is_empty() || hits.iter().any(|h| h.url == url) {
            continue;
        }
        hits.push(Hit {
            title: text_of(item, &["title", "name", "site_name"]),
            url,
            snippet: text_of(item, &["content", "snippet", "description", "text"]),
        });
    }
    hits
}

async fn checked_json(resp: reqwest::Response, what: &str) -> Result<Value, ToolError> {
    let status = resp.status();
    let body = resp
        .text()
        .await
        .map_err(|e| ToolError::Failed(format!("reading the {what} response failed: {e}")))?;
    if !status.is_success() {
        return Err(ToolError::Failed(format!(
            "the {what} answered HTTP {}: {}",
            status.as_u16(),
            truncate_chars(body.trim(), 300)
        )));
    }
    serde_json::from_str(&body).map_err(|e| {
        ToolError::Failed(format!(
            "the {what} answered something that is not JSON ({e}): {}",
            truncate_chars(body.trim(), 200)
        ))
    })
}

impl WebSearch {
    fn with_key(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match self.config.key() {
            Some(key) if self.config.key_header.eq_ignore_ascii_case("authorization") => {
                req.bearer_auth(key)
            }
            Some(key) => req.header(self.config.key_header.as_str(), key),
            None => req,
        }
    }

    /// A JSON search API: query in the body (POST) or the query string (GET); results at
    /// `results_path`; an `answer` field, if any, is passed on.
    async fn json_api(&self, query: &str) -> Result<(Option<String>, Vec<Hit>), ToolError> {
        let c = &self.config;
        let client = client()?;
        let req = match c.method {
            Method::Post => {
                let mut body = serde_json::Map::new();
                body.insert(c.query_field.clone(), json!(query));
                body.insert("max_results".into(), json!(c.max_results));
                json_body(client.post(&c.url), &Value::Object(body))
            }
            Method::Get => client.get(&c.url).query(&[(c.query_field.as_str(), query)]),
        };
        let resp = self
            .with_key(req)
            .send()
            .await
            .map_err(|e| ToolError::Failed(format!("cannot reach the search API: {e}")))?;
        let v = checked_json(resp, "search API").await?;
        let items = c
            .results_path
            .split('.')
            .filter(|k| !k.is_empty())
            .try_fold(&v, |v, k| v.get(k))
            .ok_or_else(|| {
                ToolError::Failed(format!(
                    "the search API's response has no `{}`: {}",
                    c.results_path,
                    truncate_chars(&v.to_string(), 200)
                ))
            })?;
        let answer = v.get("answer").and_then(Value::as_str).map(str::to_string);
        Ok((answer, hits_from(items)))
    }

    /// An OpenAI-compatible model with a search tool: its answer, and its sources from
    /// `search_results` (Perplexity-style), `search_info.search_results` (DashScope),
    /// `citations`, or the message's `url_citation` annotations (OpenAI). Its `usage` is
    /// counted as background work of the search model in the session's token account.
    async fn openai(
        &self,
        query: &str,
        ctx: &ToolContext,
    ) -> Result<(Option<String>, Vec<Hit>), ToolError> {
        let c = &self.config;
        let model = c.model.as_deref().ok_or_else(|| {
            ToolError::Failed("[web_search] with provider = \"openai\" needs a `model`".into())
        })?;
        let mut body = json!({
            "model": model,
            "stream": false,
            "messages": [
                {"role": "system", "content": "Search the web for the user's query. Answer in a few sentences and cite the pages you used."},
                {"role": "user", "content": query}
            ]
        });
        if let (Some(extra), Some(obj)) = (&c.extra_body, body.as_object_mut()) {
            for (k, v) in extra {
                obj.insert(k.clone(), serde_json::to_value(v).unwrap_or(Value::Null));
            }
        }
        let url = format!("{}/chat/completions", c.url.trim_end_matches('/'));
        let resp = self
            .with_key(json_body(client()?.post(&url), &body))
            .send()
            .await
            .map_err(|e| ToolError::Failed(format!("cannot reach the search model: {e}")))?;
        let v = checked_json(resp, "search model").await?;
        if let Some(stats) = &ctx.token_stats {
            stats.record(model, true, &usage_of(&v));
        }
        let message = &v["choices"][0]["message"];
        let answer = message["content"].as_str().map(str::to_string);
        let mut hits = hits_from(&v["search_results"]);
        for h in hits_from(&v["search_info"]["search_results"]) {
            if !hits.iter().any(|x| x.url == h.url) {
                hits.push(h);
            }
        }
        let text = answer.clone().unwrap_or_default();
        for a in message["annotations"].as_array().into_iter().flatten() {
            let cite = &a["url_citation"];
            let Some(url) = cite["url"].as_str() else {
                continue;
            };
            if hits.iter().any(|h| h.url == url) {
                continue;
            }
            let span = |k: &str| cite[k].as_u64().map(|n| n as usize);
            let snippet = match (span("start_index"), span("end_index")) {
                (Some(s), Some(e)) if s < e => text.chars().skip(s).take(e - s).collect(),
                _ => String::new(),
            };
            hits.push(Hit {
                title: text_of(cite, &["title"]),
                url: url.to_string(),
                snippet: truncate_chars(&snippet, SNIPPET_CHARS),
            });
        }
        for url in v["citations"].as_array().into_iter().flatten() {
            if let Some(url) = url.as_str().filter(|u| !hits.iter().any(|h| h.url == *u)) {
                hits.push(Hit {
                    title: String::new(),
                    url: url.to_string(),
                    snippet: String::new(),
                });
            }
        }
        Ok((answer, hits))
    }
}

/// The token counts of a (non-streamed) chat completion; zero where it reports none (the
/// call is still counted, as the metered provider counts one without usage).
fn usage_of(v: &Value) -> Usage {
    let n = |p: &str| v.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    Usage {
        prompt_tokens: n("/usage/prompt_tokens"),
        completion_tokens: n("/usage/completion_tokens"),
        cached_tokens: n("/usage/prompt_tokens_details/cached_tokens"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hits_skip_entries_without_url_and_duplicates() {
        let items = json!([
            {"title": "A", "url": "https://a", "content": "alpha\n  text"},
            {"title": "no url"},
            {"name": "A again", "link": "https://a"},
            {"title": "B", "link": "https://b", "description": "beta"}
        ]);
        assert_eq!(
            hits_from(&items),
            vec![
                Hit {
                    title: "A".into(),
                    url: "https://a".into(),
                    snippet: "alpha text".into()
                },
                Hit {
                    title: "B".into(),
                    url: "https://b".into(),
                    snippet: "beta".into()
                }
            ]
        );
    }
}
