//! Names and text made safe for a terminal. A file name is chosen by whoever wrote the tree
//! (a command in a branch, a model): `evil\e[2K\rM README.md` printed raw erases its own line
//! and shows a harmless `M README.md`, a newline splits one changeset line into two. What the
//! user reviews must be what happened, so every name shade prints goes through
//! [`quote_path`], and text from elsewhere through [`visible_controls`].
//!
//! The rule for names is git's C-style quoting (`core.quotePath`) with git's
//! `core.quotePath=false` view of Unicode: a name with nothing to escape is printed as it is;
//! otherwise it is put in double quotes with `\t \n \" \\ \a \b \f \r \v` and an octal `\ooo`
//! for every byte of: other control characters (ESC, DEL), C1 controls (U+0080–U+009F), the
//! bidirectional overrides and isolates (U+202A–U+202E, U+2066–U+2069) and bytes that are not
//! valid UTF-8. Printable non-ASCII characters stay readable.

use std::borrow::Cow;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// A character that may not reach a terminal raw: it moves the cursor, rewrites the screen
/// or reorders what is shown.
fn is_unsafe(c: char) -> bool {
    c.is_control() // C0, DEL and C1
        || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// `path` as shade prints it on a terminal: unchanged when safe, else quoted as git does (see
/// the module doc).
pub fn quote_path(path: &Path) -> Cow<'_, str> {
    quote_bytes(path.as_os_str().as_bytes())
}

/// [`quote_path`] for a name given as bytes.
pub fn quote_bytes(bytes: &[u8]) -> Cow<'_, str> {
    if let Ok(s) = std::str::from_utf8(bytes) {
        if !s.chars().any(|c| is_unsafe(c) || c == '"' || c == '\\') {
            return Cow::Borrowed(s);
        }
    }
    let mut out = String::from("\"");
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\u{7}' => out.push_str("\\a"),
                '\u{8}' => out.push_str("\\b"),
                '\t' => out.push_str("\\t"),
                '\n' => out.push_str("\\n"),
                '\u{b}' => out.push_str("\\v"),
                '\u{c}' => out.push_str("\\f"),
                '\r' => out.push_str("\\r"),
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                c if is_unsafe(c) => {
                    let mut buf = [0u8; 4];
                    for b in c.encode_utf8(&mut buf).bytes() {
                        out.push_str(&format!("\\{b:03o}"));
                    }
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\{b:03o}"));
        }
    }
    out.push('"');
    Cow::Owned(out)
}

/// Text from elsewhere (a model's answer, a tool's output) as it may reach a terminal: line
/// feeds and tabs stay, a carriage return before a line feed is dropped, every other control
/// or reordering character is shown instead of obeyed — C0 controls and DEL in caret
/// notation (`^[` for ESC, `^M`, `^?`), C1 controls and bidirectional overrides as `<U+202E>`.
pub fn visible_controls(text: &str) -> Cow<'_, str> {
    if !text.chars().any(|c| is_unsafe(c) && c != '\n' && c != '\t') {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\n' | '\t' => out.push(c),
            '\r' if chars.peek() == Some(&'\n') => {}
            c if (c as u32) < 0x20 => {
                out.push('^');
                out.push(char::from(b'@' + c as u8));
            }
            '\u{7f}' => out.push_str("^?"),
            c if is_unsafe(c) => out.push_str(&format!("<U+{:04X}>", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Text from elsewhere that must stay on one line (an MCP client's name, a command line kept
/// as an accept's origin): as [`visible_controls`], and line feeds, carriage returns and tabs
/// are shown too (`^J`, `^M`, `^I`), so it cannot start a line of its own — a forged entry of
/// `shade log`. Idempotent: what it returns holds nothing it would change.
pub fn visible_line(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_unsafe) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            c if (c as u32) < 0x20 => {
                out.push('^');
                out.push(char::from(b'@' + c as u8));
            }
            '\u{7f}' => out.push_str("^?"),
            c if is_unsafe(c) => out.push_str(&format!("<U+{:04X}>", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn names_are_quoted_like_git() {
        let q = |b: &[u8]| quote_path(Path::new(OsStr::from_bytes(b))).into_owned();
        assert_eq!(q(b"src/lib.rs"), "src/lib.rs");
        assert_eq!(q("café/ñ.txt".as_bytes()), "café/ñ.txt");
        assert_eq!(q(b"a b"), "a b");
        assert_eq!(
            q(b"evil\x1b[2K\rM README.md"),
            "\"evil\\033[2K\\rM README.md\""
        );
        assert_eq!(q(b"two\nlines"), "\"two\\nlines\"");
        assert_eq!(q(b"q\"b\\s\t"), "\"q\\\"b\\\\s\\t\"");
        assert_eq!(q(b"\x07\x08\x0b\x0c\x7f\x01"), "\"\\a\\b\\v\\f\\177\\001\"");
        assert_eq!(q(b"bad\xff\xfe"), "\"bad\\377\\376\"");
        assert_eq!(q("c1\u{9b}".as_bytes()), "\"c1\\302\\233\"");
        assert_eq!(
            q("rtl\u{202e}txt.exe".as_bytes()),
            "\"rtl\\342\\200\\256txt.exe\""
        );
        assert_eq!(q("iso\u{2066}".as_bytes()), "\"iso\\342\\201\\246\"");
    }

    #[test]
    fn text_shows_controls_instead_of_obeying_them() {
        assert_eq!(visible_controls("plain\ttext\n"), "plain\ttext\n");
        assert_eq!(visible_controls("a\r\nb"), "a\nb");
        assert_eq!(visible_controls("\x1b[2J\x1b[H fake"), "^[[2J^[[H fake");
        assert_eq!(visible_controls("x\ry\x7f\x00"), "x^My^?^@");
        assert_eq!(visible_controls("\u{9b}2J \u{202e}"), "<U+009B>2J <U+202E>");
        assert!(matches!(visible_controls("café ✓"), Cow::Borrowed(_)));
    }

    #[test]
    fn one_line_text_cannot_start_a_line() {
        let forged = "x\n0000-forged  2026-01-01\r\t\x1b[2K\u{202e}";
        let shown = visible_line(forged);
        assert_eq!(shown, "x^J0000-forged  2026-01-01^M^I^[[2K<U+202E>");
        assert_eq!(visible_line(&shown), shown, "idempotent");
        assert!(matches!(visible_line("mcp client café"), Cow::Borrowed(_)));
    }
}
