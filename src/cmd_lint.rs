//! `shade lint`: apply a unified diff in a branch, run the project's checkers there and
//! print the diagnostics the edit introduced. By default a warm daemon per project
//! (`shade lint --serve`, started on first use, gone when idle) keeps a long-lived branch,
//! its build output and language servers between calls.

use crate::exit;
use anyhow::{bail, Context};
use clap::Args;
use shade_fusefs::StateDir;
use shade_lint::{daemon, patch, Diagnostic, Linter, Session, Severity};
use std::io::{IsTerminal, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct LintArgs {
    /// Project directory (default: the current directory).
    #[arg(short = 'C', long = "dir", value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// The unified diff to check (default: stdin when it is not a terminal; none = the
    /// project as it is).
    #[arg(long, value_name = "FILE")]
    pub patch: Option<PathBuf>,
    /// Print a JSON array of diagnostics.
    #[arg(long)]
    pub json: bool,
    /// Print every diagnostic, not only those the edit introduced.
    #[arg(long)]
    pub all: bool,
    /// Use only this checker (cargo, ruff, mypy, pyright, eslint, tsc, go-vet, cc, command,
    /// clangd, pylsp, ruff-server, or a configured language server).
    #[arg(long, value_name = "NAME")]
    pub checker: Option<String>,
    /// Give up after this many seconds.
    #[arg(long, value_name = "SECS", value_parser = crate::args::seconds)]
    pub timeout: Option<f64>,
    /// Check in a fresh branch in this process instead of the warm daemon.
    #[arg(long)]
    pub cold: bool,
    /// Stop the project's warm daemon.
    #[arg(long, conflicts_with_all = ["cold", "serve"])]
    pub stop: bool,
    /// Be the project's warm daemon (started by `shade lint` itself).
    #[arg(long, hide = true)]
    pub serve: bool,
}

pub fn main(args: LintArgs) -> i32 {
    match run(args) {
        Ok(code) => code,
        Err(e) => exit::fail(&e),
    }
}

fn run(args: LintArgs) -> anyhow::Result<i32> {
    let state = StateDir::from_env();
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => std::env::current_dir().context("current directory")?,
    };
    let project = std::fs::canonicalize(&dir)
        .with_context(|| format!("project directory {}", dir.display()))?;
    anyhow::ensure!(project.is_dir(), "{} is not a directory", project.display());
    let config = crate::config::lint_config(None).map_err(anyhow::Error::msg)?;
    let socket = daemon::socket_path(state.root(), &project, args.checker.as_deref());
    if args.stop {
        daemon::request(
            &socket,
            &daemon::Request {
                stop: true,
                ..Default::default()
            },
            || Ok(()),
        )
        .map_err(anyhow::Error::msg)?;
        return Ok(0);
    }
    if args.serve {
        daemon::serve(&socket, config.idle(), || {
            crate::cmd_run::startup_recovery(&state);
            Session::new(Linter::new(
                &project,
                state,
                &config,
                args.checker.as_deref(),
            )?)
        })?;
        return Ok(0);
    }
    let text = read_patch(args.patch.as_deref())?;
    // Refuse a malformed patch here, before any branch or daemon exists.
    patch::parse(&text)?;
    let timeout = args.timeout.map(Duration::from_secs_f64);
    let diags = if args.cold {
        crate::cmd_run::startup_recovery(&state);
        let linter = Linter::new(&project, state, &config, args.checker.as_deref())?;
        Session::new(linter)?.lint_patch(&text, timeout.map(|t| Instant::now() + t))?
    } else {
        let req = daemon::Request {
            patch: text,
            timeout_secs: args.timeout,
            stop: false,
        };
        let resp = daemon::request(&socket, &req, || {
            start_daemon(&state, &project, &args, &socket)
        })
        .map_err(anyhow::Error::msg)?;
        match (resp.diagnostics, resp.error) {
            (Some(d), _) => d,
            (None, Some(e)) => bail!(e),
            (None, None) => bail!("the lint daemon answered nothing"),
        }
    };
    let shown: Vec<&Diagnostic> = diags.iter().filter(|d| args.all || d.new).collect();
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer(&mut out, &shown)?;
        writeln!(out)?;
    } else {
        // A checker's message quotes the branch's code: shown, never obeyed, on a terminal.
        for d in &shown {
            writeln!(out, "{}", crate::review::render::for_stdout(&d.to_string()))?;
        }
    }
    let new_errors = diags.iter().any(|d| d.new && d.severity == Severity::Error);
    Ok(if new_errors { 1 } else { 0 })
}

fn read_patch(file: Option<&Path>) -> anyhow::Result<String> {
    match file {
        Some(p) => std::fs::read_to_string(p).with_context(|| format!("patch {}", p.display())),
        None if std::io::stdin().is_terminal() => Ok(String::new()),
        None => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("reading the patch from stdin")?;
            Ok(s)
        }
    }
}

/// Start `shade lint --serve` for the project, detached (own session, no terminal), its
/// log next to its socket, and wait until it listens on `socket`. A daemon that fails to
/// start (no such checker, no branch) is reported with its error line instead.
fn start_daemon(
    state: &StateDir,
    project: &Path,
    args: &LintArgs,
    socket: &Path,
) -> std::io::Result<()> {
    let dir = state.root().join("lint");
    std::fs::create_dir_all(&dir)?;
    let log_path = dir.join("daemon.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)?;
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg("lint").arg("--serve").arg("-C").arg(project);
    if let Some(c) = &args.checker {
        cmd.arg("--checker").arg(c);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .current_dir("/");
    // SAFETY: setsid is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    // The daemon outlives us; once we are gone, its exit is reaped by init.
    let mut child = cmd.spawn()?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline && !socket.exists() {
        match child.try_wait()? {
            // Another daemon serves the project (it won the race to start): connect to it.
            Some(status) if status.success() => return Ok(()),
            Some(_) => {
                let text = std::fs::read_to_string(&log_path).unwrap_or_default();
                let last = text.lines().rev().find(|l| !l.trim().is_empty());
                let line = last.map_or("it exited", |l| l.trim_start_matches("shade: "));
                return Err(std::io::Error::other(line.to_string()));
            }
            None => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    Ok(())
}
