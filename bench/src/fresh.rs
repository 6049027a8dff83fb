//! Fresh-branch cold paths (issue 20): every command is the first thing run in its own
//! fresh view of a warm project — what each `shade run` and each speculation pays. The
//! projects are `repo/` (the 10k-file tree as a real git repository with a commit), a small
//! crate with its test binaries built (`cargo test`) and a small Python package (`pytest`),
//! warm in the page cache: natively run right before every sample.
//!
//! Per command and round, each system (rotating order) gets a new view: a new shade
//! branch, a new kernel overlayfs, fuse-overlayfs or BranchFS mount over the same lower;
//! native runs in the project itself. Only the command is timed, not the view's creation —
//! except for `cp -r` and `git worktree add` of the command's project, whose creation is
//! timed with the command: that is what a user would pay for an isolated copy.
//! After each shade sample the branch's changeset is checked: a read-only command must
//! leave none (a `git status` that rewrites `.git/index` would).

use crate::measures::{Config, RequestCount, Results};
use crate::systems::{Instance, Prepared, System};
use crate::timing::{check_interrupted, sh, time};
use crate::tree::{Layout, TreeInfo, CARGO_TEST, PYTEST, REPO};
use anyhow::{Context, Result};

/// Measure names, the project (directory of the lower) and the commands run in it.
pub const COMMANDS: [(&str, &str, &str); 6] = [
    ("fresh git status", REPO, "git status --porcelain | wc -l"),
    ("fresh git diff", REPO, "git diff --stat | wc -l"),
    // `--no-ignore`: the crates' own .gitignore files are not what is measured.
    ("fresh rg", REPO, "rg --no-ignore -c 'fn ' | wc -l"),
    ("fresh find", REPO, "find . -type f | wc -l"),
    (
        "fresh cargo test",
        CARGO_TEST,
        "cargo test --offline --locked -q 2>&1 | grep -c '^test result: ok'",
    ),
    // apt's pytest runs on the system python; the summary without its time.
    (
        "fresh pytest",
        PYTEST,
        "/usr/bin/python3 -m pytest -q 2>&1 | tail -1 | sed 's/ in [0-9.]*s.*//'",
    ),
];

/// The systems compared, in the table's order.
pub const SYSTEMS: [System; 8] = [
    System::Native,
    System::Shade,
    System::ShadeWarmed,
    System::KernelOverlay,
    System::FuseOverlayfs,
    System::BranchFs,
    System::CpR,
    System::GitWorktree,
];

/// Run every command of [`COMMANDS`] first in fresh views, `cfg.runs` rounds each.
pub fn fresh_branches(
    layout: &Layout,
    info: &TreeInfo,
    cfg: &Config,
    res: &mut Results,
) -> Result<()> {
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
    let systems = SYSTEMS;
    let mut dirty = Vec::new();
    for (measure, project, cmd) in COMMANDS {
        if info.missing_fixtures.iter().any(|m| m == project) {
            res.notes.push(format!(
                "{measure} skipped: its fixture is missing (run scripts/setup.sh bench)"
            ));
            continue;
        }
        eprintln!("bench: {measure}");
        let src = layout.lower.join(project);
        let mut samples: Vec<Vec<f64>> = systems.iter().map(|_| Vec::new()).collect();
        let mut outputs: Vec<String> = systems.iter().map(|_| String::new()).collect();
        let mut skipped: Vec<Option<String>> = systems.iter().map(|_| None).collect();
        if !src.join(".git").exists() {
            let w = systems.iter().position(|s| *s == System::GitWorktree);
            if let Some(w) = w {
                skipped[w] = Some("the project is not a git repository".into());
            }
        }
        for run in 0..cfg.runs {
            for j in 0..systems.len() {
                let k = (j + run) % systems.len();
                let system = systems[k];
                if skipped[k].is_some() {
                    continue;
                }
                check_interrupted()?;
                // Warm: the user's page cache holds the project (and git's own files).
                sh(&src, cmd)?;
                // A copy or a worktree is of the project itself, made inside the timing.
                let copies = matches!(system, System::CpR | System::GitWorktree);
                let (secs, view, out) = if copies {
                    let prepared = Prepared::new(system, layout, Some(&src.join(".git")))?;
                    let mut made = None;
                    let timed = time(|| {
                        let v = Instance::create(system, &src, layout, prepared, cfg.threads)?;
                        let dir = v.root().to_path_buf();
                        made = Some(v);
                        sh(&dir, cmd)
                    });
                    match (timed, made) {
                        (Ok((secs, out)), Some(v)) => (secs, v, out),
                        (res, _) => {
                            let why = res
                                .err()
                                .map_or("no copy made".into(), |e| format!("{e:#}"));
                            skipped[k] = Some(why);
                            continue;
                        }
                    }
                } else {
                    let prepared = Prepared::new(system, layout, None)?;
                    let view = match Instance::create(
                        system,
                        &layout.lower,
                        layout,
                        prepared,
                        cfg.threads,
                    ) {
                        Ok(v) => v,
                        Err(e)
                            if !matches!(
                                system,
                                System::Native | System::Shade | System::ShadeWarmed
                            ) =>
                        {
                            skipped[k] = Some(format!("{e:#}"));
                            continue;
                        }
                        Err(e) => return Err(e),
                    };
                    let dir = view.root().join(project);
                    match time(|| sh(&dir, cmd)) {
                        Ok((secs, out)) => (secs, view, out),
                        // A peer that cannot run the command is a hole in the table.
                        Err(e)
                            if !matches!(
                                system,
                                System::Native | System::Shade | System::ShadeWarmed
                            ) =>
                        {
                            skipped[k] = Some(format!("{e:#}"));
                            view.close()?;
                            continue;
                        }
                        Err(e) => return Err(e),
                    }
                };
                // git, rg and find only read; builds and test runs write (caches, locks).
                if let Some(n) = view.changes().filter(|_| project == REPO) {
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
    for (measure, project, cmd) in COMMANDS {
        if info.missing_fixtures.iter().any(|m| m == project) {
            continue;
        }
        for system in [
            System::Shade,
            System::ShadeWarmed,
            System::FuseOverlayfs,
            System::BranchFs,
        ] {
            check_interrupted()?;
            sh(&layout.lower.join(project), cmd)?;
            let prepared = Prepared::new(system, layout, None)?;
            let Ok(view) = Instance::create(system, &layout.lower, layout, prepared, cfg.threads)
            else {
                continue;
            };
            let counted = crate::requests::Tracer::new(view.root()).and_then(|tracer| {
                if skipped_peer(res, measure, system) {
                    anyhow::bail!("{} could not run it", system.name());
                }
                let dir = view.root().join(project);
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

/// Whether `system` was skipped for `measure` in the timed runs (its note says why).
fn skipped_peer(res: &Results, measure: &str, system: System) -> bool {
    res.get(measure, system.name()).is_none()
}
