//! The renderer on model-like answers, streamed in awkward pieces, read back through a small
//! model of a terminal (automatic margins, CR, LF, cursor up, erase): whatever the pieces,
//! the screen must end as when every line arrived whole.
#![allow(clippy::unwrap_used)]

use super::line::Blocks;
use super::line::Cursor;
use super::stream::{Screen, Stream};
use unicode_width::UnicodeWidthChar;

const ANSWER: &str = "## Plan

I'll fix the **parser** in `src/lib.rs` and add a *small* test. See [the docs](https://docs.rs/x).

1. Read the *input*
2. Parse it
   - a nested item with `code`
- [ ] not done yet

> Note: this is **important**.

```rust
fn main() {
\tprintln!(\"**not bold** `x`\");
}
```

| name | value |
|------|-------|
| **x** | `y` |

---
Done — all 3 tests pass.
";

/// The terminal: rows of cells (a wide character's second cell is '\0').
struct Term {
    cols: usize,
    rows: Vec<Vec<char>>,
    row: usize,
    col: usize,
    pending: bool,
}

impl Term {
    fn new(cols: usize) -> Term {
        Term {
            cols,
            rows: vec![Vec::new()],
            row: 0,
            col: 0,
            pending: false,
        }
    }

    fn cell(&mut self, row: usize) -> &mut Vec<char> {
        while self.rows.len() <= row {
            self.rows.push(Vec::new());
        }
        &mut self.rows[row]
    }

    fn put(&mut self, ch: char, w: usize) {
        if self.pending || self.col + w > self.cols {
            self.row += 1;
            self.col = 0;
            self.pending = false;
        }
        let (row, col) = (self.row, self.col);
        let line = self.cell(row);
        while line.len() < col + w {
            line.push(' ');
        }
        line[col] = ch;
        if w == 2 {
            line[col + 1] = '\0';
        }
        if self.col + w >= self.cols {
            self.col = self.cols - 1;
            self.pending = true;
        } else {
            self.col += w;
        }
    }

    fn write(&mut self, s: &str) {
        let mut chars = s.chars().peekable();
        while let Some(ch) = chars.next() {
            match ch {
                '\r' => {
                    self.col = 0;
                    self.pending = false;
                }
                '\n' => {
                    self.row += 1;
                    self.col = 0;
                    self.pending = false;
                    self.cell(self.row);
                }
                '\t' => {
                    if !self.pending {
                        self.col = ((self.col / 8 + 1) * 8).min(self.cols - 1);
                    }
                }
                '\x1b' => {
                    assert_eq!(chars.next(), Some('['));
                    let mut arg = String::new();
                    let end = loop {
                        let c = chars.next().unwrap();
                        if c.is_ascii_alphabetic() {
                            break c;
                        }
                        arg.push(c);
                    };
                    match end {
                        'm' => {}
                        'A' => {
                            let n: usize = arg.parse().unwrap_or(1);
                            self.row = self.row.checked_sub(n).expect("cursor up past the top");
                            self.pending = false;
                        }
                        'K' => {
                            let (row, col) = (self.row, self.col);
                            self.cell(row).truncate(col);
                        }
                        'J' => {
                            let (row, col) = (self.row, self.col);
                            self.cell(row).truncate(col);
                            self.rows.truncate(row + 1);
                        }
                        other => panic!("unexpected escape {arg}{other}"),
                    }
                }
                c => {
                    let w = c.width().unwrap_or(0);
                    if w > 0 {
                        self.put(c, w);
                    }
                }
            }
        }
    }

    fn text(&self) -> String {
        let lines: Vec<String> = self
            .rows
            .iter()
            .map(|r| r.iter().filter(|c| **c != '\0').collect::<String>())
            .map(|l| l.trim_end().to_string())
            .collect();
        lines.join("\n").trim_end().to_string()
    }
}

fn screen(cols: usize) -> Screen {
    Screen { cols, rows: 40 }
}

/// Stream `pieces` and return what the terminal shows, and everything written.
fn stream(pieces: &[&str], screen: Screen) -> (String, String) {
    let mut md = Stream::default();
    let mut term = Term::new(screen.cols);
    let mut written = String::new();
    for p in pieces {
        let out = md.push(p, screen);
        term.write(&out);
        written.push_str(&out);
    }
    let out = md.finish(screen);
    term.write(&out);
    written.push_str(&out);
    (term.text(), written)
}

/// The answer in pieces of `n` characters.
fn every(text: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    chars.chunks(n).map(|c| c.iter().collect()).collect()
}

/// The answer word by word, as the fake model streams it.
fn words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let cut = rest[1..].find(' ').map(|i| i + 1).unwrap_or(rest.len());
        out.push(rest[..cut].to_string());
        rest = &rest[cut..];
    }
    out
}

fn styled_lines(text: &str) -> Vec<String> {
    let mut blocks = Blocks::default();
    text.lines().map(|l| blocks.style(l, 80)).collect()
}

fn plain(s: &str) -> String {
    let mut t = Term::new(1000);
    t.write(s);
    t.text()
}

#[test]
fn lines_are_styled_without_their_markup() {
    let lines = styled_lines(ANSWER);
    let shown: Vec<String> = lines.iter().map(|l| plain(l)).collect();
    assert_eq!(shown[0], "Plan");
    assert!(
        lines[0].contains("\x1b[1m"),
        "heading not bold: {:?}",
        lines[0]
    );
    assert_eq!(
        shown[2],
        "I'll fix the parser in src/lib.rs and add a small test. See the docs (https://docs.rs/x)."
    );
    assert!(lines[2].contains("\x1b[1mparser\x1b[22m"), "{:?}", lines[2]);
    assert!(lines[2].contains("\x1b[3msmall\x1b[23m"), "{:?}", lines[2]);
    assert!(
        lines[2].contains("\x1b[36msrc/lib.rs\x1b[39m"),
        "{:?}",
        lines[2]
    );
    assert_eq!(shown[4], "1. Read the input");
    assert_eq!(shown[5], "2. Parse it");
    assert_eq!(shown[6], "   • a nested item with code");
    assert_eq!(shown[7], "☐ not done yet");
    assert_eq!(shown[9], "│ Note: this is important.");
    // The fence shows its language, not its backticks; the code is exactly as written.
    assert_eq!(shown[11], "rust");
    let mut code = String::new();
    super::line::strip_sgr(&lines[13], &mut code);
    assert_eq!(code, "\tprintln!(\"**not bold** `x`\");");
    assert!(
        lines[13].starts_with("\x1b[38;5;252;48;5;236m"),
        "no band: {:?}",
        lines[13]
    );
    assert!(
        lines[13].matches("\x1b[38;5;").count() >= 3,
        "not highlighted: {:?}",
        lines[13]
    );
    assert!(lines[13].ends_with("\x1b[K\x1b[0m"), "{:?}", lines[13]);
    assert_eq!(shown[15], "");
    assert!(!shown.iter().any(|l| l.contains("```")));
    // Tables stay readable: cells in their pipes, the rule dim.
    assert_eq!(shown[17], "| name | value |");
    assert_eq!(shown[18], "|------|-------|");
    assert!(lines[18].starts_with("\x1b[2m"));
    assert_eq!(shown[19], "| x | y |");
    assert_eq!(shown[21], "─".repeat(60));
    assert_eq!(shown[22], "Done — all 3 tests pass.");
}

#[test]
fn a_fence_left_open_ends_with_the_answer() {
    let mut md = Stream::default();
    let out = md.push("```\n**code**\n", screen(80));
    assert!(plain(&out).contains("**code**"));
    md.reset();
    let out = md.push("**text**\n", screen(80));
    assert_eq!(plain(&out), "text");
}

#[test]
fn text_shows_as_it_arrives_and_a_finished_line_is_redrawn() {
    let mut md = Stream::default();
    let s = screen(80);
    // Mid-marker: out at once, raw.
    assert_eq!(md.push("I'll fix the **par", s), "I'll fix the **par");
    assert!(md.mid_line());
    let out = md.push("ser** now\nNext", s);
    assert!(
        out.starts_with("\r\x1b[JI'll fix the \x1b[1mparser\x1b[22m now"),
        "{out:?}"
    );
    assert!(out.ends_with("\nNext"), "{out:?}");
    // A line that arrives whole is never shown raw.
    let mut md = Stream::default();
    let out = md.push("**whole**\n", s);
    assert!(!out.contains('\r') && !out.contains("**"), "{out:?}");
}

#[test]
fn any_split_ends_with_the_same_screen() {
    for cols in [80, 37, 12] {
        let s = screen(cols);
        let (whole, _) = stream(&[ANSWER], s);
        assert!(
            !whole.contains("**parser**") && !whole.contains("```"),
            "{whole}"
        );
        let code_fits = cols == 80;
        assert!(
            !code_fits || whole.contains("println!(\"**not bold** `x`\");"),
            "{whole}"
        );
        for n in [1, 2, 3, 5, 7] {
            let pieces = every(ANSWER, n);
            let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
            let (split, _) = stream(&refs, s);
            assert_eq!(split, whole, "{cols} columns, pieces of {n}");
        }
        let pieces = words(ANSWER);
        let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
        assert_eq!(stream(&refs, s).0, whole, "{cols} columns, word by word");
    }
}

#[test]
fn crlf_line_ends_show_as_lf_ones() {
    let crlf = ANSWER.replace('\n', "\r\n");
    for cols in [80, 12] {
        let (whole, _) = stream(&[ANSWER], screen(cols));
        let pieces = words(&crlf);
        let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
        assert_eq!(stream(&refs, screen(cols)).0, whole, "{cols} columns");
    }
}

#[test]
fn a_line_taller_than_the_screen_is_left_raw() {
    let s = Screen { cols: 10, rows: 3 };
    let (shown, written) = stream(&["some **bold** words and ", "then **more** of them\n"], s);
    assert!(!written.contains("\x1b[J"), "{written:?}");
    let squeeze = |s: &str| s.split_whitespace().collect::<String>();
    assert_eq!(
        squeeze(&shown),
        squeeze("some **bold** words and then **more** of them")
    );
}

#[test]
fn the_cursor_model_knows_wrapping() {
    assert_eq!(Cursor::after("", 10), Cursor::default());
    let full = Cursor::after("0123456789", 10);
    assert_eq!((full.row, full.pending), (0, true));
    assert_eq!(Cursor::after("0123456789a", 10).row, 1);
    // A wide character that does not fit goes to the next row.
    assert_eq!(Cursor::after("012345678界", 10).row, 1);
    assert_eq!(Cursor::after("a\tb", 10).col, 9);
}
