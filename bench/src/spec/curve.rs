//! The headline per shown suggestion as a function of the hit rate. Time saved by
//! speculation scales with how often the user takes the suggestion, which a replay with
//! scripted suggestions cannot measure: so the benchmark measures, per strategy, the mean
//! time saved on a turn whose shown suggestion was taken (`a`, credited accepts only) and on
//! one whose suggestion was not taken or diverged (`b`, usually ≤ 0: the speculation's cost),
//! each paired with the same turn run live (`none`), and reports
//! `saved per shown suggestion (h) = h·a + (1 − h)·b`, a straight line, with the run's own
//! hit rate marked on it.

use serde::Serialize;

use super::engine::Strategy;
use super::report::{checks, SessionRun};

/// One strategy's line.
#[derive(Debug, Clone, Serialize)]
pub struct Line {
    /// The strategy.
    pub strategy: String,
    /// Mean seconds saved on a shown suggestion that was taken (credited).
    pub per_accepted_s: Option<f64>,
    /// Mean seconds saved (negative: lost) on a shown suggestion that was not taken.
    pub per_ignored_s: Option<f64>,
    /// Shown suggestions measured (paired with a live turn).
    pub shown: usize,
    /// Of which credited accepts.
    pub accepted: usize,
    /// The run's hit rate (credited accepts / shown).
    pub hit_rate: Option<f64>,
    /// Mean seconds saved per shown suggestion measured at that hit rate.
    pub measured_s: Option<f64>,
}

impl Line {
    /// Seconds saved per shown suggestion at hit rate `h` (0..=1).
    pub fn at(&self, h: f64) -> Option<f64> {
        let a = self.per_accepted_s?;
        let b = self.per_ignored_s.unwrap_or(0.0);
        Some(h * a + (1.0 - h) * b)
    }
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// The lines of every speculating strategy in `runs` (needs `none` runs to pair with).
pub fn lines(runs: &[SessionRun]) -> Vec<Line> {
    let c = checks(runs);
    let mut out = Vec::new();
    for strategy in Strategy::ALL.into_iter().filter(|s| *s != Strategy::None) {
        let (mut acc, mut ign) = (Vec::new(), Vec::new());
        for r in runs.iter().filter(|r| r.strategy == strategy) {
            let Some(live) = runs
                .iter()
                .filter(|x| x.strategy == Strategy::None && x.session == r.session)
                .min_by_key(|x| (x.pass != r.pass, x.pass))
            else {
                continue;
            };
            for (i, t) in r.turns.iter().enumerate() {
                let Some(l) = live.turns.get(i) else { continue };
                if t.suggestion.is_none() {
                    continue;
                }
                let key = (r.session.clone(), strategy.name().to_string(), r.pass, i);
                let diverged = c.divergent.get(&key);
                let saved =
                    (l.wait_ms - t.wait_ms - diverged.map_or(0.0, |d| d.live_wait_ms)) / 1e3;
                if t.accepted && diverged.is_none() {
                    acc.push(saved);
                } else {
                    ign.push(saved);
                }
            }
        }
        if acc.is_empty() && ign.is_empty() {
            continue;
        }
        let shown = acc.len() + ign.len();
        let all: Vec<f64> = acc.iter().chain(&ign).copied().collect();
        out.push(Line {
            strategy: strategy.name().to_string(),
            per_accepted_s: mean(&acc),
            per_ignored_s: mean(&ign),
            shown,
            accepted: acc.len(),
            hit_rate: Some(acc.len() as f64 / shown as f64),
            measured_s: mean(&all),
        });
    }
    out
}

/// The lines as markdown sentences.
pub fn markdown(lines: &[Line]) -> String {
    let mut out = String::new();
    for l in lines {
        let (Some(a), Some(h), Some(m)) = (l.per_accepted_s, l.hit_rate, l.measured_s) else {
            continue;
        };
        let b = l.per_ignored_s;
        out.push_str(&format!(
            "- **{}** per shown suggestion at hit rate h: h × {a:+.2} s + (1 − h) × {} \
             (taken: {a:+.2} s each, {} turns; not taken: {} turns); measured here: h = {:.0} % \
             → {m:+.2} s; at h = 25 % {:+.2} s, 50 % {:+.2} s.\n",
            l.strategy,
            b.map_or("0 s (none measured)".into(), |b| format!("{b:+.2} s")),
            l.accepted,
            l.shown - l.accepted,
            h * 100.0,
            l.at(0.25).unwrap_or(0.0),
            l.at(0.5).unwrap_or(0.0),
        ));
    }
    out
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Extra measured points (label, strategy, hit rate, seconds per shown suggestion), e.g. a
/// live suggester's run, drawn on the same axes.
pub type Point = (String, String, f64, f64);

/// The curve chart: seconds saved per shown suggestion against the hit rate (0–100 %), one
/// line per strategy, the measured points marked.
pub fn svg(lines: &[Line], extra: &[Point], title: &str) -> String {
    let (left, top, w, h) = (70.0, 50.0, 520.0, 300.0);
    let mut lo: f64 = 0.0;
    let mut hi: f64 = 0.1;
    for l in lines {
        for x in [0.0, 1.0] {
            if let Some(v) = l.at(x) {
                lo = lo.min(v);
                hi = hi.max(v);
            }
        }
    }
    for p in extra {
        lo = lo.min(p.3);
        hi = hi.max(p.3);
    }
    let pad = (hi - lo) * 0.1;
    let (lo, hi) = (lo - pad, hi + pad);
    let x = |v: f64| left + v * w;
    let y = |v: f64| top + (hi - v) / (hi - lo) * h;
    let colours = ["#999999", "#e6550d", "#8c6bb1", "#2b8cbe", "#41ab5d"];
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0}\" height=\"{:.0}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" \
         fill=\"white\"/>\n<text x=\"{left}\" y=\"24\" font-size=\"15\">{}</text>\n",
        left + w + 180.0,
        top + h + 60.0,
        escape(title)
    );
    for i in 0..=10 {
        let v = i as f64 / 10.0;
        out.push_str(&format!(
            "<line x1=\"{0:.1}\" x2=\"{0:.1}\" y1=\"{top}\" y2=\"{1:.1}\" stroke=\"#eee\"/>\
             <text x=\"{0:.1}\" y=\"{2:.1}\" text-anchor=\"middle\">{3}%</text>\n",
            x(v),
            top + h,
            top + h + 16.0,
            i * 10
        ));
    }
    for i in 0..=6 {
        let v = lo + (hi - lo) * i as f64 / 6.0;
        out.push_str(&format!(
            "<line x1=\"{left}\" x2=\"{:.1}\" y1=\"{1:.1}\" y2=\"{1:.1}\" stroke=\"#eee\"/>\
             <text x=\"{2:.1}\" y=\"{3:.1}\" text-anchor=\"end\">{v:+.2} s</text>\n",
            x(1.0),
            y(v),
            left - 6.0,
            y(v) + 4.0
        ));
    }
    out.push_str(&format!(
        "<line x1=\"{left}\" x2=\"{:.1}\" y1=\"{1:.1}\" y2=\"{1:.1}\" stroke=\"black\"/>\n",
        x(1.0),
        y(0.0)
    ));
    let colour = |name: &str| {
        let i = Strategy::ALL
            .iter()
            .position(|s| s.name() == name)
            .unwrap_or(0);
        colours[i % colours.len()]
    };
    for (j, l) in lines.iter().enumerate() {
        let (Some(v0), Some(v1)) = (l.at(0.0), l.at(1.0)) else {
            continue;
        };
        let c = colour(&l.strategy);
        out.push_str(&format!(
            "<line x1=\"{:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"{c}\" stroke-width=\"2\"/>\n",
            x(0.0),
            y(v0),
            x(1.0),
            y(v1)
        ));
        if let (Some(hr), Some(m)) = (l.hit_rate, l.measured_s) {
            out.push_str(&format!(
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"5\" fill=\"{c}\"><title>{} measured: \
                 {:.0} %, {m:+.2} s</title></circle>\n",
                x(hr),
                y(m),
                escape(&l.strategy),
                hr * 100.0
            ));
        }
        out.push_str(&format!(
            "<line x1=\"{0:.1}\" x2=\"{1:.1}\" y1=\"{2:.1}\" y2=\"{2:.1}\" stroke=\"{c}\" stroke-width=\"2\"/>\
             <text x=\"{3:.1}\" y=\"{4:.1}\">{5}</text>\n",
            x(1.0) + 20.0,
            x(1.0) + 40.0,
            top + 10.0 + 20.0 * j as f64,
            x(1.0) + 46.0,
            top + 14.0 + 20.0 * j as f64,
            escape(&l.strategy)
        ));
    }
    for (label, strategy, hr, v) in extra {
        let c = colour(strategy);
        out.push_str(&format!(
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"10\" height=\"10\" fill=\"white\" stroke=\"{c}\" \
             stroke-width=\"2\"><title>{}: {:.0} %, {v:+.2} s</title></rect>\n",
            x(*hr) - 5.0,
            y(*v) - 5.0,
            escape(label),
            hr * 100.0
        ));
    }
    out.push_str(&format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">hit rate (suggestions taken / shown); \
         dots: measured in this run</text>\n<text x=\"16\" y=\"{:.1}\" transform=\"rotate(-90 16 \
         {:.1})\" text-anchor=\"middle\">time saved per shown suggestion</text>\n</svg>\n",
        x(0.5),
        top + h + 40.0,
        top + h / 2.0,
        top + h / 2.0
    ));
    out
}
