//! The markdown report (ratios to native, absolute medians, issue 4's targets as a column
//! of met/missed marks — goals, never failures of the run) and the JSON document.

use crate::agent::{
    M_CARGO_BUILD, M_GIT_CHECKOUT, M_GIT_STATUS, M_GIT_STATUS_FIRST, M_NPM, M_RG, M_RG_FIRST,
};
use crate::measures::{
    m_abort, m_accept, Measurement, Results, M_CARGO, M_FIND_FIRST, M_FIND_WARM, M_MANY_CREATE,
    M_MANY_RSS, M_READ, M_READ_FIRST, M_REQUEST, M_RM, M_TAR_FIRST, M_TAR_WARM, M_WRITE,
    REQUEST_OPS,
};
use crate::systems::System;
use std::fmt::Write;

/// A goal from issue 4 for shade.
#[derive(Clone, Copy)]
enum Goal {
    /// Ratio to native at most this (times).
    RatioMax(f64),
    /// Throughput ratio to native at least this.
    RatioMin(f64),
    /// Absolute median at most this many seconds.
    SecsMax(f64),
    /// Bytes at most.
    BytesMax(f64),
}

impl Goal {
    fn label(self) -> String {
        match self {
            Goal::RatioMax(r) => format!("≤ {r}×"),
            Goal::RatioMin(r) => format!("≥ {r}× throughput"),
            Goal::SecsMax(s) => format!("≤ {}", secs(s)),
            Goal::BytesMax(b) => format!("≤ {}", bytes(b)),
        }
    }

    /// Met or missed, given shade's ratio (if any) and absolute median.
    fn met(self, ratio: Option<f64>, abs: f64) -> Option<bool> {
        match self {
            Goal::RatioMax(r) => ratio.filter(|x| x.is_finite()).map(|x| x <= r),
            Goal::RatioMin(r) => ratio.filter(|x| x.is_finite()).map(|x| x >= r),
            Goal::SecsMax(s) => abs.is_finite().then_some(abs <= s),
            Goal::BytesMax(b) => abs.is_finite().then_some(abs <= b),
        }
    }
}

fn mark(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "✅ met",
        Some(false) => "❌ missed",
        None => "—",
    }
}

/// Human duration.
pub fn secs(s: f64) -> String {
    if !s.is_finite() {
        "—".into()
    } else if s < 1e-3 {
        format!("{:.0} µs", s * 1e6)
    } else if s < 1.0 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{s:.2} s")
    }
}

fn bytes(b: f64) -> String {
    if !b.is_finite() {
        "—".into()
    } else if b >= 1024.0 * 1024.0 {
        format!("{:.2} MiB", b / 1024.0 / 1024.0)
    } else {
        format!("{:.0} KiB", b / 1024.0)
    }
}

fn abs(m: &Measurement) -> String {
    match m.unit {
        "GB/s" if m.stats.median.is_finite() => format!("{:.2} GB/s", m.stats.median),
        "bytes" => bytes(m.stats.median),
        _ => secs(m.stats.median),
    }
}

/// Ratio of `m` to native's `n` (throughput ratio for GB/s, time ratio otherwise).
fn ratio(m: &Measurement, n: &Measurement) -> f64 {
    m.stats.median / n.stats.median
}

/// The whole report as markdown.
pub fn markdown(res: &Results, title: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "## {title}\n");
    file_ops_table(res, &mut s);
    requests_table(res, &mut s);
    agent_table(res, &mut s);
    fresh_table(res, &mut s);
    creation_table(res, &mut s);
    accept_table(res, &mut s);
    many_table(res, &mut s);
    if !res.notes.is_empty() {
        let _ = writeln!(s, "Notes:\n");
        for n in &res.notes {
            let _ = writeln!(s, "- {n}");
        }
        let _ = writeln!(s);
    }
    s
}

fn file_ops_table(res: &Results, s: &mut String) {
    let rows = [
        (
            M_FIND_FIRST,
            "first `find . -type f \\| wc -l`",
            Some(Goal::RatioMax(3.0)),
        ),
        (M_FIND_WARM, "warm `find`", Some(Goal::RatioMax(1.2))),
        (M_TAR_FIRST, "first `tar cf - . \\| wc -c`", None),
        (M_TAR_WARM, "warm `tar`", Some(Goal::RatioMax(1.3))),
        (
            M_WRITE,
            "write 1,000 4 KiB files",
            Some(Goal::RatioMax(2.0)),
        ),
        (M_RM, "rm 1,000 files", Some(Goal::RatioMax(2.0))),
        (
            M_REQUEST,
            "1,000 `getxattr` of a missing attribute (1 request each to the shade daemon)",
            None,
        ),
        (
            M_READ_FIRST,
            "first sequential read, unchanged file",
            Some(Goal::RatioMin(0.9)),
        ),
        (
            M_READ,
            "warm sequential read, unchanged file",
            Some(Goal::RatioMin(0.9)),
        ),
        (
            M_CARGO,
            "warm `cargo check --offline`",
            Some(Goal::RatioMax(1.15)),
        ),
    ];
    ratio_table(
        res,
        s,
        "File operations: median; ratio to native (time ratio, lower is better; for the \
         read, throughput ratio, higher is better)",
        &rows,
        &VIEWS,
    );
}

/// The live views compared in the file-operation and agent tables.
const VIEWS: [System; 3] = [System::Shade, System::KernelOverlay, System::FuseOverlayfs];

fn agent_table(res: &Results, s: &mut String) {
    let rows = [
        (
            M_CARGO_BUILD,
            "clean `cargo build --offline` (anyhow, globset, serde_json)",
            Some(Goal::RatioMax(1.3)),
        ),
        (
            M_GIT_STATUS_FIRST,
            "first `git status` in the view (1 run)",
            None,
        ),
        (
            M_GIT_STATUS,
            "warm `git status` (the tree as a git repository)",
            None,
        ),
        (
            M_GIT_CHECKOUT,
            "`git checkout` of a branch changing a tenth of the files",
            Some(Goal::RatioMax(2.0)),
        ),
        (M_RG_FIRST, "first `rg` over the tree", None),
        (M_RG, "warm `rg` over the tree", None),
        (
            M_NPM,
            "`npm ci --offline` (4,795 files from the local cache)",
            None,
        ),
    ];
    ratio_table(
        res,
        s,
        "Agent workloads: median; time ratio to native (lower is better)",
        &rows,
        &VIEWS,
    );
}

fn fresh_table(res: &Results, s: &mut String) {
    let [status, diff, rg, find, cargo_test, pytest] = crate::fresh::COMMANDS.map(|(m, _, _)| m);
    let rows = [
        (
            status,
            "`git status --porcelain` (10k-file repository)",
            Some(Goal::RatioMax(3.0)),
        ),
        (diff, "`git diff --stat`", Some(Goal::RatioMax(3.0))),
        (rg, "`rg --no-ignore -c 'fn '`", Some(Goal::RatioMax(2.0))),
        (
            find,
            "`find . -type f \\| wc -l`",
            Some(Goal::RatioMax(3.0)),
        ),
        (
            cargo_test,
            "`cargo test --offline` (semver, test binaries built)",
            None,
        ),
        (pytest, "`pytest` (more-itertools)", None),
    ];
    ratio_table(
        res,
        s,
        "Fresh branch: each command the first thing in its own new view of the warm \
         project; `cp -r` and `git worktree add` of the project include making the copy; \
         median; time ratio to native (lower is better)",
        &rows,
        &crate::fresh::SYSTEMS[1..],
    );
}

/// One row per measure: native's median, each view's ratio to it, shade's goal.
fn ratio_table(
    res: &Results,
    s: &mut String,
    heading: &str,
    rows: &[(&str, &str, Option<Goal>)],
    views: &[System],
) {
    if !rows
        .iter()
        .any(|(m, _, _)| res.get(m, System::Native.name()).is_some())
    {
        return;
    }
    let _ = writeln!(s, "{heading}\n");
    let _ = write!(s, "| measure | native |");
    for v in views {
        let _ = write!(s, " {} |", v.name());
    }
    let _ = writeln!(s, " target (shade) | shade |");
    let _ = writeln!(s, "|---|---|{}---|---|", "---|".repeat(views.len()));
    for &(measure, label, goal) in rows {
        let Some(native) = res.get(measure, System::Native.name()) else {
            continue;
        };
        let _ = write!(s, "| {label} | {} |", abs(native));
        let mut shade_met = None;
        for &v in views {
            match res.get(measure, v.name()) {
                Some(m) => {
                    let r = ratio(m, native);
                    let differs = m.output.is_some() && m.output != native.output;
                    let warn = if differs {
                        format!(" ⚠ output {:?} ≠ native", m.output.as_deref().unwrap_or(""))
                    } else {
                        String::new()
                    };
                    let _ = write!(s, " {r:.2}× ({}){warn} |", abs(m));
                    if v == System::Shade {
                        shade_met = goal.and_then(|g| g.met(Some(r), m.stats.median));
                    }
                }
                None => {
                    let _ = write!(s, " — |");
                }
            }
        }
        let g = goal.map(Goal::label).unwrap_or_else(|| "—".into());
        let _ = writeln!(s, " {g} | {} |", mark(shade_met));
    }
    let _ = writeln!(s);
}

fn creation_table(res: &Results, s: &mut String) {
    let mut sizes: Vec<String> = res
        .items
        .iter()
        .filter(|m| m.measure.starts_with("create, "))
        .map(|m| m.measure.clone())
        .collect();
    sizes.dedup();
    if sizes.is_empty() {
        return;
    }
    let _ = writeln!(s, "Branch creation: median (p95)\n");
    let _ = write!(s, "| system |");
    for z in &sizes {
        let _ = write!(s, " {} |", z.trim_start_matches("create, "));
    }
    let _ = writeln!(s);
    let _ = writeln!(s, "|---|{}", "---|".repeat(sizes.len()));
    for sys in System::CREATORS {
        let _ = write!(s, "| {} |", sys.name());
        for z in &sizes {
            match res.get(z, sys.name()) {
                Some(m) => {
                    let _ = write!(s, " {} ({}) |", secs(m.stats.median), secs(m.stats.p95));
                }
                None => {
                    let _ = write!(s, " — |");
                }
            }
        }
        let _ = writeln!(s);
    }
    let shade: Vec<f64> = sizes
        .iter()
        .filter_map(|z| res.get(z, "shade"))
        .map(|m| m.stats.median)
        .collect();
    if let (Some(&small), Some(&large)) = (shade.first(), shade.last()) {
        let flat = large <= small * 1.5 + 0.5e-3;
        let met = Goal::SecsMax(5e-3)
            .met(None, large)
            .map(|fast| fast && flat);
        let _ = writeln!(
            s,
            "\nTarget (shade, largest tree): ≤ 5 ms and flat in size — {} ({} at the \
             largest size, {:.2}× the smallest)\n",
            mark(met),
            secs(large),
            large / small
        );
    }
}

fn accept_table(res: &Results, s: &mut String) {
    let sizes: Vec<usize> = res
        .items
        .iter()
        .filter_map(|m| {
            m.measure
                .strip_prefix("abort ")?
                .strip_suffix(" files")?
                .parse()
                .ok()
        })
        .collect();
    if sizes.is_empty() {
        return;
    }
    let _ = writeln!(s, "Accept / abort latency (shade): median (p95)\n");
    let _ = writeln!(
        s,
        "| changed files | accept | accept, no history | history stored | abort | target (accept) | |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|");
    for n in sizes {
        let cell_of = |name: String, system: &str| {
            res.get(&name, system)
                .map(|m| format!("{} ({})", secs(m.stats.median), secs(m.stats.p95)))
                .unwrap_or_else(|| "—".into())
        };
        let cell = |name: String| cell_of(name, "shade");
        let stored = res
            .get(&format!("history bytes per accept of {n} files"), "shade")
            .map(|m| shade_fusefs::units::format_size(m.stats.median as u64))
            .unwrap_or_else(|| "—".into());
        let goal = (n == 100).then_some(Goal::SecsMax(50e-3));
        let met = goal.and_then(|g| {
            res.get(&m_accept(n), "shade")
                .and_then(|m| g.met(None, m.stats.median))
        });
        let _ = writeln!(
            s,
            "| {n} | {} | {} | {stored} | {} | {} | {} |",
            cell(m_accept(n)),
            cell_of(m_accept(n), "shade (no history)"),
            cell(m_abort(n)),
            goal.map(Goal::label).unwrap_or_else(|| "—".into()),
            if goal.is_some() { mark(met) } else { "" }
        );
    }
    let _ = writeln!(s);
}

fn many_table(res: &Results, s: &mut String) {
    let (Some(c), Some(r)) = (
        res.get(M_MANY_CREATE, "shade"),
        res.get(M_MANY_RSS, "shade"),
    ) else {
        return;
    };
    let goal = Goal::BytesMax(1024.0 * 1024.0);
    let _ = writeln!(s, "Many branches alive at once (shade)\n");
    let _ = writeln!(
        s,
        "| branches | create median | create p95 | RSS per idle branch | target | |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|");
    let _ = writeln!(
        s,
        "| {} | {} | {} | {} | {} | {} |\n",
        c.stats.samples.len(),
        secs(c.stats.median),
        secs(c.stats.p95),
        bytes(r.stats.median),
        goal.label(),
        mark(goal.met(None, r.stats.median))
    );
}

fn requests_table(res: &Results, s: &mut String) {
    if res.requests.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "FUSE requests per operation (kernel tracepoint `fuse:fuse_request_send`, one run each)\n"
    );
    let systems: Vec<&str> = [
        System::Shade,
        System::ShadeWarmed,
        System::FuseOverlayfs,
        System::BranchFs,
    ]
    .iter()
    .map(|s| s.name())
    .filter(|name| res.requests.iter().any(|r| r.system == *name))
    .collect();
    let _ = writeln!(s, "| operation | {} |", systems.join(" | "));
    let _ = writeln!(s, "|---|{}", "---|".repeat(systems.len()));
    let fresh = crate::fresh::COMMANDS.map(|(m, _, _)| m);
    for op in REQUEST_OPS.into_iter().chain(fresh) {
        let cells: Vec<String> = systems
            .iter()
            .map(|sys| {
                res.requests
                    .iter()
                    .find(|r| r.operation == op && r.system == *sys)
                    .map_or("—".into(), |r| r.counts.describe())
            })
            .collect();
        if cells.iter().all(|c| c == "—") {
            continue;
        }
        let _ = writeln!(s, "| {op} | {} |", cells.join(" | "));
    }
    let _ = writeln!(s);
}
