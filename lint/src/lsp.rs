//! A language-server client over stdio (`lsp-types` messages, JSON-RPC framing). The server
//! runs inside a branch at the project's real path, so it reads the branch's files where
//! it reads the disk; edited files are also sent with didOpen/didChange and their
//! published diagnostics awaited.

use super::diag::{Raw, Severity};
use super::exec::{self, BranchView};
use lsp_types::notification::{
    DidChangeTextDocument, DidOpenTextDocument, Exit, Initialized, Notification, PublishDiagnostics,
};
use lsp_types::request::{Initialize, Request, Shutdown};
use lsp_types::{
    ClientCapabilities, DidChangeTextDocumentParams, DidOpenTextDocumentParams, InitializeParams,
    InitializedParams, NumberOrString, PublishDiagnosticsParams, TextDocumentContentChangeEvent,
    TextDocumentItem, Url, VersionedTextDocumentIdentifier, WorkspaceFolder,
};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Why talking to the server failed.
#[derive(Debug, thiserror::Error)]
pub enum LspError {
    /// It could not be started, or its pipe broke.
    #[error("language server {0}")]
    Io(String),
    /// It did not answer or publish in time.
    #[error("language server gave no diagnostics for {0} in time")]
    Timeout(String),
    /// It answered `initialize` with an error.
    #[error("language server refused to start: {0}")]
    Refused(String),
}

#[derive(Default)]
struct Published {
    /// Per document: (how many publishes so far, version published, diagnostics).
    docs: HashMap<Url, (u64, Option<i32>, Vec<lsp_types::Diagnostic>)>,
    /// Responses by request id.
    responses: HashMap<i64, Value>,
    /// The server's stdout closed.
    closed: bool,
}

struct Shared {
    state: Mutex<Published>,
    changed: Condvar,
}

/// A running language server rooted at a branch's project path.
pub struct Server {
    name: String,
    child: Child,
    stdin: Arc<Mutex<ChildStdin>>,
    shared: Arc<Shared>,
    next_id: i64,
    project: std::path::PathBuf,
    /// What the server was last told each open document holds: (version, text).
    open: HashMap<String, (i32, String)>,
    last_used: Instant,
}

impl Server {
    /// Start `command` inside `view`, confined by `confine`, and complete the initialize
    /// handshake.
    pub fn start(
        name: &str,
        view: &BranchView,
        command: &[String],
        timeout: Duration,
        confine: &exec::Confinement,
    ) -> Result<Server, LspError> {
        let mut cmd = exec::command(view, command, &view.project, confine)
            .map_err(|e| LspError::Io(format!("{name}: {e}")))?;
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = cmd.spawn().map_err(|e| {
            LspError::Io(format!("{name}: cannot start `{}`: {e}", command.join(" ")))
        })?;
        let stdin = Arc::new(Mutex::new(
            child
                .stdin
                .take()
                .ok_or_else(|| LspError::Io(format!("{name}: no stdin")))?,
        ));
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| LspError::Io(format!("{name}: no stdout")))?;
        let shared = Arc::new(Shared {
            state: Mutex::new(Published::default()),
            changed: Condvar::new(),
        });
        let (tx, rx) = mpsc::channel::<Value>();
        spawn_reader(stdout, shared.clone(), tx);
        spawn_replier(stdin.clone(), rx);
        let mut s = Server {
            name: name.to_string(),
            child,
            stdin,
            shared,
            next_id: 1,
            project: view.project.clone(),
            open: HashMap::new(),
            last_used: Instant::now(),
        };
        let root = Url::from_directory_path(&view.project)
            .map_err(|_| LspError::Io(format!("{name}: bad root path")))?;
        #[allow(deprecated)] // root_uri: older servers still want it beside workspace_folders
        let params = InitializeParams {
            process_id: Some(std::process::id()),
            root_uri: Some(root.clone()),
            workspace_folders: Some(vec![WorkspaceFolder {
                uri: root,
                name: "project".into(),
            }]),
            capabilities: ClientCapabilities {
                text_document: Some(lsp_types::TextDocumentClientCapabilities {
                    publish_diagnostics: Some(lsp_types::PublishDiagnosticsClientCapabilities {
                        version_support: Some(true),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let reply = s.request::<Initialize>(params, timeout)?;
        if let Some(err) = reply.get("error") {
            return Err(LspError::Refused(err.to_string()));
        }
        s.notify::<Initialized>(InitializedParams {})?;
        Ok(s)
    }

    /// The checker name this server reports as.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// When it last served a request.
    pub fn last_used(&self) -> Instant {
        self.last_used
    }

    /// Whether the server process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Documents the server has been told about (project-relative paths).
    pub fn open_documents(&self) -> Vec<String> {
        self.open.keys().cloned().collect()
    }

    /// Tell the server `rel` now holds `text` (didOpen, or didChange when it differs from
    /// what it was last told), without waiting for diagnostics: replaying a caller's state.
    pub fn set_text(&mut self, rel: &str, text: &str) -> Result<(), LspError> {
        self.sync(rel, text).map(drop)
    }

    /// Send `text` as the content of `rel` unless the server already has it; the document
    /// version the server now holds, and whether it was sent just now.
    fn sync(&mut self, rel: &str, text: &str) -> Result<(Url, i32, bool), LspError> {
        let uri = Url::from_file_path(self.project.join(rel))
            .map_err(|_| LspError::Io(format!("{}: bad path {rel}", self.name)))?;
        let version = match self.open.get(rel) {
            Some((v, old)) if old == text => return Ok((uri, *v, false)),
            Some((v, _)) => {
                let v = v + 1;
                self.notify::<DidChangeTextDocument>(DidChangeTextDocumentParams {
                    text_document: VersionedTextDocumentIdentifier {
                        uri: uri.clone(),
                        version: v,
                    },
                    content_changes: vec![TextDocumentContentChangeEvent {
                        range: None,
                        range_length: None,
                        text: text.to_string(),
                    }],
                })?;
                v
            }
            None => {
                self.notify::<DidOpenTextDocument>(DidOpenTextDocumentParams {
                    text_document: TextDocumentItem {
                        uri: uri.clone(),
                        language_id: language_id(rel).into(),
                        version: 1,
                        text: text.to_string(),
                    },
                })?;
                1
            }
        };
        self.open
            .insert(rel.to_string(), (version, text.to_string()));
        Ok((uri, version, true))
    }

    /// Tell the server `rel` now holds `text` and wait for the diagnostics it publishes
    /// for that version.
    pub fn diagnostics(
        &mut self,
        rel: &str,
        text: &str,
        timeout: Duration,
    ) -> Result<Vec<Raw>, LspError> {
        self.last_used = Instant::now();
        let uri = Url::from_file_path(self.project.join(rel))
            .map_err(|_| LspError::Io(format!("{}: bad path {rel}", self.name)))?;
        let seen = self.publishes(&uri);
        let (uri, version, sent) = self.sync(rel, text)?;
        if !sent {
            // Unchanged: the server will not publish again; its last word stands.
            if let Some((_, _, d)) = self.lock().docs.get(&uri) {
                return Ok(to_raw(rel, d));
            }
        }
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        loop {
            if let Some((n, v, d)) = st.docs.get(&uri) {
                if *n > seen && v.is_none_or(|v| v >= version) {
                    return Ok(to_raw(rel, d));
                }
            }
            if st.closed {
                return Err(LspError::Io(format!("{} exited", self.name)));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(LspError::Timeout(rel.to_string()));
            }
            st = self
                .shared
                .changed
                .wait_timeout(st, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// Politely stop the server (shutdown, exit), then make sure it is gone.
    pub fn stop(mut self) {
        let _ = self.request::<Shutdown>((), Duration::from_secs(2));
        let _ = self.notify::<Exit>(());
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Published> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn publishes(&self, uri: &Url) -> u64 {
        self.lock().docs.get(uri).map(|d| d.0).unwrap_or(0)
    }

    fn send(&self, msg: &Value) -> Result<(), LspError> {
        write_frame(&self.stdin, msg).map_err(|e| LspError::Io(format!("{}: {e}", self.name)))
    }

    fn notify<N: Notification>(&self, params: N::Params) -> Result<(), LspError> {
        self.send(&json!({"jsonrpc": "2.0", "method": N::METHOD, "params": params}))
    }

    fn request<R: Request>(
        &mut self,
        params: R::Params,
        timeout: Duration,
    ) -> Result<Value, LspError> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": R::METHOD, "params": params}))?;
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        loop {
            if let Some(v) = st.responses.remove(&id) {
                return Ok(v);
            }
            if st.closed {
                return Err(LspError::Io(format!("{} exited", self.name)));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(LspError::Timeout(R::METHOD.to_string()));
            }
            st = self
                .shared
                .changed
                .wait_timeout(st, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn write_frame(stdin: &Mutex<ChildStdin>, msg: &Value) -> std::io::Result<()> {
    let body = serde_json::to_vec(msg)?;
    let mut w = stdin.lock().unwrap_or_else(|e| e.into_inner());
    write!(w, "Content-Length: {}\r\n\r\n", body.len())?;
    w.write_all(&body)?;
    w.flush()
}

/// Reads frames from the server: responses and diagnostics go to `shared`, requests from
/// the server to the replier (which answers them so the server does not wait on us).
fn spawn_reader(
    stdout: impl Read + Send + 'static,
    shared: Arc<Shared>,
    requests: mpsc::Sender<Value>,
) {
    std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        while let Some(msg) = read_frame(&mut r) {
            let method = msg.get("method").and_then(Value::as_str);
            let id = msg.get("id");
            match (method, id) {
                (Some(_), Some(_)) => {
                    let _ = requests.send(msg);
                }
                (Some(m), None) if m == PublishDiagnostics::METHOD => {
                    if let Ok(p) =
                        serde_json::from_value::<PublishDiagnosticsParams>(msg["params"].clone())
                    {
                        let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
                        let n = st.docs.get(&p.uri).map(|d| d.0).unwrap_or(0) + 1;
                        st.docs.insert(p.uri, (n, p.version, p.diagnostics));
                        shared.changed.notify_all();
                    }
                }
                (None, Some(id)) => {
                    if let Some(id) = id.as_i64() {
                        let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
                        st.responses.insert(id, msg);
                        shared.changed.notify_all();
                    }
                }
                _ => {} // logs, progress
            }
        }
        let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
        st.closed = true;
        shared.changed.notify_all();
    });
}

/// Answers the server's own requests: `workspace/configuration` with one null per item,
/// everything else (registerCapability, workDoneProgress/create, …) with null.
fn spawn_replier(stdin: Arc<Mutex<ChildStdin>>, rx: mpsc::Receiver<Value>) {
    std::thread::spawn(move || {
        for req in rx {
            let result = if req["method"] == "workspace/configuration" {
                let n = req["params"]["items"].as_array().map_or(0, Vec::len);
                Value::Array(vec![Value::Null; n])
            } else {
                Value::Null
            };
            let reply = json!({"jsonrpc": "2.0", "id": req["id"], "result": result});
            if write_frame(&stdin, &reply).is_err() {
                return;
            }
        }
    });
}

fn read_frame(r: &mut impl BufRead) -> Option<Value> {
    let mut len = None;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some(v) = line.strip_prefix("Content-Length:") {
            len = v.trim().parse::<usize>().ok();
        }
    }
    let mut body = vec![0; len?];
    r.read_exact(&mut body).ok()?;
    serde_json::from_slice(&body).ok()
}

fn to_raw(rel: &str, diags: &[lsp_types::Diagnostic]) -> Vec<Raw> {
    diags
        .iter()
        .map(|d| Raw {
            path: rel.to_string(),
            line: d.range.start.line + 1,
            column: d.range.start.character + 1,
            end_line: d.range.end.line + 1,
            end_column: d.range.end.character + 1,
            severity: Some(match d.severity {
                Some(s) if s == lsp_types::DiagnosticSeverity::ERROR => Severity::Error,
                Some(s) if s == lsp_types::DiagnosticSeverity::WARNING => Severity::Warning,
                Some(s) if s == lsp_types::DiagnosticSeverity::HINT => Severity::Hint,
                Some(_) => Severity::Info,
                None => Severity::Error,
            }),
            code: d.code.as_ref().map(|c| match c {
                NumberOrString::Number(n) => n.to_string(),
                NumberOrString::String(s) => s.clone(),
            }),
            message: d.message.clone(),
        })
        .collect()
}

/// The LSP language id for a file, from its extension.
fn language_id(rel: &str) -> &'static str {
    match rel.rsplit('.').next().unwrap_or("") {
        "py" | "pyi" => "python",
        "c" | "h" => "c",
        "cc" | "cpp" | "cxx" | "hpp" | "hh" => "cpp",
        "rs" => "rust",
        "ts" => "typescript",
        "tsx" => "typescriptreact",
        "js" | "mjs" | "cjs" => "javascript",
        "go" => "go",
        _ => "plaintext",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let body = br#"{"jsonrpc":"2.0","method":"x","params":{}}"#;
        let text = format!("Content-Length: {}\r\n\r\n", body.len());
        let mut all = text.into_bytes();
        all.extend_from_slice(body);
        let mut r = std::io::Cursor::new(all);
        assert_eq!(read_frame(&mut r).expect("frame")["method"], "x");
        assert!(read_frame(&mut r).is_none());
    }
}
