//! Streaming without holding text back: the partial line is printed raw as it arrives, and
//! once its newline comes the line is taken back (carriage return, cursor up over the rows it
//! wrapped onto, clear) and printed styled. A line that has scrolled partly out of reach (more
//! rows than the screen) is left raw. A line that arrives whole is printed styled at once.

use super::line::{Blocks, Cursor};

/// The terminal's size, in character cells.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Screen {
    pub cols: usize,
    pub rows: usize,
}

impl Screen {
    /// The size of the terminal on stdout (80×24 when it cannot be read).
    pub fn of_stdout() -> Screen {
        let (cols, rows) = crossterm::terminal::size().unwrap_or((80, 24));
        Screen {
            cols: usize::from(cols).max(1),
            rows: usize::from(rows).max(1),
        }
    }
}

/// The answer being rendered.
#[derive(Default)]
pub(crate) struct Stream {
    blocks: Blocks,
    /// The current line so far (after the last newline).
    line: String,
    /// Bytes of `line` already on screen, raw.
    shown: usize,
}

impl Stream {
    /// What to write for the next piece of the answer.
    pub fn push(&mut self, text: &str, screen: Screen) -> String {
        let mut out = String::new();
        let mut rest = text;
        while let Some(i) = rest.find('\n') {
            self.line.push_str(&rest[..i]);
            self.complete(&mut out, screen);
            rest = &rest[i + 1..];
        }
        if !rest.is_empty() {
            out.push_str(rest);
            self.line.push_str(rest);
            self.shown = self.line.len();
        }
        out
    }

    /// Is a partial line on screen?
    pub fn mid_line(&self) -> bool {
        !self.line.is_empty()
    }

    /// End the partial line (the answer stopped without a newline): what to write.
    pub fn finish(&mut self, screen: Screen) -> String {
        let mut out = String::new();
        if self.mid_line() {
            self.complete(&mut out, screen);
        }
        out
    }

    /// A new answer begins: forget an unclosed code block.
    pub fn reset(&mut self) {
        self.blocks = Blocks::default();
    }

    fn complete(&mut self, out: &mut String, screen: Screen) {
        let line = std::mem::take(&mut self.line);
        let shown = std::mem::take(&mut self.shown);
        // (A carriage return at the end would take the styled line back to its start.)
        let styled = self
            .blocks
            .style(line.strip_suffix('\r').unwrap_or(&line), screen.cols);
        if shown > 0 {
            let rows = Cursor::after(&line[..shown], screen.cols).row + 1;
            if rows >= screen.rows {
                // Its first rows may have scrolled away: leave it as it is.
                out.push_str(&line[shown..]);
                out.push('\n');
                return;
            }
            if rows > 1 {
                out.push_str(&format!("\x1b[{}A", rows - 1));
            }
            out.push_str("\r\x1b[J");
        }
        out.push_str(&styled);
        out.push('\n');
    }
}
