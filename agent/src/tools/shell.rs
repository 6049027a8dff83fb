//! `shell`: run a command in the workspace root with a timeout and an output cap. The command
//! gets its own process group so that a timeout or a cancel kills everything it started.

use std::ffi::OsString;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use shade_fusefs::sandbox::{env as sandbox_env, EnvPolicy, Tee, Termination};

use serde::Deserialize;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio_util::sync::CancellationToken;

use super::text::plural;
use super::{parse_args, summarize, Tool, ToolContext, ToolError, ToolKind, ToolOutput};
use crate::llm::{BoxFuture, ToolSpec};
use crate::runner::{self, RunError, ShadowRunner};
use shade_classify as shell_classify;

/// The tool, with its limits.
#[derive(Debug, Clone)]
pub struct Shell {
    /// Timeout when the model gives none.
    pub default_timeout: Duration,
    /// Largest timeout the model may ask for.
    pub max_timeout: Duration,
    /// Bytes kept of each of stdout and stderr (head and tail).
    pub output_cap: usize,
    /// Tokens of output past which it is summarised and kept whole in a log (0: never).
    pub output_budget: usize,
}

impl Default for Shell {
    fn default() -> Self {
        Self {
            default_timeout: Duration::from_secs(120),
            max_timeout: Duration::from_secs(600),
            output_cap: 30_000,
            output_budget: super::config::OutputBudget::default().shell,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    command: String,
    #[serde(default)]
    timeout_ms: Option<u64>,
    #[serde(default)]
    #[allow(dead_code)]
    description: Option<String>,
}

impl Tool for Shell {
    fn name(&self) -> &'static str {
        "shell"
    }

    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name().into(),
            description: format!(
                "Run a bash command in the workspace root (non-interactive: no stdin). Returns the \
                 exit code, stdout and stderr (each capped at {} bytes, head and tail kept{}). \
                 Default timeout {}s, at most {}s.",
                self.output_cap,
                if self.output_budget > 0 {
                    format!(
                        "; output over about {} tokens is summarised, its first and last lines \
                         kept verbatim and the whole of it saved in a file whose path is given",
                        self.output_budget
                    )
                } else {
                    String::new()
                },
                self.default_timeout.as_secs(),
                self.max_timeout.as_secs()
            ),
            parameters: json!({
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "The command line."},
                    "timeout_ms": {"type": "integer", "minimum": 1, "description": "Kill the command after this many milliseconds."},
                    "description": {"type": "string", "description": "A few words on what it does, for the user."}
                },
                "required": ["command"],
                "additionalProperties": false
            }),
        }
    }

    fn kind(&self) -> ToolKind {
        ToolKind::Execute
    }

    fn is_read_only_in(&self, args: &Value, ctx: &ToolContext) -> bool {
        args.get("command")
            .and_then(Value::as_str)
            .is_some_and(|c| shell_classify::classify_in(c, ctx.workspace.root()).read_only)
    }

    fn is_read_only(&self, args: &Value) -> bool {
        args.get("command")
            .and_then(Value::as_str)
            .is_some_and(shell_classify::is_read_only)
    }

    fn run<'a>(
        &'a self,
        args: Value,
        ctx: &'a ToolContext,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let p: Params = parse_args(args)?;
            if p.command.trim().is_empty() {
                return Err(ToolError::InvalidArgs("command is empty".into()));
            }
            let timeout = p
                .timeout_ms
                .map(Duration::from_millis)
                .unwrap_or(self.default_timeout)
                .min(self.max_timeout);
            let log = self.log(ctx);
            let (out, note) = match &ctx.shadow {
                Some(runner) => {
                    let tee = log
                        .clone()
                        .map(|log| Tee::new(move |bytes: &[u8]| log.write(bytes)));
                    let cap = self.cap();
                    run_in_shadow(&p.command, runner, ctx, timeout, cap, tee, cancel).await?
                }
                None => {
                    let root = ctx.workspace.root();
                    let cap = self.cap();
                    let out = run_command(
                        &p.command,
                        root,
                        timeout,
                        cap,
                        log.clone(),
                        ctx.user_terminal,
                        cancel,
                    );
                    (out.await?, None)
                }
            };
            Ok(self.fit(&p.command, ctx, log, out, note, cancel).await)
        })
    }
}

impl Shell {
    /// The whole output's log for one call, when summaries are on.
    fn log(&self, ctx: &ToolContext) -> Option<Arc<summarize::FullLog>> {
        (self.output_budget > 0)
            .then(|| summarize::FullLog::new(&ctx.output_dir, "shell", self.output_budget * 4))
    }

    /// Bytes kept per stream: with summaries on, nothing is cut below the budget (what is
    /// over it is summarised).
    fn cap(&self) -> usize {
        self.output_cap.max(self.output_budget.saturating_mul(4))
    }

    /// `out` as the model gets it: output over the budget is summarised, the whole of it
    /// kept in `log` (see [`summarize`]); a note for the model stays after the summary.
    async fn fit(
        &self,
        command: &str,
        ctx: &ToolContext,
        log: Option<Arc<summarize::FullLog>>,
        out: ToolOutput,
        note: Option<&str>,
        cancel: &CancellationToken,
    ) -> ToolOutput {
        let Some(log) = log else { return out };
        let status = out.content.lines().next().unwrap_or_default().to_string();
        let produced = summarize::Produced {
            tool: "shell",
            call: command,
            status: &status,
            content: out.content,
        };
        let mut content = summarize::fit(ctx, self.output_budget, &log, produced, cancel).await;
        if let Some(note) = note.filter(|n| !content.contains(n)) {
            if !content.ends_with('\n') {
                content.push('\n');
            }
            content.push_str("Note: ");
            content.push_str(note);
        }
        ToolOutput {
            content,
            display: out.display,
        }
    }
}

/// Kills the whole process group when dropped (a cancelled future must not leave orphans).
struct GroupGuard {
    pgid: Option<i32>,
}

impl GroupGuard {
    fn signal(&self, sig: i32) {
        if let Some(pgid) = self.pgid {
            // SAFETY: plain syscall on a process group we created; errors (already gone) are fine.
            unsafe {
                libc::killpg(pgid, sig);
            }
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.signal(libc::SIGKILL);
    }
}

enum Ending {
    Exited(std::process::ExitStatus),
    TimedOut,
    Cancelled,
}

/// The environment of the model's commands, in the project and in a branch alike, on top of
/// shade's without its secrets (the sandbox's agent policy, [`EnvPolicy::Agent`]; `None`:
/// removed). Nothing may wait for a terminal that is not there, and git's read commands
/// must not rewrite `.git/index` to refresh its stat cache (`GIT_OPTIONAL_LOCKS=0`): a
/// read-only command leaves the repository as it was.
const COMMAND_ENV: [(&str, Option<&str>); 4] = [
    ("GIT_TERMINAL_PROMPT", Some("0")),
    ("PAGER", Some("cat")),
    ("GIT_PAGER", Some("cat")),
    ("GIT_OPTIONAL_LOCKS", Some("0")),
];

async fn run_command(
    command: &str,
    root: &std::path::Path,
    timeout: Duration,
    cap: usize,
    log: Option<Arc<summarize::FullLog>>,
    user_terminal: bool,
    cancel: &CancellationToken,
) -> Result<ToolOutput, ToolError> {
    let shell = shell_program();
    let mut child = tokio::process::Command::new(shell);
    // Outside a branch there is no sandbox to hide the home's credential files, but the
    // model's command gets the filtered environment all the same; the user's own `!cmd`
    // keeps theirs.
    let policy = if user_terminal {
        EnvPolicy::User
    } else {
        EnvPolicy::Agent
    };
    child.env_clear().envs(sandbox_env::command_env(policy));
    // The model's command: a session of its own (its process group, killed as one) without
    // the user's terminal. The user's own (`!cmd`): a process group in the user's session,
    // where it may open the terminal. Neither gets any fd of ours.
    // SAFETY: the hook makes only async-signal-safe system calls.
    unsafe {
        child.pre_exec(move || {
            if user_terminal {
                if libc::setpgid(0, 0) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
            } else {
                shade_fusefs::sandbox::detach_from_terminal()?;
            }
            shade_fusefs::sandbox::cloexec_inherited_fds();
            Ok(())
        });
    }
    let mut child = child
        .arg("-c")
        .arg(command)
        .current_dir(root)
        .envs(COMMAND_ENV.iter().filter_map(|(k, v)| v.map(|v| (k, v))))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| ToolError::Failed(format!("cannot start {shell}: {e}")))?;
    let guard = GroupGuard {
        pgid: child.id().map(|p| p as i32),
    };
    let out = tokio::spawn(read_capped(child.stdout.take(), cap, log.clone()));
    let err = tokio::spawn(read_capped(child.stderr.take(), cap, log));
    let ending = tokio::select! {
        s = child.wait() => match s {
            Ok(s) => Ending::Exited(s),
            Err(e) => return Err(ToolError::Failed(format!("waiting for the command failed: {e}"))),
        },
        _ = tokio::time::sleep(timeout) => Ending::TimedOut,
        _ = cancel.cancelled() => Ending::Cancelled,
    };
    if !matches!(ending, Ending::Exited(_)) {
        guard.signal(libc::SIGTERM);
        if tokio::time::timeout(Duration::from_secs(2), child.wait())
            .await
            .is_err()
        {
            guard.signal(libc::SIGKILL);
            let _ = child.wait().await;
        }
    }
    // Background children may hold the pipes open: give them a moment, then kill the group.
    let collect = async {
        let o = out.await.unwrap_or_default();
        let e = err.await.unwrap_or_default();
        (o, e)
    };
    let (stdout, stderr) = match tokio::time::timeout(Duration::from_secs(2), collect).await {
        Ok(v) => v,
        Err(_) => {
            guard.signal(libc::SIGKILL);
            (
                Captured::note("[output collection stopped: background processes kept it open]"),
                Captured::default(),
            )
        }
    };
    drop(guard);
    let status_line = match &ending {
        Ending::Exited(s) => match s.code() {
            Some(c) => format!("Exit code: {c}"),
            None => {
                use std::os::unix::process::ExitStatusExt;
                format!("Killed by signal {}", s.signal().unwrap_or(0))
            }
        },
        Ending::TimedOut => timed_out(timeout),
        Ending::Cancelled => return Err(ToolError::Cancelled),
    };
    Ok(render(command, &status_line, &stdout, &stderr, None))
}

fn timed_out(timeout: Duration) -> String {
    format!(
        "Timed out after {}s; the command and its children were killed.",
        timeout.as_secs_f64()
    )
}

/// The tool's answer: status line, both streams, and an optional note for the model.
fn render(
    command: &str,
    status_line: &str,
    stdout: &Captured,
    stderr: &Captured,
    note: Option<&str>,
) -> ToolOutput {
    let mut content = status_line.to_string();
    content.push_str("\nStdout:");
    content.push_str(&stdout.render());
    content.push_str("\nStderr:");
    content.push_str(&stderr.render());
    if let Some(note) = note {
        content.push_str("\nNote: ");
        content.push_str(note);
    }
    let lines = stdout.text.lines().count() + stderr.text.lines().count();
    let short = crate::llm::error::truncate_chars(command.lines().next().unwrap_or(""), 60);
    let display = format!(
        "$ {short} → {} ({} of output)",
        status_line.to_lowercase().trim_end_matches('.'),
        plural(lines, "line")
    );
    ToolOutput { content, display }
}

/// The shell of the tool's commands.
fn shell_program() -> &'static str {
    if std::path::Path::new("/bin/bash").exists() {
        "/bin/bash"
    } else {
        "/bin/sh"
    }
}

/// In a shadow: the same command, run by the branch sandbox at the project's real path
/// (see `crate::shadow`), with the same environment and the same answer format.
async fn run_in_shadow(
    command: &str,
    runner: &ShadowRunner,
    ctx: &ToolContext,
    timeout: Duration,
    cap: usize,
    tee: Option<Tee>,
    cancel: &CancellationToken,
) -> Result<(ToolOutput, Option<&'static str>), ToolError> {
    let shell = shell_program();
    let env = COMMAND_ENV
        .iter()
        .map(|(k, v)| (OsString::from(k), v.map(OsString::from)))
        .collect();
    let cmd = runner::Command {
        argv: vec![shell.into(), "-c".into(), command.into()],
        cwd: ctx.workspace.shown_root().to_path_buf(),
        env,
        timeout: Some(timeout),
        output_cap: cap,
        tee,
        user_session: ctx.user_terminal,
    };
    let outcome = match runner.run(cmd, cancel).await {
        Ok(o) => o,
        Err(RunError::Cancelled) => return Err(ToolError::Cancelled),
        Err(e) => return Err(ToolError::Failed(e.to_string())),
    };
    let status_line = match &outcome.termination {
        Termination::Exited(c) => format!("Exit code: {c}"),
        Termination::Signaled(s) | Termination::Interrupted(s) => format!("Killed by signal {s}"),
        Termination::TimedOut => {
            let limit = runner
                .isolation()
                .limits
                .time_limit
                .map_or(timeout, |l| l.min(timeout));
            timed_out(limit)
        }
        Termination::Cancelled => return Err(ToolError::Cancelled),
        Termination::CannotExec(m) => {
            return Err(ToolError::Failed(format!("cannot start {shell}: {m}")))
        }
    };
    let text = |c: &Option<shade_fusefs::sandbox::Captured>| Captured {
        text: c.as_ref().map(|c| c.text()).unwrap_or_default(),
    };
    let (stdout, stderr) = (text(&outcome.stdout), text(&outcome.stderr));
    // Each limit the command reached, in one line after its status.
    let status_line = std::iter::once(status_line)
        .chain(
            outcome
                .limit_lines()
                .into_iter()
                .map(|l| format!("shade: {l}")),
        )
        .collect::<Vec<_>>()
        .join("\n");
    let isolation = runner.isolation();
    let refused_write = isolation.read_only
        && (stderr.text.contains("Read-only file system")
            || stdout.text.contains("Read-only file system"));
    let note = refused_write.then_some(
        "this command ran in a sandbox where writes outside the project land in the \
         branch's own throw-away layer, but system paths (/proc, /sys, read-only mounts) \
         stay read-only; that write was refused.",
    );
    Ok((render(command, &status_line, &stdout, &stderr, note), note))
}

/// One stream's captured text (already capped, with an omission note inside).
#[derive(Default)]
struct Captured {
    text: String,
}

impl Captured {
    fn note(s: &str) -> Self {
        Self {
            text: s.to_string(),
        }
    }

    fn render(&self) -> String {
        if self.text.is_empty() {
            return " (empty)".to_string();
        }
        format!("\n{}", self.text.trim_end_matches('\n'))
    }
}

/// Read a pipe to the end, keeping the first and last `cap / 2` bytes.
/// Everything read also goes to `log`, when there is one.
async fn read_capped<R: AsyncRead + Unpin>(
    pipe: Option<R>,
    cap: usize,
    log: Option<Arc<summarize::FullLog>>,
) -> Captured {
    let Some(mut pipe) = pipe else {
        return Captured::default();
    };
    let half = cap / 2;
    let mut head = Vec::new();
    let mut tail: Vec<u8> = Vec::new();
    let mut dropped = 0usize;
    let mut buf = [0u8; 8192];
    loop {
        let n = match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(log) = &log {
            log.write(&buf[..n]);
        }
        let mut chunk = &buf[..n];
        if head.len() < half {
            let take = (half - head.len()).min(chunk.len());
            head.extend_from_slice(&chunk[..take]);
            chunk = &chunk[take..];
        }
        tail.extend_from_slice(chunk);
        if tail.len() > half * 2 {
            let excess = tail.len() - half;
            tail.drain(..excess);
            dropped += excess;
        }
    }
    if tail.len() > half {
        let excess = tail.len() - half;
        tail.drain(..excess);
        dropped += excess;
    }
    let mut text = String::from_utf8_lossy(&head).into_owned();
    if dropped > 0 {
        text.push_str(&format!("\n[… {dropped} bytes omitted …]\n"));
    }
    text.push_str(&String::from_utf8_lossy(&tail));
    Captured { text }
}
