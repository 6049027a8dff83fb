//! `shade exec`: one-shot, non-interactive agent run in the current project. Prints the
//! streamed answer and one line per tool call, or (`--json`) every event as a JSON line.

use shade_fusefs::quote::visible_controls;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use clap::Args;
use serde::Serialize;
use shade_agent::approval::{Answer, ApprovalMode, ApprovalRequest, Approver, NoOneToAsk};
use shade_agent::{
    Agent, AgentEvent, AgentOptions, EventSink, Shadow, ShadowOptions, StopReason, ToolContext,
    ToolRegistry, Workspace,
};
use shade_fusefs::{AcceptError, AcceptFlags, Change, StateDir};
use shade_llm::BoxFuture;
use tokio_util::sync::CancellationToken;

use crate::exit;

/// Exit status when the run stopped at the turn limit.
const TURN_LIMIT: i32 = 2;
/// Exit status after Ctrl-C (as a shell reports SIGINT).
const INTERRUPTED: i32 = 130;

#[derive(Args)]
#[command(after_help = "\
Model settings come from $XDG_CONFIG_HOME/shade/config.toml (base_url, api_key, model, \
fast_model, large_context_model, backup_model, stream, max_retries, base_delay_ms, \
idle_timeout_secs, thinking_param, enable_followup_suggestions, enable_cache_sharing, \
enable_speculation, telemetry; tool tables [output_budget], [web_fetch], [web_search]: see \
README), then OPENAI_BASE_URL, OPENAI_API_KEY, SHADE_MODEL, \
SHADE_FAST_MODEL, then the flags.

Exit status: 0 answered, 2 turn limit reached, 130 interrupted (Ctrl-C; 143 SIGTERM, 129 SIGHUP), 124 --accept refused \
(conflicts, or changes to code for the host held), 125 shade or model error; with --attempts, 1 when no attempt passed.")]
pub struct ExecArgs {
    /// What may run without asking: default (ask before edits and writing commands),
    /// auto-edit, yolo, plan (read-only). Without a terminal, what would be asked is refused.
    #[arg(long, default_value = "default", value_parser = parse_mode)]
    pub approval: ApprovalMode,
    /// Print every event as one JSON object per line instead of the readable transcript.
    #[arg(long)]
    pub json: bool,
    /// Provider and models.
    #[command(flatten)]
    pub llm: crate::llm_setup::LlmChoice,
    /// Stop after this many model calls.
    #[arg(long, default_value_t = 50)]
    pub max_turns: u32,
    /// After the answer, print the prompt suggestion `shade chat` would show (`suggestion:
    /// TEXT`, or a `{"type":"suggestion",…}` line with --json) and log it to the state dir's
    /// telemetry.jsonl.
    #[arg(long)]
    pub suggest: bool,
    /// Project directory (default: the current directory).
    #[arg(short = 'C', long = "directory", value_name = "DIR")]
    pub directory: Option<PathBuf>,
    /// Work in a branch of the project: every edit and shell command lands there, the
    /// transcript ends with what changed, and the branch is dropped unless --accept.
    #[arg(long)]
    pub shadow: bool,
    /// UNCONFINED: tools write straight into the project and commands run directly on the
    /// host; nothing they do can be undone. (By default each tool call runs in a branch and
    /// is accepted into the project right after it, recorded so `shade undo` takes it back.)
    #[arg(long, conflicts_with_all = ["shadow", "attempts"])]
    pub unconfined: bool,
    /// With --shadow: write the branch into the project when the run finished cleanly
    /// (refused, nothing written, exit 124, if a changed path was edited meanwhile, or if a
    /// change is code for the host: `~/.bashrc`, shade's config… with the home as the project).
    #[arg(long, requires = "shadow")]
    pub accept: bool,
    /// Best of N: run this many attempts at the prompt at once, each in its own confined
    /// branch (attempts differ by temperature, or by model with --models), rank them and
    /// accept one (--pick best, or on a screen at a terminal); the others are dropped.
    /// Attempts ask nothing: what --approval would ask is refused.
    #[arg(long, value_name = "N", conflicts_with_all = ["shadow", "suggest"])]
    pub attempts: Option<usize>,
    /// With --attempts: a shell command run in each attempt's branch when it ends (confined
    /// like the agent's commands); exit 0 passes. Without it, an attempt passes if it finished.
    #[arg(long, value_name = "CMD")]
    pub check: Option<String>,
    /// With --attempts: the check is killed after this long, and fails.
    #[arg(long, value_name = "SECS", value_parser = crate::args::seconds, default_value = "600")]
    pub check_timeout: f64,
    /// With --attempts: models to go round, comma-separated (default: the configured model).
    #[arg(long, value_delimiter = ',', value_name = "A,B,…")]
    pub models: Vec<String>,
    /// With --attempts: how many run at once (default: the number of CPUs).
    #[arg(long, value_name = "N")]
    pub jobs: Option<usize>,
    /// With --attempts: `best` accepts the top-ranked attempt that passed, without a screen
    /// (exit 1, nothing accepted, if none passed).
    #[arg(long, value_name = "HOW", value_parser = ["best"])]
    pub pick: Option<String>,
    /// The prompt.
    pub prompt: String,
}

impl ExecArgs {
    /// Several attempts (best of N) rather than one run.
    fn best_of(&self) -> bool {
        self.attempts.is_some()
            || !self.models.is_empty()
            || self.pick.is_some()
            || self.check.is_some()
    }
}

fn parse_mode(s: &str) -> Result<ApprovalMode, String> {
    s.parse()
}

pub fn main(args: ExecArgs) -> i32 {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return exit::fail(&anyhow::anyhow!("cannot start the async runtime: {e}")),
    };
    shade_agent::housekeeping::tidy(
        shade_fusefs::StateDir::from_env().root(),
        std::time::SystemTime::now(),
    );
    runtime.block_on(run(args))
}

async fn run(args: ExecArgs) -> i32 {
    let dir = match &args.directory {
        Some(d) => d.clone(),
        None => PathBuf::from("."),
    };
    let workspace = match Workspace::new(&dir) {
        Ok(w) => w,
        Err(e) => {
            return exit::fail(&anyhow::anyhow!(
                "cannot use {} as the project: {e}",
                dir.display()
            ))
        }
    };
    let llm = match crate::llm_setup::setup(&args.llm) {
        Ok(l) => l,
        Err(e) => return exit::fail(&e),
    };
    let approver: Arc<dyn Approver> = if std::io::stdin().is_terminal() && !args.json {
        Arc::new(TerminalApprover)
    } else {
        Arc::new(NoOneToAsk {
            mode: args.approval,
        })
    };
    let settings = llm.settings.followup;
    let mut tools = ToolRegistry::configured(&llm.settings.tools);
    let mcp = connect_mcp(&llm.settings.tools, workspace.root(), &mut tools).await;
    let cancel = CancellationToken::new();
    // Registered before the run starts, so an early Ctrl-C, SIGTERM or SIGHUP cancels the
    // run (and the branch is dropped) instead of killing us with the branch mounted.
    let stopped_by = Arc::new(std::sync::atomic::AtomicI32::new(0));
    for (kind, signo) in [
        (tokio::signal::unix::SignalKind::interrupt(), libc::SIGINT),
        (tokio::signal::unix::SignalKind::terminate(), libc::SIGTERM),
        (tokio::signal::unix::SignalKind::hangup(), libc::SIGHUP),
    ] {
        match tokio::signal::unix::signal(kind) {
            Ok(mut stream) => {
                let on_signal = cancel.clone();
                let stopped_by = stopped_by.clone();
                tokio::spawn(async move {
                    if stream.recv().await.is_some() {
                        let _ = stopped_by.compare_exchange(
                            0,
                            signo,
                            std::sync::atomic::Ordering::SeqCst,
                            std::sync::atomic::Ordering::SeqCst,
                        );
                        on_signal.cancel();
                    }
                });
            }
            Err(e) => tracing::warn!("cannot catch signal {signo}: {e}"),
        }
    }
    if args.best_of() {
        crate::cmd_run::startup_recovery(&StateDir::from_env());
        let code = best_of(&args, &workspace, &llm, &tools, &cancel, &stopped_by).await;
        mcp.close().await;
        return code;
    }
    let shadow = if args.shadow {
        crate::cmd_run::startup_recovery(&StateDir::from_env());
        match Shadow::create_served(workspace.root(), ShadowOptions::live()) {
            Ok(s) => Some(s),
            Err(e) => return exit::fail(&anyhow::anyhow!(e)),
        }
    } else {
        None
    };
    // The default: a live branch, each tool call accepted right after it ran (the same
    // engine as `shade chat`'s default session).
    let live = if args.shadow || args.unconfined {
        None
    } else {
        crate::cmd_run::startup_recovery(&StateDir::from_env());
        match shade_agent::shadow::Live::start(workspace.root(), ShadowOptions::live()) {
            Ok(l) => {
                tools = l.wrap(&tools);
                Some(l)
            }
            Err(e) => {
                return exit::fail(&anyhow::anyhow!(
                    "cannot create the run's branch (FUSE): {e}; `--unconfined` runs without \
                     one, writing straight into the project"
                ))
            }
        }
    };
    let mut ctx = ToolContext::new(workspace);
    ctx.background = Some(llm.background.clone());
    ctx.token_stats = Some(llm.stats.clone());
    if let Some(shadow) = &shadow {
        // Lints only in the branch: in the real tree the checker would write its build
        // output there.
        let hook = shade_agent::tools::diagnostics::session_hook(
            shadow.project(),
            &llm.settings.lint,
            true,
        );
        if hook.is_some() {
            tools.add(Arc::new(shade_agent::tools::diagnostics::Diagnostics));
        }
        ctx.lint = hook;
        ctx = shadow.tool_context(&ctx);
    }
    let mut agent = Agent::new(
        llm.provider.clone(),
        tools.clone(),
        ctx,
        approver,
        AgentOptions {
            model: llm.model.clone(),
            max_turns: args.max_turns,
            approval: args.approval,
            temperature: None,
        },
    );
    if settings.telemetry {
        agent.set_telemetry(shade_agent::followup::telemetry::Telemetry::from_env(
            shade_agent::followup::new_session_id(),
        ));
    }
    let sink: EventSink = if args.json {
        Arc::new(print_json)
    } else {
        let renderer = Mutex::new(Renderer::default());
        Arc::new(move |e| {
            if let Ok(mut r) = renderer.lock() {
                r.render(&e);
            }
        })
    };
    let expanded = shade_agent::mentions::expand(&args.prompt, &agent.context().workspace);
    for (mention, note) in &expanded.attached {
        eprintln!("shade: attached @{mention} ({note})");
    }
    for (mention, why) in &expanded.refused {
        eprintln!("shade: @{mention} not attached: {why}");
    }
    let mut conversation = agent.start_conversation(&expanded.text);
    let (status, stop) = match agent.run(&mut conversation, &sink, &cancel).await {
        Ok(outcome) => (
            match outcome.stop {
                StopReason::Completed | StopReason::Boundary => 0,
                StopReason::TurnLimit | StopReason::LoopDetected => TURN_LIMIT,
                StopReason::Cancelled => match stopped_by.load(std::sync::atomic::Ordering::SeqCst)
                {
                    0 => INTERRUPTED,
                    signo => 128 + signo,
                },
                StopReason::Error => exit::SHADE_ERROR,
            },
            Some(outcome.stop),
        ),
        Err(e) => {
            // The renderer already printed the `error` event; with --json it went to stdout,
            // so say it on stderr too.
            if args.json {
                eprintln!("shade: {}", visible_controls(&e.to_string()));
            }
            (exit::SHADE_ERROR, None)
        }
    };
    if args.suggest && stop != Some(StopReason::Cancelled) {
        let finished = crate::exec_suggest::Finished {
            conversation: &conversation,
            tools: &tools.specs(),
            model: &llm.model,
            approval: args.approval,
            failed: status == exit::SHADE_ERROR,
        };
        crate::exec_suggest::suggest(&llm.background, settings, finished, args.json, &cancel).await;
    }
    drop(agent);
    mcp.close().await;
    if let Some(live) = live {
        live.settle();
        if let Some(lines) = live_summary(&live) {
            for l in lines.lines() {
                eprintln!("shade: {l}");
            }
        }
        close_live(&live);
    }
    match shadow {
        Some(shadow) => finish_shadow(shadow, &args, stop, status),
        None => status,
    }
}

/// `--attempts N`: run them, then accept the best, show the screen, or only report.
async fn best_of(
    args: &ExecArgs,
    workspace: &Workspace,
    llm: &crate::llm_setup::LlmSetup,
    tools: &ToolRegistry,
    cancel: &CancellationToken,
    stopped_by: &std::sync::atomic::AtomicI32,
) -> i32 {
    use crate::attempts::{self, Decision, Plan};
    let root = workspace.root();
    let expanded = shade_agent::mentions::expand(&args.prompt, workspace);
    for (mention, note) in &expanded.attached {
        eprintln!("shade: attached @{mention} ({note})");
    }
    for (mention, why) in &expanded.refused {
        eprintln!("shade: @{mention} not attached: {why}");
    }
    let n = args.attempts.unwrap_or(args.models.len().max(1));
    let plan = Plan {
        attempts: n,
        check: args.check.clone(),
        check_timeout: std::time::Duration::from_secs_f64(args.check_timeout),
        models: args.models.clone(),
        jobs: args.jobs.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get)
        }),
        approval: args.approval,
        max_turns: args.max_turns,
        prompt: expanded.text,
        history: Vec::new(),
        base: None,
    };
    if !args.json {
        eprintln!(
            "shade: {n} attempt{} in branches, {} at a time{}",
            if n == 1 { "" } else { "s" },
            plan.jobs.min(n),
            match &plan.check {
                Some(c) => format!(", checked by `{}`", visible_controls(c)),
                None => String::new(),
            }
        );
    }
    let done = match attempts::run_all(&plan, root, llm, tools, cancel, stopped_by, args.json).await
    {
        Ok(d) => d,
        Err(sig) => {
            eprintln!("shade: interrupted by signal {sig}; dropped every attempt, the project is unchanged");
            return 128 + sig;
        }
    };
    if cancel.is_cancelled() {
        // A signal between the last attempt's end and now: nothing is accepted.
        let sig = match stopped_by.load(std::sync::atomic::Ordering::SeqCst) {
            0 => libc::SIGINT,
            s => s,
        };
        attempts::drop_all(done.shadows).await;
        eprintln!(
            "shade: interrupted by signal {sig}; dropped every attempt, the project is unchanged"
        );
        return 128 + sig;
    }
    let decision = if args.pick.is_some() {
        Decision::PickBest
    } else if !args.json && std::io::stdin().is_terminal() && std::io::stdout().is_terminal() {
        Decision::Screen
    } else {
        Decision::Report
    };
    tokio::task::block_in_place(|| attempts::finish(done, decision, args.json)).0
}

/// The `--json` event closing a `--shadow` run.
#[derive(Serialize)]
struct ChangesetEvent<'a> {
    r#type: &'static str,
    changes: &'a [Change],
    /// Writes outside the project (never written by the accept).
    outside: &'a [shade_fusefs::outside::OutsideChange],
    accepted: bool,
    conflicts: Vec<crate::review::conflicts::ConflictJson>,
    /// Changes `--accept` refused as code for the host (nothing was written).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    held: Vec<std::path::PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// `--accept` refused for changes that are code for the host (`held`): says which and why,
/// and keeps the branch's diff in the state directory for the user (the branch is dropped,
/// as on a conflict).
fn hold_host_code(shadow: &Shadow, changes: &shade_fusefs::Changeset, held: &[std::path::PathBuf]) {
    let path = shade_fusefs::StateDir::from_env().root().join(format!(
        "held-{}-{}.diff",
        std::process::id(),
        chrono::Utc::now().format("%Y%m%dT%H%M%S")
    ));
    let saved = std::fs::write(&path, shadow.diff(changes)).is_ok();
    eprintln!(
        "shade: not accepted: {} would write code for the host by where {} (a shell start-up \
         file, ~/.ssh, git's global config, shade's own config, autostart, a directory on PATH, \
         /etc…); --accept never writes these, only you do; nothing was written{}:",
        shade_agent::tools::text::plural(held.len(), "change"),
        if held.len() == 1 {
            "it lies"
        } else {
            "they lie"
        },
        if saved {
            format!("; the branch's diff is in {}", path.display())
        } else {
            String::new()
        }
    );
    for p in held {
        eprintln!("  {}", shade_fusefs::quote::quote_path(p));
    }
}

/// `--shadow`: show what the branch changed, then accept it (`--accept`, clean runs only)
/// or drop it. Returns the exit status.
fn finish_shadow(shadow: Shadow, args: &ExecArgs, stop: Option<StopReason>, code: i32) -> i32 {
    let changes = shadow.changeset(false);
    let outside = shadow.outside();
    let project = shadow.project().to_path_buf();
    if !args.json {
        let mut out = std::io::stdout().lock();
        if changes.is_empty() && outside.is_empty() {
            let _ = writeln!(out, "(no changes in the shadow branch)");
        }
        for c in &changes.changes {
            let _ = writeln!(out, "{c}");
        }
        if !outside.is_empty() {
            let _ = writeln!(out, "outside the project (not written by accept):");
            for l in outside.lines(shade_fusefs::outside::home_dir().as_deref()) {
                let _ = writeln!(out, "  {l}");
            }
        }
        let _ = out.flush();
    }
    let mut event = ChangesetEvent {
        r#type: "changeset",
        changes: &changes.changes,
        outside: &outside.changes,
        accepted: false,
        conflicts: Vec::new(),
        held: Vec::new(),
        error: None,
    };
    let mut final_code = code;
    let signals =
        (args.accept && stop == Some(StopReason::Completed)).then(shade_fusefs::DeferSignals::new);
    let held = if args.accept && stop == Some(StopReason::Completed) {
        shadow.host_code_changes(&changes)
    } else {
        Vec::new()
    };
    if !held.is_empty() {
        // Red team round 8: `--accept` takes whatever the model did, but never code for
        // the host (the project is or holds the home): all or nothing, as for a conflict.
        hold_host_code(&shadow, &changes, &held);
        event.held = held;
        final_code = exit::CONFLICT;
        shadow.abort();
    } else if args.accept && stop == Some(StopReason::Completed) {
        let n = changes.changes.len();
        match shadow.accept(AcceptFlags::default()) {
            Ok(report) => {
                event.accepted = true;
                if !crate::review::conflicts::report_accepted(n, &report, args.json) {
                    event.error = Some(crate::review::conflicts::not_applied_summary(&report));
                    final_code = exit::SHADE_ERROR;
                }
            }
            Err(AcceptError::Conflicts(list)) => {
                event.conflicts = crate::review::conflicts::report_conflicts(&list, &project);
                final_code = exit::CONFLICT;
            }
            Err(e @ AcceptError::Owner { .. }) => {
                eprintln!("shade: {e}");
                event.error = Some(e.to_string());
                final_code = exit::CONFLICT;
            }
            Err(e) => {
                eprintln!("shade: {}", visible_controls(&e.to_string()));
                event.error = Some(e.to_string());
                final_code = exit::SHADE_ERROR;
            }
        }
    } else {
        if !args.json {
            if args.accept {
                eprintln!("shade: not accepted: the run did not finish cleanly");
            } else if !changes.is_empty() {
                eprintln!(
                    "shade: the shadow branch was dropped; {} is unchanged",
                    project.display()
                );
            }
        }
        shadow.abort();
    }
    if args.json {
        if let Ok(line) = serde_json::to_string(&event) {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
    }
    crate::cmd_run::after_deferred(signals, final_code)
}

fn print_json(e: AgentEvent) {
    if let Ok(line) = serde_json::to_string(&e) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
}

/// Readable transcript: answer text as it streams (Markdown rendered on a terminal that
/// wants it, raw otherwise), one line per tool call, notices on stderr.
pub(crate) struct Renderer {
    /// The last thing written to stdout did not end with a newline.
    mid_line: bool,
    /// stdout is a terminal: the model's text is shown with its control characters made
    /// visible (an escape sequence could clear the screen or forge a line); a pipe gets it
    /// byte for byte.
    terminal: bool,
    /// Renders the answer's Markdown; None: the text goes out exactly as it came.
    markdown: Option<crate::markdown::Stream>,
}

impl Default for Renderer {
    fn default() -> Self {
        use std::io::IsTerminal;
        Renderer {
            mid_line: false,
            terminal: std::io::stdout().is_terminal(),
            markdown: crate::markdown::wanted().then(crate::markdown::Stream::default),
        }
    }
}

impl Renderer {
    /// One line of shade's own (a tool call, a note): what it quotes from the model or a
    /// tool is shown, never obeyed, pipe or not.
    pub(crate) fn line(&mut self, s: &str) {
        self.end_line();
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", visible_controls(s));
        let _ = out.flush();
    }

    /// Make sure the next output starts on a fresh line. The answer's text is over for now
    /// (a tool runs, a question is asked, the turn ended): a code block it left open closes.
    pub(crate) fn end_line(&mut self) {
        if let Some(md) = &mut self.markdown {
            let text = md.finish(crate::markdown::Screen::of_stdout());
            md.reset();
            if !text.is_empty() {
                let mut out = std::io::stdout().lock();
                let _ = write!(out, "{text}");
                let _ = out.flush();
            }
            self.mid_line = false;
        }
        if self.mid_line {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out);
            let _ = out.flush();
            self.mid_line = false;
        }
    }

    pub(crate) fn render(&mut self, e: &AgentEvent) {
        match e {
            AgentEvent::TextDelta { text } => {
                let text = if self.terminal {
                    visible_controls(text)
                } else {
                    std::borrow::Cow::Borrowed(text.as_str())
                };
                let text = text.as_ref();
                let mut out = std::io::stdout().lock();
                match &mut self.markdown {
                    Some(md) => {
                        let styled = md.push(text, crate::markdown::Screen::of_stdout());
                        let _ = write!(out, "{styled}");
                        self.mid_line = md.mid_line();
                    }
                    None => {
                        let _ = write!(out, "{text}");
                        self.mid_line = !text.ends_with('\n');
                    }
                }
                let _ = out.flush();
            }
            AgentEvent::ToolEnd {
                ok,
                denied,
                display,
                output,
                ..
            } => {
                let line = if *denied {
                    // Say why, so the user knows what was refused and how to allow it.
                    let why = output.split(". ").next().unwrap_or(output);
                    let why = why.trim_start_matches("Refused without running: ");
                    format!("  ⊘ {display}: {why}")
                } else if *ok {
                    format!("  ✓ {display}")
                } else {
                    format!("  ✗ {display}")
                };
                self.line(&line);
            }
            AgentEvent::Retry {
                attempt,
                delay_ms,
                reason,
            } => eprintln!(
                "shade: {}; retry {attempt} in {:.1} s",
                visible_controls(reason),
                *delay_ms as f64 / 1000.0
            ),
            AgentEvent::ModelSwitch { from, to, reason } => eprintln!(
                "{}",
                visible_controls(&format!("shade: switching model {from} → {to} ({reason})"))
            ),
            AgentEvent::Error { message } => {
                self.end_line();
                eprintln!("shade: {}", visible_controls(message));
            }
            AgentEvent::Done { reason, .. } => {
                self.end_line();
                if *reason == StopReason::Cancelled {
                    eprintln!("shade: cancelled");
                }
            }
            AgentEvent::TurnStart { .. }
            | AgentEvent::ToolStart { .. }
            | AgentEvent::Usage { .. } => {}
        }
    }
}

/// Asks on the terminal (stderr prompt, stdin answer).
struct TerminalApprover;

impl Approver for TerminalApprover {
    fn ask<'a>(&'a self, request: ApprovalRequest<'a>) -> BoxFuture<'a, Answer> {
        let mut question = String::new();
        if let Some(diff) = request.preview {
            question.push_str(&visible_controls(diff));
            if !diff.ends_with('\n') {
                question.push('\n');
            }
        }
        question.push_str(&format!(
            "shade: allow the agent to {}? [y/N] ",
            visible_controls(request.what)
        ));
        Box::pin(async move {
            let answer = tokio::task::spawn_blocking(move || {
                eprint!("\n{question}");
                let _ = std::io::stderr().flush();
                let mut line = String::new();
                std::io::stdin().read_line(&mut line).map(|_| line)
            })
            .await;
            match answer {
                Ok(Ok(line)) if matches!(line.trim(), "y" | "Y" | "yes") => Answer::Yes,
                _ => Answer::No(
                    "The user declined this tool call. Do not retry it; ask or continue without it."
                        .into(),
                ),
            }
        })
    }
}

/// Starts the `[mcp_servers]` of the config and offers their tools; a server that fails is
/// said in one line and left out.
pub(crate) async fn connect_mcp(
    config: &shade_agent::tools::config::ToolsConfig,
    project: &std::path::Path,
    tools: &mut ToolRegistry,
) -> shade_agent::tools::mcp::McpServers {
    let mcp = shade_agent::tools::mcp::McpServers::connect(&config.mcp_servers, project).await;
    for w in &mcp.warnings {
        eprintln!("shade: {}", visible_controls(w));
    }
    for t in &mcp.tools {
        tools.add(t.clone());
    }
    mcp
}

/// After a turn of a live session: what went wrong with its accepts (a conflict keeps the
/// branch pending), and what its commands wrote outside the project (kept in the session's
/// layer, not on the host). None when there is nothing to say.
pub(crate) fn live_summary(live: &shade_agent::shadow::Live) -> Option<String> {
    let mut lines = live.take_notices();
    if live.pending() {
        let n = live.with_shadow(|s| s.map_or(0, |s| s.changeset(true).changes.len()));
        lines.push(format!(
            "the session's branch holds {} not in the project (an accept conflict, or a change \
             that runs code, held for you): /diff shows them, /accept writes them, /abort drops \
             them",
            shade_agent::tools::text::plural(n, "change")
        ));
    }
    if let Some(o) = crate::outside::summary(&live.outside(), 5) {
        lines.push(format!(
            "{o} — in the session's layer, not on the host (/changes lists them; \
             [outside] keep rules keep them at the end)"
        ));
    }
    (!lines.is_empty()).then(|| lines.join("\n"))
}

/// The end of a live session: a pending branch is dropped, saying what it held and where
/// its diff is kept; writes outside the project are kept by the config's `[outside] keep`
/// rules and the rest dropped, each said.
pub(crate) fn close_live(live: &shade_agent::shadow::Live) {
    let (changes, diff) = live.with_shadow(|s| match s {
        Some(s) => {
            let c = s.changeset(true);
            let d = s.diff(&c);
            (c, d)
        }
        None => Default::default(),
    });
    if live.pending() && !changes.changes.is_empty() {
        let state = shade_fusefs::StateDir::from_env();
        let path = state.root().join(format!(
            "dropped-{}-{}.diff",
            std::process::id(),
            chrono::Utc::now().format("%Y%m%dT%H%M%S")
        ));
        let saved = std::fs::write(&path, &diff).is_ok();
        eprintln!(
            "shade: dropped the session's branch with {} never accepted (a conflict, or held because it runs code){}:",
            shade_agent::tools::text::plural(changes.changes.len(), "change"),
            if saved {
                format!("; its diff is in {}", path.display())
            } else {
                String::new()
            }
        );
        for c in &changes.changes {
            eprintln!("  {c}");
        }
    }
    let mut outside = live.outside();
    if outside.is_empty() {
        return;
    }
    let keep = crate::outside::keep_list(&[], true);
    if !keep.is_empty() && !outside.selected(&keep).is_empty() {
        match outside.keep(&keep, &shade_fusefs::StateDir::from_env()) {
            Ok(r) => crate::outside::report_kept(&r.kept, false),
            Err(e) => crate::outside::report_refused(&e),
        }
    }
    let dropped = shade_fusefs::outside::OutsideChanges {
        changes: outside.changes.into_iter().filter(|c| !c.kept).collect(),
        layer: None,
    };
    if let Some(line) = crate::outside::summary(&dropped, 10) {
        eprintln!("shade: dropped with the session, never written to the host: {line}");
    }
}
