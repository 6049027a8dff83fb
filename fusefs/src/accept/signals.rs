//! An accept is never cut short by Ctrl-C, SIGTERM or SIGHUP once past its commit point;
//! before it (while staging) a signal cancels it and nothing is written ([`Staging`]).
//!
//! Blocking the signals in the accepting thread is not enough: the kernel hands a process
//! signal to any thread that does not block it (a FUSE worker, a tokio thread), and its
//! default action ends the whole process. So while an accept or a recovery runs, the three
//! signals get a process-wide handler that only notes them (and says on stderr that the
//! accept is being finished); when it is done the previous handlers are put back and the
//! noted signals delivered again, or handed to the caller ([`DeferSignals::take`]) which
//! reports the result first. Guards nest: only the outermost installs and restores.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// Signals noted while deferred, as a bit mask (`1 << signo`).
static PENDING: AtomicU32 = AtomicU32::new(0);
/// Live guards that protect an accept (not only a clean-up): they choose what the handler
/// says.
static ACCEPTS: AtomicUsize = AtomicUsize::new(0);
/// Accepts staging right now (before their commit point): a signal cancels these.
static STAGING: AtomicUsize = AtomicUsize::new(0);

/// Whether a termination signal came while deferred: an accept still staging stops and
/// rolls back (nothing written) instead of finishing.
pub fn cancel_requested() -> bool {
    PENDING.load(Ordering::SeqCst) != 0
}

/// While alive, the accept is before its commit point: a signal cancels it (the handler
/// says so) rather than waiting for it.
pub struct Staging(());

impl Staging {
    /// Marks an accept as staging.
    pub fn begin() -> Staging {
        STAGING.fetch_add(1, Ordering::SeqCst);
        Staging(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        STAGING.fetch_sub(1, Ordering::SeqCst);
    }
}

struct Saved {
    depth: usize,
    old: Vec<(libc::c_int, libc::sigaction)>,
}

static STATE: Mutex<Saved> = Mutex::new(Saved {
    depth: 0,
    old: Vec::new(),
});

extern "C" fn note(sig: libc::c_int) {
    PENDING.fetch_or(1 << sig, Ordering::SeqCst);
    let msg = if STAGING.load(Ordering::SeqCst) > 0 {
        "\nshade: cancelling the accept before it writes anything\u{2026}\n"
    } else if ACCEPTS.load(Ordering::SeqCst) > 0 {
        "\nshade: finishing the accept\u{2026} (an accept is never cut short)\n"
    } else {
        "\nshade: stopping once the branch is cleaned up\u{2026}\n"
    };
    // SAFETY: write(2) is async-signal-safe; the buffer is a static string.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
    }
}

/// While alive, Ctrl-C, SIGTERM and SIGHUP wait (see the module doc).
#[must_use = "signals are deferred only while the guard lives"]
pub struct DeferSignals {
    done: bool,
    accept: bool,
}

impl DeferSignals {
    /// Start deferring the termination signals (process-wide) around an accept.
    pub fn new() -> DeferSignals {
        Self::start(true)
    }

    /// Start deferring them around shade's own set-up and clean-up of a branch (mount,
    /// changeset, unmount), so a signal there cannot leave a branch mounted; the handler
    /// says shade stops once the branch is cleaned up.
    pub fn for_cleanup() -> DeferSignals {
        Self::start(false)
    }

    /// The signals noted so far, without ending the deferral (so a caller can stop before
    /// starting the next step).
    pub fn pending(&self) -> Vec<i32> {
        let pending = PENDING.load(Ordering::SeqCst);
        SIGNALS
            .into_iter()
            .filter(|s| pending & (1 << s) != 0)
            .collect()
    }

    fn start(accept: bool) -> DeferSignals {
        if accept {
            ACCEPTS.fetch_add(1, Ordering::SeqCst);
        }
        let mut st = STATE.lock().unwrap_or_else(PoisonError::into_inner);
        if st.depth == 0 {
            PENDING.store(0, Ordering::SeqCst);
            st.old.clear();
            for sig in SIGNALS {
                // SAFETY: a zeroed sigaction is valid; the handler is an extern "C" fn that
                // only touches an atomic and calls write(2).
                unsafe {
                    let mut act: libc::sigaction = std::mem::zeroed();
                    act.sa_sigaction = note as extern "C" fn(libc::c_int) as usize;
                    act.sa_flags = libc::SA_RESTART;
                    libc::sigemptyset(&mut act.sa_mask);
                    let mut old: libc::sigaction = std::mem::zeroed();
                    if libc::sigaction(sig, &act, &mut old) == 0 {
                        st.old.push((sig, old));
                    }
                }
            }
        }
        st.depth += 1;
        DeferSignals {
            done: false,
            accept,
        }
    }

    fn finish(&mut self) -> Vec<i32> {
        if self.done {
            return Vec::new();
        }
        self.done = true;
        if self.accept {
            ACCEPTS.fetch_sub(1, Ordering::SeqCst);
        }
        let mut st = STATE.lock().unwrap_or_else(PoisonError::into_inner);
        st.depth = st.depth.saturating_sub(1);
        if st.depth > 0 {
            return Vec::new();
        }
        for (sig, old) in st.old.drain(..) {
            // SAFETY: restoring the action sigaction gave us.
            unsafe {
                libc::sigaction(sig, &old, std::ptr::null_mut());
            }
        }
        let pending = PENDING.swap(0, Ordering::SeqCst);
        SIGNALS
            .into_iter()
            .filter(|s| pending & (1 << s) != 0)
            .collect()
    }

    /// Stop deferring and return the signals that came meanwhile, without delivering them
    /// (for a caller that reports the accept's result and then exits for them itself).
    /// Empty for a nested guard: the outermost one has them.
    pub fn take(mut self) -> Vec<i32> {
        self.finish()
    }
}

impl Default for DeferSignals {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for DeferSignals {
    /// Stop deferring and deliver what came meanwhile to the handlers in place before.
    fn drop(&mut self) {
        for sig in self.finish() {
            // SAFETY: sending a signal to our own process.
            unsafe {
                libc::kill(libc::getpid(), sig);
            }
        }
    }
}
