//! `shade mcp`: an MCP server giving any MCP client (Claude Code, Codex, qwen-code, …)
//! branches of the project it is started in. One process serves one client over stdio;
//! its branches live as long as the session (end of input, SIGTERM/SIGINT/SIGHUP) unless
//! accepted, and are unmounted before it exits. A crash is cleaned up by the next shade
//! start (`cleanup_stale`).

mod branches;
mod catalog;
mod server;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use rmcp::ServiceExt;
use shade_fusefs::StateDir;
use tokio::signal::unix::{signal, SignalKind};

use crate::exit;
use branches::{Branches, SessionOptions};
use server::ShadeServer;

#[derive(Args, Debug)]
pub struct McpArgs {
    /// Project directory the branches are made of (default: the current directory).
    #[arg(short = 'C', long = "dir", value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Longest any one command may run in a branch, in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 600)]
    pub timeout: u64,
    /// Do not run the project's checker after edits (the `lint` tool then says so).
    #[arg(long)]
    pub no_lint: bool,
}

/// Serves MCP on stdin/stdout until the client goes away; exit 0, or 125 on shade's errors.
pub fn main(args: McpArgs) -> i32 {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return exit::fail(&e.into()),
    };
    let result = runtime.block_on(serve_stdio(args));
    // A blocking stdin read cannot be cancelled (stdin not a pipe): do not wait for it.
    runtime.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(()) => 0,
        Err(e) => exit::fail(&e),
    }
}

/// The session's branches for `args`, after the usual start-up recovery.
fn session(args: &McpArgs) -> anyhow::Result<Arc<Branches>> {
    let state = StateDir::from_env();
    crate::cmd_run::startup_recovery(&state);
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => std::env::current_dir().context("current directory")?,
    };
    let project = std::fs::canonicalize(&dir)
        .with_context(|| format!("project directory {}", dir.display()))?;
    anyhow::ensure!(project.is_dir(), "{} is not a directory", project.display());
    Ok(Arc::new(Branches::new(SessionOptions {
        project,
        state,
        time_limit: Duration::from_secs(args.timeout.max(1)),
        lint: !args.no_lint,
    })))
}

/// One session over stdio; every branch is dropped before it returns.
async fn serve_stdio(args: McpArgs) -> anyhow::Result<()> {
    let branches = session(&args)?;
    let server = ShadeServer::new(branches.clone(), args.timeout.max(1));
    let served = serve_until_signal(server).await;
    let b = branches.clone();
    tokio::task::spawn_blocking(move || b.close_all())
        .await
        .context("dropping the branches")?;
    served
}

/// Runs the session until the client closes stdin or a termination signal arrives.
async fn serve_until_signal(server: ShadeServer) -> anyhow::Result<()> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    let transport = rmcp::transport::stdio_pipes();
    let running = tokio::select! {
        r = server.serve(transport) => r.context("MCP handshake")?,
        _ = term.recv() => return Ok(()),
        _ = int.recv() => return Ok(()),
        _ = hup.recv() => return Ok(()),
    };
    let stop = running.cancellation_token();
    let waiting = running.waiting();
    tokio::pin!(waiting);
    tokio::select! {
        r = &mut waiting => { r.context("MCP session")?; }
        _ = term.recv() => stop.cancel(),
        _ = int.recv() => stop.cancel(),
        _ = hup.recv() => stop.cancel(),
    }
    Ok(())
}
