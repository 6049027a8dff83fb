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

/// Output a failed sandbox set-up can have written (bwrap's one-line message): an attempt
/// that wrote more than this ran the command.
const SETUP_NOISE: usize = 4096;

/// A tee for one attempt at starting a sandbox: it holds the first few KiB back until the
/// attempt is known to have run the command ([`HeldTee::release`]) or more arrives, so the
/// message of a set-up that is tried again never reaches the caller's tee.
pub(crate) struct HeldTee {
    inner: Tee,
    /// `None` once released.
    held: std::sync::Mutex<Option<Vec<u8>>>,
}

impl HeldTee {
    pub(crate) fn new(inner: Tee) -> Arc<HeldTee> {
        Arc::new(HeldTee {
            inner,
            held: std::sync::Mutex::new(Some(Vec::new())),
        })
    }

    /// The tee to give the attempt.
    pub(crate) fn tee(self: &Arc<Self>) -> Tee {
        let me = self.clone();
        Tee::new(move |bytes: &[u8]| me.write(bytes))
    }

    fn write(&self, bytes: &[u8]) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        match held.as_mut() {
            Some(buf) if buf.len() + bytes.len() <= SETUP_NOISE => buf.extend_from_slice(bytes),
            Some(buf) => {
                (self.inner.0)(buf);
                (self.inner.0)(bytes);
                *held = None;
            }
            None => (self.inner.0)(bytes),
        }
    }

    /// The attempt ran the command: pass on what was held.
    pub(crate) fn release(&self) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(buf) = held.take() {
            if !buf.is_empty() {
                (self.inner.0)(&buf);
            }
        }
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

#[cfg(test)]
mod held_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::sync::Mutex;

    fn sink() -> (Tee, Arc<Mutex<Vec<u8>>>) {
        let got = Arc::new(Mutex::new(Vec::new()));
        let g = got.clone();
        (
            Tee::new(move |b: &[u8]| g.lock().unwrap().extend_from_slice(b)),
            got,
        )
    }

    #[test]
    fn a_failed_attempts_message_never_reaches_the_tee() {
        let (tee, got) = sink();
        let held = HeldTee::new(tee);
        (held.tee().0)(b"bwrap: Can't bind mount\n");
        drop(held);
        assert!(got.lock().unwrap().is_empty());
    }

    #[test]
    fn a_run_passes_everything_on_in_order() {
        let (tee, got) = sink();
        let held = HeldTee::new(tee);
        let t = held.tee();
        (t.0)(b"small ");
        assert!(got.lock().unwrap().is_empty(), "held back until known");
        let big = vec![b'x'; SETUP_NOISE];
        (t.0)(&big);
        (t.0)(b" end");
        held.release();
        let mut want = b"small ".to_vec();
        want.extend_from_slice(&big);
        want.extend_from_slice(b" end");
        assert_eq!(*got.lock().unwrap(), want);
    }
}
