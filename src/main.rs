//! shade: run anything in a shadow of your project, then accept or abort.
//!
//! A thin CLI over the `shade-fusefs` (overlay) and `shade-agent` (LLM agent) libraries.

mod args;
mod attempts;
mod branch_server;
mod chat;
mod cmd_check;
mod cmd_doctor;
mod cmd_exec;
mod cmd_history;
mod cmd_lint;
mod cmd_recover;
mod cmd_run;
mod config;
mod exec_suggest;
mod exit;
mod llm_setup;
mod markdown;
mod mcp;
mod outside;
mod review;

use clap::{Parser, Subcommand};
use shade_fusefs::sandbox;

#[derive(Parser)]
#[command(
    name = "shade",
    version,
    about = "Shadow workspaces for AI coding agents"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a command in a fresh branch of the project, show what it changed, accept or drop it.
    Run(cmd_run::RunArgs),
    /// One-shot agent run in the current project (non-interactive).
    Exec(cmd_exec::ExecArgs),
    /// Check an edit (unified diff) in a branch and print the diagnostics it introduced.
    Lint(cmd_lint::LintArgs),
    /// Interactive agent session with next-input suggestions (reads stdin without a terminal).
    Chat(chat::ChatArgs),
    /// Finish interrupted accepts from their journals and clean up stale branches and mounts.
    Recover(cmd_recover::RecoverArgs),
    /// Say whether the agent treats a shell command as read-only, and if not, why.
    #[command(name = "check-command")]
    Check(cmd_check::CheckArgs),
    /// Serve branches of the project to an MCP client (Claude Code, Codex, …) over stdio.
    Mcp(mcp::McpArgs),
    /// Say what isolation this machine gives commands in a branch (sandbox, namespaces, FUSE).
    Doctor(cmd_doctor::DoctorArgs),
    /// List the project's accepts, newest first, and which can still be undone.
    Log(cmd_history::LogArgs),
    /// Put every path an accept changed back as it was (default: the newest not undone).
    Undo(cmd_history::UndoArgs),
    /// The per-project branch server `shade run` starts (see src/branch_server).
    #[command(name = "__branch-server", hide = true)]
    BranchServer(branch_server::ServerArgs),
}

fn main() {
    shade_fusefs::timing::start();
    // Inside a sandbox, before a foreground command: not a subcommand of the CLI.
    let mut argv = std::env::args_os().skip(1);
    match argv.next() {
        Some(a) if a == sandbox::FOREGROUND_HELPER_ARG => {
            std::process::exit(sandbox::foreground_helper(&argv.collect::<Vec<_>>()));
        }
        Some(a) if a == sandbox::LIMITS_HELPER_ARG => {
            std::process::exit(sandbox::limits_helper(&argv.collect::<Vec<_>>()));
        }
        _ => {}
    }
    // Nobody may ptrace shade or read its memory and descriptors under /proc/PID, not even
    // a process of the same user (a command of a branch run unconfined included).
    // SAFETY: prctl(2) with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0) };
    init_tracing();
    let cli = Cli::try_parse().unwrap_or_else(|e| cmd_check::exit_on_usage_error(e));
    // Every command that runs something in a sandbox takes its limits from the config's
    // [sandbox] table, and may need shade's binary inside the sandbox (the helpers above).
    match config::sandbox_limits(None) {
        Ok((run, speculation)) => sandbox::configure_limits(run, speculation),
        Err(e) => {
            eprintln!("shade: {e}");
            std::process::exit(exit::SHADE_ERROR);
        }
    }
    if let Ok(exe) = std::env::current_exe() {
        sandbox::set_foreground_helper(exe.clone());
        // This binary serves branches (`__branch-server`): its commands may ask for them.
        shade_fusefs::served::set_server_exe(exe);
    }
    config::install_default_sandbox();
    shade_fusefs::accept::history::set_origin(command_line());
    let code = match cli.command {
        Command::Run(args) => cmd_run::main(args),
        Command::Exec(args) => cmd_exec::main(args),
        Command::Lint(args) => cmd_lint::main(args),
        Command::Chat(args) => chat::main(args),
        Command::Recover(args) => cmd_recover::main(args),
        Command::Check(args) => cmd_check::main(args),
        Command::Mcp(args) => mcp::main(args),
        Command::Doctor(args) => cmd_doctor::main(args),
        Command::Log(args) => cmd_history::log_main(args),
        Command::Undo(args) => cmd_history::undo_main(args),
        Command::BranchServer(args) => branch_server::server_main(args),
    };
    // Every owner drops its branches on the way here; one that could not (a thread still
    // at work when the command ended) must not leave a mount behind the process.
    let left = shade_fusefs::unmount_all_before_exit();
    shade_fusefs::timing::mark("exit");
    if left > 0 {
        tracing::debug!("{left} branches were still mounted at exit: detached");
    }
    std::process::exit(code);
}

/// This process's command line as the accept history shows where an accept came from
/// (shortened: it is a label, not a record of the arguments).
pub(crate) fn command_line() -> String {
    let words: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| shade_fusefs::quote::quote_bytes(a.as_encoded_bytes()).into_owned())
        .collect();
    let mut line = format!("shade {}", words.join(" "));
    if line.chars().count() > 100 {
        line = line.chars().take(99).collect::<String>() + "…";
    }
    line
}

/// Logs go to stderr, filtered by `SHADE_LOG` (default: warnings only), so stdout stays
/// clean for `--json` output.
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SHADE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
