//! `awk`: read-only when its program only computes and prints to standard output. Refused:
//! `system()`, pipes (`print | "cmd"`, `"cmd" | getline`, `|&`), output redirection inside
//! `print`/`printf`, `getline` (reads files or commands), `@load`/`@include`, and every option
//! but `-F` and `-v` (`-f` programs from files, gawk's `-o`/`-p`/`-d` write files, `-l` loads
//! shared objects, mawk's `-W exec` runs a program).

use super::words::Arg;
use super::Check;

pub(super) fn check(program: &str, args: &[Arg]) -> Check {
    let mut i = 0;
    while let Some(a) = args.get(i) {
        let Some(v) = a.value.as_deref() else {
            return Err(format!(
                "`{program}` argument `{}` is only known when the command runs",
                a.text
            ));
        };
        i += 1;
        if v == "--" {
            break;
        }
        if v == "-" || !v.starts_with('-') {
            i -= 1;
            break;
        }
        match v {
            "-F" | "-v" => i += 1,
            v if v.starts_with("-F") || v.starts_with("-v") => {}
            v if v.starts_with("-f") || v.starts_with("--file") => {
                return Err(format!(
                    "`{program} -f` reads its program from a file, which is not checked"
                ))
            }
            v => return Err(format!("`{program} {v}` is not on the read-only list")),
        }
    }
    let Some(text) = args.get(i) else {
        return Ok(()); // no program: awk prints its usage
    };
    let Some(source) = text.value.as_deref() else {
        return Err(format!(
            "`{program}` program `{}` is only known when the command runs",
            text.text
        ));
    };
    check_program(program, source)
}

/// Scan the raw program text. Strings, regexes and comments are not skipped on purpose: a
/// lexer that mistook a regex for a string could hide a `system(` call, and refusing
/// `print "a|b"` costs little.
fn check_program(program: &str, p: &str) -> Check {
    let c: Vec<char> = p.chars().collect();
    let mut i = 0;
    let mut seen_print = false;
    while i < c.len() {
        match c[i] {
            '@' => {
                return Err(format!(
                    "`{program}` directive `@…` loads code from another file"
                ))
            }
            '|' if c.get(i + 1) == Some(&'|') => i += 1,
            '|' => return Err(format!("`{program}` pipe (`|`) runs a shell command")),
            // After a `print`, a `>` may redirect it; comparisons elsewhere are fine.
            '>' if seen_print => {
                return Err(format!(
                    "`{program}` output redirection (`print > file`) writes a file"
                ))
            }
            c0 if c0.is_ascii_alphabetic() || c0 == '_' => {
                let start = i;
                while i < c.len() && (c[i].is_ascii_alphanumeric() || c[i] == '_') {
                    i += 1;
                }
                let word: String = c[start..i].iter().collect();
                match word.as_str() {
                    "system" => return Err(format!("`{program}` `system()` runs a shell command")),
                    "getline" => {
                        return Err(format!(
                            "`{program}` `getline` reads from files or commands"
                        ))
                    }
                    "print" | "printf" => seen_print = true,
                    _ => {}
                }
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    Ok(())
}
