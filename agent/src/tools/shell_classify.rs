//! A conservative read-only check for shell commands: approval modes let read-only commands
//! run without asking (and plan mode allows only those). Anything not clearly read-only —
//! redirections, substitutions, unknown programs, write flags — is treated as writing.
//! (The tree-sitter-bash classifier of DESIGN.md can replace this behind the same function.)

/// Programs that never write when given ordinary arguments.
const READ_ONLY: &[&str] = &[
    "cat",
    "head",
    "tail",
    "less",
    "more",
    "wc",
    "ls",
    "pwd",
    "echo",
    "printf",
    "grep",
    "egrep",
    "fgrep",
    "rg",
    "ag",
    "find",
    "fd",
    "tree",
    "file",
    "stat",
    "du",
    "df",
    "which",
    "whereis",
    "type",
    "whoami",
    "id",
    "uname",
    "date",
    "env",
    "printenv",
    "sort",
    "uniq",
    "cut",
    "tr",
    "diff",
    "cmp",
    "basename",
    "dirname",
    "realpath",
    "readlink",
    "true",
    "false",
    "test",
    "nl",
    "od",
    "xxd",
    "hexdump",
    "md5sum",
    "sha1sum",
    "sha256sum",
    "column",
    "jq",
    "seq",
];

/// `git` subcommands that only read.
const GIT_READ_ONLY: &[&str] = &[
    "status",
    "log",
    "diff",
    "show",
    "blame",
    "grep",
    "ls-files",
    "rev-parse",
    "describe",
    "shortlog",
    "branch",
    "remote",
    "tag",
];

/// `cargo` subcommands that do not change sources (they write target/, which is a cache).
const CARGO_READ_ONLY: &[&str] = &[
    "check", "build", "test", "clippy", "metadata", "tree", "doc",
];

/// Is `command` certainly free of writes to the workspace?
pub fn is_read_only(command: &str) -> bool {
    let c = command.trim();
    if c.is_empty() {
        return false;
    }
    // Redirections, substitutions, backgrounding, here-docs: not analysed, so not read-only.
    if c.contains('>')
        || c.contains('`')
        || c.contains("$(")
        || c.contains("<(")
        || c.contains('\n')
    {
        return false;
    }
    split_simple_commands(c)
        .iter()
        .all(|seg| simple_is_read_only(seg))
}

fn split_simple_commands(c: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    for ch in c.chars() {
        match quote {
            Some(q) => {
                if ch == q {
                    quote = None;
                }
                cur.push(ch);
            }
            None => match ch {
                '\'' | '"' => {
                    quote = Some(ch);
                    cur.push(ch);
                }
                '|' | ';' | '&' => {
                    out.push(std::mem::take(&mut cur));
                }
                _ => cur.push(ch),
            },
        }
    }
    out.push(cur);
    out.into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

fn simple_is_read_only(seg: &str) -> bool {
    let words: Vec<&str> = seg.split_whitespace().collect();
    let Some(&prog) = words.first() else {
        return true;
    };
    if prog.contains('=') {
        return false; // VAR=value prefix: could be anything
    }
    let args = &words[1..];
    match prog {
        "find" => !args.iter().any(|a| {
            matches!(
                *a,
                "-delete"
                    | "-exec"
                    | "-execdir"
                    | "-ok"
                    | "-okdir"
                    | "-fprint"
                    | "-fprintf"
                    | "-fls"
            )
        }),
        "sort" => !args
            .iter()
            .any(|a| a.starts_with("-o") || a.starts_with("--output")),
        "git" => {
            args.iter()
                .find(|a| !a.starts_with('-'))
                .is_some_and(|sub| GIT_READ_ONLY.contains(sub))
                && !args
                    .iter()
                    .any(|a| matches!(*a, "-D" | "-d" | "--delete" | "-m" | "-M"))
        }
        "cargo" => {
            args.iter()
                .find(|a| !a.starts_with('-'))
                .is_some_and(|sub| CARGO_READ_ONLY.contains(sub))
                && !args.iter().any(|a| a.starts_with("--fix"))
        }
        p => READ_ONLY.contains(&p),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies() {
        for ro in [
            "ls -la",
            "cat src/main.rs | grep fn | wc -l",
            "git status && git diff HEAD",
            "find . -name '*.rs'",
            "grep -n 'a|b' src/lib.rs",
            "cargo test -p x",
        ] {
            assert!(is_read_only(ro), "{ro}");
        }
        for w in [
            "rm -rf target",
            "echo hi > f",
            "cat a | tee b",
            "find . -delete",
            "git commit -m x",
            "git branch -D x",
            "sed -i s/a/b/ f",
            "ls; touch x",
            "echo $(rm x)",
            "X=1 ls",
            "python3 script.py",
            "",
        ] {
            assert!(!is_read_only(w), "{w}");
        }
    }
}
