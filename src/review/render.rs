//! How changes are shown: diffs coloured like `git diff`, and text from a branch made safe for
//! a terminal. Shared by the review screens, chat's questions and `run`'s summary.

use shade_fusefs::quote::visible_controls;
use shade_fusefs::Change;
use std::io::Write;

/// Red removals, green additions, like `git diff` on a terminal.
pub(crate) fn colour_diff(diff: &str) -> String {
    diff.lines().map(|l| colour_diff_line(l) + "\n").collect()
}

/// One line of a unified diff as [`colour_diff`] shows it (without its line feed); the
/// review of `shade run --review` lays diffs out line by line.
pub(crate) fn colour_diff_line(l: &str) -> String {
    // What the model wrote (and the names it chose) is shown, never obeyed.
    let l = visible_controls(l);
    if l.starts_with("+++") || l.starts_with("---") {
        format!("\x1b[1m{l}\x1b[0m")
    } else if l.starts_with('+') {
        format!("\x1b[32m{l}\x1b[0m")
    } else if l.starts_with('-') {
        format!("\x1b[31m{l}\x1b[0m")
    } else if l.starts_with("@@") {
        format!("\x1b[36m{l}\x1b[0m")
    } else {
        l.into_owned()
    }
}

/// Text shade prints on stdout that came from elsewhere (a branch's contents): with its
/// control characters made visible when stdout is a terminal, unchanged for a pipe or file.
pub(crate) fn for_stdout(text: &str) -> std::borrow::Cow<'_, str> {
    use std::io::IsTerminal;
    if std::io::stdout().is_terminal() {
        visible_controls(text)
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

pub(crate) fn print_changes(changes: &[Change]) {
    let mut err = std::io::stderr().lock();
    for c in changes {
        let _ = writeln!(err, "{c}");
    }
}
