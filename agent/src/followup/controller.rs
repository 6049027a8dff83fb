//! The seed's framework-free `FollowupController`: what the ghost-text suggestion does between
//! the answer and the next prompt. A deterministic state machine fed explicit `Instant`s (no
//! threads, no timers inside): the REPL asks [`FollowupController::due`] when to call
//! [`FollowupController::tick`], and reports keys. The hooks are where the speculation engine
//! plugs in: it starts on "shown" and is aborted on "dismissed".
//!
//! States: empty → pending (set, not drawn yet) → visible (after 300 ms) → empty again on
//! accept, dismiss or clear.

use std::time::{Duration, Instant};

pub use super::telemetry::AcceptMethod;
use super::telemetry::{PromptSuggestionEvent, SuggestionEventOutcome, Telemetry};
use crate::background::prompt_id;

/// A suggestion is drawn this long after it is set (an answer still being read is not
/// interrupted by flicker).
pub const SUGGESTION_DELAY_MS: u64 = 300;
/// After one accept, further accepts are refused this long (key repeat, Tab-then-Enter, and a
/// pipelined suggestion appearing right under the finger).
pub const ACCEPT_DEBOUNCE_MS: u64 = 100;

/// A hook on one suggestion's text.
pub type TextHook = Box<dyn Fn(&str) + Send + Sync>;
/// A hook on an accepted suggestion and the key that took it.
pub type AcceptHook = Box<dyn Fn(&str, AcceptMethod) + Send + Sync>;

/// Callbacks on the suggestion's life. Default: do nothing.
pub struct FollowupHooks {
    /// The suggestion became visible (start speculating on it).
    pub on_shown: TextHook,
    /// The user took it (use the speculation if it matches).
    pub on_accepted: AcceptHook,
    /// A visible suggestion went away unused (abort the speculation).
    pub on_dismissed: TextHook,
}

impl Default for FollowupHooks {
    fn default() -> Self {
        Self {
            on_shown: Box::new(|_| {}),
            on_accepted: Box::new(|_, _| {}),
            on_dismissed: Box::new(|_| {}),
        }
    }
}

impl std::fmt::Debug for FollowupHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FollowupHooks")
    }
}

/// The current suggestion, pending or visible.
#[derive(Debug, Clone)]
struct Current {
    text: String,
    prompt_id: String,
    /// When it becomes visible.
    due: Instant,
    /// When it became visible.
    shown_at: Option<Instant>,
    /// First key pressed while it was visible.
    first_keystroke: Option<Instant>,
}

/// The ghost-text suggestion's state machine (see the module doc).
#[derive(Debug)]
pub struct FollowupController {
    hooks: FollowupHooks,
    telemetry: Telemetry,
    current: Option<Current>,
    last_accept: Option<Instant>,
}

fn ms(from: Instant, to: Instant) -> u64 {
    u64::try_from(to.saturating_duration_since(from).as_millis()).unwrap_or(u64::MAX)
}

impl FollowupController {
    /// A controller with no suggestion.
    pub fn new(hooks: FollowupHooks, telemetry: Telemetry) -> Self {
        Self {
            hooks,
            telemetry,
            current: None,
            last_accept: None,
        }
    }

    /// The telemetry sink (the REPL records speculation events through it too).
    pub fn telemetry(&self) -> &Telemetry {
        &self.telemetry
    }

    /// A new suggestion (`prompt_suggestion`), drawn 300 ms after `now`; `None` clears at once.
    /// Whatever was there before is cleared first (see [`Self::clear`]).
    pub fn set_suggestion(&mut self, text: Option<String>, now: Instant) {
        self.set_suggestion_with(text, prompt_id::PROMPT_SUGGESTION, now);
    }

    /// [`Self::set_suggestion`] with the prompt id recorded in telemetry
    /// (`pipelined_suggestion` for the one computed by a speculation).
    pub fn set_suggestion_with(&mut self, text: Option<String>, prompt_id: &str, now: Instant) {
        self.clear(now);
        if let Some(text) = text {
            self.current = Some(Current {
                text,
                prompt_id: prompt_id.to_string(),
                due: now + Duration::from_millis(SUGGESTION_DELAY_MS),
                shown_at: None,
                first_keystroke: None,
            });
        }
    }

    /// Show a suggestion at once, without the delay (the pipelined suggestion after an accepted
    /// speculation: the Tab-Tab-Tab flow). Fires `on_shown`.
    pub fn show_now(&mut self, text: String, prompt_id: &str, now: Instant) {
        self.set_suggestion_with(Some(text), prompt_id, now);
        if let Some(c) = &mut self.current {
            c.due = now;
        }
        self.tick(now);
    }

    /// When [`Self::tick`] has something to do: the pending suggestion's due time.
    pub fn due(&self) -> Option<Instant> {
        self.current
            .as_ref()
            .filter(|c| c.shown_at.is_none())
            .map(|c| c.due)
    }

    /// Make a due suggestion visible (fires `on_shown`). True when visibility changed, i.e. the
    /// prompt must be redrawn.
    pub fn tick(&mut self, now: Instant) -> bool {
        let Some(c) = &mut self.current else {
            return false;
        };
        if c.shown_at.is_some() || now < c.due {
            return false;
        }
        c.shown_at = Some(now);
        (self.hooks.on_shown)(&c.text);
        true
    }

    /// The suggestion to draw as ghost text, if one is visible.
    pub fn visible(&self) -> Option<&str> {
        self.current
            .as_ref()
            .filter(|c| c.shown_at.is_some())
            .map(|c| c.text.as_str())
    }

    /// The suggestion waiting for its delay, if any.
    pub fn pending(&self) -> Option<&str> {
        self.current
            .as_ref()
            .filter(|c| c.shown_at.is_none())
            .map(|c| c.text.as_str())
    }

    /// A key was pressed (any key, before it is handled): records the time to the first
    /// keystroke while a suggestion is visible.
    pub fn keystroke(&mut self, now: Instant) {
        if let Some(c) = &mut self.current {
            if c.shown_at.is_some() && c.first_keystroke.is_none() {
                c.first_keystroke = Some(now);
            }
        }
    }

    /// Take the visible suggestion (call it only when the input line is empty: a key that
    /// accepts on an empty line types on a non-empty one). `None` when nothing is visible or
    /// within 100 ms of the previous accept. Records `accepted` and fires `on_accepted`.
    pub fn accept(&mut self, method: AcceptMethod, now: Instant) -> Option<String> {
        if let Some(last) = self.last_accept {
            if now.saturating_duration_since(last) < Duration::from_millis(ACCEPT_DEBOUNCE_MS) {
                return None;
            }
        }
        let shown_at = self.current.as_ref()?.shown_at?;
        let c = self.current.take()?;
        self.last_accept = Some(now);
        let mut event = PromptSuggestionEvent::new(SuggestionEventOutcome::Accepted, &c.prompt_id);
        event.accept_method = Some(method);
        event.time_to_accept_ms = Some(ms(shown_at, now));
        event.time_to_first_keystroke_ms = c.first_keystroke.map(|k| ms(shown_at, k));
        event.suggestion_length = Some(c.text.chars().count());
        event.similarity = Some(1.0);
        self.telemetry.record_suggestion(&event);
        (self.hooks.on_accepted)(&c.text, method);
        Some(c.text)
    }

    /// The user typed or pasted instead. A visible suggestion is recorded as `ignored` and
    /// fires `on_dismissed`. A pending one (not drawn yet) is dropped silently: the user never
    /// saw it, so it counts neither as ignored nor as shown, and nothing was started on it.
    pub fn dismiss(&mut self, now: Instant) {
        let Some(c) = self.current.take() else { return };
        let Some(shown_at) = c.shown_at else { return };
        let mut event = PromptSuggestionEvent::new(SuggestionEventOutcome::Ignored, &c.prompt_id);
        event.time_to_ignore_ms = Some(ms(shown_at, now));
        event.time_to_first_keystroke_ms = c.first_keystroke.map(|k| ms(shown_at, k));
        event.suggestion_length = Some(c.text.chars().count());
        event.similarity = Some(0.0);
        self.telemetry.record_suggestion(&event);
        (self.hooks.on_dismissed)(&c.text);
    }

    /// Hard reset (a new answer, `/clear`): a visible suggestion counts as ignored, a pending
    /// one is dropped. The accept debounce survives, so an accept right after a reset is still
    /// refused.
    pub fn clear(&mut self, now: Instant) {
        self.dismiss(now);
    }

    /// Record that a suggestion was dropped by filter rule (or guard) `reason`.
    pub fn suppressed(&self, reason: &str, prompt_id: &str) {
        self.telemetry
            .record_suggestion(&PromptSuggestionEvent::suppressed(reason, prompt_id));
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::{Arc, Mutex};

    use super::*;

    type Log = Arc<Mutex<Vec<String>>>;

    struct Fixture {
        ctl: FollowupController,
        log: Log,
        file: PathBuf,
        _dir: tempfile::TempDir,
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().expect("tmp");
        let log: Log = Arc::default();
        let (a, b, c) = (log.clone(), log.clone(), log.clone());
        let hooks = FollowupHooks {
            on_shown: Box::new(move |t| a.lock().expect("log").push(format!("shown {t}"))),
            on_accepted: Box::new(move |t, m| {
                b.lock()
                    .expect("log")
                    .push(format!("accepted {t} {}", m.as_str()))
            }),
            on_dismissed: Box::new(move |t| c.lock().expect("log").push(format!("dismissed {t}"))),
        };
        let telemetry = Telemetry::new(dir.path(), 42);
        let file = dir.path().join(super::super::telemetry::TELEMETRY_FILE);
        Fixture {
            ctl: FollowupController::new(hooks, telemetry),
            log,
            file,
            _dir: dir,
        }
    }

    impl Fixture {
        fn hooks(&self) -> Vec<String> {
            self.log.lock().expect("log").clone()
        }
        fn events(&self) -> Vec<serde_json::Value> {
            std::fs::read_to_string(&self.file)
                .unwrap_or_default()
                .lines()
                .map(|l| serde_json::from_str(l).expect("json"))
                .collect()
        }
    }

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn shown_after_the_delay_then_accepted_with_tab() {
        let mut f = fixture();
        let t0 = Instant::now();
        f.ctl.set_suggestion(Some("run the tests".into()), t0);
        assert_eq!(f.ctl.due(), Some(at(t0, 300)));
        assert_eq!(f.ctl.pending(), Some("run the tests"));
        assert!(!f.ctl.tick(at(t0, 299)), "not before 300 ms");
        assert_eq!(f.ctl.visible(), None);
        assert!(f.ctl.tick(at(t0, 300)));
        assert!(!f.ctl.tick(at(t0, 301)), "already visible");
        assert_eq!(f.ctl.due(), None);
        assert_eq!(f.ctl.visible(), Some("run the tests"));
        f.ctl.keystroke(at(t0, 700));
        let got = f.ctl.accept(AcceptMethod::Tab, at(t0, 800));
        assert_eq!(got.as_deref(), Some("run the tests"));
        assert_eq!(f.ctl.visible(), None);
        assert_eq!(
            f.hooks(),
            ["shown run the tests", "accepted run the tests tab"]
        );
        let e = f.events();
        assert_eq!(e.len(), 1);
        assert_eq!(e[0]["event"], "prompt_suggestion");
        assert_eq!(e[0]["outcome"], "accepted");
        assert_eq!(e[0]["accept_method"], "tab");
        assert_eq!(e[0]["time_to_accept_ms"], 500);
        assert_eq!(e[0]["time_to_first_keystroke_ms"], 400);
        assert_eq!(e[0]["suggestion_length"], 13);
        assert_eq!(e[0]["similarity"], 1.0);
        assert_eq!(e[0]["prompt_id"], "prompt_suggestion");
        assert_eq!(e[0]["session"], "000000000000002a");
    }

    #[test]
    fn enter_and_right_accept_and_say_how() {
        for method in [AcceptMethod::Enter, AcceptMethod::Right] {
            let mut f = fixture();
            let t0 = Instant::now();
            f.ctl.set_suggestion(Some("commit this".into()), t0);
            f.ctl.tick(at(t0, 300));
            assert_eq!(
                f.ctl.accept(method, at(t0, 350)).as_deref(),
                Some("commit this")
            );
            assert_eq!(f.events()[0]["accept_method"], method.as_str());
        }
        assert!(AcceptMethod::Enter.submits());
        assert!(!AcceptMethod::Tab.submits() && !AcceptMethod::Right.submits());
    }

    #[test]
    fn shift_tab_is_not_an_accept_method() {
        for key in ["shift+tab", "backtab", "BackTab", "s-tab", "space", ""] {
            assert!(key.parse::<AcceptMethod>().is_err(), "{key}");
        }
        let names: Vec<_> = AcceptMethod::ALL
            .iter()
            .map(|m| serde_json::to_string(m).expect("json"))
            .collect();
        assert_eq!(names, ["\"tab\"", "\"enter\"", "\"right\""]);
        for m in AcceptMethod::ALL {
            assert_eq!(m.as_str().parse::<AcceptMethod>(), Ok(m));
        }
    }

    #[test]
    fn nothing_to_accept_before_it_is_visible() {
        let mut f = fixture();
        let t0 = Instant::now();
        assert_eq!(f.ctl.accept(AcceptMethod::Tab, t0), None);
        f.ctl.set_suggestion(Some("push it".into()), t0);
        assert_eq!(f.ctl.accept(AcceptMethod::Enter, at(t0, 100)), None);
        assert_eq!(
            f.ctl.pending(),
            Some("push it"),
            "a refused accept keeps it"
        );
        assert!(f.hooks().is_empty());
        assert!(f.events().is_empty());
    }

    #[test]
    fn accept_is_debounced() {
        let mut f = fixture();
        let t0 = Instant::now();
        f.ctl.set_suggestion(Some("commit this".into()), t0);
        f.ctl.tick(at(t0, 300));
        assert!(f.ctl.accept(AcceptMethod::Tab, at(t0, 400)).is_some());
        // A speculation's pipelined suggestion appears at once under the finger...
        f.ctl.show_now(
            "push it".into(),
            prompt_id::PIPELINED_SUGGESTION,
            at(t0, 420),
        );
        assert_eq!(f.ctl.visible(), Some("push it"));
        // ...and a repeated Tab 50 ms after the first accept must not take it.
        assert_eq!(f.ctl.accept(AcceptMethod::Tab, at(t0, 450)), None);
        assert_eq!(f.ctl.accept(AcceptMethod::Enter, at(t0, 499)), None);
        assert_eq!(f.ctl.visible(), Some("push it"));
        // 100 ms after the first accept it may.
        assert_eq!(
            f.ctl.accept(AcceptMethod::Enter, at(t0, 500)).as_deref(),
            Some("push it")
        );
        let e = f.events();
        assert_eq!(e.len(), 2);
        assert_eq!(e[1]["prompt_id"], "pipelined_suggestion");
        assert_eq!(e[1]["time_to_accept_ms"], 80);
        assert_eq!(
            f.hooks(),
            [
                "shown commit this",
                "accepted commit this tab",
                "shown push it",
                "accepted push it enter"
            ]
        );
    }

    #[test]
    fn typing_dismisses_a_visible_suggestion() {
        let mut f = fixture();
        let t0 = Instant::now();
        f.ctl.set_suggestion(Some("run the tests".into()), t0);
        f.ctl.tick(at(t0, 310));
        f.ctl.keystroke(at(t0, 910));
        f.ctl.dismiss(at(t0, 910));
        assert_eq!(f.ctl.visible(), None);
        assert_eq!(f.ctl.accept(AcceptMethod::Tab, at(t0, 2000)), None);
        assert_eq!(
            f.hooks(),
            ["shown run the tests", "dismissed run the tests"]
        );
        let e = f.events();
        assert_eq!(e.len(), 1);
        assert_eq!(e[0]["outcome"], "ignored");
        assert_eq!(e[0]["time_to_ignore_ms"], 600);
        assert_eq!(e[0]["time_to_first_keystroke_ms"], 600);
        assert_eq!(e[0]["similarity"], 0.0);
        assert_eq!(e[0]["accept_method"], serde_json::Value::Null);
    }

    #[test]
    fn a_pending_suggestion_is_dropped_silently() {
        let mut f = fixture();
        let t0 = Instant::now();
        f.ctl.set_suggestion(Some("run the tests".into()), t0);
        f.ctl.keystroke(at(t0, 100));
        f.ctl.dismiss(at(t0, 100));
        assert_eq!(f.ctl.due(), None);
        assert!(!f.ctl.tick(at(t0, 400)), "never shown after typing started");
        assert!(f.hooks().is_empty());
        assert!(f.events().is_empty());
    }

    #[test]
    fn clear_and_none_reset_and_a_visible_one_counts_as_ignored() {
        let mut f = fixture();
        let t0 = Instant::now();
        f.ctl.set_suggestion(Some("one two".into()), t0);
        f.ctl.clear(at(t0, 10));
        assert_eq!((f.ctl.pending(), f.ctl.due()), (None, None));
        f.ctl.set_suggestion(Some("three four".into()), at(t0, 20));
        f.ctl.tick(at(t0, 320));
        f.ctl.set_suggestion(None, at(t0, 400));
        assert_eq!(f.ctl.visible(), None);
        // A new suggestion replaces a visible one: the old one was ignored.
        f.ctl.set_suggestion(Some("five six".into()), at(t0, 500));
        f.ctl.tick(at(t0, 800));
        f.ctl
            .set_suggestion(Some("seven eight".into()), at(t0, 900));
        assert_eq!(f.ctl.pending(), Some("seven eight"));
        assert_eq!(
            f.hooks(),
            [
                "shown three four",
                "dismissed three four",
                "shown five six",
                "dismissed five six"
            ]
        );
        let e = f.events();
        assert_eq!(e.len(), 2);
        assert!(e.iter().all(|e| e["outcome"] == "ignored"));
        assert_eq!(e[0]["time_to_ignore_ms"], 80);
    }

    #[test]
    fn suppressed_is_recorded_with_its_rule() {
        let f = fixture();
        f.ctl.suppressed("evaluative", prompt_id::PROMPT_SUGGESTION);
        let e = f.events();
        assert_eq!(e[0]["outcome"], "suppressed");
        assert_eq!(e[0]["reason"], "evaluative");
        assert_eq!(e[0]["prompt_id"], "prompt_suggestion");
        assert!(f.hooks().is_empty());
    }

    #[test]
    fn shareable_with_the_repl_tasks() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<FollowupController>();
        send_sync::<Telemetry>();
        send_sync::<super::super::SessionPrefix>();
        send_sync::<super::super::CacheSafeParams>();
    }

    #[test]
    fn typing_then_enter_does_not_accept() {
        // The peer's #2872: Enter raced the input buffer. Here a typed key dismisses first, so
        // the Enter that follows submits what was typed, not the suggestion.
        let mut f = fixture();
        let t0 = Instant::now();
        f.ctl.set_suggestion(Some("run the tests".into()), t0);
        f.ctl.tick(at(t0, 300));
        f.ctl.keystroke(at(t0, 400));
        f.ctl.dismiss(at(t0, 400));
        f.ctl.keystroke(at(t0, 401));
        assert_eq!(f.ctl.accept(AcceptMethod::Enter, at(t0, 401)), None);
        assert_eq!(f.events()[0]["outcome"], "ignored");
    }

    #[test]
    fn disabled_telemetry_still_drives_the_hooks() {
        let mut ctl = FollowupController::new(FollowupHooks::default(), Telemetry::disabled());
        let t0 = Instant::now();
        ctl.set_suggestion(Some("run it".into()), t0);
        ctl.tick(at(t0, 300));
        assert_eq!(
            ctl.accept(AcceptMethod::Right, at(t0, 301)).as_deref(),
            Some("run it")
        );
    }
}
