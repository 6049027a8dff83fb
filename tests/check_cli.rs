//! `shade check-command` through the built binary: output, exit statuses, JSON, usage
//! errors, and git commands judged against real repositories whose configuration does (and,
//! when run, demonstrably does) make them run programs.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output, Stdio};

/// Run `shade check-command ARGS` in `dir`, with no user or system git configuration.
fn check_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shade"))
        .arg("check-command")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env_remove("GIT_EXTERNAL_DIFF")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn git(dir: &Path, args: &[&str]) -> Output {
    let o = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.com")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.com")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "git {args:?}: {o:?}");
    o
}

/// A repository with one committed file, then modified so `git diff` has work to do.
fn repo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    git(dir.path(), &["init", "-q"]);
    std::fs::write(dir.path().join("a.txt"), "one\n").unwrap();
    git(dir.path(), &["add", "a.txt"]);
    git(dir.path(), &["commit", "-qm", "a"]);
    std::fs::write(dir.path().join("a.txt"), "two\n").unwrap();
    dir
}

/// An executable script that records that it ran by creating `marker`.
fn marker_program(dir: &Path, name: &str, marker: &Path) -> String {
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!("#!/bin/sh\ntouch '{}'\nexit 0\n", marker.display()),
    )
    .unwrap();
    Command::new("chmod").arg("+x").arg(&path).status().unwrap();
    path.display().to_string()
}

#[test]
fn read_only_and_not_with_reasons_and_exit_statuses() {
    let dir = tempfile::tempdir().unwrap();
    let o = check_in(dir.path(), &["grep -rn TODO src | sort | head -5"]);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(stdout(&o), "read-only\n");

    for (script, reason) in [
        ("sed -i s/a/b/ f", "`sed -i` edits files in place"),
        ("cat a > out.txt", "output redirection to `out.txt`"),
        (
            "curl https://example.com",
            "`curl` is not on the read-only list",
        ),
        (
            "ls && /bin/rm -rf x",
            "`/bin/rm` is not on the read-only list",
        ),
        (
            "FOO=$(id) ls",
            "command substitution `$(id)` runs another command",
        ),
    ] {
        let o = check_in(dir.path(), &[script]);
        assert_eq!(o.status.code(), Some(1), "{script}");
        assert_eq!(stdout(&o), format!("not read-only: {reason}\n"), "{script}");
    }
}

#[test]
fn json_output() {
    let dir = tempfile::tempdir().unwrap();
    let o = check_in(dir.path(), &["--json", "ls -la"]);
    assert_eq!(o.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"read_only": true, "reason": null, "needs_network": false})
    );

    let o = check_in(dir.path(), &["--json", "git fetch origin && git log"]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["read_only"], false);
    assert_eq!(v["needs_network"], true);
    assert!(v["reason"].as_str().unwrap().contains("`git fetch`"), "{v}");
}

#[test]
fn usage_errors_exit_125() {
    let dir = tempfile::tempdir().unwrap();
    for args in [&[][..], &["--bogus", "ls"][..], &["ls", "extra"][..]] {
        let o = check_in(dir.path(), args);
        assert_eq!(o.status.code(), Some(125), "{args:?}: {o:?}");
        assert!(o.stdout.is_empty());
    }
    let o = check_in(dir.path(), &["-C", "/nonexistent/dir", "ls"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent/dir"));
    let o = check_in(dir.path(), &["--help"]);
    assert_eq!(o.status.code(), Some(0));
}

/// In a repository with no program-running configuration, git's read commands are read-only.
#[test]
fn git_reads_in_a_clean_repository() {
    let r = repo();
    for script in [
        "git status",
        "git diff",
        "git log --oneline",
        "git show HEAD",
    ] {
        let o = check_in(r.path(), &[script]);
        assert_eq!(stdout(&o), "read-only\n", "{script}");
        let o = check_in(Path::new("/"), &["-C", r.path().to_str().unwrap(), script]);
        assert_eq!(stdout(&o), "read-only\n", "-C {script}");
    }
    // Options that make git write or run something stay refused.
    let o = check_in(r.path(), &["git -c diff.external=x diff"]);
    assert_eq!(o.status.code(), Some(1));
}

/// `core.fsmonitor` names a program that `git status` runs: the classifier refuses it, and
/// running the command really does run the program.
#[test]
fn git_status_with_fsmonitor_is_refused_and_really_runs_it() {
    let r = repo();
    let bin = tempfile::tempdir().unwrap();
    let marker = bin.path().join("ran");
    let prog = marker_program(bin.path(), "monitor", &marker);
    git(r.path(), &["config", "core.fsmonitor", &prog]);

    let o = check_in(r.path(), &["git status"]);
    assert_eq!(o.status.code(), Some(1));
    let out = stdout(&o);
    assert!(out.contains("core.fsmonitor"), "{out}");
    assert!(!marker.exists(), "classifying must not run anything");

    git(r.path(), &["status", "--short"]);
    assert!(
        marker.exists(),
        "git status ran the configured fsmonitor program"
    );
}

/// `diff.external` names a program that `git diff` runs.
#[test]
fn git_diff_with_external_diff_is_refused_and_really_runs_it() {
    let r = repo();
    let bin = tempfile::tempdir().unwrap();
    let marker = bin.path().join("ran");
    let prog = marker_program(bin.path(), "extdiff", &marker);
    git(r.path(), &["config", "diff.external", &prog]);

    let o = check_in(r.path(), &["--json", "git diff"]);
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["read_only"], false);
    assert!(
        v["reason"].as_str().unwrap().contains("diff.external"),
        "{v}"
    );
    // Commands that never consult it are still read-only there.
    assert_eq!(
        stdout(&check_in(r.path(), &["git rev-parse HEAD"])),
        "read-only\n"
    );
    assert!(!marker.exists());

    git(r.path(), &["diff"]);
    assert!(marker.exists(), "git diff ran the configured external diff");
}

/// A `post-index-change` hook runs when `git status` refreshes and writes the index.
#[test]
fn git_status_with_an_index_hook_is_refused() {
    let r = repo();
    let hooks = r.path().join(".git/hooks");
    std::fs::create_dir_all(&hooks).unwrap();
    let marker = r.path().join(".git/ran");
    marker_program(&hooks, "post-index-change", &marker);

    let o = check_in(r.path(), &["git status"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stdout(&o).contains("post-index-change"), "{}", stdout(&o));
}

/// A repository configured to run a program from every place git offers a read command:
/// `core.fsmonitor`, a clean filter, a textconv driver, an external diff, signature display
/// and the index hook. Each program appends its name to `ran` in the returned directory.
fn hostile_repo() -> (tempfile::TempDir, tempfile::TempDir) {
    let r = repo();
    git(r.path(), &["tag", "v1"]);
    let bin = tempfile::tempdir().unwrap();
    let ran = bin.path().join("ran");
    let script = |name: &str, body: &str| {
        let path = bin.path().join(name);
        std::fs::write(
            &path,
            format!("#!/bin/sh\necho {name} >> '{}'\n{body}\n", ran.display()),
        )
        .unwrap();
        Command::new("chmod").arg("+x").arg(&path).status().unwrap();
        path.display().to_string()
    };
    let cfg = |k: &str, v: &str| git(r.path(), &["config", k, v]);
    cfg("core.fsmonitor", &script("fsmonitor", "exit 1"));
    cfg("filter.x.clean", &script("clean", "cat"));
    cfg("diff.y.textconv", &script("textconv", "cat \"$1\""));
    cfg("diff.external", &script("external", "exit 0"));
    cfg("gpg.program", &script("gpg", "exit 1"));
    cfg("log.showSignature", "true");
    std::fs::write(r.path().join(".gitattributes"), "* filter=x diff=y\n").unwrap();
    let hooks = r.path().join(".git/hooks");
    std::fs::create_dir_all(&hooks).unwrap();
    std::fs::copy(
        script("post-index-change", "exit 0"),
        hooks.join("post-index-change"),
    )
    .unwrap();
    (r, bin)
}

/// Every git command the classifier calls read-only in a hostile repository really runs
/// none of the configured programs there; the ones it refuses include commands that do.
#[test]
fn accepted_git_commands_run_no_configured_program() {
    let (r, bin) = hostile_repo();
    let ran = bin.path().join("ran");
    let commands = [
        "git rev-parse HEAD",
        "git rev-parse --verify HEAD",
        "git ls-tree -r HEAD",
        "git cat-file -p HEAD:a.txt",
        "git rev-list HEAD",
        "git merge-base HEAD HEAD",
        "git show-ref",
        "git for-each-ref",
        "git name-rev HEAD",
        "git count-objects -v",
        "git var GIT_EDITOR",
        "git version",
        "git describe --tags",
        "git branch",
        "git branch -a -vv",
        "git branch --show-current",
        "git branch --list 'm*'",
        "git tag",
        "git tag -l",
        "git remote -v",
        "git config --list",
        "git config --get user.name",
        "git worktree list",
        "git ls-files",
        "git ls-files -m",
        "git grep -n one",
        "git check-ignore x",
        "git check-attr -a a.txt",
        "git status",
        "git diff",
        "git log -p",
        "git log --oneline",
        "git show HEAD",
        "git blame a.txt",
        "git shortlog -s HEAD",
        "git stash list",
        "git reflog",
        "git diff-files",
        "git diff-index HEAD",
        "git diff-tree -p HEAD",
        "git describe --dirty",
    ];
    let mut accepted = 0;
    let mut refused_but_runs = 0;
    for cmd in commands {
        let _ = std::fs::remove_file(&ran);
        let read_only = check_in(r.path(), &[cmd]).status.code() == Some(0);
        let o = Command::new("sh")
            .args(["-c", cmd])
            .current_dir(r.path())
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_PAGER", "cat")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let programs = std::fs::read_to_string(&ran).unwrap_or_default();
        if read_only {
            accepted += 1;
            assert!(
                programs.is_empty(),
                "{cmd} was called read-only but ran {programs:?} ({o:?})"
            );
        } else if !programs.is_empty() {
            refused_but_runs += 1;
        }
    }
    // The fixture is hostile enough to matter, and the check is not refusing everything.
    assert!(refused_but_runs >= 10, "{refused_but_runs}");
    assert!(accepted >= 20, "{accepted}");
}

/// A commit carrying a (fake) signature, so `%G?` makes git verify it with `gpg.program`.
fn signed_commit(r: &Path) {
    let tree = stdout(&git(r, &["rev-parse", "HEAD^{tree}"]));
    let parent = stdout(&git(r, &["rev-parse", "HEAD"]));
    let object = format!(
        "tree {}\nparent {}\nauthor t <t@example.com> 1700000000 +0000\n\
         committer t <t@example.com> 1700000000 +0000\n\
         gpgsig -----BEGIN PGP SIGNATURE-----\n \n iQEzBAABCAAdFiEE\n -----END PGP SIGNATURE-----\n\nsigned\n",
        tree.trim(),
        parent.trim()
    );
    let path = r.join(".git/signed-commit");
    std::fs::write(&path, object).unwrap();
    let id = stdout(&git(
        r,
        &["hash-object", "-w", "-t", "commit", path.to_str().unwrap()],
    ));
    git(r, &["update-ref", "HEAD", id.trim()]);
}

/// `format.pretty` (directly, or naming a `pretty.<alias>`) with `%G?` makes `git log` run
/// `gpg.program`: not read-only, and running it really runs the program.
#[test]
fn git_log_with_a_signature_format_is_refused_and_really_runs_gpg() {
    let r = repo();
    signed_commit(r.path());
    let bin = tempfile::tempdir().unwrap();
    let marker = bin.path().join("ran");
    let prog = marker_program(bin.path(), "gpg", &marker);
    git(r.path(), &["config", "gpg.program", &prog]);
    for (key, value) in [("format.pretty", "%h %G? %s"), ("pretty.sig", "%H %G?")] {
        git(r.path(), &["config", key, value]);
        if key == "pretty.sig" {
            git(r.path(), &["config", "format.pretty", "sig"]);
        }
        for script in ["git log -1", "git show --no-patch"] {
            let o = check_in(r.path(), &[script]);
            assert_eq!(o.status.code(), Some(1), "{key}: {script}");
            assert!(stdout(&o).contains(key), "{key}: {}", stdout(&o));
        }
        assert!(!marker.exists(), "classifying must not run anything");
        git(r.path(), &["log", "-1"]);
        assert!(marker.exists(), "git log ran gpg.program ({key})");
        std::fs::remove_file(&marker).unwrap();
        git(r.path(), &["config", "--unset", key]);
    }
    // The same through `-c` in a clean repository.
    git(r.path(), &["config", "--unset", "format.pretty"]);
    let o = check_in(r.path(), &["git -c 'format.pretty=%G?' log -1"]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert_eq!(stdout(&check_in(r.path(), &["git log -1"])), "read-only\n");
}

/// An embedded repository added as a gitlink (or a submodule) is entered by `git status` and
/// `git diff`, which run its own `core.fsmonitor`: its configuration is checked too, and so
/// is the repository `-C` names.
#[test]
fn git_status_runs_an_embedded_repositorys_fsmonitor_and_is_refused() {
    let r = repo();
    let inner = r.path().join("inner");
    std::fs::create_dir(&inner).unwrap();
    git(&inner, &["init", "-q"]);
    git(&inner, &["commit", "-q", "--allow-empty", "-m", "i"]);
    git(r.path(), &["add", "inner"]);
    git(r.path(), &["commit", "-qm", "embed"]);
    assert_eq!(stdout(&check_in(r.path(), &["git status"])), "read-only\n");

    let bin = tempfile::tempdir().unwrap();
    let marker = bin.path().join("ran");
    let prog = marker_program(bin.path(), "monitor", &marker);
    git(&inner, &["config", "core.fsmonitor", &prog]);
    for script in ["git status", "git diff", "git -C inner status"] {
        let o = check_in(r.path(), &[script]);
        assert_eq!(o.status.code(), Some(1), "{script}: {}", stdout(&o));
        assert!(stdout(&o).contains("core.fsmonitor"), "{}", stdout(&o));
    }
    assert!(!marker.exists(), "classifying must not run anything");
    git(r.path(), &["status", "--short"]);
    assert!(marker.exists(), "git status ran the embedded fsmonitor");
}

/// Runs `script` in `dir` on a pseudo-terminal (util-linux `script`), as an agent that runs
/// commands in a pty would, killed after 30 seconds.
fn on_a_terminal(dir: &Path, script: &str) {
    let o = Command::new("timeout")
        .args(["-s", "KILL", "30", "script", "-qec", script, "/dev/null"])
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env_remove("GIT_PAGER")
        .env_remove("PAGER")
        .stdin(Stdio::null())
        .output()
        .expect("this test needs util-linux `script` and coreutils `timeout`");
    assert_ne!(o.status.code(), Some(137), "{script} hung on the terminal");
}

/// A pager named by `-c` (`core.pager`, `pager.<cmd>`) or by the repository's own
/// configuration runs whenever git's stdout is a terminal — and agents run commands in a
/// pty — so the verdict does not depend on stdout: not read-only, and on a terminal git
/// really starts it. `cat`/`false` (no pager) and the user's global pager stay read-only.
#[test]
fn git_with_a_pager_is_refused_and_really_runs_it_on_a_terminal() {
    let r = repo();
    let tools = tempfile::tempdir().unwrap();
    let marker = tools.path().join("pager-ran");
    let pager = marker_program(tools.path(), "pager", &marker);
    for script in [
        format!("git -c core.pager='{pager}' log"),
        format!("git -c pager.log='{pager}' log"),
        format!("git -c core.pager='{pager}' rev-parse HEAD"),
        "git -c core.pager='sh -c id' log".to_string(),
        format!("git -ccore.pager={pager} branch"),
    ] {
        let o = check_in(r.path(), &[&script]);
        assert_eq!(o.status.code(), Some(1), "{script}: {}", stdout(&o));
        assert!(stdout(&o).contains("names a program"), "{}", stdout(&o));
    }
    on_a_terminal(r.path(), &format!("git -c core.pager='{pager}' log"));
    assert!(
        marker.exists(),
        "git did not start the -c pager on a terminal"
    );

    // Set in the repository's own configuration: every git command may page.
    std::fs::remove_file(&marker).unwrap();
    git(r.path(), &["config", "core.pager", &pager]);
    for script in ["git log", "git branch", "git rev-parse HEAD"] {
        let o = check_in(r.path(), &[script]);
        assert_eq!(o.status.code(), Some(1), "{script}: {}", stdout(&o));
        assert!(
            stdout(&o).contains("core.pager in local configuration"),
            "{script}: {}",
            stdout(&o)
        );
    }
    on_a_terminal(r.path(), "git branch");
    assert!(marker.exists(), "git did not start the repository's pager");
    // … unless told not to page.
    for script in ["git --no-pager log", "git -P branch"] {
        let o = check_in(r.path(), &[script]);
        assert_eq!(o.status.code(), Some(0), "{script}: {}", stdout(&o));
    }
    git(r.path(), &["config", "--unset", "core.pager"]);
    git(r.path(), &["config", "pager.status", &pager]);
    let o = check_in(r.path(), &["git status"]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    git(r.path(), &["config", "--unset", "pager.status"]);

    // No pager, or the default one switched on or off: read-only.
    for script in [
        "git -c core.pager=cat log",
        "git -c pager.log=false log",
        "git -c color.ui=never log",
        "git log",
    ] {
        let o = check_in(r.path(), &[script]);
        assert_eq!(o.status.code(), Some(0), "{script}: {}", stdout(&o));
    }
    // The user's own global pager is the user's.
    let global = tools.path().join("gitconfig");
    std::fs::write(&global, format!("[core]\n\tpager = {pager}\n")).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_shade"))
        .args(["check-command", "git log"])
        .current_dir(r.path())
        .env("GIT_CONFIG_GLOBAL", &global)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
}

/// Any other `-c` key naming a program is refused, whatever the subcommand.
#[test]
fn git_dash_c_naming_a_program_is_refused() {
    let r = repo();
    for key in [
        "core.editor=x",
        "core.sshCommand=x",
        "core.askPass=x",
        "sequence.editor=x",
        "alias.lg=!id",
        "credential.helper=x",
        "gpg.program=x",
        "gpg.ssh.program=x",
        "diff.x.textconv=x",
        "diff.external=x",
        "core.fsmonitor=x",
        "difftool.x.cmd=x",
        "merge.x.driver=x",
        "interactive.diffFilter=x",
        "remote.origin.uploadpack=x",
    ] {
        let script = format!("git -c '{key}' log");
        let o = check_in(r.path(), &[&script]);
        assert_eq!(o.status.code(), Some(1), "{script}: {}", stdout(&o));
        assert!(
            stdout(&o).contains("names a program"),
            "{script}: {}",
            stdout(&o)
        );
    }
}
