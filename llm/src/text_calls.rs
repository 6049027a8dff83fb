//! Tool calls written as text. Models served by llama.cpp (without `--jinja` or a tool-call
//! parser for the model's template), vLLM (without `--enable-auto-tool-choice`) or Ollama
//! (models whose template has no tool support) often answer a request that offered tools with
//! the call in the content instead of `tool_calls`:
//!
//! ````text
//! ```json
//! {"name": "todo_write", "arguments": {"todos": […]}}
//! ```
//! ````
//!
//! or `<tool_call>{"name": …, "arguments": …}</tool_call>` (the Hermes/Qwen template), or the
//! bare JSON object as the whole answer. [`extract`] turns such text into tool calls — only
//! when it is safe to read it so:
//!
//! - the request offered tools and the reply has no `tool_calls`;
//! - the call blocks are at the **end** of the reply (only whitespace after them): a block in
//!   the middle of prose is an example, not a call;
//! - every block is a JSON object with `name` naming one of the offered tools and `arguments`
//!   (or `parameters`) an object, or a string holding one.
//!
//! Anything else stays text.

use serde_json::Value;

use super::types::{ToolCall, ToolSpec};

/// The reply's text without the call blocks, and the calls; `None` when the text holds no
/// call to read (see the module doc for when it does).
pub fn extract(text: &str, tools: &[ToolSpec], id_prefix: &str) -> Option<(String, Vec<ToolCall>)> {
    if tools.is_empty() {
        return None;
    }
    let offered = |name: &str| tools.iter().any(|t| t.name == name);
    // The whole reply one bare JSON object (or a list of them).
    let whole = text.trim();
    if whole.starts_with('{') || whole.starts_with('[') {
        if let Ok(v) = serde_json::from_str::<Value>(whole) {
            let items = match v {
                Value::Array(items) => items,
                one => vec![one],
            };
            let calls: Option<Vec<ToolCall>> = items
                .iter()
                .enumerate()
                .map(|(i, v)| call_of(v, &offered, id_prefix, i))
                .collect();
            return calls
                .filter(|c| !c.is_empty())
                .map(|calls| (String::new(), calls));
        }
    }
    // Blocks at the end, last first.
    let mut rest = text.trim_end();
    let mut blocks = Vec::new();
    while let Some((before, body)) = last_block(rest) {
        blocks.push(body);
        rest = before.trim_end();
    }
    if blocks.is_empty() {
        return None;
    }
    blocks.reverse();
    let mut calls = Vec::new();
    for body in blocks {
        let v: Value = serde_json::from_str(body.trim()).ok()?;
        let items = match v {
            Value::Array(items) => items,
            one => vec![one],
        };
        for v in &items {
            let n = calls.len();
            calls.push(call_of(v, &offered, id_prefix, n)?);
        }
    }
    Some((rest.to_string(), calls))
}

/// The last fenced (```` ```json ````, ```` ``` ````, ```` ```tool_call ````) or
/// `<tool_call>` block that ends `text`: (the text before it, its body).
fn last_block(text: &str) -> Option<(&str, &str)> {
    if let Some(inner) = text.strip_suffix("</tool_call>") {
        let start = inner.rfind("<tool_call>")?;
        return Some((&text[..start], &inner[start + "<tool_call>".len()..]));
    }
    let inner = text.strip_suffix("```")?;
    let open = inner.rfind("```")?;
    let after = &inner[open + 3..];
    // The info string: nothing, `json` or `tool_call`, up to the end of its line.
    let (info, body) = after.split_once('\n')?;
    if !matches!(info.trim(), "" | "json" | "JSON" | "tool_call") {
        return None;
    }
    Some((&text[..open], body))
}

fn call_of(
    v: &Value,
    offered: &dyn Fn(&str) -> bool,
    id_prefix: &str,
    index: usize,
) -> Option<ToolCall> {
    let obj = v.as_object()?;
    // `{"function": {"name": …, "arguments": …}}` as some templates nest it.
    if let Some(f) = obj.get("function").filter(|f| f.is_object()) {
        return call_of(f, offered, id_prefix, index);
    }
    let name = obj.get("name")?.as_str()?;
    if !offered(name) {
        return None;
    }
    let args = match obj.get("arguments").or_else(|| obj.get("parameters")) {
        None => Value::Object(Default::default()),
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(v @ Value::Object(_)) => v,
            _ => return None,
        },
        Some(v @ Value::Object(_)) => v.clone(),
        Some(_) => return None,
    };
    Some(ToolCall {
        id: format!("{id_prefix}{index}"),
        name: name.to_string(),
        arguments: args.to_string(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tools() -> Vec<ToolSpec> {
        ["todo_write", "read_file"]
            .iter()
            .map(|n| ToolSpec {
                name: n.to_string(),
                description: String::new(),
                parameters: json!({"type": "object"}),
            })
            .collect()
    }

    #[test]
    fn a_fenced_block_at_the_end_is_a_call() {
        let text = "I'll note the plan.\n```json\n{\"name\": \"todo_write\", \"arguments\": {\"todos\": []}}\n```\n";
        let (rest, calls) = extract(text, &tools(), "text_call_").unwrap();
        assert_eq!(rest, "I'll note the plan.");
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "todo_write");
        assert_eq!(calls[0].id, "text_call_0");
        assert_eq!(calls[0].arguments, r#"{"todos":[]}"#);
    }

    #[test]
    fn other_shapes_are_calls_too() {
        let t = tools();
        let tagged = "<tool_call>\n{\"name\": \"read_file\", \"arguments\": \"{\\\"path\\\": \\\"a\\\"}\"}\n</tool_call>";
        let (_, calls) = extract(tagged, &t, "c").unwrap();
        assert_eq!(calls[0].arguments, r#"{"path":"a"}"#);
        let bare = r#"{"name": "read_file", "parameters": {"path": "b"}}"#;
        assert_eq!(extract(bare, &t, "c").unwrap().1[0].name, "read_file");
        let two = "```json\n{\"name\":\"read_file\",\"arguments\":{\"path\":\"a\"}}\n```\n```json\n{\"name\":\"read_file\",\"arguments\":{\"path\":\"b\"}}\n```";
        assert_eq!(extract(two, &t, "c").unwrap().1.len(), 2);
    }

    #[test]
    fn examples_unknown_tools_and_no_tools_stay_text() {
        let t = tools();
        let middle = "Call it like this:\n```json\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a\"}}\n```\nand you get the file.";
        assert_eq!(extract(middle, &t, "c"), None);
        let unknown = "```json\n{\"name\": \"rm_rf\", \"arguments\": {}}\n```";
        assert_eq!(extract(unknown, &t, "c"), None);
        let data = "```json\n{\"version\": 3}\n```";
        assert_eq!(extract(data, &t, "c"), None);
        let rust = "```rust\nfn main() {}\n```";
        assert_eq!(extract(rust, &t, "c"), None);
        let ok = "```json\n{\"name\": \"read_file\", \"arguments\": {}}\n```";
        assert_eq!(extract(ok, &[], "c"), None);
        assert_eq!(extract("plain answer", &t, "c"), None);
    }
}
