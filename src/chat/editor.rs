//! The line editor: reedline with file-backed history, multi-line input, slash-command
//! completion, and the suggestion shown as dim ghost text in the empty prompt.
//!
//! The suggestion's keys are decided in [`FollowupKeys`], an edit mode wrapped around emacs
//! mode: it sees every key before reedline acts on it, in order, so an Enter typed right after
//! a character is never mistaken for accepting the suggestion (the peer's Enter race), and
//! Shift+Tab (BackTab) is not Tab.

use std::borrow::Cow;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossterm::event::{Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use reedline::{
    default_emacs_keybindings, ColumnarMenu, Completer, CompletionResult, EditCommand, EditMode,
    Emacs, FileBackedHistory, Hinter, History, MenuBuilder, Prompt, PromptEditMode,
    PromptHistorySearch, Reedline, ReedlineEvent, ReedlineMenu, ReedlineRawEvent, Span, Suggestion,
    ValidationResult, Validator,
};
use shade_agent::followup::controller::{AcceptMethod, FollowupController};

use super::commands::COMMANDS;

/// History entries kept.
const HISTORY_SIZE: usize = 5_000;

/// What the editor, the key handler and the session share about the suggestion.
pub(crate) struct Ghost {
    pub ctl: Mutex<FollowupController>,
    /// The suggestion the user accepted while editing, and how; taken at submit.
    pub accepted: Mutex<Option<(String, AcceptMethod)>>,
    /// Was the line empty at the last repaint? (The suggestion only shows on an empty line.)
    pub line_empty: AtomicBool,
}

impl Ghost {
    pub fn new(ctl: FollowupController) -> Self {
        Self {
            ctl: Mutex::new(ctl),
            accepted: Mutex::new(None),
            line_empty: AtomicBool::new(true),
        }
    }

    fn visible(&self) -> Option<String> {
        self.ctl
            .lock()
            .ok()
            .and_then(|c| c.visible().map(str::to_string))
    }
}

/// Build the editor.
pub(crate) fn build(
    history: Option<&Path>,
    ghost: Arc<Ghost>,
    wake: Arc<AtomicBool>,
) -> reedline::Reedline {
    let mut keybindings = default_emacs_keybindings();
    keybindings.add_binding(
        KeyModifiers::NONE,
        KeyCode::Tab,
        ReedlineEvent::UntilFound(vec![
            ReedlineEvent::Menu("completion_menu".to_string()),
            ReedlineEvent::MenuNext,
        ]),
    );
    keybindings.add_binding(
        KeyModifiers::ALT,
        KeyCode::Enter,
        ReedlineEvent::Edit(vec![EditCommand::InsertNewline]),
    );
    let menu = ColumnarMenu::default().with_name("completion_menu");
    let mut editor = Reedline::create()
        .with_hinter(Box::new(GhostHinter {
            ghost: ghost.clone(),
            shown: String::new(),
        }))
        .with_edit_mode(Box::new(FollowupKeys {
            inner: Emacs::new(keybindings),
            ghost,
        }))
        .with_completer(Box::new(SlashCompleter))
        .with_menu(ReedlineMenu::EngineCompleter(Box::new(menu)))
        .with_quick_completions(true)
        .with_partial_completions(true)
        .with_validator(Box::new(BackslashContinues))
        .with_break_signal(wake)
        .with_poll_interval(Duration::from_millis(30));
    if let Some(path) = history {
        match FileBackedHistory::with_file(HISTORY_SIZE, path.to_path_buf()) {
            Ok(h) => editor = editor.with_history(Box::new(h)),
            Err(e) => tracing::warn!("history at {} not used: {e}", path.display()),
        }
    }
    editor
}

/// Shows the visible suggestion, dimmed, when the line is empty.
struct GhostHinter {
    ghost: Arc<Ghost>,
    shown: String,
}

impl Hinter for GhostHinter {
    fn handle(
        &mut self,
        line: &str,
        _pos: usize,
        _history: &dyn History,
        use_ansi_coloring: bool,
        _cwd: &str,
    ) -> String {
        self.ghost
            .line_empty
            .store(line.is_empty(), Ordering::SeqCst);
        self.shown = match (line.is_empty(), self.ghost.visible()) {
            (true, Some(s)) => s,
            _ => String::new(),
        };
        if self.shown.is_empty() {
            String::new()
        } else if use_ansi_coloring {
            format!("\x1b[2m{}\x1b[0m", self.shown)
        } else {
            self.shown.clone()
        }
    }

    fn complete_hint(&self) -> String {
        self.shown.clone()
    }

    fn next_hint_token(&self) -> String {
        self.shown
            .split_inclusive(' ')
            .next()
            .unwrap_or("")
            .to_string()
    }
}

/// Emacs mode plus the suggestion's keys: Tab and Right fill it in, Enter submits it,
/// typed or pasted text dismisses it.
struct FollowupKeys {
    inner: Emacs,
    ghost: Arc<Ghost>,
}

impl FollowupKeys {
    fn accept(&self, method: AcceptMethod) -> Option<String> {
        let text = {
            let mut ctl = self.ghost.ctl.lock().ok()?;
            ctl.accept(method, Instant::now())?
        };
        if let Ok(mut a) = self.ghost.accepted.lock() {
            *a = Some((text.clone(), method));
        }
        Some(text)
    }
}

impl EditMode for FollowupKeys {
    fn parse_event(&mut self, event: ReedlineRawEvent) -> ReedlineEvent {
        let event: Event = event.into();
        let showing =
            self.ghost.line_empty.load(Ordering::SeqCst) && self.ghost.visible().is_some();
        if let Event::Key(KeyEvent {
            code,
            modifiers,
            kind: KeyEventKind::Press | KeyEventKind::Repeat,
            ..
        }) = &event
        {
            if let Ok(mut ctl) = self.ghost.ctl.lock() {
                ctl.keystroke(Instant::now());
            }
            if showing && *modifiers == KeyModifiers::NONE {
                let fill = |text: String| EditCommand::InsertString(text);
                match code {
                    KeyCode::Tab => {
                        return self
                            .accept(AcceptMethod::Tab)
                            .map(|t| ReedlineEvent::Edit(vec![fill(t)]))
                            .unwrap_or(ReedlineEvent::None)
                    }
                    KeyCode::Right => {
                        return self
                            .accept(AcceptMethod::Right)
                            .map(|t| ReedlineEvent::Edit(vec![fill(t)]))
                            .unwrap_or(ReedlineEvent::None)
                    }
                    KeyCode::Enter => {
                        return self
                            .accept(AcceptMethod::Enter)
                            .map(|t| {
                                ReedlineEvent::Multiple(vec![
                                    ReedlineEvent::Edit(vec![fill(t)]),
                                    ReedlineEvent::Submit,
                                ])
                            })
                            .unwrap_or(ReedlineEvent::None)
                    }
                    _ => {}
                }
            }
            let types = matches!(code, KeyCode::Char(_))
                && !modifiers.intersects(KeyModifiers::CONTROL | KeyModifiers::ALT);
            if types {
                self.dismiss();
            }
        }
        if matches!(event, Event::Paste(_)) {
            self.dismiss();
        }
        match ReedlineRawEvent::try_from(event) {
            Ok(raw) => self.inner.parse_event(raw),
            Err(()) => ReedlineEvent::None,
        }
    }

    fn edit_mode(&self) -> PromptEditMode {
        self.inner.edit_mode()
    }
}

impl FollowupKeys {
    fn dismiss(&self) {
        if let Ok(mut ctl) = self.ghost.ctl.lock() {
            ctl.dismiss(Instant::now());
        }
    }
}

/// Completes slash commands at the start of the line.
struct SlashCompleter;

impl Completer for SlashCompleter {
    fn complete(&mut self, line: &str, pos: usize) -> CompletionResult {
        let typed = &line[..pos.min(line.len())];
        if !typed.starts_with('/') || typed.contains(' ') {
            return CompletionResult::fresh(Vec::new());
        }
        let found: Vec<Suggestion> = COMMANDS
            .iter()
            .filter(|(c, _)| c.starts_with(typed))
            .map(|(c, d)| Suggestion {
                value: c.to_string(),
                description: Some(d.to_string()),
                span: Span::new(0, pos),
                append_whitespace: true,
                ..Suggestion::default()
            })
            .collect();
        CompletionResult::fresh(found)
    }
}

/// A line ending in a backslash continues on the next line.
struct BackslashContinues;

impl Validator for BackslashContinues {
    fn validate(&self, line: &str) -> ValidationResult {
        if line.ends_with('\\') {
            ValidationResult::Incomplete
        } else {
            ValidationResult::Complete
        }
    }
}

/// Turn the editor's text into the prompt: continuation backslashes removed.
pub(crate) fn submitted_text(line: &str) -> String {
    line.replace("\\\n", "\n")
}

/// `shade [mode]> ` on the left; nothing on the right.
pub(crate) struct ChatPrompt {
    pub label: String,
}

impl Prompt for ChatPrompt {
    fn render_prompt_left(&self) -> Cow<'_, str> {
        Cow::Borrowed(&self.label)
    }
    fn render_prompt_right(&self) -> Cow<'_, str> {
        Cow::Borrowed("")
    }
    fn render_prompt_indicator(&self, _mode: PromptEditMode) -> Cow<'_, str> {
        Cow::Borrowed("> ")
    }
    fn render_prompt_multiline_indicator(&self) -> Cow<'_, str> {
        Cow::Borrowed("… ")
    }
    fn render_prompt_history_search_indicator(&self, search: PromptHistorySearch) -> Cow<'_, str> {
        Cow::Owned(format!("(search: {}) ", search.term))
    }
}
