//! What a turn prints in the chat: the lines `shade exec` prints, plus one transient status
//! line — a model call under way or about to be retried, a tool at work — that the next
//! output replaces, so a slow model or command shows what the turn waits for, and a server
//! that cannot be reached ends as one line, not one per retry.

use std::io::Write;

use shade_agent::{AgentEvent, StopReason};

use crate::cmd_exec::Renderer;

/// The chat's renderer.
#[derive(Default)]
pub(crate) struct View {
    renderer: Renderer,
    /// A status line is on screen (the cursor is at its end, on stderr's line).
    status: bool,
}

impl View {
    pub fn render(&mut self, e: &AgentEvent) {
        match e {
            AgentEvent::Retry {
                attempt,
                delay_ms,
                reason,
            } => self.status(&format!(
                "shade: {reason}; retry {attempt} in {:.1} s",
                *delay_ms as f64 / 1000.0
            )),
            AgentEvent::ToolStart { summary, .. } => self.status(&format!("  ⋯ {summary}")),
            // The loop says "(cancelled)" once the turn is over.
            AgentEvent::Done {
                reason: StopReason::Cancelled,
                ..
            } => self.end_line(),
            // The wait for the model's first word, which can be long.
            AgentEvent::TurnStart { model, .. } => self.status(&format!("  ⋯ waiting for {model}")),
            // The model call is over (what it said has cleared the line already, if anything).
            AgentEvent::Usage { .. } => self.clear(),
            other => {
                self.clear();
                self.renderer.render(other);
            }
        }
    }

    /// Make sure the next output starts on a fresh line.
    pub fn end_line(&mut self) {
        self.clear();
        self.renderer.end_line();
    }

    fn status(&mut self, text: &str) {
        self.renderer.end_line();
        let width = crossterm::terminal::size()
            .map(|(w, _)| usize::from(w))
            .unwrap_or(80);
        // One terminal row, so that a carriage return takes it all back.
        let text = shade_fusefs::quote::visible_controls(text);
        let shown: String = text.chars().take(width.saturating_sub(1).max(1)).collect();
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[K\x1b[2m{shown}\x1b[0m");
        let _ = err.flush();
        self.status = true;
    }

    fn clear(&mut self) {
        if self.status {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[K");
            let _ = err.flush();
            self.status = false;
        }
    }
}
