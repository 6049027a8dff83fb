//! `shade mcp --http ADDR`: the same server over MCP's streamable HTTP transport. Every MCP
//! session (one per client `initialize`) gets its own branches, dropped when the session
//! ends — the client's DELETE, the session idling out, or the server stopping.
//!
//! A loopback port is open to every local user and to web pages (a cross-site POST), and
//! its `accept_branch` writes the project as shade's user: so every request must carry
//! `Authorization: Bearer TOKEN` (`SHADE_MCP_TOKEN`, or one made at start and said on
//! stderr), requests with an `Origin` header (browsers) are refused, and only loopback
//! `Host` names are answered (DNS rebinding).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
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
    let chosen = std::env::var("SHADE_MCP_TOKEN")
        .ok()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty());
    let token: Arc<str> = match &chosen {
        Some(t) => Arc::from(t.as_str()),
        None => Arc::from(new_token()?),
    };
    // Said on stderr so that whoever started it (a test, a script) learns a chosen port and
    // the token its clients must send.
    eprintln!("shade mcp: serving http://{local}/mcp");
    if chosen.is_some() {
        eprintln!(
            "shade mcp: clients must send the header `Authorization: Bearer $SHADE_MCP_TOKEN`"
        );
    } else {
        eprintln!(
            "shade mcp: clients must send the header `Authorization: Bearer {token}` \
             (set SHADE_MCP_TOKEN to choose it)"
        );
    }
    let sessions: Sessions = Arc::default();
    let service = service(options, time_limit_secs, sessions.clone(), stop.clone());
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => accepted.context("accepting a connection")?,
            _ = stop.cancelled() => break,
        };
        let (service, token) = (service.clone(), token.clone());
        let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
            let (service, token) = (service.clone(), token.clone());
            async move {
                Ok::<_, std::convert::Infallible>(match refusal(&req, &token) {
                    Some(response) => response,
                    None => service.handle(req).await,
                })
            }
        });
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
    // Loopback `Host` names only (rmcp's default); any `Origin` refused (an empty list,
    // enforced): MCP clients send none, browsers always do on a cross-site POST.
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(true)
        .enforce_origin_validation()
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

/// A random token of 32 bytes from the kernel, hex-encoded.
fn new_token() -> anyhow::Result<String> {
    let mut buf = [0u8; 32];
    let mut filled = 0;
    while filled < buf.len() {
        // SAFETY: writing at most the rest of `buf`, which we own.
        let n =
            unsafe { libc::getrandom(buf[filled..].as_mut_ptr().cast(), buf.len() - filled, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e).context("making a token");
        }
        filled += n as usize;
    }
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// The 401 for a request without the right bearer token; None lets it through.
fn refusal<B>(
    req: &Request<B>,
    token: &str,
) -> Option<Response<BoxBody<Bytes, std::convert::Infallible>>> {
    let given = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if same(given.trim().as_bytes(), token.as_bytes()) {
        return None;
    }
    let mut response = Response::new(
        Full::new(Bytes::from_static(
            b"shade mcp: missing or wrong `Authorization: Bearer` token\n",
        ))
        .boxed(),
    );
    *response.status_mut() = StatusCode::UNAUTHORIZED;
    response.headers_mut().insert(
        hyper::header::WWW_AUTHENTICATE,
        hyper::header::HeaderValue::from_static("Bearer"),
    );
    Some(response)
}

/// Compares in time independent of where the bytes differ (the token is a secret).
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
