//! `git`: read subcommands only, listing forms of `branch`/`tag`/`remote`/`config`, and no
//! global options that change which repository, configuration or helper programs git uses.
//!
//! Global options: `-C`/`--git-dir`/`--work-tree` point git at another repository and
//! `-c KEY=VALUE` can set `core.fsmonitor` or `diff.external` (a program): they are passed to
//! the configuration check, which then reads exactly the configuration the command would
//! use. `--config-env` (a value from the environment), `--namespace`/`--bare`,
//! `--exec-path` (git's helper programs from elsewhere) and `-p` (a pager) are refused.
//!
//! `status`, `diff`, `log`, `show`, `blame`, `ls-files`, `grep` and kin can run programs named
//! in configuration:
//! `core.fsmonitor` and `filter.*` (status and diff refresh the index), hooks
//! (`post-index-change` when the refreshed index is written), `diff.external`, `diff.*.textconv`
//! and `diff.*.command`, `gpg.program` through `log.showSignature` or a `%G` placeholder in
//! `format.pretty`/`pretty.<alias>`, and submodules with their own
//! configuration. They are read-only only when [`config_hazard`] finds none of these in the
//! repository the command runs in.
//!
//! Every git command starts a pager when its stdout is a terminal — and other agents run
//! commands in a pty (MCP's `check_command` is asked for them) — so a verdict must not
//! depend on stdout: a pager named by `-c` (`core.pager`, `pager.<cmd>`) or by the
//! repository's own configuration ([`pager_hazard`]: local and worktree scope, includes
//! followed) makes any git command not read-only; the user's global pager is the user's.
//! Any other `-c` key that names a program ([`names_program`]: editors, ssh commands,
//! aliases, credential helpers, gpg, diff/merge drivers, …) is refused outright, whether
//! or not the subcommand would run it.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::options::long_is;
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
    // `-C DIR`, `--git-dir`, `--work-tree` and `-c KEY=VALUE`, in order: the configuration
    // check runs git with them, so it reads the configuration the command would use.
    let mut globals: Vec<String> = Vec::new();
    // `--no-pager`/`-P`: git starts no pager, whatever the configuration says.
    let mut no_pager = false;
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
                no_pager |= v == "--no-pager" || v == "-P";
                i += 1;
                continue;
            }
            "--version" => return Ok(()),
            "-C" | "-c" | "--git-dir" | "--work-tree" => {
                let Some(value) = args.get(i + 1).and_then(|a| a.value.as_deref()) else {
                    return Err(format!(
                        "`git {v}` has a value that is only known when the command runs"
                    ));
                };
                if v == "-c" {
                    refuse_program_setting(value)?;
                }
                globals.extend([v.to_string(), value.to_string()]);
                i += 2;
                continue;
            }
            v if v.starts_with("--git-dir=") || v.starts_with("--work-tree=") => {
                // Kept as option-value pairs, like the others.
                let (opt, value) = v.split_once('=').unwrap_or((v, ""));
                globals.extend([opt.to_string(), value.to_string()]);
                i += 1;
                continue;
            }
            v if v.starts_with("-C") || v.starts_with("-c") => {
                if let Some(setting) = v.strip_prefix("-c") {
                    refuse_program_setting(setting)?;
                }
                globals.extend([v[..2].to_string(), v[2..].to_string()]);
                i += 1;
                continue;
            }
            v if v.starts_with("--config-env") => {
                "sets configuration from the environment, which this check does not read"
            }
            v if v.starts_with("--namespace") || v == "--bare" => {
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
    // Another repository or configuration: checked even for commands that read the
    // object store only (`-c include.path`, `--git-dir` of an unknown repository).
    if !globals.is_empty() {
        walker.git_config_allows(sub, &globals)?;
    }
    let verdict = match sub {
        s if PLAIN_READS.contains(&s) => Ok(()),
        s if CONFIG_READS.contains(&s) => walker.git_config_allows(s, &globals),
        "branch" => branch(&rest),
        "tag" => tag(&rest),
        "remote" => remote(&rest),
        "config" => config(&rest),
        "worktree" if rest.first() == Some(&"list") => Ok(()),
        "stash" if rest.first() == Some(&"list") => {
            walker.git_config_allows("stash list", &globals)
        }
        "stash" if rest.first() == Some(&"show") => {
            walker.git_config_allows("stash show", &globals)
        }
        "reflog"
            if rest
                .first()
                .is_none_or(|r| *r == "show" || r.starts_with('-')) =>
        {
            walker.git_config_allows("reflog", &globals)
        }
        s if NETWORK.contains(&s) => Err(format!(
            "`git {s}` talks to a remote repository and changes local refs or files"
        )),
        s => Err(format!("`git {s}` is not a read-only git command")),
    };
    verdict?;
    // Whatever the subcommand: on a terminal, git pages its output.
    if no_pager {
        return Ok(());
    }
    walker.git_pager_allows(sub, &globals)
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

/// The first configuration key (or file) in the effective git configuration of a command run
/// in `dir` with the global options `globals` (`-C`, `--git-dir`, `--work-tree`, `-c`) that
/// would make a read command run a program, or why the configuration could not be read.
pub(super) fn config_hazard(dir: &Path, globals: &[String]) -> Option<String> {
    config_hazard_at(dir, globals, 0)
}

/// Submodules (and embedded repositories added as gitlinks) nested deeper than this are
/// not looked into: the command is then not called read-only.
const MAX_SUBMODULE_DEPTH: usize = 4;

fn config_hazard_at(dir: &Path, globals: &[String], depth: usize) -> Option<String> {
    if std::env::var_os("GIT_EXTERNAL_DIFF").is_some() {
        return Some("GIT_EXTERNAL_DIFF in the environment".into());
    }
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(globals)
            .args(args)
            .env("GIT_OPTIONAL_LOCKS", "0")
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
    };
    // `-c` settings are listed too (command-line scope), and include files are followed.
    let out = match git(&["config", "--list", "-z"]) {
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
    let hook = git(&[
        "rev-parse",
        "--path-format=absolute",
        "--git-path",
        "hooks/post-index-change",
    ]);
    if let Ok(o) = hook {
        if o.status.success() {
            let path = String::from_utf8_lossy(&o.stdout).trim().to_string();
            if !path.is_empty() && Path::new(&path).exists() {
                return Some("hook post-index-change".into());
            }
        }
    }
    // `status` and `diff` look into every populated submodule — a gitlink in the index,
    // with or without `.gitmodules` — by running git there, with that repository's own
    // configuration (its `core.fsmonitor`, …): each is checked the same way.
    let top = match git(&["rev-parse", "--show-toplevel"]) {
        Ok(o) if o.status.success() => {
            PathBuf::from(String::from_utf8_lossy(&o.stdout).trim_end_matches('\n'))
        }
        // Not in a work tree (a bare repository, no repository): no submodules to enter.
        _ => return None,
    };
    let listing = match git(&["ls-files", "--stage", "-z", "--full-name", "--", ":/"]) {
        Ok(o) if o.status.success() => o.stdout,
        _ => return Some("`git ls-files` failed".into()),
    };
    // `-c` settings reach git in the submodule too (GIT_CONFIG_PARAMETERS); `-C` and the rest
    // do not.
    let inherited: Vec<String> = globals
        .chunks(2)
        .filter(|pair| pair.first().is_some_and(|o| o == "-c"))
        .flatten()
        .cloned()
        .collect();
    for entry in listing.split(|b| *b == 0) {
        let Some(tab) = entry.iter().position(|b| *b == b'\t') else {
            continue;
        };
        if !entry.starts_with(b"160000 ") {
            continue;
        }
        let rel = Path::new(std::ffi::OsStr::from_bytes(&entry[tab + 1..]));
        let sub = top.join(rel);
        if !sub.join(".git").exists() {
            continue; // not populated: git does not enter it
        }
        let shown = rel.to_string_lossy();
        if depth >= MAX_SUBMODULE_DEPTH {
            return Some(format!("submodule {shown} nested too deep to check"));
        }
        if let Some(h) = config_hazard_at(&sub, &inherited, depth + 1) {
            return Some(format!("{h} in submodule {shown}"));
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
        // `%G?` and the other `%G` placeholders verify signatures: they run `gpg.program`.
        // `format.pretty` may also name a `pretty.<alias>`, which is checked on its own.
        ("format", "pretty") | ("pretty", _) => value.contains("%G"),
        ("submodule", _) => true,
        ("trace2", _) => true,
        _ => false,
    }
}

/// `-c KEY=VALUE` (or `-c KEY`, which means true) naming a program: refused.
fn refuse_program_setting(setting: &str) -> Check {
    let (key, value) = setting.split_once('=').unwrap_or((setting, "true"));
    if names_program(key, value) {
        return Err(format!(
            "`git -c {}` names a program for git to run (a pager, editor, helper or driver)",
            key.to_ascii_lowercase()
        ));
    }
    Ok(())
}

/// Does `key = value` name a program git may run (for any subcommand)? Everything
/// [`key_runs_programs`] and [`pager_key`] know, and the keys of programs that only other
/// subcommands run: a `-c` setting of one of them is refused whatever the subcommand.
pub(super) fn names_program(key: &str, value: &str) -> bool {
    if key_runs_programs(key, value) || pager_key(key, value) {
        return true;
    }
    let key = key.to_ascii_lowercase();
    let section = key.split('.').next().unwrap_or("");
    let var = key.rsplit('.').next().unwrap_or("");
    let has_subsection = key.matches('.').count() >= 2;
    match (section, var) {
        ("core", "editor" | "sshcommand" | "askpass" | "gitproxy") => true,
        ("sequence", "editor") => true,
        ("alias", _) => true,
        ("credential", "helper") => true,
        ("gpg", "program" | "defaultkeycommand") => true,
        ("difftool" | "mergetool" | "man" | "browser", "cmd" | "path") => has_subsection,
        ("merge", "driver") => has_subsection,
        ("web", "browser") | ("man", "viewer") => true,
        ("interactive", "difffilter") => true,
        ("uploadpack", "packobjectshook") => true,
        ("remote", "uploadpack" | "receivepack" | "vcs" | "proxy") => has_subsection,
        ("sendemail", _) => true,
        ("init", "templatedir") => true,
        _ => false,
    }
}

/// Does `key = value` set a pager? `core.pager` other than none (empty or `cat`, which git
/// takes for no pager), and `pager.<cmd>` naming a program (true/false only switch the
/// default pager on or off).
pub(super) fn pager_key(key: &str, value: &str) -> bool {
    let key = key.to_ascii_lowercase();
    let value = value.trim();
    if key == "core.pager" {
        return !(value.is_empty() || value == "cat");
    }
    if key.starts_with("pager.") {
        let switch = matches!(
            value.to_ascii_lowercase().as_str(),
            "" | "true" | "false" | "yes" | "no" | "on" | "off" | "1" | "0" | "cat"
        );
        return !switch;
    }
    false
}

/// A pager (see [`pager_key`]) that the repository's own configuration (local or worktree
/// scope, with what they include) or the command line sets for a git command run in `dir`
/// with `globals`, or why the configuration could not be read.
pub(super) fn pager_hazard(dir: &Path, globals: &[String]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(globals)
        .args(["config", "--list", "-z", "--show-scope"])
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
    // `scope NUL key LF value NUL`, entry after entry.
    let mut fields = text.split('\0');
    while let (Some(scope), Some(entry)) = (fields.next(), fields.next()) {
        let (key, value) = entry.split_once('\n').unwrap_or((entry, "true"));
        let ours = matches!(scope, "local" | "worktree" | "command");
        if ours && pager_key(key, value) {
            return Some(format!("{key} in {scope} configuration"));
        }
    }
    None
}
