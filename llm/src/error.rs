//! Errors of a model call, classified so the retry layer can decide what to do.

use std::time::Duration;

/// Why a model call failed.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum LlmError {
    /// The server answered with a non-success HTTP status.
    #[error("HTTP {status} from the model server: {message}")]
    Http {
        /// Status code.
        status: u16,
        /// Error text extracted from the body (JSON `error.message`, or HTML stripped to text).
        message: String,
        /// Wait the server asked for (`Retry-After` / `retry-after-ms`).
        retry_after: Option<Duration>,
    },
    /// Could not connect, or the connection broke before a response started.
    #[error("cannot reach the model server: {0}")]
    Connect(String),
    /// No data within the idle timeout.
    #[error("the model server stopped sending data for {0:?}")]
    Timeout(Duration),
    /// The stream ended before the model finished (no `finish_reason` and no `[DONE]`).
    #[error("the response stream was cut off before the model finished: {0}")]
    Truncated(String),
    /// The server sent something that is not a valid Chat Completions response.
    #[error("malformed response from the model server: {0}")]
    Malformed(String),
    /// The server reported an error inside an otherwise successful stream.
    #[error("the model server reported an error: {0}")]
    Provider(String),
    /// The caller cancelled.
    #[error("cancelled")]
    Cancelled,
    /// Missing or invalid configuration (no model, bad URL, unreadable config file).
    #[error("configuration: {0}")]
    Config(String),
    /// Record/replay problem: cassette missing, exhausted or not matching the request.
    #[error("cassette: {0}")]
    Cassette(String),
}

impl LlmError {
    /// Worth another attempt with the same request: rate limits, server errors, broken
    /// connections. Never auth/validation (4xx other than 408/409/429).
    pub fn is_retryable(&self) -> bool {
        if self.local_server_hint().is_some() {
            // A server set up without tool calls answers the same every time.
            return false;
        }
        match self {
            Self::Http { status, .. } => {
                matches!(status, 408 | 409 | 429) || (500..=599).contains(status)
            }
            Self::Connect(_) | Self::Timeout(_) | Self::Truncated(_) => true,
            Self::Provider(msg) => looks_overloaded(msg),
            _ => false,
        }
    }

    /// What to change when a local server refuses the request's tools (llama.cpp without
    /// `--jinja`, vLLM without a tool-call parser, an Ollama model without tool support):
    /// their own messages name a flag, not the fix.
    pub fn local_server_hint(&self) -> Option<&'static str> {
        let msg = match self {
            Self::Http { message, .. } | Self::Provider(message) => message.to_ascii_lowercase(),
            _ => return None,
        };
        if msg.contains("--jinja") {
            Some("llama.cpp's server takes tool calls only when started with --jinja (llama-server --jinja …)")
        } else if msg.contains("enable-auto-tool-choice") || msg.contains("tool-call-parser") {
            Some("vLLM takes tool calls only when started with --enable-auto-tool-choice --tool-call-parser NAME (the parser of the model's family, e.g. hermes for Qwen)")
        } else if msg.contains("does not support tools") {
            Some("this model's Ollama template has no tool calls: use a model listed with the \"tools\" capability (ollama show MODEL)")
        } else {
            None
        }
    }

    /// The provider is rate limiting us (switch to the backup model if one is configured).
    pub fn is_rate_limited(&self) -> bool {
        match self {
            Self::Http { status, .. } => *status == 429,
            Self::Provider(msg) => msg.to_ascii_lowercase().contains("rate limit"),
            _ => false,
        }
    }

    /// The request is larger than the model's context window (switch to the larger-context
    /// model if one is configured).
    pub fn is_context_too_long(&self) -> bool {
        let msg = match self {
            Self::Http {
                status, message, ..
            } if *status == 400 || *status == 413 => message,
            Self::Provider(message) => message,
            _ => return false,
        };
        let m = msg.to_ascii_lowercase();
        [
            "context_length_exceeded",
            "context length",
            "maximum context",
            "context window",
            "too many tokens",
            "prompt is too long",
            "input is too long",
            "range of input length",
        ]
        .iter()
        .any(|needle| m.contains(needle))
    }
}

fn looks_overloaded(msg: &str) -> bool {
    let m = msg.to_ascii_lowercase();
    m.contains("overloaded") || m.contains("rate limit") || m.contains("try again")
}

/// Turn an error body into one readable line: the JSON `error.message` when there is one,
/// otherwise the text of an HTML page (title first), otherwise the raw text — all truncated.
pub fn describe_error_body(body: &str) -> String {
    const MAX: usize = 300;
    let trimmed = body.trim();
    if trimmed.is_empty() {
        return "(empty body)".to_string();
    }
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(trimmed) {
        let msg = v
            .pointer("/error/message")
            .or_else(|| v.get("message"))
            .or_else(|| v.get("error"))
            .or_else(|| v.get("detail"));
        if let Some(m) = msg {
            let text = m
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| m.to_string());
            return truncate_chars(&text, MAX);
        }
    }
    let lower = trimmed.to_ascii_lowercase();
    if lower.starts_with("<!doctype") || lower.starts_with("<html") || lower.contains("<body") {
        let text = strip_tags(trimmed);
        return format!("(HTML page) {}", truncate_chars(&text, MAX));
    }
    truncate_chars(&collapse_ws(trimmed), MAX)
}

fn strip_tags(html: &str) -> String {
    let mut out = String::with_capacity(html.len());
    let mut in_tag = false;
    // Byte-wise matching: `i` may sit inside a multi-byte character within a tag.
    let lower = html.to_ascii_lowercase().into_bytes();
    let mut skip_until: Option<&[u8]> = None;
    let mut i = 0;
    let bytes = html.as_bytes();
    while i < bytes.len() {
        if let Some(end) = skip_until {
            if lower[i..].starts_with(end) {
                i += end.len();
                skip_until = None;
            } else {
                i += 1;
            }
            continue;
        }
        if lower[i..].starts_with(b"<script") {
            skip_until = Some(b"</script>");
            continue;
        }
        if lower[i..].starts_with(b"<style") {
            skip_until = Some(b"</style>");
            continue;
        }
        let c = bytes[i];
        if c == b'<' {
            in_tag = true;
            out.push(' ');
        } else if c == b'>' {
            in_tag = false;
        } else if !in_tag {
            // Copy whole UTF-8 sequences.
            let ch_len = utf8_len(c);
            if let Some(s) = html.get(i..i + ch_len) {
                out.push_str(s);
            }
            i += ch_len;
            continue;
        }
        i += 1;
    }
    collapse_ws(&out)
}

fn utf8_len(first: u8) -> usize {
    match first {
        0x00..=0x7f => 1,
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        _ => 4,
    }
}

fn collapse_ws(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Cut `s` to at most `max` characters, marking the cut.
pub fn truncate_chars(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((idx, _)) => format!("{}…", &s[..idx]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_statuses() {
        let e = |status| LlmError::Http {
            status,
            message: String::new(),
            retry_after: None,
        };
        assert!(e(429).is_retryable());
        assert!(e(503).is_retryable());
        assert!(!e(401).is_retryable());
        assert!(!e(400).is_retryable());
        assert!(e(429).is_rate_limited());
        assert!(!e(500).is_rate_limited());
    }

    #[test]
    fn context_too_long_detected() {
        let e = LlmError::Http {
            status: 400,
            message: "This model's maximum context length is 8192 tokens".into(),
            retry_after: None,
        };
        assert!(e.is_context_too_long());
        assert!(!e.is_retryable());
    }

    #[test]
    fn html_body_becomes_text() {
        let body = "<!DOCTYPE html><html><head><title>502 Bad Gateway</title><style>p{}</style></head><body><h1>Bad Gateway</h1></body></html>";
        let d = describe_error_body(body);
        assert_eq!(d, "(HTML page) 502 Bad Gateway Bad Gateway");
    }

    #[test]
    fn html_with_multibyte_text_inside_tags_does_not_panic() {
        let body = "<html><body><p title=\"café ☕\">Fehler: überlastet ☕</p><script>é</script></body></html>";
        assert_eq!(
            describe_error_body(body),
            "(HTML page) Fehler: überlastet ☕"
        );
    }

    #[test]
    fn json_body_message() {
        let d = describe_error_body(r#"{"error":{"message":"Invalid API key","type":"auth"}}"#);
        assert_eq!(d, "Invalid API key");
    }
}
