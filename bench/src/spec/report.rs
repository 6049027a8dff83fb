//! The benchmark's figures: per session and strategy (over all passes) and overall, as a
//! markdown table, a JSON document with every measurement, and an SVG bar chart of the
//! user-visible time saved per session by strategy.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::check::differs;
use super::engine::{Strategy, TurnResult};
use super::live::{TokenUse, Tokens};

/// One pass of one session under one strategy.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionRun {
    /// The session's name (its directory).
    pub session: String,
    /// The strategy.
    pub strategy: Strategy,
    /// Which pass.
    pub pass: usize,
    /// Every turn.
    pub turns: Vec<TurnResult>,
    /// Model requests the recording answered.
    pub replay_answered: u64,
    /// Model requests it had no answer for (the run left the recording).
    pub replay_missed: u64,
    #[serde(default)]
    /// Speculative requests the recording had no answer for (a suggestion the recorded user
    /// did not take, whose speculation was not recorded): answered at once with a stub.
    pub unrecorded_speculation: u64,
    /// FUSE mounts left behind after the session (must be 0).
    pub leftover_mounts: usize,
    /// Tokens by kind of call (as the server counted them, or the replay estimated them).
    #[serde(default)]
    pub tokens: TokenUse,
    /// The latency profile (`local`, `hosted`).
    #[serde(default = "local")]
    pub profile: String,
    /// How long the user looked at each suggestion.
    #[serde(default)]
    pub think_ms: u64,
    /// The machine's 1-minute load average when the run started.
    #[serde(default)]
    pub load1: Option<f64>,
    /// The run's index in the job list (shards merge in this order).
    #[serde(default)]
    pub job: usize,
}

fn local() -> String {
    "local".into()
}

/// The figures of a group of runs (one session and strategy, or all sessions).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Figures {
    /// Passes summed.
    pub passes: usize,
    /// Suggestions shown (per pass, summed).
    pub shown: usize,
    /// Of which accepted.
    pub accepted: usize,
    /// Accept → result of every accepted turn.
    pub accept_ms: Vec<f64>,
    /// Median of `accept_ms`.
    pub accept_median_ms: Option<f64>,
    /// 90th percentile of `accept_ms`.
    pub accept_p90_ms: Option<f64>,
    /// User-visible waiting over all turns, mean per pass.
    pub wait_ms: f64,
    /// `none`'s mean wait less this one's (None when `none` did not run).
    pub saved_ms: Option<f64>,
    /// Speculations that completed / stopped at a boundary / were dropped / failed.
    pub completed: usize,
    /// See `completed`.
    pub boundary: usize,
    /// See `completed`.
    pub aborted: usize,
    /// See `completed`.
    pub failed: usize,
    /// Accepts refused because the project changed under the branch.
    pub conflicts: usize,
    /// Tokens of all speculations.
    pub speculation_tokens: u64,
    /// Tokens of thrown-away speculations.
    pub discarded_tokens: u64,
    /// CPU of thrown-away speculations.
    pub discarded_cpu_ms: f64,
    /// The largest memory peak of a thrown-away speculation.
    pub discarded_peak_bytes: Option<u64>,
    /// Model requests the recording had no answer for.
    pub replay_missed: u64,
    /// Accepted speculations whose result differed from the same turn run live (counted as
    /// misses: not in `accepted`, and the live turn's wait added to theirs).
    pub divergent: usize,
    /// Accepted speculations with no live run to compare with (no `none` run of the session).
    pub unchecked: usize,
    /// Credited accepts / shown suggestions.
    pub hit_rate: Option<f64>,
    /// Tokens by kind of call, summed.
    pub tokens: TokenUse,
}

/// Per-token prices for the cost column (USD per million tokens).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Prices {
    /// Input tokens.
    pub input_per_m: f64,
    /// Output tokens.
    pub output_per_m: f64,
}

impl Default for Prices {
    fn default() -> Self {
        // A small hosted model's list price (e.g. gpt-4o-mini: $0.15 / $0.60 per million).
        Prices {
            input_per_m: 0.15,
            output_per_m: 0.60,
        }
    }
}

impl Prices {
    /// The cost of `t` in USD.
    pub fn cost(&self, t: Tokens) -> f64 {
        (t.prompt as f64 * self.input_per_m + t.completion as f64 * self.output_per_m) / 1e6
    }
}

/// (session, strategy, pass, turn index).
pub type TurnKey = (String, String, usize, usize);

/// An accepted speculation whose result differs from the live run's.
#[derive(Debug, Clone, Serialize)]
pub struct Divergence {
    /// Session.
    pub session: String,
    /// Strategy.
    pub strategy: String,
    /// Pass.
    pub pass: usize,
    /// Turn index (0-based).
    pub turn: usize,
    /// The accepted input.
    pub input: String,
    /// What differed.
    pub why: String,
    /// The live turn's wait, which the user pays again to get the right result.
    pub live_wait_ms: f64,
}

/// Every accepted, used speculation compared with the same turn of the `none` run of its
/// session (the same pass when there is one): the ones that differ, and the ones that could
/// not be checked.
#[derive(Debug, Clone, Default)]
pub struct Checks {
    /// Divergent accepts by turn.
    pub divergent: BTreeMap<TurnKey, Divergence>,
    /// Accepts with no reference.
    pub unchecked: BTreeSet<TurnKey>,
}

/// Was this turn's result taken (wholly or partly) from a speculation?
fn speculated(t: &TurnResult) -> bool {
    t.accepted && matches!(t.speculation.as_deref(), Some("completed" | "boundary"))
}

/// Compare every accepted speculation of `runs` with the live run of its turn.
pub fn checks(runs: &[SessionRun]) -> Checks {
    let mut c = Checks::default();
    for r in runs.iter().filter(|r| r.strategy != Strategy::None) {
        let reference = runs
            .iter()
            .filter(|x| x.strategy == Strategy::None && x.session == r.session)
            .min_by_key(|x| (x.pass != r.pass, x.pass));
        for (i, t) in r.turns.iter().enumerate() {
            if !speculated(t) {
                continue;
            }
            let key = (r.session.clone(), r.strategy.name().to_string(), r.pass, i);
            let Some(live) = reference.and_then(|x| x.turns.get(i)) else {
                c.unchecked.insert(key);
                continue;
            };
            if let Some(why) = differs(&t.tools, &t.changes, &live.tools, &live.changes) {
                c.divergent.insert(
                    key,
                    Divergence {
                        session: r.session.clone(),
                        strategy: r.strategy.name().to_string(),
                        pass: r.pass,
                        turn: i,
                        input: t.input.clone(),
                        why,
                        live_wait_ms: live.wait_ms,
                    },
                );
            }
        }
    }
    c
}

fn percentile(v: &[f64], p: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() - 1) as f64 * p).round() as usize;
    v.get(i).copied()
}

/// Sum up `runs`; a divergent accept (`checks`) is a miss, its wait the speculated one plus
/// the live turn's.
pub fn figures<'a>(runs: impl IntoIterator<Item = &'a SessionRun>, checks: &Checks) -> Figures {
    let mut f = Figures::default();
    let mut wait = 0.0;
    for r in runs {
        f.passes += 1;
        f.replay_missed += r.replay_missed;
        f.tokens = TokenUse {
            main: f.tokens.main.plus(r.tokens.main),
            suggestion: f.tokens.suggestion.plus(r.tokens.suggestion),
            speculation: f.tokens.speculation.plus(r.tokens.speculation),
            other: f.tokens.other.plus(r.tokens.other),
        };
        for (i, t) in r.turns.iter().enumerate() {
            let key = (r.session.clone(), r.strategy.name().to_string(), r.pass, i);
            let diverged = checks.divergent.get(&key);
            wait += t.wait_ms + diverged.map_or(0.0, |d| d.live_wait_ms);
            f.shown += usize::from(t.suggestion.is_some());
            f.unchecked += usize::from(checks.unchecked.contains(&key));
            if diverged.is_some() {
                f.divergent += 1;
            } else if t.accepted {
                f.accepted += 1;
                f.accept_ms.push(t.wait_ms);
            }
            match t.speculation.as_deref() {
                Some("completed") => f.completed += 1,
                Some("boundary" | "discarded") => f.boundary += 1,
                Some("aborted") => f.aborted += 1,
                Some("failed") => f.failed += 1,
                _ => {}
            }
            f.conflicts += usize::from(t.conflict);
            f.speculation_tokens += t.speculation_tokens;
            f.discarded_tokens += t.discarded_tokens;
            if let Some(u) = &t.discarded_used {
                f.discarded_cpu_ms += u.cpu_ms;
                if let Some(p) = u.peak_bytes {
                    f.discarded_peak_bytes = Some(f.discarded_peak_bytes.unwrap_or(0).max(p));
                }
            }
        }
    }
    // Per pass: sessions are summed, passes averaged (callers group by session first).
    f.wait_ms = wait;
    f.hit_rate = (f.shown > 0).then(|| f.accepted as f64 / f.shown as f64);
    f.accept_median_ms = percentile(&f.accept_ms, 0.5);
    f.accept_p90_ms = percentile(&f.accept_ms, 0.9);
    f
}

/// The report's rows: (session or `all`, strategy) → figures, waits averaged over passes and
/// time saved against `none`.
pub fn table(runs: &[SessionRun]) -> BTreeMap<(String, String), Figures> {
    let mut sessions: Vec<String> = runs.iter().map(|r| r.session.clone()).collect();
    sessions.sort();
    sessions.dedup();
    let passes = runs.iter().map(|r| r.pass + 1).max().unwrap_or(1) as f64;
    let checks = checks(runs);
    let mut out = BTreeMap::new();
    for strategy in Strategy::ALL {
        if !runs.iter().any(|r| r.strategy == strategy) {
            continue;
        }
        for name in sessions.iter().map(String::as_str).chain(["all"]) {
            let pick = |s: Strategy| {
                runs.iter()
                    .filter(move |r| r.strategy == s && (name == "all" || r.session == name))
            };
            let mut f = figures(pick(strategy), &checks);
            f.wait_ms /= passes;
            if runs.iter().any(|r| r.strategy == Strategy::None) {
                let base = figures(pick(Strategy::None), &checks).wait_ms / passes;
                f.saved_ms = Some(base - f.wait_ms);
            }
            out.insert((name.to_string(), strategy.name().to_string()), f);
        }
    }
    out
}

fn ms(v: Option<f64>) -> String {
    v.map(|x| format!("{x:.0} ms"))
        .unwrap_or_else(|| "–".into())
}

fn secs(v: Option<f64>) -> String {
    v.map(|x| format!("{:+.1} s", x / 1e3))
        .unwrap_or_else(|| "–".into())
}

/// The markdown table (rows grouped by session; `all` last).
pub fn markdown(runs: &[SessionRun], header: &str, prices: Prices) -> String {
    let t = table(runs);
    let mut out = format!(
        "{header}\n\n| session | strategy | shown | accepted | hit rate | accept → result median | p90 | \
         wait | time saved | completed | boundary | aborted | failed | conflicts | \
         discarded tokens | discarded CPU | discarded peak | replay misses | divergent | \
         suggestion tokens | speculation tokens | background cost |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    );
    let mut names: Vec<&String> = t.keys().map(|(s, _)| s).collect();
    names.dedup();
    names.sort_by_key(|n| (n.as_str() == "all", n.to_string()));
    names.dedup();
    for name in names {
        for strategy in Strategy::ALL {
            let Some(f) = t.get(&(name.clone(), strategy.name().to_string())) else {
                continue;
            };
            out.push_str(&format!(
                "| {name} | {} | {} | {} | {} | {} | {} | {:.1} s | {} | {} | {} | {} | {} | {} | {} | {:.2} s | {} | {} | {} | {} | {} | ${:.4} |\n",
                strategy.name(),
                f.shown,
                f.accepted,
                f.hit_rate.map_or("–".into(), |h| format!("{:.0} %", h * 100.0)),
                ms(f.accept_median_ms),
                ms(f.accept_p90_ms),
                f.wait_ms / 1e3,
                if strategy == Strategy::None { "–".into() } else { secs(f.saved_ms) },
                f.completed,
                f.boundary,
                f.aborted,
                f.failed,
                f.conflicts,
                f.discarded_tokens,
                f.discarded_cpu_ms / 1e3,
                f.discarded_peak_bytes
                    .map(|b| format!("{:.1} MiB", b as f64 / 1048576.0))
                    .unwrap_or_else(|| "–".into()),
                f.replay_missed,
                f.divergent,
                f.tokens.suggestion.prompt + f.tokens.suggestion.completion,
                f.tokens.speculation.prompt + f.tokens.speculation.completion,
                prices.cost(f.tokens.suggestion.plus(f.tokens.speculation).plus(f.tokens.other)),
            ));
        }
    }
    // Suggestions asked for but not shown, by reason (a live suggester's measured output).
    let mut dropped: BTreeMap<String, usize> = BTreeMap::new();
    for r in runs {
        for t in &r.turns {
            if let Some(d) = &t.suggestion_dropped {
                let key = if d.starts_with("failed") {
                    "failed"
                } else {
                    d.as_str()
                };
                *dropped.entry(key.to_string()).or_default() += 1;
            }
        }
    }
    if !dropped.is_empty() {
        let parts: Vec<String> = dropped.iter().map(|(k, n)| format!("{k} ×{n}")).collect();
        out.push_str(&format!(
            "\nSuggestions asked for but not shown (the suggestion filter's rule, or the request \
             failed): {}.\n",
            parts.join(", ")
        ));
    }
    // Every accepted speculation was compared with the live run of its turn.
    let c = checks(runs);
    out.push_str(&format!(
        "\n*accepted* counts only accepts whose result (tool outcomes, files changed) equals the \
         same turn run live (`none`); {} divergent accept(s) counted as misses{}.\n",
        c.divergent.len(),
        if c.unchecked.is_empty() {
            String::new()
        } else {
            format!(
                ", {} accept(s) not checked (no `none` run of their session)",
                c.unchecked.len()
            )
        }
    ));
    if !c.divergent.is_empty() {
        out.push_str("\n| session | strategy | pass | turn | input | what differed |\n|---|---|---|---|---|---|\n");
        for d in c.divergent.values() {
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} |\n",
                d.session,
                d.strategy,
                d.pass + 1,
                d.turn + 1,
                d.input.replace('|', "\\|"),
                d.why.replace('|', "\\|")
            ));
        }
    }
    // The headline: per accepted suggestion saved, per ignored one wasted.
    out.push('\n');
    for strategy in [
        Strategy::Peer,
        Strategy::PeerKeep,
        Strategy::Runnable,
        Strategy::Pipelined,
    ] {
        let Some(f) = t.get(&("all".to_string(), strategy.name().to_string())) else {
            continue;
        };
        let ignored = f.shown.saturating_sub(f.accepted + f.divergent);
        let runs_of = runs
            .iter()
            .filter(|r| r.strategy == strategy)
            .count()
            .max(1);
        let sessions = t
            .keys()
            .filter(|(s, st)| s != "all" && st == strategy.name())
            .count()
            .max(1);
        let per_pass = (runs_of / sessions).max(1) as f64;
        let accepted = f.accepted as f64 / per_pass;
        let saved = match f.saved_ms {
            Some(s) if accepted > 0.0 => format!("{:+.2} s", s / 1e3 / accepted),
            _ => "–".into(),
        };
        let wasted = if ignored > 0 {
            format!(
                "{} tokens and {:.2} CPU-s",
                f.discarded_tokens / ignored as u64,
                f.discarded_cpu_ms / 1e3 / ignored as f64
            )
        } else {
            "nothing (no suggestion ignored)".into()
        };
        out.push_str(&format!(
            "- **{}**: time saved per accepted suggestion {saved}; work thrown away (every discarded speculation: ignored suggestions, conflicts, and for `peer` its discarded boundaries) per ignored suggestion {wasted}.\n",
            strategy.name()
        ));
    }
    out
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A grouped bar chart: per session, one bar per speculating strategy, the time saved
/// against `none` (seconds; below the axis when it cost time).
pub fn svg(runs: &[SessionRun], title: &str) -> String {
    let t = table(runs);
    let strategies: Vec<Strategy> = Strategy::ALL
        .into_iter()
        .filter(|s| *s != Strategy::None && runs.iter().any(|r| r.strategy == *s))
        .collect();
    let mut sessions: Vec<String> = t
        .keys()
        .map(|(s, _)| s.clone())
        .filter(|s| s != "all")
        .collect();
    sessions.sort();
    sessions.dedup();
    let value = |s: &str, st: Strategy| {
        t.get(&(s.to_string(), st.name().to_string()))
            .and_then(|f| f.saved_ms)
            .unwrap_or(0.0)
            / 1e3
    };
    let mut lo: f64 = 0.0;
    let mut hi: f64 = 0.0;
    for s in &sessions {
        for st in &strategies {
            lo = lo.min(value(s, *st));
            hi = hi.max(value(s, *st));
        }
    }
    if hi - lo < 1e-9 {
        hi = lo + 1.0;
    }
    // Axis ends on whole steps, so the top and bottom gridlines frame the bars.
    let step = nice_step((hi - lo) / 5.0);
    lo = (lo / step).floor() * step;
    hi = (hi / step).ceil() * step;
    let span = hi - lo;
    let (left, top, plot_h, bar_w, gap) = (60.0, 50.0, 260.0, 22.0, 30.0);
    let group_w = bar_w * strategies.len().max(1) as f64 + gap;
    let width = (left + group_w * sessions.len().max(1) as f64 + 160.0)
        .max(80.0 + 9.0 * title.chars().count() as f64);
    // Room below for the slanted session names.
    let longest = sessions
        .iter()
        .map(|s| s.chars().count())
        .max()
        .unwrap_or(8) as f64;
    let height = top + plot_h + 30.0 + 5.0 * longest;
    let y = |v: f64| top + (hi - v) / span * plot_h;
    let colours = ["#e6550d", "#8c6bb1", "#2b8cbe", "#41ab5d"];
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" \
         viewBox=\"0 0 {width:.0} {height:.0}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{left}\" y=\"24\" font-size=\"15\">{}</text>\n",
        escape(title)
    );
    // Gridlines and axis labels.
    let mut v = lo;
    while v <= hi + 1e-9 {
        out.push_str(&format!(
            "<line x1=\"{left}\" x2=\"{:.0}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{:.0}\" y=\"{:.1}\" text-anchor=\"end\">{v:.1} s</text>\n",
            left + group_w * sessions.len().max(1) as f64,
            y(v),
            y(v),
            left - 6.0,
            y(v) + 4.0
        ));
        v += step;
    }
    let plot_right = left + group_w * sessions.len().max(1) as f64;
    out.push_str(&format!(
        "<line x1=\"{left}\" x2=\"{:.0}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"black\"/>\n",
        plot_right,
        y(0.0),
        y(0.0)
    ));
    for (i, s) in sessions.iter().enumerate() {
        let x0 = left + gap / 2.0 + group_w * i as f64;
        for (j, st) in strategies.iter().enumerate() {
            let val = value(s, *st);
            let (a, b) = (y(val.max(0.0)), y(val.min(0.0)));
            out.push_str(&format!(
                "<rect x=\"{:.1}\" y=\"{a:.1}\" width=\"{bar_w}\" height=\"{:.1}\" fill=\"{}\">\
                 <title>{} {}: {val:+.2} s</title></rect>\n",
                x0 + bar_w * j as f64,
                (b - a).max(0.5),
                colours[j % colours.len()],
                escape(s),
                st.name()
            ));
        }
        let cx = x0 + bar_w * strategies.len() as f64 / 2.0;
        let ly = top + plot_h + 14.0;
        out.push_str(&format!(
            "<text x=\"{cx:.1}\" y=\"{ly:.1}\" text-anchor=\"end\" \
             transform=\"rotate(-35 {cx:.1} {ly:.1})\">{}</text>\n",
            escape(s)
        ));
    }
    for (j, st) in strategies.iter().enumerate() {
        let ly = top + 10.0 + 20.0 * j as f64;
        out.push_str(&format!(
            "<rect x=\"{:.0}\" y=\"{:.0}\" width=\"12\" height=\"12\" fill=\"{}\"/>\
             <text x=\"{:.0}\" y=\"{:.0}\">{}</text>\n",
            plot_right + 20.0,
            ly - 10.0,
            colours[j % colours.len()],
            plot_right + 38.0,
            ly,
            st.name()
        ));
    }
    out.push_str(&format!(
        "<text x=\"14\" y=\"{:.0}\" transform=\"rotate(-90 14 {:.0})\" text-anchor=\"middle\">\
         user-visible time saved vs none</text>\n</svg>\n",
        top + plot_h / 2.0,
        top + plot_h / 2.0
    ));
    out
}

fn nice_step(raw: f64) -> f64 {
    let raw = raw.max(1e-6);
    let p = 10f64.powf(raw.log10().floor());
    let m = raw / p;
    let n = if m <= 1.0 {
        1.0
    } else if m <= 2.0 {
        2.0
    } else if m <= 5.0 {
        5.0
    } else {
        10.0
    };
    n * p
}
