//! The speculation engine: the moment a suggestion is shown, run it — a fork of the
//! conversation with the same cacheable prefix, the fast model, thinking off — in a fresh
//! branch of the project, so that when the user accepts the suggestion the result is already
//! there. Unlike the peer's temp-dir overlay, the branch is a real mount: a speculative
//! `cargo test` or `make` runs inside it at the project's real path, network off, and its
//! effects are accepted or dropped with the branch.
//!
//! States: running → completed | boundary | failed, or aborted at any time. The caller (the
//! chat) accepts a finished speculation with [`Speculation::finish`] and writes its branch,
//! or drops it with [`Speculation::abort`].

pub mod gate;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::approval::ApprovalMode;
use crate::background::{prompt_id, BackgroundLlm};
use crate::events::{AgentEvent, StopReason};
use crate::followup::cache::CacheSafeParams;
use crate::followup::generate::{generate_pipelined, SuggestionOutcome};
use crate::followup::telemetry::{SpeculationEvent, SpeculationEventOutcome, Telemetry};
use crate::llm::{Message, Usage};
use crate::query_loop::{Agent, CallGate, EventSink, GateCall};
use crate::shadow::{Shadow, ShadowBase, ShadowOptions};
pub use gate::{SpeculationGate, MAX_SPECULATION_MESSAGES};
use shade_fusefs::{AcceptError, AcceptFlags};

/// Model calls a speculation may make (the seed's MAX_SPECULATION_TURNS).
pub const MAX_SPECULATION_TURNS: u32 = 20;

/// How long one speculative command may run.
pub const COMMAND_TIME_LIMIT: Duration = Duration::from_secs(300);

/// Where a speculation stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Still working.
    Running,
    /// The model answered: the whole turn is in the branch.
    Completed,
    /// Stopped before a call it may not make; what ran before it is kept.
    Boundary(String),
    /// A model call or the branch failed.
    Failed(String),
    /// Cancelled.
    Aborted,
}

impl Status {
    /// No longer running.
    pub fn is_finished(&self) -> bool {
        !matches!(self, Status::Running)
    }
}

/// What a speculation needs to start.
pub struct Start {
    /// The suggestion it runs as the user's next input.
    pub suggestion: String,
    /// The saved prefix of the main conversation.
    pub prefix: CacheSafeParams,
    /// The main agent (tools, memory paths, background handle), forked into the branch.
    pub agent: Agent,
    /// Background calls: the fast model, for the turns and the pipelined suggestion.
    pub background: BackgroundLlm,
    /// The real project.
    pub project: PathBuf,
    /// In a `--shadow` session, the session's branch: the speculation branches off it (it
    /// sees the session's unaccepted edits) and its accept writes there, not into the project.
    pub base: Option<ShadowBase>,
    /// The user's approval mode.
    pub mode: ApprovalMode,
    /// Compute the next suggestion when the speculation completes.
    pub pipeline: bool,
    /// Where outcomes are logged.
    pub telemetry: Telemetry,
}

/// A speculation written into the project.
pub struct Applied {
    /// Completed, or stopped at a boundary (the live turn continues from there).
    pub status: Status,
    /// The next suggestion, computed from the speculated turn (completed ones only).
    pub pipelined: Option<String>,
    /// How long the speculation ran.
    pub duration: Duration,
    /// Paths it changed.
    pub files: usize,
    /// What accept left out on purpose (see `AcceptReport::privileges_note`), to be said.
    pub privileges_note: Option<String>,
    /// The branch, still mounted: drop it (off the caller's critical path) to unmount.
    pub leftover: crate::shadow::Leftover,
}

impl Finished {
    /// Would [`Finished::apply`] be refused (the project changed under paths it touched)?
    pub fn check(&self) -> Result<(), AcceptError> {
        self.shadow.check_accept(AcceptFlags::default())
    }

    /// Write the branch into the project (conflict-checked, atomic; blocking) and, only once
    /// the files are there, append the speculated messages to `conversation`.
    pub fn apply(self, conversation: &mut Vec<Message>) -> Result<Applied, AcceptError> {
        let files = self.shadow.changeset(false).changes.len();
        let (report, leftover) = self.shadow.accept_then_clean(AcceptFlags::default())?;
        conversation.extend(self.messages);
        let boundary = matches!(self.status, Status::Boundary(_));
        Ok(Applied {
            pipelined: if boundary { None } else { self.pipelined },
            status: self.status,
            duration: self.duration,
            files,
            privileges_note: report.privileges_note(),
            leftover,
        })
    }

    /// The telemetry line for this speculation's outcome.
    pub fn event(
        &self,
        outcome: SpeculationEventOutcome,
        time_saved: Option<Duration>,
    ) -> SpeculationEvent {
        let mut e = SpeculationEvent::new(outcome);
        e.turns_used = self.turns;
        e.files_written = self.shadow.changeset(false).changes.len() as u32;
        e.tool_use_count = self.tool_uses as u32;
        e.duration_ms = self.duration.as_millis() as u64;
        e.boundary_type = match &self.status {
            Status::Boundary(b) => Some(b.clone()),
            _ => None,
        };
        e.had_pipelined_suggestion = self.pipelined.is_some();
        e.time_saved_ms = time_saved.map(|d| d.as_millis() as u64);
        e
    }
}

/// A finished speculation handed over for accept.
pub struct Finished {
    /// How it ended (completed or boundary; the others are not handed over).
    pub status: Status,
    /// The branch with its work.
    pub shadow: Shadow,
    /// The messages to append to the conversation: the user's (the suggestion), then the
    /// assistant's and the tools', every call paired with its result.
    pub messages: Vec<Message>,
    /// What a live turn would have printed, to render on accept.
    pub events: Vec<AgentEvent>,
    /// The tools whose calls the approval mode would have asked about live (none: empty).
    pub would_ask: Vec<String>,
    /// The suggestion after this one, when computed.
    pub pipelined: Option<String>,
    /// Model calls made.
    pub turns: u32,
    /// Tool calls run.
    pub tool_uses: usize,
    /// How long it ran.
    pub duration: Duration,
    /// Tokens spent.
    pub usage: Usage,
}

struct State {
    status: Status,
    events: Vec<AgentEvent>,
    messages: Vec<Message>,
    shadow: Option<Shadow>,
    pipelined: Option<String>,
    would_ask: Vec<String>,
    turns: u32,
    usage: Usage,
    finished_at: Option<Instant>,
}

struct Shared {
    state: Mutex<State>,
    changed: Notify,
}

/// A running (or finished) speculation. Dropping it aborts it.
pub struct Speculation {
    suggestion: String,
    shared: Arc<Shared>,
    cancel: CancellationToken,
    started: Instant,
    telemetry: Telemetry,
    /// Set once accepted or aborted (so drop does nothing more).
    closed: bool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Speculation {
    /// Create the branch and start the forked run on `runtime`.
    pub fn start(start: Start, runtime: &tokio::runtime::Handle) -> Speculation {
        Self::start_gated(start, None, runtime)
    }

    /// [`Speculation::start`] with an extra gate consulted before shade's own: a call either
    /// refuses is a boundary. The speculation benchmark plays the peer's stricter strategy
    /// (stop at the first writing shell command) through it, with the engine unchanged.
    pub fn start_gated(
        start: Start,
        extra: Option<Arc<dyn CallGate>>,
        runtime: &tokio::runtime::Handle,
    ) -> Speculation {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                status: Status::Running,
                events: Vec::new(),
                messages: Vec::new(),
                shadow: None,
                pipelined: None,
                would_ask: Vec::new(),
                turns: 0,
                usage: Usage::default(),
                finished_at: None,
            }),
            changed: Notify::new(),
        });
        let cancel = CancellationToken::new();
        let spec = Speculation {
            suggestion: start.suggestion.clone(),
            shared: shared.clone(),
            cancel: cancel.clone(),
            started: Instant::now(),
            telemetry: start.telemetry.clone(),
            closed: false,
        };
        runtime.spawn(async move {
            let status = run(start, extra, &shared, &cancel).await;
            let mut st = lock(&shared.state);
            if st.status == Status::Running {
                st.status = status;
            }
            st.finished_at = Some(Instant::now());
            drop(st);
            shared.changed.notify_waiters();
        });
        spec
    }

    /// The suggestion being speculated.
    pub fn suggestion(&self) -> &str {
        &self.suggestion
    }

    /// Where it stands.
    pub fn status(&self) -> Status {
        lock(&self.shared.state).status.clone()
    }

    /// Tokens spent so far (what is lost if it is dropped).
    pub fn usage(&self) -> Usage {
        lock(&self.shared.state).usage.clone()
    }

    /// Events from index `from` on, and whether the speculation has finished.
    pub fn events_since(&self, from: usize) -> (Vec<AgentEvent>, bool) {
        let st = lock(&self.shared.state);
        let events = st.events.get(from..).map(<[_]>::to_vec).unwrap_or_default();
        (events, st.status.is_finished())
    }

    /// Wait until something new happens (an event, or the end).
    pub async fn changed(&self) {
        let notified = self.shared.changed.notified();
        tokio::pin!(notified);
        if lock(&self.shared.state).status.is_finished() {
            return;
        }
        let _ = tokio::time::timeout(Duration::from_millis(200), notified).await;
    }

    /// Wait until it has finished.
    pub async fn wait(&self) {
        while !lock(&self.shared.state).status.is_finished() {
            self.changed().await;
        }
    }

    /// Take a finished completed-or-boundary speculation for accept; `Err(self)` while it
    /// runs, or when it failed or was aborted (with the status).
    pub fn finish(mut self) -> Result<Finished, Box<(Speculation, Status)>> {
        let status = self.status();
        if !matches!(status, Status::Completed | Status::Boundary(_)) {
            return Err(Box::new((self, status)));
        }
        let mut st = lock(&self.shared.state);
        let Some(shadow) = st.shadow.take() else {
            drop(st);
            return Err(Box::new((
                self,
                Status::Failed("the branch is gone".into()),
            )));
        };
        let tool_uses = count_tool_uses(&st.events);
        let finished = Finished {
            status,
            shadow,
            messages: std::mem::take(&mut st.messages),
            events: std::mem::take(&mut st.events),
            would_ask: std::mem::take(&mut st.would_ask),
            pipelined: st.pipelined.take(),
            turns: st.turns,
            tool_uses,
            duration: st
                .finished_at
                .unwrap_or_else(Instant::now)
                .duration_since(self.started),
            usage: st.usage.clone(),
        };
        drop(st);
        self.closed = true;
        Ok(finished)
    }

    /// Cancel the model call, kill the branch's processes, drop the branch (nothing left
    /// mounted or on disk) and log the outcome.
    pub fn abort(mut self) {
        self.close(SpeculationEventOutcome::Aborted);
    }

    fn close(&mut self, outcome: SpeculationEventOutcome) {
        if self.closed {
            return;
        }
        self.closed = true;
        self.cancel.cancel();
        let mut st = lock(&self.shared.state);
        if st.status == Status::Running {
            st.status = Status::Aborted;
        }
        let shadow = st.shadow.take();
        let mut event = SpeculationEvent::new(outcome);
        event.turns_used = st.turns;
        event.tool_use_count = count_tool_uses(&st.events) as u32;
        event.duration_ms = self.started.elapsed().as_millis() as u64;
        event.boundary_type = match &st.status {
            Status::Boundary(b) => Some(b.clone()),
            _ => None,
        };
        event.had_pipelined_suggestion = st.pipelined.is_some();
        if let Some(s) = &shadow {
            event.files_written = s.changeset(false).changes.len() as u32;
        }
        drop(st);
        self.telemetry.record_speculation(&event);
        // Killing commands and unmounting block: not on an async worker.
        if let Some(shadow) = shadow {
            let _ = std::thread::spawn(move || shadow.abort()).join();
        }
    }
}

impl Drop for Speculation {
    fn drop(&mut self) {
        self.close(SpeculationEventOutcome::Aborted);
    }
}

fn count_tool_uses(events: &[AgentEvent]) -> usize {
    events
        .iter()
        .filter(|e| matches!(e, AgentEvent::ToolEnd { denied: false, .. }))
        .count()
}

/// An extra gate, then shade's own: the first refusal wins.
struct Gates<'a> {
    extra: Option<&'a dyn CallGate>,
    main: &'a SpeculationGate,
}

impl CallGate for Gates<'_> {
    fn check(&self, call: &GateCall<'_>) -> Option<String> {
        self.extra
            .and_then(|g| g.check(call))
            .or_else(|| self.main.check(call))
    }

    fn message_limit(&self) -> Option<usize> {
        self.main.message_limit()
    }
}

/// The speculative run itself; returns how it ended.
async fn run(
    start: Start,
    extra: Option<Arc<dyn CallGate>>,
    shared: &Arc<Shared>,
    cancel: &CancellationToken,
) -> Status {
    // Its commands run before anyone approved them: only in the sandbox, never without.
    if let Err(why) = shade_fusefs::sandbox::probe() {
        return Status::Failed(format!("not speculating: {why}"));
    }
    let project = start.project.clone();
    let base = start.base.clone();
    let shadow = match tokio::task::spawn_blocking(move || {
        // `[sandbox.speculation]`'s time limit, else the built-in one.
        let limit = shade_fusefs::sandbox::Limits::speculation()
            .time_limit
            .unwrap_or(COMMAND_TIME_LIMIT);
        let options = ShadowOptions::speculative(limit);
        match base {
            Some(base) => base.create_child(options),
            None => Shadow::create_served(&project, options),
        }
    })
    .await
    {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Status::Failed(format!("cannot create a branch: {e}")),
        Err(e) => return Status::Failed(format!("cannot create a branch: {e}")),
    };
    let mut agent = start.agent.fork_into(&shadow, ApprovalMode::Yolo);
    agent.set_model(start.background.model());
    agent.set_max_turns(MAX_SPECULATION_TURNS);
    agent.tag_requests(prompt_id::SPECULATION);
    lock(&shared.state).shadow = Some(shadow);
    if cancel.is_cancelled() {
        return Status::Aborted;
    }
    let mut conversation = start.prefix.fork_messages(Message::User {
        content: start.suggestion.clone(),
    });
    let prefix_len = conversation.len() - 1;
    let sink_shared = shared.clone();
    let sink: EventSink = Arc::new(move |e: AgentEvent| {
        let mut st = lock(&sink_shared.state);
        if let AgentEvent::Usage {
            prompt_tokens,
            completion_tokens,
            cached_tokens,
            ..
        } = &e
        {
            st.usage.prompt_tokens += prompt_tokens;
            st.usage.completion_tokens += completion_tokens;
            st.usage.cached_tokens += cached_tokens;
        }
        if matches!(e, AgentEvent::TurnStart { .. }) {
            st.turns += 1;
        }
        st.events.push(e);
        drop(st);
        sink_shared.changed.notify_waiters();
    });
    let gate = SpeculationGate::new(start.mode);
    let both = Gates {
        extra: extra.as_deref(),
        main: &gate,
    };
    let outcome = agent
        .run_gated(&mut conversation, &sink, cancel, Some(&both))
        .await;
    let new_messages = conversation.split_off(prefix_len);
    let status = match outcome {
        Ok(o) => match o.stop {
            StopReason::Completed => Status::Completed,
            StopReason::Boundary => Status::Boundary(
                o.boundary
                    .map(|b| b.reason)
                    .unwrap_or_else(|| "boundary".into()),
            ),
            StopReason::TurnLimit => Status::Boundary("turn_limit".into()),
            StopReason::Cancelled => Status::Aborted,
            StopReason::Error => Status::Failed("the model call failed".into()),
            StopReason::LoopDetected => Status::Failed("the model repeated itself".into()),
        },
        Err(e) => Status::Failed(e.to_string()),
    };
    {
        let mut st = lock(&shared.state);
        st.messages = new_messages.clone();
        st.would_ask = gate.asked_tools();
    }
    if status == Status::Completed && start.pipeline {
        if let SuggestionOutcome::Suggested(next) = generate_pipelined(
            &start.background,
            &start.prefix,
            &start.suggestion,
            &new_messages,
            cancel,
        )
        .await
        {
            lock(&shared.state).pipelined = Some(next);
        }
    }
    status
}
