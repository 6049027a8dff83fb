//! Loop detection for the query loop: a model that keeps making the same tool call (small
//! local models do: 34 identical `todo_write` calls until the server went away), or that keeps
//! streaming the same text, is first told so and then stopped, instead of spinning until the
//! turn limit.
//!
//! - **Tool calls**: the calls of a run, in order, are compared by name and arguments (JSON
//!   with sorted keys, so key order does not matter). The same call — or the same cycle of up
//!   to [`MAX_CYCLE`] calls (A B A B …) — repeated [`STEER_AT`] times in a row is run, and its
//!   result tells the model it repeats itself; at [`STOP_AT`] repetitions the call is not run
//!   and the run stops. Calls with anything different in between (an edit, then `cargo test`,
//!   another edit, `cargo test` again) are progress, not a loop.
//! - **Content**: streamed text (or reasoning) whose end is one piece of at least
//!   [`MIN_UNIT`] characters repeated [`CONTENT_REPEATS`] times in a row, outside a fenced code
//!   block, stops the model call at once.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

/// Repetitions of the same call (or cycle) at which the model is told it repeats itself.
pub const STEER_AT: usize = 3;
/// Repetitions at which the run stops (the call is not run).
pub const STOP_AT: usize = 4;
/// Longest cycle of calls looked for.
pub const MAX_CYCLE: usize = 3;
/// Shortest repeated piece of text that counts.
pub const MIN_UNIT: usize = 16;
/// Longest repeated piece of text looked for.
pub const MAX_UNIT: usize = 400;
/// Times a piece of text must repeat back to back. A model stuck in a loop repeats for
/// hundreds of times; a real answer repeats a phrase a dozen times at most (a long wrapped
/// line of the same words, a list of similar items), so the bar sits well above that.
pub const CONTENT_REPEATS: usize = 20;

/// What to do about one tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallVerdict {
    /// Not a loop.
    Run,
    /// Run it, and tell the model (the text goes after the call's result).
    Steer(String),
    /// Do not run it; stop the run (the text is the one-line reason for the user).
    Stop(String),
}

/// A detected loop, as recorded in telemetry (`"event": "loop_detected"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LoopEvent {
    /// Always `loop_detected`.
    pub event: &'static str,
    /// `tool_call` or `content`.
    pub kind: &'static str,
    /// `steered` (the model was told) or `stopped` (the run ended).
    pub action: &'static str,
    /// The repeated tool (tool-call loops).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// Repetitions seen.
    pub repeats: usize,
    /// Model calls of the run so far.
    pub model_calls: u32,
    /// The model.
    pub model: String,
    /// A background run (speculation) rather than the conversation itself.
    pub background: bool,
}

/// Watches a run's tool calls.
#[derive(Debug, Default)]
pub struct CallLoops {
    /// Signatures of the calls so far (name + canonical arguments).
    seen: Vec<String>,
}

impl CallLoops {
    /// Record the next call and judge it.
    pub fn check(&mut self, name: &str, arguments: &str) -> (CallVerdict, usize) {
        self.seen.push(signature(name, arguments));
        let (repeats, cycle) = repeats(&self.seen);
        let what = if cycle == 1 {
            format!("the same `{name}` call")
        } else {
            format!("the same cycle of {cycle} tool calls")
        };
        let verdict = if repeats >= STOP_AT {
            CallVerdict::Stop(format!(
                "stopped: the model made {what} {repeats} times in a row with the same arguments (loop detected)"
            ))
        } else if repeats >= STEER_AT {
            CallVerdict::Steer(format!(
                "Note from shade: this is {what} {repeats} times in a row with the same arguments; \
                 its result will not change. Do not repeat it. Take a different step, or give your \
                 answer now. Repeating it again ends the run."
            ))
        } else {
            CallVerdict::Run
        };
        (verdict, repeats)
    }
}

/// How many times the calls ending at the last one repeat back to back, and the cycle
/// length that gives the most repetitions (1 for the same call over and over).
fn repeats(seen: &[String]) -> (usize, usize) {
    let mut best = (1, 1);
    for cycle in 1..=MAX_CYCLE {
        if seen.len() < 2 * cycle {
            break;
        }
        let last = &seen[seen.len() - cycle..];
        // A cycle made of one call repeated is the 1-cycle's business.
        if cycle > 1 && last.iter().all(|s| *s == last[0]) {
            continue;
        }
        let mut n = 1;
        while seen.len() >= (n + 1) * cycle {
            let start = seen.len() - (n + 1) * cycle;
            if &seen[start..start + cycle] != last {
                break;
            }
            n += 1;
        }
        if n > best.0 {
            best = (n, cycle);
        }
    }
    best
}

/// Name and arguments, the arguments as JSON with sorted keys (raw text when not JSON).
fn signature(name: &str, arguments: &str) -> String {
    let args = match serde_json::from_str::<Value>(arguments) {
        Ok(v) => canonical(&v),
        Err(_) => arguments.trim().to_string(),
    };
    format!("{name}\u{0}{args}")
}

fn canonical(v: &Value) -> String {
    match v {
        Value::Object(map) => {
            let sorted: BTreeMap<&String, String> =
                map.iter().map(|(k, v)| (k, canonical(v))).collect();
            let body: Vec<String> = sorted
                .iter()
                .map(|(k, v)| format!("{}:{v}", Value::String((*k).clone())))
                .collect();
            format!("{{{}}}", body.join(","))
        }
        Value::Array(items) => {
            let body: Vec<String> = items.iter().map(canonical).collect();
            format!("[{}]", body.join(","))
        }
        other => other.to_string(),
    }
}

/// Watches one streamed reply's text for a piece repeated over and over.
#[derive(Debug, Default)]
pub struct ContentLoops {
    text: String,
    /// Length of `text` at the last check.
    checked: usize,
    /// Fence markers seen (odd: inside a code block, where repetition is normal).
    fences: usize,
}

impl ContentLoops {
    /// Add a delta; `Some(reason)` once the text ends in a long run of one repeated piece.
    pub fn push(&mut self, delta: &str) -> Option<String> {
        self.text.push_str(delta);
        // Check every 64 characters, on a bounded tail.
        if self.text.len() < self.checked + 64 {
            return None;
        }
        self.checked = self.text.len();
        self.fences = self.text.matches("```").count();
        if self.fences % 2 == 1 {
            return None;
        }
        let tail_len = MAX_UNIT * CONTENT_REPEATS;
        if self.text.len() > 2 * tail_len {
            let mut cut = self.text.len() - tail_len;
            while !self.text.is_char_boundary(cut) {
                cut += 1;
            }
            // Fence count of what is dropped stays in `fences` only through the kept text:
            // keep the parity by leaving a marker when an odd number is dropped.
            let dropped = self.text[..cut].matches("```").count();
            self.text = if dropped % 2 == 1 {
                format!("```{}", &self.text[cut..])
            } else {
                self.text[cut..].to_string()
            };
            self.checked = self.text.len();
        }
        let unit = repeated_unit(self.text.as_bytes())?;
        let piece = String::from_utf8_lossy(unit);
        let piece = crate::llm::error::truncate_chars(piece.trim(), 60);
        Some(format!(
            "stopped: the model wrote the same text over and over (\"{piece}\", {CONTENT_REPEATS}+ times; loop detected)"
        ))
    }
}

/// The piece the text ends in, repeated [`CONTENT_REPEATS`] times back to back, if any.
fn repeated_unit(text: &[u8]) -> Option<&[u8]> {
    for unit in MIN_UNIT..=MAX_UNIT {
        let need = unit * CONTENT_REPEATS;
        if text.len() < need {
            break;
        }
        let tail = &text[text.len() - need..];
        let piece = &tail[need - unit..];
        if tail.chunks(unit).all(|c| c == piece) {
            // A piece that is itself one character or two repeated (a rule of `=====`, a
            // row of `-|-`) is layout, not a looping model.
            let distinct: std::collections::HashSet<u8> = piece
                .iter()
                .copied()
                .filter(|b| !b.is_ascii_whitespace())
                .collect();
            if distinct.len() >= 4 {
                return Some(piece);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_call_is_steered_at_three_and_stopped_at_four() {
        let mut l = CallLoops::default();
        let args = r#"{"todos":[{"id":"1","content":"a","status":"pending"}]}"#;
        let same_reordered = r#"{ "todos": [ {"status":"pending","content":"a","id":"1"} ] }"#;
        assert_eq!(l.check("todo_write", args).0, CallVerdict::Run);
        assert_eq!(l.check("todo_write", same_reordered).0, CallVerdict::Run);
        assert!(matches!(
            l.check("todo_write", args).0,
            CallVerdict::Steer(_)
        ));
        match l.check("todo_write", args) {
            (CallVerdict::Stop(why), 4) => {
                assert!(why.contains("`todo_write`"), "{why}");
                assert!(!why.contains('\n'));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn progress_in_between_is_not_a_loop() {
        let mut l = CallLoops::default();
        for i in 0..6 {
            let edit = format!(
                r#"{{"path":"a","old_string":"{i}","new_string":"{}"}}"#,
                i + 1
            );
            assert_eq!(l.check("edit", &edit).0, CallVerdict::Run);
            assert_eq!(
                l.check("shell", r#"{"command":"cargo test"}"#).0,
                CallVerdict::Run
            );
        }
        // Different arguments each time.
        let mut l = CallLoops::default();
        for i in 0..10 {
            let args = format!(r#"{{"path":"f{i}"}}"#);
            assert_eq!(l.check("read_file", &args).0, CallVerdict::Run);
        }
    }

    #[test]
    fn a_cycle_of_two_calls_is_a_loop_too() {
        let mut l = CallLoops::default();
        let mut verdicts = Vec::new();
        for _ in 0..4 {
            verdicts.push(l.check("read_file", r#"{"path":"a"}"#).0);
            verdicts.push(l.check("ls", r#"{"path":"."}"#).0);
        }
        assert!(matches!(verdicts[5], CallVerdict::Steer(_)), "{verdicts:?}");
        match &verdicts[7] {
            CallVerdict::Stop(why) => assert!(why.contains("cycle of 2"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_phrase_repeated_a_dozen_times_is_an_answer_not_a_loop() {
        let mut c = ContentLoops::default();
        let line = "A long line: **wrapped** text and ".to_string()
            + &"**wrapped** text and ".repeat(14)
            + "the end.\n";
        for chunk in line.as_bytes().chunks(7) {
            assert_eq!(c.push(std::str::from_utf8(chunk).expect("ASCII")), None);
        }
    }

    #[test]
    fn repeated_text_is_caught_and_layout_is_not() {
        let mut c = ContentLoops::default();
        let mut caught = None;
        for _ in 0..40 {
            if let Some(why) = c.push("I will update the todo list now. ") {
                caught = Some(why);
                break;
            }
        }
        let why = caught.expect("the loop was not caught");
        assert!(why.contains("update the todo list"), "{why}");

        let mut c = ContentLoops::default();
        for _ in 0..100 {
            assert_eq!(c.push("=========="), None);
        }
        let mut c = ContentLoops::default();
        assert_eq!(c.push("```\n"), None);
        for _ in 0..40 {
            assert_eq!(c.push("assert_eq!(f(1), 1);\n"), None);
        }
        let mut c = ContentLoops::default();
        for i in 0..200 {
            assert_eq!(
                c.push(&format!("line {i} of a long and varied answer\n")),
                None
            );
        }
    }
}
