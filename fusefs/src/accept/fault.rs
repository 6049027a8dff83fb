//! Fault injection for the crash and fault harnesses (`fusefs/tests/accept_crash.rs`,
//! `fusefs/tests/accept_faults.rs`, `tests/accept_failures.rs`).
//!
//! The accept engine (`apply` and `recover`) calls [`step`] right before each of its durable
//! steps (staging a file or directory, writing the journal, each rename/mkdir/trash, each
//! cleanup removal). Steps are counted from 1 per process. Environment variables choose what
//! happens at step N:
//! - `SHADE_FAULT_KILL_AT_STEP=N`: the process sends itself SIGKILL (a crash);
//! - `SHADE_FAULT_FAIL_AT_STEP=N:ERR`: the step fails with errno ERR (`ENOSPC`, `EDQUOT`,
//!   `EMFILE`, `EIO`, or a number), as a full disk, a quota, a descriptor limit or a failing
//!   device would make it;
//! - `SHADE_FAULT_RUN_AT_STEP=N:CMD`: `sh -c CMD` runs first, to completion — a concurrent
//!   change of the project (a rename, a directory swapped for a symlink, an edit) exactly
//!   there.
//!
//! This is test-only machinery: unset, it costs three env lookups per step and nothing else.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

/// The env var naming the step at which to die.
pub const KILL_AT_STEP_ENV: &str = "SHADE_FAULT_KILL_AT_STEP";
/// The env var naming the step that fails, and with which errno (`N:ENOSPC`).
pub const FAIL_AT_STEP_ENV: &str = "SHADE_FAULT_FAIL_AT_STEP";
/// The env var naming the step before which a shell command runs (`N:CMD`).
pub const RUN_AT_STEP_ENV: &str = "SHADE_FAULT_RUN_AT_STEP";

static STEP: AtomicU64 = AtomicU64::new(0);

fn at(var: &str) -> Option<(u64, String)> {
    let v = std::env::var(var).ok()?;
    match v.split_once(':') {
        Some((n, rest)) => Some((n.trim().parse().ok()?, rest.to_string())),
        None => Some((v.trim().parse().ok()?, String::new())),
    }
}

fn errno(name: &str) -> i32 {
    match name.trim() {
        "ENOSPC" => libc::ENOSPC,
        "EDQUOT" => libc::EDQUOT,
        "EMFILE" => libc::EMFILE,
        "EIO" => libc::EIO,
        other => other.parse().unwrap_or(libc::EIO),
    }
}

/// Count one durable step; do what the environment says for it (see the module doc).
pub fn step() -> io::Result<()> {
    let kill = at(KILL_AT_STEP_ENV);
    let fail = at(FAIL_AT_STEP_ENV);
    let run = at(RUN_AT_STEP_ENV);
    if kill.is_none() && fail.is_none() && run.is_none() {
        return Ok(());
    }
    let n = STEP.fetch_add(1, Ordering::SeqCst) + 1;
    if let Some((_, cmd)) = run.filter(|(at, _)| *at == n) {
        let _ = std::process::Command::new("sh").arg("-c").arg(cmd).status();
    }
    if kill.is_some_and(|(at, _)| at == n) {
        // SAFETY: plain syscalls; SIGKILL cannot be caught, the process ends here.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
    match fail {
        Some((at, name)) if at == n => Err(io::Error::from_raw_os_error(errno(&name))),
        _ => Ok(()),
    }
}
