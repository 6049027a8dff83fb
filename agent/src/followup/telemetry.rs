//! Local telemetry of suggestions and speculation: one JSON object per line appended to
//! `$SHADE_STATE_DIR/telemetry.jsonl` (never sent anywhere), mirrored to `tracing`. It is a
//! side channel: a write that fails is logged and never fails the caller.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// File name of the telemetry log inside the state dir.
pub const TELEMETRY_FILE: &str = "telemetry.jsonl";

/// The keys that take a suggestion. Shift+Tab is deliberately not one (the peer's bug #3060:
/// it accepted the suggestion instead of cycling the approval mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AcceptMethod {
    /// Fills the input, does not submit.
    Tab,
    /// Fills the input and submits it.
    Enter,
    /// Right arrow: fills the input, does not submit.
    Right,
}

impl AcceptMethod {
    /// Every accept method.
    pub const ALL: [AcceptMethod; 3] = [Self::Tab, Self::Enter, Self::Right];

    /// Its telemetry name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tab => "tab",
            Self::Enter => "enter",
            Self::Right => "right",
        }
    }

    /// Does this method submit the filled input at once?
    pub fn submits(self) -> bool {
        self == Self::Enter
    }
}

impl FromStr for AcceptMethod {
    type Err = String;

    /// `tab`, `enter`, `right` (any case); anything else — `shift+tab`, `backtab` — is not an
    /// accept.
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "tab" => Ok(Self::Tab),
            "enter" => Ok(Self::Enter),
            "right" => Ok(Self::Right),
            other => Err(format!("`{other}` does not accept a suggestion")),
        }
    }
}

/// What became of a suggestion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SuggestionEventOutcome {
    /// Tab, Enter or Right took it.
    Accepted,
    /// The user typed or pasted something else while it was shown (or it was cleared).
    Ignored,
    /// A filter rule (or an empty answer) dropped it before it was shown.
    Suppressed,
    /// Printed by `shade exec --suggest`, where nobody can accept or ignore it.
    Shown,
}

/// The seed's `PromptSuggestionEvent`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PromptSuggestionEvent {
    /// Always `prompt_suggestion`.
    pub event: &'static str,
    /// What became of it.
    pub outcome: SuggestionEventOutcome,
    /// `prompt_suggestion` or `pipelined_suggestion`.
    pub prompt_id: String,
    /// How it was accepted.
    pub accept_method: Option<AcceptMethod>,
    /// Shown → accepted.
    pub time_to_accept_ms: Option<u64>,
    /// Shown → ignored.
    pub time_to_ignore_ms: Option<u64>,
    /// Shown → the first key pressed while it was shown.
    pub time_to_first_keystroke_ms: Option<u64>,
    /// Characters of the suggestion (unknown for a suppressed one).
    pub suggestion_length: Option<usize>,
    /// 1.0 when accepted, 0.0 when ignored.
    pub similarity: Option<f64>,
    /// The filter rule that suppressed it.
    pub reason: Option<String>,
}

impl PromptSuggestionEvent {
    /// An event with only the outcome and prompt id set.
    pub fn new(outcome: SuggestionEventOutcome, prompt_id: &str) -> Self {
        Self {
            event: "prompt_suggestion",
            outcome,
            prompt_id: prompt_id.to_string(),
            accept_method: None,
            time_to_accept_ms: None,
            time_to_ignore_ms: None,
            time_to_first_keystroke_ms: None,
            suggestion_length: None,
            similarity: None,
            reason: None,
        }
    }

    /// Append it to `telemetry` (same as [`Telemetry::record_suggestion`]).
    pub fn record(&self, telemetry: &Telemetry) {
        telemetry.record_suggestion(self);
    }

    /// A suggestion dropped by filter rule (or guard) `reason`.
    pub fn suppressed(reason: &str, prompt_id: &str) -> Self {
        Self {
            reason: Some(reason.to_string()),
            ..Self::new(SuggestionEventOutcome::Suppressed, prompt_id)
        }
    }
}

/// How a speculation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SpeculationEventOutcome {
    /// The user accepted the suggestion and the speculated work was kept.
    Accepted,
    /// The user did something else, or it hit a boundary and was dropped.
    Aborted,
    /// A model or tool error ended it.
    Failed,
}

/// The seed's `SpeculationEvent`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SpeculationEvent {
    /// Always `speculation`.
    pub event: &'static str,
    /// How it ended.
    pub outcome: SpeculationEventOutcome,
    /// Model calls made.
    pub turns_used: u32,
    /// Files written in the speculation's branch.
    pub files_written: u32,
    /// Tool calls run.
    pub tool_use_count: u32,
    /// Wall-clock time from start to end.
    pub duration_ms: u64,
    /// What stopped it (`shell:…`, `tool:…`, `turn_limit`…), if a boundary did.
    pub boundary_type: Option<String>,
    /// Whether the next suggestion was computed from its result.
    pub had_pipelined_suggestion: bool,
    /// Time the user did not wait because the work was already done (accepted only).
    pub time_saved_ms: Option<u64>,
}

impl SpeculationEvent {
    /// Append it to `telemetry` (same as [`Telemetry::record_speculation`]).
    pub fn record(&self, telemetry: &Telemetry) {
        telemetry.record_speculation(self);
    }

    /// An event with the outcome set and every count zero.
    pub fn new(outcome: SpeculationEventOutcome) -> Self {
        Self {
            event: "speculation",
            outcome,
            turns_used: 0,
            files_written: 0,
            tool_use_count: 0,
            duration_ms: 0,
            boundary_type: None,
            had_pipelined_suggestion: false,
            time_saved_ms: None,
        }
    }
}

/// The telemetry sink of one session (cheap to clone; clones share the file lock).
#[derive(Debug, Clone)]
pub struct Telemetry {
    path: Option<PathBuf>,
    session: u64,
    lock: Arc<Mutex<()>>,
}

impl Telemetry {
    /// Append to `state_dir/telemetry.jsonl` (the directory is created on first write).
    pub fn new(state_dir: &Path, session: u64) -> Self {
        Self {
            path: Some(state_dir.join(TELEMETRY_FILE)),
            session,
            lock: Arc::new(Mutex::new(())),
        }
    }

    /// Append to the state dir branches use (`$SHADE_STATE_DIR`, `$XDG_STATE_HOME/shade`,
    /// `~/.local/state/shade`).
    pub fn from_env(session: u64) -> Self {
        Self::new(shade_fusefs::StateDir::from_env().root(), session)
    }

    /// Records nothing (the `telemetry = false` setting).
    pub fn disabled() -> Self {
        Self {
            path: None,
            session: 0,
            lock: Arc::new(Mutex::new(())),
        }
    }

    /// Is anything recorded?
    pub fn is_enabled(&self) -> bool {
        self.path.is_some()
    }

    /// The file written to, when enabled.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The session id stamped on every line.
    pub fn session(&self) -> u64 {
        self.session
    }

    /// Record a suggestion outcome.
    pub fn record_suggestion(&self, event: &PromptSuggestionEvent) {
        self.record(event);
    }

    /// Record a speculation outcome.
    pub fn record_speculation(&self, event: &SpeculationEvent) {
        self.record(event);
    }

    /// Append `event` as one line, with `timestamp` (RFC 3339, UTC) and `session` (hex) added.
    pub fn record<E: Serialize>(&self, event: &E) {
        let Some(path) = &self.path else { return };
        let mut value = match serde_json::to_value(event) {
            Ok(serde_json::Value::Object(map)) => map,
            Ok(_) | Err(_) => {
                tracing::warn!("telemetry: event is not a JSON object; not recorded");
                return;
            }
        };
        value.insert("timestamp".into(), now_rfc3339().into());
        value.insert("session".into(), format!("{:016x}", self.session).into());
        let line = serde_json::Value::Object(value).to_string();
        tracing::info!(target: "shade::telemetry", "{line}");
        let _guard = self.lock.lock();
        if let Err(e) = append_line(path, &line) {
            tracing::warn!("telemetry: cannot append to {}: {e}", path.display());
        }
    }
}

fn append_line(path: &Path, line: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    // One write per line, so concurrent writers (two chats) never interleave within a line.
    file.write_all(format!("{line}\n").as_bytes())
}

/// Now as `YYYY-MM-DDTHH:MM:SS.mmmZ`, without a date crate.
fn now_rfc3339() -> String {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    rfc3339(since.as_secs(), since.subsec_millis())
}

fn rfc3339(secs: u64, millis: u32) -> String {
    let secs = i64::try_from(secs).unwrap_or(0);
    chrono::DateTime::from_timestamp(secs, millis.min(999) * 1_000_000)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(path: &Path) -> Vec<serde_json::Value> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("json line"))
            .collect()
    }

    #[test]
    fn timestamps_are_utc_rfc3339() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(rfc3339(1_795_437_296, 123), "2026-11-23T12:34:56.123Z");
    }

    #[test]
    fn appends_one_line_per_event_creating_the_dir() {
        let dir = tempfile::tempdir().expect("tmp");
        let state = dir.path().join("state/nested");
        let t = Telemetry::new(&state, 0xabc);
        t.record_suggestion(&PromptSuggestionEvent::suppressed(
            "evaluative",
            "prompt_suggestion",
        ));
        let mut accepted =
            PromptSuggestionEvent::new(SuggestionEventOutcome::Accepted, "prompt_suggestion");
        accepted.accept_method = Some(AcceptMethod::Tab);
        accepted.similarity = Some(1.0);
        accepted.suggestion_length = Some(13);
        t.record_suggestion(&accepted);
        let mut spec = SpeculationEvent::new(SpeculationEventOutcome::Aborted);
        spec.boundary_type = Some("shell:rm -rf build".into());
        spec.record(&t);
        let got = lines(&state.join(TELEMETRY_FILE));
        assert_eq!(got.len(), 3);
        assert_eq!(got[0]["event"], "prompt_suggestion");
        assert_eq!(got[0]["outcome"], "suppressed");
        assert_eq!(got[0]["reason"], "evaluative");
        assert_eq!(got[0]["session"], "0000000000000abc");
        assert!(got[0]["timestamp"]
            .as_str()
            .is_some_and(|s| s.ends_with('Z')));
        assert_eq!(got[1]["accept_method"], "tab");
        assert_eq!(got[1]["similarity"], 1.0);
        assert_eq!(got[1]["time_to_ignore_ms"], serde_json::Value::Null);
        assert_eq!(got[2]["event"], "speculation");
        assert_eq!(got[2]["outcome"], "aborted");
        assert_eq!(got[2]["boundary_type"], "shell:rm -rf build");
    }

    #[test]
    fn disabled_writes_nothing_and_failures_do_not_panic() {
        let t = Telemetry::disabled();
        assert!(!t.is_enabled());
        t.record_suggestion(&PromptSuggestionEvent::suppressed(
            "done",
            "prompt_suggestion",
        ));
        // A state dir that is a file: the write fails, is logged, and the caller goes on.
        let dir = tempfile::tempdir().expect("tmp");
        let file = dir.path().join("not-a-dir");
        std::fs::write(&file, "x").expect("write");
        let t = Telemetry::new(&file, 1);
        t.record_suggestion(&PromptSuggestionEvent::suppressed(
            "done",
            "prompt_suggestion",
        ));
        assert_eq!(std::fs::read_to_string(&file).expect("read"), "x");
    }
}
