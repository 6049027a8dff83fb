//! Syntax colours for fenced code, by the fence's language, from syntect's bundled grammars
//! (the ones bat uses). Colours are xterm-256 ones, which every terminal that renders
//! Markdown here shows; the code's own characters are never changed.

use std::sync::OnceLock;

use syntect::easy::HighlightLines;
use syntect::highlighting::{Color, Theme, ThemeSet};
use syntect::parsing::SyntaxSet;

/// Loaded on the first code block (a few milliseconds), then shared.
fn syntaxes() -> &'static SyntaxSet {
    static SYNTAXES: OnceLock<SyntaxSet> = OnceLock::new();
    SYNTAXES.get_or_init(SyntaxSet::load_defaults_newlines)
}

/// A dark theme, to go with the code band's dark background.
fn theme() -> &'static Theme {
    static THEME: OnceLock<Theme> = OnceLock::new();
    THEME.get_or_init(|| {
        ThemeSet::load_defaults()
            .themes
            .remove("base16-ocean.dark")
            .unwrap_or_default()
    })
}

/// The colouring state of one code block (a string or comment can span lines).
pub(crate) struct Highlighter(HighlightLines<'static>);

impl Highlighter {
    /// For a fence's info string (`rust`, `py title=x`); None for a language not known.
    pub fn for_info(info: &str) -> Option<Highlighter> {
        let token = info
            .split(|c: char| c.is_whitespace() || c == ',' || c == '{')
            .next()
            .filter(|t| !t.is_empty())?;
        let syntax = syntaxes().find_syntax_by_token(token)?;
        Some(Highlighter(HighlightLines::new(syntax, theme())))
    }

    /// `line` with foreground colours around its pieces.
    pub fn line(&mut self, line: &str) -> String {
        let with_newline = format!("{line}\n");
        let Ok(pieces) = self.0.highlight_line(&with_newline, syntaxes()) else {
            return line.to_string();
        };
        let mut out = String::new();
        let mut current = None;
        for (style, text) in pieces {
            let text = text.strip_suffix('\n').unwrap_or(text);
            if text.is_empty() {
                continue;
            }
            let colour = xterm256(style.foreground);
            if current != Some(colour) {
                out.push_str(&format!("\x1b[38;5;{colour}m"));
                current = Some(colour);
            }
            out.push_str(text);
        }
        out
    }
}

/// The nearest colour of the xterm-256 palette (its 6×6×6 cube or its grey ramp).
fn xterm256(c: Color) -> u8 {
    const LEVELS: [u8; 6] = [0, 95, 135, 175, 215, 255];
    let step = |v: u8| match v {
        0..=47 => 0,
        48..=114 => 1,
        _ => (v - 35) / 40,
    };
    let (r, g, b) = (step(c.r), step(c.g), step(c.b));
    let distance = |x: (u8, u8, u8)| {
        let d = |a: u8, b: u8| (i32::from(a) - i32::from(b)).pow(2);
        d(x.0, c.r) + d(x.1, c.g) + d(x.2, c.b)
    };
    let cube = (
        LEVELS[usize::from(r)],
        LEVELS[usize::from(g)],
        LEVELS[usize::from(b)],
    );
    let average = ((u16::from(c.r) + u16::from(c.g) + u16::from(c.b)) / 3) as u8;
    let grey_step = (average.saturating_sub(3) / 10).min(23);
    let grey = 8 + 10 * grey_step;
    if distance((grey, grey, grey)) < distance(cube) {
        232 + grey_step
    } else {
        16 + 36 * r + 6 * g + b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn palette_colours_map_to_themselves() {
        let rgb = |r, g, b| Color { r, g, b, a: 255 };
        assert_eq!(xterm256(rgb(0, 0, 0)), 16);
        assert_eq!(xterm256(rgb(255, 255, 255)), 231);
        assert_eq!(xterm256(rgb(255, 0, 0)), 196);
        assert_eq!(xterm256(rgb(0x30, 0x30, 0x30)), 236);
        assert_eq!(xterm256(rgb(95, 135, 175)), 67);
    }

    #[test]
    fn known_languages_are_coloured_and_unknown_ones_not() {
        assert!(Highlighter::for_info("").is_none());
        assert!(Highlighter::for_info("no-such-language").is_none());
        let mut rust = Highlighter::for_info("rust title=\"x\"").unwrap();
        let line = rust.line("let s = \"hi\"; // note");
        let colours: std::collections::HashSet<&str> = line
            .split("\x1b[38;5;")
            .skip(1)
            .map(|p| &p[..p.find('m').unwrap_or(0)])
            .collect();
        assert!(colours.len() >= 3, "{line:?}");
    }
}
