//! `shade chat` without a terminal: prompts read line by line from stdin, each run as a turn
//! of one shared conversation, like a sequence of `shade exec` runs; slash commands work too.
//! The exit status is that of the last turn (as `shade exec`).

use std::io::BufRead;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};

use shade_agent::{EventSink, StopReason};

use super::commands::{self, Flow};
use super::session::Session;
use crate::cmd_exec::Renderer;
use crate::exit;

pub(crate) fn run(mut session: Session, runtime: &tokio::runtime::Runtime) -> i32 {
    let renderer = Arc::new(Mutex::new(Renderer::default()));
    let r = renderer.clone();
    let sink: EventSink = Arc::new(move |e| {
        if let Ok(mut r) = r.lock() {
            r.render(&e);
        }
    });
    if let Some(summary) = session.resume_summary() {
        eprintln!("shade: {summary}");
    }
    // Ctrl-C, SIGTERM and SIGHUP end the session as the end of input does — a running turn
    // cancelled, the session's branch dropped and unmounted — and exit 128+N; also while
    // shade waits for the next line.
    let stopped_by = Arc::new(AtomicI32::new(0));
    {
        let _guard = runtime.enter();
        for (kind, signo) in [
            (SignalKind::interrupt(), libc::SIGINT),
            (SignalKind::terminate(), libc::SIGTERM),
            (SignalKind::hangup(), libc::SIGHUP),
        ] {
            match signal(kind) {
                Ok(mut stream) => {
                    let stopped_by = stopped_by.clone();
                    runtime.spawn(async move {
                        while stream.recv().await.is_some() {
                            let first = stopped_by
                                .compare_exchange(0, signo, Ordering::SeqCst, Ordering::SeqCst)
                                .is_ok();
                            // A running turn listens for Ctrl-C: cancel it the same way.
                            if first && signo != libc::SIGINT {
                                let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGINT);
                            }
                        }
                    });
                }
                Err(e) => tracing::warn!("cannot catch signal {signo}: {e}"),
            }
        }
    }
    // Lines come from a thread, so a signal is noticed while shade waits for input.
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let stopped = || match stopped_by.load(Ordering::SeqCst) {
        0 => None,
        signo => Some(128 + signo),
    };
    let mut code = 0;
    loop {
        if stopped().is_some() {
            break;
        }
        let line = match lines.recv_timeout(Duration::from_millis(100)) {
            Ok(Ok(line)) => line,
            Ok(Err(_)) | Err(RecvTimeoutError::Disconnected) => break,
            Err(RecvTimeoutError::Timeout) => continue,
        };
        let prompt = line.trim();
        if prompt.is_empty() {
            continue;
        }
        if let Some(command) = prompt.strip_prefix('!').map(str::trim) {
            if !command.is_empty() {
                session.run_user_command(command);
                session.save();
            }
            continue;
        }
        if prompt.starts_with('/') {
            match commands::parse(prompt) {
                Ok(cmd) => {
                    if commands::apply(&mut session, cmd) == Flow::Exit {
                        break;
                    }
                    session.save();
                }
                Err(msg) => eprintln!("shade: {msg}"),
            }
            continue;
        }
        let outcome = session.turn_until_ctrl_c(prompt, &sink);
        session.save();
        code = match outcome {
            Ok(o) => match o.stop {
                StopReason::Completed | StopReason::Boundary => 0,
                StopReason::TurnLimit | StopReason::LoopDetected => 2,
                StopReason::Cancelled => {
                    session.close();
                    return stopped().unwrap_or(130);
                }
                StopReason::Error => exit::SHADE_ERROR,
            },
            Err(_) => exit::SHADE_ERROR,
        };
    }
    session.close();
    stopped().unwrap_or(code)
}
