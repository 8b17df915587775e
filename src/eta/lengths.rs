//! The output-length distribution of a job's prompts, estimated without survivorship bias: a
//! product-limit (Kaplan–Meier) estimate over finished requests (events), requests stopped by
//! `max_tokens` and requests still streaming (both right-censored: their length is at least
//! what was seen), with the unseen tail bounded rather than guessed.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The normal quantile of a two-sided 90% interval.
pub const Z90: f64 = 1.645;

/// What is known of one request's output length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// It ended by itself (EOS or a stop string) after this many tokens.
    Finished(u32),
    /// `max_tokens` (or the context) stopped it here: its natural length is at least this.
    Capped(u32),
    /// Still streaming, this many tokens so far.
    Running(u32),
}

impl Seen {
    /// What an answer of `tokens` says: stopped by the `max_tokens` it asked for, its length
    /// is at least that; stopped anywhere else (EOS, a stop string, the context), it ended.
    pub fn of_answer(tokens: u64, finish_reason: Option<&str>, max_tokens: u32) -> Seen {
        let n = u32::try_from(tokens).unwrap_or(u32::MAX);
        if finish_reason == Some("length") && n >= max_tokens {
            Seen::Capped(n)
        } else {
            Seen::Finished(n)
        }
    }
}

/// Observations by length: weights, so that a prior's curve can stand as pseudo-observations.
/// Serialized as `[[length, ended, censored], ...]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(from = "Vec<(u32, f64, f64)>", into = "Vec<(u32, f64, f64)>")]
pub struct Lengths {
    /// length → (ended there, censored there).
    at: BTreeMap<u32, (f64, f64)>,
}

impl From<Vec<(u32, f64, f64)>> for Lengths {
    fn from(v: Vec<(u32, f64, f64)>) -> Lengths {
        let mut l = Lengths::default();
        for (t, d, c) in v {
            let e = l.at.entry(t).or_default();
            e.0 += d;
            e.1 += c;
        }
        l
    }
}

impl From<Lengths> for Vec<(u32, f64, f64)> {
    fn from(l: Lengths) -> Self {
        l.at.into_iter().map(|(t, (d, c))| (t, d, c)).collect()
    }
}

impl Lengths {
    pub fn add(&mut self, s: Seen) {
        self.add_weighted(s, 1.0);
    }

    fn add_weighted(&mut self, s: Seen, w: f64) {
        let (t, ended) = match s {
            Seen::Finished(t) => (t, true),
            Seen::Capped(t) | Seen::Running(t) => (t, false),
        };
        let e = self.at.entry(t).or_default();
        if ended {
            e.0 += w;
        } else {
            e.1 += w;
        }
    }

    /// Adds every observation of `other`.
    pub fn merge(&mut self, other: &Lengths) {
        self.merge_weighted(other, 1.0);
    }

    /// Adds every observation of `other`, each weighing `w`.
    pub fn merge_weighted(&mut self, other: &Lengths, w: f64) {
        for (t, (d, c)) in &other.at {
            let e = self.at.entry(*t).or_default();
            e.0 += d * w;
            e.1 += c * w;
        }
    }

    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }

    /// The product-limit estimate from these observations plus requests still streaming,
    /// `running` tokens each so far.
    pub fn survival(&self, running: &[u32]) -> Survival {
        let mut at = self.at.clone();
        for &t in running {
            at.entry(t).or_default().1 += 1.0;
        }
        Survival::of(&at)
    }

    /// Pseudo-observations that reproduce `prior`'s curve with its sample size: each drop of
    /// the curve is that share of the sample ending midway between its point and the one
    /// before (the first point is the shortest length seen), and what is left past its last
    /// point is censored where the curve was last seen.
    pub fn from_prior(prior: &LengthPrior) -> Lengths {
        let mut l = Lengths::default();
        let n = prior.sample as f64;
        let (mut s, mut from) = (1.0, None);
        for &(t, next) in &prior.survival {
            let drop = (s - next).max(0.0);
            if drop > 0.0 {
                let at = from.map_or(t, |f: u32| f + (t - f.min(t)) / 2);
                l.add_weighted(Seen::Finished(at), drop * n);
            }
            s = next;
            from = Some(t);
        }
        if s > 0.0 {
            l.add_weighted(Seen::Capped(prior.seen_to), s * n);
        }
        l
    }
}

/// An estimate with its 90% interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    pub point: f64,
    pub low: f64,
    pub high: f64,
}

impl Interval {
    pub fn exact(x: f64) -> Interval {
        Interval {
            point: x,
            low: x,
            high: x,
        }
    }

    pub fn scale(self, k: f64) -> Interval {
        Interval {
            point: self.point * k,
            low: self.low * k,
            high: self.high * k,
        }
    }

    pub fn plus(self, o: Interval) -> Interval {
        Interval {
            point: self.point + o.point,
            low: self.low + o.low,
            high: self.high + o.high,
        }
    }

    /// Relative width: (high − low) ÷ point.
    pub fn width(&self) -> f64 {
        if self.point > 0.0 {
            (self.high - self.low) / self.point
        } else {
            f64::INFINITY
        }
    }
}

/// Requests that must still be at risk for the curve to be trusted there: past that, a
/// request that just ended can drive it to zero while those still running, whose counts are a
/// chunk or a metrics tick old, sit just below.
const TRUSTED_AT_RISK: f64 = 5.0;

/// The estimated survival curve S(t) = P(length > t), known on `[0, seen]` and trusted, for
/// the interval's bounds, on `[0, trusted]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Survival {
    /// (t, S just after t) at each length where requests ended, ascending.
    steps: Vec<(u32, f64)>,
    /// Greenwood's term d ÷ (n (n − d)) at each step.
    greenwood: Vec<f64>,
    /// The longest observation of any kind: past it the curve is unseen.
    seen: u32,
    /// The longest length with [`TRUSTED_AT_RISK`] requests still at risk (all of them, when
    /// fewer were observed).
    trusted: u32,
    /// A Weibull curve fitted to every observation (censored ones included), for the tail's
    /// point estimate: its shape follows a hazard that rises (lengths bunched below a limit) as
    /// well as one that falls (a heavy tail).
    weibull: Option<Weibull>,
    /// Observations (finished and censored).
    n: f64,
}

impl Survival {
    fn of(at: &BTreeMap<u32, (f64, f64)>) -> Survival {
        let n: f64 = at.values().map(|(d, c)| d + c).sum();
        let seen = at.keys().next_back().copied().unwrap_or(0);
        let (mut steps, mut greenwood) = (Vec::new(), Vec::new());
        let mut at_risk = n;
        let mut trusted = 0;
        let mut s = 1.0;
        for (&t, &(d, c)) in at {
            if at_risk >= TRUSTED_AT_RISK.min(n) {
                trusted = t;
            }
            if d > 0.0 && at_risk > 0.0 {
                s *= 1.0 - d / at_risk;
                steps.push((t, s));
                greenwood.push(if at_risk > d {
                    d / (at_risk * (at_risk - d))
                } else {
                    0.0
                });
            }
            at_risk -= d + c;
        }
        Survival {
            steps,
            greenwood,
            seen,
            trusted,
            weibull: Weibull::fit(at),
            n,
        }
    }

    /// Observations behind the estimate.
    pub fn observations(&self) -> f64 {
        self.n
    }

    /// Whether more than 2% of requests may run past what the curve can tell, short of `cap`.
    pub fn tail_unseen(&self, cap: u32) -> bool {
        self.trusted < cap && self.at(self.trusted) > 0.02
    }

    /// P(length > t) for t within what was seen.
    pub fn at(&self, t: u32) -> f64 {
        match self.steps.partition_point(|(x, _)| *x <= t) {
            0 => 1.0,
            i => self.steps[i - 1].1,
        }
    }

    /// ∫ S over `[a, b]`, within what was seen.
    fn area(&self, a: u32, b: u32) -> f64 {
        if b <= a {
            return 0.0;
        }
        let (mut total, mut from, mut s) = (0.0, a, self.at(a));
        let first = self.steps.partition_point(|(x, _)| *x <= a);
        for &(t, next) in &self.steps[first..] {
            if t >= b {
                break;
            }
            total += s * f64::from(t - from);
            from = t;
            s = next;
        }
        total + s * f64::from(b - from)
    }

    /// ∫ S over `[from, cap]`: the curve as seen, then, past what was seen, a Weibull tail
    /// (half the flat bound without a fit).
    fn integral(&self, from: u32, cap: u32) -> f64 {
        let end = cap.min(self.seen).max(from);
        let seen = self.area(from, end);
        if cap <= end {
            return seen;
        }
        let s = self.at(end);
        let tail = match &self.weibull {
            Some(w) => s * w.rest(f64::from(end), f64::from(cap)),
            None => s * f64::from(cap - end) / 2.0,
        };
        seen + tail
    }

    /// Bounds of ∫ S over `[from, cap]`: the trusted curve then nothing at least, the trusted
    /// curve then staying flat at most.
    fn bounds(&self, from: u32, cap: u32) -> (f64, f64) {
        let end = cap.min(self.trusted).max(from);
        let known = self.area(from, end);
        (known, known + self.at(end) * f64::from(cap - end))
    }

    /// E[min(length, cap)], with a 90% interval: the sampling error (Greenwood) of the part
    /// trusted, and the bounds of the rest.
    pub fn mean(&self, cap: u32) -> Option<Interval> {
        if self.n <= 0.0 {
            return None;
        }
        let end = cap.min(self.trusted);
        // Var = Σ A_j² d/(n(n−d)), A_j the area from step j to the end.
        let mut var = 0.0;
        let mut after = 0.0;
        let mut right = end;
        for (i, &(t, _)) in self.steps.iter().enumerate().rev() {
            if t >= end {
                continue;
            }
            after += self.area(t, right);
            right = t;
            var += after * after * self.greenwood[i];
        }
        let sd = var.sqrt();
        let (low, high) = self.bounds(0, cap);
        let point = self.integral(0, cap);
        Some(Interval {
            point,
            low: (low - Z90 * sd).max(0.0).min(point),
            high: (high + Z90 * sd).max(point),
        })
    }

    /// The tokens still to come of a request that has streamed `so_far` of at most `cap`:
    /// E[min(length, cap) − so_far | length ≥ so_far].
    pub fn rest(&self, so_far: u32, cap: u32) -> Interval {
        if so_far >= cap {
            return Interval::exact(0.0);
        }
        let s0 = if so_far == 0 {
            1.0
        } else {
            self.at(so_far - 1)
        };
        if s0 <= 0.0 || so_far > self.trusted {
            // It outlived what the curve can tell: only the cap bounds it.
            let span = f64::from(cap - so_far);
            return Interval {
                point: span / 2.0,
                low: 0.0,
                high: span,
            };
        }
        let (low, high) = self.bounds(so_far, cap);
        let point = self.integral(so_far, cap);
        Interval {
            point,
            low: low.min(point),
            high: high.max(point),
        }
        .scale(1.0 / s0)
    }

    /// The length the longest of `n` requests may be expected to reach, at most `cap`: where
    /// the curve falls to 1 ÷ (n + 1). Past what was seen, the point is on the Weibull tail
    /// and the upper bound is `cap`.
    pub fn longest_of(&self, n: u64, cap: u32) -> Interval {
        let share = 1.0 / (n as f64 + 1.0);
        if let Some((t, _)) = self.steps.iter().find(|(_, s)| *s <= share) {
            return Interval::exact(f64::from((*t).min(cap)));
        }
        let (s, cap) = (self.at(self.seen), f64::from(cap));
        let point = match &self.weibull {
            Some(w) if s > 0.0 => w.reaching(f64::from(self.seen), share / s).min(cap),
            _ => cap,
        };
        Interval {
            point,
            low: point,
            high: cap,
        }
    }

    /// The curve as a profile records it: its first step, then where it crosses each 5% step.
    pub fn prior(&self, max_tokens: u32) -> LengthPrior {
        let mut survival = Vec::new();
        let mut next = 0.95;
        for (i, &(t, s)) in self.steps.iter().enumerate() {
            if i == 0 || s <= next + 1e-12 {
                survival.push((t, round(s, 4)));
                while next > s + 1e-12 {
                    next -= 0.05;
                }
            }
        }
        LengthPrior {
            max_tokens,
            sample: self.n.round() as u64,
            seen_to: self.seen,
            mean: self.mean(max_tokens).map(|m| round(m.point, 1)),
            survival,
        }
    }
}

/// S(t) = exp(−(t/scale)^shape).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Weibull {
    shape: f64,
    scale: f64,
}

impl Weibull {
    /// The maximum-likelihood fit with right-censoring: for a shape k the best scale is
    /// (Σ t^k ÷ endings)^(1/k), so only k is searched (golden section over a log range).
    fn fit(at: &BTreeMap<u32, (f64, f64)>) -> Option<Weibull> {
        let ended: f64 = at.values().map(|(d, _)| d).sum();
        if ended <= 0.0 {
            return None;
        }
        let pts: Vec<(f64, f64, f64)> = at
            .iter()
            .filter(|(t, _)| **t > 0)
            .map(|(t, (d, c))| (f64::from(*t), *d, d + c))
            .collect();
        // Scaled so that t^k stays finite for large k.
        let top = pts.iter().map(|p| p.0).fold(1.0, f64::max);
        let sum_log_ended: f64 = pts.iter().map(|(t, d, _)| d * (t / top).ln()).sum();
        let log_lik = |k: f64| {
            let sum_pow: f64 = pts.iter().map(|(t, _, w)| w * (t / top).powf(k)).sum();
            if sum_pow <= 0.0 {
                return f64::NEG_INFINITY;
            }
            ended * k.ln() - ended * (sum_pow / ended).ln() + (k - 1.0) * sum_log_ended - ended
        };
        let (mut a, mut b) = (0.2f64.ln(), 20f64.ln());
        let g = (5f64.sqrt() - 1.0) / 2.0;
        for _ in 0..60 {
            let (x1, x2) = (b - g * (b - a), a + g * (b - a));
            if log_lik(x1.exp()) < log_lik(x2.exp()) {
                a = x1;
            } else {
                b = x2;
            }
        }
        let shape = ((a + b) / 2.0).exp();
        let sum_pow: f64 = pts.iter().map(|(t, _, w)| w * (t / top).powf(shape)).sum();
        let scale = top * (sum_pow / ended).powf(1.0 / shape);
        (scale.is_finite() && scale > 0.0).then_some(Weibull { shape, scale })
    }

    fn survival(&self, t: f64) -> f64 {
        (-(t / self.scale).powf(self.shape)).exp()
    }

    /// The length where, given survival to `from`, the share still going falls to `share`.
    fn reaching(&self, from: f64, share: f64) -> f64 {
        let base = (from / self.scale).powf(self.shape);
        self.scale * (base - share.ln()).powf(1.0 / self.shape)
    }

    /// ∫ S over [from, to] given survival to `from` (Simpson's rule).
    fn rest(&self, from: f64, to: f64) -> f64 {
        let s0 = self.survival(from);
        if s0 <= 0.0 || to <= from {
            return 0.0;
        }
        let n = 64;
        let h = (to - from) / f64::from(n);
        let f = |i: u32| self.survival(from + h * f64::from(i)) / s0;
        let inner: f64 = (1..n)
            .map(|i| if i % 2 == 1 { 4.0 * f(i) } else { 2.0 * f(i) })
            .sum();
        h / 3.0 * (f(0) + inner + f(n))
    }
}

fn round(x: f64, decimals: i32) -> f64 {
    let f = 10f64.powi(decimals);
    (x * f).round() / f
}

/// A measured length distribution, as `sweep.json` and a profile's `expected.output_tokens`
/// record it: a job started from it uses it as its prior.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LengthPrior {
    /// The `max_tokens` the requests asked for.
    pub max_tokens: u32,
    /// Requests observed, finished or not.
    pub sample: u64,
    /// The longest length seen: the curve is unknown past it.
    pub seen_to: u32,
    /// E[min(length, max_tokens)], for the reader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean: Option<f64>,
    /// (length, share still going past it), where the curve crosses each 5% step.
    pub survival: Vec<(u32, f64)>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn uniform(lo: u32, hi: u32, n: usize, seed: u64) -> Vec<u32> {
        let mut r = rand::rngs::SmallRng::seed_from_u64(seed);
        (0..n).map(|_| r.random_range(lo..=hi)).collect()
    }

    #[test]
    fn with_every_request_finished_it_is_the_plain_mean() {
        let mut l = Lengths::default();
        for t in [100, 200, 300, 400] {
            l.add(Seen::Finished(t));
        }
        let m = l.survival(&[]).mean(1000).unwrap();
        assert!((m.point - 250.0).abs() < 1e-9, "{m:?}");
        assert!(m.low < 250.0 && m.high > 250.0);
        // Restricted to a cap below some lengths.
        let m = l.survival(&[]).mean(250).unwrap();
        assert!((m.point - (100.0 + 200.0 + 250.0 + 250.0) / 4.0).abs() < 1e-9);
    }

    /// The first minute: a cohort of 144 requests all started together, lengths uniform in
    /// 200..=1776, followed up to 1000 tokens. The finished ones average ~600; the estimate,
    /// with the running ones censored, brackets the true 988.
    #[test]
    fn running_requests_undo_the_survivors_bias_and_the_interval_holds_the_truth() {
        for seed in 0..20 {
            let lens = uniform(200, 1776, 144, seed);
            let truth = lens.iter().map(|&x| f64::from(x)).sum::<f64>() / 144.0;
            let mut l = Lengths::default();
            let mut running = Vec::new();
            for &x in &lens {
                if x <= 1000 {
                    l.add(Seen::Finished(x));
                } else {
                    running.push(1000);
                }
            }
            let naive = l.survival(&[]).mean(4096).unwrap().point;
            assert!(naive < 0.7 * truth, "finished only: {naive} vs {truth}");
            let m = l.survival(&running).mean(4096).unwrap();
            assert!(
                m.low <= truth && truth <= m.high,
                "seed {seed}: {truth} outside {m:?}"
            );
            assert!(
                (m.point - truth).abs() / truth < 0.15,
                "seed {seed}: {m:?} vs {truth}"
            );
        }
    }

    #[test]
    fn capped_requests_are_counted_at_the_cap() {
        let mut l = Lengths::default();
        for _ in 0..50 {
            l.add(Seen::Finished(100));
            l.add(Seen::Capped(512));
        }
        let m = l.survival(&[]).mean(512).unwrap();
        assert!((m.point - 306.0).abs() < 1e-9, "{m:?}");
        // Lengths of 100 or 512, half each: the mean of 100 has a standard error of 20.6.
        assert!((m.high - m.low - 2.0 * Z90 * 20.6).abs() < 0.1, "{m:?}");
    }

    #[test]
    fn the_interval_narrows_as_the_tail_is_seen() {
        let lens = uniform(200, 1776, 400, 7);
        let width_at = |seen: u32| {
            let mut l = Lengths::default();
            let mut running = Vec::new();
            for &x in &lens {
                if x <= seen {
                    l.add(Seen::Finished(x));
                } else {
                    running.push(seen);
                }
            }
            l.survival(&running).mean(4096).unwrap().width()
        };
        let (early, later, all) = (width_at(600), width_at(1200), width_at(2000));
        assert!(early > later && later > all, "{early} {later} {all}");
        // Seen to the end, it is the sampling error and the last five at risk, untrusted.
        assert!(all < 0.15, "{all}");
    }

    #[test]
    fn the_rest_of_a_running_request_is_what_its_length_leaves() {
        let mut l = Lengths::default();
        for t in [100, 200, 300, 400] {
            for _ in 0..10 {
                l.add(Seen::Finished(t));
            }
        }
        let s = l.survival(&[]);
        // Past 250 only 300 and 400 remain: 50 or 150 to go.
        let r = s.rest(251, 1000);
        assert!((r.point - 99.0).abs() < 1.0, "{r:?}");
        assert_eq!(s.rest(1000, 1000), Interval::exact(0.0));
        // Outlived everything seen: bounded by the cap.
        let r = s.rest(500, 1000);
        assert!(r.low == 0.0 && r.high == 500.0, "{r:?}");
        // Past the last five at risk the curve is not trusted either.
        let mut few = Lengths::default();
        for t in [100, 200, 300, 400] {
            few.add(Seen::Finished(t));
        }
        let r = few.survival(&[]).rest(251, 1000);
        assert!(r.low == 0.0 && r.high == 749.0, "{r:?}");
    }

    #[test]
    fn a_prior_stands_for_its_curve_and_its_sample() {
        let lens = uniform(200, 1776, 400, 3);
        let mut l = Lengths::default();
        for &x in &lens {
            l.add(Seen::Finished(x));
        }
        let s = l.survival(&[]);
        let prior = s.prior(4096);
        assert_eq!(prior.sample, 400);
        assert!(prior.survival.len() >= 19, "{prior:?}");
        let back = Lengths::from_prior(&prior).survival(&[]);
        let (a, b) = (s.mean(4096).unwrap(), back.mean(4096).unwrap());
        assert!((a.point - b.point).abs() / a.point < 0.03, "{a:?} {b:?}");
        assert!((back.observations() - 400.0).abs() < 1e-6);
        let text = serde_json::to_string(&prior).unwrap();
        assert_eq!(serde_json::from_str::<LengthPrior>(&text).unwrap(), prior);
    }

    #[test]
    fn the_weibull_fit_finds_a_known_curve_through_censoring() {
        // Lengths 1000·(−ln u)^(1/2) (shape 2, scale 1000), censored at 900.
        let mut l = Lengths::default();
        let mut running = Vec::new();
        for i in 1..2000 {
            let u = f64::from(i) / 2000.0;
            let t = (1000.0 * (-u.ln()).sqrt()).round() as u32;
            if t <= 900 {
                l.add(Seen::Finished(t.max(1)));
            } else {
                running.push(900);
            }
        }
        let w = l.survival(&running).weibull.unwrap();
        assert!((w.shape - 2.0).abs() < 0.1, "{w:?}");
        assert!((w.scale - 1000.0).abs() < 30.0, "{w:?}");
    }

    #[test]
    fn the_longest_of_many_is_seen_on_the_curve_or_its_tail() {
        let lens = uniform(200, 1776, 400, 5);
        let mut l = Lengths::default();
        for &x in &lens {
            l.add(Seen::Finished(x));
        }
        let s = l.survival(&[]);
        let max = f64::from(*lens.iter().max().unwrap());
        assert_eq!(
            s.longest_of(1000, 4096),
            Interval::exact(max),
            "seen to its end"
        );
        assert_eq!(s.longest_of(1000, 1000).high, 1000.0, "at most the cap");
        // Followed only to 1000 tokens: past it, the fitted tail says where it ends.
        let mut l = Lengths::default();
        let mut running = Vec::new();
        for &x in &lens {
            if x <= 1000 {
                l.add(Seen::Finished(x));
            } else {
                running.push(1000);
            }
        }
        let longest = l.survival(&running).longest_of(400, 4096);
        assert!((1000.0..4096.0).contains(&longest.point), "{longest:?}");
        assert_eq!(longest.high, 4096.0, "unseen, it may run to the cap");
    }

    #[test]
    fn nothing_seen_is_no_estimate() {
        assert_eq!(Lengths::default().survival(&[]).mean(100), None);
    }
}
