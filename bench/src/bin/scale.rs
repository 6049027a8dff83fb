//! How many live branches one process holds (issue 31, scale; `bench/scale.sh`): branches of
//! one project are made one after another (`Branch::create_detached`: "create"), each is
//! attached ("first attach": a connection from the pool), gets a small change through its
//! mount and is detached (`Branch::detach`: it lets its FUSE connection go while idle). At each
//! checkpoint the holder's RSS, threads and descriptors, the kernel's slab and shmem (from
//! /proc/meminfo, machine-wide: a delta, noisy), and the creation times of the branches made
//! since the last checkpoint are recorded; then 100 of the live branches are attached and
//! run `git status` at once (throughput, errors) and are detached again. Writes a markdown
//! table and an SVG plot. Run as root.
//!
//! `scale PROJECT OUT_PREFIX [MAX] [CONCURRENT]`

use shade_fusefs::{Branch, BranchOptions};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

/// One checkpoint of the curve.
#[derive(Default, Clone)]
struct Point {
    branches: usize,
    create_p50_ms: f64,
    create_p99_ms: f64,
    detach_p50_ms: f64,
    first_attach_p50_ms: f64,
    first_attach_p99_ms: f64,
    rss_kib: u64,
    kernel_kib: i64,
    per_branch_kib: f64,
    threads: usize,
    fds: usize,
    status_per_s: f64,
    threads_attached: usize,
    fds_attached: usize,
    status_errors: usize,
    status_wall_ms: f64,
    attach_p50_ms: f64,
}

fn meminfo(key: &str) -> i64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The kernel memory a branch can cost: slab (dentries, inodes, FUSE requests) and shmem
/// (memfd contents), KiB.
fn kernel_kib() -> i64 {
    meminfo("Slab:") + meminfo("Shmem:")
}

/// Object sizes from /proc/slabinfo (bytes), 0 where unknown.
fn slab_size(cache: &str) -> u64 {
    std::fs::read_to_string("/proc/slabinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.split_whitespace().next() == Some(cache))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// What an idle branch costs the kernel by count, in KiB: its content's memfd (a shmem
/// inode, a dentry, a file, one page) and its state directory (the directory, `store/`,
/// `owner`: three inodes and dentries of the state directory's file system; ext4 assumed).
/// The machine-wide /proc/meminfo delta is measured too, but other processes move it by
/// more than a branch costs.
fn kernel_est_kib() -> f64 {
    // A branch's small change lives on the holder's heap (counted in its RSS), not in a
    // memfd: what the kernel holds per idle branch is its state directory.
    let (dentry, ext4) = (slab_size("dentry"), slab_size("ext4_inode_cache"));
    (3 * (ext4 + dentry)) as f64 / 1024.0
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn count(dir: &str) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

/// Attach `n` branches spread over the live ones, run `git status` in all of them at
/// once, detach them again.
fn concurrent_status(branches: &mut [Branch], n: usize, p: &mut Point) -> anyhow::Result<()> {
    let n = n.min(branches.len());
    if n == 0 {
        return Ok(());
    }
    let step = branches.len() / n;
    let mut attach = Vec::new();
    let mut mounts: Vec<PathBuf> = Vec::new();
    let picked: Vec<usize> = (0..n).map(|i| i * step).collect();
    for &i in &picked {
        let t = Instant::now();
        branches[i].attach()?;
        attach.push(t.elapsed().as_secs_f64() * 1e3);
        mounts.push(branches[i].mountpoint().to_path_buf());
    }
    p.threads_attached = count("/proc/self/task");
    p.fds_attached = count("/proc/self/fd");
    let t = Instant::now();
    let children: Vec<_> = mounts
        .iter()
        .map(|m| {
            std::process::Command::new("git")
                .args(["-c", "core.fsmonitor=false", "status", "--porcelain"])
                .current_dir(m)
                .env("GIT_CONFIG_NOSYSTEM", "1")
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
        })
        .collect();
    let mut errors = 0;
    for (c, i) in children.into_iter().zip(&picked) {
        let ok = match c {
            Ok(c) => c.wait_with_output().map(|o| {
                // Each branch shows its own new file as untracked, and nothing else errs.
                o.status.success()
                    && String::from_utf8_lossy(&o.stdout).contains(&format!("scale-{i}.txt"))
            }),
            Err(e) => Err(e),
        };
        if !matches!(ok, Ok(true)) {
            errors += 1;
        }
    }
    let wall = t.elapsed().as_secs_f64();
    for &i in &picked {
        // A git process just reaped may still have its last RELEASE in flight: the detach
        // waits for it (pool.rs), so a refusal here is a real reference.
        if let Err(why) = branches[i].detach() {
            eprintln!("branch {i} stays attached: {why}");
        }
    }
    p.status_wall_ms = wall * 1e3;
    p.status_per_s = n as f64 / wall;
    p.status_errors = errors;
    p.attach_p50_ms = pct(&mut attach, 0.5);
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let project = PathBuf::from(args.next().ok_or_else(|| anyhow::anyhow!("usage"))?);
    let out = PathBuf::from(args.next().ok_or_else(|| anyhow::anyhow!("usage"))?);
    let max: usize = args.next().map_or(Ok(10_000), |v| v.parse())?;
    let concurrent: usize = args.next().map_or(Ok(100), |v| v.parse())?;
    let pool: usize = std::env::var("SCALE_POOL")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    shade_fusefs::set_pool_size(pool);
    let opts = BranchOptions::default();
    let checkpoints: Vec<usize> = [1, 10, 100, 500, 1000, 2000, 5000, 10_000, 20_000]
        .into_iter()
        .filter(|&c| c <= max)
        .chain(std::iter::once(max))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    // A first branch made and dropped: the pool holds a warm connection, the process its
    // one-time parts (watch thread, reaper), so the baseline is what any holder has.
    drop(Branch::create(&project, &opts)?);
    let (rss0, kern0) = (rss_kib(), kernel_kib());
    let (threads0, fds0) = (count("/proc/self/task"), count("/proc/self/fd"));
    let mut branches: Vec<Branch> = Vec::with_capacity(max);
    let mut create: Vec<f64> = Vec::new();
    let mut detach: Vec<f64> = Vec::new();
    let mut ready: Vec<f64> = Vec::new();
    let mut points = Vec::new();
    let started = Instant::now();
    for i in 0..max {
        let t = Instant::now();
        let mut b = Branch::create_detached(&project, &opts)?;
        create.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        b.attach()?;
        ready.push(t.elapsed().as_secs_f64() * 1e3);
        std::fs::write(
            b.mountpoint().join(format!("scale-{i}.txt")),
            format!("branch {i}\n"),
        )?;
        let t = Instant::now();
        if let Err(why) = b.detach() {
            eprintln!("branch {i} stays attached: {why}");
        }
        detach.push(t.elapsed().as_secs_f64() * 1e3);
        branches.push(b);
        let n = i + 1;
        if checkpoints.contains(&n) {
            let (rss, kern) = (rss_kib(), kernel_kib());
            let mut p = Point {
                branches: n,
                create_p50_ms: pct(&mut create, 0.5),
                create_p99_ms: pct(&mut create, 0.99),
                detach_p50_ms: pct(&mut detach, 0.5),
                first_attach_p50_ms: pct(&mut ready, 0.5),
                first_attach_p99_ms: pct(&mut ready, 0.99),
                rss_kib: rss,
                kernel_kib: kern - kern0,
                per_branch_kib: ((rss as i64 - rss0 as i64) + (kern - kern0)) as f64 / n as f64,
                threads: count("/proc/self/task"),
                fds: count("/proc/self/fd"),
                ..Point::default()
            };
            create.clear();
            detach.clear();
            ready.clear();
            concurrent_status(&mut branches, concurrent, &mut p)?;
            eprintln!(
                "{n} branches ({:.0} s): create p50 {:.2} ms p99 {:.2} ms, first attach p50 {:.2} p99 {:.2}, detach p50 {:.2} ms, \
                 rss {} KiB, kernel +{} KiB, {:.1} KiB/branch, threads {}, fds {}, \
                 {concurrent}× git status {:.0} ms ({} errors), attach p50 {:.2} ms",
                started.elapsed().as_secs_f64(),
                p.create_p50_ms,
                p.create_p99_ms,
                p.first_attach_p50_ms,
                p.first_attach_p99_ms,
                p.detach_p50_ms,
                p.rss_kib,
                p.kernel_kib,
                p.per_branch_kib,
                p.threads,
                p.fds,
                p.status_wall_ms,
                p.status_errors,
                p.attach_p50_ms
            );
            points.push(p);
        }
    }
    let live_attached = branches.iter().filter(|b| !b.is_detached()).count();
    let mut md = table(
        &points,
        (rss0, threads0, fds0),
        pool,
        live_attached,
        concurrent,
    );
    if let Some(last) = points.last() {
        let holder = (last.rss_kib as f64 - rss0 as f64) / last.branches as f64;
        let kernel = kernel_est_kib();
        let _ = writeln!(
            md,
            "\nAt {} branches: holder RSS {holder:.1} KiB per branch (measured), kernel {kernel:.1} KiB \
             per branch (by count: three state-directory inodes and dentries, object sizes from \
             /proc/slabinfo; the small change is on the heap, no memfd) = {:.1} KiB all in.",
            last.branches,
            holder + kernel
        );
    }
    std::fs::write(out.with_extension("md"), &md)?;
    std::fs::write(out.with_extension("svg"), svg(&points))?;
    print!("{md}");
    let t = Instant::now();
    drop(branches);
    let dropped = format!(
        "\nDropping the {max} branches took {:.1} s (mostly removing their state directories).\n",
        t.elapsed().as_secs_f64()
    );
    eprint!("{dropped}");
    md.push_str(&dropped);
    std::fs::write(out.with_extension("md"), &md)?;
    shade_fusefs::drain_branch_pool();
    Ok(())
}

fn table(
    points: &[Point],
    (rss0, threads0, fds0): (u64, usize, usize),
    pool: usize,
    attached: usize,
    concurrent: usize,
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Baseline (one branch made and dropped): RSS {rss0} KiB, {threads0} threads, {fds0} fds; \
         pool {pool} per project; branches left attached at the end: {attached}.\n"
    );
    let _ = writeln!(
        s,
        "| live branches | create p50 ms | create p99 ms | first attach p50 / p99 ms | detach p50 ms | holder RSS KiB | kernel Δ KiB (slab+shmem) | KiB per branch (all in) | threads | fds | threads / fds with {concurrent} attached | {concurrent}× git status wall ms | git status/s | errors | attach p50 ms |"
    );
    let _ = writeln!(
        s,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for p in points {
        let _ = writeln!(
            s,
            "| {} | {:.2} | {:.2} | {:.2} / {:.2} | {:.2} | {} | {} | {:.1} | {} | {} | {} / {} | {:.0} | {:.0} | {} | {:.2} |",
            p.branches,
            p.create_p50_ms,
            p.create_p99_ms,
            p.first_attach_p50_ms,
            p.first_attach_p99_ms,
            p.detach_p50_ms,
            p.rss_kib,
            p.kernel_kib,
            p.per_branch_kib,
            p.threads,
            p.fds,
            p.threads_attached,
            p.fds_attached,
            p.status_wall_ms,
            p.status_per_s,
            p.status_errors,
            p.attach_p50_ms
        );
    }
    s
}

/// A series: its name and how to read it from a point.
type Series = (&'static str, Box<dyn Fn(&Point) -> f64>);
/// A panel: its title and its series.
type Panel = (&'static str, Vec<Series>);

/// Four panels over a log axis of live branches.
fn svg(points: &[Point]) -> String {
    let panels: [Panel; 4] = [
        (
            "creation ms (p50, p99)",
            vec![
                ("p50", Box::new(|p: &Point| p.create_p50_ms)),
                ("p99", Box::new(|p: &Point| p.create_p99_ms)),
            ],
        ),
        (
            "KiB per idle branch (holder RSS + kernel)",
            vec![("all in", Box::new(|p: &Point| p.per_branch_kib.max(0.0)))],
        ),
        (
            "threads, fds of the holder",
            vec![
                ("threads", Box::new(|p: &Point| p.threads as f64)),
                ("fds", Box::new(|p: &Point| p.fds as f64)),
            ],
        ),
        (
            "concurrent git status per second",
            vec![("git status/s", Box::new(|p: &Point| p.status_per_s))],
        ),
    ];
    let (w, h, pad) = (420.0, 260.0, 45.0);
    let colors = ["#1f77b4", "#d62728"];
    let mut s = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{}' height='{}' font-family='sans-serif' font-size='11'>\n",
        w * 2.0,
        h * 2.0
    );
    let xmax = points.iter().map(|p| p.branches).max().unwrap_or(1).max(10) as f64;
    for (k, (title, series)) in panels.iter().enumerate() {
        let (ox, oy) = ((k % 2) as f64 * w, (k / 2) as f64 * h);
        let ymax = points
            .iter()
            .flat_map(|p| series.iter().map(move |(_, f)| f(p)))
            .fold(0.0f64, f64::max)
            .max(1e-9)
            * 1.1;
        let x = |b: usize| ox + pad + (b.max(1) as f64).log10() / xmax.log10() * (w - 2.0 * pad);
        let y = |v: f64| oy + h - pad - v / ymax * (h - 2.0 * pad);
        let _ = writeln!(
            s,
            "<text x='{}' y='{}' font-weight='bold'>{title}</text>",
            ox + pad,
            oy + 18.0
        );
        let _ = writeln!(
            s,
            "<line x1='{}' y1='{}' x2='{}' y2='{}' stroke='black'/><line x1='{}' y1='{}' x2='{}' y2='{}' stroke='black'/>",
            ox + pad, oy + h - pad, ox + w - pad, oy + h - pad, ox + pad, oy + pad, ox + pad, oy + h - pad
        );
        let _ = writeln!(
            s,
            "<text x='{}' y='{}'>{:.1}</text><text x='{}' y='{}'>0</text>",
            ox + 2.0,
            oy + pad + 4.0,
            ymax / 1.1,
            ox + 2.0,
            oy + h - pad
        );
        let mut dec = 1usize;
        while dec as f64 <= xmax {
            let _ = writeln!(
                s,
                "<text x='{}' y='{}' text-anchor='middle'>{dec}</text>",
                x(dec),
                oy + h - pad + 14.0
            );
            dec *= 10;
        }
        let _ = writeln!(
            s,
            "<text x='{}' y='{}' text-anchor='middle'>live branches (log)</text>",
            ox + w / 2.0,
            oy + h - 8.0
        );
        for (j, (name, f)) in series.iter().enumerate() {
            let pts: Vec<String> = points
                .iter()
                .map(|p| format!("{:.1},{:.1}", x(p.branches), y(f(p))))
                .collect();
            let _ = writeln!(
                s,
                "<polyline fill='none' stroke='{}' stroke-width='2' points='{}'/>",
                colors[j % 2],
                pts.join(" ")
            );
            let _ = writeln!(
                s,
                "<text x='{}' y='{}' fill='{}'>{name}</text>",
                ox + w - pad - 70.0,
                oy + 32.0 + 12.0 * j as f64,
                colors[j % 2]
            );
        }
    }
    s.push_str("</svg>\n");
    s
}
