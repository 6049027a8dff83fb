//! The interactive loop: read a line, run a turn (or a slash command), then compute the next
//! suggestion in the background and show it as ghost text once it is due.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use reedline::Signal;
use shade_agent::approval::ApprovalMode;
use shade_agent::background::prompt_id;
use shade_agent::followup::cache::CacheSafeParams;
use shade_agent::followup::controller::{FollowupController, FollowupHooks};
use shade_agent::followup::generate::{generate_suggestion, SuggestionOutcome, SuggestionSource};
use shade_agent::followup::guards::{count_model_turns, SuggestionGuards};
use shade_agent::followup::telemetry::Telemetry;
use shade_agent::{EventSink, StopReason};
use shade_llm::Message;
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

use super::approve;
use super::commands::{self, Command, Flow};
use super::echo;
use super::editor::{self, ChatPrompt, Ghost};
use super::session::Session;
use super::speculate::{self, Accepted, Speculator, Template};
use super::view::View;
use crate::exit;

pub(crate) fn run(mut session: Session, runtime: &tokio::runtime::Runtime) -> i32 {
    let _guard = runtime.enter();
    let telemetry = if session.settings.telemetry {
        Telemetry::from_env(session.id)
    } else {
        Telemetry::disabled()
    };
    let wake = Arc::new(AtomicBool::new(false));
    let speculator = Speculator::new(session.runtime.clone());
    let (on_shown, on_dismissed) = (speculator.clone(), speculator.clone());
    let hooks = FollowupHooks {
        on_shown: Box::new(move |text: &str| on_shown.on_shown(text)),
        on_dismissed: Box::new(move |_text: &str| on_dismissed.on_dismissed()),
        ..FollowupHooks::default()
    };
    let ghost = Arc::new(Ghost::new(FollowupController::new(
        hooks,
        telemetry.clone(),
    )));
    let history = shade_fusefs::StateDir::from_env()
        .root()
        .join("chat_history");
    if let Some(dir) = history.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let project = session.agent.context().workspace.root().to_path_buf();
    let mut editor = editor::build(Some(&history), &project, ghost.clone(), wake.clone());
    println!(
        "shade chat in {} — model {}, approval {}. /help for commands, Ctrl-D to leave.",
        session.agent.context().workspace.shown_root().display(),
        session.agent.options().model,
        session.agent.options().approval
    );
    if let Some(summary) = session.resume_summary() {
        println!("{summary}");
    }
    let renderer = Arc::new(Mutex::new(View::default()));
    if let Some(approver) = &session.approver {
        let view = renderer.clone();
        approver.on_ask(Arc::new(move || {
            if let Ok(mut v) = view.lock() {
                v.end_line();
            }
        }));
    }
    let r = renderer.clone();
    let sink: EventSink = Arc::new(move |e| {
        if let Ok(mut r) = r.lock() {
            r.render(&e);
        }
    });
    let mut prefix: Option<CacheSafeParams> = None;
    let mut pending: Option<CancellationToken> = None;
    let mut ctrl_c_armed = false;
    // The terminal closing (SIGHUP) or a SIGTERM ends the session the same way Ctrl-D does,
    // so no speculation's branch outlives it.
    let hang_up = Arc::new(AtomicBool::new(false));
    // Which signal ended the session (0: none): the exit status is 128 + it, as a shell's.
    let ended_by = Arc::new(AtomicI32::new(0));
    // Set once the loop has ended and the session is being closed (branches unmounted).
    let closing = Arc::new(AtomicBool::new(false));
    for (kind, number) in [
        (SignalKind::hangup(), libc::SIGHUP),
        (SignalKind::terminate(), libc::SIGTERM),
    ] {
        let (flag, wake, spec) = (hang_up.clone(), wake.clone(), speculator.clone());
        let (closing, ended_by) = (closing.clone(), ended_by.clone());
        match signal(kind) {
            Ok(mut s) => {
                session.runtime.spawn(async move {
                    if s.recv().await.is_some() {
                        let _ = ended_by.compare_exchange(
                            0,
                            number,
                            Ordering::SeqCst,
                            Ordering::SeqCst,
                        );
                        flag.store(true, Ordering::SeqCst);
                        wake.store(true, Ordering::SeqCst);
                        // A running turn is cancelled as by Ctrl-C, so the loop comes round.
                        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGINT);
                        let tick = std::time::Duration::from_millis(50);
                        for _ in 0..20 {
                            if closing.load(Ordering::SeqCst) {
                                break;
                            }
                            tokio::time::sleep(tick).await;
                        }
                        if closing.load(Ordering::SeqCst) {
                            // The loop is closing the session: unmounting can take a while on
                            // a loaded machine, and leaving mid-way would leave a branch
                            // mounted. The process ends when it is done.
                            tokio::time::sleep(std::time::Duration::from_secs(60)).await;
                        }
                        // A closed terminal can leave the line editor spinning on its dead
                        // input instead of returning: drop the speculation here and leave.
                        // Whatever still holds a branch (the main thread at a question about
                        // a speculation, a drop under way) cannot be waited for: every
                        // branch of the process is detached here.
                        spec.shutdown_within(std::time::Duration::from_secs(3));
                        shade_fusefs::unmount_all_before_exit();
                        shade_agent::shadow::remove_layers_before_exit();
                        echo::restore();
                        std::process::exit(128 + ended_by.load(Ordering::SeqCst));
                    }
                });
            }
            Err(e) => tracing::warn!("cannot catch {kind:?}: {e}"),
        }
    }
    watch_terminal();
    // Ctrl-C outside a turn (a slash command at work, a shadow branch being written) must
    // not kill the session with its branches mounted: from here on SIGINT only ever cancels
    // what listens for it. (Tokio keeps the handler for the life of the process.)
    if let Err(e) = signal(SignalKind::interrupt()) {
        tracing::warn!("cannot catch SIGINT: {e}");
    }
    let mut code = 0;
    loop {
        if hang_up.load(Ordering::SeqCst) {
            break;
        }
        let mode = session.agent.options().approval;
        let prompt = ChatPrompt {
            label: match mode {
                ApprovalMode::Default => "shade".into(),
                other => format!("shade [{other}]"),
            },
        };
        let read = match editor.read_line(&prompt) {
            Ok(s) => s,
            Err(_) if terminal_gone(0) => {
                // Closed under us: what is left to say has nowhere to go.
                silence_output();
                code = 128 + libc::SIGHUP;
                break;
            }
            Err(e) => {
                use std::io::Write;
                let _ = writeln!(std::io::stderr(), "shade: the terminal failed: {e}");
                code = exit::SHADE_ERROR;
                break;
            }
        };
        let line = match read {
            Signal::Success(line) => line,
            Signal::CtrlC => {
                let empty = ghost.line_empty.load(Ordering::SeqCst);
                if empty && ctrl_c_armed {
                    break;
                }
                ctrl_c_armed = empty;
                if empty {
                    println!("(press Ctrl-C again to exit)");
                }
                continue;
            }
            Signal::CtrlD => break,
            // The suggestion became visible: reading again repaints the prompt with it.
            _ => continue,
        };
        ctrl_c_armed = false;
        let text = editor::submitted_text(&line);
        let text = text.trim().to_string();
        let text = text.as_str();
        if text.is_empty() {
            // Nothing to send: whatever suggestion is coming or shown stays.
            continue;
        }
        if let Some(c) = pending.take() {
            c.cancel();
        }
        // Take the speculation before the controller is reset (which would drop it): it is
        // used only when the submitted text is exactly the suggestion it ran.
        let accepted = ghost.accepted.lock().ok().and_then(|mut a| a.take());
        let speculation = accepted
            .as_ref()
            .filter(|(suggestion, _)| suggestion == text)
            .and_then(|_| speculator.take_for(text));
        if let Ok(mut ctl) = ghost.ctl.lock() {
            ctl.clear(Instant::now());
        }
        speculator.on_dismissed();
        if let Some(command) = text.strip_prefix('!').map(str::trim) {
            if !command.is_empty() {
                prefix = None;
                speculator.prepare(None);
                session.run_user_command(command);
                session.save();
            }
            continue;
        }
        // Keys typed from here until the next prompt wait for it, unechoed.
        let quiet = echo::Quiet::new();
        if text.starts_with('/') {
            match commands::parse(text) {
                Ok(cmd) => {
                    if cmd == Command::Clear {
                        prefix = None;
                        speculator.prepare(None);
                    }
                    if matches!(cmd, Command::Accept { .. } | Command::Abort) {
                        // Speculations branch off the session's branch: gone before it is.
                        speculator.prepare(None);
                        speculator.settle();
                    }
                    if commands::apply(&mut session, cmd) == Flow::Exit {
                        break;
                    }
                    session.save();
                }
                Err(msg) => println!("{msg}"),
            }
            continue;
        }
        let mut next_suggestion = None;
        // An accepted speculation is a turn of its own (`/undo` takes it back alone).
        if speculation.is_some() {
            session.next_turn();
        }
        shade_fusefs::accept::history::set_origin(session.history_origin());
        let result = match speculation {
            Some(spec) => match speculate::accept(
                spec,
                &mut session.conversation,
                speculate::Asking {
                    mode,
                    allowed: &|tool| {
                        session
                            .approver
                            .as_ref()
                            .is_some_and(|a| a.always_allows(tool))
                    },
                    into_branch: session.shadow.is_some(),
                    ask: &|changes| {
                        if let Ok(mut r) = renderer.lock() {
                            r.end_line();
                        }
                        approve::confirm(changes, "write these changes into the project")
                    },
                },
                &sink,
                &session.runtime.clone(),
                &telemetry,
            ) {
                Accepted::Applied {
                    continue_live,
                    next,
                    leftover,
                } => {
                    speculator.dispose(leftover);
                    next_suggestion = next;
                    if continue_live {
                        session.continue_until_ctrl_c(&sink)
                    } else {
                        session.after_speculated_turn();
                        Ok(ended(StopReason::Completed))
                    }
                }
                Accepted::Cancelled => Ok(ended(StopReason::Cancelled)),
                Accepted::Declined => {
                    // No turn happened: the conversation is as it was; no suggestion follows.
                    if let Ok(mut r) = renderer.lock() {
                        r.end_line();
                    }
                    continue;
                }
                Accepted::RunLive => session.turn_until_ctrl_c(text, &sink),
            },
            None => session.turn_until_ctrl_c(text, &sink),
        };
        drop(quiet);
        if let Ok(mut r) = renderer.lock() {
            r.end_line();
        }
        let cancelled = matches!(&result, Ok(o) if o.stop == StopReason::Cancelled);
        match &result {
            // Over the `^C` the terminal echoed, when it stands alone on the line.
            Ok(_) if cancelled => println!("\r\x1b[K(cancelled)"),
            Ok(_) => {}
            // The model error was shown as it happened (the turn's Error event); saying it
            // again here would print the same long line twice.
            Err(_) => {}
        }
        if let Some(line) = session.branch_summary() {
            println!("\x1b[2m{line}\x1b[0m");
        }
        session.save();
        let tools = session.agent.tool_specs();
        prefix = CacheSafeParams::capture(
            session.id,
            &session.conversation,
            &tools,
            &session.agent.options().model,
            prefix.as_ref(),
        );
        let guards = SuggestionGuards {
            enabled: session.suggest,
            interactive: true,
            plan_mode: mode == ApprovalMode::Plan,
            last_answer_error: session.last_turn_failed,
            dialog_open: false,
            model_turns: count_model_turns(&session.conversation),
        };
        speculator.prepare(match (&prefix, session.speculate) {
            (Some(p), true) => Some(Template {
                prefix: p.clone(),
                agent: session.agent.clone(),
                background: session.llm.background.clone(),
                project: session.agent.context().workspace.shown_root().to_path_buf(),
                base: session.shadow.as_ref().map(|s| s.base()),
                mode: session.agent.options().approval,
                pipeline: true,
                telemetry: telemetry.clone(),
            }),
            _ => None,
        });
        if let Some(next) = next_suggestion.filter(|_| guards.blocked_by().is_none()) {
            // The speculation already computed what comes next: show it at once.
            if let Ok(mut ctl) = ghost.ctl.lock() {
                ctl.show_now(next, prompt_id::PIPELINED_SUGGESTION, Instant::now());
            }
        } else if guards.blocked_by().is_none() && !cancelled {
            // (After Ctrl-C the user wants the prompt, not the same idea offered again.)
            pending = Some(spawn_suggestion(
                &session,
                prefix.clone(),
                ghost.clone(),
                wake.clone(),
            ));
        }
    }
    closing.store(true, Ordering::SeqCst);
    if let Some(c) = pending.take() {
        c.cancel();
    }
    if let Ok(mut ctl) = ghost.ctl.lock() {
        ctl.clear(Instant::now());
    }
    speculator.shutdown();
    session.close();
    match ended_by.load(Ordering::SeqCst) {
        0 => code,
        sig => 128 + sig,
    }
}

/// A terminal can vanish without a SIGHUP (it was not our controlling terminal, or the
/// hang-up was ignored): reads on it then return EOF or EIO at once, and the line editor
/// would spin on them. A thread watches it for the hang-up (`poll` reports POLLHUP without
/// reading a byte) and signals us SIGHUP, which ends the session as a closed terminal does.
fn watch_terminal() {
    let spawned = std::thread::Builder::new()
        .name("terminal-watch".into())
        .spawn(|| loop {
            if terminal_gone(1000) {
                tracing::debug!("the terminal is gone: ending the session");
                silence_output();
                // SAFETY: signalling ourselves.
                unsafe { libc::kill(libc::getpid(), libc::SIGHUP) };
                return;
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot watch the terminal: {e}");
    }
}

/// Whether our terminal (stdin) has hung up, waiting up to `ms` for it to.
fn terminal_gone(ms: i32) -> bool {
    let mut fds = [libc::pollfd {
        fd: 0,
        events: 0,
        revents: 0,
    }];
    // SAFETY: poll(2) on one pollfd we own, with a timeout.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), 1, ms) };
    n > 0 && fds[0].revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
}

/// Once the terminal is gone, writes to it fail (EIO) and `println!` would panic halfway
/// through closing the session: stdout and stderr go to /dev/null from then on.
fn silence_output() {
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        use std::os::fd::AsRawFd;
        // SAFETY: dup2(2) onto our own standard streams.
        unsafe {
            libc::dup2(null.as_raw_fd(), 1);
            libc::dup2(null.as_raw_fd(), 2);
        }
    }
}

/// A turn that made no model call of its own.
fn ended(stop: StopReason) -> shade_agent::RunOutcome {
    shade_agent::RunOutcome {
        stop,
        boundary: None,
        turns: 0,
        final_text: String::new(),
        usage: Default::default(),
    }
}

/// Ask the fast model for the next input; when it arrives, hand it to the controller and wake
/// the editor once it is due (300 ms later), so it repaints with the ghost text.
fn spawn_suggestion(
    session: &Session,
    prefix: Option<CacheSafeParams>,
    ghost: Arc<Ghost>,
    wake: Arc<AtomicBool>,
) -> CancellationToken {
    let cancel = CancellationToken::new();
    let token = cancel.clone();
    let background = session.llm.background.clone();
    let cached = prefix.filter(|_| session.settings.cache_sharing);
    let conversation: Vec<Message> = session.conversation.clone();
    let request = ghost.requested();
    session.runtime.spawn(async move {
        let _done = Arrived(&ghost, request);
        let source = match &cached {
            Some(p) => SuggestionSource::Cached(p),
            None => SuggestionSource::Standalone(&conversation),
        };
        match generate_suggestion(&background, source, &token).await {
            SuggestionOutcome::Suggested(text) => {
                let due = ghost.ctl.lock().ok().and_then(|mut ctl| {
                    ctl.set_suggestion(Some(text), Instant::now());
                    ctl.due()
                });
                if let Some(due) = due {
                    tokio::time::sleep_until(due.into()).await;
                }
                if token.is_cancelled() {
                    return;
                }
                let shown = ghost
                    .ctl
                    .lock()
                    .map(|mut ctl| ctl.tick(Instant::now()))
                    .unwrap_or(false);
                if shown {
                    wake.store(true, Ordering::SeqCst);
                }
            }
            SuggestionOutcome::Suppressed(rule) => {
                if let Ok(ctl) = ghost.ctl.lock() {
                    ctl.suppressed(rule, shade_agent::background::prompt_id::PROMPT_SUGGESTION);
                }
            }
            SuggestionOutcome::Failed(e) => tracing::debug!("no suggestion: {e}"),
        }
    });
    cancel
}

/// Tells the editor a suggestion request ended, however its task ends (even cancelled).
struct Arrived<'a>(&'a Ghost, u64);

impl Drop for Arrived<'_> {
    fn drop(&mut self) {
        self.0.arrived(self.1);
    }
}
