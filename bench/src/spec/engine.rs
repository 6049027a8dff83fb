//! One session run the way `shade chat` runs it, with a scripted user: each input typed in
//! turn; after each answer the suggestion is asked for (the cached prefix, the guards, the
//! pipelined one when the speculation computed it) and, by the strategy, speculated while the
//! user thinks; the user accepts when the suggestion is their next input. Every step goes
//! through the library paths the chat uses (`generate_suggestion`, `Speculation::start`,
//! `Finished::check`/`apply`, `Agent::run`), so the recorder and the benchmark measure what
//! the chat does.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use shade_agent::approval::{AlwaysYes, ApprovalMode};
use shade_agent::background::BackgroundLlm;
use shade_agent::followup::cache::{new_session_id, CacheSafeParams};
use shade_agent::followup::generate::{generate_suggestion, SuggestionOutcome, SuggestionSource};
use shade_agent::followup::guards::{count_model_turns, SuggestionGuards};
use shade_agent::followup::telemetry::Telemetry;
use shade_agent::llm::{LlmProvider, Message};
use shade_agent::speculation::{Speculation, Start, Status};
use shade_agent::{
    Agent, AgentOptions, CallGate, EventSink, StopReason, ToolContext, ToolRegistry, Workspace,
};
use tokio_util::sync::CancellationToken;

use super::check::{turn_tools, Snapshot};
use super::meter::{Meter, Used};
use super::peer::PeerGate;

/// What runs a shown suggestion ahead of the user.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// No speculation: every input runs live when submitted.
    None,
    /// The peer (qwen-code) as it ships: reads and edits in a copy-on-write branch, stop at
    /// the first shell command that is not read-only, and a speculation that stopped at a
    /// boundary is thrown away on accept (the input runs live); pipelined suggestions.
    Peer,
    /// The peer's gate with shade's accept: a boundary's finished part is kept and the turn
    /// continues live from it (what the `peer` row measured before issue 32).
    #[serde(rename = "peer-keep")]
    #[value(name = "peer-keep")]
    PeerKeep,
    /// shade's runnable speculation (commands run in the branch's sandbox), no pipelining.
    Runnable,
    /// shade's runnable speculation with pipelined suggestions, as `shade chat` runs it.
    Pipelined,
}

impl Strategy {
    /// All of them, in report order.
    pub const ALL: [Strategy; 5] = [
        Strategy::None,
        Strategy::Peer,
        Strategy::PeerKeep,
        Strategy::Runnable,
        Strategy::Pipelined,
    ];

    /// The name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::None => "none",
            Strategy::Peer => "peer",
            Strategy::PeerKeep => "peer-keep",
            Strategy::Runnable => "runnable",
            Strategy::Pipelined => "pipelined",
        }
    }

    fn speculates(self) -> bool {
        self != Strategy::None
    }

    fn pipelines(self) -> bool {
        matches!(
            self,
            Strategy::Peer | Strategy::PeerKeep | Strategy::Pipelined
        )
    }
}

/// The model side of a run.
#[derive(Clone)]
pub struct Model {
    /// Every call goes through it.
    pub provider: Arc<dyn LlmProvider>,
    /// The main model's name.
    pub model: String,
    /// The fast (background) model's name.
    pub fast: String,
}

/// Should the scripted user take `suggestion` when their next input is `input`?
pub type AcceptRule = Arc<dyn Fn(&str, &str) -> bool + Send + Sync>;

/// Should a speculation of this suggestion, which the user will not take, run to its end
/// before it is dropped?
pub type FinishRule = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// How a run goes.
#[derive(Clone)]
pub struct Options {
    /// The strategy.
    pub strategy: Strategy,
    /// How long the user looks at a shown suggestion before typing or accepting (while a
    /// speculation runs; not part of any wait).
    pub think: Duration,
    /// When the user takes the shown suggestion.
    pub accept: AcceptRule,
    /// Recording: wait until a speculation the user will not take has finished before
    /// dropping it, when this says so for its suggestion (so its calls are all recorded).
    pub finish_unaccepted: Option<FinishRule>,
    /// Ask for (and speculate) a suggestion after the last input too (the recorder does, as
    /// the chat would; the benchmark's user leaves instead).
    pub suggest_after_last: bool,
    /// Where CPU and memory of speculations are measured.
    pub meter: Option<Arc<Meter>>,
}

/// Normalised for comparing a suggestion with an input: lower case, single spaces, no
/// trailing punctuation.
pub fn normalise(s: &str) -> String {
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .trim_matches(['"', '\'', '`', ' '])
        .trim_end_matches(['.', '!', '?', ' '])
        .to_lowercase()
}

/// The accept rule: the suggestion is the next input (normalised).
pub fn same_input() -> AcceptRule {
    Arc::new(|suggestion, input| normalise(suggestion) == normalise(input))
}

/// The benchmark's accept rule: the suggestion is, normalised, the user's real next input or
/// one of the hand-written equivalents of it (`equivalents`, keyed by the recorded input).
pub fn same_or_equivalent(
    equivalents: std::collections::BTreeMap<String, Vec<String>>,
) -> AcceptRule {
    let eq: std::collections::HashMap<String, Vec<String>> = equivalents
        .into_iter()
        .map(|(k, v)| (normalise(&k), v.iter().map(|x| normalise(x)).collect()))
        .collect();
    Arc::new(move |suggestion, input| {
        let (s, i) = (normalise(suggestion), normalise(input));
        s == i || eq.get(&i).is_some_and(|v| v.contains(&s))
    })
}

/// What one turn measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TurnResult {
    /// What the user typed (or accepted).
    pub input: String,
    /// The suggestion shown before it, if any.
    pub suggestion: Option<String>,
    /// The user took the suggestion.
    pub accepted: bool,
    /// The user-visible wait: submit (or accept) → the turn's result in the project and the
    /// conversation.
    pub wait_ms: f64,
    /// The speculation's end: completed, boundary, aborted, failed, conflict.
    pub speculation: Option<String>,
    /// Its boundary, if it stopped at one.
    pub boundary: Option<String>,
    /// It had finished when the user accepted.
    pub ready_at_accept: bool,
    /// Tokens the speculation spent.
    pub speculation_tokens: u64,
    /// Of which thrown away (aborted, failed, conflicting speculations).
    pub discarded_tokens: u64,
    /// CPU and memory of the speculation (start → accepted or dropped).
    pub speculation_used: Option<Used>,
    /// Those of a thrown-away speculation.
    pub discarded_used: Option<Used>,
    /// The accept was refused: the project changed under the branch.
    pub conflict: bool,
    /// `tool: outcome` of every tool call of the turn (speculated and live parts), for the
    /// check against the same turn run live (`check::turn_tools`).
    #[serde(default)]
    pub tools: Vec<String>,
    /// The files the turn created, changed or removed (`check::Snapshot::changes`).
    #[serde(default)]
    pub changes: Vec<String>,
    /// The suggestion asked for after this turn was not shown: the filter rule that dropped
    /// it (`empty`, `too_many_words`, …) or `failed: …`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suggestion_dropped: Option<String>,
}

fn tokens(s: &Speculation) -> u64 {
    let u = s.usage();
    u.prompt_tokens + u.completion_tokens
}

/// The agent the chat would have for `project`: the standard tools, yolo (the scripted user
/// approves everything), the fast model for background work.
pub fn agent(project: &Path, model: &Model) -> Result<(Agent, BackgroundLlm)> {
    let mut ctx = ToolContext::new(
        Workspace::new(project).with_context(|| format!("project {}", project.display()))?,
    );
    ctx.global_memory = None;
    let background = BackgroundLlm::new(model.provider.clone(), model.fast.clone());
    ctx.background = Some(background.clone());
    let agent = Agent::new(
        model.provider.clone(),
        ToolRegistry::standard(),
        ctx,
        Arc::new(AlwaysYes),
        AgentOptions {
            model: model.model.clone(),
            max_turns: 50,
            approval: ApprovalMode::Yolo,
            temperature: None,
        },
    );
    Ok((agent, background))
}

async fn live(agent: &Agent, conversation: &mut Vec<Message>, input: Option<&str>) -> Result<bool> {
    if let Some(input) = input {
        if conversation.is_empty() {
            *conversation = agent.start_conversation(input);
        } else {
            conversation.push(Message::User {
                content: input.to_string(),
            });
        }
    }
    let quiet: EventSink = Arc::new(|_| {});
    let outcome = agent
        .run(conversation, &quiet, &CancellationToken::new())
        .await
        .context("a live turn failed")?;
    Ok(outcome.stop == StopReason::Error)
}

/// Drop a speculation off the async workers (unmounting blocks) and measure it.
async fn drop_speculation(s: Speculation) -> Result<()> {
    tokio::task::spawn_blocking(move || s.abort()).await?;
    Ok(())
}

/// Run `inputs` as one session on `project` and measure every turn.
pub async fn run_session(
    inputs: &[String],
    project: &Path,
    model: &Model,
    opts: &Options,
) -> Result<Vec<TurnResult>> {
    let runtime = tokio::runtime::Handle::current();
    let (agent, background) = agent(project, model)?;
    let session_id = new_session_id();
    let mut conversation: Vec<Message> = Vec::new();
    let mut prefix: Option<CacheSafeParams> = None;
    let mut last_failed = false;
    let mut results = Vec::new();
    // The project before the turn, to tell what each turn changed (outside every wait).
    let mut state = Snapshot::take(project)?;
    // The suggestion on screen and its speculation (with its measuring window).
    let mut shown: Option<String> = None;
    let mut running: Option<(Speculation, Option<super::meter::Window>)> = None;
    let extra: Option<Arc<dyn CallGate>> = match opts.strategy {
        Strategy::Peer | Strategy::PeerKeep => Some(Arc::new(PeerGate)),
        _ => None,
    };
    for (i, input) in inputs.iter().enumerate() {
        let mut r = TurnResult {
            input: input.clone(),
            suggestion: shown.clone(),
            ..TurnResult::default()
        };
        let accepted = shown.as_deref().is_some_and(|s| (opts.accept)(s, input));
        r.accepted = accepted;
        let mut pipelined: Option<String> = None;
        let mut done = false;
        if let Some((spec, window)) = running.take() {
            tokio::time::sleep(opts.think).await;
            let measure = |w: Option<super::meter::Window>| match (&opts.meter, w) {
                (Some(m), Some(w)) => Some(m.end(w)),
                _ => None,
            };
            if accepted {
                let t0 = Instant::now();
                r.ready_at_accept = spec.status().is_finished();
                spec.wait().await;
                r.speculation_tokens = tokens(&spec);
                match spec.finish() {
                    Ok(finished)
                        if opts.strategy == Strategy::Peer
                            && matches!(finished.status, Status::Boundary(_)) =>
                    {
                        // The peer's shipped rule: a boundary discards the speculation.
                        if let Status::Boundary(b) = &finished.status {
                            r.boundary = Some(b.clone());
                        }
                        r.speculation = Some("discarded".into());
                        r.discarded_tokens = r.speculation_tokens;
                        let shadow = finished.shadow;
                        tokio::task::spawn_blocking(move || shadow.abort()).await?;
                        r.discarded_used = measure(window);
                        r.speculation_used = r.discarded_used;
                    }
                    Ok(finished) => {
                        if finished.check().is_ok() {
                            let mut conv = conversation.clone();
                            let applied = tokio::task::spawn_blocking(move || {
                                finished.apply(&mut conv).map(|a| (a, conv))
                            })
                            .await?;
                            match applied {
                                Ok((applied, conv)) => {
                                    conversation = conv;
                                    // The speculation's cost ends here (a boundary's live
                                    // continuation is the main agent's work).
                                    r.speculation_used = measure(window);
                                    // Unmounting the written branch is not part of the wait.
                                    let leftover = applied.leftover;
                                    match &applied.status {
                                        Status::Boundary(b) => {
                                            r.speculation = Some("boundary".into());
                                            r.boundary = Some(b.clone());
                                            last_failed =
                                                live(&agent, &mut conversation, None).await?;
                                        }
                                        _ => {
                                            r.speculation = Some("completed".into());
                                            last_failed = false;
                                        }
                                    }
                                    r.wait_ms = t0.elapsed().as_secs_f64() * 1e3;
                                    tokio::task::spawn_blocking(move || drop(leftover)).await?;
                                    pipelined = applied.pipelined;
                                    done = true;
                                }
                                Err(_) => {
                                    r.conflict = true;
                                    r.speculation = Some("conflict".into());
                                }
                            }
                        } else {
                            r.conflict = true;
                            r.speculation = Some("conflict".into());
                            let shadow = finished.shadow;
                            tokio::task::spawn_blocking(move || shadow.abort()).await?;
                        }
                        if !done {
                            r.discarded_tokens = r.speculation_tokens;
                            r.discarded_used = measure(window);
                            r.speculation_used = r.discarded_used;
                        }
                    }
                    Err(unusable) => {
                        let (s, status) = *unusable;
                        r.speculation = Some(match status {
                            Status::Aborted => "aborted".into(),
                            _ => "failed".into(),
                        });
                        r.discarded_tokens = r.speculation_tokens;
                        drop_speculation(s).await?;
                        r.discarded_used = measure(window);
                        r.speculation_used = r.discarded_used;
                    }
                }
                if !done {
                    // Unusable: the prompt runs live, timed from the accept.
                    last_failed = live(&agent, &mut conversation, Some(input)).await?;
                    r.wait_ms = t0.elapsed().as_secs_f64() * 1e3;
                    done = true;
                }
            } else {
                if let Some(finish) = &opts.finish_unaccepted {
                    if finish(spec.suggestion()) {
                        spec.wait().await;
                    }
                }
                r.speculation = Some("aborted".into());
                r.speculation_tokens = tokens(&spec);
                r.discarded_tokens = r.speculation_tokens;
                drop_speculation(spec).await?;
                r.discarded_used = measure(window);
                r.speculation_used = r.discarded_used;
            }
        }
        if !done {
            let t0 = Instant::now();
            last_failed = live(&agent, &mut conversation, Some(input)).await?;
            r.wait_ms = t0.elapsed().as_secs_f64() * 1e3;
        }
        r.tools = turn_tools(&conversation);
        let now = Snapshot::take(project)?;
        r.changes = state.changes(&now);
        state = now;
        results.push(r);
        // After the answer: the prefix, the guards, the next suggestion, its speculation.
        prefix = CacheSafeParams::capture(
            session_id,
            &conversation,
            &agent.tool_specs(),
            &agent.options().model,
            prefix.as_ref(),
        );
        shown = None;
        if i + 1 == inputs.len() && !opts.suggest_after_last {
            break;
        }
        let guards = SuggestionGuards {
            enabled: true,
            interactive: true,
            plan_mode: false,
            last_answer_error: last_failed,
            dialog_open: false,
            model_turns: count_model_turns(&conversation),
        };
        if guards.blocked_by().is_some() {
            continue;
        }
        // After the last input (the recorder only) the suggestion is asked for afresh: its
        // request shows the whole conversation, so a last turn taken from a speculation is
        // visible in the cassettes.
        let last = i + 1 == inputs.len();
        shown = match pipelined.filter(|_| opts.strategy.pipelines() && !last) {
            Some(next) => Some(next),
            None => {
                let source = match &prefix {
                    Some(p) => SuggestionSource::Cached(p),
                    None => SuggestionSource::Standalone(&conversation),
                };
                match generate_suggestion(&background, source, &CancellationToken::new()).await {
                    SuggestionOutcome::Suggested(s) => Some(s),
                    SuggestionOutcome::Suppressed(rule) => {
                        if let Some(r) = results.last_mut() {
                            r.suggestion_dropped = Some(rule.to_string());
                        }
                        None
                    }
                    SuggestionOutcome::Failed(m) => {
                        if let Some(r) = results.last_mut() {
                            r.suggestion_dropped = Some(format!("failed: {m}"));
                        }
                        None
                    }
                }
            }
        };
        if let (Some(s), Some(p), true) = (&shown, &prefix, opts.strategy.speculates()) {
            let window = opts.meter.as_ref().map(|m| m.begin());
            let spec = Speculation::start_gated(
                Start {
                    suggestion: s.clone(),
                    prefix: p.clone(),
                    agent: agent.clone(),
                    background: background.clone(),
                    project: project.to_path_buf(),
                    base: None,
                    mode: ApprovalMode::Yolo,
                    pipeline: opts.strategy.pipelines(),
                    telemetry: Telemetry::disabled(),
                },
                extra.clone(),
                &runtime,
            );
            running = Some((spec, window));
        }
    }
    // The user leaves: whatever still runs is dropped.
    if let Some((spec, _)) = running.take() {
        if let Some(finish) = &opts.finish_unaccepted {
            if finish(spec.suggestion()) {
                spec.wait().await;
            }
        }
        drop_speculation(spec).await?;
    }
    Ok(results)
}
