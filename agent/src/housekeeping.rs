//! Keeping the state directory from growing without end: full logs of oversized tool output
//! are needed while their session may still point the model at them, not for ever, and the
//! local telemetry log is rotated once it is large. Run at the start of each session; every
//! step is best effort (a failure here must never stop the user's work).

use std::path::Path;
use std::time::{Duration, SystemTime};

/// Full tool-output logs older than this are removed.
pub const TOOL_OUTPUT_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);
/// `telemetry.jsonl` is moved to `telemetry.jsonl.1` (replacing it) past this size.
pub const TELEMETRY_MAX_BYTES: u64 = 16 * 1024 * 1024;

/// What was tidied, for a debug log line and for tests.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Tidied {
    /// Tool-output logs removed.
    pub logs_removed: usize,
    /// Whether the telemetry log was rotated.
    pub telemetry_rotated: bool,
}

/// Tidy `state_root` (`$SHADE_STATE_DIR`) as of `now`.
pub fn tidy(state_root: &Path, now: SystemTime) -> Tidied {
    let mut done = Tidied::default();
    if let Ok(entries) = std::fs::read_dir(state_root.join("tool-output")) {
        for e in entries.flatten() {
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| now.duration_since(t).ok())
                .is_some_and(|age| age > TOOL_OUTPUT_MAX_AGE);
            if old
                && e.file_type().is_ok_and(|t| t.is_file())
                && std::fs::remove_file(e.path()).is_ok()
            {
                done.logs_removed += 1;
            }
        }
    }
    let log = state_root.join(crate::followup::telemetry::TELEMETRY_FILE);
    if std::fs::metadata(&log).is_ok_and(|m| m.len() > TELEMETRY_MAX_BYTES) {
        let mut rotated = log.clone().into_os_string();
        rotated.push(".1");
        done.telemetry_rotated = std::fs::rename(&log, rotated).is_ok();
    }
    if done != Tidied::default() {
        tracing::debug!(?done, "tidied the state directory");
    }
    done
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn removes_old_logs_only_and_rotates_a_large_telemetry_log() {
        let state = tempfile::tempdir().unwrap();
        let logs = state.path().join("tool-output");
        std::fs::create_dir(&logs).unwrap();
        std::fs::write(logs.join("old.log"), "x").unwrap();
        std::fs::write(logs.join("new.log"), "x").unwrap();
        let week_ago = SystemTime::now() - TOOL_OUTPUT_MAX_AGE - Duration::from_secs(60);
        std::fs::File::options()
            .write(true)
            .open(logs.join("old.log"))
            .unwrap()
            .set_modified(week_ago)
            .unwrap();
        let telemetry = state.path().join("telemetry.jsonl");
        std::fs::write(&telemetry, "{}\n").unwrap();
        let small = tidy(state.path(), SystemTime::now());
        assert_eq!(small.logs_removed, 1);
        assert!(!small.telemetry_rotated);
        assert!(logs.join("new.log").exists() && !logs.join("old.log").exists());

        std::fs::File::options()
            .write(true)
            .open(&telemetry)
            .unwrap()
            .set_len(TELEMETRY_MAX_BYTES + 1)
            .unwrap();
        assert!(tidy(state.path(), SystemTime::now()).telemetry_rotated);
        assert!(!telemetry.exists());
        assert!(state.path().join("telemetry.jsonl.1").exists());
    }
}
