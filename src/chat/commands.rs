//! Slash commands: parsing, help, and the list the completer offers.

use shade_agent::approval::ApprovalMode;
use shade_agent::compact::CompactError;
use shade_agent::tools::text::plural;
use shade_llm::LlmError;

/// Every command with a one-line description (for /help and completion).
pub(crate) const COMMANDS: &[(&str, &str)] = &[
    ("/help", "list the commands and keys"),
    (
        "/model",
        "show the model, or switch: /model NAME; the fast model: /model --fast [NAME]",
    ),
    (
        "/approval",
        "show the approval mode, or switch: /approval default|auto-edit|yolo|plan",
    ),
    ("/compact", "summarise older turns into one message now"),
    ("/clear", "start a new conversation"),
    (
        "/stats",
        "tokens per model, cached tokens, background work counted apart",
    ),
    (
        "/changes",
        "the paths the session's branch changed (with --shadow, or pending after a conflict), \
         and its writes outside the project",
    ),
    ("/diff", "what the session's branch changed, as a diff"),
    (
        "/accept",
        "write the branch into the project (conflict-checked); with --shadow \
         --keep-outside PATH… also keeps those writes outside it",
    ),
    (
        "/abort",
        "drop the branch's changes (--shadow, or pending after a conflict)",
    ),
    (
        "/try",
        "/try N [--check CMD --] PROMPT: N attempts in branches, the best accepted, and the \
         conversation goes on from it",
    ),
    (
        "/undo",
        "undo this session's last turn (every change it brought into the project, shell-made \
         ones included; with --shadow its /accept); /undo N the last N turns",
    ),
    ("/exit", "leave (also Ctrl-D)"),
];

/// A parsed command line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Command {
    Help,
    Model {
        fast: bool,
        name: Option<String>,
    },
    Approval(Option<ApprovalMode>),
    Compact,
    Clear,
    Stats,
    Changes,
    Diff,
    /// `/accept [--keep-outside PATH…]`: the outside paths to keep with it.
    Accept {
        keep: Vec<String>,
    },
    Abort,
    /// `/try N [--check CMD --] PROMPT`: best of N.
    Try {
        n: usize,
        check: Option<String>,
        prompt: String,
    },
    /// `/undo [N]`: undo this session's last N turns' accepts (newest first).
    Undo(usize),
    Exit,
}

/// Parse a line that starts with `/`; the error is the message to show.
pub(crate) fn parse(line: &str) -> Result<Command, String> {
    let mut words = line.split_whitespace();
    let name = words.next().unwrap_or("");
    let rest: Vec<&str> = words.collect();
    let no_args = |c: Command| {
        if rest.is_empty() {
            Ok(c)
        } else {
            Err(format!("{name} takes no arguments"))
        }
    };
    match name {
        "/help" | "/?" => no_args(Command::Help),
        "/model" => {
            let (fast, args) = match rest.first() {
                Some(&"--fast") => (true, &rest[1..]),
                _ => (false, &rest[..]),
            };
            match args {
                [] => Ok(Command::Model { fast, name: None }),
                [m] => Ok(Command::Model {
                    fast,
                    name: Some(m.to_string()),
                }),
                _ => Err("usage: /model [--fast] [NAME]".into()),
            }
        }
        "/approval" => match rest.as_slice() {
            [] => Ok(Command::Approval(None)),
            [m] => m.parse().map(|m| Command::Approval(Some(m))),
            _ => Err("usage: /approval [default|auto-edit|yolo|plan]".into()),
        },
        "/compact" => no_args(Command::Compact),
        "/clear" => no_args(Command::Clear),
        "/stats" => no_args(Command::Stats),
        "/changes" => no_args(Command::Changes),
        "/diff" => no_args(Command::Diff),
        "/accept" => match rest.split_first() {
            None => Ok(Command::Accept { keep: Vec::new() }),
            Some((&"--keep-outside", paths)) if !paths.is_empty() => Ok(Command::Accept {
                keep: paths.iter().map(|p| p.to_string()).collect(),
            }),
            _ => Err("usage: /accept [--keep-outside PATH…]".into()),
        },
        "/abort" => no_args(Command::Abort),
        "/try" => parse_try(line),
        "/undo" => match rest.as_slice() {
            [] => Ok(Command::Undo(1)),
            [n] => match n.parse::<usize>() {
                Ok(n) if n > 0 => Ok(Command::Undo(n)),
                _ => Err("usage: /undo [N] (N ≥ 1: the last N turns)".into()),
            },
            _ => Err("usage: /undo [N]".into()),
        },
        "/exit" | "/quit" => no_args(Command::Exit),
        other => Err(format!("unknown command {other} (try /help)")),
    }
}

/// `/try N [--check CMD --] PROMPT`, the prompt kept as typed.
fn parse_try(line: &str) -> Result<Command, String> {
    let usage = || "usage: /try N [--check CMD --] PROMPT".to_string();
    let rest = line
        .trim_start()
        .strip_prefix("/try")
        .ok_or_else(usage)?
        .trim_start();
    let (n, mut rest) = rest.split_once(char::is_whitespace).ok_or_else(usage)?;
    let n: usize = n
        .parse()
        .ok()
        .filter(|n| (1..=16).contains(n))
        .ok_or_else(|| "/try: N must be a number from 1 to 16".to_string())?;
    rest = rest.trim_start();
    let mut check = None;
    if let Some(after) = rest.strip_prefix("--check ") {
        let (cmd, prompt) = after.split_once(" -- ").ok_or_else(usage)?;
        check = Some(cmd.trim().to_string());
        rest = prompt.trim_start();
    }
    if rest.trim().is_empty() {
        return Err(usage());
    }
    Ok(Command::Try {
        n,
        check,
        prompt: rest.to_string(),
    })
}

/// The /help text.
pub(crate) fn help() -> String {
    let mut s = String::from("Commands:\n");
    for (c, d) in COMMANDS {
        s.push_str(&format!("  {c:<10} {d}\n"));
    }
    s.push_str(
        "Keys: Enter submits; Alt-Enter or a trailing \\ continues on a new line; Ctrl-C cancels \
         a running turn (twice on an empty line exits); Ctrl-D exits.\n\
         A suggestion in dim text: Tab or Right fills it in, Enter submits it, typing dismisses it.\n\
         @path attaches a file or directory (Tab completes paths); !command runs a shell command \
         of yours where the agent's run, and the model sees its output.\n\
         At a question: y yes, n no, a always for that tool this session, Ctrl-C cancels the \
         turn.\n\
         Conversations are saved: `shade chat --continue` picks this one up again.",
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn try_takes_a_count_an_optional_check_and_the_prompt_as_typed() {
        assert_eq!(
            parse("/try 3 fix  the bug"),
            Ok(Command::Try {
                n: 3,
                check: None,
                prompt: "fix  the bug".into()
            })
        );
        assert_eq!(
            parse("/try 2 --check cargo test -q -- fix it"),
            Ok(Command::Try {
                n: 2,
                check: Some("cargo test -q".into()),
                prompt: "fix it".into()
            })
        );
        assert!(parse("/try").is_err());
        assert!(parse("/try 0 x").is_err());
        assert!(parse("/try many x").is_err());
        assert!(parse("/try 2 --check true").is_err());
    }

    #[test]
    fn parses_commands_and_rejects_bad_ones() {
        assert_eq!(parse("/help"), Ok(Command::Help));
        assert_eq!(
            parse("/model --fast small"),
            Ok(Command::Model {
                fast: true,
                name: Some("small".into())
            })
        );
        assert_eq!(
            parse("/model big"),
            Ok(Command::Model {
                fast: false,
                name: Some("big".into())
            })
        );
        assert_eq!(
            parse("/approval yolo"),
            Ok(Command::Approval(Some(ApprovalMode::Yolo)))
        );
        assert!(parse("/approval nope").is_err());
        assert!(parse("/clear now").is_err());
        assert!(parse("/frobnicate").is_err());
        assert_eq!(parse("/exit"), Ok(Command::Exit));
        assert_eq!(parse("/changes"), Ok(Command::Changes));
        assert!(parse("/changes now").is_err());
        assert_eq!(parse("/undo"), Ok(Command::Undo(1)));
        assert_eq!(parse("/undo 3"), Ok(Command::Undo(3)));
        assert!(parse("/undo 0").is_err());
        assert!(parse("/undo x").is_err());
        assert_eq!(parse("/accept"), Ok(Command::Accept { keep: vec![] }));
        assert_eq!(
            parse("/accept --keep-outside ~/.gitconfig ~/.claude"),
            Ok(Command::Accept {
                keep: vec!["~/.gitconfig".into(), "~/.claude".into()]
            })
        );
        assert!(parse("/accept --keep-outside").is_err());
        assert!(parse("/accept now").is_err());
    }
}

/// What the loop does after a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    Continue,
    Exit,
}

/// Run a command against the session, printing its output.
pub(crate) fn apply(session: &mut super::session::Session, cmd: Command) -> Flow {
    match cmd {
        Command::Help => println!("{}", help()),
        Command::Model { fast: false, name } => match name {
            None => println!("model: {}", session.agent.options().model),
            Some(m) => {
                session.agent.set_model(&m);
                println!("model: {m} (from the next turn)");
            }
        },
        Command::Model { fast: true, name } => match name {
            None => println!("fast model: {}", session.llm.background.model()),
            Some(m) => {
                session.llm.background = session.llm.background.with_model(&m);
                println!("fast model: {m}");
            }
        },
        Command::Approval(None) => println!("approval mode: {}", session.agent.options().approval),
        Command::Approval(Some(mode)) => {
            session.agent.set_approval(mode);
            println!("approval mode: {mode}");
        }
        Command::Compact => {
            let cancel = tokio_util::sync::CancellationToken::new();
            let runtime = session.runtime.clone();
            if session.conversation.is_empty() {
                println!("nothing to compact: no conversation yet");
                return Flow::Continue;
            }
            println!("compacting: the fast model summarises the older turns (Ctrl-C stops)…");
            let result = super::session::until_ctrl_c(&runtime, &cancel, session.compact(&cancel));
            match result {
                Ok(r) => println!(
                    "compacted: {} older messages summarised into one, {} kept",
                    r.summarised, r.kept
                ),
                Err(CompactError::Llm(LlmError::Cancelled)) => {
                    println!("\r\x1b[Knot compacted: cancelled; the conversation is unchanged")
                }
                Err(e) => println!("not compacted: {e}"),
            }
        }
        Command::Clear => {
            session.clear();
            println!("new conversation");
        }
        Command::Stats => print!("{}", stats(session)),
        Command::Changes | Command::Diff | Command::Accept { .. } | Command::Abort
            if session.live.is_some() =>
        {
            live_command(session, cmd)
        }
        Command::Changes | Command::Diff | Command::Accept { .. } | Command::Abort
            if session.shadow.is_none() =>
        {
            println!("an unconfined session has no branch: tools write straight into the project")
        }
        which @ (Command::Changes | Command::Diff) => {
            if let Some(shadow) = &session.shadow {
                let changes = shadow.changeset(false);
                let outside = shadow.outside();
                if changes.changes.is_empty() && outside.is_empty() {
                    println!("no changes in the branch");
                    return Flow::Continue;
                }
                for c in &changes.changes {
                    println!("{c}");
                }
                print_outside(&outside);
                if which == Command::Diff {
                    print!(
                        "{}",
                        crate::review::render::for_stdout(&shadow.diff(&changes))
                    );
                    print!(
                        "{}",
                        crate::review::render::for_stdout(&crate::outside::diff(&outside))
                    );
                }
            }
        }
        Command::Accept { keep } => accept_shadow(session, &keep),
        Command::Try { n, check, prompt } => session.try_attempts(n, check, &prompt),
        Command::Undo(n) => undo_turns(session, n),
        Command::Abort => {
            let n = session
                .shadow
                .as_ref()
                .map(|s| s.changeset(false).changes.len())
                .unwrap_or(0);
            if let Some(shadow) = session.shadow.take() {
                shadow.abort();
            }
            println!("dropped {}; the project is unchanged", plural(n, "change"));
            if let Err(e) = session.renew_shadow() {
                println!("shade: {e:#}");
            }
        }
        Command::Exit => return Flow::Exit,
    }
    Flow::Continue
}

/// `/changes`, `/diff`, `/accept`, `/abort` in a live session: its branch holds changes
/// only while an accept conflict keeps them pending; its writes outside the project stay
/// in the session's layer.
fn live_command(session: &mut super::session::Session, cmd: Command) {
    let Some(live) = session.live.clone() else {
        return;
    };
    let outside = live.outside();
    match cmd {
        Command::Changes | Command::Diff => {
            let (changes, diff) = live.with_shadow(|s| match s {
                Some(s) => {
                    let c = s.changeset(true);
                    let d = if cmd == Command::Diff {
                        s.diff(&c)
                    } else {
                        String::new()
                    };
                    (c, d)
                }
                None => Default::default(),
            });
            if changes.changes.is_empty() && outside.is_empty() {
                println!("no changes in the branch: every tool call's changes are in the project");
                return;
            }
            for c in &changes.changes {
                println!("{c}");
            }
            print_outside(&outside);
            if cmd == Command::Diff {
                print!("{}", crate::review::render::for_stdout(&diff));
                print!(
                    "{}",
                    crate::review::render::for_stdout(&crate::outside::diff(&outside))
                );
            }
        }
        Command::Accept { keep } => {
            if !keep.is_empty() {
                println!(
                    "in a live session writes outside the project are kept when it ends, by \
                     [outside] keep rules (`shade chat --shadow` keeps them at /accept)"
                );
                return;
            }
            use shade_agent::shadow::AfterCall;
            shade_fusefs::accept::history::set_origin(session.history_origin());
            match live.accept_now() {
                AfterCall::Nothing => println!("no changes to accept"),
                AfterCall::Accepted(_, n) => {
                    println!("accepted {}", plural(n, "change"));
                    session.note_for_model(format!(
                        "The user accepted the branch's pending changes ({}): they are in the \
                         project now.",
                        plural(n, "change")
                    ));
                }
                AfterCall::Pending(line) => {
                    live.take_notices();
                    println!("{line}");
                }
            }
            for l in live.take_notices() {
                println!("shade: {l}");
            }
        }
        Command::Abort => {
            let n = live.abort();
            println!("dropped {}; the project is unchanged", plural(n, "change"));
            if n > 0 {
                session.note_for_model(format!(
                    "The user dropped the branch's pending changes ({}): they never entered \
                     the project; the files are as the project has them.",
                    plural(n, "change")
                ));
            }
            for l in live.take_notices() {
                println!("shade: {l}");
            }
        }
        _ => {}
    }
}

/// The "outside the project:" block on stdout (nothing when there are none).
fn print_outside(outside: &shade_fusefs::outside::OutsideChanges) {
    if outside.is_empty() {
        return;
    }
    println!("outside the project:");
    for l in outside.lines(shade_fusefs::outside::home_dir().as_deref()) {
        println!("  {l}");
    }
}

/// `/accept` in a shadow session: refuse (keeping the branch) when the project changed
/// meanwhile, or a kept outside path on the host, else write the branch (and keep the named
/// outside paths, `keep` and config `[outside] keep`) and go on in a fresh one.
fn accept_shadow(session: &mut super::session::Session, keep: &[String]) {
    let Some(shadow) = session.shadow.take() else {
        return;
    };
    let n = shadow.changeset(false).changes.len();
    let mut outside = shadow.outside();
    let keep = crate::outside::keep_list(keep, true);
    let keeping = !keep.is_empty() && !outside.selected(&keep).is_empty();
    if n == 0 && !keeping {
        println!("no changes to accept");
        session.shadow = Some(shadow);
        return;
    }
    if let Err(e) = shadow.check_accept(shade_fusefs::AcceptFlags::default()) {
        print_refusal(&e);
        session.shadow = Some(shadow);
        return;
    }
    if keeping {
        match outside.keep(&keep, &shade_fusefs::StateDir::from_env()) {
            Ok(r) => {
                if let Some(note) = r.accept.privileges_note() {
                    println!("shade: {note}");
                }
                crate::outside::report_kept(&r.kept, false);
            }
            Err(e) => {
                crate::outside::report_refused(&e);
                if e.nothing_written() {
                    println!("nothing accepted or kept; the branch is kept");
                }
                session.shadow = Some(shadow);
                return;
            }
        }
    }
    shade_fusefs::accept::history::set_origin(session.history_origin());
    let result = shadow.accept(shade_fusefs::AcceptFlags::default());
    let dropped = shade_fusefs::outside::OutsideChanges {
        changes: outside.changes.into_iter().filter(|c| !c.kept).collect(),
        layer: None,
    };
    if let Some(line) = crate::outside::summary(&dropped, 10) {
        println!("not written ({line}): /accept --keep-outside PATH keeps one");
    }
    if let Some(note) = result.as_ref().ok().and_then(|r| r.privileges_note()) {
        println!("shade: {note}");
    }
    match result {
        Ok(report) if report.not_applied.is_empty() => println!("accepted {}", plural(n, "change")),
        Ok(report) => {
            println!(
                "accepted all but {} of {n}: changed in the project while the accept ran, left as they are:",
                report.not_applied.len()
            );
            for a in &report.not_applied {
                println!("  {a}");
            }
        }
        Err(e) => print_refusal(&e),
    }
    if let Err(e) = session.renew_shadow() {
        println!("shade: {e:#}");
    }
}

/// `/undo [N]`: undo this session's last `n` accepts not undone yet, newest first, each
/// all or nothing; stop at the first refused (a path changed since). The model is told.
fn undo_turns(session: &mut super::session::Session, n: usize) {
    use shade_fusefs::accept::history;
    use shade_fusefs::undo::{self, UndoError, UndoOptions};
    let state = shade_fusefs::StateDir::from_env();
    let project = match std::fs::canonicalize(session.project()) {
        Ok(p) => p,
        Err(e) => {
            println!("shade: {}: {e}", session.project().display());
            return;
        }
    };
    let all = match undo::project_history(&state, &project) {
        Ok(a) => a,
        Err(e) => {
            println!("shade: {e}");
            return;
        }
    };
    let prefix = session.history_prefix();
    // The session's accepts not undone yet, newest first, grouped by turn (a live turn
    // has one accept per tool call that changed files): the last `n` turns' accepts.
    let mut turns: Vec<&str> = Vec::new();
    let mut targets: Vec<String> = Vec::new();
    for e in all.iter().rev().filter(|e| {
        e.origin.starts_with(&prefix)
            && e.undoes.is_none()
            && e.dropped.is_none()
            && history::undone_by(&all, &e.id).is_none()
    }) {
        if !turns.contains(&e.origin.as_str()) {
            if turns.len() == n {
                break;
            }
            turns.push(&e.origin);
        }
        targets.push(e.id.clone());
    }
    if targets.is_empty() {
        println!("nothing to undo: this session accepted nothing that is not undone yet");
        return;
    }
    let mut lines = Vec::new();
    for id in &targets {
        let opts = UndoOptions {
            keep_mine: false,
            dry_run: false,
            origin: format!("{}/undo of {id}", session.history_origin()),
        };
        match undo::undo(&state, &project, Some(id), &opts) {
            Ok(r) => {
                let mut changed: Vec<String> = r
                    .restored
                    .iter()
                    .map(|p| format!("restored {}", shade_fusefs::quote::quote_path(p)))
                    .collect();
                changed.extend(
                    r.removed
                        .iter()
                        .map(|p| format!("removed {}", shade_fusefs::quote::quote_path(p))),
                );
                println!("undid accept {id}:");
                for c in &changed {
                    println!("  {c}");
                }
                lines.push(format!("accept {id}: {}", changed.join(", ")));
            }
            Err(UndoError::Conflicts { id, kept }) => {
                println!(
                    "not undone: {} changed since accept {id} (nothing written; `shade undo --keep-mine {id}` keeps them and undoes the rest):",
                    plural(kept.len(), "path")
                );
                for k in &kept {
                    println!(
                        "  {}: {}",
                        shade_fusefs::quote::quote_path(&k.path),
                        k.reason
                    );
                }
                break;
            }
            Err(e) => {
                println!("not undone: {e}");
                break;
            }
        }
    }
    if !lines.is_empty() {
        session.note_for_model(format!(
            "I undid accepted changes of this session (/undo); the project's files are back as \
             they were before these accepts:\n{}",
            lines.join("\n")
        ));
    }
}

fn print_refusal(e: &shade_fusefs::AcceptError) {
    match e {
        shade_fusefs::AcceptError::Conflicts(list) => {
            println!(
                "not accepted: {} changed in the project since the branch read them (nothing written):",
                plural(list.len(), "path")
            );
            for c in list {
                println!("  {}", crate::review::conflicts::conflict_line(c));
            }
        }
        other if other.nothing_written() => println!("not accepted, nothing written: {other}"),
        other => println!("shade: {other}"),
    }
}

/// The /stats table.
fn stats(session: &super::session::Session) -> String {
    let snap = session.llm.stats.snapshot();
    if snap.is_empty() {
        return "no model calls yet\n".into();
    }
    let mut s = format!(
        "{:<28} {:>6} {:>10} {:>10} {:>10}\n",
        "model", "calls", "prompt", "cached", "output"
    );
    let mut bg_total = 0;
    for (model, t) in &snap {
        // No call of this model reported usage: its token counts are unknown, not 0.
        let unknown = t.unreported_calls == t.foreground_calls + t.background_calls;
        let n = |v: u64| {
            if unknown {
                "n/a".to_string()
            } else {
                v.to_string()
            }
        };
        for (who, u, calls) in [
            ("", &t.foreground, t.foreground_calls),
            (" (background)", &t.background, t.background_calls),
        ] {
            if calls == 0 {
                continue;
            }
            if !who.is_empty() {
                bg_total += u.prompt_tokens + u.completion_tokens;
            }
            s.push_str(&format!(
                "{:<28} {:>6} {:>10} {:>10} {:>10}\n",
                format!("{model}{who}"),
                calls,
                n(u.prompt_tokens),
                n(u.cached_tokens),
                n(u.completion_tokens)
            ));
        }
    }
    s.push_str(&format!(
        "background work (suggestions, speculation, summaries): {bg_total} tokens\n"
    ));
    for (model, t) in &snap {
        if t.unreported_calls > 0 {
            s.push_str(&format!(
                "{model}: {} of {} calls reported no token usage (the server sent none); their tokens are not counted above\n",
                t.unreported_calls,
                t.foreground_calls + t.background_calls
            ));
        }
    }
    s
}
