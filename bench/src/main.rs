//! shade-bench: shade against native, kernel overlayfs, fuse-overlayfs, `cp -r` and
//! `git worktree add`, side by side in one run, as issue 4 asks.
//!
//! `cargo run --release -p shade-bench -- [--quick] [--json FILE] [--markdown FILE]`
//! (as root: it mounts a tmpfs and overlays). Everything lives under
//! `/var/tmp/shade-bench/<pid>/` and is unmounted and removed at the end, on error and on
//! Ctrl-C too.

mod agent;
mod fresh;
mod measures;
mod mounts;
mod report;
mod requests;
mod systems;
mod timing;
mod tree;

use anyhow::{bail, Context, Result};
use clap::Parser;
use measures::{Config, Results};
use mounts::RunDir;
use serde_json::json;
use std::path::PathBuf;
use std::time::Instant;
use systems::{Instance, Prepared, System};
use tree::{Layout, Sizes};

/// Command line.
#[derive(Parser, Debug)]
#[command(about = "Benchmark shade against native, overlayfs, fuse-overlayfs, cp -r, git worktree")]
struct Args {
    /// Fewer runs and smaller trees: a CI smoke run in under two minutes.
    #[arg(long)]
    quick: bool,
    /// Write all samples, medians and the environment as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Also write the markdown report here.
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// Timed runs per measure (default 5, or 3 with --quick).
    #[arg(long)]
    runs: Option<usize>,
    /// FUSE worker threads per shade branch.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Only these sections (comma-separated): fileops, requests, agent, fresh, create,
    /// accept, many.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
}

const SECTIONS: [&str; 7] = [
    "fileops", "requests", "agent", "fresh", "create", "accept", "many",
];

fn main() {
    let args = Args::parse();
    let started = Instant::now();
    let outcome = run(&args);
    // Whatever happened, nothing of ours may stay mounted.
    let leftover = mounts::mounts_under(std::path::Path::new(mounts::BASE));
    let own = PathBuf::from(mounts::BASE).join(std::process::id().to_string());
    let mut code = 0;
    match leftover {
        Ok(list) => {
            let ours: Vec<_> = list.iter().filter(|p| p.starts_with(&own)).collect();
            if !ours.is_empty() {
                eprintln!("bench: ERROR: still mounted: {ours:?}");
                code = 1;
            }
        }
        Err(e) => eprintln!("bench: cannot check /proc/mounts: {e:#}"),
    }
    if let Err(e) = outcome {
        eprintln!("bench: error: {e:#}");
        code = 1;
    }
    eprintln!(
        "bench: finished in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    std::process::exit(code);
}

fn run(args: &Args) -> Result<()> {
    for s in &args.only {
        if !SECTIONS.contains(&s.as_str()) {
            bail!("unknown section {s:?} (known: {})", SECTIONS.join(", "));
        }
    }
    let want = |s: &str| args.only.is_empty() || args.only.iter().any(|o| o == s);
    if !nix::unistd::geteuid().is_root() {
        bail!("run as root: the benchmark mounts tmpfs and overlays and drops caches");
    }
    timing::install_signal_handlers()?;
    mounts::clean_stale_runs();

    let started = Instant::now();
    let sizes = if args.quick {
        Sizes {
            tree_files: 2_000,
            gen_files: 10_000,
            blob_bytes: 256 << 20,
            accept_files: 2_000,
        }
    } else {
        Sizes {
            tree_files: 10_000,
            gen_files: 100_000,
            blob_bytes: 1 << 30,
            accept_files: 2_000,
        }
    };
    let cfg = Config {
        runs: args.runs.unwrap_or(if args.quick { 3 } else { 5 }).max(1),
        threads: args.threads,
        write_files: 1_000,
        accept_sizes: vec![1, 10, 100, 1_000, 2_000],
        many: if args.quick { 50 } else { 200 },
        drop_caches: true,
    };

    // FUSE daemons need CPU for every request: on a busy machine every FUSE system pays
    // scheduling latency that native and kernel overlayfs do not. Record it.
    let load = |when: &str| {
        let l = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let l1 = l.split_whitespace().next().unwrap_or("?").to_string();
        format!("load average {when}: {l1}")
    };
    let load_start = load("at start");
    // Taken now: the commit checked out at the end may not be the one that was built.
    let env = environment();
    let rundir = RunDir::create()?;
    let layout = Layout::new(&rundir.tmpfs());
    eprintln!("bench: building trees in {}", layout.base.display());
    let info = tree::build(
        &layout,
        &sizes,
        want("create"),
        want("agent"),
        want("agent") || want("fresh"),
    )?;

    let mut res = Results::default();
    if want("fileops") || want("requests") || want("agent") {
        eprintln!("bench: native warm-up build of the bench crate (cargo check --offline)");
        let (build, ()) = timing::time(|| measures::cargo_check(&layout.lower.join(tree::CRATE)))?;
        res.notes.push(format!(
            "bench crate cold `cargo check` (native, untimed warm-up): {}",
            report::secs(build)
        ));
        let mut views = Vec::new();
        for system in System::VIEWS {
            let prepared = Prepared::new(system, &layout, None)?;
            match Instance::create(system, &layout.lower, &layout, prepared, cfg.threads) {
                Ok(v) => views.push(v),
                // A missing peer (no fuse-overlayfs, no overlay module) leaves a hole in
                // the table, not a failed run.
                Err(e) if !matches!(system, System::Native | System::Shade) => {
                    res.notes.push(format!("{} skipped: {e:#}", system.name()));
                }
                Err(e) => return Err(e),
            }
        }
        let native_scratch = systems::scratch(&layout, "native-writes")?;
        let mut r = Ok(());
        if want("fileops") {
            r = measures::file_ops(&views, &native_scratch, &cfg, &mut res);
        }
        if r.is_ok() && want("requests") {
            r = measures::request_counts(&views, &cfg, &mut res);
        }
        if r.is_ok() && want("agent") {
            r = agent::workloads(&views, &layout, &cfg, &mut res);
        }
        for v in views {
            v.close()?;
        }
        r?;
    }
    if want("fresh") {
        fresh::fresh_branches(&layout, &info, &cfg, &mut res)?;
    }
    if want("create") {
        measures::creation(
            &layout,
            &layout.tree(),
            &layout.git_tree,
            info.tree_files,
            &cfg,
            &mut res,
        )?;
        measures::creation(
            &layout,
            &layout.gen,
            &layout.git_gen,
            info.gen_files,
            &cfg,
            &mut res,
        )?;
    }
    if want("accept") {
        measures::accept_abort(&layout, &cfg, &mut res)?;
    }
    if want("many") {
        measures::many_branches(&layout, &cfg, &mut res)?;
    }
    rundir.finish().context("cleaning up the run directory")?;
    res.notes.push(format!(
        "{load_start}, {} (on {} CPUs)",
        load("at end"),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    ));

    let title = format!(
        "shade-bench{}: {} files ({:.0} MB) tree, {} MiB read, medians of {} runs",
        if args.quick { " --quick" } else { "" },
        info.tree_files,
        info.tree_bytes as f64 / 1e6,
        sizes.blob_bytes >> 20,
        cfg.runs
    );
    let md = report::markdown(&res, &title);
    println!("{md}");
    let elapsed = started.elapsed().as_secs_f64();
    eprintln!("bench: measured in {elapsed:.0} s");
    if let Some(path) = &args.markdown {
        std::fs::write(path, &md).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.json {
        let doc = json!({
            "mode": if args.quick { "quick" } else { "full" },
            "seconds": elapsed,
            "environment": env,
            "config": cfg,
            "sizes": sizes,
            "tree": info,
            "results": res,
        });
        let text = serde_json::to_string_pretty(&doc)?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("bench: JSON written to {}", path.display());
    }
    Ok(())
}

/// Machine facts that make a result comparable later.
fn environment() -> serde_json::Value {
    let cmd = |p: &str, a: &[&str]| {
        std::process::Command::new(p)
            .args(a)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    json!({
        "kernel": cmd("uname", &["-r"]),
        "cpus": std::thread::available_parallelism().map(|n| n.get()).ok(),
        "shade_commit": cmd("git", &["rev-parse", "HEAD"]),
        // The build includes uncommitted work in these paths, if any.
        "shade_dirty": cmd("git", &["status", "--porcelain", "--", "fusefs", "Cargo.lock"]),
        "loadavg_start": std::fs::read_to_string("/proc/loadavg").ok().map(|s| s.trim().to_string()),
        "fuse_overlayfs": cmd("fuse-overlayfs", &["--version"]),
        "date": cmd("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]),
    })
}
