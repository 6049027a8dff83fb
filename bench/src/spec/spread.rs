//! Spread: one pass on a shared machine says little (an earlier pass gave a baseline twice as
//! long). Each (session, pass) of a strategy is paired with the same session and pass run
//! live (`none`), and the headline figures get percentile-bootstrap 95 % intervals over those
//! pairs (2,000 resamples, a fixed seed: the same runs give the same report, sharded or not).

use serde::Serialize;

use super::engine::Strategy;
use super::report::{checks, figures, Checks, SessionRun};

/// One (session, pass) of a strategy paired with `none`'s.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Pair {
    /// `none`'s wait less the strategy's (ms).
    pub saved_ms: f64,
    /// Credited accepts.
    pub accepted: f64,
    /// Suggestions shown.
    pub shown: f64,
}

/// The pairs of `strategy` in `runs`.
pub fn pairs(runs: &[SessionRun], strategy: Strategy, c: &Checks) -> Vec<Pair> {
    let mut out = Vec::new();
    for r in runs.iter().filter(|r| r.strategy == strategy) {
        let Some(live) = runs
            .iter()
            .find(|x| x.strategy == Strategy::None && x.session == r.session && x.pass == r.pass)
        else {
            continue;
        };
        let f = figures([r], c);
        let base = figures([live], c);
        out.push(Pair {
            saved_ms: base.wait_ms - f.wait_ms,
            accepted: f.accepted as f64,
            shown: f.shown as f64,
        });
    }
    out
}

/// A figure and its 95 % interval.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Interval {
    /// The estimate on all pairs.
    pub value: f64,
    /// 2.5th percentile of the bootstrap.
    pub low: f64,
    /// 97.5th percentile.
    pub high: f64,
}

impl Interval {
    /// `value [low, high]` with `scale` and `unit`.
    pub fn show(&self, scale: f64, unit: &str) -> String {
        format!(
            "{:+.2}{unit} [{:+.2}, {:+.2}]",
            self.value * scale,
            self.low * scale,
            self.high * scale
        )
    }
}

/// xorshift64*: a small fixed-seed generator (no dependency, same numbers everywhere).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n.max(1)
    }
}

/// Σnum / Σden over `pairs`, with its bootstrap interval (None without pairs or when every
/// resample's denominator is 0).
pub fn ratio(pairs: &[Pair], num: fn(&Pair) -> f64, den: fn(&Pair) -> f64) -> Option<Interval> {
    let stat = |idx: &mut dyn Iterator<Item = usize>| {
        let (mut n, mut d) = (0.0, 0.0);
        for i in idx {
            n += num(&pairs[i]);
            d += den(&pairs[i]);
        }
        (d > 0.0).then(|| n / d)
    };
    let value = stat(&mut (0..pairs.len()))?;
    let mut rng = Rng(0x5eed_1234_abcd_0032);
    let mut boot: Vec<f64> = (0..2000)
        .filter_map(|_| {
            let picks: Vec<usize> = (0..pairs.len()).map(|_| rng.below(pairs.len())).collect();
            stat(&mut picks.into_iter())
        })
        .collect();
    if boot.is_empty() {
        return None;
    }
    boot.sort_by(|a, b| a.total_cmp(b));
    let at = |p: f64| boot[((boot.len() - 1) as f64 * p).round() as usize];
    Some(Interval {
        value,
        low: at(0.025),
        high: at(0.975),
    })
}

/// A strategy's headline figures with intervals.
#[derive(Debug, Clone, Serialize)]
pub struct Spread {
    /// The strategy.
    pub strategy: String,
    /// Pairs (session × pass).
    pub pairs: usize,
    /// Seconds saved per session run.
    pub saved_per_session_s: Option<Interval>,
    /// Seconds saved per credited accept.
    pub saved_per_accept_s: Option<Interval>,
    /// Seconds saved per shown suggestion.
    pub saved_per_shown_s: Option<Interval>,
    /// Credited accepts / shown.
    pub hit_rate: Option<Interval>,
}

/// Every strategy's spread in `runs` (`none` paired with itself: its hit rate's interval,
/// nothing saved).
pub fn spreads(runs: &[SessionRun]) -> Vec<Spread> {
    let c = checks(runs);
    Strategy::ALL
        .into_iter()
        .filter_map(|s| {
            let p = pairs(runs, s, &c);
            (!p.is_empty()).then(|| Spread {
                strategy: s.name().to_string(),
                pairs: p.len(),
                saved_per_session_s: ratio(&p, |x| x.saved_ms / 1e3, |_| 1.0),
                saved_per_accept_s: ratio(&p, |x| x.saved_ms / 1e3, |x| x.accepted),
                saved_per_shown_s: ratio(&p, |x| x.saved_ms / 1e3, |x| x.shown),
                hit_rate: ratio(&p, |x| x.accepted, |x| x.shown),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_interval_holds_the_estimate_and_is_reproducible() {
        let p: Vec<Pair> = (0..20)
            .map(|i| Pair {
                saved_ms: 1000.0 + 100.0 * f64::from(i % 5),
                accepted: 2.0,
                shown: 3.0,
            })
            .collect();
        let a = ratio(&p, |x| x.saved_ms, |x| x.accepted).unwrap();
        let b = ratio(&p, |x| x.saved_ms, |x| x.accepted).unwrap();
        assert!((a.value - 600.0).abs() < 1e-9);
        assert!(a.low <= a.value && a.value <= a.high && a.low < a.high);
        assert_eq!((a.low, a.high), (b.low, b.high));
        let h = ratio(&p, |x| x.accepted, |x| x.shown).unwrap();
        assert!((h.value - 2.0 / 3.0).abs() < 1e-9 && h.low == h.high);
        assert!(ratio(&[], |x| x.saved_ms, |_| 1.0).is_none());
    }
}
