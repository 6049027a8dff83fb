//! Repairs of `edit` and `write_file` arguments the model got slightly wrong (the seed's
//! ensureCorrectEdit and ensureCorrectFileContent): cheap rules first (one level of escaping,
//! trailing whitespace, indentation), then one fast-model call. A repaired edit is used only
//! when its `old_string` occurs in the file exactly as often as expected, so a repair can
//! never land somewhere the model did not mean.

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::background::{prompt_id, BackgroundLlm};
use crate::llm::Message;

/// A working replacement for an edit that did not match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EditFix {
    /// The `old_string` that matches.
    pub old: String,
    /// The `new_string` to go with it.
    pub new: String,
    /// What was wrong, for the note in the result.
    pub how: String,
}

/// Characters of the file sent to the model at most.
const MAX_FILE_CHARS: usize = 60_000;

/// Undo one level of string escaping (`\n`, `\t`, `\r`, `\"`, `\'`, `` \` ``, `\\`), as when a
/// model escapes text that is already inside a JSON string. Other backslashes stay.
pub fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        let decoded = match chars.peek() {
            Some('n') => '\n',
            Some('t') => '\t',
            Some('r') => '\r',
            Some(&q @ ('"' | '\'' | '`' | '\\')) => q,
            _ => {
                out.push('\\');
                continue;
            }
        };
        chars.next();
        out.push(decoded);
    }
    out
}

/// Does `s` contain an escape sequence [`unescape`] would change?
pub fn has_escapes(s: &str) -> bool {
    unescape(s) != s
}

/// How lines are compared when the text does not match exactly.
type Norm = fn(&str) -> &str;

/// Try the rules on an edit whose `old_string` does not occur `expected` times.
pub fn edit_by_rule(current: &str, old: &str, new: &str, expected: usize) -> Option<EditFix> {
    let mut candidates = vec![(old.to_string(), new.to_string(), "")];
    if has_escapes(old) {
        candidates.push((unescape(old), unescape(new), "over-escaped text, "));
    }
    for (old, new, unescaped) in candidates {
        if !unescaped.is_empty() && old != new && current.matches(old.as_str()).count() == expected
        {
            return Some(EditFix {
                old,
                new,
                how: "over-escaped text (one level of escaping undone)".into(),
            });
        }
        let strategies: [(&str, Norm); 2] = [
            ("trailing whitespace", str::trim_end),
            ("indentation", str::trim),
        ];
        for (what, norm) in strategies {
            if let Some(fix) = by_lines(current, &old, &new, expected, norm) {
                return Some(EditFix {
                    how: format!("{unescaped}{what} differed from the file"),
                    ..fix
                });
            }
        }
    }
    None
}

/// The most line comparisons one rule makes: an `old_string` of many lines against a file of
/// many similar ones is their product; past it the rule gives up (no repair).
const COMPARE_MAX: usize = 50_000_000;

/// Match `old` line by line under `norm`; the matched lines of the file become the new
/// `old_string` and `new` is re-indented by the difference in indentation.
fn by_lines(current: &str, old: &str, new: &str, expected: usize, norm: Norm) -> Option<EditFix> {
    let want: Vec<&str> = old.split_inclusive('\n').collect();
    if want.iter().all(|l| l.trim().is_empty()) {
        return None;
    }
    let keep_last_newline = old.ends_with('\n');
    fn bare(l: &str) -> &str {
        l.trim_end_matches('\n').trim_end_matches('\r')
    }
    // Streamed over the file's lines, holding no list of them nor of the places found (a
    // file of empty lines is millions of lines): the first place found, and how many.
    let at = |l: &str| l.as_ptr() as usize - current.as_ptr() as usize;
    let mut lines = current.split_inclusive('\n');
    let mut found: Option<&str> = None;
    let mut count = 0usize;
    let mut compared = 0usize;
    loop {
        let mut window = lines.clone();
        let mut last = None;
        let fits = want.iter().all(|w| {
            compared += 1;
            match window.next() {
                Some(l) if norm(bare(w)) == norm(bare(l)) => {
                    last = Some(l);
                    true
                }
                _ => false,
            }
        });
        if compared > COMPARE_MAX {
            return None;
        }
        match (fits, last, lines.clone().next()) {
            (true, Some(last), Some(first)) => {
                let start = at(first);
                let end = if keep_last_newline {
                    at(last) + last.len()
                } else {
                    at(last) + bare(last).len()
                };
                let region = &current[start..end];
                count += 1;
                if count > expected || found.is_some_and(|f| f != region) {
                    return None;
                }
                found = Some(region);
                lines = window;
            }
            _ => {
                if lines.next().is_none() {
                    break;
                }
            }
        }
    }
    let found = found.filter(|_| count == expected)?.to_string();
    if found == old || current.matches(found.as_str()).count() != expected {
        return None;
    }
    let new = reindent(old, &found, new);
    if new == found {
        return None;
    }
    Some(EditFix {
        old: found,
        new,
        how: String::new(),
    })
}

fn indent_of(line: &str) -> &str {
    &line[..line.len() - line.trim_start().len()]
}

/// Shift `new` by the indentation difference between the first non-blank line of `old` and
/// the same line in the file.
fn reindent(old: &str, found: &str, new: &str) -> String {
    let Some((k, old_line)) = old.lines().enumerate().find(|(_, l)| !l.trim().is_empty()) else {
        return new.to_string();
    };
    let Some(file_line) = found.lines().nth(k) else {
        return new.to_string();
    };
    let (from, to) = (indent_of(old_line), indent_of(file_line));
    if from == to {
        return new.to_string();
    }
    new.split_inclusive('\n')
        .map(|l| {
            if l.trim().is_empty() {
                l.to_string()
            } else if let Some(rest) = l.strip_prefix(from) {
                format!("{to}{rest}")
            } else {
                l.to_string()
            }
        })
        .collect()
}

/// Ask the fast model for a corrected `old_string` / `new_string`; `None` when it has none,
/// or its proposal does not occur exactly `expected` times.
pub async fn edit_by_model(
    bg: &BackgroundLlm,
    shown: &str,
    current: &str,
    old: &str,
    new: &str,
    expected: usize,
    cancel: &CancellationToken,
) -> Option<EditFix> {
    let file = crate::tools::text::cap_middle(current, MAX_FILE_CHARS);
    let system = "You repair search-and-replace edits for a coding agent. The agent's old_string \
        does not occur in the file the expected number of times, usually because of whitespace, \
        indentation or escaping mistakes, or a few wrong characters. Find the text the agent \
        meant, copy it exactly from the file (every space and line break), and adjust \
        new_string the same way, keeping the agent's intended change. Reply with one JSON \
        object and nothing else: {\"old_string\": \"...\", \"new_string\": \"...\"}. If the \
        intended text is not in the file, reply {\"old_string\": \"\", \"new_string\": \"\"}.";
    let user = format!(
        "File: {shown}\nExpected occurrences of old_string: {expected}\n\n\
         old_string (as the agent sent it):\n<<<\n{old}\n>>>\n\n\
         new_string (as the agent sent it):\n<<<\n{new}\n>>>\n\n\
         Current content of {shown}:\n<<<\n{file}\n>>>"
    );
    let messages = vec![
        Message::System {
            content: system.into(),
        },
        Message::User { content: user },
    ];
    let answer = match bg.ask(prompt_id::EDIT_CORRECTION, messages, cancel).await {
        Ok(c) => c.text,
        Err(e) => {
            tracing::debug!("edit correction failed: {e}");
            return None;
        }
    };
    let v = json_object(&answer)?;
    let fixed_old = v.get("old_string")?.as_str()?.to_string();
    let fixed_new = v.get("new_string")?.as_str()?.to_string();
    if fixed_old.is_empty()
        || fixed_old == fixed_new
        || current.matches(fixed_old.as_str()).count() != expected
    {
        return None;
    }
    Some(EditFix {
        old: fixed_old,
        new: fixed_new,
        // No model name: results must read the same when a recorded run is replayed.
        how: "corrected by the fast model".into(),
    })
}

/// The first JSON object in a model's answer (tolerates code fences and chatter around it).
pub fn json_object(answer: &str) -> Option<Value> {
    let start = answer.find('{')?;
    let end = answer.rfind('}')?;
    if end < start {
        return None;
    }
    serde_json::from_str::<Value>(&answer[start..=end])
        .ok()
        .filter(Value::is_object)
}

/// What the rules say about content about to be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Escaping {
    /// Nothing to correct.
    Clean,
    /// Over-escaped for sure: here it is with one level of escaping undone.
    Over(String),
    /// Escapes where code rarely has them, but also real line breaks: the rules cannot
    /// tell; the unescaped version is offered to the model to judge.
    Unsure(String),
}

/// Judge content by rule: a file with no line break but `\n` sequences is over-escaped; a
/// backslash escape outside any quoted string on its line (`print(\"hi\")`) is suspicious.
pub fn judge_content(content: &str) -> Escaping {
    if !has_escapes(content) {
        return Escaping::Clean;
    }
    let decoded = unescape(content);
    if !content.contains('\n') && content.contains("\\n") {
        return Escaping::Over(decoded);
    }
    if content.lines().any(escape_outside_quotes) {
        Escaping::Unsure(decoded)
    } else {
        Escaping::Clean
    }
}

fn escape_outside_quotes(line: &str) -> bool {
    let mut quote: Option<char> = None;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(_), '\\') => {
                chars.next();
            }
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'' | '`') => quote = Some(c),
            (None, '\\') => {
                if matches!(
                    chars.peek(),
                    Some('n' | 't' | 'r' | '"' | '\'' | '`' | '\\')
                ) {
                    return true;
                }
            }
            (None, _) => {}
        }
    }
    false
}

/// Ask the fast model whether content the rules were unsure of is over-escaped.
pub async fn content_is_over_escaped(
    bg: &BackgroundLlm,
    shown: &str,
    content: &str,
    cancel: &CancellationToken,
) -> bool {
    let sample = crate::tools::text::cap_middle(content, MAX_FILE_CHARS);
    let system = "A coding agent is about to write a file. Sometimes its content arrives escaped \
        one level too many: line breaks as the two characters \\n, quotes as \\\". Decide \
        whether this content is such an over-escaped file (true) or correct as it is, its \
        backslashes meant (false). Reply with one JSON object and nothing else: \
        {\"over_escaped\": true} or {\"over_escaped\": false}.";
    let messages = vec![
        Message::System {
            content: system.into(),
        },
        Message::User {
            content: format!("File: {shown}\n\nContent:\n<<<\n{sample}\n>>>"),
        },
    ];
    match bg
        .ask(prompt_id::CONTENT_CORRECTION, messages, cancel)
        .await
    {
        Ok(c) => json_object(&c.text)
            .and_then(|v| v.get("over_escaped").and_then(Value::as_bool))
            .unwrap_or(false),
        Err(e) => {
            tracing::debug!("content correction failed: {e}");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescape_undoes_one_level_only() {
        assert_eq!(unescape(r#"a\nb\t\"c\" \\n \q"#), "a\nb\t\"c\" \\n \\q");
        assert!(!has_escapes("plain \\q text"));
    }

    #[test]
    fn rules_fix_escaping_trailing_space_and_indentation() {
        let file = "fn a() {\n    let x = 1;   \n    call(x);\n}\n";
        let fix = edit_by_rule(file, "let x = 1;\\n    call(x);", "let x = 2;", 1)
            .expect("escapes and indentation");
        assert_eq!(fix.old, "    let x = 1;   \n    call(x);");
        assert_eq!(fix.new, "    let x = 2;");
        assert!(fix.how.starts_with("over-escaped"), "{}", fix.how);
        let fix = edit_by_rule(
            file,
            "    let x = 1;\n    call(x);\n",
            "    let x = 2;\n",
            1,
        )
        .expect("trailing whitespace");
        assert_eq!(fix.old, "    let x = 1;   \n    call(x);\n");
        assert!(fix.how.contains("trailing"));
        let fix = edit_by_rule(file, "let x = 1;\ncall(x);", "let y = 1;\ncall(y);", 1)
            .expect("indentation");
        assert_eq!(fix.old, "    let x = 1;   \n    call(x);");
        assert_eq!(fix.new, "    let y = 1;\n    call(y);");
        let fix = edit_by_rule(file, "    call(x);\\n}", "    call(y);\\n}", 1).expect("escapes");
        assert_eq!(
            (fix.old.as_str(), fix.new.as_str()),
            ("    call(x);\n}", "    call(y);\n}")
        );
        // Two sites differing only in indentation are ambiguous: no rule fix.
        let twice = "  f();\n    f();\n";
        assert_eq!(edit_by_rule(twice, "f();\n", "g();\n", 1), None);
    }

    #[test]
    fn content_judged_by_rule_where_it_can() {
        assert_eq!(judge_content("fn main() {}\n"), Escaping::Clean);
        assert_eq!(
            judge_content("fn main() {\\n    println!(\\\"hi\\\");\\n}\\n"),
            Escaping::Over("fn main() {\n    println!(\"hi\");\n}\n".into())
        );
        assert_eq!(
            judge_content("fn main() {\n    println!(\"a\\nb\");\n}\n"),
            Escaping::Clean
        );
        assert!(matches!(
            judge_content("print(\\\"hi\\\")\nx = 1\n"),
            Escaping::Unsure(ref d) if d == "print(\"hi\")\nx = 1\n"
        ));
    }

    #[test]
    fn json_object_tolerates_fences() {
        let v = json_object("```json\n{\"old_string\": \"a\"}\n```").expect("json");
        assert_eq!(v["old_string"], "a");
        assert!(json_object("no json").is_none());
    }
}
