//! `sed`: read-only unless it edits in place (`-i`), takes its script from a file (`-f`), or
//! the script uses a command that runs a shell (`e`, `s///e`) or touches other files (`w`,
//! `W`, `s///w`, `r`, `R`). The script is parsed command by command (GNU syntax); anything
//! the parser does not recognise is refused.

use super::options::{fixed, long_is, options, Opt, OptSpec};
use super::words::Arg;
use super::Check;

pub(super) fn check(args: &[Arg]) -> Check {
    let args = fixed("sed", args)?;
    let spec = OptSpec {
        short_arg: "efl",
        short_optarg: "iI",
        long_arg: &["expression", "file", "line-length"],
    };
    let mut scripts = Vec::new();
    let mut operands = Vec::new();
    for o in options(&args, &spec) {
        match o {
            Opt::Short('i', _) => return Err("`sed -i` edits files in place".into()),
            // BSD sed's in-place flag; GNU sed rejects it, but no need to rely on that.
            Opt::Short('I', _) => return Err("`sed -I` edits files in place".into()),
            Opt::Long(n, _) if long_is(n, "in-place") => {
                return Err("`sed --in-place` edits files in place".into())
            }
            Opt::Short('f', _) => {
                return Err("`sed -f` reads its script from a file, which is not checked".into())
            }
            Opt::Long(n, _) if long_is(n, "file") => {
                return Err(
                    "`sed --file` reads its script from a file, which is not checked".into(),
                )
            }
            Opt::Short('e', Some(s)) => scripts.push(s),
            Opt::Long(n, Some(s)) if long_is(n, "expression") => scripts.push(s),
            Opt::Operand(x) => operands.push(x),
            _ => {}
        }
    }
    if scripts.is_empty() {
        match operands.first() {
            Some(s) => scripts.push(s),
            None => return Ok(()), // sed with no script only prints its usage
        }
    }
    scripts.into_iter().try_for_each(script)
}

/// Check one sed script.
fn script(s: &str) -> Check {
    let c: Vec<char> = s.chars().collect();
    let mut i = 0;
    loop {
        while i < c.len() && (c[i].is_whitespace() || c[i] == ';' || c[i] == '}') {
            i += 1;
        }
        if i >= c.len() {
            return Ok(());
        }
        if c[i] == '#' {
            i = to_line_end(&c, i);
            continue;
        }
        i = address(&c, i)?;
        if i < c.len() && c[i] == ',' {
            i = address(&c, i + 1)?;
        }
        while i < c.len() && (c[i].is_whitespace() || c[i] == '!') {
            i += 1;
        }
        let Some(&cmd) = c.get(i) else {
            return Err(format!("`sed` script `{s}` ends without a command"));
        };
        i += 1;
        match cmd {
            '{' => {}
            's' => i = substitute(&c, i)?,
            'y' => {
                let delim = *c.get(i).ok_or("`sed y` has no delimiter")?;
                i = delimited(&c, i + 1, delim)?;
                i = command_end(&c, delimited(&c, i, delim)?)?;
            }
            'e' => return Err("`sed` command `e` runs a shell command".into()),
            'w' | 'W' => return Err(format!("`sed` command `{cmd}` writes to a file")),
            'r' | 'R' => {
                return Err(format!(
                    "`sed` command `{cmd}` reads a file named in the script, which is not checked"
                ))
            }
            // Text to the end of the line (a trailing backslash continues it).
            'a' | 'i' | 'c' => i = to_line_end(&c, i),
            // Labels end at `;` or the line.
            'b' | 't' | 'T' | ':' | 'v' => {
                while i < c.len() && c[i] != ';' && c[i] != '\n' {
                    i += 1;
                }
            }
            'q' | 'Q' | 'l' | 'L' => {
                while i < c.len() && (c[i].is_ascii_digit() || c[i] == ' ') {
                    i += 1;
                }
                i = command_end(&c, i)?;
            }
            '=' | 'd' | 'D' | 'g' | 'G' | 'h' | 'H' | 'n' | 'N' | 'p' | 'P' | 'x' | 'z' | 'F' => {
                i = command_end(&c, i)?
            }
            other => return Err(format!("`sed` command `{other}` is not understood")),
        }
    }
}

/// As GNU sed: after a command only blanks, then `;`, a newline, `}` or a comment may follow
/// (`xp` is an error there, not two commands).
fn command_end(c: &[char], mut i: usize) -> Result<usize, String> {
    while i < c.len() && (c[i] == ' ' || c[i] == '\t') {
        i += 1;
    }
    match c.get(i) {
        None | Some(';' | '\n' | '}' | '#') => Ok(i),
        Some(x) => Err(format!("`sed` script has `{x}` after a command")),
    }
}

/// Skip one address: a line number (with `~step`), `$`, `+N`, or a regex `/re/` or `\cREc`
/// with its `I`/`M` flags.
fn address(c: &[char], mut i: usize) -> Result<usize, String> {
    while i < c.len() && c[i] == ' ' {
        i += 1;
    }
    match c.get(i) {
        Some('$') => Ok(i + 1),
        Some(d) if d.is_ascii_digit() || *d == '+' || *d == '~' => {
            i += 1;
            while i < c.len() && (c[i].is_ascii_digit() || c[i] == '~') {
                i += 1;
            }
            Ok(i)
        }
        Some('/') => regex_flags(c, regex_end(c, i + 1, '/')?),
        Some('\\') => {
            let delim = *c.get(i + 1).ok_or("`sed` address ends after `\\`")?;
            regex_flags(c, regex_end(c, i + 2, delim)?)
        }
        _ => Ok(i),
    }
}

fn regex_flags(c: &[char], mut i: usize) -> Result<usize, String> {
    while i < c.len() && matches!(c[i], 'I' | 'M') {
        i += 1;
    }
    Ok(i)
}

/// `s/re/replacement/flags`: flags `e` (run) and `w` (write) are refused.
fn substitute(c: &[char], i: usize) -> Result<usize, String> {
    let delim = *c.get(i).ok_or("`sed s` has no delimiter")?;
    if delim == '\n' || delim == '\\' {
        return Err("`sed s` delimiter is not understood".into());
    }
    let mut i = regex_end(c, i + 1, delim)?;
    i = delimited(c, i, delim)?;
    while let Some(&f) = c.get(i) {
        match f {
            'g' | 'p' | 'i' | 'I' | 'm' | 'M' | ' ' => i += 1,
            d if d.is_ascii_digit() => i += 1,
            'e' => return Err("`sed s///e` runs the result as a shell command".into()),
            'w' => return Err("`sed s///w` writes to a file".into()),
            ';' | '\n' | '}' | '#' => return Ok(i),
            other => return Err(format!("`sed s` flag `{other}` is not understood")),
        }
    }
    Ok(i)
}

/// The index just past the `delim` that ends a regex: like [`delimited`], but a bracket
/// expression (`[/]`, `[]/]`, `[[:alpha:]/]`) does not end at a `delim` inside it, as in GNU
/// sed. Reading `s/[/]/…` as ending at the first `/` would misplace everything after it.
fn regex_end(c: &[char], mut i: usize, delim: char) -> Result<usize, String> {
    while i < c.len() {
        match c[i] {
            '\\' => i += 2,
            '\n' => break,
            '[' => {
                i += 1;
                if c.get(i) == Some(&'^') {
                    i += 1;
                }
                if c.get(i) == Some(&']') {
                    i += 1;
                }
                loop {
                    match c.get(i) {
                        None | Some('\n') => {
                            return Err("`sed` script has an unterminated `[…]`".into())
                        }
                        Some(']') => {
                            i += 1;
                            break;
                        }
                        // `[:alpha:]`, `[.x.]`, `[=e=]` end at their own `:]`, `.]`, `=]`.
                        Some('[') if matches!(c.get(i + 1), Some(':' | '.' | '=')) => {
                            let kind = c[i + 1];
                            i += 2;
                            while i + 1 < c.len() && !(c[i] == kind && c[i + 1] == ']') {
                                i += 1;
                            }
                            i += 2;
                        }
                        Some(_) => i += 1,
                    }
                }
            }
            ch if ch == delim => return Ok(i + 1),
            _ => i += 1,
        }
    }
    Err(format!(
        "`sed` script has an unterminated `{delim}…{delim}`"
    ))
}

/// The index just past the next unescaped `delim`.
fn delimited(c: &[char], mut i: usize, delim: char) -> Result<usize, String> {
    while i < c.len() {
        match c[i] {
            '\\' => i += 2,
            '\n' if delim != '\n' => break,
            ch if ch == delim => return Ok(i + 1),
            _ => i += 1,
        }
    }
    Err(format!(
        "`sed` script has an unterminated `{delim}…{delim}`"
    ))
}

/// The index of the end of the line, a backslash-newline continuing it.
fn to_line_end(c: &[char], mut i: usize) -> usize {
    while i < c.len() && c[i] != '\n' {
        i += if c[i] == '\\' { 2 } else { 1 };
    }
    i
}
