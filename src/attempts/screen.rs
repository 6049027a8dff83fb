//! The best-of-N screen, in the `--review` screen's style: the attempts ranked, one per line,
//! and below them the one under the cursor's diff, its check's output, or its diff against a
//! marked attempt. Enter takes that attempt to the `--review` screen (accept all of it or the
//! files picked, conflict-checked); the others are dropped first. `d` drops all.

use std::time::Duration;

use crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use crossterm::terminal;
use shade_agent::Shadow;
use shade_fusefs::AcceptFlags;

use super::{compare, one_line, Attempt};
use crate::review::render::colour_diff_line;
use crate::review::{expand_tabs, paint, terminal_input, Input, Screen, Signals};

/// What the lower half shows.
#[derive(Clone, Copy, PartialEq)]
enum View {
    Diff,
    Check,
    Compare,
}

/// How the screen ended.
enum Choice {
    /// Review and accept this attempt (index into the attempts).
    Take(usize),
    Drop,
    Signal(i32),
}

struct Ui<'a> {
    attempts: &'a [Attempt],
    /// Attempt indexes, best first: the rows.
    order: &'a [usize],
    /// Row under the cursor.
    cursor: usize,
    /// Row marked as the base of a comparison.
    marked: Option<usize>,
    view: View,
    scroll: usize,
    confirm_drop: bool,
    message: Option<String>,
}

/// Shows the attempts and lets a person pick one (then reviews it with the per-file screen)
/// or drop all. Every attempt not accepted is dropped before this returns. Returns the exit
/// status and the attempt picked.
pub(crate) fn choose(
    attempts: &[Attempt],
    order: &[usize],
    shadows: &mut [Option<Shadow>],
) -> (i32, Option<usize>) {
    if attempts.is_empty() {
        eprintln!("shade: no attempt finished");
        return (crate::exit::SHADE_ERROR, None);
    }
    let signals = Signals::install();
    let mut ui = Ui {
        attempts,
        order,
        cursor: 0,
        marked: None,
        view: View::Diff,
        scroll: 0,
        confirm_drop: false,
        message: None,
    };
    let choice = match Screen::open() {
        Ok(screen) => {
            let c = ui.run();
            drop(screen);
            c
        }
        Err(e) => {
            eprintln!("shade: cannot use the terminal ({e}); every attempt was dropped");
            Choice::Drop
        }
    };
    let picked = match choice {
        Choice::Take(i) => i,
        Choice::Drop => {
            drop_all(shadows);
            eprintln!("shade: dropped every attempt; the project is unchanged");
            return (0, None);
        }
        Choice::Signal(sig) => {
            drop_all(shadows);
            eprintln!(
                "shade: interrupted by signal {sig}; dropped every attempt, the project is unchanged"
            );
            return (128 + sig, None);
        }
    };
    let taken = shadows.get_mut(picked).and_then(Option::take);
    drop_all(shadows);
    drop(signals);
    let Some((branch, _caches)) = taken.and_then(Shadow::into_branch) else {
        eprintln!("shade: that attempt's branch is gone; nothing accepted");
        return (crate::exit::SHADE_ERROR, None);
    };
    let a = &attempts[picked];
    let changes = branch.changeset(false);
    let outside = crate::review::Outside {
        changes: crate::outside::read(&branch),
        keep: crate::outside::keep_list(&[], true),
    };
    let ended = format!("attempt {}", a.index);
    let code = crate::review::review(branch, changes, outside, AcceptFlags::default(), &ended, 0);
    (code, Some(a.index))
}

fn drop_all(shadows: &mut [Option<Shadow>]) {
    for s in shadows.iter_mut() {
        drop(s.take());
    }
}

impl Ui<'_> {
    fn run(&mut self) -> Choice {
        let mut dirty = true;
        loop {
            if let Some(sig) = Signals::received() {
                return Choice::Signal(sig);
            }
            let (w, h) = terminal::size().unwrap_or((80, 24));
            if dirty {
                if let Err(e) = self.draw(w as usize, h as usize) {
                    tracing::warn!("drawing the attempts: {e}");
                    return Choice::Drop;
                }
                dirty = false;
            }
            match event::poll(Duration::ZERO) {
                Ok(true) => dirty = true,
                Ok(false) => {
                    match terminal_input(Duration::from_millis(100)) {
                        Input::Ready | Input::Nothing => {}
                        Input::Gone => return Choice::Drop,
                    }
                    continue;
                }
                Err(_) => return Choice::Drop,
            }
            let key = match event::read() {
                Ok(Event::Key(k)) if k.kind != KeyEventKind::Release => k,
                Ok(_) => continue,
                Err(_) => return Choice::Drop,
            };
            self.message = None;
            if self.confirm_drop {
                if matches!(key.code, KeyCode::Char('y') | KeyCode::Char('Y')) {
                    return Choice::Drop;
                }
                self.confirm_drop = false;
                continue;
            }
            let page = (h as usize / 2).max(1);
            match key.code {
                KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => {
                    return Choice::Signal(libc::SIGINT)
                }
                KeyCode::Up | KeyCode::Char('k') => self.go(self.cursor.saturating_sub(1)),
                KeyCode::Down | KeyCode::Char('j') => self.go(self.cursor + 1),
                KeyCode::Tab => {
                    self.view = match self.view {
                        View::Diff => View::Check,
                        View::Check if self.marked.is_some() => View::Compare,
                        _ => View::Diff,
                    };
                    self.scroll = 0;
                }
                KeyCode::Char('m') => {
                    self.marked = Some(self.cursor);
                    self.view = View::Compare;
                    self.scroll = 0;
                    self.message = Some(format!(
                        "marked attempt {}: move to another to see the diff between them",
                        self.attempts[self.order[self.cursor]].index
                    ));
                }
                KeyCode::PageDown | KeyCode::Char(' ') => self.scroll += page,
                KeyCode::PageUp => self.scroll = self.scroll.saturating_sub(page),
                KeyCode::Enter | KeyCode::Char('a') => {
                    return Choice::Take(self.order[self.cursor]);
                }
                KeyCode::Char('d') | KeyCode::Char('q') | KeyCode::Esc => {
                    self.confirm_drop = true;
                }
                _ => {}
            }
        }
    }

    fn go(&mut self, row: usize) {
        let row = row.min(self.order.len().saturating_sub(1));
        if row != self.cursor {
            self.cursor = row;
            self.scroll = 0;
        }
    }

    /// The lower half's title and lines.
    fn body(&self) -> (String, Vec<String>) {
        let a = &self.attempts[self.order[self.cursor]];
        let coloured = |text: &str| -> Vec<String> {
            text.lines()
                .map(|l| colour_diff_line(&expand_tabs(l)))
                .collect()
        };
        match self.view {
            View::Diff => {
                let lines = if a.diff.is_empty() {
                    vec!["(no changes)".to_string()]
                } else {
                    coloured(&a.diff)
                };
                (format!("diff of attempt {}", a.index), lines)
            }
            View::Check => {
                let lines = match &a.check {
                    None => vec!["(no --check)".to_string()],
                    Some(c) if c.output.is_empty() => vec![c.summary.clone()],
                    Some(c) => c
                        .output
                        .lines()
                        .map(|l| {
                            shade_fusefs::quote::visible_controls(&expand_tabs(l)).into_owned()
                        })
                        .collect(),
                };
                (format!("check output of attempt {}", a.index), lines)
            }
            View::Compare => match self.marked {
                Some(m) => {
                    let base = &self.attempts[self.order[m]];
                    let d = compare(base, a);
                    let lines = if d.is_empty() {
                        vec!["(the same files)".to_string()]
                    } else {
                        coloured(&d)
                    };
                    (
                        format!("attempt {} → attempt {}", base.index, a.index),
                        lines,
                    )
                }
                None => (
                    "compare".into(),
                    vec!["press m on an attempt to compare the others with it".into()],
                ),
            },
        }
    }

    fn draw(&mut self, w: usize, h: usize) -> std::io::Result<()> {
        let n = self.order.len();
        let list_h = n.min(h.saturating_sub(4) / 2).max(1);
        let body_h = h.saturating_sub(list_h + 3);
        let passed = self.attempts.iter().filter(|a| a.passed()).count();
        let mut rows = vec![format!(
            "\x1b[1mshade exec --attempts\x1b[0m: {n} attempts, {passed} passed, best first"
        )];
        let top = self.cursor.saturating_sub(list_h.saturating_sub(1));
        for r in top..(top + list_h).min(n) {
            let a = &self.attempts[self.order[r]];
            let mark = if self.marked == Some(r) { "*" } else { " " };
            let ok = if a.passed() {
                "\x1b[32m✓\x1b[0m"
            } else {
                "\x1b[31m✗\x1b[0m"
            };
            let line = format!("{}. {}", r + 1, one_line(a));
            rows.push(if r == self.cursor {
                format!("\x1b[7m>{mark}{line}\x1b[0m {ok}")
            } else {
                format!(" {mark}{line} {ok}")
            });
        }
        while rows.len() < 1 + list_h {
            rows.push(String::new());
        }
        let (title, lines) = self.body();
        self.scroll = self.scroll.min(lines.len().saturating_sub(body_h));
        rows.push(format!("\x1b[2m── {title} ──\x1b[0m"));
        rows.extend(lines.into_iter().skip(self.scroll).take(body_h));
        paint(rows, self.footer(), w, h)
    }

    fn footer(&self) -> String {
        if self.confirm_drop {
            return "\x1b[1mdrop every attempt? the project stays as it is\x1b[0m  y drop · any other key: back".into();
        }
        if let Some(m) = &self.message {
            return format!("\x1b[33m{m}\x1b[0m");
        }
        "↑↓/jk move  Tab diff/check/compare  m mark to compare  Enter review this one  d/q/Esc drop all (asks)"
            .into()
    }
}
