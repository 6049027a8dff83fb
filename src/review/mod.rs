//! `shade run --review`: after the command ends, a person reviews what it changed in a small
//! terminal UI — the changed paths, the diff of the one under the cursor — and accepts all of
//! it, the files they pick, or nothing. The accept is the same all-or-nothing, conflict-checked
//! one as `--accept`, of the picked part of the branch (see `shade_fusefs::Selection` for which
//! changes come only together).

pub(crate) mod conflicts;
pub(crate) mod render;

use crate::exit;
use crossterm::event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use crossterm::style::Print;
use crossterm::terminal::{self, ClearType};
use crossterm::{cursor, queue};
use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
use shade_fusefs::outside::OutsideChanges;
use shade_fusefs::quote::quote_path;
use shade_fusefs::{
    AcceptError, AcceptFlags, Branch, Change, ChangeKind, Changeset, Conflict, Selection,
};
use std::collections::HashSet;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;
use unicode_width::UnicodeWidthChar;

/// Why `--review` cannot run here, if it cannot: it needs a person at a terminal. Asked before
/// the command runs, so an agent session is not spent for a review no one can do.
pub(crate) fn unavailable() -> Option<&'static str> {
    (!std::io::stdin().is_terminal() || !std::io::stdout().is_terminal()).then_some(
        "--review needs a terminal (stdin and stdout); use --diff to see the changes or --accept to take them",
    )
}

/// Review `changes` of `branch` (the command has ended: `ended` says how) and accept what the
/// person picks. Returns shade's exit status: `code` (the command's) unless an accept was
/// refused for conflicts (124, nothing written) or failed (125).
pub(crate) fn review(
    branch: Branch,
    changes: Changeset,
    outside: Outside,
    flags: AcceptFlags,
    ended: &str,
    code: i32,
) -> i32 {
    if changes.is_empty() && outside.changes.is_empty() {
        say(format_args!("shade: no changes ({ended})"));
        return code;
    }
    // Installed before and kept until after the branch is gone (accepted or dropped inside).
    let _signals = Signals::install();
    review_branch(branch, changes, outside, flags, ended, code)
}

/// The writes outside the project a review offers, each unpicked unless `keep` names it.
pub(crate) struct Outside {
    pub changes: OutsideChanges,
    /// Paths (or prefixes) picked to start with (`--keep-outside`, `[outside] keep`).
    pub keep: Vec<PathBuf>,
}

/// Keep the picked outside paths of `ui` (before the project's accept, which takes the
/// branch and its layer); `Err(exit status)` when refused or failed (said on stderr).
fn keep_picked(ui: &mut Review) -> Result<(), i32> {
    let keep = ui.outside_keep();
    if keep.is_empty() {
        return Ok(());
    }
    match ui.outside.keep(&keep, &shade_fusefs::StateDir::from_env()) {
        Ok(r) => {
            if let Some(note) = r.accept.privileges_note() {
                say(format_args!("shade: {note}"));
            }
            crate::outside::report_kept(&r.kept, false);
            Ok(())
        }
        Err(e) => {
            crate::outside::report_refused(&e);
            Err(match e {
                shade_fusefs::outside::KeepError::Conflicts(_)
                | shade_fusefs::outside::KeepError::Refused { .. }
                | shade_fusefs::outside::KeepError::Accept(AcceptError::Conflicts(_)) => {
                    exit::CONFLICT
                }
                _ => exit::SHADE_ERROR,
            })
        }
    }
}

/// [`review`] once its signal handlers are in place; `branch` is unmounted when this returns.
fn review_branch(
    branch: Branch,
    changes: Changeset,
    outside: Outside,
    flags: AcceptFlags,
    ended: &str,
    code: i32,
) -> i32 {
    let n = changes.changes.len();
    let project = branch.project().to_path_buf();
    let mut ui = Review::new(&branch, changes, outside, ended);
    let choice = match Screen::open() {
        Ok(screen) => {
            let choice = ui.run(&branch, flags);
            drop(screen);
            choice
        }
        Err(e) => {
            say(format_args!("shade: cannot use the terminal for the review ({e}); dropped {}, the project is unchanged", plural(n)));
            return exit::SHADE_ERROR;
        }
    };
    match choice {
        Choice::Signal(sig) => {
            say(format_args!(
                "shade: interrupted by signal {sig}; dropped {}, the project is unchanged",
                plural(n)
            ));
            128 + sig
        }
        Choice::Drop => {
            let refused = ui
                .refused
                .as_ref()
                .inspect(|list| report_conflicts(list, &project));
            say(format_args!(
                "shade: dropped {}; the project is unchanged",
                plural(n)
            ));
            if refused.is_some() {
                exit::CONFLICT
            } else {
                code
            }
        }
        Choice::Failed(e @ AcceptError::Owner { .. }) => {
            say(format_args!("shade: {e}"));
            exit::CONFLICT
        }
        Choice::Failed(e) => {
            say(format_args!(
                "shade: accept failed, the project is unchanged: {e}"
            ));
            exit::SHADE_ERROR
        }
        Choice::Accept => {
            if let Err(status) = keep_picked(&mut ui) {
                say(format_args!(
                    "shade: nothing accepted; dropped {}, the project is unchanged",
                    plural(n)
                ));
                return status;
            }
            let sel = ui.sel;
            let k = sel.picked_count();
            if k == 0 {
                drop(branch);
                say(format_args!(
                    "shade: dropped {}; the project is unchanged",
                    plural(n)
                ));
                return code;
            }
            let result = branch.accept_selected(flags, &sel);
            if let Some(note) = result.as_ref().ok().and_then(|r| r.privileges_note()) {
                say(format_args!("shade: {note}"));
            }
            match result {
                Ok(_) if k == n => {
                    say(format_args!("shade: accepted {}", plural(n)));
                    code
                }
                Ok(_) => {
                    say(format_args!(
                        "shade: accepted {k} of {}; {} dropped",
                        plural(n),
                        n - k
                    ));
                    code
                }
                Err(AcceptError::Conflicts(list)) => {
                    report_conflicts(&list, &project);
                    exit::CONFLICT
                }
                Err(e @ AcceptError::Owner { .. }) => {
                    say(format_args!("shade: {e}"));
                    exit::CONFLICT
                }
                Err(e) => {
                    say(format_args!(
                        "shade: accept failed, the project is unchanged: {e}"
                    ));
                    exit::SHADE_ERROR
                }
            }
        }
    }
}

/// One line on stderr. The terminal may be gone by now (closed during the review), and a
/// failed write must not panic while the branch is still mounted, as `eprintln!` would.
fn say(line: std::fmt::Arguments) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// The conflicts an accept was refused for, as `shade run --accept` lists them.
fn report_conflicts(list: &[Conflict], project: &std::path::Path) {
    say(format_args!(
        "shade: not accepted: {} changed in {} since the branch read them:",
        if list.len() == 1 {
            "1 path".to_string()
        } else {
            format!("{} paths", list.len())
        },
        quote_path(project)
    ));
    for c in list {
        say(format_args!(
            "  {}",
            crate::review::conflicts::conflict_line(c)
        ));
    }
}

/// SIGINT, SIGTERM or SIGHUP (the terminal closed) during the review. Only shade's main
/// thread blocks them, so without a handler one would take the default action in a FUSE
/// thread and kill shade with the branch still mounted; with it, the review drops the
/// branch and unmounts.
static SIGNALLED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNALLED.store(sig, Ordering::SeqCst);
}

/// Our handlers while the review runs; the earlier dispositions come back on drop.
pub(crate) struct Signals(Vec<(Signal, SigAction)>);

impl Signals {
    pub(crate) fn install() -> Signals {
        let action = SigAction::new(
            SigHandler::Handler(on_signal),
            SaFlags::SA_RESTART,
            SigSet::empty(),
        );
        let mut saved = Vec::new();
        for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
            // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
            match unsafe { sigaction(sig, &action) } {
                Ok(old) => saved.push((sig, old)),
                Err(e) => tracing::warn!("cannot handle {sig} during the review: {e}"),
            }
        }
        Signals(saved)
    }

    pub(crate) fn received() -> Option<i32> {
        match SIGNALLED.load(Ordering::SeqCst) {
            0 => None,
            sig => Some(sig),
        }
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        for (sig, old) in self.0.drain(..) {
            // SAFETY: reinstating the disposition that was there before the review.
            let _ = unsafe { sigaction(sig, &old) };
        }
    }
}

fn plural(n: usize) -> String {
    format!("{n} change{}", if n == 1 { "" } else { "s" })
}

/// How the review ended.
enum Choice {
    /// Accept the picked changes (checked just before: no conflicts then).
    Accept,
    Drop,
    /// A termination signal arrived: drop.
    Signal(i32),
    /// The pre-accept check failed for a reason other than conflicts; nothing was written.
    Failed(AcceptError),
}

/// The terminal while the review shows: raw mode, the alternate screen, no cursor. Restored
/// when dropped — also when the review panics.
pub(crate) struct Screen;

impl Screen {
    pub(crate) fn open() -> std::io::Result<Screen> {
        terminal::enable_raw_mode()?;
        let screen = Screen;
        let mut out = std::io::stdout();
        queue!(out, terminal::EnterAlternateScreen, cursor::Hide)?;
        out.flush()?;
        Ok(screen)
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let mut out = std::io::stdout();
        let _ = queue!(out, cursor::Show, terminal::LeaveAlternateScreen);
        let _ = out.flush();
        let _ = terminal::disable_raw_mode();
    }
}

/// The review's state.
struct Review {
    sel: Selection,
    ended: String,
    cursor: usize,
    /// First change shown in the list.
    top: usize,
    /// First diff line shown.
    scroll: usize,
    /// Each change's diff as lines, made when first shown.
    diffs: Vec<Option<Vec<String>>>,
    /// The footer's message until the next key.
    message: Option<String>,
    /// Asking "drop everything?".
    confirm_drop: bool,
    /// Paths an accept was refused for (marked in the list).
    conflicts: HashSet<PathBuf>,
    /// The last refusal, when nothing has been accepted since.
    refused: Option<Vec<Conflict>>,
    /// Writes outside the project, listed after the project's changes.
    outside: OutsideChanges,
    /// Which of them are picked to keep (none unless the command line or config said).
    outside_picked: Vec<bool>,
    outside_diffs: Vec<Option<Vec<String>>>,
    /// The home, shown as `~`.
    home: Option<PathBuf>,
}

impl Review {
    fn new(branch: &Branch, changes: Changeset, outside: Outside, ended: &str) -> Review {
        let n = changes.changes.len();
        let m = outside.changes.changes.len();
        let prepicked = outside.changes.selected(&outside.keep);
        let outside_picked = (0..m).map(|i| prepicked.contains(&i)).collect();
        Review {
            outside: outside.changes,
            outside_picked,
            outside_diffs: vec![None; m],
            home: shade_fusefs::outside::home_dir(),
            sel: branch.selection(changes),
            ended: shade_fusefs::quote::visible_controls(ended).into_owned(),
            cursor: 0,
            top: 0,
            scroll: 0,
            diffs: vec![None; n],
            message: None,
            confirm_drop: false,
            conflicts: HashSet::new(),
            refused: None,
        }
    }

    fn run(&mut self, branch: &Branch, flags: AcceptFlags) -> Choice {
        let mut dirty = true;
        loop {
            if let Some(sig) = Signals::received() {
                return Choice::Signal(sig);
            }
            let (w, h) = terminal::size().unwrap_or((80, 24));
            if dirty {
                if let Err(e) = self.draw(branch, w as usize, h as usize) {
                    tracing::warn!("drawing the review: {e}");
                    return Choice::Drop;
                }
                dirty = false;
            }
            match event::poll(Duration::ZERO) {
                Ok(true) => dirty = true,
                Ok(false) => {
                    // Wait for the terminal ourselves, in short steps to notice a signal:
                    // crossterm keeps reading a hung-up terminal's end of file forever.
                    match terminal_input(Duration::from_millis(100)) {
                        Input::Ready => {}
                        Input::Nothing => {}
                        Input::Gone => return Choice::Drop,
                    }
                    continue;
                }
                Err(_) => return Choice::Drop,
            }
            let key = match event::read() {
                Ok(Event::Key(k)) if k.kind != KeyEventKind::Release => k,
                Ok(_) => continue,
                // The terminal went away: nothing can be reviewed, nothing is written.
                Err(_) => return Choice::Drop,
            };
            if let Some(choice) = self.key(key, branch, flags, h as usize) {
                return choice;
            }
        }
    }

    /// Project changes, then outside ones: the rows of the list.
    fn total(&self) -> usize {
        self.sel.changes().len() + self.outside.changes.len()
    }

    /// The outside change at list row `i`, if that row is one.
    fn outside_at(&self, i: usize) -> Option<usize> {
        i.checked_sub(self.sel.changes().len())
            .filter(|j| *j < self.outside.changes.len())
    }

    /// The picked outside paths.
    fn outside_keep(&self) -> Vec<PathBuf> {
        self.outside
            .changes
            .iter()
            .zip(&self.outside_picked)
            .filter(|(_, p)| **p)
            .map(|(c, _)| c.path.clone())
            .collect()
    }

    fn outside_picked_count(&self) -> usize {
        self.outside_picked.iter().filter(|p| **p).count()
    }

    /// Lines of the list and of the diff for a `h`-row terminal.
    fn layout(&self, h: usize) -> (usize, usize) {
        let n = self.total();
        let list = n.min((h.saturating_sub(4) / 3).max(3)).max(1);
        let diff = h.saturating_sub(list + 3);
        (list, diff)
    }

    fn key(
        &mut self,
        key: KeyEvent,
        branch: &Branch,
        flags: AcceptFlags,
        h: usize,
    ) -> Option<Choice> {
        let n = self.total();
        let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
        if ctrl && matches!(key.code, KeyCode::Char('c')) {
            return Some(Choice::Drop);
        }
        self.message = None;
        if self.confirm_drop {
            self.confirm_drop = false;
            return match key.code {
                KeyCode::Char('y' | 'Y' | 'd') => Some(Choice::Drop),
                _ => None,
            };
        }
        let (list_h, diff_h) = self.layout(h);
        match key.code {
            KeyCode::Up | KeyCode::Char('k') => self.go(self.cursor.saturating_sub(1), list_h),
            KeyCode::Down | KeyCode::Char('j') => self.go((self.cursor + 1).min(n - 1), list_h),
            KeyCode::Home | KeyCode::Char('g') => self.go(0, list_h),
            KeyCode::End | KeyCode::Char('G') => self.go(n - 1, list_h),
            KeyCode::PageDown => self.scroll += diff_h.max(1),
            KeyCode::PageUp => self.scroll = self.scroll.saturating_sub(diff_h.max(1)),
            KeyCode::Char(' ') if self.outside_at(self.cursor).is_some() => {
                if let Some(j) = self.outside_at(self.cursor) {
                    self.outside_picked[j] = !self.outside_picked[j];
                }
            }
            KeyCode::Char(' ') => {
                let on = !self.sel.is_picked(self.cursor);
                let also = self.sel.set(self.cursor, on);
                if !also.is_empty() {
                    let names: Vec<String> = also
                        .iter()
                        .map(|&i| self.sel.changes()[i].to_string())
                        .collect();
                    self.message = Some(format!(
                        "also {}: {}",
                        if on { "picked" } else { "unpicked" },
                        names.join(", ")
                    ));
                }
            }
            KeyCode::Char('a') => {
                self.sel.set_all(true);
                return self.try_accept(branch, flags);
            }
            KeyCode::Enter if self.sel.picked_count() == 0 && self.outside_picked_count() == 0 => {
                self.confirm_drop = true;
            }
            KeyCode::Enter => return self.try_accept(branch, flags),
            KeyCode::Char('d' | 'q') | KeyCode::Esc => self.confirm_drop = true,
            _ => {}
        }
        None
    }

    fn go(&mut self, to: usize, list_h: usize) {
        if to != self.cursor {
            self.cursor = to;
            self.scroll = 0;
        }
        if self.cursor < self.top {
            self.top = self.cursor;
        } else if self.cursor >= self.top + list_h {
            self.top = self.cursor + 1 - list_h;
        }
    }

    /// Check the picked part against the project now: on conflicts stay and mark them, so
    /// the person can unpick them (or drop); the accept itself checks again.
    fn try_accept(&mut self, branch: &Branch, flags: AcceptFlags) -> Option<Choice> {
        if let Err(e) = self.outside.check_keep(&self.outside_keep()) {
            let text = match &e {
                shade_fusefs::outside::KeepError::Conflicts(list) => format!(
                    "not kept, nothing written: changed on the host meanwhile: {} — unpick (space) and Enter, or d to drop",
                    list.iter()
                        .map(|c| shade_fusefs::outside::display_path(&c.path, self.home.as_deref()))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                other => format!("not kept, nothing written: {other} — unpick it (space)"),
            };
            self.message = Some(shade_fusefs::quote::visible_controls(&text).into_owned());
            return None;
        }
        match branch.check_accept_selected(flags, &self.sel) {
            Ok(()) => Some(Choice::Accept),
            Err(AcceptError::Conflicts(list)) => {
                self.conflicts = list.iter().map(|c| c.path.clone()).collect();
                let shown: Vec<String> = list
                    .iter()
                    .map(|c| quote_path(&c.path).into_owned())
                    .collect();
                self.message = Some(format!(
                    "not accepted, nothing written: changed in the project meanwhile: {} — unpick (space) and Enter, or d to drop",
                    shown.join(", ")
                ));
                self.refused = Some(list);
                None
            }
            Err(e) => Some(Choice::Failed(e)),
        }
    }

    fn diff_lines(&mut self, branch: &Branch, i: usize) -> &[String] {
        if let Some(j) = self.outside_at(i) {
            let c = &self.outside.changes[j];
            let home = self.home.as_deref();
            return self.outside_diffs[j].get_or_insert_with(|| {
                c.diff(home)
                    .lines()
                    .filter(|l| !l.starts_with("diff --shade-outside "))
                    .map(|l| render::colour_diff_line(&expand_tabs(l)))
                    .collect()
            });
        }
        let c = &self.sel.changes()[i];
        let slot = &mut self.diffs[i];
        slot.get_or_insert_with(|| {
            let text = branch.diff(&Changeset {
                changes: vec![c.clone()],
            });
            if text.is_empty() {
                vec![no_diff(c)]
            } else {
                // The title above the diff names the file already.
                text.lines()
                    .filter(|l| !l.starts_with("diff --shade "))
                    .map(|l| render::colour_diff_line(&expand_tabs(l)))
                    .collect()
            }
        })
    }

    fn draw(&mut self, branch: &Branch, w: usize, h: usize) -> std::io::Result<()> {
        let (list_h, diff_h) = self.layout(h);
        let n = self.total();
        let np = self.sel.changes().len();
        let mut rows: Vec<String> = Vec::with_capacity(h);
        let outside = if self.outside.is_empty() {
            String::new()
        } else {
            format!(
                "; outside the project: {} kept of {}",
                self.outside_picked_count(),
                self.outside.changes.len()
            )
        };
        rows.push(format!(
            "\x1b[1mshade run --review\x1b[0m: {} picked of {}{outside} ({})",
            self.sel.picked_count(),
            plural(np),
            self.ended
        ));
        for i in self.top..(self.top + list_h).min(n) {
            if let Some(j) = self.outside_at(i) {
                let mark = if self.outside_picked[j] { "[x]" } else { "[ ]" };
                let line = format!(
                    "outside: {}",
                    self.outside.changes[j].line(self.home.as_deref())
                );
                rows.push(if i == self.cursor {
                    format!("\x1b[7m> {mark} {line}\x1b[0m")
                } else {
                    format!("  {mark} {line}")
                });
                continue;
            }
            let c = &self.sel.changes()[i];
            let mark = if self.sel.is_picked(i) { "[x]" } else { "[ ]" };
            let here = i == self.cursor;
            let line = change_line(c);
            let conflict = if self.conflicts.contains(&c.path) {
                "  \x1b[31m! changed in the project meanwhile\x1b[0m"
            } else {
                ""
            };
            rows.push(if here {
                format!("\x1b[7m> {mark} {line}\x1b[0m{conflict}")
            } else {
                format!("  {mark} {line}{conflict}")
            });
        }
        while rows.len() < 1 + list_h {
            rows.push(String::new());
        }
        let cursor = self.cursor;
        let title = match self.outside_at(cursor) {
            Some(j) => format!(
                "outside: {}",
                self.outside.changes[j].line(self.home.as_deref())
            ),
            None => change_line(&self.sel.changes()[cursor]),
        };
        let diff_len = self.diff_lines(branch, cursor).len();
        self.scroll = self.scroll.min(diff_len.saturating_sub(diff_h));
        let more = if diff_len > diff_h {
            format!(
                " lines {}-{} of {diff_len} ",
                self.scroll + 1,
                (self.scroll + diff_h).min(diff_len)
            )
        } else {
            String::new()
        };
        rows.push(format!("\x1b[2m── {title} ──{more}\x1b[0m"));
        let scroll = self.scroll;
        let diff = self.diff_lines(branch, cursor);
        rows.extend(diff.iter().skip(scroll).take(diff_h).cloned());
        paint(rows, self.footer(), w, h)
    }

    fn footer(&self) -> String {
        if self.confirm_drop {
            return format!(
                "\x1b[1mdrop all {}? the project stays as it is\x1b[0m  y drop · any other key: back",
                plural(self.total())
            );
        }
        if let Some(m) = &self.message {
            return format!("\x1b[33m{m}\x1b[0m");
        }
        "↑↓/jk move  space pick  Enter accept picked  a accept all  d/q/Esc drop (asks)  PgUp/PgDn scroll"
            .into()
    }
}

/// What the terminal has for us.
pub(crate) enum Input {
    Ready,
    Nothing,
    /// Hung up (closed) or unusable: no one is there to review.
    Gone,
}

/// Wait up to `timeout` for input on stdin (the terminal crossterm reads).
pub(crate) fn terminal_input(timeout: Duration) -> Input {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let stdin = std::io::stdin();
    let mut fds = [PollFd::new(stdin.as_fd(), PollFlags::POLLIN)];
    let ms = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX);
    match poll(&mut fds, ms) {
        Ok(0) => Input::Nothing,
        Ok(_) => {
            let got = fds[0].revents().unwrap_or(PollFlags::empty());
            if got.intersects(PollFlags::POLLHUP | PollFlags::POLLERR | PollFlags::POLLNVAL) {
                Input::Gone
            } else {
                Input::Ready
            }
        }
        Err(nix::errno::Errno::EINTR) => Input::Nothing,
        Err(_) => Input::Gone,
    }
}

/// A change as the list shows it: its `git status`-like line, names quoted.
fn change_line(c: &Change) -> String {
    c.to_string()
}

/// What to show for a change whose diff is empty (directories, renames, metadata).
fn no_diff(c: &Change) -> String {
    let what = match (c.kind, c.is_dir) {
        (ChangeKind::Added, true) => "a new, empty directory",
        (ChangeKind::Deleted, true) => "the directory and everything in it is deleted",
        (ChangeKind::Renamed, true) => "the directory is moved with what it holds",
        (ChangeKind::Modified, true) => "the directory's mode, owner or attributes changed",
        (ChangeKind::Renamed, false) => "renamed; the content is unchanged",
        (ChangeKind::Added, false) => "a new, empty file",
        (ChangeKind::Deleted, false) => "an empty file is deleted",
        (ChangeKind::Modified, false) => {
            "mode, times or attributes changed; the content is unchanged"
        }
    };
    let from = match &c.old_path {
        Some(old) => format!(" (from {})", quote_path(old)),
        None => String::new(),
    };
    format!("\x1b[2m{what}{from}\x1b[0m")
}

/// Tabs as spaces to the next multiple of 8, so a line's width is known.
pub(crate) fn expand_tabs(l: &str) -> String {
    if !l.contains('\t') {
        return l.to_string();
    }
    let mut out = String::with_capacity(l.len() + 8);
    let mut col = 0;
    for ch in l.chars() {
        if ch == '\t' {
            let n = 8 - col % 8;
            out.extend(std::iter::repeat_n(' ', n));
            col += n;
        } else {
            out.push(ch);
            col += ch.width().unwrap_or(0);
        }
    }
    out
}

/// Paint a full screen: `rows` from the top (cut or padded to all but the last line), then
/// `footer` on the last line, each cut to `w` columns. The review and the attempts' screen
/// draw this way.
pub(crate) fn paint(
    mut rows: Vec<String>,
    footer: String,
    w: usize,
    h: usize,
) -> std::io::Result<()> {
    rows.resize(h.saturating_sub(1), String::new());
    rows.push(footer);
    let mut out = std::io::stdout().lock();
    for (y, row) in rows.iter().enumerate() {
        queue!(
            out,
            cursor::MoveTo(0, y as u16),
            terminal::Clear(ClearType::CurrentLine),
            Print(fit(row, w)),
            Print("\x1b[0m")
        )?;
    }
    out.flush()
}

/// `s` cut to `w` columns; SGR escapes (`ESC [ … m`, the only ones the review makes) are
/// kept and take no room.
pub(crate) fn fit(s: &str, w: usize) -> String {
    let mut out = String::with_capacity(s.len());
    let mut col = 0;
    let mut chars = s.chars().peekable();
    while let Some(ch) = chars.next() {
        if ch == '\x1b' {
            out.push(ch);
            for c in chars.by_ref() {
                out.push(c);
                if c == 'm' {
                    break;
                }
            }
            continue;
        }
        let cw = ch.width().unwrap_or(0);
        if col + cw > w {
            // Skip the rest of the text but keep its escapes (they reset colours).
            continue;
        }
        col += cw;
        out.push(ch);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn fitting_keeps_escapes_and_counts_columns() {
        assert_eq!(
            super::fit("\x1b[32m+abcdef\x1b[0m", 4),
            "\x1b[32m+abc\x1b[0m"
        );
        assert_eq!(super::fit("日本語", 4), "日本");
        assert_eq!(super::expand_tabs("a\tb"), "a       b");
    }
}
