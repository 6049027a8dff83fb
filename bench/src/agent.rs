//! What coding agents run all day, on every live view (issue 12): a clean offline
//! `cargo build` of a crate with dependencies, `git status` and `git checkout` of another
//! branch in a 10k-file repository, `rg` over the tree, and `npm ci --offline` creating
//! thousands of files from the local npm cache.
//!
//! Native runs on copies under the scratch area (never in the project itself): the live
//! shade branch's lower watcher and the overlays' lower layer must not see native's
//! writes while the other systems are timed.

use crate::measures::{cold, rounds, Config, Results};
use crate::systems::{Instance, System};
use crate::timing::{check_interrupted, sh, time};
use crate::tree::{Layout, CRATE, NPM, REPO, TREE};
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

pub const M_CARGO_BUILD: &str = "clean cargo build";
pub const M_GIT_STATUS_FIRST: &str = "first git status";
pub const M_GIT_STATUS: &str = "warm git status";
pub const M_GIT_CHECKOUT: &str = "git checkout";
pub const M_RG_FIRST: &str = "first rg";
pub const M_RG: &str = "warm rg";
pub const M_NPM: &str = "npm ci";

/// Counts matching lines per file the way an agent's search tool does (`--no-ignore`: the
/// tree's crates ship .gitignore files that would hide different files on each system).
const RG: &str = "rg --no-ignore -c 'fn ' | wc -l";
const GIT_STATUS: &str = "git status --porcelain | wc -l";
const CHECKOUT_OTHER: &str = "git checkout -q other";
const CHECKOUT_MAIN: &str = "git checkout -q main";
const NPM_CI: &str =
    "rm -rf node_modules && npm ci --offline --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null";

/// Where system `v` runs the workloads: its view of the project, or native's copies.
struct Places {
    repo: PathBuf,
    krate: PathBuf,
    npm: PathBuf,
    tree: PathBuf,
}

fn places(v: &Instance, native_copies: &Path) -> Places {
    let base = if v.system == System::Native {
        native_copies
    } else {
        v.root()
    };
    Places {
        repo: base.join(REPO),
        krate: base.join(CRATE),
        npm: base.join(NPM),
        // Read-only: native reads the project itself.
        tree: v.root().join(TREE),
    }
}

/// Run every agent workload on every view, interleaved like the file operations.
pub fn workloads(
    views: &[Instance],
    layout: &Layout,
    cfg: &Config,
    res: &mut Results,
) -> Result<()> {
    let copies = crate::systems::scratch(layout, "native-agent")?;
    for what in [REPO, CRATE, NPM] {
        sh(
            &layout.lower,
            &format!(
                "tar cf - --exclude=./{CRATE}/target ./{what} | tar xf - -C '{}'",
                copies.display()
            ),
        )
        .with_context(|| format!("copying {what} for native"))?;
    }

    eprintln!("bench: {M_GIT_STATUS_FIRST}");
    // Once per view: the first status in a fresh view is what an agent's first step pays
    // (an overlay showing other inode numbers than the index recorded re-hashes files).
    let firsts = rounds(views, 1, |_, v| {
        let p = places(v, &copies);
        time(|| sh(&p.repo, GIT_STATUS))
    })?;
    push_all(views, res, M_GIT_STATUS_FIRST, firsts);

    eprintln!("bench: {M_GIT_STATUS}");
    let warm = rounds(views, cfg.runs, |_, v| {
        let p = places(v, &copies);
        sh(&p.repo, GIT_STATUS)?;
        time(|| sh(&p.repo, GIT_STATUS))
    })?;
    push_all(views, res, M_GIT_STATUS, warm);

    eprintln!("bench: {M_GIT_CHECKOUT}");
    let checkouts = rounds(views, cfg.runs, |_, v| {
        let p = places(v, &copies);
        let t = time(|| sh(&p.repo, CHECKOUT_OTHER))?;
        sh(&p.repo, CHECKOUT_MAIN)?;
        Ok(t)
    })?;
    push_all(views, res, M_GIT_CHECKOUT, checkouts);

    for (measure, first) in [(M_RG_FIRST, true), (M_RG, false)] {
        eprintln!("bench: {measure}");
        let samples = rounds(views, cfg.runs, |_, v| {
            let p = places(v, &copies);
            if first {
                cold(cfg)?;
            } else {
                sh(&p.tree, RG)?;
            }
            time(|| sh(&p.tree, RG))
        })?;
        push_all(views, res, measure, samples);
    }

    // The slowest workloads: at most 3 runs each.
    let runs = cfg.runs.min(3);
    eprintln!("bench: {M_CARGO_BUILD}");
    let builds = rounds(views, runs, |run, v| {
        let p = places(v, &copies);
        check_interrupted()?;
        // A fresh target dir each run, inside the gitignored target/ as a real build.
        time(|| {
            sh(
                &p.krate,
                &format!(
                    "CARGO_TARGET_DIR=target/clean-{run} cargo build --offline --quiet && echo ok"
                ),
            )
        })
    })?;
    push_all(views, res, M_CARGO_BUILD, builds);

    eprintln!("bench: {M_NPM}");
    let probe = sh(&copies.join(NPM), NPM_CI);
    match probe {
        Ok(_) => {
            let installs = rounds(views, runs, |_, v| {
                let p = places(v, &copies);
                sh(&p.npm, "rm -rf node_modules")?;
                time(|| {
                    sh(
                        &p.npm,
                        &format!("{NPM_CI} && find node_modules -type f | wc -l"),
                    )
                })
            })?;
            push_all(views, res, M_NPM, installs);
        }
        Err(e) => res.notes.push(format!(
            "{M_NPM} skipped: the npm cache is not ready (scripts/setup.sh fills it): {e:#}"
        )),
    }
    Ok(())
}

fn push_all(
    views: &[Instance],
    res: &mut Results,
    measure: &str,
    samples: Vec<Vec<(f64, String)>>,
) {
    for (v, sm) in views.iter().zip(samples) {
        let out = sm.last().map(|(_, o)| o.clone()).unwrap_or_default();
        res.push(
            measure,
            v.system.name(),
            "s",
            sm.into_iter().map(|(t, _)| t).collect(),
        );
        res.push_output(out);
    }
}
