//! `git`: read subcommands only, listing forms of `branch`/`tag`/`remote`/`config`, and no
//! global options that change which repository, configuration or helper programs git uses.
//!
//! Global options: `-c`/`--config-env` can set `core.fsmonitor` or `diff.external` (a
//! program), `-C`/`--git-dir`/`--work-tree` point git at a repository whose configuration was
//! not checked, `--exec-path` swaps git's helper programs, `-p` starts a pager. All are
//! refused; only options that change nothing of that kind (`--no-pager`, pathspec modes)
//! pass.
//!
//! `status`, `diff`, `log`, `show`, `blame`, `ls-files`, `grep` and kin can run programs named
//! in configuration:
//! `core.fsmonitor` and `filter.*` (status and diff refresh the index), hooks
//! (`post-index-change` when the refreshed index is written), `diff.external`, `diff.*.textconv`
//! and `diff.*.command`, `gpg.program` through `log.showSignature`, and submodules with their own
//! configuration. They are read-only only when [`config_hazard`] finds none of these in the
//! repository the command runs in. A pager only starts on a terminal, which the agent's
//! commands never have, so pager settings are not a hazard here (`-p` still is).

use std::path::Path;
use std::process::{Command, Stdio};

use super::programs::long_is;
use super::words::Arg;
use super::{Check, Walker};

/// Subcommands that read the object store or refs and never run configured programs
/// (checked by running each in a repository configured to run programs: tests/check_cli.rs).
const PLAIN_READS: &[&str] = &[
    "rev-parse",
    "ls-tree",
    "cat-file",
    "rev-list",
    "merge-base",
    "show-ref",
    "for-each-ref",
    "name-rev",
    "count-objects",
    "var",
    "version",
    "describe",
];

/// Read subcommands that can run programs named in configuration (see the module doc).
/// `ls-files`, `grep`, `check-ignore` and `check-attr` look at the work tree through
/// `core.fsmonitor`.
const CONFIG_READS: &[&str] = &[
    "ls-files",
    "grep",
    "check-ignore",
    "check-attr",
    "status",
    "diff",
    "log",
    "show",
    "blame",
    "annotate",
    "shortlog",
    "whatchanged",
    "diff-files",
    "diff-index",
    "diff-tree",
    "range-diff",
];

/// Subcommands that talk to a remote (they also write refs or files).
pub(super) const NETWORK: &[&str] = &[
    "fetch",
    "pull",
    "push",
    "clone",
    "ls-remote",
    "submodule",
    "send-email",
    "request-pull",
];

pub(super) fn check(args: &[Arg], walker: &mut Walker) -> Check {
    let mut i = 0;
    while let Some(a) = args.get(i) {
        let Some(v) = a.value.as_deref() else {
            return Err(format!(
                "`git` argument `{}` is only known when the command runs",
                a.text
            ));
        };
        if !v.starts_with('-') {
            break;
        }
        let why = match v {
            "--no-pager"
            | "-P"
            | "--no-optional-locks"
            | "--literal-pathspecs"
            | "--glob-pathspecs"
            | "--noglob-pathspecs"
            | "--icase-pathspecs"
            | "--no-replace-objects" => {
                i += 1;
                continue;
            }
            "--version" => return Ok(()),
            v if v.starts_with("-c") || v.starts_with("--config-env") => {
                "sets configuration that can make git run programs (core.fsmonitor, diff.external)"
            }
            v if v.starts_with("-C")
                || v.starts_with("--git-dir")
                || v.starts_with("--work-tree")
                || v.starts_with("--namespace")
                || v == "--bare" =>
            {
                "points git at a repository whose configuration was not checked"
            }
            v if v.starts_with("--exec-path") => "runs git's helper programs from elsewhere",
            "-p" | "--paginate" => "starts a pager, which can run shell commands",
            _ => "is not on the read-only list",
        };
        return Err(format!("`git {v}` {why}"));
    }
    let Some(sub) = args.get(i).and_then(|a| a.value.as_deref()) else {
        return Ok(()); // plain `git` prints its usage
    };
    // Arguments after the subcommand: fixed up to `--`; pathspecs after it may be dynamic.
    let mut rest: Vec<&str> = Vec::new();
    let mut after_dashes = false;
    for a in &args[i + 1..] {
        match a.value.as_deref() {
            Some("--") => {
                after_dashes = true;
                break;
            }
            Some(v) => rest.push(v),
            None => {
                return Err(format!(
                    "`git {sub}` argument `{}` is only known when the command runs",
                    a.text
                ))
            }
        }
    }
    if let Some(reason) = risky_option(sub, &rest) {
        return Err(reason);
    }
    // `git branch -- NAME` creates NAME: for these, what follows `--` is not a pathspec.
    if after_dashes
        && matches!(
            sub,
            "branch" | "tag" | "remote" | "config" | "worktree" | "stash"
        )
    {
        return Err(format!(
            "`git {sub} --` is not a listing form of `git {sub}`"
        ));
    }
    match sub {
        s if PLAIN_READS.contains(&s) => Ok(()),
        s if CONFIG_READS.contains(&s) => walker.git_config_allows(s),
        "branch" => branch(&rest),
        "tag" => tag(&rest),
        "remote" => remote(&rest),
        "config" => config(&rest),
        "worktree" if rest.first() == Some(&"list") => Ok(()),
        "stash" if rest.first() == Some(&"list") => walker.git_config_allows("stash list"),
        "stash" if rest.first() == Some(&"show") => walker.git_config_allows("stash show"),
        "reflog"
            if rest
                .first()
                .is_none_or(|r| *r == "show" || r.starts_with('-')) =>
        {
            walker.git_config_allows("reflog")
        }
        s if NETWORK.contains(&s) => Err(format!(
            "`git {s}` talks to a remote repository and changes local refs or files"
        )),
        s => Err(format!("`git {s}` is not a read-only git command")),
    }
}

/// Options that write or run programs whatever the subcommand.
fn risky_option(sub: &str, rest: &[&str]) -> Option<String> {
    for a in rest {
        if a.contains("%G") || a.contains("%(signature") {
            return Some(format!("`git {sub}` format `{a}` runs gpg"));
        }
        if let Some(long) = a.strip_prefix("--") {
            let name = long.split_once('=').map(|(n, _)| n).unwrap_or(long);
            let why = if long_is(name, "output") {
                "writes to a file"
            } else if long_is(name, "ext-diff") {
                "runs an external diff program"
            } else if long_is(name, "show-signature") {
                "runs gpg"
            } else if long_is(name, "open-files-in-pager") {
                "opens a pager, which can run shell commands"
            } else if long_is(name, "textconv") || long_is(name, "filters") {
                "runs the textconv or filter programs of the configuration"
            } else if long_is(name, "dirty") || long_is(name, "broken") {
                "refreshes the index, which can run configured programs"
            } else if long_is(name, "help") {
                "opens the manual in a pager or browser"
            } else if long_is(name, "exec") || long_is(name, "upload-pack") {
                "runs another program"
            } else {
                continue;
            };
            return Some(format!("`git {sub} --{name}` {why}"));
        }
        if sub == "grep" && a.starts_with("-O") {
            return Some("`git grep -O` opens a pager, which can run shell commands".into());
        }
    }
    None
}

/// `git branch` lists, unless given a name without `--list`, or an option that edits.
fn branch(rest: &[&str]) -> Check {
    let mut listing = false;
    let mut i = 0;
    let mut operands = Vec::new();
    while let Some(&a) = rest.get(i) {
        i += 1;
        match a {
            "-l" | "--list" => listing = true,
            "-a" | "--all" | "-r" | "--remotes" | "-v" | "-vv" | "--verbose" | "--show-current"
            | "-i" | "--ignore-case" | "--color" | "--no-color" | "--column" | "--no-column"
            | "--omit-empty" => {}
            "--contains" | "--no-contains" | "--merged" | "--no-merged" | "--points-at"
            | "--sort" | "--format" => {
                i += 1;
            }
            a if a.starts_with("--contains=")
                || a.starts_with("--no-contains=")
                || a.starts_with("--merged=")
                || a.starts_with("--no-merged=")
                || a.starts_with("--points-at=")
                || a.starts_with("--sort=")
                || a.starts_with("--format=")
                || a.starts_with("--color=")
                || a.starts_with("--column=")
                || a.starts_with("--abbrev=") => {}
            a if a.starts_with('-') => {
                return Err(format!("`git branch {a}` changes branches"));
            }
            a => operands.push(a),
        }
    }
    match operands.first() {
        Some(name) if !listing => Err(format!("`git branch {name}` creates a branch")),
        _ => Ok(()),
    }
}

/// `git tag` lists with no name, or with `-l`; anything else creates, deletes or verifies.
fn tag(rest: &[&str]) -> Check {
    let mut listing = false;
    let mut i = 0;
    let mut operands = Vec::new();
    while let Some(&a) = rest.get(i) {
        i += 1;
        match a {
            "-l" | "--list" => listing = true,
            "-i" | "--ignore-case" | "--column" | "--no-column" | "--color" | "--omit-empty" => {}
            "--contains" | "--no-contains" | "--merged" | "--no-merged" | "--points-at"
            | "--sort" | "--format" => i += 1,
            a if a.starts_with("-n")
                || a.starts_with("--contains=")
                || a.starts_with("--no-contains=")
                || a.starts_with("--merged=")
                || a.starts_with("--no-merged=")
                || a.starts_with("--points-at=")
                || a.starts_with("--sort=")
                || a.starts_with("--format=")
                || a.starts_with("--color=") => {}
            a if a.starts_with('-') => {
                return Err(format!("`git tag {a}` changes or verifies tags"))
            }
            a => operands.push(a),
        }
    }
    match operands.first() {
        Some(name) if !listing => Err(format!("`git tag {name}` creates a tag")),
        _ => Ok(()),
    }
}

/// `git remote` and `git remote -v` list; `get-url` reads; `show` contacts the remote.
fn remote(rest: &[&str]) -> Check {
    match rest {
        [] | ["-v"] | ["--verbose"] => Ok(()),
        ["get-url", ..] => Ok(()),
        [sub, ..] => Err(format!(
            "`git remote {sub}` is not a listing form of `git remote`"
        )),
    }
}

/// `git config` reads with `--get`/`--list` (or the `get`/`list` subcommands).
fn config(rest: &[&str]) -> Check {
    let reads = rest.iter().any(|a| {
        matches!(
            *a,
            "--get"
                | "--get-all"
                | "--get-regexp"
                | "--get-urlmatch"
                | "-l"
                | "--list"
                | "get"
                | "list"
        )
    });
    let writes = rest.iter().any(|a| {
        matches!(
            *a,
            "--add"
                | "--unset"
                | "--unset-all"
                | "--replace-all"
                | "--rename-section"
                | "--remove-section"
                | "-e"
                | "--edit"
                | "set"
                | "unset"
                | "edit"
                | "rename-section"
                | "remove-section"
        )
    });
    if reads && !writes {
        Ok(())
    } else {
        Err("`git config` without `--get`/`--list` changes configuration".into())
    }
}

/// The first configuration key (or file) in `dir`'s effective git configuration that would
/// make a read command run a program, or why the configuration could not be read.
pub(super) fn config_hazard(dir: &Path) -> Option<String> {
    if std::env::var_os("GIT_EXTERNAL_DIFF").is_some() {
        return Some("GIT_EXTERNAL_DIFF in the environment".into());
    }
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["config", "--list", "-z"])
        .env("GIT_OPTIONAL_LOCKS", "0")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output();
    let out = match out {
        Ok(o) if o.status.success() => o.stdout,
        Ok(_) => return Some("`git config --list` failed".into()),
        Err(e) => return Some(format!("could not run `git config`: {e}")),
    };
    let text = String::from_utf8_lossy(&out);
    for entry in text.split('\0').filter(|e| !e.is_empty()) {
        let (key, value) = entry.split_once('\n').unwrap_or((entry, "true"));
        if key_runs_programs(key, value) {
            return Some(key.to_string());
        }
    }
    let hook = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["rev-parse", "--git-path", "hooks/post-index-change"])
        .env("GIT_OPTIONAL_LOCKS", "0")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output();
    if let Ok(o) = hook {
        if o.status.success() {
            let path = String::from_utf8_lossy(&o.stdout).trim().to_string();
            if !path.is_empty() && dir.join(&path).exists() {
                return Some("hook post-index-change".into());
            }
        }
    }
    None
}

/// Does configuration `key = value` name a program that a read command may run?
pub(super) fn key_runs_programs(key: &str, value: &str) -> bool {
    let key = key.to_ascii_lowercase();
    let section = key.split('.').next().unwrap_or("");
    let var = key.rsplit('.').next().unwrap_or("");
    let has_subsection = key.matches('.').count() >= 2;
    let off = matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "" | "false" | "no" | "off" | "0"
    );
    match (section, var) {
        ("core", "fsmonitor") => !off,
        ("core", "hookspath") => true,
        ("diff", "external") => true,
        ("diff", "command" | "textconv") => has_subsection,
        ("filter", "clean" | "smudge" | "process") => has_subsection,
        ("log", "showsignature") => !off,
        ("submodule", _) => true,
        ("trace2", _) => true,
        _ => false,
    }
}
