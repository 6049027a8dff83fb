//! The query loop of the query-engine seed: stream the model's reply, run the tool calls it
//! asks for (approval first; read-only calls of a turn concurrently, the rest in order), give
//! every call exactly one result, and go again until the model answers or a limit is hit.

use std::sync::Arc;

use futures::future::join_all;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::approval::{decide_call, Answer, ApprovalMode, ApprovalRequest, Approver, Decision};
use crate::events::{AgentEvent, StopReason};
use crate::followup::telemetry::Telemetry;
use crate::llm::{
    ChatRequest, FinishReason, LlmError, LlmEvent, LlmProvider, Message, ToolCall, Usage,
};
use crate::loop_detect::{CallLoops, CallVerdict, ContentLoops, LoopEvent};
use crate::tools::{Tool, ToolContext, ToolError, ToolRegistry};

/// Where events go. `Fn` + `Sync` so tools running concurrently can report.
pub type EventSink = Arc<dyn Fn(AgentEvent) + Send + Sync>;

/// Settings of one agent.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// Model for the conversation.
    pub model: String,
    /// Model calls per run at most.
    pub max_turns: u32,
    /// What may run without asking.
    pub approval: ApprovalMode,
    /// Sampling temperature, if any.
    pub temperature: Option<f32>,
}

impl Default for AgentOptions {
    fn default() -> Self {
        Self {
            model: String::new(),
            max_turns: 50,
            approval: ApprovalMode::Default,
            temperature: None,
        }
    }
}

/// Decides, call by call, whether a run may go on: the speculation engine's tool gate. A
/// call the gate refuses is a *boundary*: the run stops before it, keeping the calls of the
/// same reply that came before it (by position) with their results, and dropping it and
/// every call after it.
pub trait CallGate: Send + Sync {
    /// `None`: the call may run; `Some(reason)`: stop here (`reason` names the boundary, e.g.
    /// `web_fetch` or `shell: curl …`).
    fn check(&self, call: &GateCall<'_>) -> Option<String>;

    /// Stop (as a boundary) once the run has added this many messages.
    fn message_limit(&self) -> Option<usize> {
        None
    }
}

/// What a gate sees of one call.
pub struct GateCall<'a> {
    /// Tool name as the model wrote it.
    pub name: &'a str,
    /// The tool, if it exists.
    pub tool: Option<&'a Arc<dyn Tool>>,
    /// Parsed arguments (`None` when not valid JSON).
    pub args: Option<&'a Value>,
    /// The tool's verdict on these arguments.
    pub read_only: bool,
    /// The context the call would run in.
    pub ctx: &'a ToolContext,
}

/// Where and why a gated run stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Boundary {
    /// The gate's reason.
    pub reason: String,
    /// Calls of the last reply that ran before it.
    pub kept_calls: usize,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
pub struct RunOutcome {
    /// Why it stopped.
    pub stop: StopReason,
    /// Set when `stop` is `Boundary`.
    pub boundary: Option<Boundary>,
    /// Model calls made.
    pub turns: u32,
    /// The last assistant text.
    pub final_text: String,
    /// Tokens over all calls.
    pub usage: Usage,
}

/// A run that could not go on.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AgentError {
    /// A model call failed after retries.
    #[error(transparent)]
    Llm(#[from] LlmError),
}

/// The agent: a provider, tools over a workspace, an approval policy.
#[derive(Clone)]
pub struct Agent {
    provider: Arc<dyn LlmProvider>,
    tools: ToolRegistry,
    ctx: ToolContext,
    approver: Arc<dyn Approver>,
    options: AgentOptions,
    /// Internal prompt id of a background agent (speculation): its requests are tagged as
    /// background work (thinking off, kept out of the main cassette, counted apart).
    request_tag: Option<String>,
    /// Where detected loops are counted (`loop_detected` lines).
    telemetry: Telemetry,
}

#[derive(Clone)]
struct Planned {
    call: ToolCall,
    tool: Option<Arc<dyn Tool>>,
    args: Result<Value, String>,
    read_only: bool,
    /// [`Tool::outlives_the_branch`]: asked in every mode.
    lasting: bool,
    summary: String,
    /// What [`Tool::prepare`] repaired, for the result.
    note: Option<String>,
}

/// One tool call's result.
struct Outcome {
    ok: bool,
    denied: bool,
    content: String,
    display: String,
}

impl Agent {
    /// Assemble an agent.
    pub fn new(
        provider: Arc<dyn LlmProvider>,
        tools: ToolRegistry,
        ctx: ToolContext,
        approver: Arc<dyn Approver>,
        options: AgentOptions,
    ) -> Self {
        Self {
            provider,
            tools,
            ctx,
            approver,
            options,
            request_tag: None,
            telemetry: Telemetry::disabled(),
        }
    }

    /// Count detected loops in `telemetry` (off until set).
    pub fn set_telemetry(&mut self, telemetry: Telemetry) {
        self.telemetry = telemetry;
    }

    /// The tool context (workspace, todos, memory paths).
    pub fn context(&self) -> &ToolContext {
        &self.ctx
    }

    /// The options in use.
    pub fn options(&self) -> &AgentOptions {
        &self.options
    }

    /// Switch the conversation's model (`/model NAME`); later turns use it.
    pub fn set_model(&mut self, model: impl Into<String>) {
        self.options.model = model.into();
    }

    /// Model calls per run at most.
    pub fn set_max_turns(&mut self, turns: u32) {
        self.options.max_turns = turns;
    }

    /// Make this agent background work: its requests carry `prompt_id` (see
    /// [`crate::background::prompt_id`]) and ask for thinking off.
    pub fn tag_requests(&mut self, prompt_id: &str) {
        self.request_tag = Some(prompt_id.to_string());
    }

    /// Switch the approval mode (`/approval MODE`).
    pub fn set_approval(&mut self, mode: ApprovalMode) {
        self.options.approval = mode;
    }

    /// The tool specs offered to the model, in the order sent (part of the cacheable prefix).
    pub fn tool_specs(&self) -> Vec<crate::llm::ToolSpec> {
        self.tools.specs()
    }

    /// One of the agent's tools, for a caller that runs it on the user's behalf (chat's
    /// `!command` runs `shell` where the agent's commands run, in a branch or not).
    pub fn tool(&self, name: &str) -> Option<std::sync::Arc<dyn crate::tools::Tool>> {
        self.tools.get(name)
    }

    /// Every tool the agent has, for a caller that starts agents like it (chat's `/try`).
    pub fn tools(&self) -> &ToolRegistry {
        &self.tools
    }

    /// The same agent (provider, tools, model, memory paths) working in another workspace —
    /// e.g. a branch mount for a speculative run — with its own todo list and approval mode.
    /// Run it on a clone of the conversation so the request prefix stays identical.
    pub fn fork_onto(
        &self,
        workspace: crate::workspace::Workspace,
        approval: ApprovalMode,
    ) -> Self {
        let mut ctx = self.ctx.clone();
        ctx.workspace = workspace;
        ctx.todos = Default::default();
        // Commands follow the files: a plain workspace runs them directly.
        ctx.shadow = None;
        // Lints belong to a shadow's branch: none here.
        ctx.lint = ctx
            .lint
            .as_ref()
            .map(|h| std::sync::Arc::new(h.bound_to(None)));
        let mut fork = self.clone();
        fork.ctx = ctx;
        fork.options.approval = approval;
        fork
    }

    /// The same agent working in `shadow`: file tools in its branch (paths still shown as
    /// in the project), `shell` in its sandbox, its own todo list and approval mode.
    pub fn fork_into(&self, shadow: &crate::shadow::Shadow, approval: ApprovalMode) -> Self {
        let mut fork = self.clone();
        fork.ctx = shadow.tool_context(&self.ctx);
        fork.options.approval = approval;
        fork
    }

    /// A new conversation: system prompt (with memories) and the user's prompt.
    pub fn start_conversation(&self, prompt: &str) -> Vec<Message> {
        vec![
            Message::System {
                content: crate::prompt::system_prompt(&self.ctx),
            },
            Message::User {
                content: prompt.to_string(),
            },
        ]
    }

    /// Run until the model answers without tools, the turn limit, cancellation or a fatal
    /// model error. `conversation` is extended in place and always stays well-formed: every
    /// assistant tool call is followed by its result.
    pub async fn run(
        &self,
        conversation: &mut Vec<Message>,
        events: &EventSink,
        cancel: &CancellationToken,
    ) -> Result<RunOutcome, AgentError> {
        self.run_gated(conversation, events, cancel, None).await
    }

    /// [`Agent::run`] with a [`CallGate`] deciding each call before approval; stops with
    /// `StopReason::Boundary` at the first call the gate refuses.
    pub async fn run_gated(
        &self,
        conversation: &mut Vec<Message>,
        events: &EventSink,
        cancel: &CancellationToken,
        gate: Option<&dyn CallGate>,
    ) -> Result<RunOutcome, AgentError> {
        let specs = self.tools.specs();
        let start_len = conversation.len();
        let mut usage = Usage::default();
        let mut final_text = String::new();
        let mut turns = 0;
        // After a model switch (context too long, rate limited) later turns stay on the new
        // model instead of failing over again on every call.
        let mut model = self.options.model.clone();
        let switched: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);
        let finish_at = |stop, boundary, turns, final_text: String, usage: Usage| {
            events(AgentEvent::Done {
                reason: stop,
                turns,
            });
            Ok(RunOutcome {
                stop,
                boundary,
                turns,
                final_text,
                usage,
            })
        };
        let finish = |stop, turns, final_text: String, usage: Usage| {
            finish_at(stop, None, turns, final_text, usage)
        };
        let mut call_loops = CallLoops::default();
        let record_loop = |kind, action, tool: Option<&str>, repeats, turns, model: &str| {
            self.telemetry.record(&LoopEvent {
                event: "loop_detected",
                kind,
                action,
                tool: tool.map(str::to_string),
                repeats,
                model_calls: turns,
                model: model.to_string(),
                background: self.request_tag.is_some(),
            });
        };
        loop {
            if cancel.is_cancelled() {
                return finish(StopReason::Cancelled, turns, final_text, usage);
            }
            if turns >= self.options.max_turns {
                events(AgentEvent::Error {
                    message: format!(
                        "stopped after {} model calls (turn limit)",
                        self.options.max_turns
                    ),
                });
                return finish(StopReason::TurnLimit, turns, final_text, usage);
            }
            turns += 1;
            events(AgentEvent::TurnStart {
                turn: turns,
                model: model.clone(),
            });
            let request = ChatRequest {
                model: model.clone(),
                messages: conversation.clone(),
                tools: specs.clone(),
                temperature: self.options.temperature,
                max_tokens: None,
                background: self.request_tag.is_some(),
                prompt_id: self.request_tag.clone(),
            };
            // A reply that repeats one piece of text over and over is cut off at once.
            let call_cancel = cancel.child_token();
            let content_loop: std::sync::Mutex<(ContentLoops, ContentLoops, Option<String>)> =
                Default::default();
            let watch = |delta: &str, reasoning: bool| {
                if let Ok(mut w) = content_loop.lock() {
                    let (text, thinking, found) = &mut *w;
                    if found.is_some() {
                        return;
                    }
                    let detector = if reasoning { thinking } else { text };
                    if let Some(why) = detector.push(delta) {
                        *found = Some(why);
                        call_cancel.cancel();
                    }
                }
            };
            let sink = |e: LlmEvent| match e {
                LlmEvent::Text(text) => {
                    watch(&text, false);
                    events(AgentEvent::TextDelta { text })
                }
                // Reasoning (`reasoning_content`, `<think>`) is never shown or kept.
                LlmEvent::Reasoning(r) => watch(&r, true),
                LlmEvent::Retry {
                    attempt,
                    delay_ms,
                    reason,
                } => events(AgentEvent::Retry {
                    attempt,
                    delay_ms,
                    reason,
                }),
                LlmEvent::ModelSwitch { from, to, reason } => {
                    if let Ok(mut s) = switched.lock() {
                        *s = Some(to.clone());
                    }
                    events(AgentEvent::ModelSwitch { from, to, reason })
                }
            };
            let result = self.provider.complete(&request, &sink, &call_cancel).await;
            let looped = content_loop.lock().ok().and_then(|mut w| w.2.take());
            if let (Some(why), false) = (looped, cancel.is_cancelled()) {
                record_loop(
                    "content",
                    "stopped",
                    None,
                    crate::loop_detect::CONTENT_REPEATS,
                    turns,
                    &model,
                );
                events(AgentEvent::Error { message: why });
                return finish(StopReason::LoopDetected, turns, final_text, usage);
            }
            let mut completion = match result {
                Ok(c) => c,
                Err(LlmError::Cancelled) => {
                    return finish(StopReason::Cancelled, turns, final_text, usage)
                }
                Err(e) => {
                    let message = match e.local_server_hint() {
                        Some(hint) => format!("{e} — {hint}"),
                        None => e.to_string(),
                    };
                    events(AgentEvent::Error { message });
                    events(AgentEvent::Done {
                        reason: StopReason::Error,
                        turns,
                    });
                    return Err(e.into());
                }
            };
            if let Some(to) = switched.lock().ok().and_then(|mut s| s.take()) {
                model = to;
            }
            if let Some(u) = &completion.usage {
                usage.prompt_tokens += u.prompt_tokens;
                usage.completion_tokens += u.completion_tokens;
                usage.cached_tokens += u.cached_tokens;
                events(AgentEvent::Usage {
                    model: completion.model.clone(),
                    prompt_tokens: u.prompt_tokens,
                    completion_tokens: u.completion_tokens,
                    cached_tokens: u.cached_tokens,
                });
            }
            // Tool calls a local model wrote as text (see `llm::text_calls`).
            if completion.tool_calls.is_empty() {
                let prefix = format!("text_call_{turns}_");
                if let Some((text, calls)) =
                    crate::llm::text_calls::extract(&completion.text, &specs, &prefix)
                {
                    completion.text = text;
                    completion.tool_calls = calls;
                    if completion.finish_reason != FinishReason::Length {
                        completion.finish_reason = FinishReason::ToolCalls;
                    }
                }
            }
            final_text = completion.text.clone();
            // The gate decides before anything runs: the calls up to the first refused one
            // run, the rest are dropped from the reply (by position: names repeat).
            let mut calls = completion.tool_calls.clone();
            let mut boundary = None;
            if let Some(gate) = gate {
                let over_limit = gate
                    .message_limit()
                    .is_some_and(|max| conversation.len() + 1 + calls.len() - start_len > max);
                let refused = if over_limit {
                    Some((0, "message_limit".to_string()))
                } else {
                    calls.iter().enumerate().find_map(|(i, c)| {
                        let p = self.plan(c);
                        gate.check(&GateCall {
                            name: &c.name,
                            tool: p.tool.as_ref(),
                            args: p.args.as_ref().ok(),
                            read_only: p.read_only,
                            ctx: &self.ctx,
                        })
                        .map(|reason| (i, reason))
                    })
                };
                if let Some((i, reason)) = refused {
                    calls.truncate(i);
                    boundary = Some(Boundary {
                        reason,
                        kept_calls: i,
                    });
                }
            }
            // Loop detection: the calls up to the first one repeated too often run; the run
            // stops there. Calls repeated a little less run with a note to the model.
            let mut steer: Vec<Option<String>> = Vec::with_capacity(calls.len());
            let mut looped = None;
            for (i, c) in calls.iter().enumerate() {
                match call_loops.check(&c.name, &c.arguments) {
                    (CallVerdict::Run, _) => steer.push(None),
                    (CallVerdict::Steer(note), n) => {
                        record_loop("tool_call", "steered", Some(&c.name), n, turns, &model);
                        steer.push(Some(note));
                    }
                    (CallVerdict::Stop(why), n) => {
                        record_loop("tool_call", "stopped", Some(&c.name), n, turns, &model);
                        looped = Some((i, why));
                        break;
                    }
                }
            }
            if let Some((i, _)) = &looped {
                calls.truncate(*i);
                boundary = None;
            }
            if !(completion.text.is_empty()
                && calls.is_empty()
                && (boundary.is_some() || looped.is_some()))
            {
                conversation.push(Message::Assistant {
                    content: completion.text.clone(),
                    tool_calls: calls.clone(),
                });
            }
            if calls.is_empty() && boundary.is_some() {
                return finish_at(StopReason::Boundary, boundary, turns, final_text, usage);
            }
            if calls.is_empty() {
                if let Some((_, why)) = looped {
                    events(AgentEvent::Error { message: why });
                    return finish(StopReason::LoopDetected, turns, final_text, usage);
                }
            }
            if completion.tool_calls.is_empty() {
                if completion.finish_reason == FinishReason::Length {
                    events(AgentEvent::Error {
                        message: "the answer was cut off at the model's output token limit".into(),
                    });
                }
                return finish(StopReason::Completed, turns, final_text, usage);
            }
            let results = self.run_tools(&calls, events, cancel).await;
            for ((call, outcome), note) in calls.iter().zip(results).zip(&steer) {
                let content = match note {
                    Some(note) => format!("{}\n\n{note}", outcome.content),
                    None => outcome.content,
                };
                conversation.push(Message::Tool {
                    tool_call_id: call.id.clone(),
                    content,
                });
            }
            if let Some((_, why)) = looped {
                events(AgentEvent::Error { message: why });
                return finish(StopReason::LoopDetected, turns, final_text, usage);
            }
            if boundary.is_some() {
                return finish_at(StopReason::Boundary, boundary, turns, final_text, usage);
            }
        }
    }

    fn plan(&self, call: &ToolCall) -> Planned {
        let tool = self.tools.get(&call.name);
        let args = parse_arguments(&call.arguments);
        let (read_only, lasting, summary) = match (&tool, &args) {
            (Some(t), Ok(a)) => (
                t.is_read_only_in(a, &self.ctx),
                t.outlives_the_branch(a),
                t.describe(a),
            ),
            _ => (false, false, call.name.clone()),
        };
        Planned {
            call: call.clone(),
            tool,
            args,
            read_only,
            lasting,
            summary,
            note: None,
        }
    }

    /// Let the tool repair its arguments before approval (not for calls that will be refused).
    async fn prepare(&self, p: &Planned, cancel: &CancellationToken) -> Planned {
        let (Some(tool), Ok(args)) = (&p.tool, &p.args) else {
            return p.clone();
        };
        if matches!(
            decide_call(
                self.options.approval,
                tool.kind(),
                p.read_only,
                p.lasting,
                &p.summary,
            ),
            Decision::Deny(_)
        ) {
            return p.clone();
        }
        let prepared = tool.prepare(args.clone(), &self.ctx, cancel).await;
        Planned {
            args: Ok(prepared.args),
            note: prepared.note,
            ..p.clone()
        }
    }

    /// Run one turn's calls; returns one outcome per call, in the calls' order.
    async fn run_tools(
        &self,
        calls: &[ToolCall],
        events: &EventSink,
        cancel: &CancellationToken,
    ) -> Vec<Outcome> {
        let planned: Vec<Planned> = calls.iter().map(|c| self.plan(c)).collect();
        let mut results: Vec<Option<Outcome>> = (0..planned.len()).map(|_| None).collect();
        let mut i = 0;
        while i < planned.len() {
            if cancel.is_cancelled() {
                break;
            }
            // A run of consecutive read-only calls goes concurrently.
            let mut j = i;
            while j < planned.len() && self.runs_freely(&planned[j]) {
                j += 1;
            }
            if j > i {
                let batch = planned[i..j]
                    .iter()
                    .map(|p| self.execute(p, events, cancel));
                // Ends are reported in call order, not completion order, so that a replayed
                // run prints exactly the same transcript every time.
                for (k, out) in join_all(batch).await.into_iter().enumerate() {
                    emit_end(events, &planned[i + k], &out);
                    results[i + k] = Some(out);
                }
                i = j;
                continue;
            }
            let p = &self.prepare(&planned[i], cancel).await;
            let outcome = match self.gate(p).await {
                Ok(()) => {
                    let o = self.execute(p, events, cancel).await;
                    emit_end(events, p, &o);
                    o
                }
                Err(reason) => {
                    let o = Outcome {
                        ok: false,
                        denied: true,
                        content: reason.clone(),
                        display: format!("{} refused", p.summary),
                    };
                    emit_end(events, p, &o);
                    o
                }
            };
            results[i] = Some(outcome);
            i += 1;
        }
        // Whatever did not run (cancelled) still gets its result.
        results
            .into_iter()
            .zip(&planned)
            .map(|(r, p)| {
                r.unwrap_or_else(|| {
                    let o = Outcome {
                        ok: false,
                        denied: false,
                        content: "Not run: the user cancelled.".into(),
                        display: format!("{} cancelled", p.summary),
                    };
                    emit_end(events, p, &o);
                    o
                })
            })
            .collect()
    }

    /// Needs no approval and has no side effects: may run concurrently with its neighbours.
    fn runs_freely(&self, p: &Planned) -> bool {
        match (&p.tool, &p.args) {
            (Some(t), Ok(_)) => {
                p.read_only
                    && decide_call(
                        self.options.approval,
                        t.kind(),
                        p.read_only,
                        p.lasting,
                        &p.summary,
                    ) == Decision::Allow
            }
            _ => true, // unknown tool / bad JSON: the "execution" is just an error result
        }
    }

    async fn gate(&self, p: &Planned) -> Result<(), String> {
        let Some(tool) = &p.tool else { return Ok(()) };
        if p.args.is_err() {
            return Ok(());
        }
        match decide_call(
            self.options.approval,
            tool.kind(),
            p.read_only,
            p.lasting,
            &p.summary,
        ) {
            Decision::Allow => Ok(()),
            Decision::Deny(why) => Err(format!(
                "Refused without running: {why}. Do not retry; continue without it."
            )),
            Decision::Ask(what) => {
                let preview = match &p.args {
                    Ok(args) => tool.preview(args, &self.ctx),
                    Err(_) => None,
                };
                let request = ApprovalRequest {
                    tool: &p.call.name,
                    what: &what,
                    preview: preview.as_deref(),
                };
                match self.approver.ask(request).await {
                    Answer::Yes => Ok(()),
                    Answer::No(why) => Err(why),
                }
            }
        }
    }

    /// Run one approved call (emits its start; the caller emits its end).
    async fn execute(
        &self,
        p: &Planned,
        events: &EventSink,
        cancel: &CancellationToken,
    ) -> Outcome {
        events(AgentEvent::ToolStart {
            id: p.call.id.clone(),
            name: p.call.name.clone(),
            summary: p.summary.clone(),
            args: p.args.clone().unwrap_or(Value::Null),
        });
        let outcome = match (&p.tool, &p.args) {
            (None, _) => Outcome {
                ok: false,
                denied: false,
                content: format!(
                    "Error: there is no tool named `{}`. Available tools: {}.",
                    p.call.name,
                    self.tools.names().join(", ")
                ),
                display: format!("unknown tool {}", p.call.name),
            },
            (Some(_), Err(e)) => Outcome {
                ok: false,
                denied: false,
                content: format!(
                    "Error: the arguments of this {} call are not valid JSON ({e}). Arguments received: {}",
                    p.call.name,
                    crate::llm::error::truncate_chars(&p.call.arguments, 500)
                ),
                display: format!("{}: invalid JSON arguments", p.call.name),
            },
            (Some(tool), Ok(args)) => match tool.run(args.clone(), &self.ctx, cancel).await {
                Ok(out) => match &p.note {
                    None => Outcome {
                        ok: true,
                        denied: false,
                        content: out.content,
                        display: out.display,
                    },
                    Some(note) => Outcome {
                        ok: true,
                        denied: false,
                        content: format!("{}\n{note}", out.content),
                        display: format!("{} (repaired)", out.display),
                    },
                },
                Err(ToolError::Cancelled) => Outcome {
                    ok: false,
                    denied: false,
                    content: "Cancelled by the user before it finished.".into(),
                    display: format!("{} cancelled", p.summary),
                },
                Err(e) => Outcome {
                    ok: false,
                    denied: false,
                    content: format!("Error: {e}"),
                    display: format!("{}: {}", p.summary, first_line(&e.to_string())),
                },
            },
        };
        outcome
    }
}

fn emit_end(events: &EventSink, p: &Planned, o: &Outcome) {
    events(AgentEvent::ToolEnd {
        id: p.call.id.clone(),
        name: p.call.name.clone(),
        ok: o.ok,
        denied: o.denied,
        display: o.display.clone(),
        output: o.content.clone(),
    });
}

fn first_line(s: &str) -> String {
    crate::llm::error::truncate_chars(s.lines().next().unwrap_or(""), 160)
}

/// Parse a tool call's argument text; empty means `{}`.
fn parse_arguments(text: &str) -> Result<Value, String> {
    if text.trim().is_empty() {
        return Ok(Value::Object(Default::default()));
    }
    match serde_json::from_str::<Value>(text) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(other) => Err(format!("expected a JSON object, got {other}")),
        Err(e) => Err(e.to_string()),
    }
}
