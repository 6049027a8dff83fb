//! The speculation benchmark's recorder: a hand-written session script (bench/corpus/scripts,
//! the format `spec::script` describes) → the cassettes `shade chat --record FILE` would
//! write for that conversation (`chat.jsonl`, `chat.background.jsonl`) plus `session.toml`
//! (project, patch, git, kind, about) in `--out`.
//!
//! `shade chat` asks for suggestions and speculates only at a terminal; rather than drive its
//! line editor in tmux, the recorder runs the chat's own library paths (the same ones the
//! benchmark uses: `RecordingProvider` over an OpenAI client, suggestions from the cached
//! prefix, `Speculation::start` with pipelined suggestions, `Finished::apply`) against a
//! local fake model that answers from the script. The project is a fresh copy, and the tool
//! calls run for real in it (speculations in branches: run as root).
//!
//! `cargo run --release -p shade-bench --bin spec-record -- SCRIPT.json --out
//!  bench/corpus/sessions/NAME [--corpus /var/tmp/shade-corpus]`

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use shade_agent::background::{MeteredProvider, TokenStats};
use shade_agent::llm::cassette::{background_path, load, RecordingProvider};
use shade_agent::llm::{LlmConfig, LlmProvider, OpenAiClient};
use shade_bench::spec::engine::{self, Model, Options, Strategy};
use shade_bench::spec::project::{materialise, write_inline, SessionMeta, DEFAULT_CORPUS};
use shade_bench::spec::script::{router, Script};
use shade_testkit::FakeLlm;

#[derive(Parser, Debug)]
#[command(about = "Record a session script as shade chat cassettes")]
struct Args {
    /// The session script (JSON).
    script: PathBuf,
    /// The session directory to write (chat.jsonl, chat.background.jsonl, session.toml,
    /// project/ for inline projects, patch.diff).
    #[arg(long)]
    out: PathBuf,
    /// Where bench/corpus/fetch.sh put the projects.
    #[arg(long, default_value = DEFAULT_CORPUS)]
    corpus: PathBuf,
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("spec-record: error: {e:#}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("run as root: speculations mount branches (FUSE)");
    }
    let text = std::fs::read_to_string(&args.script)
        .with_context(|| format!("reading {}", args.script.display()))?;
    let script: Script = serde_json::from_str(&text)
        .with_context(|| format!("parsing {}", args.script.display()))?;
    let out = &args.out;
    std::fs::create_dir_all(out)?;
    for stale in [
        "chat.jsonl",
        "chat.background.jsonl",
        "patch.diff",
        "session.toml",
    ] {
        let _ = std::fs::remove_file(out.join(stale));
    }
    let _ = std::fs::remove_dir_all(out.join("project"));
    let mut meta = SessionMeta {
        project: script.project.clone().unwrap_or_else(|| "inline".into()),
        patch: None,
        git: script.git,
        kind: script.kind.clone(),
        about: script.about.clone(),
        equivalents: script
            .turns
            .iter()
            .filter(|t| !t.equivalents.is_empty())
            .map(|t| (t.user.clone(), t.equivalents.clone()))
            .collect(),
    };
    if let Some(p) = &script.patch {
        let from = args
            .script
            .parent()
            .unwrap_or(std::path::Path::new("."))
            .join(p);
        std::fs::copy(&from, out.join("patch.diff"))
            .with_context(|| format!("copying {}", from.display()))?;
        meta.patch = Some("patch.diff".into());
    }
    if meta.project == "inline" {
        if script.files.is_empty() {
            bail!("the script names no project and has no files");
        }
        write_inline(&script.files, &script.executable, &out.join("project"))?;
    }
    meta.save(out)?;
    let work = PathBuf::from(format!("/var/tmp/shade-spec-record/{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    std::env::set_var("SHADE_STATE_DIR", work.join("state"));
    let result = record(args, &script, &meta, &work);
    let _ = std::fs::remove_dir_all(&work);
    result
}

fn record(args: &Args, script: &Script, meta: &SessionMeta, work: &std::path::Path) -> Result<()> {
    let out = &args.out;
    let source = meta.source(out, &args.corpus, None)?;
    let patch = meta.patch.as_ref().map(|p| out.join(p));
    let project = materialise(&source, patch.as_deref(), meta.git, &work.join("project"))?;
    let script = Arc::new(script.clone());
    let llm = FakeLlm::start(router(script.clone()))?;
    let client = OpenAiClient::new(LlmConfig {
        base_url: llm.base_url.clone(),
        model: Some("main".into()),
        ..LlmConfig::default()
    })?;
    let cassette = out.join("chat.jsonl");
    let recorder = RecordingProvider::create(client, &cassette)?;
    let provider: Arc<dyn LlmProvider> = Arc::new(MeteredProvider::new(
        Arc::new(recorder),
        TokenStats::default(),
    ));
    let model = Model {
        provider,
        model: "main".into(),
        fast: "fast".into(),
    };
    let s = script.clone();
    let opts = Options {
        strategy: Strategy::Pipelined,
        think: Duration::from_millis(300),
        accept: engine::same_input(),
        finish_unaccepted: Some(Arc::new(move |suggestion: &str| {
            s.turns.iter().any(|t| {
                t.suggestion.as_deref() == Some(suggestion) && t.speculation_steps.is_some()
            })
        })),
        suggest_after_last: true,
        meter: None,
    };
    let inputs: Vec<String> = script.turns.iter().map(|t| t.user.clone()).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let turns = runtime.block_on(engine::run_session(&inputs, &project, &model, &opts))?;
    let main = load(&cassette)?.len();
    let side = background_path(&cassette);
    let background = if side.exists() { load(&side)?.len() } else { 0 };
    let accepted = turns.iter().filter(|t| t.accepted).count();
    eprintln!(
        "spec-record: {} → {}: {} turns ({accepted} taken from a suggestion), {main} main and \
         {background} background calls",
        script.name,
        out.display(),
        turns.len()
    );
    runtime.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}
