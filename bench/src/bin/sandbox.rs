//! What a sandboxed command costs: the fixed overhead of running `true` in a branch with
//! each isolation level, against a plain fork/exec, in interleaved rounds of one run; and
//! what setting a speculative shadow up and tearing it down costs (branch, cache branches).
//!
//! `cargo run --release -p shade-bench --bin sandbox -- [--rounds N]` (as root). Prints a
//! markdown table; everything lives under /var/tmp/shade-bench-sandbox.<pid> and is removed.

use anyhow::{Context, Result};
use shade_fusefs::sandbox::{self, CacheBranches, Isolation, Output, RunSpec, Termination};
use shade_fusefs::{Branch, BranchOptions, StateDir};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn main() -> Result<()> {
    let rounds: usize = std::env::args()
        .skip_while(|a| a != "--rounds")
        .nth(1)
        .map(|n| n.parse())
        .transpose()
        .context("--rounds N")?
        .unwrap_or(50);
    let base = PathBuf::from(format!(
        "/var/tmp/shade-bench-sandbox.{}",
        std::process::id()
    ));
    let result = run(&base, rounds);
    let _ = std::fs::remove_dir_all(&base);
    result
}

fn run(base: &Path, rounds: usize) -> Result<()> {
    let project = base.join("project");
    std::fs::create_dir_all(project.join("src"))?;
    std::fs::write(project.join("src/lib.rs"), "fn f() {}\n")?;
    let caches: Vec<PathBuf> = ["cargo", "cache", "npm"]
        .iter()
        .map(|c| base.join("home").join(c))
        .collect();
    for c in &caches {
        std::fs::create_dir_all(c)?;
        std::fs::write(c.join("index"), "x")?;
    }
    let opts = BranchOptions {
        state: StateDir::at(base.join("state")),
        ..BranchOptions::default()
    };
    let branch = Branch::create(&project, &opts)?;
    let cache_branches = CacheBranches::create(&project, &caches, &opts)?;
    let spec = |isolation: Isolation, binds| {
        let mut s = RunSpec::new(
            project.clone(),
            branch.mountpoint().to_path_buf(),
            project.clone(),
            vec!["true".into()],
        );
        s.output = Output::Capture { cap: 4096 };
        s.isolation = isolation;
        s.binds = binds;
        s
    };
    let speculative = Isolation::speculative(Duration::from_secs(60));
    let cases: Vec<(&str, Option<RunSpec>)> = vec![
        ("plain fork/exec of `true` (no sandbox)", None),
        (
            "`--unconfined`: mount namespace only (the runner before bubblewrap)",
            Some(spec(
                Isolation {
                    unconfined: true,
                    ..Isolation::default()
                },
                Vec::new(),
            )),
        ),
        (
            "sandbox: branch bound at the real path (`shade run`, live `--shadow`)",
            Some(spec(Isolation::default(), Vec::new())),
        ),
        (
            "+ network off",
            Some(spec(
                Isolation {
                    network: true,
                    ..Isolation::default()
                },
                Vec::new(),
            )),
        ),
        (
            "+ private /tmp + read-only rest",
            Some(spec(
                Isolation {
                    private_tmp: true,
                    read_only: true,
                    ..Isolation::default()
                },
                Vec::new(),
            )),
        ),
        (
            "speculative (all of it)",
            Some(spec(speculative, Vec::new())),
        ),
        (
            "speculative + 3 cache branches bound",
            Some(spec(speculative, cache_branches.binds())),
        ),
    ];
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for _ in 0..rounds {
        for (i, (_, s)) in cases.iter().enumerate() {
            let t = Instant::now();
            match s {
                None => {
                    let st = Command::new("true").status()?;
                    anyhow::ensure!(st.success());
                }
                Some(s) => {
                    let o = sandbox::run(s)?;
                    anyhow::ensure!(o.termination == Termination::Exited(0), "{o:?}");
                    anyhow::ensure!(o.namespaced, "ran without a namespace");
                }
            }
            samples[i].push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    let baseline = median(&mut samples[0].clone());
    println!("## Sandboxed command overhead ({rounds} interleaved rounds, ms)\n");
    println!("| run of `true` | median | p95 | × plain |");
    println!("|---|---:|---:|---:|");
    for ((name, _), s) in cases.iter().zip(samples.iter_mut()) {
        let m = median(s);
        println!("| {name} | {m:.2} | {:.2} | {:.1} |", p95(s), m / baseline);
    }
    drop(cache_branches);
    drop(branch);

    let mut create = Vec::new();
    let mut with_caches = Vec::new();
    for _ in 0..rounds.min(20) {
        let t = Instant::now();
        let b = Branch::create(&project, &opts)?;
        drop(b);
        create.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let b = Branch::create(&project, &opts)?;
        let c = CacheBranches::create(&project, &caches, &opts)?;
        drop(c);
        drop(b);
        with_caches.push(t.elapsed().as_secs_f64() * 1e3);
    }
    println!(
        "\n## Shadow set-up and tear-down ({} rounds, ms)\n",
        create.len()
    );
    println!("| | median | p95 |");
    println!("|---|---:|---:|");
    println!(
        "| branch create + drop | {:.2} | {:.2} |",
        median(&mut create),
        p95(&create)
    );
    println!(
        "| branch + 3 cache branches create + drop | {:.2} | {:.2} |",
        median(&mut with_caches),
        p95(&with_caches)
    );
    Ok(())
}

fn median(s: &mut [f64]) -> f64 {
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

fn p95(s: &[f64]) -> f64 {
    let mut v = s.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 * 0.95) as usize).min(v.len() - 1)]
}
