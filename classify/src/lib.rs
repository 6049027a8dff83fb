//! The shell classifier: decides from a real bash parse (tree-sitter-bash) whether a command
//! line only reads, so approval modes can run it without asking, plan mode can allow it, and
//! speculation can run it outside the branch sandbox. It also says whether a command needs the
//! network, which speculation (network off) treats as a boundary.
//!
//! Conservative by construction: a script is read-only only if every construct in it is one
//! this module understands and allows. Output redirection (other than to `/dev/null` and the
//! standard streams), command / process substitution and arithmetic anywhere, assignments,
//! `export`/`declare`, function definitions, background jobs, parse errors and programs
//! outside the allow-list all make it "not read-only", with the first offending construct as
//! the reason. Control flow (`if`, `while`, `for`, `case`, `{ }`, `( )`, `!`) is allowed when
//! every command inside it is: it only sequences commands and adds no effect of its own.
//!
//! `git status/diff/log/show/blame/ls-files/grep` can run programs named in git configuration
//! (`core.fsmonitor`, `diff.external`, textconv and filter drivers, hooks). [`classify`] knows
//! no repository, so it does not call them read-only; [`classify_in`] reads the effective
//! configuration of the given directory (`git config --list`) and accepts them when none of
//! those keys is set. Every git command also pages on a terminal: a pager set by `-c` or in
//! the repository's own configuration makes it not read-only, whatever stdout is at the
//! moment of the check (see `git.rs`).
#![warn(missing_docs)]

mod awk;
mod git;
mod network;
mod options;
mod programs;
mod sed;
mod words;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::Path;

use serde::Serialize;
use tree_sitter::{Node, Parser};

use words::Arg;

/// The classifier's answer, with the reason a user is shown when a command is not read-only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// True when the script certainly changes nothing (files, shell state, other processes).
    pub read_only: bool,
    /// The first construct that made it not read-only; `None` when it is read-only.
    pub reason: Option<String>,
    /// True when some command in the script talks to the network (curl, git fetch, npm
    /// install, …), whether or not the script is read-only.
    pub needs_network: bool,
}

/// Classify `script` without looking at any repository: git commands that can run
/// configured programs are not read-only here (see [`classify_in`]).
pub fn classify(script: &str) -> Verdict {
    classify_with(script, None)
}

/// Classify `script` as it would run in `dir`: git commands that can run configured programs
/// are read-only when the effective git configuration of `dir` names none.
pub fn classify_in(script: &str, dir: &Path) -> Verdict {
    classify_with(script, Some(dir))
}

/// Is `script` certainly free of writes? Same as `classify(script).read_only`.
pub fn is_read_only(script: &str) -> bool {
    classify(script).read_only
}

fn classify_with(script: &str, repo: Option<&Path>) -> Verdict {
    let mut parser = Parser::new();
    let tree = parser
        .set_language(&tree_sitter_bash::LANGUAGE.into())
        .ok()
        .and_then(|()| parser.parse(script, None));
    let Some(tree) = tree else {
        return Verdict {
            read_only: false,
            reason: Some("the shell parser failed on this script".into()),
            needs_network: false,
        };
    };
    let src = script.as_bytes();
    let root = tree.root_node();
    let needs_network = network::needs_network(root, src);
    let mut walker = Walker {
        src,
        repo,
        changes_dir: false,
        git_hazard: HashMap::new(),
        git_pager: HashMap::new(),
    };
    let outcome = walker.check_script(root);
    Verdict {
        read_only: outcome.is_ok(),
        reason: outcome.err(),
        needs_network,
    }
}

/// A check's outcome: `Err` carries the reason shown to the user.
type Check = Result<(), String>;

/// The walk over one parsed script.
struct Walker<'s, 'r> {
    src: &'s [u8],
    repo: Option<&'r Path>,
    /// The script changes directory somewhere (`cd`, `pushd`, `popd`), so a git command may
    /// run in a repository other than `repo`.
    changes_dir: bool,
    /// The repository's git configuration checks, done once per set of git's global options
    /// (`-C`, `-c`, …), on the first git command that needs it.
    git_hazard: HashMap<Vec<String>, Option<String>>,
    /// The same for a pager set in the repository's own configuration (every git command).
    git_pager: HashMap<Vec<String>, Option<String>>,
}

/// The first characters of a node's text, on one line, for reasons.
fn snippet(node: Node, src: &[u8]) -> String {
    let text = node.utf8_text(src).unwrap_or("");
    let one_line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() > 60 {
        let cut: String = one_line.chars().take(57).collect();
        format!("{cut}…")
    } else {
        one_line
    }
}

impl Walker<'_, '_> {
    fn text(&self, node: Node) -> &str {
        node.utf8_text(self.src).unwrap_or("")
    }

    fn check_script(&mut self, root: Node) -> Check {
        if root.has_error() {
            let bad = first_error(root).unwrap_or(root);
            return Err(format!(
                "the shell parser does not understand `{}`",
                snippet(bad, self.src)
            ));
        }
        self.scan(root)?;
        let mut cursor = root.walk();
        if !root
            .named_children(&mut cursor)
            .any(|c| c.kind() != "comment")
        {
            return Err("there is no command to run".into());
        }
        self.check_block(root)
    }

    /// Constructs refused wherever they appear (in arguments, strings, heredocs, assignment
    /// values, redirect targets), and the directory changes that make a repository check moot.
    fn scan(&mut self, node: Node) -> Check {
        let what = match node.kind() {
            "command_substitution" => Some("command substitution `{}` runs another command"),
            "process_substitution" => Some("process substitution `{}` runs another command"),
            "arithmetic_expansion" | "c_style_for_statement" => {
                Some("arithmetic `{}` can run commands hidden in variables")
            }
            "subscript" => Some("array subscript `{}` is evaluated as arithmetic"),
            "expansion" if !self.plain_expansion(node) => {
                Some("parameter expansion `{}` with operators is not analysed")
            }
            "heredoc_body" if self.heredoc_expands(node) => {
                let body = self.text(node);
                (body.contains('`') || body.contains("$(") || body.contains("$["))
                    .then_some("here-document `{}` contains a command substitution")
            }
            "command_name" => {
                let name = self.text(node);
                if matches!(name, "cd" | "pushd" | "popd") {
                    self.changes_dir = true;
                }
                None
            }
            _ => None,
        };
        if let Some(what) = what {
            return Err(what.replace("{}", &snippet(node, self.src)));
        }
        let mut cursor = node.walk();
        let children: Vec<Node> = node.children(&mut cursor).collect();
        for child in children {
            self.scan(child)?;
        }
        Ok(())
    }

    /// Does the here-document of this body expand its text (an unquoted delimiter)? The
    /// parser does not model every substitution inside it (backticks, `$[…]`), so such a
    /// body is also checked as text.
    fn heredoc_expands(&self, body: Node) -> bool {
        let start = body
            .parent()
            .and_then(|r| {
                let mut cursor = r.walk();
                let found = r
                    .children(&mut cursor)
                    .find(|c| c.kind() == "heredoc_start");
                found
            })
            .map(|s| self.text(s))
            .unwrap_or("");
        !start.contains(['\'', '"', '\\'])
    }

    /// `${name}` and nothing else: no default, pattern, indirection or length operators.
    fn plain_expansion(&self, node: Node) -> bool {
        let mut cursor = node.walk();
        let kinds: Vec<&str> = node.children(&mut cursor).map(|c| c.kind()).collect();
        matches!(
            kinds.as_slice(),
            ["${", "variable_name" | "special_variable_name", "}"]
        )
    }

    /// A sequence of statements (script, list, pipeline, group, subshell, loop body).
    fn check_block(&mut self, node: Node) -> Check {
        let mut cursor = node.walk();
        let children: Vec<Node> = node.children(&mut cursor).collect();
        for child in children {
            if !child.is_named() {
                match child.kind() {
                    "&" => {
                        return Err(
                            "`&` runs a command in the background, which this check does not allow"
                                .into(),
                        )
                    }
                    ";" | "&&" | "||" | "|" | "|&" | "\n" | "{" | "}" | "(" | ")" | "do"
                    | "done" => {}
                    other => {
                        return Err(format!("`{other}` is not understood here"));
                    }
                }
                continue;
            }
            self.check_stmt(child)?;
        }
        Ok(())
    }

    fn check_stmt(&mut self, node: Node) -> Check {
        match node.kind() {
            "comment" => Ok(()),
            "command" => self.check_command(node),
            "program" | "pipeline" | "list" | "compound_statement" | "subshell" | "do_group" => {
                self.check_block(node)
            }
            "redirected_statement" | "negated_command" => self.check_parts(node),
            "if_statement" | "elif_clause" | "else_clause" | "while_statement"
            | "case_statement" | "case_item" | "for_statement" => {
                if node.child(0).is_some_and(|c| c.kind() == "select") {
                    return Err("`select` reads choices from the terminal".into());
                }
                if let Some(var) = node.child_by_field_name("variable") {
                    let name = self.text(var);
                    if !programs::is_local_name(name) {
                        return Err(format!(
                            "`for {name}` sets a variable that is not a plain lower-case name"
                        ));
                    }
                }
                self.check_parts(node)
            }
            "test_command" => self.check_test(node),
            "variable_assignment" | "variable_assignments" => Err(format!(
                "assignment `{}` changes shell variables",
                snippet(node, self.src)
            )),
            "declaration_command" | "unset_command" => Err(format!(
                "`{}` changes shell variables",
                node.child(0).map(|c| self.text(c)).unwrap_or("declare")
            )),
            "function_definition" => Err(format!(
                "defining a function (`{}`) can shadow a read-only program",
                node.child_by_field_name("name")
                    .map(|n| self.text(n))
                    .unwrap_or("?")
            )),
            kind => Err(format!(
                "`{}` ({}) is not understood",
                snippet(node, self.src),
                kind.replace('_', " ")
            )),
        }
    }

    /// The named parts of a compound statement: redirects are checked as redirects, words
    /// (loop values, case patterns) need nothing more than the scan, the rest are statements.
    fn check_parts(&mut self, node: Node) -> Check {
        let mut cursor = node.walk();
        let children: Vec<Node> = node.named_children(&mut cursor).collect();
        for child in children {
            match child.kind() {
                "file_redirect" | "heredoc_redirect" | "herestring_redirect" => {
                    self.check_redirect(child)?
                }
                k if words::is_word(k) || k == "variable_name" => {}
                _ => self.check_stmt(child)?,
            }
        }
        Ok(())
    }

    fn check_redirect(&mut self, node: Node) -> Check {
        match node.kind() {
            "herestring_redirect" => Ok(()),
            "heredoc_redirect" => {
                let mut cursor = node.walk();
                let children: Vec<Node> = node.named_children(&mut cursor).collect();
                for child in children {
                    match child.kind() {
                        "heredoc_start" | "heredoc_body" | "heredoc_end" | "heredoc_content" => {}
                        "file_redirect" | "heredoc_redirect" | "herestring_redirect" => {
                            self.check_redirect(child)?
                        }
                        // `cat <<EOF | sh`, `cat <<EOF && rm x`: the rest of the line.
                        _ => self.check_stmt(child)?,
                    }
                }
                Ok(())
            }
            "file_redirect" => self.check_file_redirect(node),
            kind => Err(format!(
                "redirection `{}` ({kind}) is not understood",
                snippet(node, self.src)
            )),
        }
    }

    fn check_file_redirect(&self, node: Node) -> Check {
        let mut cursor = node.walk();
        let op = node
            .children(&mut cursor)
            .find(|c| !c.is_named())
            .map(|c| c.kind())
            .unwrap_or("");
        let dest = node.child_by_field_name("destination");
        let dest_value = dest.map(|d| words::value(d, self.src));
        let dest_text = dest.map(|d| self.text(d)).unwrap_or("");
        let to_sink = matches!(
            dest_value.as_ref().and_then(|v| v.as_deref()),
            Some("/dev/null" | "/dev/stdout" | "/dev/stderr")
        );
        if dest_text.starts_with("/dev/tcp/") || dest_text.starts_with("/dev/udp/") {
            return Err(format!(
                "redirection to `{dest_text}` opens a network connection"
            ));
        }
        match op {
            "<" | "<&" | "<&-" => Ok(()),
            ">&-" => Ok(()),
            // `2>&1`, `>&2`, `1>&2-`: duplicating or moving a descriptor, no file.
            ">&" if dest.is_some_and(|d| d.kind() == "number")
                || dest_value
                    .as_ref()
                    .and_then(|v| v.as_deref())
                    .is_some_and(is_fd_target) =>
            {
                Ok(())
            }
            ">" | ">>" | "&>" | "&>>" | ">|" | ">&" if to_sink => Ok(()),
            ">" | ">>" | "&>" | "&>>" | ">|" | ">&" => {
                Err(format!("output redirection to `{dest_text}`"))
            }
            _ => Err(format!(
                "redirection `{}` is not understood",
                snippet(node, self.src)
            )),
        }
    }

    fn check_command(&mut self, node: Node) -> Check {
        let mut name: Option<Arg> = None;
        let mut args: Vec<Arg> = Vec::new();
        let mut cursor = node.walk();
        let children: Vec<Node> = node.named_children(&mut cursor).collect();
        for child in children {
            match child.kind() {
                "command_name" => {
                    let inner = child.named_child(0).unwrap_or(child);
                    name = Some(Arg::of(inner, self.src));
                }
                "variable_assignment" => {
                    return Err(format!(
                        "`{}` sets an environment variable for the command",
                        snippet(child, self.src)
                    ))
                }
                "file_redirect" | "heredoc_redirect" | "herestring_redirect" => {
                    self.check_redirect(child)?
                }
                "comment" => {}
                _ => args.push(Arg::of(child, self.src)),
            }
        }
        let Some(name) = name else {
            return Err(format!(
                "`{}` has no program to run",
                snippet(node, self.src)
            ));
        };
        let Some(program) = name.value.as_deref() else {
            return Err(format!(
                "the program name `{}` is only known when the command runs",
                name.text
            ));
        };
        let resolved = programs::resolve(program)?;
        programs::check(&resolved, program, &args, self)
    }

    /// `[[ … ]]` / `[ … ]`: tests only read, but `-v` and arithmetic comparisons evaluate
    /// array subscripts in variable values, which can run commands.
    fn check_test(&self, node: Node) -> Check {
        // In `[ … ]` (the builtin, parsed when it runs) an unquoted word can split into
        // several, `-v` among them.
        let single = node.child(0).is_some_and(|c| c.kind() == "[");
        let mut has_variable = false;
        let mut arithmetic = None;
        let mut stack = vec![node];
        while let Some(n) = stack.pop() {
            match n.kind() {
                "test_operator" => {
                    let op = self.text(n);
                    if matches!(op, "-v" | "-R") {
                        return Err(format!("test `{op}` evaluates array subscripts"));
                    }
                    if matches!(op, "-eq" | "-ne" | "-lt" | "-le" | "-gt" | "-ge") {
                        arithmetic = Some(op.to_string());
                    }
                }
                "simple_expansion" | "expansion" | "word"
                    if single
                        && n.parent().is_some_and(|p| p.kind() != "string")
                        && words::value(n, self.src).is_none() =>
                {
                    return Err(format!(
                        "unquoted `{}` in `[ … ]` can split into operators such as `-v`",
                        self.text(n)
                    ));
                }
                "simple_expansion" | "expansion" => has_variable = true,
                // A bare word next to an arithmetic operator is a variable name there.
                "word" => has_variable |= self.text(n).chars().any(|c| c.is_ascii_alphabetic()),
                _ => {}
            }
            let mut cursor = n.walk();
            stack.extend(n.children(&mut cursor));
        }
        match arithmetic {
            Some(op) if has_variable => Err(format!(
                "test `{op}` on a variable evaluates it as arithmetic, which can run commands"
            )),
            _ => Ok(()),
        }
    }

    /// Git commands that can run configured programs: cleared only by a check of the
    /// repository they run in.
    fn git_config_allows(&mut self, sub: &str, globals: &[String]) -> Check {
        let Some(repo) = self.repo else {
            return Err(format!(
                "`git {sub}` can run programs named in git configuration (core.fsmonitor, \
                 diff.external, textconv drivers); the repository's configuration was not checked"
            ));
        };
        if self.changes_dir {
            return Err(format!(
                "`git {sub}` after a directory change runs in a repository whose configuration \
                 was not checked"
            ));
        }
        let hazard = self
            .git_hazard
            .entry(globals.to_vec())
            .or_insert_with(|| git::config_hazard(repo, globals))
            .clone();
        match hazard {
            None => Ok(()),
            Some(h) => Err(format!(
                "`git {sub}` would run a program configured for this repository ({h})"
            )),
        }
    }

    /// Any git command pages its output when stdout is a terminal, which the commands of
    /// other agents (and MCP's `check_command` asked for them) have: cleared only when the
    /// repository's own configuration names no pager (see [`git::pager_hazard`]).
    fn git_pager_allows(&mut self, sub: &str, globals: &[String]) -> Check {
        let Some(repo) = self.repo else {
            return Err(format!(
                "`git {sub}` may start a pager named in the repository's configuration, which \
                 was not checked"
            ));
        };
        if self.changes_dir {
            return Err(format!(
                "`git {sub}` after a directory change runs in a repository whose configuration \
                 was not checked"
            ));
        }
        let hazard = self
            .git_pager
            .entry(globals.to_vec())
            .or_insert_with(|| git::pager_hazard(repo, globals))
            .clone();
        match hazard {
            None => Ok(()),
            Some(h) => Err(format!(
                "`git {sub}` would start a pager configured for this repository ({h}), a \
                 program of the repository's choosing whenever stdout is a terminal"
            )),
        }
    }
}

/// `1`, `2-` (move), `-` (close): descriptor targets of `>&`.
fn is_fd_target(s: &str) -> bool {
    s == "-"
        || (!s.is_empty()
            && s.trim_end_matches('-').chars().all(|c| c.is_ascii_digit())
            && !s.trim_end_matches('-').is_empty())
}

fn first_error(node: Node) -> Option<Node> {
    if node.is_error() || node.is_missing() {
        return Some(node);
    }
    let mut cursor = node.walk();
    let children: Vec<Node> = node.children(&mut cursor).collect();
    children.into_iter().find_map(first_error)
}
