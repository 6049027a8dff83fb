//! The speculation benchmark: recorded sessions (the cassettes `shade chat --record` writes,
//! or those `spec-record` makes from a script) replayed by a scripted user, strategies side by
//! side on the same sessions: `none`, `peer` (the peer's: stop at the first writing shell
//! command), `runnable` (shade's) and `pipelined` (shade's as `shade chat` runs it). The tool
//! calls run for real on a fresh copy of the project each run; only the model is replayed, by
//! a local OpenAI-compatible server with a latency profile — or, with `--base-url`, a live
//! model answers everything and its own suggestions are measured against the recorded inputs.
//!
//! `cargo run --release -p shade-bench --bin speculation -- [SESSION_DIR …]
//!  [--strategies none,peer,runnable,pipelined] [--latency local|hosted] [--ttft-ms N]
//!  [--tokens-per-s N] [--think-ms 1500] [--runs 1] [--out PREFIX] [--project DIR]
//!  [--base-url URL --model M]` (as root: speculations mount branches). Sessions default to
//! `bench/corpus/sessions/*`. See bench/README.md.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use serde_json::json;
use shade_agent::background::{MeteredProvider, TokenStats};
use shade_agent::llm::{LlmConfig, LlmProvider, OpenAiClient};
use shade_bench::spec::cassettes::{self, Latency, ReplayStats};
use shade_bench::spec::curve;
use shade_bench::spec::engine::{self, Model, Options, Strategy};
use shade_bench::spec::live::Routed;
use shade_bench::spec::meter::Meter;
use shade_bench::spec::project::{materialise, SessionMeta, DEFAULT_CORPUS};
use shade_bench::spec::render;
use shade_bench::spec::report::{self, Prices, SessionRun};
use shade_testkit::FakeLlm;

#[derive(Parser, Debug)]
#[command(
    about = "Speculation benchmark: recorded sessions, a scripted user, strategies side by side"
)]
struct Args {
    /// Session directories (chat.jsonl + chat.background.jsonl [+ session.toml]) or main
    /// cassette files; default: bench/corpus/sessions/*.
    sessions: Vec<PathBuf>,
    /// Strategies to compare (comma-separated).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "none,peer,peer-keep,runnable,pipelined"
    )]
    strategies: Vec<Strategy>,
    /// Model latency presets, comma-separated: local, hosted (each a dimension of the grid).
    #[arg(long, value_delimiter = ',', default_value = "local")]
    latency: Vec<String>,
    /// Time to first token (overrides the preset).
    #[arg(long)]
    ttft_ms: Option<u64>,
    /// Generation speed in tokens/s (overrides the preset).
    #[arg(long)]
    tokens_per_s: Option<f64>,
    /// How long the scripted user looks at a shown suggestion before answering, ms;
    /// comma-separated for a sweep (e.g. 500,1500,3000,6000,12000; the first is the table's).
    #[arg(long, value_delimiter = ',', default_value = "1500")]
    think_ms: Vec<u64>,
    /// Passes over every session and strategy (the strategies' order rotates every pass).
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// Run only the jobs I, I+N, I+2N, … of the grid (0 ≤ I < N), for running it on many
    /// machines; `--merge` makes the report of all the shards' JSONs.
    #[arg(long, value_name = "I/N")]
    shard: Option<String>,
    /// Run nothing: merge the JSONs of shards (`--shard`) into one report (to `--out`).
    #[arg(long, value_name = "FILE", num_args = 1..)]
    merge: Vec<PathBuf>,
    /// Write PREFIX.md, PREFIX.json and PREFIX.svg.
    #[arg(long, value_name = "PREFIX")]
    out: Option<PathBuf>,
    /// The project of sessions without a session.toml (your own recordings).
    #[arg(long, value_name = "DIR")]
    project: Option<PathBuf>,
    /// Where bench/corpus/fetch.sh put the corpus projects.
    #[arg(long, default_value = DEFAULT_CORPUS)]
    corpus: PathBuf,
    /// Keep the project copies on a private tmpfs instead of the disk (/var/tmp).
    #[arg(long)]
    tmpfs: bool,
    /// A live OpenAI-compatible server instead of the replay: its answers and suggestions
    /// are its own; the user accepts a suggestion when it is their recorded next input.
    #[arg(long, value_name = "URL")]
    base_url: Option<String>,
    /// The live server's model.
    #[arg(long)]
    model: Option<String>,
    /// The live server's model for background work (default: --model).
    #[arg(long)]
    fast_model: Option<String>,
    /// A live OpenAI-compatible server for the suggestions only (e.g. scripts/local-model.sh
    /// serve: http://127.0.0.1:8080/v1); everything else is replayed. The share of its
    /// suggestions that match the user's real next input (or a hand-written equivalent) is
    /// the measured hit rate.
    #[arg(long, value_name = "URL")]
    suggester_url: Option<String>,
    /// The suggester's model name.
    #[arg(long, default_value = "smollm2")]
    suggester_model: String,
    /// Price of input tokens, in USD per million, for the cost columns.
    #[arg(long, default_value_t = 0.15)]
    price_in: f64,
    /// Price of output tokens, in USD per million.
    #[arg(long, default_value_t = 0.60)]
    price_out: f64,
    /// Run nothing: render the table and plot of an earlier run's PREFIX.json again (to
    /// `--out`, or stdout for the table).
    #[arg(long, value_name = "FILE")]
    rerender: Option<PathBuf>,
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("speculation bench: error: {e:#}");
        std::process::exit(1);
    }
}

/// FUSE mounts under this run's work directory (other programs' mounts do not count).
fn fuse_mounts(work: &Path) -> usize {
    let under = work.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|m| {
            m.lines()
                .filter(|l| {
                    let fuse = l
                        .split(" - ")
                        .nth(1)
                        .is_some_and(|t| t.starts_with("fuse") && !t.starts_with("fusectl"));
                    let point = l.split(' ').nth(4).unwrap_or("");
                    fuse && point.starts_with(&under)
                })
                .count()
        })
        .unwrap_or(0)
}

fn commit() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// `--rerender` (one file) or `--merge` (shards): the report of JSONs written before, their
/// runs in job order, the first one's header kept.
fn rerender(args: &Args, files: &[PathBuf]) -> Result<()> {
    let mut runs: Vec<SessionRun> = Vec::new();
    let mut first: Option<serde_json::Value> = None;
    for file in files {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        let doc: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", file.display()))?;
        let more: Vec<SessionRun> = serde_json::from_value(doc["runs"].clone())?;
        runs.extend(more);
        first.get_or_insert(doc);
    }
    let doc = first.unwrap_or_default();
    runs.sort_by_key(|r| r.job);
    let commit = doc["commit"].as_str().unwrap_or("unknown").to_string();
    let header = doc["header"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| format!("# Speculation benchmark\n\nCommit {commit}."));
    // A shard's header names its shard; the merged report is all of them.
    let header = match (header.find(" (shard "), files.len() > 1) {
        (Some(at), true) => {
            let end = header[at..].find(')').map_or(header.len(), |e| at + e + 1);
            format!(
                "{} ({} shards merged){}",
                &header[..at],
                files.len(),
                &header[end..]
            )
        }
        _ => header,
    };
    let prices: Prices = serde_json::from_value(doc["prices"].clone()).unwrap_or_default();
    let md = render::markdown(&runs, &header, prices);
    print!("{md}");
    if let Some(prefix) = &args.out {
        render::write(prefix, &md, &runs, &commit)?;
        if !args.merge.is_empty() {
            let mut merged = doc.clone();
            merged["runs"] = serde_json::to_value(&runs)?;
            merged["summary"] = summary(&runs);
            merged["curve"] = serde_json::to_value(curve::lines(&render::headline(&runs)))?;
            merged["merged_from"] = json!(files);
            std::fs::write(
                render::with_ext(prefix, ".json"),
                serde_json::to_string_pretty(&merged)?,
            )?;
        }
    }
    Ok(())
}

/// The headline subset's table as JSON rows.
fn summary(runs: &[SessionRun]) -> serde_json::Value {
    let rows: Vec<_> = report::table(&render::headline(runs))
        .into_iter()
        .map(|((session, strategy), f)| json!({"session": session, "strategy": strategy, "figures": f}))
        .collect();
    json!(rows)
}

/// `I/N` → (I, N).
fn parse_shard(s: &str) -> Result<(usize, usize)> {
    let (i, n) = s.split_once('/').context("--shard takes I/N (e.g. 0/4)")?;
    let (i, n): (usize, usize) = (i.trim().parse()?, n.trim().parse()?);
    if n == 0 || i >= n {
        bail!("--shard {s}: need 0 ≤ I < N");
    }
    Ok((i, n))
}

/// One session run of the grid.
#[derive(Debug, Clone)]
struct Job {
    index: usize,
    pass: usize,
    profile: String,
    latency: Latency,
    think_ms: u64,
    dir: PathBuf,
    strategy: Strategy,
}

/// The grid in run order: passes × profiles × think times × sessions × strategies, the
/// strategies' order rotated every pass (so none of them always runs first, on a cold cache
/// or a quieter machine); `none` once per profile (it does not depend on the think time).
fn jobs(args: &Args, dirs: &[PathBuf], latencies: &[(String, Latency)]) -> Vec<Job> {
    let mut out = Vec::new();
    let n = args.strategies.len().max(1);
    for pass in 0..args.runs {
        for (profile, latency) in latencies {
            for (k, &think_ms) in args.think_ms.iter().enumerate() {
                for dir in dirs {
                    for j in 0..n {
                        let strategy = args.strategies[(j + pass) % n];
                        if strategy == Strategy::None && k > 0 {
                            continue;
                        }
                        out.push(Job {
                            index: out.len(),
                            pass,
                            profile: profile.clone(),
                            latency: *latency,
                            think_ms,
                            dir: dir.clone(),
                            strategy,
                        });
                    }
                }
            }
        }
    }
    out
}

/// The 1-minute load average.
fn load1() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn run(args: &Args) -> Result<()> {
    if let Some(file) = &args.rerender {
        return rerender(args, std::slice::from_ref(file));
    }
    if !args.merge.is_empty() {
        return rerender(args, &args.merge);
    }
    if !nix::unistd::geteuid().is_root() {
        bail!("run as root: speculations mount branches (FUSE)");
    }
    let mut latencies = Vec::new();
    for name in &args.latency {
        let mut latency = Latency::preset(name)?;
        if let Some(t) = args.ttft_ms {
            latency.ttft_ms = t;
        }
        if let Some(t) = args.tokens_per_s {
            latency.tokens_per_s = t;
        }
        latencies.push((name.clone(), latency));
    }
    let shard = args.shard.as_deref().map(parse_shard).transpose()?;
    let dirs: Vec<PathBuf> = if args.sessions.is_empty() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/sessions");
        let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.join("chat.jsonl").exists())
            .collect();
        v.sort();
        v
    } else {
        // Absolute: the patch is applied from inside the project's copy.
        args.sessions
            .iter()
            .map(|d| std::fs::canonicalize(d).with_context(|| format!("session {}", d.display())))
            .collect::<Result<_>>()?
    };
    if args.base_url.is_some() && args.model.is_none() {
        bail!("--base-url needs --model");
    }
    let work = PathBuf::from(format!("/var/tmp/shade-bench-spec/{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    if args.tmpfs {
        nix::mount::mount(
            Some("tmpfs"),
            &work,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("mode=0755"),
        )
        .context("mounting a tmpfs for the projects")?;
    }
    std::env::set_var("SHADE_STATE_DIR", work.join("state"));
    let meter = Arc::new(Meter::enter());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let all = jobs(args, &dirs, &latencies);
    let mine: Vec<Job> = all
        .into_iter()
        .filter(|j| shard.is_none_or(|(i, n)| j.index % n == i))
        .collect();
    let result = run_all(args, &mine, &work, &meter, &runtime);
    runtime.shutdown_timeout(Duration::from_secs(2));
    if args.tmpfs {
        let _ = nix::mount::umount2(&work, nix::mount::MntFlags::MNT_DETACH);
    }
    let _ = std::fs::remove_dir_all(&work);
    let runs = result?;
    let mode = match &args.base_url {
        Some(u) => format!(
            "a live model ({} at {u}; suggestions are its own)",
            args.model.as_deref().unwrap_or("")
        ),
        None => {
            let profiles: Vec<String> = latencies
                .iter()
                .map(|(n, l)| {
                    format!(
                        "`{n}`: {} ms to first token + {} ms per 1,000 prompt tokens, {} tokens/s",
                        l.ttft_ms, l.prefill_ms_per_ktok, l.tokens_per_s
                    )
                })
                .collect();
            format!("the recording replayed ({})", profiles.join("; "))
        }
    };
    let commit = commit();
    let header = format!(
        "# Speculation benchmark\n\nCommit {commit}{}. Model: {mode}. The user thinks {} ms at a \
         shown suggestion; {} pass(es); projects on {}; CPU and memory of discarded work from {}.\n\
         Counts are summed over passes; *wait*: the user's total waiting over the session (submit \
         or accept → result, per pass); \
         *time saved*: `none`'s wait less this strategy's; *accept → result*: accepted turns only. \
         Suggestions: {}; a suggestion is taken when it matches the user's real next input or a \
         hand-written equivalent (session.toml). Tokens: {}; *background cost* (suggestions, \
         speculations, summaries) at ${}/M input and ${}/M output tokens.",
        args.shard
            .as_deref()
            .map(|s| format!(" (shard {s})"))
            .unwrap_or_default(),
        args.think_ms
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(" / "),
        args.runs,
        if args.tmpfs {
            "a tmpfs"
        } else {
            "the disk (/var/tmp)"
        },
        meter.how(),
        match &args.suggester_url {
            Some(u) => format!(
                "made live by {} at {u} (the next input held out)",
                args.suggester_model
            ),
            None if args.base_url.is_some() => "the live model's own".into(),
            None => "the recorded (scripted) ones".into(),
        },
        if args.suggester_url.is_some() || args.base_url.is_some() {
            "as the servers report them (llama.cpp's server counts with the model's own tokenizer); \
             replayed calls estimated as characters / 4"
        } else {
            "estimated as characters / 4 (replay)"
        },
        args.price_in,
        args.price_out,
    );
    let prices = Prices {
        input_per_m: args.price_in,
        output_per_m: args.price_out,
    };
    let md = render::markdown(&runs, &header, prices);
    print!("{md}");
    if let Some(prefix) = &args.out {
        render::write(prefix, &md, &runs, &commit)?;
        std::fs::write(
            render::with_ext(prefix, ".json"),
            serde_json::to_string_pretty(&json!({
                "commit": commit,
                "header": header,
                "model": mode,
                "latency": latencies.iter().map(|(n, l)| json!({"profile": n, "latency": l})).collect::<Vec<_>>(),
                "shard": args.shard,
                "live": args.base_url.is_some(),
                "think_ms": args.think_ms,
                "passes": args.runs,
                "tmpfs": args.tmpfs,
                "meter": meter.how(),
                "summary": summary(&runs),
                "prices": prices,
                "suggester": args.suggester_url.as_ref().map(|u| json!({"url": u, "model": args.suggester_model})),
                "curve": curve::lines(&render::headline(&runs)),
                "runs": runs,
            }))?,
        )?;
    }
    Ok(())
}

fn run_all(
    args: &Args,
    jobs: &[Job],
    work: &Path,
    meter: &Arc<Meter>,
    runtime: &tokio::runtime::Runtime,
) -> Result<Vec<SessionRun>> {
    let mut runs = Vec::new();
    for job in jobs {
        let (pass, strategy, latency, dir) = (job.pass, job.strategy, job.latency, &job.dir);
        {
            let session_dir = if dir.is_dir() {
                dir.clone()
            } else {
                dir.parent().unwrap_or(Path::new(".")).to_path_buf()
            };
            // A directory is named after itself, a cassette file after its stem.
            let named = if dir.is_dir() {
                session_dir.file_name()
            } else {
                dir.file_stem()
            };
            let name = named
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "session".into());
            let meta = SessionMeta::load(&session_dir)?;
            let recorded = Arc::new(cassettes::read(dir)?.with_equivalents(&meta.equivalents));
            let source = meta.source(&session_dir, &args.corpus, args.project.as_deref())?;
            let patch = meta.patch.as_ref().map(|p| session_dir.join(p));
            {
                eprintln!(
                    "speculation bench: {name} / {} (pass {}/{}, {}, think {} ms; job {})",
                    strategy.name(),
                    pass + 1,
                    args.runs,
                    job.profile,
                    job.think_ms,
                    job.index
                );
                let load1 = load1();
                let before = fuse_mounts(work);
                let project = materialise(
                    &source,
                    patch.as_deref(),
                    meta.git,
                    &work.join(format!("{name}-{}-{}", strategy.name(), job.index)),
                )?;
                let stats = Arc::new(ReplayStats::default());
                let (base_url, model, fast, _server) = match &args.base_url {
                    Some(url) => {
                        let m = args.model.clone().unwrap_or_default();
                        let f = args.fast_model.clone().unwrap_or_else(|| m.clone());
                        (url.clone(), m, f, None)
                    }
                    None => {
                        let server = FakeLlm::start(cassettes::router(
                            recorded.clone(),
                            latency,
                            stats.clone(),
                        ))?;
                        (
                            server.base_url.clone(),
                            "main".to_string(),
                            "fast".to_string(),
                            Some(server),
                        )
                    }
                };
                // A live server takes its key from OPENAI_API_KEY, as `shade chat` does.
                let config = LlmConfig {
                    base_url,
                    api_key: args
                        .base_url
                        .is_some()
                        .then(|| std::env::var("OPENAI_API_KEY").ok())
                        .flatten(),
                    model: Some(model.clone()),
                    fast_model: Some(fast.clone()),
                    ..LlmConfig::default()
                };
                let client = OpenAiClient::new(config)?;
                let suggester: Option<(Arc<dyn LlmProvider>, String)> = match &args.suggester_url {
                    Some(url) => Some((
                        Arc::new(OpenAiClient::new(LlmConfig {
                            base_url: url.clone(),
                            api_key: std::env::var("OPENAI_API_KEY").ok(),
                            model: Some(args.suggester_model.clone()),
                            fast_model: Some(args.suggester_model.clone()),
                            ..LlmConfig::default()
                        })?),
                        args.suggester_model.clone(),
                    )),
                    None => None,
                };
                let routed = Arc::new(Routed::new(Arc::new(client), suggester));
                let provider: Arc<dyn LlmProvider> =
                    Arc::new(MeteredProvider::new(routed.clone(), TokenStats::default()));
                let opts = Options {
                    strategy,
                    think: Duration::from_millis(job.think_ms),
                    accept: engine::same_or_equivalent(meta.equivalents.clone()),
                    finish_unaccepted: None,
                    suggest_after_last: false,
                    meter: Some(meter.clone()),
                };
                let turns = runtime.block_on(engine::run_session(
                    &recorded.inputs,
                    &project,
                    &Model {
                        provider,
                        model,
                        fast,
                    },
                    &opts,
                ));
                // A tool result the recording does not have at its step: the replay refused
                // it; the figures would describe another session, so the run stops here.
                let drifts = stats.drift_lines();
                if !drifts.is_empty() {
                    bail!(
                        "replay drift in {name} / {} (pass {}): a tool result's outcome differs \
                         from the recording, so its answers no longer apply (re-record the \
                         session, or find why the tool behaves differently now):\n  {}",
                        strategy.name(),
                        pass + 1,
                        drifts.join("\n  ")
                    );
                }
                let turns = turns?;
                let _ = std::fs::remove_dir_all(&project);
                runs.push(SessionRun {
                    session: name.clone(),
                    strategy,
                    pass,
                    turns,
                    replay_answered: stats.answered.load(Ordering::Relaxed),
                    replay_missed: stats.missed.load(Ordering::Relaxed),
                    // A leak, not the warm connections the session's dropped branches
                    // left in the pool (by design; let go here).
                    leftover_mounts: {
                        shade_fusefs::drain_branch_pool();
                        fuse_mounts(work).saturating_sub(before)
                    },
                    unrecorded_speculation: stats.unrecorded_speculation.load(Ordering::Relaxed),
                    tokens: routed.used(),
                    profile: job.profile.clone(),
                    think_ms: job.think_ms,
                    load1,
                    job: job.index,
                });
            }
        }
    }
    Ok(runs)
}
