//! Fault injection for the crash harness (`fusefs/tests/accept_crash.rs`).
//!
//! When the environment variable `SHADE_FAULT_KILL_AT_STEP=N` is set, the accept engine
//! (`apply` and `recover`) sends itself SIGKILL right before its N-th durable step (staging
//! a file, writing the journal, each rename/mkdir/trash, each cleanup removal). Steps are
//! counted from 1 per process. This is test-only machinery: unset, it costs one env lookup
//! per step and nothing else.

use std::sync::atomic::{AtomicU64, Ordering};

/// The env var naming the step at which to die.
pub const KILL_AT_STEP_ENV: &str = "SHADE_FAULT_KILL_AT_STEP";

static STEP: AtomicU64 = AtomicU64::new(0);

/// Count one durable step; die here if it is the configured one.
pub fn step() {
    let Some(at) = std::env::var(KILL_AT_STEP_ENV)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    else {
        return;
    };
    let n = STEP.fetch_add(1, Ordering::SeqCst) + 1;
    if n == at {
        // SAFETY: plain syscalls; SIGKILL cannot be caught, the process ends here.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}
