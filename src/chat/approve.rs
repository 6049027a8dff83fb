//! Inline approvals in the chat: the diff an edit would make, then one key — y (yes), n or Esc
//! (no), a (always, for this tool, for the rest of the session). Ctrl-C cancels the turn.

use shade_fusefs::quote::visible_controls;
use std::collections::HashSet;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossterm::event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use shade_agent::approval::{Answer, ApprovalRequest, Approver};
use shade_llm::BoxFuture;
use tokio_util::sync::CancellationToken;

/// Asks on the terminal; remembers "always" per tool.
#[derive(Default)]
pub(crate) struct ChatApprover {
    always: Mutex<HashSet<String>>,
    /// The running turn's token: Ctrl-C at the question cancels the turn.
    turn: Mutex<Option<CancellationToken>>,
    /// Called before a question is shown (the chat clears its status line).
    before_ask: Mutex<Option<Hook>>,
}

type Hook = Arc<dyn Fn() + Send + Sync>;

impl ChatApprover {
    /// Called when a turn starts.
    pub fn set_turn(&self, cancel: CancellationToken) {
        if let Ok(mut t) = self.turn.lock() {
            *t = Some(cancel);
        }
    }

    fn turn(&self) -> CancellationToken {
        self.turn
            .lock()
            .ok()
            .and_then(|t| t.clone())
            .unwrap_or_default()
    }

    /// Run `hook` before each question is shown.
    pub fn on_ask(&self, hook: Hook) {
        if let Ok(mut h) = self.before_ask.lock() {
            *h = Some(hook);
        }
    }

    /// Has the user said "always" for this tool?
    pub fn always_allows(&self, tool: &str) -> bool {
        self.always.lock().is_ok_and(|a| a.contains(tool))
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Key {
    Yes,
    No,
    Always,
    Cancel,
}

impl Approver for ChatApprover {
    fn ask<'a>(&'a self, request: ApprovalRequest<'a>) -> BoxFuture<'a, Answer> {
        let tool = request.tool.to_string();
        if self.always_allows(&tool) {
            return Box::pin(async { Answer::Yes });
        }
        if let Some(hook) = self.before_ask.lock().ok().and_then(|h| h.clone()) {
            hook();
        }
        let mut question = String::new();
        if let Some(diff) = request.preview {
            question.push_str(&crate::review::render::colour_diff(diff));
            if !diff.ends_with('\n') {
                question.push('\n');
            }
        }
        question.push_str(&format!(
            "\x1b[1mallow the agent to {}?\x1b[0m [y]es / [n]o / [a]lways for {} ",
            visible_controls(request.what),
            visible_controls(&tool)
        ));
        let cancel = self.turn();
        Box::pin(async move {
            let waiter = cancel.clone();
            let key = tokio::task::spawn_blocking(move || read_key(&question, &waiter))
                .await
                .unwrap_or(Key::No);
            match key {
                Key::Yes => Answer::Yes,
                Key::Always => {
                    if let Ok(mut a) = self.always.lock() {
                        a.insert(tool);
                    }
                    Answer::Yes
                }
                Key::No => Answer::No(
                    "The user declined this tool call. Do not retry it; ask or continue without it."
                        .into(),
                ),
                Key::Cancel => {
                    cancel.cancel();
                    Answer::No("The user cancelled the turn.".into())
                }
            }
        })
    }
}

/// The answer to a question asked outside a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Confirm {
    Yes,
    No,
    /// Ctrl-C: not "no", but "stop this turn".
    Cancel,
}

/// Ask a yes/no question about `shown` (a changeset and diff) outside a turn.
pub(crate) fn confirm(shown: &str, what: &str) -> Confirm {
    let question = format!(
        "{}\x1b[1m{what}?\x1b[0m [y]es / [n]o ",
        crate::review::render::colour_diff(shown)
    );
    match read_key(&question, &CancellationToken::new()) {
        Key::Yes | Key::Always => Confirm::Yes,
        Key::No => Confirm::No,
        Key::Cancel => Confirm::Cancel,
    }
}

/// Show the question and wait for one of the answer keys (raw mode, so no Enter needed).
fn read_key(question: &str, cancel: &CancellationToken) -> Key {
    let mut err = std::io::stderr();
    // Raw mode before the question shows: a key pressed the moment it appears is a key (in
    // cooked mode a Ctrl-C would be a signal no one is waiting for).
    let raw = crossterm::terminal::enable_raw_mode().is_ok();
    let shown = format!("\n{question}");
    let _ = write!(err, "{}", shown.replace('\n', "\r\n"));
    let _ = err.flush();
    if !raw {
        let _ = writeln!(err);
        return Key::No;
    }
    let key = loop {
        if cancel.is_cancelled() {
            break Key::Cancel;
        }
        match event::poll(Duration::from_millis(50)) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(_) => break Key::No,
        }
        let Ok(Event::Key(KeyEvent {
            code,
            modifiers,
            kind: KeyEventKind::Press,
            ..
        })) = event::read()
        else {
            continue;
        };
        match (code, modifiers) {
            (KeyCode::Char('c'), KeyModifiers::CONTROL) => break Key::Cancel,
            (KeyCode::Char('y' | 'Y'), _) => break Key::Yes,
            (KeyCode::Char('a' | 'A'), _) => break Key::Always,
            (KeyCode::Char('n' | 'N'), _) | (KeyCode::Esc, _) => break Key::No,
            _ => {}
        }
    };
    let _ = crossterm::terminal::disable_raw_mode();
    let word = match key {
        Key::Yes => "yes",
        Key::No => "no",
        Key::Always => "always",
        Key::Cancel => "cancelled",
    };
    let _ = writeln!(err, "{word}");
    key
}
