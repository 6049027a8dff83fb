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
use shade_bench::spec::engine::{self, Model, Options, Strategy};
use shade_bench::spec::meter::Meter;
use shade_bench::spec::project::{materialise, SessionMeta, DEFAULT_CORPUS};
use shade_bench::spec::report::{self, SessionRun};
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
        default_value = "none,peer,runnable,pipelined"
    )]
    strategies: Vec<Strategy>,
    /// Model latency preset: local or hosted.
    #[arg(long, default_value = "local")]
    latency: String,
    /// Time to first token (overrides the preset).
    #[arg(long)]
    ttft_ms: Option<u64>,
    /// Generation speed in tokens/s (overrides the preset).
    #[arg(long)]
    tokens_per_s: Option<f64>,
    /// How long the scripted user looks at a shown suggestion before answering.
    #[arg(long, default_value_t = 1500)]
    think_ms: u64,
    /// Passes over every session and strategy.
    #[arg(long, default_value_t = 1)]
    runs: usize,
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

/// `PREFIX.EXT` for the report files.
fn with_ext(prefix: &Path, ext: &str) -> PathBuf {
    let mut p = prefix.as_os_str().to_owned();
    p.push(ext);
    PathBuf::from(p)
}

/// Write the markdown and the SVG plot beside `prefix` (the JSON is the caller's).
fn write_md_svg(prefix: &Path, md: &str, runs: &[SessionRun], commit: &str) -> Result<()> {
    std::fs::write(with_ext(prefix, ".md"), md)?;
    std::fs::write(
        with_ext(prefix, ".svg"),
        report::svg(
            runs,
            &format!("Time saved per session by strategy ({commit})"),
        ),
    )?;
    Ok(())
}

/// `--rerender`: the markdown and SVG of a JSON written before (its header kept).
fn rerender(args: &Args, file: &Path) -> Result<()> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let doc: serde_json::Value = serde_json::from_str(&text)?;
    let runs: Vec<SessionRun> = serde_json::from_value(doc["runs"].clone())?;
    let commit = doc["commit"].as_str().unwrap_or("unknown");
    let header = doc["header"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| format!("# Speculation benchmark\n\nCommit {commit}."));
    let md = report::markdown(&runs, &header);
    print!("{md}");
    if let Some(prefix) = &args.out {
        write_md_svg(prefix, &md, &runs, commit)?;
    }
    Ok(())
}

fn run(args: &Args) -> Result<()> {
    if let Some(file) = &args.rerender {
        return rerender(args, file);
    }
    if !nix::unistd::geteuid().is_root() {
        bail!("run as root: speculations mount branches (FUSE)");
    }
    let mut latency = Latency::preset(&args.latency)?;
    if let Some(t) = args.ttft_ms {
        latency.ttft_ms = t;
    }
    if let Some(t) = args.tokens_per_s {
        latency.tokens_per_s = t;
    }
    let dirs = if args.sessions.is_empty() {
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
        args.sessions.clone()
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
    let result = run_all(args, &dirs, latency, &work, &meter, &runtime);
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
        None => format!(
            "the recording replayed with {} ms to first token and {} tokens/s",
            latency.ttft_ms, latency.tokens_per_s
        ),
    };
    let commit = commit();
    let header =
        format!(
        "# Speculation benchmark\n\nCommit {commit}. Model: {mode}. The user thinks {} ms at a \
         shown suggestion; {} pass(es); projects on {}; CPU and memory of discarded work from {}.\n\
         Counts are summed over passes; *wait*: the user's total waiting over the session (submit \
         or accept → result, per pass); \
         *time saved*: `none`'s wait less this strategy's; *accept → result*: accepted turns only.",
        args.think_ms,
        args.runs,
        if args.tmpfs { "a tmpfs" } else { "the disk (/var/tmp)" },
        meter.how()
    );
    let md = report::markdown(&runs, &header);
    print!("{md}");
    if let Some(prefix) = &args.out {
        write_md_svg(prefix, &md, &runs, &commit)?;
        let table: Vec<_> = report::table(&runs)
            .into_iter()
            .map(|((session, strategy), f)| json!({"session": session, "strategy": strategy, "figures": f}))
            .collect();
        std::fs::write(
            with_ext(prefix, ".json"),
            serde_json::to_string_pretty(&json!({
                "commit": commit,
                "header": header,
                "model": mode,
                "latency": latency,
                "live": args.base_url.is_some(),
                "think_ms": args.think_ms,
                "passes": args.runs,
                "tmpfs": args.tmpfs,
                "meter": meter.how(),
                "summary": table,
                "runs": runs,
            }))?,
        )?;
    }
    Ok(())
}

fn run_all(
    args: &Args,
    dirs: &[PathBuf],
    latency: Latency,
    work: &Path,
    meter: &Arc<Meter>,
    runtime: &tokio::runtime::Runtime,
) -> Result<Vec<SessionRun>> {
    let mut runs = Vec::new();
    for pass in 0..args.runs {
        for dir in dirs {
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
            let recorded = Arc::new(cassettes::read(dir)?);
            let meta = SessionMeta::load(&session_dir)?;
            let source = meta.source(&session_dir, &args.corpus, args.project.as_deref())?;
            let patch = meta.patch.as_ref().map(|p| session_dir.join(p));
            for &strategy in &args.strategies {
                eprintln!(
                    "speculation bench: {name} / {} (pass {}/{})",
                    strategy.name(),
                    pass + 1,
                    args.runs
                );
                let before = fuse_mounts(work);
                let project = materialise(
                    &source,
                    patch.as_deref(),
                    meta.git,
                    &work.join(format!("{name}-{}-{pass}", strategy.name())),
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
                let provider: Arc<dyn LlmProvider> = Arc::new(MeteredProvider::new(
                    Arc::new(client),
                    TokenStats::default(),
                ));
                let opts = Options {
                    strategy,
                    think: Duration::from_millis(args.think_ms),
                    accept: engine::same_input(),
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
                    leftover_mounts: fuse_mounts(work).saturating_sub(before),
                    unrecorded_speculation: stats.unrecorded_speculation.load(Ordering::Relaxed),
                });
            }
        }
    }
    Ok(runs)
}
