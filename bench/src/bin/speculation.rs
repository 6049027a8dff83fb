//! The speculation benchmark: recorded sessions replayed against the local OpenAI-compatible
//! server with a chosen model latency, by a scripted user who accepts the shown suggestion
//! when it is what they typed next in the recording, and types their own input otherwise.
//! Each session runs twice on fresh copies of its project: live (no speculation) and with
//! speculation, through the same library paths `shade chat` uses (suggestion generation with
//! the cached prefix, `Speculation::start`, `Finished::check` and `apply`).
//!
//! `cargo run --release -p shade-bench --bin speculation -- [--latency-ms 400]
//!  [--think-ms 1500] [--runs 3] [--markdown FILE] [--json FILE] [SESSION.json …]`
//! (as root: speculations mount branches). Sessions default to `bench/sessions/*.json`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use serde::Deserialize;
use serde_json::{json, Value};
use shade_agent::approval::{AlwaysYes, ApprovalMode};
use shade_agent::background::{BackgroundLlm, MeteredProvider, TokenStats};
use shade_agent::followup::cache::{new_session_id, CacheSafeParams};
use shade_agent::followup::generate::{generate_suggestion, SuggestionOutcome, SuggestionSource};
use shade_agent::followup::guards::count_model_turns;
use shade_agent::followup::telemetry::Telemetry;
use shade_agent::llm::{LlmConfig, LlmProvider, Message, OpenAiClient};
use shade_agent::speculation::{Speculation, Start, Status};
use shade_agent::{Agent, AgentOptions, EventSink, ToolContext, ToolRegistry, Workspace};
use shade_testkit::{
    is_suggestion_request, last_real_user, last_user, tool_results_since_user, FakeLlm, Reply,
};
use tokio_util::sync::CancellationToken;

#[derive(Parser, Debug)]
#[command(about = "Speculation benchmark: replayed sessions, a scripted user, live vs speculated")]
struct Args {
    /// Time to first byte of every model call.
    #[arg(long, default_value_t = 400)]
    latency_ms: u64,
    /// How long the scripted user looks at a shown suggestion before answering.
    #[arg(long, default_value_t = 1500)]
    think_ms: u64,
    /// Passes over every session (each pass runs it live and speculated).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Write the report as markdown here too.
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// Write every measurement as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Keep the projects on the disk under /var/tmp instead of a private tmpfs (as the file
    /// benchmarks do): accept then pays the disk's fsync latency.
    #[arg(long)]
    disk: bool,
    /// Session files (default: bench/sessions/*.json).
    sessions: Vec<PathBuf>,
}

/// A recorded session: the project, and per turn what the user typed, what the model did
/// and what it suggested next.
#[derive(Debug, Clone, Deserialize)]
struct Session {
    name: String,
    files: BTreeMap<String, String>,
    #[serde(default)]
    executable: Vec<String>,
    turns: Vec<Turn>,
}

#[derive(Debug, Clone, Deserialize)]
struct Turn {
    user: String,
    steps: Vec<Step>,
    suggestion: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum Step {
    Tool { tool: String, args: Value },
    Text { text: String },
}

/// The model: answers from the recording, slowly on purpose.
fn router(session: Session, latency: Duration) -> shade_testkit::Router {
    Arc::new(move |body: &Value| {
        let tokens = (body.to_string().len() / 4) as u64;
        let reply = if is_suggestion_request(body) {
            // A pipelined request names the speculated input; a plain one follows the
            // conversation's last input.
            let asked = last_user(body);
            let user = match asked.split_once("The user just said: \"") {
                Some((_, rest)) => rest.split('"').next().unwrap_or("").to_string(),
                None => last_real_user(body),
            };
            match session.turns.iter().find(|t| t.user == user) {
                Some(t) => Reply::text(&t.suggestion),
                None => Reply::text(""),
            }
        } else {
            let user = last_real_user(body);
            let step = tool_results_since_user(body);
            match session
                .turns
                .iter()
                .find(|t| t.user == user)
                .and_then(|t| t.steps.get(step))
            {
                Some(Step::Tool { tool, args }) => Reply::tool(tool, args.clone()),
                Some(Step::Text { text }) => Reply::text(text),
                None => Reply::text("(not in the recording)"),
            }
        };
        Reply {
            prompt_tokens: tokens,
            ..reply
        }
        .after(latency)
    })
}

/// What one pass of one session measured.
#[derive(Debug, Default, Clone, serde::Serialize)]
struct Pass {
    session: String,
    /// Submit → result of turns the user would have accepted, run live.
    live_ms: Vec<f64>,
    /// Accept → result of the same turns with speculation (boundaries and fallbacks too).
    speculated_ms: Vec<f64>,
    /// Accept → result of the accepted speculations that had completed.
    completed_ms: Vec<f64>,
    /// The same, for those that had already finished when the user accepted.
    ready_ms: Vec<f64>,
    shown: usize,
    accepted: usize,
    completed: usize,
    boundary: usize,
    aborted: usize,
    failed: usize,
    /// Tokens of speculations that were thrown away.
    discarded_tokens: u64,
}

fn main() {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("speculation bench: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = run(&args, &runtime) {
        eprintln!("speculation bench: error: {e:#}");
        std::process::exit(1);
    }
}

fn run(args: &Args, runtime: &tokio::runtime::Runtime) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("run as root: speculations mount branches (FUSE)");
    }
    let files = if args.sessions.is_empty() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("sessions");
        let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
        v.sort();
        v
    } else {
        args.sessions.clone()
    };
    let sessions: Vec<Session> = files
        .iter()
        .map(|f| {
            let text =
                std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
            serde_json::from_str(&text).with_context(|| format!("parsing {}", f.display()))
        })
        .collect::<Result<_>>()?;
    let work = PathBuf::from(format!("/var/tmp/shade-bench-spec/{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    if !args.disk {
        nix::mount::mount(
            Some("tmpfs"),
            &work,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("mode=0755"),
        )
        .context("mounting a tmpfs for the projects")?;
    }
    let result = run_in(args, &sessions, &work, runtime);
    if !args.disk {
        let _ = nix::mount::umount2(&work, nix::mount::MntFlags::MNT_DETACH);
    }
    let _ = std::fs::remove_dir_all(&work);
    let report = result?;
    print!("{report}");
    if let Some(p) = &args.markdown {
        std::fs::write(p, &report)?;
    }
    Ok(())
}

fn run_in(
    args: &Args,
    sessions: &[Session],
    work: &Path,
    runtime: &tokio::runtime::Runtime,
) -> Result<String> {
    // Branch stores and telemetry of this run stay in the work dir.
    std::env::set_var("SHADE_STATE_DIR", work.join("state"));
    let latency = Duration::from_millis(args.latency_ms);
    let think = Duration::from_millis(args.think_ms);
    let mut passes = Vec::new();
    for run in 0..args.runs {
        for s in sessions {
            eprintln!(
                "speculation bench: {} (pass {}/{})",
                s.name,
                run + 1,
                args.runs
            );
            let dir = work.join(format!("{}-{run}", s.name));
            let pass = runtime.block_on(one_pass(s, &dir, latency, think, runtime.handle()))?;
            passes.push(pass);
        }
    }
    let report = report(&passes, args);
    if let Some(p) = &args.json {
        std::fs::write(
            p,
            serde_json::to_string_pretty(&json!({
                "latency_ms": args.latency_ms, "think_ms": args.think_ms, "disk": args.disk,
                "passes": passes}))?,
        )?;
    }
    Ok(report)
}

/// A fresh copy of the session's project.
fn lay_out(session: &Session, dir: &Path) -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    for (name, content) in &session.files {
        let p = dir.join(name);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&p, content)?;
        if session.executable.contains(name) {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755))?;
        }
    }
    Ok(std::fs::canonicalize(dir)?)
}

struct Side {
    agent: Agent,
    background: BackgroundLlm,
    conversation: Vec<Message>,
    project: PathBuf,
    _llm: FakeLlm,
}

fn side(session: &Session, dir: &Path, latency: Duration) -> Result<Side> {
    let project = lay_out(session, dir)?;
    let llm = FakeLlm::start(router(session.clone(), latency))?;
    let client = OpenAiClient::new(LlmConfig {
        base_url: llm.base_url.clone(),
        model: Some("main".into()),
        ..LlmConfig::default()
    })?;
    let provider: Arc<dyn LlmProvider> = Arc::new(MeteredProvider::new(
        Arc::new(client),
        TokenStats::default(),
    ));
    let mut ctx = ToolContext::new(Workspace::new(&project)?);
    ctx.global_memory = None;
    let background = BackgroundLlm::new(provider.clone(), "fast");
    ctx.background = Some(background.clone());
    let agent = Agent::new(
        provider,
        ToolRegistry::standard(),
        ctx,
        Arc::new(AlwaysYes),
        AgentOptions {
            model: "main".into(),
            max_turns: 20,
            approval: ApprovalMode::Yolo,
            temperature: None,
        },
    );
    Ok(Side {
        agent,
        background,
        conversation: Vec::new(),
        project,
        _llm: llm,
    })
}

async fn live_turn(side: &mut Side, user: &str) -> Result<Duration> {
    let quiet: EventSink = Arc::new(|_| {});
    let t0 = Instant::now();
    if side.conversation.is_empty() {
        side.conversation = side.agent.start_conversation(user);
    } else {
        side.conversation.push(Message::User {
            content: user.to_string(),
        });
    }
    side.agent
        .run(&mut side.conversation, &quiet, &CancellationToken::new())
        .await?;
    Ok(t0.elapsed())
}

async fn one_pass(
    session: &Session,
    dir: &Path,
    latency: Duration,
    think: Duration,
    runtime: &tokio::runtime::Handle,
) -> Result<Pass> {
    let mut pass = Pass {
        session: session.name.clone(),
        ..Pass::default()
    };
    // Live: every turn typed and run; the turns the user would have accepted are timed.
    let mut live = side(session, &dir.join("live"), latency)?;
    for (i, turn) in session.turns.iter().enumerate() {
        let took = live_turn(&mut live, &turn.user).await?;
        if i > 0 && session.turns[i - 1].suggestion == turn.user {
            pass.live_ms.push(took.as_secs_f64() * 1e3);
        }
    }
    // Speculated: the suggestion after each answer is shown and speculated; the user takes
    // it when it is what they typed next.
    let mut spec = side(session, &dir.join("speculated"), latency)?;
    let session_id = new_session_id();
    let mut prefix: Option<CacheSafeParams> = None;
    let mut next_suggestion: Option<String> = None;
    for turn in &session.turns {
        let shown = match (next_suggestion.take(), &prefix) {
            (Some(s), _) => Some(s),
            (None, Some(p)) if count_model_turns(&spec.conversation) >= 2 => {
                match generate_suggestion(
                    &spec.background,
                    SuggestionSource::Cached(p),
                    &CancellationToken::new(),
                )
                .await
                {
                    SuggestionOutcome::Suggested(s) => Some(s),
                    _ => None,
                }
            }
            _ => None,
        };
        let mut ran = false;
        if let (Some(suggestion), Some(p)) = (shown, prefix.clone()) {
            pass.shown += 1;
            let speculation = Speculation::start(
                Start {
                    suggestion: suggestion.clone(),
                    prefix: p,
                    agent: spec.agent.clone(),
                    background: spec.background.clone(),
                    project: spec.project.clone(),
                    base: None,
                    mode: ApprovalMode::Yolo,
                    pipeline: true,
                    telemetry: Telemetry::disabled(),
                },
                runtime,
            );
            tokio::time::sleep(think).await;
            if suggestion == turn.user {
                pass.accepted += 1;
                let t0 = Instant::now();
                let ready = speculation.status().is_finished();
                speculation.wait().await;
                match speculation.finish() {
                    Ok(finished) if finished.check().is_ok() => {
                        let mut conversation = spec.conversation.clone();
                        let applied = tokio::task::spawn_blocking(move || {
                            finished.apply(&mut conversation).map(|a| (a, conversation))
                        })
                        .await??;
                        spec.conversation = applied.1;
                        let accepted_in = t0.elapsed();
                        let applied = applied.0;
                        let status = applied.status.clone();
                        let pipelined = applied.pipelined.clone();
                        // Unmounting the written branch is not part of the user's wait.
                        let leftover = applied.leftover;
                        tokio::task::spawn_blocking(move || drop(leftover)).await?;
                        match status {
                            Status::Boundary(_) => {
                                pass.boundary += 1;
                                let quiet: EventSink = Arc::new(|_| {});
                                spec.agent
                                    .run(&mut spec.conversation, &quiet, &CancellationToken::new())
                                    .await?;
                            }
                            _ => {
                                pass.completed += 1;
                                let took = accepted_in.as_secs_f64() * 1e3;
                                pass.completed_ms.push(took);
                                if ready {
                                    pass.ready_ms.push(took);
                                }
                            }
                        }
                        next_suggestion = pipelined;
                        // A boundary's live continuation is part of its result.
                        let total = match status {
                            Status::Boundary(_) => t0.elapsed(),
                            _ => accepted_in,
                        };
                        pass.speculated_ms.push(total.as_secs_f64() * 1e3);
                        ran = true;
                    }
                    Ok(finished) => {
                        pass.failed += 1;
                        drop(finished);
                    }
                    Err(not_ready) => {
                        pass.failed += 1;
                        let (s, _) = *not_ready;
                        pass.discarded_tokens += tokens(&s);
                        s.abort();
                    }
                }
                if !ran {
                    // Unusable: run live, timed as the user sees it.
                    live_turn(&mut spec, &turn.user).await?;
                    pass.speculated_ms.push(t0.elapsed().as_secs_f64() * 1e3);
                    ran = true;
                }
            } else {
                pass.aborted += 1;
                pass.discarded_tokens += tokens(&speculation);
                let s = speculation;
                tokio::task::spawn_blocking(move || s.abort()).await?;
            }
        }
        if !ran {
            live_turn(&mut spec, &turn.user).await?;
        }
        prefix = CacheSafeParams::capture(
            session_id,
            &spec.conversation,
            &spec.agent.tool_specs(),
            "main",
            prefix.as_ref(),
        );
    }
    Ok(pass)
}

fn tokens(s: &Speculation) -> u64 {
    let u = s.usage();
    u.prompt_tokens + u.completion_tokens
}

fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    Some(v[v.len() / 2])
}

fn ms(v: Option<f64>) -> String {
    v.map(|x| format!("{x:.0} ms"))
        .unwrap_or_else(|| "–".into())
}

fn report(passes: &[Pass], args: &Args) -> String {
    let mut out = format!(
        "# Speculation benchmark\n\nModel latency {} ms per call (time to first byte), user \
         think time {} ms, {} pass(es) per session, projects on {}. Accept → result: from the user's accept \
         to the turn's result in the project and the conversation; live: the same turn typed \
         and run without speculation.\n\n\
         | session | shown | accepted | hit rate | completed | boundary | aborted | failed | \
         median accept → result, live | speculated | completed | finished before accept | ratio | discarded tokens |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        args.latency_ms,
        args.think_ms,
        args.runs,
        if args.disk { "the disk (/var/tmp)" } else { "a tmpfs" }
    );
    let mut names: Vec<&str> = passes.iter().map(|p| p.session.as_str()).collect();
    names.dedup();
    let mut all = Pass::default();
    for name in names.iter().copied().chain(std::iter::once("all")) {
        let mut t = Pass::default();
        for p in passes.iter().filter(|p| name == "all" || p.session == name) {
            t.live_ms.extend(&p.live_ms);
            t.speculated_ms.extend(&p.speculated_ms);
            t.completed_ms.extend(&p.completed_ms);
            t.ready_ms.extend(&p.ready_ms);
            t.shown += p.shown;
            t.accepted += p.accepted;
            t.completed += p.completed;
            t.boundary += p.boundary;
            t.aborted += p.aborted;
            t.failed += p.failed;
            t.discarded_tokens += p.discarded_tokens;
        }
        let (live, spec) = (median(&t.live_ms), median(&t.speculated_ms));
        let ratio = match (live, spec) {
            (Some(l), Some(s)) if s > 0.0 => format!("{:.0}× faster", l / s),
            _ => "–".into(),
        };
        let hit = if t.shown > 0 {
            format!("{:.0}%", 100.0 * t.accepted as f64 / t.shown as f64)
        } else {
            "–".into()
        };
        out.push_str(&format!(
            "| {name} | {} | {} | {hit} | {} | {} | {} | {} | {} | {} | {} | {} | {ratio} | {} |\n",
            t.shown,
            t.accepted,
            t.completed,
            t.boundary,
            t.aborted,
            t.failed,
            ms(live),
            ms(spec),
            ms(median(&t.completed_ms)),
            ms(median(&t.ready_ms)),
            t.discarded_tokens
        ));
        if name == "all" {
            all = t;
        }
    }
    out.push_str(&format!(
        "\n{} of {} shown suggestions were accepted; discarded speculative work cost {} tokens.\n",
        all.accepted, all.shown, all.discarded_tokens
    ));
    out
}
