//! The chat's side of speculation: start one when a suggestion is shown, drop it when the
//! user types something else, and on accept write its branch and show its turn as if it had
//! just run — or, when it cannot be used, run the prompt live as if there had been none.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use shade_agent::approval::ApprovalMode;
use shade_agent::background::BackgroundLlm;
use shade_agent::followup::cache::CacheSafeParams;
use shade_agent::followup::telemetry::{SpeculationEventOutcome, Telemetry};
use shade_agent::shadow::Leftover;
use shade_agent::speculation::{Finished, Speculation, Start, Status};
use shade_agent::tools::text::plural;
use shade_agent::{Agent, AgentEvent, EventSink};
use shade_fusefs::AcceptError;

use super::approve::Confirm;

/// What the next speculation starts from; refreshed after every turn.
#[derive(Clone)]
pub(crate) struct Template {
    pub prefix: CacheSafeParams,
    pub agent: Agent,
    pub background: BackgroundLlm,
    pub project: std::path::PathBuf,
    /// `--shadow`: the session's branch, which speculations branch off.
    pub base: Option<shade_agent::ShadowBase>,
    pub mode: ApprovalMode,
    pub pipeline: bool,
    pub telemetry: Telemetry,
}

/// Holds at most one speculation, started by the controller's "shown" hook and dropped by
/// its "dismissed" hook.
pub(crate) struct Speculator {
    template: Mutex<Option<Template>>,
    current: Mutex<Option<Speculation>>,
    /// Aborts under way (joined before the session ends, so no branch outlives it).
    aborting: Mutex<Vec<std::thread::JoinHandle<()>>>,
    runtime: tokio::runtime::Handle,
    /// The sandbox is not available: said once, then no speculation starts.
    refused: std::sync::atomic::AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Speculator {
    pub fn new(runtime: tokio::runtime::Handle) -> Arc<Self> {
        Arc::new(Self {
            template: Mutex::new(None),
            current: Mutex::new(None),
            aborting: Mutex::new(Vec::new()),
            runtime,
            refused: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Speculations start from `template` from now on (`None`: none start).
    pub fn prepare(&self, template: Option<Template>) {
        *lock(&self.template) = template;
    }

    /// The "shown" hook.
    pub fn on_shown(&self, suggestion: &str) {
        let Some(t) = lock(&self.template).clone() else {
            return;
        };
        // A speculation runs the model's commands before anyone approved them: never
        // without the sandbox. Said once per session.
        if let Err(why) = shade_fusefs::sandbox::probe() {
            if !self
                .refused
                .swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                eprintln!("shade: not speculating: {why}");
            }
            return;
        }
        let spec = Speculation::start(
            Start {
                suggestion: suggestion.to_string(),
                prefix: t.prefix,
                agent: t.agent,
                background: t.background,
                project: t.project,
                base: t.base,
                mode: t.mode,
                pipeline: t.pipeline,
                telemetry: t.telemetry,
            },
            &self.runtime,
        );
        if let Some(old) = lock(&self.current).replace(spec) {
            self.abort_in_background(old);
        }
    }

    /// The "dismissed" hook (typing, paste, a new answer, /clear).
    pub fn on_dismissed(&self) {
        if let Some(s) = lock(&self.current).take() {
            self.abort_in_background(s);
        }
    }

    /// Take the speculation for the submitted `text`: only when it speculated exactly that.
    /// Any other is aborted.
    pub fn take_for(&self, text: &str) -> Option<Speculation> {
        let spec = lock(&self.current).take()?;
        if spec.suggestion() == text {
            Some(spec)
        } else {
            self.abort_in_background(spec);
            None
        }
    }
}

impl Speculator {
    /// Killing commands and unmounting take a moment: never on the key handler's thread.
    fn abort_in_background(&self, spec: Speculation) {
        let mut aborting = lock(&self.aborting);
        aborting.retain(|h| !h.is_finished());
        aborting.push(std::thread::spawn(move || spec.abort()));
    }

    /// Unmount an accepted branch in the background (joined at shutdown), so the user's
    /// result does not wait for it.
    pub fn dispose(&self, leftover: Box<Leftover>) {
        let mut aborting = lock(&self.aborting);
        aborting.retain(|h| !h.is_finished());
        aborting.push(std::thread::spawn(move || drop(leftover)));
    }

    /// Before the session's branch is accepted or aborted: the current speculation (if any)
    /// dropped and every abort and disposal finished, so no branch of it is mounted.
    pub fn settle(&self) {
        if let Some(s) = lock(&self.current).take() {
            s.abort();
        }
        for h in std::mem::take(&mut *lock(&self.aborting)) {
            let _ = h.join();
        }
    }

    /// At the end of the session: no new speculation, the current one aborted, and every
    /// abort finished (nothing left mounted).
    pub fn shutdown(&self) {
        self.prepare(None);
        self.settle();
    }

    /// [`Speculator::shutdown`] for a process that must end (a signal): the aborts are given
    /// `limit` to finish; what is still mounted then is detached by
    /// `shade_fusefs::unmount_all_before_exit`.
    pub fn shutdown_within(&self, limit: std::time::Duration) {
        self.prepare(None);
        if let Some(s) = lock(&self.current).take() {
            self.abort_in_background(s);
        }
        let deadline = std::time::Instant::now() + limit;
        let handles = std::mem::take(&mut *lock(&self.aborting));
        while std::time::Instant::now() < deadline && !handles.iter().all(|h| h.is_finished()) {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        for h in handles.into_iter().filter(|h| h.is_finished()) {
            let _ = h.join();
        }
    }
}

/// What accepting a speculation came to.
pub(crate) enum Accepted {
    /// Its turn is in the conversation and its files in the project. `continue_live`: it
    /// stopped at a boundary, the live turn goes on from there. `next`: the pipelined
    /// suggestion.
    Applied {
        continue_live: bool,
        next: Option<String>,
        /// The written branch, still mounted: for [`Speculator::dispose`].
        leftover: Box<Leftover>,
    },
    /// Not used (failed, conflict): run the prompt live. The reason was printed.
    RunLive,
    /// The user said no to its changes: dropped, nothing written, nothing run.
    Declined,
    /// The user cancelled (Ctrl-C while it was finishing, or at the question): dropped.
    Cancelled,
}

/// How accept asks: the session's mode, the tools the user allowed for the session
/// ("always"), and the question itself.
pub(crate) struct Asking<'a> {
    pub mode: ApprovalMode,
    pub allowed: &'a dyn Fn(&str) -> bool,
    pub ask: &'a dyn Fn(&str) -> Confirm,
    /// `--shadow`: the speculation is written into the session's branch, not the project.
    pub into_branch: bool,
}

/// Accept `spec` for the session: wait for it if it is still running (showing its turn as
/// it goes), ask once where the approval mode would have asked, write the branch
/// (conflict-checked, atomic), and append its messages to `conversation`.
pub(crate) fn accept(
    spec: Speculation,
    conversation: &mut Vec<shade_llm::Message>,
    asking: Asking<'_>,
    sink: &EventSink,
    runtime: &tokio::runtime::Handle,
    telemetry: &Telemetry,
) -> Accepted {
    let mut accepted_at = Instant::now();
    let was_running = !spec.status().is_finished();
    // Still running: show its turn as it goes, as a live turn would show.
    if was_running {
        let mut shown = 0;
        let cancelled = runtime.block_on(async {
            // One listener for the whole wait: a Ctrl-C between two events is not lost.
            let ctrl_c = tokio::signal::ctrl_c();
            tokio::pin!(ctrl_c);
            loop {
                let (events, done) = spec.events_since(shown);
                shown += events.len();
                for e in events {
                    render(sink, e);
                }
                if done {
                    return false;
                }
                tokio::select! {
                    _ = spec.changed() => {}
                    _ = &mut ctrl_c => return true,
                }
            }
        });
        if cancelled {
            spec.abort();
            return Accepted::Cancelled;
        }
    }
    let finished = match spec.finish() {
        Ok(f) => f,
        Err(not_ready) => {
            let (spec, status) = *not_ready;
            let why = match &status {
                Status::Failed(e) => format!("it failed ({e})"),
                _ => "it did not finish".to_string(),
            };
            eprintln!("shade: the speculated turn is not used: {why}; running it live");
            spec.abort();
            return Accepted::RunLive;
        }
    };
    // A conflict is found before anything is shown or asked.
    if let Err(e) = finished.check() {
        telemetry.record_speculation(&finished.event(SpeculationEventOutcome::Failed, None));
        report_not_applied(&e);
        drop_finished(finished);
        return Accepted::RunLive;
    }
    // What it did comes first, as a live turn would have shown it; the question follows.
    if !was_running {
        for e in finished.events.iter().cloned() {
            render(sink, e);
        }
    }
    let changes = finished.shadow.changeset(false);
    let outside = finished.shadow.outside();
    let would_ask = finished
        .would_ask
        .iter()
        .any(|tool| !(asking.allowed)(tool));
    if would_ask
        && asking.mode != ApprovalMode::Yolo
        && !(changes.changes.is_empty() && outside.is_empty())
    {
        let mut shown = String::new();
        for c in &changes.changes {
            shown.push_str(&format!("{c}\n"));
        }
        if let Some(line) = crate::outside::summary(&outside, 10) {
            shown.push_str(&format!("{line}\n"));
        }
        shown.push_str(&finished.shadow.diff(&changes));
        shown.push_str(&crate::outside::diff(&outside));
        let asked_at = Instant::now();
        let answer = (asking.ask)(&shown);
        // The time the user took to answer is neither the write's nor lost to speculation.
        accepted_at += asked_at.elapsed();
        if answer != Confirm::Yes {
            telemetry.record_speculation(&finished.event(SpeculationEventOutcome::Aborted, None));
            drop_finished(finished);
            if answer == Confirm::Cancel {
                return Accepted::Cancelled;
            }
            eprintln!(
                "shade: nothing written; the speculated changes are dropped (Up and Enter runs \
                 the prompt again live, asking at each step)"
            );
            return Accepted::Declined;
        }
    }
    // Its size before accept (the changeset is empty afterwards).
    let accepted_event = finished.event(SpeculationEventOutcome::Accepted, None);
    let failed_event = finished.event(SpeculationEventOutcome::Failed, None);
    let result = runtime.block_on(async {
        let mut appended = conversation.clone();
        tokio::task::spawn_blocking(move || finished.apply(&mut appended).map(|a| (a, appended)))
            .await
    });
    match result {
        Ok(Ok((applied, appended))) => {
            *conversation = appended;
            let saved = applied.duration.saturating_sub(accepted_at.elapsed());
            let mut event = accepted_event;
            event.time_saved_ms = Some(saved.as_millis() as u64);
            telemetry.record_speculation(&event);
            let written = plural(applied.files, "change");
            let place = if asking.into_branch {
                " into the session's branch"
            } else {
                ""
            };
            if let Some(note) = &applied.privileges_note {
                eprintln!("shade: {note}");
            }
            if !was_running {
                let ms = accepted_at.elapsed().as_millis();
                eprintln!("shade: speculated ahead: {written} written{place} in {ms} ms");
            } else if applied.files > 0 {
                eprintln!("shade: {written} written{place}");
            }
            // Its writes outside the project stay in its branch, dropped with it: said, so
            // that a cache or config the speculated commands wrote is not thought kept.
            if let Some(line) = crate::outside::summary(&outside, 5) {
                eprintln!(
                    "shade: not written ({line}): an accepted speculation writes the project only"
                );
            }
            Accepted::Applied {
                continue_live: matches!(applied.status, Status::Boundary(_)),
                next: applied.pipelined,
                leftover: Box::new(applied.leftover),
            }
        }
        Ok(Err(e)) => {
            telemetry.record_speculation(&failed_event);
            report_not_applied(&e);
            Accepted::RunLive
        }
        Err(e) => {
            telemetry.record_speculation(&failed_event);
            eprintln!("shade: speculation not applied ({e}); running live");
            Accepted::RunLive
        }
    }
}

/// Say why the speculated changes were not written (nothing was).
fn report_not_applied(e: &AcceptError) {
    match e {
        AcceptError::Conflicts(list) => {
            eprintln!(
                "shade: speculation not applied ({} changed meanwhile); running live",
                plural(list.len(), "path")
            );
            for c in list {
                eprintln!("  {}", crate::review::conflicts::conflict_line(c));
            }
        }
        other if other.nothing_written() => {
            eprintln!("shade: speculation not applied ({other}); running live")
        }
        other => eprintln!("shade: speculation {other}"),
    }
}

fn render(sink: &EventSink, e: AgentEvent) {
    sink(e)
}

fn drop_finished(finished: Finished) {
    std::thread::spawn(move || drop(finished));
}
