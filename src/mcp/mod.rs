//! `shade mcp`: an MCP server giving any MCP client (Claude Code, Codex, qwen-code, …)
//! branches of the project it is started in. Over stdio one process serves one client;
//! with `--http` one process serves many, a session each. Branches live as long as their
//! session (end of input, SIGTERM/SIGINT/SIGHUP, the HTTP session closed) unless accepted,
//! and are unmounted before the process exits. A crash is cleaned up by the next shade
//! start (`cleanup_stale`).

mod branches;
mod catalog;
mod http;
mod server;

use std::net::SocketAddr;
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
    /// Longest any one command may run in a branch, in seconds (default: the config's
    /// `[sandbox.speculation]` `time_limit_secs`, 300 unless set).
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<u64>,
    /// Do not run the project's checker after edits (the `lint` tool then says so).
    #[arg(long)]
    pub no_lint: bool,
    /// Serve MCP's streamable HTTP transport on this address (e.g. 127.0.0.1:8765; port 0
    /// picks one) instead of stdio; every client session gets its own branches.
    #[arg(long, value_name = "ADDR")]
    pub http: Option<SocketAddr>,
}

/// Serves MCP on stdin/stdout until the client goes away (or over HTTP until a termination
/// signal); exit 0, or 125 on shade's errors.
pub fn main(args: McpArgs) -> i32 {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return exit::fail(&e.into()),
    };
    let result = match args.http {
        Some(addr) => runtime.block_on(serve_http(addr, args)),
        None => runtime.block_on(serve_stdio(args)),
    };
    // A blocking stdin read cannot be cancelled (stdin not a pipe): do not wait for it.
    runtime.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(()) => 0,
        Err(e) => exit::fail(&e),
    }
}

/// What every session's branches share, after the usual start-up recovery.
fn session_options(args: &McpArgs) -> anyhow::Result<SessionOptions> {
    let state = StateDir::from_env();
    crate::cmd_run::startup_recovery(&state);
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => std::env::current_dir().context("current directory")?,
    };
    let project = std::fs::canonicalize(&dir)
        .with_context(|| format!("project directory {}", dir.display()))?;
    anyhow::ensure!(project.is_dir(), "{} is not a directory", project.display());
    let (max_branches, max_branches_total) =
        crate::config::mcp_branch_caps().map_err(anyhow::Error::msg)?;
    Ok(SessionOptions {
        project,
        state,
        time_limit: Duration::from_secs(time_limit_secs(args)),
        lint: !args.no_lint,
        max_branches,
        max_branches_total,
    })
}

/// What "no time limit" is: a year (a deadline must stay representable).
const UNLIMITED_SECS: u64 = 365 * 24 * 3600;

/// The longest a command may run: `--timeout`, else the speculation limits' (config).
fn time_limit_secs(args: &McpArgs) -> u64 {
    let configured = shade_fusefs::sandbox::Limits::speculation()
        .time_limit
        .map_or(UNLIMITED_SECS, |d| d.as_secs());
    args.timeout.unwrap_or(configured).clamp(1, UNLIMITED_SECS)
}

/// Many sessions over HTTP until SIGTERM, SIGINT or SIGHUP; every branch is dropped before
/// it returns.
async fn serve_http(addr: SocketAddr, args: McpArgs) -> anyhow::Result<()> {
    let options = session_options(&args)?;
    let stop = tokio_util::sync::CancellationToken::new();
    let on_signal = stop.clone();
    let mut signals = Signals::new()?;
    tokio::spawn(async move {
        signals.any().await;
        on_signal.cancel();
    });
    http::serve(addr, options, time_limit_secs(&args), stop).await
}

/// One session over stdio; every branch is dropped before it returns.
async fn serve_stdio(args: McpArgs) -> anyhow::Result<()> {
    let branches = Arc::new(Branches::new(session_options(&args)?));
    let server = ShadeServer::new(branches.clone(), time_limit_secs(&args));
    let served = serve_until_signal(server).await;
    let b = branches.clone();
    tokio::task::spawn_blocking(move || b.close_all())
        .await
        .context("dropping the branches")?;
    served
}

/// Runs the session until the client closes stdin or a termination signal arrives.
async fn serve_until_signal(server: ShadeServer) -> anyhow::Result<()> {
    let mut signals = Signals::new()?;
    let transport = rmcp::transport::stdio_pipes();
    let running = tokio::select! {
        r = server.serve(transport) => r.context("MCP handshake")?,
        _ = signals.any() => return Ok(()),
    };
    let stop = running.cancellation_token();
    let waiting = running.waiting();
    tokio::pin!(waiting);
    tokio::select! {
        r = &mut waiting => { r.context("MCP session")?; }
        _ = signals.any() => stop.cancel(),
    }
    Ok(())
}

/// The signals that end a session: SIGTERM, SIGINT, SIGHUP. Once listened for they no
/// longer kill the process, so the branches are always dropped first.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// Waits for the first of them.
    async fn any(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
            _ = self.hup.recv() => {}
        }
    }
}
