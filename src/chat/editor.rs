//! The line editor: reedline with file-backed history, multi-line input, slash-command
//! completion, and the suggestion shown as dim ghost text in the empty prompt.
//!
//! The suggestion's keys are decided in [`FollowupKeys`], an edit mode wrapped around emacs
//! mode: it sees every key before reedline acts on it, in order, so an Enter typed right after
//! a character is never mistaken for accepting the suggestion (the peer's Enter race), and
//! Shift+Tab (BackTab) is not Tab.

use std::borrow::Cow;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
    /// The suggestion request on its way (its number; 0: none). While one is, an Enter on
    /// the empty line is one typed out of habit (after a one-key approval, or as the answer
    /// ends): it must not submit an empty line that throws the coming suggestion away.
    awaiting: AtomicU64,
    /// Numbers the suggestion requests.
    requests: AtomicU64,
}

impl Ghost {
    pub fn new(ctl: FollowupController) -> Self {
        Self {
            ctl: Mutex::new(ctl),
            accepted: Mutex::new(None),
            line_empty: AtomicBool::new(true),
            awaiting: AtomicU64::new(0),
            requests: AtomicU64::new(0),
        }
    }

    /// A suggestion request starts; pass the number to [`Ghost::arrived`] when it ends.
    pub fn requested(&self) -> u64 {
        let n = self.requests.fetch_add(1, Ordering::SeqCst) + 1;
        self.awaiting.store(n, Ordering::SeqCst);
        n
    }

    /// Request `n` ended, however (suggested, suppressed, failed, cancelled).
    pub fn arrived(&self, n: u64) {
        let _ = self
            .awaiting
            .compare_exchange(n, 0, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// Is a suggestion on its way: requested, or set and waiting for its delay?
    fn coming(&self) -> bool {
        self.awaiting.load(Ordering::SeqCst) != 0
            || self.ctl.lock().is_ok_and(|c| c.pending().is_some())
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
    project: &Path,
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
        .with_completer(Box::new(ChatCompleter {
            project: project.to_path_buf(),
        }))
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
        } else {
            // The model's suggestion is shown, never obeyed (Tab still fills it as it is).
            let shown = shade_fusefs::quote::visible_controls(&self.shown);
            if use_ansi_coloring {
                format!("\x1b[2m{shown}\x1b[0m")
            } else {
                shown.into_owned()
            }
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
            // Enter, or Ctrl-J: what an Enter typed during a turn reads as (the terminal
            // turned it into a newline while it was not in raw mode).
            let enter = (*code == KeyCode::Enter && *modifiers == KeyModifiers::NONE)
                || (*code == KeyCode::Char('j') && *modifiers == KeyModifiers::CONTROL);
            if enter
                && !showing
                && self.ghost.line_empty.load(Ordering::SeqCst)
                && self.ghost.coming()
            {
                // Nothing typed and a suggestion on its way: submitting the empty line would
                // only drop the suggestion. The Enter does nothing; the suggestion shows.
                return ReedlineEvent::None;
            }
            let code = if enter { &KeyCode::Enter } else { code };
            let modifiers = if enter {
                &KeyModifiers::NONE
            } else {
                modifiers
            };
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

/// Completes slash commands at the start of the line, and `@` mentions with the project's
/// paths (directories end in `/`, so Tab goes on into them).
struct ChatCompleter {
    project: std::path::PathBuf,
}

impl Completer for ChatCompleter {
    fn complete(&mut self, line: &str, pos: usize) -> CompletionResult {
        let typed = &line[..pos.min(line.len())];
        let found = if typed.starts_with('/') && !typed.contains(' ') {
            complete_command(typed, pos)
        } else {
            let start = typed.rfind(char::is_whitespace).map_or(0, |i| {
                i + typed[i..].chars().next().map_or(1, char::len_utf8)
            });
            match typed[start..].strip_prefix('@') {
                Some(partial) => complete_path(&self.project, partial, start + 1, pos),
                None => Vec::new(),
            }
        };
        CompletionResult::fresh(found)
    }
}

fn complete_command(typed: &str, pos: usize) -> Vec<Suggestion> {
    COMMANDS
        .iter()
        .filter(|(c, _)| c.starts_with(typed))
        .map(|(c, d)| Suggestion {
            value: c.to_string(),
            description: Some(d.to_string()),
            span: Span::new(0, pos),
            append_whitespace: true,
            ..Suggestion::default()
        })
        .collect()
}

/// Entries of the directory `partial` points into whose names start with its last part;
/// hidden ones only when that part starts with a dot. Never outside the project.
fn complete_path(project: &Path, partial: &str, start: usize, pos: usize) -> Vec<Suggestion> {
    let (dir, prefix) = match partial.rfind('/') {
        Some(i) => (&partial[..=i], &partial[i + 1..]),
        None => ("", partial),
    };
    let Ok(ws) = shade_agent::Workspace::new(project) else {
        return Vec::new();
    };
    let Ok(dir_path) = ws.resolve(if dir.is_empty() { "." } else { dir }) else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir(dir_path) else {
        return Vec::new();
    };
    let mut out: Vec<Suggestion> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with(prefix) || (name.starts_with('.') && !prefix.starts_with('.')) {
                return None;
            }
            let is_dir = e.path().is_dir();
            Some(Suggestion {
                value: format!("{dir}{name}{}", if is_dir { "/" } else { "" }),
                span: Span::new(start, pos),
                append_whitespace: !is_dir,
                ..Suggestion::default()
            })
        })
        .collect();
    out.sort_by(|a, b| a.value.cmp(&b.value));
    out.truncate(100);
    out
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
