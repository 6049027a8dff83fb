//! Phase timestamps of one process (`SHADE_LOG=timing=debug`): where a `shade run`'s
//! milliseconds go (connect, branch, sandbox set-up, command, result, teardown), for
//! `bench/run-latency.sh` and for whoever chases a slow run. Costs one check when off.

use std::sync::OnceLock;
use std::time::Instant;

static START: OnceLock<Instant> = OnceLock::new();

/// Start the clock (first thing in `main`); [`mark`] starts it too if nothing did.
pub fn start() {
    START.get_or_init(Instant::now);
}

/// Log that `phase` was reached, in milliseconds since [`start`] (debug, target `timing`).
pub fn mark(phase: &str) {
    if tracing::enabled!(target: "timing", tracing::Level::DEBUG) {
        let ms = START.get_or_init(Instant::now).elapsed().as_secs_f64() * 1e3;
        tracing::debug!(target: "timing", "phase {phase} at {ms:.2} ms");
    }
}
