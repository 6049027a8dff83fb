//! Hand-written session scripts (the format bench/sessions/*.json had, extended): what the
//! user types each turn, what the model does, what it suggests next, and what it does when a
//! shown suggestion is speculated but the user types something else. `spec-record` turns a
//! script into cassettes; the benchmark itself reads only cassettes.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use shade_testkit::{
    is_suggestion_request, last_real_user, last_user, tool_results_since_user, Reply, Router,
};

/// One session script.
#[derive(Debug, Clone, Deserialize)]
pub struct Script {
    /// Session name (the output directory's name).
    pub name: String,
    /// What kind of work it is (fix-then-test, run-tests, lint-fix, refactor, commit,
    /// docs-lookup, destructive, long-build, ignored, …).
    #[serde(default)]
    pub kind: Option<String>,
    /// One line for the reader of the results.
    #[serde(default)]
    pub about: Option<String>,
    /// A project of bench/corpus/projects.toml (fetched by bench/corpus/fetch.sh), or absent
    /// for an inline one (`files`).
    #[serde(default)]
    pub project: Option<String>,
    /// Inline project: path → content.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// Inline files made executable.
    #[serde(default)]
    pub executable: Vec<String>,
    /// A unified diff (relative to the script) applied to the project first.
    #[serde(default)]
    pub patch: Option<PathBuf>,
    /// Make the project a git repository with one commit before the session.
    #[serde(default)]
    pub git: bool,
    /// The conversation.
    pub turns: Vec<Turn>,
}

/// One user turn of a script.
#[derive(Debug, Clone, Deserialize)]
pub struct Turn {
    /// What the user typed.
    pub user: String,
    /// What the model did, in order (one model call per step).
    pub steps: Vec<Step>,
    /// What the model suggested after the answer (none: no suggestion).
    #[serde(default)]
    pub suggestion: Option<String>,
    /// What the model does when `suggestion` is speculated but the user types something else
    /// (omit when the next input is the suggestion: then the next turn's steps are it).
    #[serde(default)]
    pub speculation_steps: Option<Vec<Step>>,
    /// Other ways the user could have typed `user` (hand-written): a live suggestion equal
    /// to one of them counts as this input (copied into session.toml's `equivalents`).
    #[serde(default)]
    pub equivalents: Vec<String>,
}

/// One model call's answer.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Step {
    /// A tool call.
    Tool {
        /// Tool name.
        tool: String,
        /// Its arguments.
        args: Value,
    },
    /// A text answer (ends the turn).
    Text {
        /// The text.
        text: String,
    },
}

/// The input a pipelined suggestion request names (`The user just said: "…"`), if it is one.
pub fn pipelined_input(asked: &str) -> Option<String> {
    let (_, rest) = asked.split_once("The user just said: \"")?;
    let end = rest
        .find("\"\nThe assistant responded")
        .or_else(|| rest.find('"'))?;
    Some(rest[..end].to_string())
}

/// The input a suggestion request follows: the speculated one for a pipelined request, the
/// conversation's last real input otherwise.
pub fn suggestion_follows(body: &Value) -> String {
    pipelined_input(&last_user(body)).unwrap_or_else(|| last_real_user(body))
}

fn reply(step: &Step) -> Reply {
    match step {
        Step::Tool { tool, args } => Reply::tool(tool, args.clone()),
        Step::Text { text } => Reply::text(text),
    }
}

/// A model that answers from the script: suggestions by the input they follow, turns by
/// (input, tool results since it). A speculation of a suggestion the script has no steps for
/// is never answered (the recorder aborts it, so nothing is recorded).
pub fn router(script: Arc<Script>) -> Router {
    Arc::new(move |body: &Value| {
        if is_suggestion_request(body) {
            let after = suggestion_follows(body);
            return match script.turns.iter().find(|t| t.user == after) {
                Some(Turn {
                    suggestion: Some(s),
                    ..
                }) => Reply::text(s),
                _ => Reply::text(""),
            };
        }
        // A tool output over the budget asks the fast model for a summary: answer it (the
        // script is about the session's turns, not about summaries), or the recording waits.
        let system = body["messages"][0]["content"].as_str().unwrap_or_default();
        if system.starts_with("You summarise the output of a tool call") {
            return Reply::text("Long output; its first and last lines are below.");
        }
        let user = last_real_user(body);
        let step = tool_results_since_user(body);
        let steps = script
            .turns
            .iter()
            .find(|t| t.user == user)
            .map(|t| &t.steps)
            .or_else(|| {
                script
                    .turns
                    .iter()
                    .find(|t| t.suggestion.as_deref() == Some(user.as_str()))
                    .and_then(|t| t.speculation_steps.as_ref())
            });
        match steps {
            Some(steps) => match steps.get(step) {
                Some(s) => reply(s),
                None => Reply::text("(not in the script)"),
            },
            None => Reply::text("(not in the script)").after(Duration::from_secs(600)),
        }
    })
}
