//! One complete line of Markdown to text with SGR styles. Lines come one at a time (the
//! answer streams), so the one block that spans lines and changes how they read — a fenced
//! code block — is tracked here; everything else is parsed line by line with pulldown-cmark.

use pulldown_cmark::{Event, HeadingLevel, LinkType, Options, Parser, Tag, TagEnd};
use unicode_width::UnicodeWidthChar;

use super::highlight::Highlighter;

const RESET: &str = "\x1b[0m";
/// Code blocks: light grey on dark grey, both set so they read on light and dark themes.
const CODE_BLOCK: &str = "\x1b[38;5;252;48;5;236m";
const INLINE_CODE: &str = "36";
const LINK: &str = "34";
const HEADING: &str = "35";

/// An open code fence: its character and length (a closing fence needs at least as many).
struct Fence {
    ch: char,
    len: usize,
    /// Colours for the block's language, when known.
    colours: Option<Highlighter>,
}

/// What the lines seen so far leave open.
#[derive(Default)]
pub(crate) struct Blocks {
    fence: Option<Fence>,
}

impl Blocks {
    /// The styled form of `line` (no newline); `cols` is the terminal's width.
    pub fn style(&mut self, line: &str, cols: usize) -> String {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        if let Some(open) = &mut self.fence {
            if closes(trimmed, open) {
                self.fence = None;
                return band(indent, "", cols);
            }
            // Code stays exactly as written: only colours around it.
            return match &mut open.colours {
                Some(colours) => band("", &colours.line(line), cols),
                None => band("", line, cols),
            };
        }
        if let Some(mut fence) = opens(trimmed) {
            let info = trimmed[fence.len * fence.ch.len_utf8()..].trim();
            fence.colours = Highlighter::for_info(info);
            self.fence = Some(fence);
            return band(indent, &format!("\x1b[2m{info}\x1b[22m"), cols);
        }
        if trimmed.is_empty() {
            return String::new();
        }
        if trimmed.starts_with('|') && is_table_rule(trimmed) {
            return format!("{indent}\x1b[2m{trimmed}{RESET}");
        }
        match inline(trimmed, cols) {
            Some(styled) => format!("{indent}{styled}"),
            // Nothing to show (a link definition, say): the text as written.
            None => line.to_string(),
        }
    }
}

/// `text` on the code background, the background carried to the end of the row. (Erasing
/// at the last column of a full row would erase the character there, so not then.)
fn band(indent: &str, text: &str, cols: usize) -> String {
    let mut plain = indent.to_string();
    strip_sgr(text, &mut plain);
    let fill = if Cursor::after(&plain, cols).pending {
        ""
    } else {
        "\x1b[K"
    };
    format!("{indent}{CODE_BLOCK}{text}{fill}{RESET}")
}

pub(super) fn strip_sgr(text: &str, out: &mut String) {
    let mut in_escape = false;
    for ch in text.chars() {
        match (in_escape, ch) {
            (false, '\x1b') => in_escape = true,
            (false, c) => out.push(c),
            (true, 'm') => in_escape = false,
            (true, _) => {}
        }
    }
}

fn opens(trimmed: &str) -> Option<Fence> {
    let ch = trimmed.chars().next().filter(|c| *c == '`' || *c == '~')?;
    let len = trimmed.chars().take_while(|c| *c == ch).count();
    let info = &trimmed[len..];
    // A backtick fence's info string has no backtick (else it is inline code).
    (len >= 3 && !(ch == '`' && info.contains('`'))).then_some(Fence {
        ch,
        len,
        colours: None,
    })
}

fn closes(trimmed: &str, open: &Fence) -> bool {
    let len = trimmed.chars().take_while(|c| *c == open.ch).count();
    len >= open.len && trimmed[len * open.ch.len_utf8()..].trim().is_empty()
}

/// `|---|:--:|`: the line under a table's header.
fn is_table_rule(trimmed: &str) -> bool {
    trimmed.contains('-') && trimmed.chars().all(|c| matches!(c, '|' | '-' | ':' | ' '))
}

/// One line without its indentation, rendered from pulldown-cmark's events; None when it
/// shows nothing.
fn inline(text: &str, cols: usize) -> Option<String> {
    let options = Options::ENABLE_STRIKETHROUGH | Options::ENABLE_TASKLISTS;
    let mut out = String::new();
    let mut visible = false;
    let mut bold = 0usize;
    // The foreground colour to go back to after inline code or a link.
    let mut colour: Option<&str> = None;
    let mut ordered: Option<u64> = None;
    let mut links: Vec<(String, LinkType, usize)> = Vec::new();
    for event in Parser::new_ext(text, options) {
        match event {
            Event::Start(tag) => match tag {
                Tag::Heading { level, .. } => {
                    bold += 1;
                    out.push_str("\x1b[1m");
                    if matches!(level, HeadingLevel::H1 | HeadingLevel::H2) {
                        colour = Some(HEADING);
                        out.push_str(&format!("\x1b[{HEADING}m"));
                    }
                }
                Tag::List(start) => ordered = start,
                Tag::Item => {
                    visible = true;
                    match ordered {
                        Some(n) => out.push_str(&format!("{n}. ")),
                        None => out.push_str("\x1b[1m•\x1b[22m "),
                    }
                }
                Tag::BlockQuote(_) => {
                    visible = true;
                    out.push_str("\x1b[2m│\x1b[22m ");
                }
                Tag::Strong => {
                    bold += 1;
                    out.push_str("\x1b[1m");
                }
                Tag::Emphasis => out.push_str("\x1b[3m"),
                Tag::Strikethrough => out.push_str("\x1b[9m"),
                Tag::Link {
                    link_type,
                    dest_url,
                    ..
                }
                | Tag::Image {
                    link_type,
                    dest_url,
                    ..
                } => {
                    links.push((dest_url.to_string(), link_type, out.len()));
                    out.push_str(&format!("\x1b[4;{LINK}m"));
                }
                _ => {}
            },
            Event::End(tag) => match tag {
                TagEnd::Heading(_) => {
                    out.push_str(RESET);
                    bold = 0;
                    colour = None;
                }
                TagEnd::Strong => {
                    bold = bold.saturating_sub(1);
                    if bold == 0 {
                        out.push_str("\x1b[22m");
                    }
                }
                TagEnd::Emphasis => out.push_str("\x1b[23m"),
                TagEnd::Strikethrough => out.push_str("\x1b[29m"),
                TagEnd::Link | TagEnd::Image => {
                    out.push_str("\x1b[24m");
                    restore_colour(&mut out, colour);
                    if let Some((url, kind, start)) = links.pop() {
                        let mut shown = String::new();
                        strip_sgr(&out[start..], &mut shown);
                        let bare = matches!(kind, LinkType::Autolink | LinkType::Email);
                        if !bare && shown != url && !url.is_empty() {
                            out.push_str(&format!(" \x1b[2m({url})\x1b[22m"));
                            if bold > 0 {
                                out.push_str("\x1b[1m");
                            }
                        }
                    }
                }
                _ => {}
            },
            Event::Code(code) => {
                visible = true;
                out.push_str(&format!("\x1b[{INLINE_CODE}m{code}"));
                restore_colour(&mut out, colour);
            }
            Event::Text(t) | Event::Html(t) | Event::InlineHtml(t) => {
                visible |= !t.trim().is_empty();
                out.push_str(&t);
            }
            Event::SoftBreak | Event::HardBreak => out.push(' '),
            Event::Rule => {
                visible = true;
                out.push_str(&format!("\x1b[2m{}\x1b[22m", "─".repeat(cols.clamp(1, 60))));
            }
            Event::TaskListMarker(done) => {
                // Over the bullet the item already has.
                if out.ends_with("\x1b[1m•\x1b[22m ") {
                    out.truncate(out.len() - "\x1b[1m•\x1b[22m ".len());
                }
                out.push_str(if done { "☑ " } else { "☐ " });
            }
            _ => {}
        }
    }
    if !visible {
        return None;
    }
    if out.contains('\x1b') {
        out.push_str(RESET);
    }
    Some(out)
}

fn restore_colour(out: &mut String, colour: Option<&str>) {
    match colour {
        Some(c) => out.push_str(&format!("\x1b[{c}m")),
        None => out.push_str("\x1b[39m"),
    }
}

/// Where text written from the start of a row leaves the cursor, as a terminal with
/// automatic margins (xterm, tmux) places it.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Cursor {
    pub row: usize,
    pub col: usize,
    /// At the last column with the next character due on the next row.
    pub pending: bool,
}

impl Cursor {
    pub fn after(text: &str, cols: usize) -> Cursor {
        let cols = cols.max(1);
        let mut c = Cursor::default();
        for ch in text.chars() {
            if ch == '\t' {
                if !c.pending {
                    c.col = ((c.col / 8 + 1) * 8).min(cols - 1);
                }
                continue;
            }
            let w = ch.width().unwrap_or(0);
            if w == 0 {
                continue;
            }
            if c.pending || c.col + w > cols {
                c.row += 1;
                c.col = 0;
                c.pending = false;
            }
            if c.col + w >= cols {
                c.col = cols - 1;
                c.pending = true;
            } else {
                c.col += w;
            }
        }
        c
    }
}
