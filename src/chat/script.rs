//! `shade chat` without a terminal: prompts read line by line from stdin, each run as a turn
//! of one shared conversation, like a sequence of `shade exec` runs; slash commands work too.
//! The exit status is that of the last turn (as `shade exec`).

use std::io::BufRead;
use std::sync::{Arc, Mutex};

use shade_agent::{EventSink, StopReason};

use super::commands::{self, Flow};
use super::session::Session;
use crate::cmd_exec::Renderer;
use crate::exit;

pub(crate) fn run(mut session: Session, _runtime: &tokio::runtime::Runtime) -> i32 {
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
    let mut code = 0;
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
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
                    return 130;
                }
                StopReason::Error => exit::SHADE_ERROR,
            },
            Err(_) => exit::SHADE_ERROR,
        };
    }
    session.close();
    code
}
