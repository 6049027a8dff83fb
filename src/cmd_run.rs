//! `shade run`: mount a fresh branch of the project, run a command inside it at the
//! project's real path, show what it changed, then accept or drop the branch.

use crate::branch_server::RunBranch;
use crate::exit;
use crate::review::conflicts::{
    not_applied_summary, report_accepted, report_conflicts, ConflictJson,
};
use crate::review::render::{for_stdout, print_changes};
use anyhow::Context;
use clap::Args;
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use serde::Serialize;
use shade_fusefs::outside::KeepError;
use shade_fusefs::quote::{quote_path, visible_controls};
use shade_fusefs::sandbox::{self, EnvPolicy, Isolation, Output, RunSpec, Termination};
use shade_fusefs::{AcceptError, AcceptFlags, Branch, BranchOptions, Change, StateDir};
use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Project directory to shadow (default: the current directory).
    #[arg(short = 'C', long = "dir", value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Accept the branch into the real project if the command exits 0.
    #[arg(long)]
    pub accept: bool,
    /// Print the unified diff of the changes.
    #[arg(long)]
    pub diff: bool,
    /// After the command, review the changes in the terminal (a diff per file) and accept
    /// all, the files you pick, or nothing.
    #[arg(long, conflicts_with_all = ["accept", "diff", "json"])]
    pub review: bool,
    /// Print one JSON report on stdout (the command's stdout goes to stderr).
    #[arg(long)]
    pub json: bool,
    /// Kill the command (and everything it started) after this many seconds.
    #[arg(long, value_name = "SECS", value_parser = crate::args::seconds)]
    pub timeout: Option<f64>,
    /// Also accept changes under gitignored paths (target/, node_modules/, …).
    #[arg(long)]
    pub include_ignored: bool,
    /// Accept even over paths the user changed meanwhile.
    #[arg(long)]
    pub force: bool,
    /// Keep this write outside the project (a path or a directory prefix, `~` for the home;
    /// repeatable) when the command exits 0, with or without `--accept`. Without it, writes
    /// outside the project are only listed; config `[outside] keep` adds paths kept with an
    /// accept. With `--review`, these start picked.
    #[arg(long = "keep-outside", value_name = "PATH", action = clap::ArgAction::Append)]
    pub keep_outside: Vec<String>,
    /// Accepted for compatibility: every uid of the command can use the branch by default
    /// (users outside the command still cannot reach it).
    #[arg(long, hide = true)]
    pub allow_other: bool,
    /// Let the command connect to this unix socket outside the branch (repeatable; `$VAR`
    /// is expanded, e.g. '$SSH_AUTH_SOCK'): it is bound into the sandbox at its path. Every
    /// other host socket is closed to the command; config `[sandbox] allow_sockets` adds
    /// more.
    #[arg(long = "allow-socket", value_name = "PATH", action = clap::ArgAction::Append)]
    pub allow_socket: Vec<String>,
    /// Run the command without network (loopback only).
    #[arg(long)]
    pub no_network: bool,
    /// Give the command a private, empty /tmp.
    #[arg(long)]
    pub private_tmp: bool,
    /// Run without the sandbox: only a private mount namespace with the branch bound over
    /// the project. NOT a security boundary (the command can reach shade, the real project
    /// and the host); for machines without user namespaces and for file system test suites.
    #[arg(long)]
    pub unconfined: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// The `--json` report.
#[derive(Serialize)]
struct Report<'a> {
    exit_code: i32,
    termination: String,
    namespaced: bool,
    changes: &'a [Change],
    /// Writes outside the project (listed apart; `kept` says which reached the host).
    outside: &'a [shade_fusefs::outside::OutsideChange],
    accepted: bool,
    conflicts: Vec<ConflictJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    diff: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

pub fn main(args: RunArgs) -> i32 {
    match run(args) {
        Ok(code) => code,
        Err(e) => exit::fail(&e),
    }
}

/// Finish interrupted accepts and clean up branches of dead shade processes; every
/// shade start does this before touching a project.
pub fn startup_recovery(state: &StateDir) {
    match shade_fusefs::accept::recover(state) {
        Ok(r) => {
            for p in &r.rolled_forward {
                eprintln!("shade: finished an interrupted accept in {}", quote_path(p));
            }
            for (p, a) in &r.not_applied {
                eprintln!("shade:   left out (changed since) in {}: {a}", p.display());
            }
            for p in &r.project_gone {
                eprintln!(
                    "shade: dropped the journal of an interrupted accept into {}, which no longer exists",
                    p.display()
                );
            }
            for p in &r.dropped {
                eprintln!(
                    "shade: dropped the journal of an accept into the dead branch {}",
                    quote_path(p)
                );
            }
            for p in &r.rolled_back {
                eprintln!(
                    "shade: rolled back an interrupted accept in {}",
                    p.display()
                );
            }
        }
        Err(e) => eprintln!("shade: warning: recovering accept journals: {e}"),
    }
    for id in shade_fusefs::cleanup_stale(state) {
        tracing::info!("cleaned up stale branch {id}");
    }
    let n = crate::branch_server::cleanup_stale(state.root());
    if n > 0 {
        tracing::info!("removed {n} sockets of branch servers that were killed");
    }
}

fn run(args: RunArgs) -> anyhow::Result<i32> {
    let state = StateDir::from_env();
    startup_recovery(&state);
    shade_fusefs::timing::mark("recovered");
    let here = std::env::current_dir().context("current directory")?;
    let dir = args.dir.clone().unwrap_or_else(|| here.clone());
    let project = std::fs::canonicalize(&dir)
        .with_context(|| format!("project directory {}", dir.display()))?;
    anyhow::ensure!(project.is_dir(), "{} is not a directory", project.display());
    anyhow::ensure!(
        project != std::path::Path::new("/"),
        "the project cannot be / (its branch would be bound over the whole file system); \
         give a project directory with -C"
    );
    // Stay in the same subdirectory when invoked from inside the project.
    let cwd = std::fs::canonicalize(&here)
        .ok()
        .filter(|h| h.starts_with(&project))
        .unwrap_or_else(|| project.clone());

    if let Some(why) = args.review.then(crate::review::unavailable).flatten() {
        anyhow::bail!(why);
    }
    let mut sockets = Vec::new();
    for s in &args.allow_socket {
        sockets.push(sandbox::expand_socket(s).map_err(|e| anyhow::anyhow!("--allow-socket {e}"))?);
    }
    sandbox::allow_sockets(sockets);

    // The sandbox's namespaces and programs are made while the branch mounts (the
    // command's own sandbox start is the test that it works: see `sandbox::confinement`).
    let probe = (!args.unconfined).then(|| std::thread::spawn(|| sandbox::confinement().is_ok()));
    let limits = sandbox::Limits::run();
    let iso_for_ids = Isolation {
        unconfined: args.unconfined,
        ..Isolation::default()
    };
    let opts = BranchOptions {
        state,
        limits: limits.branch(),
        // As root, the command is root of a namespace mapped to unprivileged ids: the
        // branch shows it its files as its own (see fusefs/src/idmap.rs).
        id_shift: sandbox::branch_id_shift(&iso_for_ids),
        // The user's own command keeps the home's credentials, as outside the project.
        hide_credentials: sandbox::env::config().hide_credentials,
        ..BranchOptions::default()
    };
    // From the mount to the unmount, Ctrl-C/SIGTERM/SIGHUP outside the command's own run
    // (where the runner stops the command for them) wait until the branch is cleaned up,
    // instead of killing shade with the branch mounted.
    let cleanup = shade_fusefs::DeferSignals::for_cleanup();
    // One branch per process here: pooling in this process would only reset a connection,
    // then unmount it at exit. Warm connections come from the project's branch server
    // (unless reviewing: the review screen works on an in-process branch). An unconfined
    // command has no pid namespace to end it, so its connection is never handed on; any
    // other is handed on only if this process's sandbox saw it run contained and end whole
    // (the branch tells the server so as it is dropped; the server checks again).
    shade_fusefs::set_pool_size(0);
    let branch = if args.review {
        RunBranch::Local(Box::new(Branch::create(&project, &opts)?))
    } else {
        RunBranch::create(&project, &opts, !args.unconfined)?
    };
    shade_fusefs::timing::mark("branch");
    if let Some(probe) = probe {
        let _ = probe.join();
    }
    shade_fusefs::timing::mark("probed");
    if let Some(sig) = cleanup.pending().first().copied() {
        drop(branch);
        let _ = cleanup.take();
        eprintln!("shade: stopped by signal {sig} before the command started; nothing ran");
        return Ok(128 + sig);
    }
    let spec = RunSpec {
        project: project.clone(),
        mount: branch.mountpoint().to_path_buf(),
        cwd,
        argv: args.command.clone(),
        env: Vec::new(),
        // The user's own command: their environment and home as they are.
        env_policy: EnvPolicy::User,
        timeout: args.timeout.map(Duration::from_secs_f64),
        tee: None,
        output: if args.json {
            Output::StdoutToStderr
        } else {
            Output::Inherit
        },
        foreground: true,
        user_session: false,
        isolation: Isolation {
            network: args.no_network,
            private_tmp: args.private_tmp,
            unconfined: args.unconfined,
            limits,
            ..Isolation::default()
        },
        binds: Vec::new(),
        outside: (!args.unconfined).then(|| branch.outside_dir()),
    };
    // Only this thread takes Ctrl-C/SIGTERM, and only while the command runs (the runner
    // forwards them to it). Outside that window they wait until shade has finished its own
    // work — changeset, accept, unmount — so an accept is never cut short.
    // On a terminal the command gets its own process group through shade's binary (see
    // sandbox::foreground_helper).
    if let Ok(exe) = std::env::current_exe() {
        sandbox::set_foreground_helper(exe);
    }
    termination_signals(SigmaskHow::SIG_UNBLOCK);
    let outcome = sandbox::run(&spec);
    shade_fusefs::timing::mark("command-done");
    termination_signals(SigmaskHow::SIG_BLOCK);
    let outcome = outcome?;
    // Each limit the command reached, in one line, before anything else is said of it.
    for hit in &outcome.limits_hit {
        eprintln!("shade: {hit}");
    }
    for hit in branch.take_limit_hits() {
        eprintln!("shade: {hit}");
    }
    let code = outcome.exit_code();
    let changes = branch.changeset(args.include_ignored)?;
    shade_fusefs::timing::mark("changeset");
    let branch = match branch {
        RunBranch::Local(branch) if args.review => *branch,
        branch => return finish(args, project, opts, cleanup, outcome, branch, changes),
    };
    // The review screen handles its own keys and signals.
    {
        if let Some(sig) = cleanup.take().first().copied() {
            drop(branch);
            eprintln!("shade: stopped by signal {sig}; the branch was dropped, nothing accepted");
            return Ok(128 + sig);
        }
        let flags = AcceptFlags {
            include_ignored: args.include_ignored,
            force: args.force,
        };
        let ended = describe(&outcome.termination);
        let outside = crate::review::Outside {
            changes: crate::outside::read(&branch),
            keep: crate::outside::keep_list(&args.keep_outside, true),
        };
        Ok(crate::review::review(
            branch, changes, outside, flags, &ended, code,
        ))
    }
}

/// After the command (not reviewed): report the changes, keep outside paths, accept, drop.
fn finish(
    args: RunArgs,
    project: PathBuf,
    opts: BranchOptions,
    cleanup: shade_fusefs::DeferSignals,
    outcome: sandbox::RunOutcome,
    branch: RunBranch,
    changes: shade_fusefs::Changeset,
) -> anyhow::Result<i32> {
    let code = outcome.exit_code();
    let mut outside = read_outside(&branch.outside_dir());
    let diff = match args.diff {
        true => {
            let mut d = branch.diff(&changes)?;
            d.push_str(&crate::outside::diff(&outside));
            Some(d)
        }
        false => None,
    };
    if !args.json {
        print_changes(&changes.changes);
        crate::outside::print(&outside);
        if let Some(d) = &diff {
            // The branch's contents are the command's: on a terminal they are shown, never
            // obeyed; a pipe gets the diff byte for byte (a patch must apply).
            print!("{}", for_stdout(d));
        }
    }
    let ok = matches!(outcome.termination, Termination::Exited(0));
    let mut accepted = false;
    let mut conflicts = Vec::new();
    let mut error = None;
    let mut final_code = code;
    let keep = crate::outside::keep_list(&args.keep_outside, args.accept);
    let keeping = ok && !keep.is_empty() && !outside.is_empty();
    if !args.json {
        for p in &args.keep_outside {
            if outside.selected(&[crate::outside::expand(p)]).is_empty() {
                eprintln!(
                    "shade: --keep-outside {}: the command wrote nothing there",
                    visible_controls(p)
                );
            }
        }
    }
    // Held until the accept's outcome is reported: a signal meanwhile waits for both.
    let signals = ((args.accept || keeping) && ok).then(shade_fusefs::DeferSignals::new);
    let flags = AcceptFlags {
        include_ignored: args.include_ignored,
        force: args.force,
    };
    // Kept outside paths and the project go together: both are checked before either is
    // written, and a refusal of one writes neither.
    let mut refused = false;
    if keeping {
        let checked = outside.check_keep(&keep).and_then(|()| {
            if args.accept {
                branch.check_accept(flags).map_err(KeepError::Accept)
            } else {
                Ok(())
            }
        });
        let kept = checked.and_then(|()| outside.keep(&keep, &opts.state));
        match kept {
            Ok(r) => {
                if let Some(note) = r.accept.privileges_note() {
                    eprintln!("shade: {note}");
                }
                crate::outside::report_kept(&r.kept, args.json);
            }
            Err(e) => {
                refused = true;
                crate::outside::report_refused(&e);
                match &e {
                    KeepError::Conflicts(list) => {
                        conflicts.extend(list.iter().map(|c| ConflictJson {
                            path: c.path.clone(),
                            path_bytes: shade_fusefs::non_utf8_bytes(&c.path).map(<[u8]>::to_vec),
                            reason: c.reason.clone(),
                        }));
                        final_code = exit::CONFLICT;
                    }
                    KeepError::Accept(AcceptError::Conflicts(list)) => {
                        conflicts = report_conflicts(list, &project);
                        final_code = exit::CONFLICT;
                    }
                    // Refused like an accept refused for an owner: nothing written, exit 124.
                    KeepError::Refused { .. } => {
                        error = Some(e.to_string());
                        final_code = exit::CONFLICT;
                    }
                    other => {
                        error = Some(other.to_string());
                        final_code = exit::SHADE_ERROR;
                    }
                }
                if !args.json && e.nothing_written() {
                    eprintln!(
                        "shade: nothing {}; the host is unchanged",
                        if args.accept {
                            "accepted or kept"
                        } else {
                            "kept"
                        }
                    );
                }
            }
        }
    } else if !keep.is_empty() && !ok && !outside.is_empty() && !args.json {
        eprintln!(
            "shade: nothing kept outside the project: {}",
            describe(&outcome.termination)
        );
    }
    if args.accept && ok && !refused {
        let n = changes.changes.len();
        match branch.accept(flags) {
            Ok(report) => {
                accepted = true;
                if !report_accepted(n, &report, args.json) {
                    error = Some(not_applied_summary(&report));
                    final_code = exit::SHADE_ERROR;
                }
            }
            Err(AcceptError::Conflicts(list)) => {
                conflicts = report_conflicts(&list, &project);
                final_code = exit::CONFLICT;
            }
            Err(e @ AcceptError::Owner { .. }) => {
                // Refused like conflicts: nothing written, one line saying why.
                eprintln!("shade: {e}");
                error = Some(e.to_string());
                final_code = exit::CONFLICT;
            }
            Err(e) => {
                // The error says what the project is left as (unchanged, or partly changed
                // and how to finish it).
                eprintln!("shade: {e}");
                error = Some(e.to_string());
                final_code = exit::SHADE_ERROR;
            }
        }
    } else {
        if args.accept && !args.json && !refused {
            eprintln!("shade: not accepted: {}", describe(&outcome.termination));
        } else if matches!(outcome.termination, Termination::Interrupted(_)) && !args.json {
            eprintln!("shade: {}", describe(&outcome.termination));
        }
        shade_fusefs::timing::mark("reported");
        drop(branch);
        shade_fusefs::timing::mark("dropped");
    }
    if args.json {
        let report = Report {
            exit_code: code,
            termination: describe(&outcome.termination),
            namespaced: outcome.namespaced,
            changes: &changes.changes,
            outside: &outside.changes,
            accepted,
            conflicts,
            diff,
            error,
        };
        let mut out = std::io::stdout().lock();
        serde_json::to_writer(&mut out, &report)?;
        writeln!(out)?;
    }
    let code = after_deferred(signals, final_code);
    // Nested inside `cleanup`, the accept's guard hands its signals to it.
    match cleanup.take().first().copied() {
        Some(sig) if accepted => {
            eprintln!("shade: stopped by signal {sig} after the accept was finished");
            Ok(128 + sig)
        }
        // A refused or failed accept has said what the project is left as.
        Some(sig) if args.accept && ok => {
            eprintln!("shade: stopped by signal {sig}");
            Ok(128 + sig)
        }
        Some(sig) => {
            eprintln!("shade: stopped by signal {sig}; the branch was dropped, nothing accepted");
            Ok(128 + sig)
        }
        None => Ok(code),
    }
}

/// The branch's outside changes (see `crate::outside::read`), from its layer's directory.
fn read_outside(dir: &std::path::Path) -> shade_fusefs::outside::OutsideChanges {
    match shade_fusefs::outside::OutsideChanges::read(dir) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("shade: warning: cannot read the branch's writes outside the project: {e}");
            shade_fusefs::outside::OutsideChanges::default()
        }
    }
}

/// The exit status once an accept and its report are done: 128+N when signal N came while
/// they ran (they were finished first, as said on stderr), else `code`.
pub(crate) fn after_deferred(signals: Option<shade_fusefs::DeferSignals>, code: i32) -> i32 {
    let Some(sig) = signals.and_then(|g| g.take().into_iter().next()) else {
        return code;
    };
    eprintln!("shade: stopped by signal {sig} after the accept was finished");
    128 + sig
}

/// Block or unblock SIGINT, SIGTERM and SIGHUP for the calling thread (and the threads
/// it starts afterwards). A signal that arrives while blocked waits; shade exits moments
/// later on its own.
fn termination_signals(how: SigmaskHow) {
    let mut set = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(s);
    }
    if let Err(e) = nix::sys::signal::pthread_sigmask(how, Some(&set), None) {
        tracing::warn!("cannot change the signal mask: {e}");
    }
}

fn describe(t: &Termination) -> String {
    match t {
        Termination::Exited(c) => format!("command exited with status {c}"),
        Termination::Signaled(s) => format!("command killed by signal {s}"),
        Termination::TimedOut => "command timed out".into(),
        Termination::Interrupted(s) => format!("interrupted by signal {s}"),
        Termination::Cancelled => "command cancelled".into(),
        Termination::CannotExec(m) => format!("command could not be started: {m}"),
    }
}
