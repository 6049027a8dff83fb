//! The whole report of a run (or of merged shards): the headline table at the first latency
//! profile and think time, the hit-rate lines, the think-time sweep and the spread over
//! passes for every profile, machine load per pass; the SVGs beside it. Everything is
//! computed from the runs alone, so a run, its `--rerender` and the merge of its shards give
//! the same report.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Result;

use super::curve;
use super::engine::Strategy;
use super::report::{self, Prices, SessionRun};
use super::spread;

/// `PREFIX.EXT` for the report files.
pub fn with_ext(prefix: &Path, ext: &str) -> PathBuf {
    let mut p = prefix.as_os_str().to_owned();
    p.push(ext);
    PathBuf::from(p)
}

/// Latency profiles and think times present, in first-seen order of the job list (runs are
/// kept in job order).
fn dims(runs: &[SessionRun]) -> (Vec<String>, Vec<u64>) {
    let mut profiles = Vec::new();
    let mut thinks = Vec::new();
    for r in runs {
        if !profiles.contains(&r.profile) {
            profiles.push(r.profile.clone());
        }
        if r.strategy != Strategy::None && !thinks.contains(&r.think_ms) {
            thinks.push(r.think_ms);
        }
    }
    if thinks.is_empty() {
        thinks = runs.iter().map(|r| r.think_ms).take(1).collect();
    }
    (profiles, thinks)
}

/// The runs of one profile and think time (`none`, which does not depend on the think time,
/// in every subset of its profile).
pub fn subset(runs: &[SessionRun], profile: &str, think: u64) -> Vec<SessionRun> {
    runs.iter()
        .filter(|r| r.profile == profile && (r.think_ms == think || r.strategy == Strategy::None))
        .cloned()
        .collect()
}

/// The headline subset: the first profile at the first think time.
pub fn headline(runs: &[SessionRun]) -> Vec<SessionRun> {
    let (profiles, thinks) = dims(runs);
    match (profiles.first(), thinks.first()) {
        (Some(p), Some(t)) => subset(runs, p, *t),
        _ => runs.to_vec(),
    }
}

/// The markdown report.
pub fn markdown(runs: &[SessionRun], header: &str, prices: Prices) -> String {
    let (profiles, thinks) = dims(runs);
    let head = headline(runs);
    let mut md = report::markdown(&head, header, prices);
    if let (Some(p), Some(t)) = (profiles.first(), thinks.first()) {
        md.push_str(&format!(
            "\nThe table: latency profile `{p}`, think time {:.1} s.\n",
            *t as f64 / 1e3
        ));
    }
    let lines = curve::lines(&head);
    if !lines.is_empty() {
        md.push_str(
            "\nPer shown suggestion, as a function of the hit rate h (each shown suggestion's \
             turn paired with the same turn live; taken = credited accepts):\n\n",
        );
        md.push_str(&curve::markdown(&lines));
    }
    // Spread and sweep: every profile × think time, all sessions.
    md.push_str(
        "\n## Spread and think-time sweep\n\nPer profile and think time, over all sessions: \
         paired differences with `none` per (session, pass), 95 % percentile-bootstrap \
         intervals. *saved/session*: seconds saved per session run; *per accept*: per credited \
         accept; *per shown*: per shown suggestion; *wasted CPU/ignored*: CPU-s of discarded \
         speculations per suggestion not taken.\n\n\
         | profile | think | strategy | pairs | hit rate | saved/session | per accept | per shown | wasted CPU/ignored |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for p in &profiles {
        for t in &thinks {
            let sub = subset(runs, p, *t);
            let table = report::table(&sub);
            for s in spread::spreads(&sub) {
                let all = table.get(&("all".to_string(), s.strategy.clone()));
                let wasted = all.map_or("–".into(), |f| {
                    let ignored = f.shown.saturating_sub(f.accepted);
                    if ignored == 0 {
                        "–".into()
                    } else {
                        format!("{:.2} s", f.discarded_cpu_ms / 1e3 / ignored as f64)
                    }
                });
                let baseline = s.strategy == Strategy::None.name();
                let show = |i: Option<spread::Interval>, scale: f64, unit: &str| {
                    i.filter(|_| !baseline)
                        .map_or("–".into(), |i| i.show(scale, unit))
                };
                md.push_str(&format!(
                    "| {p} | {:.1} s | {} | {} | {} | {} | {} | {} | {wasted} |\n",
                    *t as f64 / 1e3,
                    s.strategy,
                    s.pairs,
                    s.hit_rate.map_or("–".into(), |h| format!(
                        "{:.0} % [{:.0}, {:.0}]",
                        h.value * 100.0,
                        h.low * 100.0,
                        h.high * 100.0
                    )),
                    show(s.saved_per_session_s, 1.0, " s"),
                    show(s.saved_per_accept_s, 1.0, " s"),
                    show(s.saved_per_shown_s, 1.0, " s"),
                ));
            }
        }
    }
    // Machine load per pass (1-minute load average when each session run started).
    let mut load: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
    for r in runs {
        if let Some(l) = r.load1 {
            load.entry(r.pass).or_default().push(l);
        }
    }
    if !load.is_empty() {
        md.push_str("\nMachine load (1-min average at each session run's start) per pass: ");
        let parts: Vec<String> = load
            .iter()
            .map(|(p, v)| {
                let lo = v.iter().copied().fold(f64::MAX, f64::min);
                let hi = v.iter().copied().fold(f64::MIN, f64::max);
                let mean = v.iter().sum::<f64>() / v.len() as f64;
                format!("pass {}: mean {mean:.1} (min {lo:.1}, max {hi:.1})", p + 1)
            })
            .collect();
        md.push_str(&parts.join("; "));
        md.push_str(".\n");
    }
    md
}

/// The sweep chart: per strategy, seconds saved per credited accept (solid) and CPU-s wasted
/// per ignored suggestion (dashed) against the think time, first profile.
pub fn sweep_svg(runs: &[SessionRun], title: &str) -> String {
    let (profiles, thinks) = dims(runs);
    let Some(profile) = profiles.first() else {
        return String::new();
    };
    // (think s, saved per accept s, wasted CPU-s per ignored) per strategy.
    type Series = (String, Vec<(f64, f64, f64)>);
    let mut series: Vec<Series> = Vec::new();
    for s in Strategy::ALL.into_iter().filter(|s| *s != Strategy::None) {
        let mut pts = Vec::new();
        for t in &thinks {
            let sub = subset(runs, profile, *t);
            let table = report::table(&sub);
            let Some(f) = table.get(&("all".to_string(), s.name().to_string())) else {
                continue;
            };
            let passes = sub.iter().map(|r| r.pass + 1).max().unwrap_or(1) as f64;
            let acc = f.accepted as f64 / passes;
            let per_acc = f
                .saved_ms
                .filter(|_| acc > 0.0)
                .map_or(0.0, |v| v / 1e3 / acc);
            let ignored = f.shown.saturating_sub(f.accepted);
            let wasted = if ignored > 0 {
                f.discarded_cpu_ms / 1e3 / ignored as f64
            } else {
                0.0
            };
            pts.push((*t as f64 / 1e3, per_acc, wasted));
        }
        if !pts.is_empty() {
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            series.push((s.name().to_string(), pts));
        }
    }
    let xmax = thinks.iter().copied().max().unwrap_or(1) as f64 / 1e3;
    let mut lo: f64 = 0.0;
    let mut hi: f64 = 0.1;
    for (_, pts) in &series {
        for p in pts {
            lo = lo.min(p.1).min(p.2);
            hi = hi.max(p.1).max(p.2);
        }
    }
    let (left, top, w, h) = (70.0, 50.0, 520.0, 300.0);
    let x = |v: f64| left + v / xmax.max(0.001) * w;
    let y = |v: f64| top + (hi - v) / (hi - lo) * h;
    let colours = ["#e6550d", "#8c6bb1", "#2b8cbe", "#41ab5d"];
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0}\" height=\"{:.0}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" \
         fill=\"white\"/>\n<text x=\"{left}\" y=\"24\" font-size=\"15\">{}</text>\n",
        left + w + 220.0,
        top + h + 60.0,
        title.replace('&', "&amp;").replace('<', "&lt;")
    );
    for t in &thinks {
        let v = *t as f64 / 1e3;
        out.push_str(&format!(
            "<line x1=\"{0:.1}\" x2=\"{0:.1}\" y1=\"{top}\" y2=\"{1:.1}\" stroke=\"#eee\"/>\
             <text x=\"{0:.1}\" y=\"{2:.1}\" text-anchor=\"middle\">{v} s</text>\n",
            x(v),
            top + h,
            top + h + 16.0
        ));
    }
    for i in 0..=6 {
        let v = lo + (hi - lo) * i as f64 / 6.0;
        out.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{v:+.2}</text>\n",
            left - 6.0,
            y(v) + 4.0
        ));
    }
    out.push_str(&format!(
        "<line x1=\"{left}\" x2=\"{:.1}\" y1=\"{1:.1}\" y2=\"{1:.1}\" stroke=\"black\"/>\n",
        x(xmax),
        y(0.0)
    ));
    for (j, (name, pts)) in series.iter().enumerate() {
        let c = colours[j % colours.len()];
        for (k, dash) in [(1usize, ""), (2, " stroke-dasharray=\"5,4\"")] {
            let path: Vec<String> = pts
                .iter()
                .map(|p| {
                    let v = if k == 1 { p.1 } else { p.2 };
                    format!("{:.1},{:.1}", x(p.0), y(v))
                })
                .collect();
            out.push_str(&format!(
                "<polyline points=\"{}\" fill=\"none\" stroke=\"{c}\" stroke-width=\"2\"{dash}/>\n",
                path.join(" ")
            ));
            for p in pts {
                let v = if k == 1 { p.1 } else { p.2 };
                out.push_str(&format!(
                    "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{c}\"/>\n",
                    x(p.0),
                    y(v)
                ));
            }
        }
        out.push_str(&format!(
            "<line x1=\"{0:.1}\" x2=\"{1:.1}\" y1=\"{2:.1}\" y2=\"{2:.1}\" stroke=\"{c}\" stroke-width=\"2\"/>\
             <text x=\"{3:.1}\" y=\"{4:.1}\">{name}</text>\n",
            x(xmax) + 20.0,
            x(xmax) + 40.0,
            top + 10.0 + 20.0 * j as f64,
            x(xmax) + 46.0,
            top + 14.0 + 20.0 * j as f64,
        ));
    }
    out.push_str(&format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">think time; solid: seconds saved per \
         accepted suggestion; dashed: CPU-s wasted per ignored one</text>\n</svg>\n",
        x(xmax / 2.0),
        top + h + 40.0
    ));
    out
}

/// Write PREFIX.md, PREFIX.svg (per session), PREFIX-hitrate.svg and PREFIX-sweep.svg.
pub fn write(prefix: &Path, md: &str, runs: &[SessionRun], commit: &str) -> Result<()> {
    std::fs::write(with_ext(prefix, ".md"), md)?;
    let head = headline(runs);
    std::fs::write(
        with_ext(prefix, "-hitrate.svg"),
        curve::svg(
            &curve::lines(&head),
            &[],
            &format!("Time saved per shown suggestion vs hit rate ({commit})"),
        ),
    )?;
    std::fs::write(
        with_ext(prefix, "-sweep.svg"),
        sweep_svg(runs, &format!("Think-time sweep ({commit})")),
    )?;
    std::fs::write(
        with_ext(prefix, ".svg"),
        report::svg(
            &head,
            &format!("Time saved per session by strategy ({commit})"),
        ),
    )?;
    Ok(())
}
