//! The allow-list: which programs may run in a read-only script, and which of their options
//! or operands write, execute other programs or escape to a shell.

use super::options::{fixed, long_is, options, Opt, OptSpec};
use super::words::Arg;
use super::{awk, git, sed, Check, Walker};

/// Programs with no option that writes a file, runs another program or opens a shell, so
/// any arguments (even ones only known at run time) are fine.
const PLAIN: &[&str] = &[
    "arch",
    ":",
    "b2sum",
    "base32",
    "basename",
    "break",
    "cat",
    "cd",
    "cksum",
    "cmp",
    "column",
    "comm",
    "continue",
    "cut",
    "df",
    "diff",
    "dirname",
    "du",
    "echo",
    "egrep",
    "exit",
    "expand",
    "expr",
    "false",
    "fgrep",
    "fold",
    "free",
    "getconf",
    "grep",
    "groups",
    "head",
    "id",
    "join",
    "jq",
    "locale",
    "ls",
    "md5sum",
    "nl",
    "nproc",
    "numfmt",
    "od",
    "paste",
    "pgrep",
    "printenv",
    "ps",
    "pwd",
    "readlink",
    "realpath",
    "return",
    "rev",
    "seq",
    "sha1sum",
    "sha224sum",
    "sha256sum",
    "sha384sum",
    "sha512sum",
    "sleep",
    "stat",
    "strings",
    "sum",
    "tac",
    "tail",
    "tr",
    "true",
    "tty",
    "type",
    "uname",
    "unexpand",
    "uptime",
    "wc",
    "which",
    "whoami",
];

/// Directories whose programs are the system's own: `/usr/bin/cat` is `cat`, `./cat` is not.
const SYSTEM_DIRS: &[&str] = &[
    "/bin/",
    "/usr/bin/",
    "/usr/local/bin/",
    "/sbin/",
    "/usr/sbin/",
];

/// The program a command name runs, as the allow-list knows it. Names are matched exactly
/// (case included: `RM` is not `rm`, and neither is on the list); a path is accepted only
/// in a system directory, so a project's own `./cat` never passes for `cat`.
pub(super) fn resolve(name: &str) -> Result<String, String> {
    if !name.contains('/') {
        return Ok(name.to_string());
    }
    SYSTEM_DIRS
        .iter()
        .find_map(|d| name.strip_prefix(d))
        .filter(|rest| !rest.is_empty() && !rest.contains('/'))
        .map(str::to_string)
        .ok_or_else(|| format!("`{name}` runs a program by path, not one on the read-only list"))
}

/// Check `program` (as [`resolve`]d; `shown` is the name as written) with its arguments.
pub(super) fn check(program: &str, shown: &str, args: &[Arg], walker: &mut Walker) -> Check {
    match program {
        "test" | "[" => test(program, args),
        p if PLAIN.contains(&p) => Ok(()),
        "find" => find(args),
        "sed" => sed::check(args),
        "awk" | "gawk" | "mawk" | "nawk" => awk::check(program, args),
        "git" => git::check(args, walker),
        "sort" => sort(args),
        "uniq" => uniq(args),
        "tree" => tree(args),
        "tee" => tee(args),
        "dd" => dd(args),
        "env" => env(args),
        "xargs" => xargs(args),
        "command" => command(args),
        "read" => read(args),
        "printf" => printf(args),
        "date" => date(args),
        "file" => file(args),
        "rg" => rg(args),
        "base64" => base64(args),
        "fd" | "fdfind" => fd(program, args),
        "less" | "more" | "most" | "man" | "vi" | "vim" | "view" | "nano" | "emacs" => Err(
            format!("`{program}` is interactive and can run shell commands from its prompt"),
        ),
        _ => Err(format!("`{shown}` is not on the read-only list")),
    }
}

fn find(args: &[Arg]) -> Check {
    for a in fixed("find", args)? {
        let why = match a {
            "-exec" | "-execdir" | "-ok" | "-okdir" => "runs another program",
            "-delete" => "deletes files",
            "-fprint" | "-fprint0" | "-fprintf" | "-fls" => "writes to a file",
            _ => continue,
        };
        return Err(format!("`find {a}` {why}"));
    }
    Ok(())
}

fn sort(args: &[Arg]) -> Check {
    let args = fixed("sort", args)?;
    let spec = OptSpec {
        short_arg: "kStTo",
        short_optarg: "",
        long_arg: &[
            "key",
            "field-separator",
            "buffer-size",
            "temporary-directory",
            "output",
            "compress-program",
            "parallel",
            "batch-size",
            "files0-from",
            "random-source",
            "sort",
        ],
    };
    for o in options(&args, &spec) {
        match o {
            Opt::Short('o', _) => return Err("`sort -o` writes its output to a file".into()),
            Opt::Long(n, _) if long_is(n, "output") => {
                return Err("`sort --output` writes its output to a file".into())
            }
            Opt::Long(n, _) if long_is(n, "compress-program") => {
                return Err("`sort --compress-program` runs another program".into())
            }
            _ => {}
        }
    }
    Ok(())
}

fn uniq(args: &[Arg]) -> Check {
    let args = fixed("uniq", args)?;
    let spec = OptSpec {
        short_arg: "fsw",
        short_optarg: "",
        long_arg: &["skip-fields", "skip-chars", "check-chars"],
    };
    let operands: Vec<&str> = options(&args, &spec)
        .into_iter()
        .filter_map(|o| match o {
            Opt::Operand(x) => Some(x),
            _ => None,
        })
        .collect();
    match operands.get(1) {
        Some(out) => Err(format!("`uniq IN OUT` writes its output to `{out}`")),
        None => Ok(()),
    }
}

fn tree(args: &[Arg]) -> Check {
    let args = fixed("tree", args)?;
    let spec = OptSpec {
        short_arg: "LPIHTo",
        short_optarg: "",
        long_arg: &[
            "charset",
            "filelimit",
            "timefmt",
            "sort",
            "fromfile",
            "infofile",
            "hintro",
            "houtro",
        ],
    };
    for o in options(&args, &spec) {
        match o {
            Opt::Short('o', _) => return Err("`tree -o` writes its output to a file".into()),
            Opt::Short('R', _) => {
                return Err("`tree -R` writes an `00Tree.html` into every directory".into())
            }
            Opt::Long(n, _) if long_is(n, "output") => {
                return Err("`tree --output` writes its output to a file".into())
            }
            _ => {}
        }
    }
    Ok(())
}

fn tee(args: &[Arg]) -> Check {
    let args = fixed("tee", args)?;
    let spec = OptSpec {
        short_arg: "",
        short_optarg: "",
        long_arg: &[],
    };
    for o in options(&args, &spec) {
        if let Opt::Operand(f) = o {
            return Err(format!("`tee {f}` writes to `{f}`"));
        }
    }
    Ok(())
}

fn dd(args: &[Arg]) -> Check {
    for a in fixed("dd", args)? {
        let key = a.split_once('=').map(|(k, _)| k).unwrap_or(a);
        match key {
            "if" | "bs" | "ibs" | "obs" | "cbs" | "count" | "skip" | "iseek" | "iflag"
            | "status" | "conv" => {}
            "of" | "oflag" | "seek" | "oseek" => {
                return Err(format!("`dd {a}` writes to a file"));
            }
            _ => return Err(format!("`dd {a}` is not understood")),
        }
    }
    Ok(())
}

/// `env` alone (or with `NAME=value` pairs) prints the environment; with a command it runs it.
fn env(args: &[Arg]) -> Check {
    for a in fixed("env", args)? {
        match a {
            "-0" | "--null" | "-i" | "--ignore-environment" | "-" => {}
            a if a.starts_with('-') => {
                return Err(format!("`env {a}` is not on the read-only list"));
            }
            a if a.contains('=') => {}
            cmd => return Err(format!("`env {cmd}` runs `{cmd}`")),
        }
    }
    Ok(())
}

/// `xargs CMD` runs CMD with arguments read from its input, which nothing here can see: only
/// programs that are safe with any arguments at all (the plain list) may be run that way.
fn xargs(args: &[Arg]) -> Check {
    let args = fixed("xargs", args)?;
    const LONG_ARG: &[&str] = &[
        "arg-file",
        "delimiter",
        "max-args",
        "max-procs",
        "max-chars",
        "process-slot-var",
    ];
    // Options stop at the command, so walk them one argument at a time.
    let mut i = 0;
    while let Some(&a) = args.get(i) {
        if a == "--" {
            i += 1;
            break;
        }
        if !a.starts_with('-') || a == "-" {
            break;
        }
        i += 1;
        if let Some(long) = a.strip_prefix("--") {
            let (name, has_value) = match long.split_once('=') {
                Some((n, _)) => (n, true),
                None => (long, false),
            };
            if long_is(name, "open-tty") || long_is(name, "interactive") {
                return Err(format!("`xargs --{name}` talks to the terminal"));
            }
            if !has_value && LONG_ARG.iter().any(|f| long_is(name, f)) {
                i += 1;
            }
            continue;
        }
        for (pos, c) in a[1..].char_indices() {
            let rest = &a[1 + pos + c.len_utf8()..];
            if "op".contains(c) {
                return Err(format!("`xargs -{c}` talks to the terminal"));
            }
            if "adEILnPs".contains(c) {
                if rest.is_empty() {
                    i += 1;
                }
                break;
            }
            if "eil".contains(c) {
                break;
            }
        }
    }
    let Some(cmd) = args.get(i) else {
        return Ok(()); // runs `echo`
    };
    let cmd = resolve(cmd)?;
    if PLAIN.contains(&cmd.as_str()) {
        Ok(())
    } else {
        Err(format!(
            "`xargs {cmd}` runs `{cmd}` with arguments only known when the command runs"
        ))
    }
}

/// `command -v NAME` looks a name up; `command NAME` runs it.
fn command(args: &[Arg]) -> Check {
    let args = fixed("command", args)?;
    let lookup = args
        .iter()
        .take_while(|a| a.starts_with('-'))
        .any(|a| a.contains('v') || a.contains('V'));
    if lookup {
        Ok(())
    } else {
        Err("`command` runs the program it is given".into())
    }
}

fn date(args: &[Arg]) -> Check {
    let args = fixed("date", args)?;
    let spec = OptSpec {
        short_arg: "dfr",
        short_optarg: "I",
        long_arg: &["date", "file", "reference", "set"],
    };
    for o in options(&args, &spec) {
        match o {
            Opt::Short('s', _) => return Err("`date -s` sets the system clock".into()),
            Opt::Long(n, _) if long_is(n, "set") => {
                return Err("`date --set` sets the system clock".into())
            }
            Opt::Operand(op) if !op.starts_with('+') => {
                return Err(format!("`date {op}` sets the system clock"))
            }
            _ => {}
        }
    }
    Ok(())
}

fn file(args: &[Arg]) -> Check {
    let args = fixed("file", args)?;
    let spec = OptSpec {
        short_arg: "mfFeP",
        short_optarg: "",
        long_arg: &[
            "magic-file",
            "files-from",
            "separator",
            "exclude",
            "parameter",
        ],
    };
    for o in options(&args, &spec) {
        match o {
            Opt::Short('C', _) => return Err("`file -C` writes a compiled magic file".into()),
            Opt::Long(n, _) if long_is(n, "compile") => {
                return Err("`file --compile` writes a compiled magic file".into())
            }
            _ => {}
        }
    }
    Ok(())
}

fn rg(args: &[Arg]) -> Check {
    let args = fixed("rg", args)?;
    let spec = OptSpec {
        short_arg: "ABCEMTdefgjmrt",
        short_optarg: "",
        long_arg: &["pre", "hostname-bin"],
    };
    for o in options(&args, &spec) {
        match o {
            Opt::Long(n, _) if long_is(n, "pre") => {
                return Err("`rg --pre` runs a program on every file it searches".into())
            }
            Opt::Long(n, _) if long_is(n, "hostname-bin") => {
                return Err("`rg --hostname-bin` runs a program".into())
            }
            Opt::Short('z', _) => {
                return Err("`rg -z` runs decompression programs on the files it searches".into())
            }
            Opt::Long(n, _) if long_is(n, "search-zip") => {
                return Err("`rg --search-zip` runs decompression programs".into())
            }
            _ => {}
        }
    }
    Ok(())
}

/// GNU `base64` only prints; BSD `base64 -o FILE` writes FILE.
fn base64(args: &[Arg]) -> Check {
    let args = fixed("base64", args)?;
    let spec = OptSpec {
        short_arg: "wio",
        short_optarg: "",
        long_arg: &["wrap", "input", "output"],
    };
    for o in options(&args, &spec) {
        match o {
            Opt::Short('o', _) => return Err("`base64 -o` writes to a file".into()),
            Opt::Long(n, _) if long_is(n, "output") => {
                return Err("`base64 --output` writes to a file".into())
            }
            _ => {}
        }
    }
    Ok(())
}

fn fd(program: &str, args: &[Arg]) -> Check {
    let args = fixed(program, args)?;
    let spec = OptSpec {
        short_arg: "dteESjocC",
        short_optarg: "",
        long_arg: &[
            "max-depth",
            "type",
            "extension",
            "exclude",
            "size",
            "threads",
            "owner",
            "color",
            "base-directory",
            "changed-within",
            "changed-before",
            "max-results",
        ],
    };
    for o in options(&args, &spec) {
        match o {
            Opt::Short('x' | 'X', _) => {
                return Err(format!("`{program} --exec` runs a program on every match"))
            }
            Opt::Long(n, _) if long_is(n, "exec") || long_is(n, "exec-batch") => {
                return Err(format!("`{program} --exec` runs a program on every match"))
            }
            _ => {}
        }
    }
    Ok(())
}

/// Binary and unary operators of `test`: a word next to one of them stays an operand.
const TEST_OPERATORS: &[&str] = &[
    "=", "==", "!=", "<", ">", "-eq", "-ne", "-lt", "-le", "-gt", "-ge", "-nt", "-ot", "-ef", "-n",
    "-z", "-e", "-f", "-d", "-r", "-w", "-x", "-s", "-L", "-h", "-b", "-c", "-p", "-S", "-t", "-g",
    "-u", "-k", "-O", "-G", "-N",
];

/// `test`/`[` only read, except `-v NAME`, which evaluates an array subscript in NAME (and
/// so can run commands). A word known only at run time could become `-v`, unless it sits
/// next to a fixed operator, where test treats it as an operand.
fn test(program: &str, args: &[Arg]) -> Check {
    let mut args: Vec<&Arg> = args.iter().collect();
    if program == "[" && args.last().and_then(|a| a.value.as_deref()) == Some("]") {
        args.pop();
    }
    let is_op = |a: Option<&&Arg>| {
        a.and_then(|a| a.value.as_deref())
            .is_some_and(|v| TEST_OPERATORS.contains(&v))
    };
    for (i, a) in args.iter().enumerate() {
        match a.value.as_deref() {
            Some("-v" | "-R") => {
                return Err(format!(
                    "`{program} {}` evaluates array subscripts, which can run commands",
                    a.text
                ))
            }
            Some(_) => {}
            None if a.may_split => {
                return Err(format!(
                    "unquoted `{}` in `{program}` can become an operator",
                    a.text
                ))
            }
            None if is_op(i.checked_sub(1).and_then(|j| args.get(j))) || is_op(args.get(i + 1)) => {
            }
            None => {
                return Err(format!(
                    "`{}` in `{program}` can become an operator when the command runs",
                    a.text
                ))
            }
        }
    }
    Ok(())
}

/// `printf` prints, except `printf -v NAME`, which sets a shell variable: only a plain
/// lower-case one passes (see [`read`]). A first word known only at run time could be `-v`.
fn printf(args: &[Arg]) -> Check {
    let Some(first) = args.first() else {
        return Ok(());
    };
    match first.value.as_deref() {
        None => Err(format!(
            "`printf` argument `{}` is only known when the command runs",
            first.text
        )),
        Some("-v") => match args.get(1).and_then(|a| a.value.as_deref()) {
            Some(name) if is_local_name(name) => Ok(()),
            _ => Err(format!(
                "`printf -v {}` sets a variable that is not a plain lower-case name",
                args.get(1).map(|a| a.text.as_str()).unwrap_or("")
            )),
        },
        Some(_) => Ok(()),
    }
}

/// `read NAME…` only sets shell variables of this script. Names must be lower-case: the
/// variables that change what later commands do (`PATH`, `IFS`, `LD_PRELOAD`, `GIT_*`) are
/// upper-case, and a subscript (`a[$(cmd)]`) would be evaluated.
fn read(args: &[Arg]) -> Check {
    let args = fixed("read", args)?;
    let spec = OptSpec {
        short_arg: "adinNptu",
        short_optarg: "",
        long_arg: &[],
    };
    for o in options(&args, &spec) {
        let name = match o {
            Opt::Short('a', Some(n)) | Opt::Operand(n) => n,
            _ => continue,
        };
        if !is_local_name(name) {
            return Err(format!(
                "`read {name}` sets a variable that is not a plain lower-case name"
            ));
        }
    }
    Ok(())
}

/// A lower-case shell identifier: never an exported setting such as `PATH` or `IFS`.
pub(super) fn is_local_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}
