//! `shade mcp --http ADDR`: the same server over MCP's streamable HTTP transport. Every MCP
//! session (one per client `initialize`) gets its own branches, dropped when the session
//! ends — the client's DELETE, the session idling out, or the server stopping.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};

use anyhow::Context;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::branches::{Branches, SessionOptions};
use super::server::ShadeServer;

/// The branches of every session started so far (weak: a closed session drops its own).
type Sessions = Arc<Mutex<Vec<Weak<Branches>>>>;

/// Serves MCP on `addr` until `stop` fires, then drops every session's branches.
pub async fn serve(
    addr: SocketAddr,
    options: SessionOptions,
    time_limit_secs: u64,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening on {addr}"))?;
    let local = listener.local_addr()?;
    // Said on stderr so that whoever started it (a test, a script) learns a chosen port.
    eprintln!("shade mcp: serving http://{local}/mcp");
    let sessions: Sessions = Arc::default();
    let service = service(options, time_limit_secs, sessions.clone(), stop.clone());
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => accepted.context("accepting a connection")?,
            _ = stop.cancelled() => break,
        };
        let svc = TowerToHyperService::new(service.clone());
        let stop = stop.clone();
        tokio::spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .serve_connection(TokioIo::new(stream), svc);
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => if let Err(e) = r { tracing::debug!("MCP connection: {e}") },
                _ = stop.cancelled() => conn.as_mut().graceful_shutdown(),
            }
        });
    }
    close_sessions(&sessions).await;
    Ok(())
}

/// The MCP service: a fresh [`ShadeServer`] with its own branches for each session.
fn service(
    options: SessionOptions,
    time_limit_secs: u64,
    sessions: Sessions,
    stop: CancellationToken,
) -> StreamableHttpService<ShadeServer, LocalSessionManager> {
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(true)
        .with_cancellation_token(stop);
    StreamableHttpService::new(
        move || {
            let branches = Arc::new(Branches::new(options.clone()));
            let mut live = sessions.lock().unwrap_or_else(|e| e.into_inner());
            live.retain(|w| w.strong_count() > 0);
            live.push(Arc::downgrade(&branches));
            Ok(ShadeServer::new(branches, time_limit_secs))
        },
        Arc::new(LocalSessionManager::default()),
        config,
    )
}

/// Drops the branches of the sessions still open (blocking work, off the async threads).
async fn close_sessions(sessions: &Sessions) {
    let live: Vec<Arc<Branches>> = sessions
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    let closing = tokio::task::spawn_blocking(move || {
        for b in live {
            b.close_all();
        }
    });
    if let Err(e) = closing.await {
        tracing::warn!("dropping the sessions' branches: {e}");
    }
}
