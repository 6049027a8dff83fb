//! Every rule from both sides: what passes as read-only, what does not and with which reason.
#![allow(clippy::unwrap_used)]

use super::git::key_runs_programs;
use super::options::{options, Opt, OptSpec};
use super::*;

/// An empty repository with no configuration of its own: git commands are judged in it
/// (without a repository to check, any git command may start a configured pager).
fn clean_repo() -> &'static Path {
    static REPO: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    REPO.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let st = std::process::Command::new("git")
            .args(["init", "-q"])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(st.success());
        dir
    })
    .path()
}

#[track_caller]
fn read_only(scripts: &[&str]) {
    for s in scripts {
        let git = s.contains("git");
        let v = if git {
            classify_in(s, clean_repo())
        } else {
            classify(s)
        };
        assert!(v.read_only, "{s:?} should be read-only, got {:?}", v.reason);
        assert_eq!(v.reason, None, "{s:?}");
        if !git {
            assert!(is_read_only(s), "{s:?}");
        }
    }
}

/// Each script is refused, and its reason contains the given text.
#[track_caller]
fn refused(cases: &[(&str, &str)]) {
    for (s, why) in cases {
        let v = classify(s);
        assert!(!v.read_only, "{s:?} should not be read-only");
        assert!(!is_read_only(s), "{s:?}");
        let reason = v.reason.unwrap_or_default();
        assert!(
            reason.contains(why),
            "{s:?}: reason {reason:?} should mention {why:?}"
        );
    }
}

#[test]
fn plain_reads_and_combinations() {
    read_only(&[
        "ls -la",
        "ls -la src/ | head -n 20",
        "cat src/main.rs | grep -n 'fn main' | wc -l",
        "pwd && ls; echo done || true",
        "grep -rn 'a|b' src/ --include '*.rs'",
        "wc -l *.rs",
        "head -c 100 \"$HOME/.profile\"",
        "echo \"$PATH\" ${HOME} $1",
        "stat -c %s Cargo.toml; du -sh target; df -h .",
        "diff -u a.txt b.txt",
        "printf '%s\\n' a b c | sort | uniq -c | sort -rn",
        "tail -n 50 log.txt # the end",
        "jq '.name' package.json",
        "/usr/bin/cat README.md",
        "l\"\"s -la",
        "\\ls",
        "which cargo; type ls; command -v git",
        "cut -d: -f1 /etc/passwd | tr a-z A-Z | nl",
        "env",
        "env -0",
        "ls |& head",
        "sha256sum Cargo.lock && md5sum README.md",
    ]);
}

#[test]
fn nothing_to_run_and_parse_errors() {
    refused(&[
        ("", "no command"),
        ("   # only a comment", "no command"),
        ("ls )", "does not understand"),
        ("ls &&", "does not understand"),
        ("echo 'unterminated", "does not understand"),
        ("ls <>f", "does not understand"),
        ("if true; then ls", "does not understand"),
    ]);
}

#[test]
fn redirections() {
    read_only(&[
        "ls 2>&1",
        "ls >&2",
        "ls 2>&1 | head",
        "ls 2>/dev/null",
        "ls >/dev/null 2>&1",
        "ls &>/dev/null",
        "ls 3>&-",
        "ls 2>&-",
        "echo x 1>&2-",
        "cat < input.txt",
        "wc -l <<< \"$x\"",
        "cat <<'EOF'\nhello\nEOF",
        "cat <<EOF\nhello $USER\nEOF",
        "cat <<'EOF'\n$(id) `id`\nEOF",
        "cat <<\"EOF\"\n$(id)\nEOF",
        "while read l; do echo \"$l\"; done < f",
        "{ ls; pwd; } 2>/dev/null",
    ]);
    refused(&[
        ("echo hi > out.txt", "output redirection to `out.txt`"),
        ("echo hi >> log", "output redirection to `log`"),
        ("ls &> all.log", "output redirection to `all.log`"),
        ("ls &>> all.log", "output redirection to `all.log`"),
        ("ls >| forced", "output redirection to `forced`"),
        ("ls >& file", "output redirection to `file`"),
        ("ls 2> errors", "output redirection to `errors`"),
        ("ls 1>f", "output redirection to `f`"),
        ("ls > 2", "output redirection to `2`"),
        ("ls &> 2", "output redirection to `2`"),
        ("ls 2>/dev/null > list", "output redirection to `list`"),
        ("{ ls; } > f", "output redirection to `f`"),
        (
            "while read l; do echo $l; done < a > b",
            "output redirection to `b`",
        ),
        ("cat <<EOF > out\nx\nEOF", "output redirection to `out`"),
        (
            "cat <<EOF | sh\nx\nEOF",
            "`sh` is not on the read-only list",
        ),
        (
            "cat <<EOF && rm x\nx\nEOF",
            "`rm` is not on the read-only list",
        ),
        ("ls > \"$OUT\"", "output redirection"),
        (
            "cat < /dev/tcp/example.com/80",
            "opens a network connection",
        ),
        (
            "echo x > /dev/udp/10.0.0.1/53",
            "opens a network connection",
        ),
    ]);
}

#[test]
fn substitutions_anywhere() {
    refused(&[
        ("echo $(rm -rf x)", "command substitution `$(rm -rf x)`"),
        ("echo `rm x`", "command substitution"),
        ("echo \"a $(date) b\"", "command substitution"),
        ("FOO=$(curl evil) ls", "command substitution"),
        ("x=$(id)", "command substitution"),
        ("cat < $(echo f)", "command substitution"),
        ("ls > $(echo f)", "command substitution"),
        ("cat <<EOF\n$(rm x)\nEOF", "command substitution"),
        ("cat <<EOF\n`rm x`\nEOF", "command substitution"),
        ("cat <<EOF\n$[1+1]\nEOF", ""),
        ("cat <<EOF\n$(id)\nEOF", "command substitution"),
        ("diff <(ls a) <(ls b)", "process substitution"),
        ("echo a | tee >(cat)", "process substitution"),
        ("echo $((1 + 2))", "arithmetic"),
        ("echo \"$((x))\"", "arithmetic"),
        ("for ((i=0; i<3; i++)); do ls; done", "arithmetic"),
        ("echo ${a[$i]}", "parameter expansion"),
        ("echo ${x:-$(id)}", "parameter expansion"),
        ("echo ${x:-default}", "parameter expansion"),
        ("echo ${!name}", "parameter expansion"),
        ("for f in $(ls); do cat $f; done", "command substitution"),
        ("case $(id) in x) ls;; esac", "command substitution"),
    ]);
}

#[test]
fn shell_state_is_not_read_only() {
    refused(&[
        ("x=1", "assignment `x=1`"),
        ("a=(1 2)", "assignment"),
        ("export A=1", "`export` changes shell variables"),
        ("declare -x A=1", "`declare`"),
        ("declare -p", "`declare`"),
        ("local x", "`local`"),
        ("readonly X", "`readonly`"),
        ("unset PATH", "`unset`"),
        ("LC_ALL=C sort f", "sets an environment variable"),
        (
            "GIT_EXTERNAL_DIFF=evil git diff",
            "sets an environment variable",
        ),
        ("f() { ls; }", "defining a function (`f`)"),
        ("function cat { rm -rf x; }; cat", "defining a function"),
        ("ls &", "in the background"),
        ("sleep 100 & ls", "in the background"),
        ("ls ;; pwd", "`;;` is not understood here"),
        ("eval ls", "`eval` is not on the read-only list"),
        ("source x.sh", "`source` is not on the read-only list"),
        (". x.sh", "`.` is not on the read-only list"),
        ("exec ls", "`exec`"),
        ("command rm x", "`command` runs the program"),
        ("builtin cd /", "`builtin`"),
        ("select x in a b; do ls; done", "`select`"),
    ]);
}

#[test]
fn control_flow_is_read_only_when_its_commands_are() {
    read_only(&[
        "if [ -f Cargo.toml ]; then cat Cargo.toml; else ls; fi",
        "for f in src/*.rs; do wc -l \"$f\"; done",
        "while true; do ls; break; done",
        "until false; do pwd; done",
        "case \"$1\" in a) ls;; *) pwd;; esac",
        "(cd src && ls)",
        "{ ls; pwd; }",
        "! grep -q x f",
        "[[ -d target && ! -e x ]] && ls target",
        "[[ \"$a\" == x* ]]",
        "[ \"$a\" = b ] || echo no",
        "test -n \"$x\" && echo set",
        "[ 1 -eq 1 ]",
        "while read -r line; do echo \"$line\"; done < f",
        "read -a parts x y",
        "for f in a b; do continue; done",
    ]);
    refused(&[
        (
            "if true; then rm x; fi",
            "`rm` is not on the read-only list",
        ),
        ("for f in *; do rm $f; done", "`rm`"),
        ("while true; do touch x; done", "`touch`"),
        ("(cd src && make)", "`make`"),
        ("! mkdir d", "`mkdir`"),
        ("case x in a) ls > f;; esac", "output redirection"),
        ("[[ -v 'a[$(id)]' ]]", "evaluates array subscripts"),
        ("[ -v x ]", "evaluates array subscripts"),
        ("test -v 'a[$(id)]'", "evaluates array subscripts"),
        ("[[ $n -eq 1 ]]", "arithmetic"),
        ("[[ n -gt 1 ]]", "arithmetic"),
        ("[ $a ]", "unquoted `$a`"),
        ("read PATH", "`read PATH` sets a variable"),
        ("read IFS", "not a plain lower-case name"),
        ("read 'a[$(id)]'", "not a plain lower-case name"),
        (
            "for PATH in /tmp; do ls; done",
            "`for PATH` sets a variable",
        ),
        ("for a in -v; do test $a x; done", "can become an operator"),
        ("test \"$a\" \"$b\"", "can become an operator"),
    ]);
}

#[test]
fn program_names_are_matched_exactly() {
    refused(&[
        ("rm -rf /", "`rm` is not on the read-only list"),
        ("/bin/rm -rf /", "`/bin/rm` is not on the read-only list"),
        (
            "/usr/bin/rm x",
            "`/usr/bin/rm` is not on the read-only list",
        ),
        ("RM -rf /", "`RM` is not on the read-only list"),
        ("Cat f", "`Cat` is not on the read-only list"),
        ("./cat f", "`./cat` runs a program by path"),
        ("bin/ls", "runs a program by path"),
        ("/tmp/ls", "runs a program by path"),
        ("$CMD x", "program name `$CMD` is only known"),
        ("\"$EDITOR\" f", "only known when the command runs"),
        ("r\"\"m x", "`rm` is not on the read-only list"),
        ("\\rm x", "`rm` is not on the read-only list"),
        (
            "python3 script.py",
            "`python3` is not on the read-only list",
        ),
        ("cargo test", "`cargo` is not on the read-only list"),
        (
            "curl https://example.com",
            "`curl` is not on the read-only list",
        ),
    ]);
    let v = classify("/bin/rm x");
    assert!(!v.read_only);
}

#[test]
fn find() {
    read_only(&[
        "find . -name '*.rs'",
        "find . -type f -newer Cargo.toml -print",
        "find src -maxdepth 2 -print0 | xargs -0 wc -l",
    ]);
    refused(&[
        (
            "find . -exec rm {} \\;",
            "`find -exec` runs another program",
        ),
        ("find . -execdir ls \\;", "`find -execdir`"),
        ("find . -ok rm {} \\;", "`find -ok`"),
        ("find . -okdir rm {} \\;", "`find -okdir`"),
        ("find . -delete", "`find -delete` deletes files"),
        ("find . -fprint out", "`find -fprint` writes to a file"),
        ("find . -fprint0 out", "`find -fprint0`"),
        ("find . -fprintf out %p", "`find -fprintf`"),
        ("find . -fls out", "`find -fls`"),
        ("find . $ACTION", "`$ACTION` is only known"),
        ("find *", "`*` is only known"),
        ("find . -name x -o -delete", "deletes"),
        ("find . {-delete,}", "only known"),
    ]);
}

#[test]
fn sed() {
    read_only(&[
        "sed -n '1,20p' src/main.rs",
        "sed 's/foo/bar/g' f",
        "sed -e 's/a/b/' -e '/x/d' f",
        "sed -n '/start/,/end/{p;}' f",
        "sed -E 's|/usr|/opt|2' f",
        "sed -n '$p' f",
        "sed 's/a\\/b/c/;s/x/y/gI' f",
        "sed '1~2d;3q' f",
        "sed --expression='y/abc/xyz/' f",
        "sed -ne 's/x/y/p' f",
        "sed '/^#/a\\\nappended' f",
        "sed 'i\\header' f",
        "sed 's/[0-9]\\+/N/g; s/[^a-z]//' f",
        "sed -n '/[/]/p' f",
    ]);
    refused(&[
        ("sed -i 's/a/b/' f", "`sed -i` edits files in place"),
        ("sed -i.bak 's/a/b/' f", "`sed -i` edits files in place"),
        ("sed -ni 's/a/b/' f", "`sed -i`"),
        ("sed 's/a/b/' -i f", "`sed -i`"),
        ("sed --in-place 's/a/b/' f", "`sed --in-place`"),
        ("sed --in-pl 's/a/b/' f", "`sed --in-place`"),
        ("sed -I.bak 's/a/b/' f", "`sed -I` edits files in place"),
        ("sed -nI .bak 's/a/b/' f", "`sed -I`"),
        (
            "sed -f script.sed f",
            "`sed -f` reads its script from a file",
        ),
        ("sed '1e rm x' f", "`sed` command `e` runs a shell command"),
        ("sed 's/a/b/e' f", "`sed s///e`"),
        ("sed 's/a/b/w out' f", "`sed s///w` writes"),
        ("sed -n '/x/w out' f", "`sed` command `w` writes"),
        ("sed 'W out' f", "command `W` writes"),
        ("sed 'r /etc/passwd' f", "command `r` reads a file"),
        ("sed '1R other' f", "command `R`"),
        ("sed \"$SCRIPT\" f", "only known"),
        ("sed -n p *.txt", "`*.txt` is only known"),
        ("sed 's/a/b' f", "unterminated"),
        ("sed 'k' f", "command `k` is not understood"),
        ("sed -n xp f", "`p` after a command"),
        // GNU sed reads `[/]` as a bracket: the regex ends at the third `/`, and `w` follows.
        ("sed 's/[/]/g;s|/w out|x|' f", "`sed s///w` writes"),
        ("sed -n '/[/]/w out' f", "command `w` writes"),
        ("sed 's/[[:alpha:]/]/x/w out' f", "`sed s///w`"),
        ("sed 's/[]/]/x/w out' f", "`sed s///w`"),
        ("sed 's/[/x/' f", "unterminated"),
    ]);
}

#[test]
fn awk() {
    read_only(&[
        "awk '{print $1}' f",
        "awk -F: '{ print $1, $3 }' /etc/passwd",
        "awk -v n=3 'NR > n { print }' f",
        "awk '$3 > 100 { n++ } END { print n }' f",
        "awk 'a || b { print }' f",
        "gawk 'BEGIN { x = 1 }' *.txt",
    ]);
    refused(&[
        (
            "awk 'BEGIN { system(\"rm x\") }'",
            "`system()` runs a shell command",
        ),
        ("awk '{ print > \"out\" }' f", "output redirection"),
        (
            "awk '{ printf \"%s\", $1 >> \"out\" }' f",
            "output redirection",
        ),
        ("awk '{ print | \"sh\" }' f", "pipe"),
        ("awk 'BEGIN { \"date\" | getline d }'", "pipe"),
        ("awk 'BEGIN { getline l < \"/etc/passwd\" }'", "`getline`"),
        (
            "awk -f prog.awk f",
            "`awk -f` reads its program from a file",
        ),
        (
            "gawk -o out '{print}' f",
            "`gawk -o` is not on the read-only list",
        ),
        ("gawk -l ext 'BEGIN{}'", "not on the read-only list"),
        ("mawk -W exec x", "not on the read-only list"),
        ("awk '@load \"x\"'", "`@…`"),
        ("awk '/\"/ { system(\"rm x\") } /\"/' f", "`system()`"),
        ("awk \"$PROG\" f", "only known"),
    ]);
}

#[test]
fn output_options_of_other_programs() {
    read_only(&[
        "sort -rn f",
        "sort -t, -k2 f",
        "sort -to f",
        "uniq -c f",
        "uniq -f 2 f",
        "tree -L 2 src",
        "tee",
        "echo x | tee -a",
        "dd if=/dev/zero bs=1 count=4 status=none",
        "date +%s",
        "date -d yesterday +%F",
        "file -b Cargo.toml",
        "rg -n 'fn main' src",
        "rg --pre-glob '*.gz' x",
        "rg -e -z x",
        "rg -- -z x",
        "base64 -d f",
        "base64 -w0 f",
        "fd -e rs",
        "fd -t x",
        "xargs",
        "echo a b | xargs -n1 echo",
        "find . -name '*.rs' | xargs grep -n foo",
        "ls | xargs -I{} wc -l {}",
        "env LANG=C",
        "printf -v out '%s' x",
        "printf '%s\\n' \"$x\"",
    ]);
    refused(&[
        ("sort -o out f", "`sort -o` writes"),
        ("sort -rno out f", "`sort -o`"),
        ("sort --output=out f", "`sort --output`"),
        ("sort --out out f", "`sort --output`"),
        ("sort --compress-program=sh f", "runs another program"),
        ("sort {-o,output} input", "only known when the command runs"),
        ("sort -{o,} x", "only known"),
        (
            "uniq in.txt out.txt",
            "`uniq IN OUT` writes its output to `out.txt`",
        ),
        ("uniq -c in out", "writes its output to `out`"),
        ("tree -o out.txt", "`tree -o` writes"),
        ("tee out.txt", "`tee out.txt` writes to `out.txt`"),
        ("echo x | tee -a log", "`tee log`"),
        ("dd if=a of=b", "`dd of=b` writes to a file"),
        ("dd if=/dev/zero of=/dev/sda", "`dd of=/dev/sda`"),
        ("date -s '2020-01-01'", "`date -s` sets the system clock"),
        ("date --set=now", "`date --set`"),
        ("date 010112002020", "sets the system clock"),
        ("file -C -m magic", "`file -C` writes"),
        ("rg --pre ./x foo", "`rg --pre` runs a program"),
        ("rg --pre=sh foo", "`rg --pre`"),
        ("rg --hostname-bin=./x foo", "`rg --hostname-bin`"),
        ("rg -iz foo a.gz", "`rg -z` runs decompression programs"),
        ("rg --search-zip foo", "`rg --search-zip`"),
        ("base64 -o out in", "`base64 -o` writes"),
        ("base64 -oout in", "`base64 -o`"),
        ("base64 --output=out in", "`base64 --output`"),
        ("tree -R -H . ", "`tree -R`"),
        ("printf -v PATH /tmp", "`printf -v PATH`"),
        ("printf \"$fmt\" x", "only known"),
        ("fd -x rm", "`fd --exec`"),
        ("fd --exec-batch rm", "`fd --exec`"),
        ("fd -X rm", "`fd --exec`"),
        ("env rm -rf x", "`env rm` runs `rm`"),
        ("env A=1 sh -c x", "`env sh` runs `sh`"),
        ("env -S 'rm x'", "`env -S` is not on the read-only list"),
        ("xargs rm", "`xargs rm` runs `rm`"),
        ("find . | xargs -0 rm -f", "`xargs rm`"),
        ("ls | xargs -I{} sh -c 'rm {}'", "`xargs sh`"),
        ("ls | xargs sed -i s/a/b/", "`xargs sed`"),
        ("ls | xargs find", "`xargs find`"),
        ("ls | xargs -p echo", "talks to the terminal"),
        ("less README.md", "`less` is interactive"),
        ("more README.md", "`more` is interactive"),
        ("man ls", "interactive"),
        ("vim f", "interactive"),
    ]);
}

#[test]
fn git() {
    read_only(&[
        "git rev-parse HEAD",
        "git rev-parse --verify HEAD",
        "git cat-file -p HEAD",
        "git describe --tags",
        "git branch",
        "git branch -a -vv",
        "git branch --show-current",
        "git branch --list 'feat*'",
        "git branch --contains HEAD",
        "git tag",
        "git tag -l 'v1*'",
        "git remote -v",
        "git remote",
        "git remote get-url origin",
        "git config --get user.name",
        "git config --list",
        "git --no-pager rev-parse HEAD",
        "git worktree list",
        "git for-each-ref --format='%(refname)' refs/heads",
        "git ls-tree -r HEAD -- \"$dir\"",
        "git --version",
    ]);
    refused(&[
        (
            "git commit -m x",
            "`git commit` is not a read-only git command",
        ),
        ("git add .", "`git add`"),
        ("git checkout main", "`git checkout`"),
        ("git reset --hard", "`git reset`"),
        ("git stash", "`git stash`"),
        ("git push", "talks to a remote"),
        ("git fetch origin", "talks to a remote"),
        ("git pull", "talks to a remote"),
        ("git clone u", "talks to a remote"),
        ("git branch -D x", "`git branch -D` changes branches"),
        ("git branch -m a b", "`git branch -m`"),
        (
            "git branch newbranch",
            "`git branch newbranch` creates a branch",
        ),
        ("git branch --set-upstream-to=o/m", "changes branches"),
        ("git tag v1", "`git tag v1` creates a tag"),
        ("git tag -d v1", "`git tag -d`"),
        ("git tag -v v1", "`git tag -v`"),
        ("git remote add o u", "`git remote add`"),
        ("git remote set-url o u", "`git remote set-url`"),
        ("git remote show origin", "`git remote show`"),
        ("git config user.name x", "changes configuration"),
        ("git config --unset user.name", "changes configuration"),
        ("git -c core.fsmonitor=evil status", "names a program"),
        ("git -c diff.external=x diff", "names a program"),
        ("git -c diff.external=x rev-parse HEAD", "names a program"),
        (
            "git --config-env=a.b=C log",
            "sets configuration from the environment",
        ),
        ("git -C /tmp/other log", "configuration was not checked"),
        ("git --git-dir=/x/.git log", "configuration was not checked"),
        ("git --work-tree=/x status", "configuration was not checked"),
        ("git -C \"$d\" log", "only known when the command runs"),
        ("git --exec-path=/tmp log", "helper programs"),
        ("git -p log", "starts a pager"),
        ("git --paginate log", "starts a pager"),
        ("git --bare log", "points git at"),
        ("git log --output=f", "`git log --output` writes"),
        ("git diff --ext-diff", "external diff"),
        ("git log --show-signature", "runs gpg"),
        ("git log '--format=%G?'", "runs gpg"),
        ("git grep -O foo", "pager"),
        ("git grep --open-files-in-pager=vi foo", "pager"),
        ("git cat-file --textconv HEAD:f", "textconv"),
        ("git cat-file --filters HEAD:f", "textconv or filter"),
        ("git describe --dirty", "refreshes the index"),
        ("git log $ARGS", "only known"),
        ("git $SUB", "only known"),
        ("git help log", "`git help`"),
        ("git worktree add x", "`git worktree`"),
        ("git reflog expire --all", "`git reflog`"),
        (
            "git branch -- --list",
            "`git branch --` is not a listing form",
        ),
        ("git branch --list -- -d", "not a listing form"),
        ("git --help commit", "`git --help`"),
        ("git rev-parse --help", "opens the manual"),
    ]);
}

/// Without a repository to check, git commands that can run configured programs are not
/// read-only, and the reason says why.
#[test]
fn git_reads_that_run_configured_programs_need_a_repository_check() {
    for s in [
        "git status",
        "git diff",
        "git diff --stat HEAD~1",
        "git log --oneline -5",
        "git show HEAD",
        "git blame src/main.rs",
        "git shortlog -s",
        "git stash list",
        "git stash show",
        "git reflog",
        "git ls-files -m",
        "git grep -n foo",
        "git check-ignore target",
        "git check-attr -a f",
    ] {
        let v = classify(s);
        assert!(!v.read_only, "{s}");
        let reason = v.reason.unwrap();
        assert!(
            reason.contains("can run programs named in git configuration"),
            "{s}: {reason}"
        );
    }
}

#[test]
fn repository_configuration_decides_git_reads() {
    let dir = tempfile::tempdir().unwrap();
    let git = |args: &[&str]| {
        let st = std::process::Command::new("git")
            .arg("-C")
            .arg(dir.path())
            .args(args)
            .status()
            .unwrap();
        assert!(st.success(), "git {args:?}");
    };
    git(&["init", "-q"]);
    git(&["config", "diff.external", "/bin/false"]);
    let v = classify_in("git diff", dir.path());
    assert!(!v.read_only);
    assert!(v.reason.unwrap().contains("would run a program configured"));
    // Commands that never consult those keys stay read-only in that repository.
    assert!(classify_in("git rev-parse --git-dir", dir.path()).read_only);
    // A directory change makes the check of `dir` say nothing about where git runs.
    let v = classify_in("cd /tmp && git status", dir.path());
    assert!(v.reason.unwrap().contains("after a directory change"));
}

/// `git log` verifies signatures (runs `gpg.program`) when the configured pretty format has a
/// `%G` placeholder, directly or through a `pretty.<alias>`; `-C`, `--git-dir` and `-c` are
/// judged by the configuration they make git use.
#[test]
fn pretty_formats_and_global_options_decide_git_reads() {
    let dir = tempfile::tempdir().unwrap();
    let git = |args: &[&str]| {
        let st = std::process::Command::new("git")
            .arg("-C")
            .arg(dir.path())
            .args(args)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .status()
            .unwrap();
        assert!(st.success(), "git {args:?}");
    };
    git(&["init", "-q"]);
    let clean = tempfile::tempdir().unwrap();
    let clean_dir = clean.path().to_str().unwrap().to_string();
    let st = std::process::Command::new("git")
        .args(["init", "-q", &clean_dir])
        .status()
        .unwrap();
    assert!(st.success());
    assert!(classify_in("git log -1", dir.path()).read_only);

    git(&["config", "format.pretty", "%h %G? %s"]);
    let v = classify_in("git log -1", dir.path());
    assert!(!v.read_only);
    assert!(v.reason.unwrap().contains("format.pretty"));

    git(&["config", "format.pretty", "sig"]);
    git(&["config", "pretty.sig", "%H %G?"]);
    let v = classify_in("git show", dir.path());
    assert!(v.reason.unwrap().contains("pretty.sig"));

    // From a clean repository, `-C` and `--git-dir` into the configured one are refused …
    let target = dir.path().to_str().unwrap();
    for script in [
        format!("git -C {target} log -1"),
        format!("git --git-dir={target}/.git log -1"),
        format!("git --git-dir {target}/.git status"),
    ] {
        let v = classify_in(&script, clean.path());
        assert!(!v.read_only, "{script}");
        assert!(v.reason.unwrap().contains("pretty.sig"), "{script}");
    }
    // … `-C` back into a clean one is read-only, and `-c` is checked as set.
    assert!(classify_in(&format!("git -C {clean_dir} log -1"), dir.path()).read_only);
    assert!(classify_in("git -c color.ui=never log -1", clean.path()).read_only);
    for (script, key) in [
        ("git -c 'format.pretty=%G?' log -1", "format.pretty"),
        ("git -c core.fsmonitor=/tmp/x status", "core.fsmonitor"),
        ("git -c diff.external=x diff", "diff.external"),
        (
            "git -c core.hooksPath=/tmp rev-parse HEAD",
            "core.hookspath",
        ),
    ] {
        let v = classify_in(script, clean.path());
        assert!(!v.read_only, "{script}");
        assert!(v.reason.unwrap().contains(key), "{script}");
    }
}

#[test]
fn configuration_keys_that_run_programs() {
    for (k, v) in [
        ("core.fsmonitor", "/tmp/evil"),
        ("core.fsmonitor", "true"),
        ("core.hooksPath", "hooks"),
        ("diff.external", "x"),
        ("diff.pdf.textconv", "pdftotext"),
        ("diff.foo.bar.command", "x"),
        ("filter.lfs.process", "git-lfs filter-process"),
        ("filter.x.clean", "x"),
        ("filter.x.smudge", "x"),
        ("log.showSignature", "true"),
        ("format.pretty", "%h %G? %s"),
        ("format.pretty", "format:%GS"),
        ("pretty.sig", "%H %G?"),
        ("submodule.lib.url", "u"),
        ("trace2.eventTarget", "/tmp/t"),
    ] {
        assert!(key_runs_programs(k, v), "{k}={v}");
    }
    for (k, v) in [
        ("core.fsmonitor", "false"),
        ("log.showsignature", "false"),
        ("user.name", "x"),
        ("core.pager", "less"),
        ("diff.textconv", "x"),
        ("diff.algorithm", "patience"),
        ("remote.origin.url", "u"),
        ("format.pretty", "oneline"),
        ("pretty.short", "%h %s"),
    ] {
        assert!(!key_runs_programs(k, v), "{k}={v}");
    }
}

#[test]
fn network() {
    for s in [
        "curl https://example.com",
        "wget x",
        "/usr/bin/CURL x",
        "ssh host ls",
        "git fetch",
        "git -C x pull",
        "git push origin main",
        "git clone u",
        "git ls-remote origin",
        "git remote update",
        "git submodule update --init",
        "npm install",
        "npm i left-pad",
        "yarn",
        "pnpm add x",
        "pip install requests",
        "python3 -m pip install x",
        "uv pip install x",
        "cargo install ripgrep",
        "cargo fetch",
        "go get x",
        "apt-get install -y jq",
        "echo $(curl x)",
        "ls && wget x",
        "npx prettier .",
        "cat < /dev/tcp/example.com/80",
    ] {
        let v = classify(s);
        assert!(v.needs_network, "{s} needs the network");
        assert!(!v.read_only, "{s}");
    }
    for s in [
        "ls",
        "git status",
        "git log",
        "cargo build",
        "cargo test",
        "npm test",
        "npm run build",
        "pip list",
        "python3 x.py",
        "echo curl",
        "grep wget f",
    ] {
        assert!(!classify(s).needs_network, "{s} needs no network");
    }
}

#[test]
fn reasons_name_the_first_offending_construct() {
    let v = classify("ls && sed -i s/a/b/ f && rm x");
    assert_eq!(v.reason.as_deref(), Some("`sed -i` edits files in place"));
    let v = classify("cat f > out.txt");
    assert_eq!(v.reason.as_deref(), Some("output redirection to `out.txt`"));
    let v = classify("curl x");
    assert_eq!(
        v.reason.as_deref(),
        Some("`curl` is not on the read-only list")
    );
    assert_eq!(
        v,
        Verdict {
            read_only: false,
            reason: Some("`curl` is not on the read-only list".into()),
            needs_network: true
        }
    );
}

/// The bugs the peer's check had to fix, each as its own case.
#[test]
fn peer_bugs_stay_fixed() {
    refused(&[
        ("env rm -rf /", "`env rm`"),
        ("sort -o f f", "`sort -o`"),
        ("tree -o out", "`tree -o`"),
        ("uniq a b", "`uniq IN OUT`"),
        ("tee f", "`tee f`"),
        ("dd of=f", "`dd of=f`"),
        ("less f", "`less`"),
        ("more f", "`more`"),
        ("FOO=$(curl x)", "command substitution"),
        ("FOO=$(curl x) ls", "command substitution"),
        ("cat < $(echo x)", "command substitution"),
        ("git diff", "git configuration"),
        ("git log", "git configuration"),
        ("git show", "git configuration"),
        ("git status", "git configuration"),
        ("/bin/rm -rf /", "`/bin/rm`"),
        ("RM -rf /", "`RM`"),
    ]);
}

#[test]
fn option_parsing() {
    let spec = OptSpec {
        short_arg: "kt",
        short_optarg: "i",
        long_arg: &["key"],
    };
    let got = options(
        &[
            "-rn", "-k2", "-t", "o", "--key", "3", "-i.bak", "--x=y", "f", "--", "-o",
        ],
        &spec,
    );
    assert_eq!(
        got,
        vec![
            Opt::Short('r', None),
            Opt::Short('n', None),
            Opt::Short('k', Some("2")),
            Opt::Short('t', Some("o")),
            Opt::Long("key", Some("3")),
            Opt::Short('i', Some(".bak")),
            Opt::Long("x", Some("y")),
            Opt::Operand("f"),
            Opt::Operand("-o"),
        ]
    );
}

/// The classes other agents' read-only checks test, in this project's own cases.
#[test]
fn classes_other_agents_test() {
    refused(&[
        // A second command on another line (or after CR LF) is still a command.
        ("grep -n TODO notes.md\nwget http://x/y", "`wget`"),
        ("head README\r\nwget http://x/y", "`wget`"),
        ("cat a\n\nrm b", "`rm`"),
        // A quoted program name is that whole name.
        ("'git status'", "`git status` is not on the read-only list"),
        // Broken lists and pipelines.
        ("cat a | | wc", "does not understand"),
        ("&& ls", "does not understand"),
        ("(pwd ||)", "does not understand"),
        ("{ ; ls; }", "does not understand"),
        // Variables glued to option values, and substitutions inside them.
        ("rg -g\"$GLOB\" needle", "only known"),
        ("rg -g\"$(echo x)\" needle", "command substitution"),
        // Here-documents and here-strings feeding programs that are not allowed.
        ("python3 <<'PY'\nprint(1)\nPY", "`python3`"),
        (
            "PATH=/tmp/x:$PATH cat <<'EOF'\nhi\nEOF",
            "sets an environment variable",
        ),
        ("wc -l <<< \"$(rm -rf /)\"", "command substitution"),
        // awk calling functions by name, and getline in any form.
        ("awk 'BEGIN { f = \"sys\" \"tem\"; @f(\"id\") }'", "`@…`"),
        ("awk '{ getline line; print line }' f", "`getline`"),
        // sed options hidden in clusters or after `--`.
        ("sed -e -i f", "command `-` is not understood"),
        ("sed -- -i f", "not understood"),
        ("sed -nEewout f", "command `w` writes"),
        ("sed -es/a/b/e", "`sed s///e`"),
        // Writers among ordinary readers.
        ("uniq - copy.txt", "`uniq IN OUT`"),
        ("uniq -- -c copy.txt", "`uniq IN OUT`"),
        ("tree -Cofile .", "`tree -o`"),
        ("sort --co=sh f", "runs another program"),
        ("find . -name x -fprint0 list", "`find -fprint0`"),
        // Forced deletes however they are spelled.
        ("/bin/rm -fr /tmp/x", "`/bin/rm`"),
        ("sudo rm -rf /tmp/x", "`sudo`"),
        ("printf x | rm -rf y", "`rm`"),
        ("if test -d d; then rm --force d; fi", "`rm`"),
    ]);
    read_only(&[
        // A backslash-newline joins one command.
        "grep -n needle \\\nnotes.md",
        // Text inserted by sed's `i` command, not a flag.
        "sed -einsert f",
        // Replacement text that merely contains the letter w.
        "sed 's/a/new text/' f",
        "sed 's/a/;w out/' f",
        // awk's close() releases a stream; it neither writes nor runs anything.
        "awk '{ close(\"f\") }' f",
        // An operand after the program is a file name, not code.
        "awk '{ print }' 'print > x'",
        // Escaped braces are literal.
        "git rev-parse \\{\\{",
        "echo '/usr'\"/\"'local'/bin",
    ]);
}

/// A pager set by `-c` is refused with or without a repository; without one, any git
/// command may start the repository's pager, so none is read-only.
#[test]
fn git_pagers_are_refused_whether_or_not_stdout_is_a_terminal() {
    refused(&[
        (
            "git -c core.pager='sh -c id' log",
            "`git -c core.pager` names a program",
        ),
        (
            "git -c pager.log=x log",
            "`git -c pager.log` names a program",
        ),
        ("git -c core.editor=x rev-parse HEAD", "names a program"),
        ("git rev-parse HEAD", "may start a pager"),
    ]);
    assert!(classify_in("git -c core.pager=cat log", clean_repo()).read_only);
    assert!(classify_in("git -c pager.log=false log", clean_repo()).read_only);
    assert!(classify("git --no-pager rev-parse HEAD").read_only);
}
