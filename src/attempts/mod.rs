//! Best of N (`shade exec --attempts N`): N agent attempts at one prompt, each in its own
//! confined branch (the branches `exec --shadow` uses), at most `--jobs` at a time. After an
//! attempt ends, `--check` runs in its branch like any command of the agent's; its exit code
//! and output become the attempt's result, next to what it changed, its diff size, time and
//! tokens. The attempts are ranked (check passed first, then smaller diff, then faster); one
//! is accepted (`--pick best`, or picked on the screen of [`screen`]) through the same
//! conflict-checked accept as every other, and the others are dropped.
//!
//! Each attempt sees only its own writes: a branch is a private layer over the project, and
//! its commands run in their own sandbox with that branch bound at the project's path.

pub(crate) mod screen;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use shade_agent::approval::{ApprovalMode, NoOneToAsk};
use shade_agent::shadow::ShadowBase;
use shade_agent::tools::ToolRegistry;
use shade_agent::{
    Agent, AgentEvent, AgentOptions, EventSink, Shadow, ShadowOptions, StopReason, ToolContext,
    Workspace,
};
use shade_fusefs::quote::visible_controls;
use shade_fusefs::{AcceptError, AcceptFlags, Change};
use shade_llm::Message;
use tokio_util::sync::CancellationToken;

use crate::exit;
use crate::llm_setup::LlmSetup;

/// Exit status when no attempt passed (nothing accepted).
pub(crate) const NONE_PASSED: i32 = 1;

/// Bytes kept of a check's stdout and of its stderr (head and tail).
const CHECK_OUTPUT_CAP: usize = 64 * 1024;

/// What to run: built by `shade exec` (and chat's `/try`) from their arguments.
pub(crate) struct Plan {
    /// How many attempts.
    pub attempts: usize,
    /// Shell command run in each attempt's branch when it ends (`sh -c`).
    pub check: Option<String>,
    /// The check is killed after this long (and counts as failed).
    pub check_timeout: Duration,
    /// Models to go round (empty: the configured main model).
    pub models: Vec<String>,
    /// Attempts running at once.
    pub jobs: usize,
    /// What may run without asking (nobody is asked: what would be asked is refused).
    pub approval: ApprovalMode,
    /// Model calls per attempt at most.
    pub max_turns: u32,
    /// The prompt, mentions expanded.
    pub prompt: String,
    /// The conversation so far (chat's `/try`), system prompt first; empty: a new one.
    pub history: Vec<Message>,
    /// Branch the attempts off this shadow (a `--shadow` chat's branch: they see its edits,
    /// and accepting one writes into it); None: off the project.
    pub base: Option<ShadowBase>,
}

/// The check's result in one attempt's branch.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CheckResult {
    /// Its exit code; None when it was killed or could not start.
    pub exit: Option<i32>,
    /// Exit code 0.
    pub passed: bool,
    /// Its last lines (stdout then stderr), or why it did not run to the end.
    pub summary: String,
    /// Its whole captured output (stdout then stderr), for the screen.
    #[serde(skip)]
    pub output: String,
}

/// One attempt's result.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Attempt {
    /// 1-based, in the order they were started.
    pub index: usize,
    /// Model it used.
    pub model: String,
    /// Sampling temperature it used (None: the server's default).
    pub temperature: Option<f32>,
    /// The branch's id (in the state dir) while it lives.
    pub branch: String,
    /// How the agent's run ended: completed, turn_limit, error, cancelled.
    pub stop: String,
    /// Why the run failed, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What it changed in the project.
    pub changes: Vec<Change>,
    /// Lines added plus lines removed.
    pub diff_lines: usize,
    /// Wall-clock seconds, agent and check.
    pub seconds: f64,
    /// Prompt plus completion tokens of its model calls.
    pub tokens: u64,
    /// The check's result (None without `--check`).
    pub check: Option<CheckResult>,
    /// The unified diff of its changes.
    #[serde(skip)]
    pub diff: String,
    /// Where its branch is mounted (another attempt's versions are read from here).
    #[serde(skip)]
    pub mount: PathBuf,
    /// Its conversation as it ended (chat goes on from the accepted one's).
    #[serde(skip)]
    pub conversation: Vec<Message>,
}

impl Attempt {
    /// It counts as passing: its check exited 0, or without a check, the agent finished.
    pub(crate) fn passed(&self) -> bool {
        match &self.check {
            Some(c) => c.passed,
            None => self.stop == "completed",
        }
    }
}

/// Ranks attempts best first: passed first, then the smaller diff, then the faster, then
/// the earlier. Returns indexes into `attempts`.
pub(crate) fn rank(attempts: &[Attempt]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..attempts.len()).collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (&attempts[a], &attempts[b]);
        y.passed()
            .cmp(&x.passed())
            .then(x.diff_lines.cmp(&y.diff_lines))
            .then(x.seconds.total_cmp(&y.seconds))
            .then(x.index.cmp(&y.index))
    });
    order
}

/// The temperature of attempt `i` of `n`: spread over 0.2..=1.2 so that attempts differ;
/// one attempt keeps the server's default.
fn temperature(i: usize, n: usize) -> Option<f32> {
    (n > 1).then(|| 0.2 + i as f32 / (n - 1) as f32)
}

/// An attempt's branch and sandbox: as `exec --shadow`'s, but with a private /tmp and a
/// network namespace of its own (loopback only), so that attempts running at once do not
/// see each other's temporary files or ports (each has its own branch, outside layer and
/// PID namespace already). So attempts have no network.
fn attempt_options() -> ShadowOptions {
    let isolation = shade_fusefs::sandbox::Isolation {
        network: true,
        private_tmp: true,
        ..shade_fusefs::sandbox::Isolation::default()
    };
    ShadowOptions {
        branch: shade_fusefs::BranchOptions {
            id_shift: shade_fusefs::sandbox::branch_id_shift(&isolation),
            ..shade_fusefs::BranchOptions::default()
        },
        isolation,
        cache_dirs: Vec::new(),
    }
}

/// The attempts once all have ended, with their branches still mounted.
pub(crate) struct Finished {
    /// Results, in start order.
    pub attempts: Vec<Attempt>,
    /// Their shadows, same order (None: its branch could not be created).
    pub shadows: Vec<Option<Shadow>>,
}

/// Runs the plan's attempts; Err(signal) when cancelled (every branch is dropped by then).
pub(crate) async fn run_all(
    plan: &Plan,
    root: &Path,
    llm: &LlmSetup,
    tools: &ToolRegistry,
    cancel: &CancellationToken,
    stopped_by: &AtomicI32,
    quiet: bool,
) -> Result<Finished, i32> {
    let n = plan.attempts.max(1);
    let slots = Arc::new(tokio::sync::Semaphore::new(plan.jobs.max(1)));
    let mut tasks = Vec::new();
    for i in 0..n {
        let model = match plan.models.len() {
            0 => llm.model.clone(),
            k => plan.models[i % k].clone(),
        };
        let one = One {
            index: i + 1,
            model,
            temperature: temperature(i, n),
            root: root.to_path_buf(),
            provider: llm.provider.clone(),
            background: llm.background.clone(),
            lint: llm.settings.lint.clone(),
            tools: tools.clone(),
            approval: plan.approval,
            max_turns: plan.max_turns,
            prompt: plan.prompt.clone(),
            history: plan.history.clone(),
            base: plan.base.clone(),
            check: plan.check.clone(),
            check_timeout: plan.check_timeout,
        };
        let (slots, cancel) = (slots.clone(), cancel.clone());
        tasks.push(tokio::spawn(async move {
            let Ok(_permit) = slots.acquire_owned().await else {
                return None;
            };
            if cancel.is_cancelled() {
                return None;
            }
            Some(one.run(&cancel, quiet).await)
        }));
    }
    let mut attempts = Vec::new();
    let mut shadows = Vec::new();
    for t in tasks {
        match t.await {
            Ok(Some((a, s))) => {
                attempts.push(a);
                shadows.push(s);
            }
            Ok(None) => {}
            Err(e) => tracing::warn!("an attempt's task failed: {e}"),
        }
    }
    if cancel.is_cancelled() {
        drop_all(shadows).await;
        return Err(match stopped_by.load(Ordering::SeqCst) {
            0 => libc::SIGINT,
            s => s,
        });
    }
    Ok(Finished { attempts, shadows })
}

/// Drops branches off the async workers (unmounting waits for their commands to die).
pub(crate) async fn drop_all(shadows: Vec<Option<Shadow>>) {
    let _ = tokio::task::spawn_blocking(move || drop(shadows)).await;
}

/// One attempt's settings.
struct One {
    index: usize,
    model: String,
    temperature: Option<f32>,
    root: PathBuf,
    provider: Arc<dyn shade_llm::LlmProvider>,
    background: shade_agent::background::BackgroundLlm,
    lint: shade_lint::LintConfig,
    tools: ToolRegistry,
    approval: ApprovalMode,
    max_turns: u32,
    prompt: String,
    history: Vec<Message>,
    base: Option<ShadowBase>,
    check: Option<String>,
    check_timeout: Duration,
}

impl One {
    async fn run(self, cancel: &CancellationToken, quiet: bool) -> (Attempt, Option<Shadow>) {
        let started = Instant::now();
        let mut attempt = Attempt {
            index: self.index,
            model: self.model.clone(),
            temperature: self.temperature,
            branch: String::new(),
            stop: "error".into(),
            error: None,
            changes: Vec::new(),
            diff_lines: 0,
            seconds: 0.0,
            tokens: 0,
            check: None,
            diff: String::new(),
            mount: PathBuf::new(),
            conversation: Vec::new(),
        };
        let root = self.root.clone();
        let base = self.base.clone();
        let created = tokio::task::spawn_blocking(move || {
            match base {
                Some(b) => b.create_child(attempt_options()),
                None => Shadow::create(&root, attempt_options()),
            }
            .map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r);
        let shadow = match created {
            Ok(s) => s,
            Err(e) => {
                attempt.error = Some(format!("cannot create its branch: {e}"));
                return (attempt, None);
            }
        };
        attempt.branch = shadow.id().to_string();
        attempt.mount = shadow.mountpoint();
        let workspace = match Workspace::new(&self.root) {
            Ok(w) => w,
            Err(e) => {
                attempt.error = Some(format!("cannot use the project: {e}"));
                return (attempt, Some(shadow));
            }
        };
        let mut ctx = ToolContext::new(workspace);
        ctx.background = Some(self.background.clone());
        let mut tools = self.tools.clone();
        let hook =
            shade_agent::tools::diagnostics::session_hook(shadow.project(), &self.lint, true);
        if hook.is_some() {
            tools.add(Arc::new(shade_agent::tools::diagnostics::Diagnostics));
        }
        ctx.lint = hook;
        let ctx = shadow.tool_context(&ctx);
        let agent = Agent::new(
            self.provider.clone(),
            tools,
            ctx,
            Arc::new(NoOneToAsk {
                mode: self.approval,
            }),
            AgentOptions {
                model: self.model.clone(),
                max_turns: self.max_turns,
                approval: self.approval,
                temperature: self.temperature,
            },
        );
        let tokens = Arc::new(AtomicU64::new(0));
        let counted = tokens.clone();
        let sink: EventSink = Arc::new(move |e| {
            if let AgentEvent::Usage {
                prompt_tokens,
                completion_tokens,
                ..
            } = e
            {
                counted.fetch_add(prompt_tokens + completion_tokens, Ordering::Relaxed);
            }
        });
        let mut conversation = if self.history.is_empty() {
            agent.start_conversation(&self.prompt)
        } else {
            let mut c = self.history.clone();
            c.push(Message::User {
                content: self.prompt.clone(),
            });
            c
        };
        attempt.stop = match agent.run(&mut conversation, &sink, cancel).await {
            Ok(outcome) => match outcome.stop {
                StopReason::Completed | StopReason::Boundary => "completed",
                StopReason::TurnLimit | StopReason::LoopDetected => "turn_limit",
                StopReason::Cancelled => "cancelled",
                StopReason::Error => "error",
            },
            Err(e) => {
                attempt.error = Some(e.to_string());
                "error"
            }
        }
        .to_string();
        drop(agent);
        attempt.conversation = conversation;
        attempt.tokens = tokens.load(Ordering::Relaxed);
        if cancel.is_cancelled() {
            return (attempt, Some(shadow));
        }
        if let Some(check) = &self.check {
            attempt.check = Some(run_check(&shadow, check, self.check_timeout, cancel).await);
        }
        let changes = shadow.changeset(false);
        attempt.diff = shadow.diff(&changes);
        attempt.diff_lines = diff_lines(&attempt.diff);
        attempt.changes = changes.changes;
        attempt.seconds = started.elapsed().as_secs_f64();
        if !quiet {
            eprintln!("shade: {}", one_line(&attempt));
        }
        (attempt, Some(shadow))
    }
}

/// Runs `check` in the attempt's branch (confined, at the project's path, as the agent's
/// commands run).
async fn run_check(
    shadow: &Shadow,
    check: &str,
    timeout: Duration,
    cancel: &CancellationToken,
) -> CheckResult {
    let cmd = shade_agent::shadow::Command {
        argv: vec!["sh".into(), "-c".into(), check.into()],
        cwd: shadow.project().to_path_buf(),
        env: Vec::new(),
        timeout: Some(timeout),
        output_cap: CHECK_OUTPUT_CAP,
        tee: None,
        user_session: false,
    };
    match shadow.runner().run(cmd, cancel).await {
        Ok(outcome) => {
            let mut output = String::new();
            for c in [&outcome.stdout, &outcome.stderr].into_iter().flatten() {
                output.push_str(&c.text());
            }
            let exit = match outcome.termination {
                shade_fusefs::sandbox::Termination::Exited(c) => Some(c),
                _ => None,
            };
            let mut summary = last_lines(&output, 5);
            if exit.is_none() {
                summary = format!("{:?}; {summary}", outcome.termination);
            }
            CheckResult {
                exit,
                passed: exit == Some(0),
                summary,
                output,
            }
        }
        Err(e) => CheckResult {
            exit: None,
            passed: false,
            summary: format!("the check did not run: {e}"),
            output: String::new(),
        },
    }
}

fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Lines added plus removed in a unified diff.
pub(crate) fn diff_lines(diff: &str) -> usize {
    diff.lines()
        .filter(|l| {
            (l.starts_with('+') && !l.starts_with("+++"))
                || (l.starts_with('-') && !l.starts_with("---"))
        })
        .count()
}

/// One line about an attempt: `#2 model t=0.53: completed, check passed (exit 0), 2
/// changes, 14 lines, 3.2 s, 1200 tokens`.
pub(crate) fn one_line(a: &Attempt) -> String {
    let check = match &a.check {
        None => String::new(),
        Some(c) if c.passed => ", check passed".into(),
        Some(c) => match c.exit {
            Some(code) => format!(", check failed (exit {code})"),
            None => ", check failed (did not finish)".into(),
        },
    };
    let t = a
        .temperature
        .map(|t| format!(" t={t:.2}"))
        .unwrap_or_default();
    visible_controls(&format!(
        "attempt {} ({}{t}): {}{check}, {} change{}, {} diff lines, {:.1} s, {} tokens",
        a.index,
        a.model,
        a.stop,
        a.changes.len(),
        if a.changes.len() == 1 { "" } else { "s" },
        a.diff_lines,
        a.seconds,
        a.tokens
    ))
    .into_owned()
}

/// A unified diff from attempt `a`'s version of every path either changed to `b`'s.
pub(crate) fn compare(a: &Attempt, b: &Attempt) -> String {
    diff_between(
        (&format!("attempt {}", a.index), &a.mount, &a.changes),
        (&format!("attempt {}", b.index), &b.mount, &b.changes),
    )
}

/// A unified diff from one branch's version of every path either changed to the other's:
/// each side is (name for the headers, mount point, its changes).
pub(crate) fn diff_between(
    (a_name, a_mount, a_changes): (&str, &Path, &[Change]),
    (b_name, b_mount, b_changes): (&str, &Path, &[Change]),
) -> String {
    let mut paths: Vec<&Path> = a_changes
        .iter()
        .chain(b_changes)
        .filter(|c| !c.is_dir)
        .map(|c| c.path.as_path())
        .collect();
    paths.sort();
    paths.dedup();
    let mut out = String::new();
    // The branches are hostile: two 4 MiB files of shuffled lines cost the line diff hours
    // (O(ND)); past this one deadline for the whole comparison each diff is a coarse one.
    let deadline = Instant::now() + COMPARE_TIME;
    for p in paths {
        let read = |mount: &Path| read_beneath(mount, p).unwrap_or_default();
        let (x, y) = (read(a_mount), read(b_mount));
        if x == y {
            continue;
        }
        let (x, y) = (String::from_utf8_lossy(&x), String::from_utf8_lossy(&y));
        let diff = similar::TextDiff::configure()
            .deadline(deadline)
            .diff_lines(x.as_ref(), y.as_ref());
        out.push_str(
            &diff
                .unified_diff()
                .header(
                    &format!("{a_name}/{}", p.display()),
                    &format!("{b_name}/{}", p.display()),
                )
                .to_string(),
        );
    }
    out
}

/// Bytes kept of one file a comparison reads.
const COMPARE_LIMIT: u64 = 4 << 20;

/// How long a comparison's line diffs may search for the smallest diff.
const COMPARE_TIME: Duration = Duration::from_secs(5);

/// The regular file `rel` below `mount`, read without following any symlink on the way (a
/// branch is hostile: its `a/b` may be a link to a file of the host that shade, unlike the
/// branch's commands, can read) and at most [`COMPARE_LIMIT`] bytes. None: not a regular
/// file there, or unreadable.
fn read_beneath(mount: &Path, rel: &Path) -> Option<Vec<u8>> {
    use std::ffi::CString;
    use std::io::Read;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    let dir = std::fs::File::open(mount).ok()?;
    let name = CString::new(rel.as_os_str().as_bytes()).ok()?;
    // SAFETY: a zeroed open_how is valid (no flags, no mode, no resolve restrictions).
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: openat2 with a live directory fd, a NUL-terminated name and an open_how of
    // the size given; the returned fd (if any) is owned by us.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            name.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: fd is a fresh descriptor nothing else owns.
    let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd as i32) });
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut out = Vec::new();
    file.take(COMPARE_LIMIT).read_to_end(&mut out).ok()?;
    Some(out)
}

/// The `--json` line of one attempt.
#[derive(Serialize)]
struct AttemptEvent<'a> {
    r#type: &'static str,
    rank: usize,
    #[serde(flatten)]
    attempt: &'a Attempt,
}

/// The `--json` line closing a best-of-N run.
#[derive(Serialize)]
struct BestOfEvent {
    r#type: &'static str,
    /// Attempt indexes, best first.
    ranking: Vec<usize>,
    /// The attempt accepted, if one was.
    accepted: Option<usize>,
    conflicts: Vec<crate::review::conflicts::ConflictJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// How a finished best-of-N run ends.
pub(crate) enum Decision {
    /// Accept the top attempt that passed (`--pick best`).
    PickBest,
    /// A person picks on the screen.
    Screen,
    /// Only report (no terminal, no `--pick`): every branch is dropped.
    Report,
}

/// Reports the finished attempts, accepts the one decided on, drops the rest. Returns the
/// exit status and the accepted attempt's index.
pub(crate) fn finish(done: Finished, decision: Decision, json: bool) -> (i32, Option<usize>) {
    let Finished {
        attempts,
        mut shadows,
    } = done;
    let order = rank(&attempts);
    if json {
        for (r, &i) in order.iter().enumerate() {
            print_json(&AttemptEvent {
                r#type: "attempt",
                rank: r + 1,
                attempt: &attempts[i],
            });
        }
    } else if !matches!(decision, Decision::Screen) {
        let mut out = std::io::stdout().lock();
        for (r, &i) in order.iter().enumerate() {
            let _ = writeln!(out, "{}. {}", r + 1, one_line(&attempts[i]));
        }
        let _ = out.flush();
    }
    let mut event = BestOfEvent {
        r#type: "best_of",
        ranking: order.iter().map(|&i| attempts[i].index).collect(),
        accepted: None,
        conflicts: Vec::new(),
        error: None,
    };
    let any_passed = attempts.iter().any(Attempt::passed);
    let mut code = if any_passed { 0 } else { NONE_PASSED };
    match decision {
        Decision::Report => {
            if !json {
                eprintln!("shade: every attempt's branch was dropped; the project is unchanged (--pick best accepts the best one)");
            }
        }
        Decision::PickBest => match order.iter().copied().find(|&i| attempts[i].passed()) {
            None => {
                eprintln!("shade: no attempt passed; nothing accepted, the project is unchanged")
            }
            Some(i) => {
                let a = &attempts[i];
                if let Some(shadow) = shadows.get_mut(i).and_then(Option::take) {
                    let project = shadow.project().to_path_buf();
                    if !json {
                        eprintln!("shade: accepting attempt {}", a.index);
                    }
                    let signals = shade_fusefs::DeferSignals::new();
                    match shadow.accept(AcceptFlags::default()) {
                        Ok(report) => {
                            event.accepted = Some(a.index);
                            if !crate::review::conflicts::report_accepted(
                                a.changes.len(),
                                &report,
                                json,
                            ) {
                                event.error =
                                    Some(crate::review::conflicts::not_applied_summary(&report));
                                code = exit::SHADE_ERROR;
                            }
                        }
                        Err(AcceptError::Conflicts(list)) => {
                            event.conflicts =
                                crate::review::conflicts::report_conflicts(&list, &project);
                            code = exit::CONFLICT;
                        }
                        Err(e) => {
                            eprintln!("shade: {}", visible_controls(&e.to_string()));
                            event.error = Some(e.to_string());
                            code = match e {
                                AcceptError::Owner { .. } => exit::CONFLICT,
                                _ => exit::SHADE_ERROR,
                            };
                        }
                    }
                    code = crate::cmd_run::after_deferred(Some(signals), code);
                }
            }
        },
        Decision::Screen => {
            let (status, picked) = screen::choose(&attempts, &order, &mut shadows);
            event.accepted = picked;
            code = status;
        }
    }
    drop(shadows);
    if json {
        print_json(&event);
    }
    (code, event.accepted)
}

fn print_json<T: Serialize>(v: &T) {
    if let Ok(line) = serde_json::to_string(v) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(index: usize, passed: bool, diff_lines: usize, seconds: f64) -> Attempt {
        Attempt {
            index,
            model: "m".into(),
            temperature: None,
            branch: String::new(),
            stop: "completed".into(),
            error: None,
            changes: Vec::new(),
            diff_lines,
            seconds,
            tokens: 0,
            check: Some(CheckResult {
                exit: Some(if passed { 0 } else { 1 }),
                passed,
                summary: String::new(),
                output: String::new(),
            }),
            diff: String::new(),
            mount: PathBuf::new(),
            conversation: Vec::new(),
        }
    }

    #[test]
    fn passed_first_then_smaller_diff_then_faster() {
        let list = vec![
            attempt(1, false, 1, 1.0),
            attempt(2, true, 9, 1.0),
            attempt(3, true, 3, 5.0),
            attempt(4, true, 3, 2.0),
        ];
        let order: Vec<usize> = rank(&list).iter().map(|&i| list[i].index).collect();
        assert_eq!(order, vec![4, 3, 2, 1]);
    }

    /// Hostile branches (attack round): files of shuffled lines, each side different,
    /// made compare_branches search for hours; now it ends (bounded wait: it fails
    /// after two minutes rather than hanging).
    #[test]
    fn comparison_of_shuffled_files_ends() {
        let dir = std::env::temp_dir().join(format!("shade-compare-{}", std::process::id()));
        let (a, b) = (dir.join("a"), dir.join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        let n = 60_000usize;
        let text =
            |k: usize| -> String { (0..n).map(|i| format!("{:016}\n", (i * k) % n)).collect() };
        std::fs::write(a.join("f"), text(7919)).unwrap();
        std::fs::write(b.join("f"), text(104_729)).unwrap();
        let change = Change {
            kind: shade_fusefs::ChangeKind::Modified,
            path: PathBuf::from("f"),
            old_path: None,
            is_dir: false,
            ignored: false,
            mode: None,
            owner: None,
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let (ma, mb) = (a.clone(), b.clone());
        std::thread::spawn(move || {
            let c = [change];
            let _ = tx.send(diff_between(("a", &ma, &c), ("b", &mb, &c)).len());
        });
        let got = rx.recv_timeout(std::time::Duration::from_secs(120));
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(got.is_ok_and(|len| len > 0), "the comparison did not end");
    }

    #[test]
    fn temperatures_differ() {
        assert_eq!(temperature(0, 1), None);
        let t: Vec<f32> = (0..4).map(|i| temperature(i, 4).unwrap_or(0.0)).collect();
        assert!(t.windows(2).all(|w| w[0] < w[1]), "{t:?}");
        assert!((t[3] - 1.2).abs() < 1e-6);
    }
}
