//! Captured output: a reader thread per stream keeps the head and the tail of what the
//! command wrote, so a command printing gigabytes costs a fixed amount of memory and still
//! shows how it started and how it ended. A [`Tee`] sees every byte as it is read, for a
//! caller that keeps the whole output somewhere else (a file) without holding it in memory.

use std::io::Read;
use std::process::Child;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Gets every chunk of captured output (stdout and stderr, as each arrives, from the reader
/// threads), so that a caller can keep all of it while the capture keeps only head and tail.
#[derive(Clone)]
pub struct Tee(Arc<TeeFn>);

type TeeFn = dyn Fn(&[u8]) + Send + Sync;

impl Tee {
    /// A tee calling `f` with each chunk.
    pub fn new(f: impl Fn(&[u8]) + Send + Sync + 'static) -> Tee {
        Tee(Arc::new(f))
    }
}

impl std::fmt::Debug for Tee {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tee")
    }
}

/// One stream's output, capped: the first and last `cap / 2` bytes, and how many bytes in
/// between were dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Captured {
    /// The start of the output.
    pub head: Vec<u8>,
    /// The end of the output (empty unless the output exceeded the head).
    pub tail: Vec<u8>,
    /// Bytes dropped between head and tail.
    pub omitted: u64,
}

impl Captured {
    /// The output as text (lossy UTF-8), with a `[… N bytes omitted …]` line where bytes
    /// were dropped.
    pub fn text(&self) -> String {
        let mut text = String::from_utf8_lossy(&self.head).into_owned();
        if self.omitted > 0 {
            text.push_str(&format!("\n[… {} bytes omitted …]\n", self.omitted));
        }
        text.push_str(&String::from_utf8_lossy(&self.tail));
        text
    }

    /// True if the command wrote nothing.
    pub fn is_empty(&self) -> bool {
        self.head.is_empty() && self.tail.is_empty() && self.omitted == 0
    }
}

/// The reader threads of one run, each handing its result over a channel.
pub(crate) struct Readers {
    stdout: Option<Receiver<Captured>>,
    stderr: Option<Receiver<Captured>>,
}

/// How long we wait for the pipes to close once every process of the run is gone. Only a
/// process we could not find (no namespace, left the group) can keep them open longer.
const DRAIN_WAIT: Duration = Duration::from_secs(2);

impl Readers {
    pub(crate) fn start(child: &mut Child, cap: usize, tee: Option<&Tee>) -> Readers {
        let spawn = |pipe: Option<Box<dyn Read + Send>>| {
            let pipe = pipe?;
            let (tx, rx) = mpsc::channel();
            let tee = tee.cloned();
            std::thread::Builder::new()
                .name("sandbox-capture".into())
                .spawn(move || {
                    let _ = tx.send(read_capped(pipe, cap, tee));
                })
                .ok()?;
            Some(rx)
        };
        Readers {
            stdout: spawn(
                child
                    .stdout
                    .take()
                    .map(|p| Box::new(p) as Box<dyn Read + Send>),
            ),
            stderr: spawn(
                child
                    .stderr
                    .take()
                    .map(|p| Box::new(p) as Box<dyn Read + Send>),
            ),
        }
    }

    /// The captured streams. Called after the run's processes are gone.
    pub(crate) fn finish(self) -> (Captured, Captured) {
        let deadline = Instant::now() + DRAIN_WAIT;
        (join(self.stdout, deadline), join(self.stderr, deadline))
    }
}

fn join(rx: Option<Receiver<Captured>>, deadline: Instant) -> Captured {
    let Some(rx) = rx else {
        return Captured::default();
    };
    match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        Ok(c) => c,
        // The thread ends by itself when the last writer goes; we do not wait for it.
        Err(RecvTimeoutError::Timeout) => Captured {
            head: b"[output collection stopped: an escaped process kept it open]".to_vec(),
            ..Captured::default()
        },
        // The reader died without an answer (it panicked): nothing was kept.
        Err(RecvTimeoutError::Disconnected) => Captured::default(),
    }
}

fn read_capped(mut pipe: Box<dyn Read + Send>, cap: usize, tee: Option<Tee>) -> Captured {
    let half = cap / 2;
    let mut out = Captured::default();
    let mut buf = [0u8; 8192];
    loop {
        let n = match pipe.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        if let Some(tee) = &tee {
            (tee.0)(&buf[..n]);
        }
        let mut chunk = &buf[..n];
        if out.head.len() < half {
            let take = (half - out.head.len()).min(chunk.len());
            out.head.extend_from_slice(&chunk[..take]);
            chunk = &chunk[take..];
        }
        out.tail.extend_from_slice(chunk);
        if out.tail.len() > half * 2 {
            trim_tail(&mut out, half);
        }
    }
    trim_tail(&mut out, half);
    out
}

fn trim_tail(out: &mut Captured, half: usize) {
    if out.tail.len() > half {
        let excess = out.tail.len() - half;
        out.tail.drain(..excess);
        out.omitted += excess as u64;
    }
}
