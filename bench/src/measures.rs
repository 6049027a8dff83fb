//! The measures of issue 4: file operations on every live view, branch creation against
//! copies and worktrees, accept/abort latency, and many idle branches at once.

use crate::systems::{shade_options, Instance, Prepared, System};
use crate::timing::{check_interrupted, drop_caches, sh, time, Stats};
use crate::tree::{self, Layout, ACCEPT, BLOB, CRATE, TREE};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use shade_fusefs::{AcceptFlags, Branch};
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};

/// Knobs shared by every measure.
#[derive(Clone, Debug, Serialize)]
pub struct Config {
    /// Timed runs per measure (medians are over these).
    pub runs: usize,
    /// FUSE threads per shade branch.
    pub threads: usize,
    /// Files written then removed per run.
    pub write_files: usize,
    /// Changed-file counts for accept/abort.
    pub accept_sizes: Vec<usize>,
    /// Branches alive at once.
    pub many: usize,
    /// Whether "first" runs really drop caches (needs root).
    pub drop_caches: bool,
}

/// One measure on one system.
#[derive(Clone, Debug, Serialize)]
pub struct Measurement {
    pub measure: String,
    pub system: String,
    /// "s" (lower is better), "GB/s" (higher is better) or "bytes".
    pub unit: &'static str,
    #[serde(flatten)]
    pub stats: Stats,
    /// What the command printed (file count, byte count), to check systems agree.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
}

/// Everything measured, in order.
#[derive(Debug, Default, Serialize)]
pub struct Results {
    pub items: Vec<Measurement>,
    /// FUSE requests per operation (the `requests` section).
    pub requests: Vec<RequestCount>,
    /// Things the reader must know (skipped measures, mismatches).
    pub notes: Vec<String>,
}

/// FUSE requests one operation sent to one FUSE view.
#[derive(Clone, Debug, Serialize)]
pub struct RequestCount {
    pub operation: String,
    pub system: String,
    #[serde(flatten)]
    pub counts: crate::requests::Counts,
}

impl Results {
    pub(crate) fn push(
        &mut self,
        measure: &str,
        system: &str,
        unit: &'static str,
        samples: Vec<f64>,
    ) {
        self.items.push(Measurement {
            measure: measure.into(),
            system: system.into(),
            unit,
            stats: Stats::of(samples),
            output: None,
        });
    }

    pub(crate) fn push_output(&mut self, output: String) {
        if let Some(last) = self.items.last_mut() {
            last.output = Some(output.trim().to_string());
        }
    }

    /// The measurement of `measure` on `system`, if taken.
    pub fn get(&self, measure: &str, system: &str) -> Option<&Measurement> {
        self.items
            .iter()
            .find(|m| m.measure == measure && m.system == system)
    }
}

/// Counts files the way a user would, through a pipe like every tool does.
pub const FIND: &str = "find . -type f | wc -l";
/// Piped into wc: GNU tar skips reading file data when its output is /dev/null.
pub const TAR: &str = "tar cf - . | wc -c";
/// Measure names: the JSON keys and the report rows.
pub const M_FIND_FIRST: &str = "first find";
pub const M_FIND_WARM: &str = "warm find";
pub const M_TAR_FIRST: &str = "first tar";
pub const M_TAR_WARM: &str = "warm tar";
pub const M_WRITE: &str = "write files";
pub const M_RM: &str = "rm files";
pub const M_READ: &str = "sequential read";
/// 1,000 calls that each cost a FUSE view exactly one request and the daemon next to no
/// work: the per-request floor the write and rm measures are made of.
pub const M_REQUEST: &str = "1000 requests";
/// The same read right after dropping caches: what the first build or scan pays.
pub const M_READ_FIRST: &str = "first sequential read";
pub const M_CARGO: &str = "warm cargo check";
pub const M_MANY_CREATE: &str = "create with many alive";
pub const M_MANY_RSS: &str = "RSS per idle branch";

/// Name of the branch-creation measure at `files` files.
pub fn m_create(files: usize) -> String {
    format!("create, {files} files")
}

/// Name of the accept measure for `n` changed files.
pub fn m_accept(n: usize) -> String {
    format!("accept {n} files")
}
/// Name of the abort measure for `n` changed files.
pub fn m_abort(n: usize) -> String {
    format!("abort {n} files")
}

/// All file-operation measures on the live views. Runs are interleaved across systems
/// (run 1 on every system, then run 2, …) so that load from other processes on a shared
/// machine spreads evenly instead of biasing whichever system ran during a busy spell.
///
/// Native writes go to `native_scratch` (same tmpfs, outside the project): written into
/// the project they would reach the live shade branch's lower watcher, which would then
/// be busy invalidating while the other systems are timed.
pub fn file_ops(
    views: &[Instance],
    native_scratch: &Path,
    cfg: &Config,
    res: &mut Results,
) -> Result<()> {
    for (measure, cmd, first) in [
        (M_FIND_FIRST, FIND, true),
        (M_FIND_WARM, FIND, false),
        (M_TAR_FIRST, TAR, true),
        (M_TAR_WARM, TAR, false),
    ] {
        eprintln!("bench: {measure}");
        let samples = rounds(views, cfg.runs, |_, v| {
            let tree = v.root().join(TREE);
            if first {
                cold(cfg)?;
            } else {
                sh(&tree, cmd)?; // warm-up: see `rounds`
            }
            time(|| sh(&tree, cmd))
        })?;
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

    eprintln!("bench: write/rm {} files", cfg.write_files);
    let data = vec![b'x'; 4096];
    // One more round than timed: the first pays one-time costs and is dropped.
    let samples = rounds(views, cfg.runs + 1, |run, v| {
        let base = if v.system == System::Native {
            native_scratch
        } else {
            v.root()
        };
        let dir = base.join(format!(
            "scratch-{}-{run}",
            v.system.name().replace(' ', "-")
        ));
        write_rm(&dir, cfg.write_files, &data)
    })?;
    for (v, sm) in views.iter().zip(samples) {
        let (w, r): (Vec<f64>, Vec<f64>) = sm.into_iter().skip(1).unzip();
        res.push(M_WRITE, v.system.name(), "s", w);
        res.push(M_RM, v.system.name(), "s", r);
    }

    eprintln!("bench: request floor");
    let floor = rounds(views, cfg.runs, |_, v| {
        let dir = v.root().join(TREE);
        time(|| missing_xattr_lookups(&dir, 1000)).map(|(secs, ())| secs)
    })?;
    for (v, f) in views.iter().zip(floor) {
        res.push(M_REQUEST, v.system.name(), "s", f);
    }

    for (measure, first) in [(M_READ_FIRST, true), (M_READ, false)] {
        eprintln!("bench: {measure}");
        let rates = rounds(views, cfg.runs, |_, v| {
            let blob = v.root().join(BLOB);
            if first {
                cold(cfg)?;
            } else {
                read_all(&blob)?; // warm-up: see `rounds`
            }
            let (secs, bytes) = time(|| read_all(&blob))?;
            Ok(bytes as f64 / secs / 1e9)
        })?;
        for (v, r) in views.iter().zip(rates) {
            res.push(measure, v.system.name(), "GB/s", r);
        }
    }

    eprintln!("bench: warm cargo check");
    let checks = rounds(views, cfg.runs, |_, v| {
        let krate = v.root().join(CRATE);
        cargo_check(&krate)?; // warm-up: see `rounds`
        time(|| cargo_check(&krate)).map(|(secs, ())| secs)
    })?;
    for (v, c) in views.iter().zip(checks) {
        res.push(M_CARGO, v.system.name(), "s", c);
    }
    Ok(())
}

/// Operations whose FUSE requests the `requests` section counts, in order: each runs once
/// on each FUSE view, in the state the previous one left (the tree walked cold, then warm).
pub const REQUEST_OPS: [&str; 8] = [
    M_FIND_FIRST,
    M_FIND_WARM,
    M_TAR_FIRST,
    M_TAR_WARM,
    M_WRITE,
    M_RM,
    M_READ_FIRST,
    M_READ,
];

/// Count the FUSE requests each operation of [`REQUEST_OPS`] sends to each FUSE view
/// (shade and fuse-overlayfs), from the kernel's tracepoint.
pub fn request_counts(views: &[Instance], cfg: &Config, res: &mut Results) -> Result<()> {
    let data = vec![b'x'; 4096];
    for v in views
        .iter()
        .filter(|v| matches!(v.system, System::Shade | System::FuseOverlayfs))
    {
        eprintln!("bench: {}: requests per operation", v.system.name());
        let tracer = crate::requests::Tracer::new(v.root())?;
        let tree = v.root().join(TREE);
        let blob = v.root().join(BLOB);
        let dir = v.root().join("scratch-requests");
        std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let names: Vec<_> = (0..cfg.write_files)
            .map(|i| dir.join(format!("w{i:04}.txt")))
            .collect();
        for op in REQUEST_OPS {
            check_interrupted()?;
            if op == M_FIND_FIRST || op == M_TAR_FIRST || op == M_READ_FIRST {
                cold(cfg)?;
            }
            let counts = tracer.count(|| match op {
                M_FIND_FIRST | M_FIND_WARM => sh(&tree, FIND).map(drop),
                M_TAR_FIRST | M_TAR_WARM => sh(&tree, TAR).map(drop),
                M_WRITE => names.iter().try_for_each(|n| {
                    std::fs::write(n, &data).with_context(|| format!("writing {}", n.display()))
                }),
                M_RM => names.iter().try_for_each(|n| {
                    std::fs::remove_file(n).with_context(|| format!("removing {}", n.display()))
                }),
                _ => read_all(&blob).map(drop),
            })?;
            res.requests.push(RequestCount {
                operation: op.into(),
                system: v.system.name().into(),
                counts,
            });
        }
        std::fs::remove_dir(&dir)?;
    }
    Ok(())
}

/// `runs` rounds over every view, interleaved (run 1 on every view, then run 2, …) in
/// rotating order; `sample(run, view)` takes one sample. Returns each view's samples.
///
/// Warm samples warm their view up inside `sample`, right before timing, not a round
/// earlier: page cache left idle in between may be reclaimed (this VM runs a DAMON
/// `pageout` scheme), which hits FUSE views, whose cache is reclaimable, but not tmpfs,
/// whose pages are not without swap; "warm" then measured reclaim, not the view.
pub(crate) fn rounds<T>(
    views: &[Instance],
    runs: usize,
    mut sample: impl FnMut(usize, &Instance) -> Result<T>,
) -> Result<Vec<Vec<T>>> {
    let mut out: Vec<Vec<T>> = views.iter().map(|_| Vec::new()).collect();
    for run in 0..runs {
        for (k, v) in rotated(views, run) {
            check_interrupted()?;
            out[k].push(sample(run, v)?);
        }
    }
    Ok(out)
}

/// The views starting at a different one each round, so no system always runs right
/// after another (or first in a round) on a machine with background load.
fn rotated(views: &[Instance], run: usize) -> impl Iterator<Item = (usize, &Instance)> {
    let n = views.len();
    (0..n).map(move |j| {
        let k = (j + run) % n;
        (k, &views[k])
    })
}

/// Make the next run a "first" one: drop caches, then reload the programs themselves
/// (sh, find, tar, wc live on disk; reading them back is not what "first" measures).
pub(crate) fn cold(cfg: &Config) -> Result<()> {
    if cfg.drop_caches {
        drop_caches()?;
        sh(
            Path::new("/"),
            "find /proc/self/fd -maxdepth 0 | wc -l >/dev/null; tar cf - /proc/self/comm 2>/dev/null | wc -c >/dev/null",
        )?;
    }
    Ok(())
}

/// Create `n` 4 KiB files in a fresh `dir`, then remove them. Returns (write, rm) seconds.
fn write_rm(dir: &Path, n: usize, data: &[u8]) -> Result<(f64, f64)> {
    std::fs::create_dir(dir).with_context(|| format!("creating {}", dir.display()))?;
    let names: Vec<_> = (0..n).map(|i| dir.join(format!("w{i:04}.txt"))).collect();
    let (w, ()) = time(|| {
        for n in &names {
            std::fs::write(n, data).with_context(|| format!("writing {}", n.display()))?;
        }
        Ok(())
    })?;
    let (r, ()) = time(|| {
        for n in &names {
            std::fs::remove_file(n).with_context(|| format!("removing {}", n.display()))?;
        }
        Ok(())
    })?;
    std::fs::remove_dir(dir)?;
    Ok((w, r))
}

/// `n` getxattr calls for an attribute `path` does not have. The kernel caches no xattrs
/// for FUSE, so on a FUSE view each is one GETXATTR round trip to the daemon.
fn missing_xattr_lookups(path: &Path, n: usize) -> Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    let name = c"user.shade-bench-absent";
    for _ in 0..n {
        // SAFETY: valid C strings; a null buffer of size 0 only asks for the size.
        let r = unsafe { libc::getxattr(c_path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
        let e = std::io::Error::last_os_error();
        if r >= 0 || !matches!(e.raw_os_error(), Some(libc::ENODATA | libc::EOPNOTSUPP)) {
            bail!(
                "getxattr on {}: expected no such attribute, got {r} ({e})",
                path.display()
            );
        }
    }
    Ok(())
}

/// Read a whole file in 1 MiB chunks; returns bytes read.
fn read_all(path: &Path) -> Result<u64> {
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(total);
        }
        total += n as u64;
    }
}

/// `cargo check --offline` in `dir`, with the target dir inside the project (the caller's
/// CARGO_TARGET_DIR would point elsewhere).
pub fn cargo_check(dir: &Path) -> Result<()> {
    let out = Command::new("cargo")
        .args(["check", "--offline", "--quiet"])
        .current_dir(dir)
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET_DIR")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .context("running cargo check")?;
    if !out.status.success() {
        bail!(
            "cargo check in {} failed: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Branch creation of every creator over `src` (`files` files; `git_dir` its repo).
pub fn creation(
    layout: &Layout,
    src: &Path,
    git_dir: &Path,
    files: usize,
    cfg: &Config,
    res: &mut Results,
) -> Result<()> {
    let measure = m_create(files);
    for system in System::CREATORS {
        eprintln!("bench: {}: {measure}", system.name());
        match create_runs(layout, system, src, git_dir, cfg) {
            Ok(samples) => res.push(&measure, system.name(), "s", samples),
            Err(e) if system != System::Shade => {
                res.notes
                    .push(format!("{} {measure} skipped: {e:#}", system.name()));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Timed creations of `system` over `src`, each torn down untimed.
fn create_runs(
    layout: &Layout,
    system: System,
    src: &Path,
    git_dir: &Path,
    cfg: &Config,
) -> Result<Vec<f64>> {
    let mut samples = Vec::new();
    // The first creation pays one-time costs (binaries, thread stacks): warm-up.
    for run in 0..=cfg.runs {
        check_interrupted()?;
        let prepared = Prepared::new(system, layout, Some(git_dir))?;
        let (secs, inst) = time(|| Instance::create(system, src, layout, prepared, cfg.threads))?;
        let shows = std::fs::read_dir(inst.root())?.next().is_some();
        inst.close()?;
        if !shows {
            bail!("{} of {} shows an empty tree", system.name(), src.display());
        }
        if run > 0 {
            samples.push(secs);
        }
    }
    Ok(samples)
}

/// Write new contents into the first `n` files of `accept/` through a branch.
fn change_files(branch: &Branch, n: usize, round: usize) -> Result<()> {
    let dir = branch.mountpoint().join(ACCEPT);
    for i in 0..n {
        let p = dir.join(format!("f{i:04}.txt"));
        std::fs::write(&p, tree::source_text(i + 7 * round + 1, 2100))
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

/// Accept and abort latency for each size in `cfg.accept_sizes`.
pub fn accept_abort(layout: &Layout, cfg: &Config, res: &mut Results) -> Result<()> {
    let opts = shade_options(layout, cfg.threads);
    let mut round = 0;
    for &n in &cfg.accept_sizes {
        eprintln!("bench: shade: accept/abort {n} files");
        let mut aborts = Vec::new();
        for _ in 0..cfg.runs {
            check_interrupted()?;
            round += 1;
            let b = Branch::create(&layout.lower, &opts)?;
            change_files(&b, n, round)?;
            let (secs, ()) = time(|| {
                drop(b);
                Ok(())
            })?;
            aborts.push(secs);
        }
        res.push(&m_abort(n), "shade", "s", aborts);
        accept_runs(layout, n, &mut round, cfg, res)?;
    }
    accept_one_line(layout, cfg, res)
}

/// Bytes of the files below `dir` (0 when it does not exist).
fn tree_bytes(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => tree_bytes(&e.path()),
            _ => e.metadata().map(|m| m.len()).unwrap_or(0),
        })
        .sum()
}

/// Accept latency of `n` changed files with the accept history on (system "shade", plus the
/// bytes the history stores per accept) and off ("shade (no history)"), runs interleaved
/// (on/off, then off/on, …) so that load drifts hit both alike; the paired ratio on/off
/// with its spread goes to the notes.
fn accept_runs(
    layout: &Layout,
    n: usize,
    round: &mut usize,
    cfg: &Config,
    res: &mut Results,
) -> Result<()> {
    let edit = |b: &Branch, round: usize| change_files(b, n, round);
    let check = |round: usize| -> Result<()> {
        let probe = layout.lower.join(ACCEPT).join("f0000.txt");
        if std::fs::read_to_string(&probe)? != tree::source_text(7 * round + 1, 2100) {
            bail!("accept did not write {}", probe.display());
        }
        Ok(())
    };
    let (on, off, stored) = accept_on_off(layout, n, round, cfg, &edit, &check)?;
    let ratio = ratio_note(&format!("accept of {n} changed files"), &on, &off);
    res.push(&m_accept(n), "shade", "s", on);
    res.push(&m_accept(n), "shade (no history)", "s", off);
    res.push(
        &format!("history bytes per accept of {n} files"),
        "shade",
        "bytes",
        stored,
    );
    res.notes.push(ratio);
    Ok(())
}

/// Name of the one-line-edit accept measure.
pub const M_ACCEPT_LINE: &str = "accept a one-line edit";
/// Name of the live session's tool-call accept measure (accept + the next branch).
pub const M_LIVE_CALL: &str = "live tool-call accept (accept + new branch)";

/// A one-line edit (the second line of a 2 KiB file replaced, as `sed -i` does) accepted
/// with the history on and off, interleaved; then the same edit as a live chat session's
/// tool call: the call's accept plus the branch renewed for the next call.
pub fn accept_one_line(layout: &Layout, cfg: &Config, res: &mut Results) -> Result<()> {
    eprintln!("bench: shade: accept of a one-line edit, history on/off");
    let file = |root: &Path| root.join(ACCEPT).join("f0001.txt");
    let line = |round: usize| format!("// edited line {round}");
    let edit_in = |root: &Path, round: usize| -> Result<()> {
        let p = file(root);
        let text = std::fs::read_to_string(&p)?;
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        if lines.len() < 2 {
            bail!("{} has fewer than 2 lines", p.display());
        }
        lines[1] = line(round);
        std::fs::write(&p, lines.join("\n") + "\n")?;
        Ok(())
    };
    let check = |round: usize| -> Result<()> {
        let text = std::fs::read_to_string(file(&layout.lower))?;
        if text.lines().nth(1) != Some(line(round).as_str()) {
            bail!("the one-line edit was not accepted");
        }
        Ok(())
    };
    let mut round = 10_000;
    let edit = |b: &Branch, round: usize| edit_in(b.mountpoint(), round);
    let (on, off, stored) = accept_on_off(layout, 1, &mut round, cfg, &edit, &check)?;
    res.notes
        .push(ratio_note("accept of a one-line edit", &on, &off));
    res.push(M_ACCEPT_LINE, "shade", "s", on);
    res.push(M_ACCEPT_LINE, "shade (no history)", "s", off);
    res.push(
        "history bytes per accept of a one-line edit",
        "shade",
        "bytes",
        stored,
    );

    eprintln!("bench: shade: a live session's tool-call accept");
    let options = shade_agent::ShadowOptions {
        branch: shade_options(layout, cfg.threads),
        ..shade_agent::ShadowOptions::live()
    };
    let live = shade_agent::shadow::Live::start(&layout.lower, options)
        .map_err(|e| anyhow::anyhow!("starting a live session: {e}"))?;
    live.set_origin("shade-bench live call".into());
    let mut samples = Vec::new();
    // The first accept pays one-time costs (the history's directories): warm-up.
    for run in 0..=cfg.runs {
        check_interrupted()?;
        round += 1;
        let mount = live
            .with_shadow(|s| s.map(|s| s.mountpoint().to_path_buf()))
            .context("the live session has no branch")?;
        edit_in(&mount, round)?;
        let (secs, after) = time(|| Ok(live.settle()))?;
        if !matches!(after, shade_agent::shadow::AfterCall::Accepted(..)) {
            bail!("the live tool call was not accepted: {after:?}");
        }
        check(round)?;
        if run > 0 {
            samples.push(secs);
        }
    }
    drop(live);
    res.notes.push(spread_note(
        "live tool-call accept (one-line edit: accept + a new branch for the next call)",
        &samples,
    ));
    res.push(M_LIVE_CALL, "shade", "s", samples);
    Ok(())
}

/// `runs` accepts of what `edit` changes with the history on and as many with it off,
/// interleaved; returns the on and off times and the history bytes each accept stored.
fn accept_on_off(
    layout: &Layout,
    n: usize,
    round: &mut usize,
    cfg: &Config,
    edit: &dyn Fn(&Branch, usize) -> Result<()>,
    check: &dyn Fn(usize) -> Result<()>,
) -> Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
    use shade_fusefs::accept::history;
    let keeping = history::retention();
    let history_dir = shade_fusefs::StateDir::at(layout.state.clone()).history();
    let opts = shade_options(layout, cfg.threads);
    let (mut on, mut off, mut stored) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..cfg.runs {
        let order = if run % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for keep in order {
            check_interrupted()?;
            *round += 1;
            history::configure(if keep {
                keeping
            } else {
                history::Retention { keep: 0, ..keeping }
            });
            let before = tree_bytes(&history_dir);
            let r = (|| {
                let b = Branch::create(&layout.lower, &opts)?;
                edit(&b, *round)?;
                let flags = AcceptFlags {
                    include_ignored: false,
                    force: false,
                };
                let (secs, report) = time(|| {
                    b.accept(flags)
                        .map_err(|e| anyhow::anyhow!("accept of {n} changed files: {e}"))
                })?;
                if report.written != n {
                    bail!(
                        "accept of {n} changed files reported {} written",
                        report.written
                    );
                }
                check(*round)?;
                Ok(secs)
            })();
            history::configure(keeping);
            let secs = r?;
            if keep {
                on.push(secs);
                stored.push(tree_bytes(&history_dir).saturating_sub(before) as f64);
            } else {
                off.push(secs);
            }
        }
    }
    Ok((on, off, stored))
}

/// "WHAT: history on/off ratio median R (min A, max B) over N interleaved runs; on M ms, off
/// M ms (medians)".
fn ratio_note(what: &str, on: &[f64], off: &[f64]) -> String {
    let mut ratios: Vec<f64> = on.iter().zip(off).map(|(a, b)| a / b).collect();
    ratios.sort_by(f64::total_cmp);
    format!(
        "{what}: history on/off ratio median {:.2} (min {:.2}, max {:.2}) over {} interleaved \
         runs; on {:.1} ms, off {:.1} ms (medians)",
        median(&ratios),
        ratios.first().copied().unwrap_or(0.0),
        ratios.last().copied().unwrap_or(0.0),
        ratios.len(),
        median(on) * 1e3,
        median(off) * 1e3,
    )
}

/// "WHAT: median M ms (min A, max B) over N runs".
fn spread_note(what: &str, samples: &[f64]) -> String {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    format!(
        "{what}: median {:.1} ms (min {:.1}, max {:.1}) over {} runs",
        median(&s) * 1e3,
        s.first().copied().unwrap_or(0.0) * 1e3,
        s.last().copied().unwrap_or(0.0) * 1e3,
        s.len()
    )
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => 0.0,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// `cfg.many` branches alive at once: creation time of each, and RSS per idle branch
/// (this process's RSS growth over all of them; fuser gives each worker thread its own
/// 16 MiB read buffer, resident only as far as it is touched).
pub fn many_branches(layout: &Layout, cfg: &Config, res: &mut Results) -> Result<()> {
    eprintln!("bench: shade: {} branches alive at once", cfg.many);
    let opts = shade_options(layout, cfg.threads);
    let (rss0, threads0) = (status_field("VmRSS")?, status_field("Threads")?);
    let mut branches = Vec::with_capacity(cfg.many);
    let mut samples = Vec::with_capacity(cfg.many);
    for _ in 0..cfg.many {
        check_interrupted()?;
        let (secs, b) = time(|| Branch::create(&layout.lower, &opts).map_err(Into::into))?;
        samples.push(secs);
        branches.push(b);
    }
    // Each branch answers (so it really is serving), then everything settles.
    for b in &branches {
        std::fs::metadata(b.mountpoint().join(TREE))?;
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    let (rss1, threads1) = (status_field("VmRSS")?, status_field("Threads")?);
    // For finding where idle-branch memory goes: SHADE_BENCH_SMAPS=FILE saves the mappings.
    if let Some(path) = std::env::var_os("SHADE_BENCH_SMAPS") {
        std::fs::copy("/proc/self/smaps", &path).context("saving /proc/self/smaps")?;
    }
    let per = (rss1.saturating_sub(rss0) * 1024) as f64 / cfg.many as f64;
    res.push(M_MANY_CREATE, "shade", "s", samples);
    res.push(M_MANY_RSS, "shade", "bytes", vec![per]);
    res.notes.push(format!(
        "{} branches alive: process RSS {} → {} KiB, threads {} → {}",
        cfg.many, rss0, rss1, threads0, threads1
    ));
    let (secs, ()) = time(|| {
        branches.clear();
        Ok(())
    })?;
    res.notes.push(format!(
        "dropping {} branches took {:.0} ms",
        cfg.many,
        secs * 1e3
    ));
    Ok(())
}

/// A numeric field of /proc/self/status (VmRSS in KiB, Threads).
fn status_field(name: &str) -> Result<u64> {
    let text = std::fs::read_to_string("/proc/self/status")?;
    text.lines()
        .find_map(|l| {
            l.strip_prefix(name)
                .and_then(|r| r.strip_prefix(':'))
                .and_then(|r| r.split_whitespace().next())
                .and_then(|v| v.parse().ok())
        })
        .with_context(|| format!("{name} missing from /proc/self/status"))
}
