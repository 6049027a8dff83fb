//! Timing primitives: repeated runs, medians, cache dropping and Ctrl-C checks.
//!
//! Measures time single runs with [`time`] and summarize them with [`Stats`], so every
//! system under test is timed and summarized the same way.

use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Catch SIGINT/SIGTERM/SIGHUP so the run stops between measurements and still unmounts
/// everything it mounted (the default action would kill us with mounts left behind).
pub fn install_signal_handlers() -> Result<()> {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::empty(),
        SigSet::empty(),
    );
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { sigaction(sig, &action) }.with_context(|| format!("installing {sig} handler"))?;
    }
    Ok(())
}

/// Fail (and so unwind to the clean-up) if the user asked us to stop.
pub fn check_interrupted() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(())
}

/// Summary of one measurement's runs.
#[derive(Clone, Debug, Serialize)]
pub struct Stats {
    pub samples: Vec<f64>,
    pub median: f64,
    pub p95: f64,
    pub min: f64,
    pub max: f64,
}

impl Stats {
    /// Summarize samples (any unit). Empty input gives NaNs, which the report shows as "—".
    pub fn of(samples: Vec<f64>) -> Stats {
        let mut sorted = samples.clone();
        sorted.sort_by(f64::total_cmp);
        let pick = |q: f64| -> f64 {
            if sorted.is_empty() {
                return f64::NAN;
            }
            // Nearest-rank percentile.
            let rank = (q * sorted.len() as f64).ceil() as usize;
            sorted[rank.clamp(1, sorted.len()) - 1]
        };
        let median = match sorted.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => sorted[n / 2],
            n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
        };
        Stats {
            median,
            p95: pick(0.95),
            min: sorted.first().copied().unwrap_or(f64::NAN),
            max: sorted.last().copied().unwrap_or(f64::NAN),
            samples,
        }
    }
}

/// Seconds taken by `f`.
pub fn time<T>(f: impl FnOnce() -> Result<T>) -> Result<(f64, T)> {
    let start = Instant::now();
    let out = f()?;
    Ok((start.elapsed().as_secs_f64(), out))
}

/// Drop the page, dentry and inode caches, so the next run is a "first" run: for FUSE and
/// overlay mounts this evicts their inodes (tmpfs itself keeps its dentries pinned).
pub fn drop_caches() -> Result<()> {
    nix::unistd::sync();
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").context("writing /proc/sys/vm/drop_caches")
}

/// Run a shell command line in `dir`, failing on a non-zero exit; returns its stdout.
pub fn sh(dir: &std::path::Path, cmdline: &str) -> Result<String> {
    let out = Command::new("sh")
        .arg("-c")
        .arg(cmdline)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("running `{cmdline}` in {}", dir.display()))?;
    if !out.status.success() {
        bail!(
            "`{cmdline}` in {} failed ({}): {}",
            dir.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Run a program with arguments, failing on a non-zero exit.
pub fn run(program: &str, args: &[&std::ffi::OsStr]) -> Result<()> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {:?} failed ({}): {}",
            args,
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_p95() {
        let s = Stats::of(vec![5.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!(s.median, 3.0);
        assert_eq!(s.p95, 5.0);
        assert_eq!(Stats::of(vec![1.0, 2.0]).median, 1.5);
        assert!(Stats::of(vec![]).median.is_nan());
    }
}
