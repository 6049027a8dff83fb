//! Fresh-branch cold paths (issue 20): every command is the first thing run in its own
//! fresh view of a warm project — what each `shade run` and each speculation pays. The
//! project is `repo/` (the 10k-file tree as a real git repository with a commit), warm in
//! the page cache: natively read right before every sample.
//!
//! Per command and round, each system (rotating order) gets a new view: a new shade
//! branch, a new kernel overlayfs or fuse-overlayfs mount over the same lower; native
//! runs in the project itself. Only the command is timed, not the view's creation.
//! After each shade sample the branch's changeset is checked: a read-only command must
//! leave none (a `git status` that rewrites `.git/index` would).

use crate::measures::{Config, RequestCount, Results};
use crate::systems::{Instance, Prepared, System};
use crate::timing::{check_interrupted, sh, time};
use crate::tree::{Layout, REPO};
use anyhow::{Context, Result};

/// Measure names and the commands, run in `repo/` of each view.
pub const COMMANDS: [(&str, &str); 4] = [
    ("fresh git status", "git status --porcelain | wc -l"),
    ("fresh git diff", "git diff --stat | wc -l"),
    // `--no-ignore`: the crates' own .gitignore files are not what is measured.
    ("fresh rg", "rg --no-ignore -c 'fn ' | wc -l"),
    ("fresh find", "find . -type f | wc -l"),
];

/// Run every command of [`COMMANDS`] first in fresh views, `cfg.runs` rounds each.
pub fn fresh_branches(layout: &Layout, cfg: &Config, res: &mut Results) -> Result<()> {
    let repo = layout.lower.join(REPO);
    // Settle git's racy-clean entries once (files written in the index's second are
    // re-hashed by every status until the index is newer than them), as in a project
    // that has been worked in.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    sh(
        &repo,
        "git update-index -q --refresh; git status --porcelain >/dev/null",
    )
    .context("settling the bench repository's index")?;
    let systems = [
        System::Native,
        System::Shade,
        System::KernelOverlay,
        System::FuseOverlayfs,
    ];
    let mut dirty = Vec::new();
    for (measure, cmd) in COMMANDS {
        eprintln!("bench: {measure}");
        let mut samples: Vec<Vec<f64>> = systems.iter().map(|_| Vec::new()).collect();
        let mut outputs: Vec<String> = systems.iter().map(|_| String::new()).collect();
        let mut skipped: Vec<Option<String>> = systems.iter().map(|_| None).collect();
        for run in 0..cfg.runs {
            for j in 0..systems.len() {
                let k = (j + run) % systems.len();
                let system = systems[k];
                if skipped[k].is_some() {
                    continue;
                }
                check_interrupted()?;
                // Warm: the user's page cache holds the project (and git's own files).
                sh(&repo, cmd)?;
                let prepared = Prepared::new(system, layout, None)?;
                let view =
                    match Instance::create(system, &layout.lower, layout, prepared, cfg.threads) {
                        Ok(v) => v,
                        Err(e) if !matches!(system, System::Native | System::Shade) => {
                            skipped[k] = Some(format!("{e:#}"));
                            continue;
                        }
                        Err(e) => return Err(e),
                    };
                let dir = view.root().join(REPO);
                let (secs, out) = time(|| sh(&dir, cmd))?;
                if let Some(n) = view.changes() {
                    if n > 0 {
                        dirty.push(format!("{measure} left {n} change(s) in the shade branch"));
                    }
                }
                view.close()?;
                samples[k].push(secs);
                outputs[k] = out;
            }
        }
        for (k, system) in systems.iter().enumerate() {
            if let Some(why) = &skipped[k] {
                res.notes
                    .push(format!("{measure}: {} skipped: {why}", system.name()));
                continue;
            }
            res.push(measure, system.name(), "s", std::mem::take(&mut samples[k]));
            res.push_output(std::mem::take(&mut outputs[k]));
        }
    }
    // Requests, which unlike times do not move with load: one more fresh view per FUSE
    // system and command, traced.
    for (measure, cmd) in COMMANDS {
        for system in [System::Shade, System::FuseOverlayfs] {
            check_interrupted()?;
            sh(&repo, cmd)?;
            let prepared = Prepared::new(system, layout, None)?;
            let Ok(view) = Instance::create(system, &layout.lower, layout, prepared, cfg.threads)
            else {
                continue;
            };
            let counted = crate::requests::Tracer::new(view.root()).and_then(|tracer| {
                let dir = view.root().join(REPO);
                tracer.count(|| sh(&dir, cmd).map(drop))
            });
            view.close()?;
            match counted {
                Ok(counts) => res.requests.push(RequestCount {
                    operation: measure.into(),
                    system: system.name().into(),
                    counts,
                }),
                Err(e) => {
                    res.notes
                        .push(format!("{measure}: requests not counted: {e:#}"));
                }
            }
        }
    }
    dirty.dedup();
    if dirty.is_empty() {
        res.notes
            .push("fresh branches: no read-only command left a change in its shade branch".into());
    }
    res.notes.extend(dirty);
    Ok(())
}
