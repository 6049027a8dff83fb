//! The model's answer as styled terminal text: Markdown is what models write, and `**bold**`
//! or code fences printed literally are noise to a person at a terminal. Only for a terminal
//! that wants colour; pipes, `--json` and recordings keep the raw text.

mod highlight;
mod line;
mod stream;

pub(crate) use stream::{Screen, Stream};

/// Should answers on stdout be rendered? Only on a terminal, and not when the user asked for
/// plain text (`NO_COLOR` set and not empty, `TERM=dumb` or no `TERM`).
pub(crate) fn wanted() -> bool {
    use std::io::IsTerminal;
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    let dumb = std::env::var("TERM").map_or(true, |t| t.is_empty() || t == "dumb");
    std::io::stdout().is_terminal() && !no_color && !dumb
}

#[cfg(test)]
mod tests;
