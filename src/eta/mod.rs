//! The one estimator behind every ETA fleet shows (the job's progress, `fleet progress`, the
//! sweep's projection and the report): remaining work ÷ live token throughput, where the work
//! is each waiting prompt's expected output (the [`lengths`] estimate, capped by `max_tokens`)
//! plus what the running requests still have to stream, with a 90% interval. Pure: its callers
//! bring the counts and the clock.

pub mod lengths;

use serde::{Deserialize, Serialize};

pub use lengths::{Interval, LengthPrior, Lengths, Seen, Survival};

/// Where the expected output length comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// A sweep's measured distribution (the profile's `expected.output_tokens`), nothing of
    /// the job's own yet.
    Sweep,
    /// The job's own requests.
    Job,
    /// The sweep's distribution pooled with the job's requests.
    #[serde(rename = "sweep+job")]
    SweepAndJob,
    /// `--expected-output-tokens`.
    Given,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Sweep => "sweep",
            Source::Job => "job",
            Source::SweepAndJob => "sweep+job",
            Source::Given => "given",
        }
    }
}

/// The expected output tokens of one prompt (capped by `max_tokens`), and what it rests on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Expectation {
    pub tokens: Interval,
    pub source: Source,
    /// More than 2% of requests may run past what the curve can tell: the unseen tail still
    /// widens the interval.
    pub tail_unseen: bool,
    /// The length the longest of the requests still to come may reach (up to `max_tokens`
    /// while unseen): how long the last of a job keeps its end waiting.
    pub longest: Interval,
}

/// What is known of the output lengths: a prior (a sweep's), the job's own requests, or a
/// number the user gave.
#[derive(Debug, Clone, Default)]
pub struct LengthModel {
    prior: Option<Lengths>,
    own: Lengths,
    given: Option<f64>,
}

impl LengthModel {
    pub fn new(prior: Option<&LengthPrior>, given: Option<f64>) -> LengthModel {
        LengthModel {
            prior: prior.map(Lengths::from_prior),
            own: Lengths::default(),
            given,
        }
    }

    pub fn observe(&mut self, s: Seen) {
        self.own.add(s);
    }

    /// The curve from everything known, with requests still streaming at `running` tokens.
    pub fn survival(&self, running: &[u32]) -> Survival {
        match &self.prior {
            Some(p) => {
                let mut all = p.clone();
                all.merge(&self.own);
                all.survival(running)
            }
            None => self.own.survival(running),
        }
    }

    fn source(&self, running: &[u32]) -> Source {
        let own = !self.own.is_empty() || !running.is_empty();
        match (&self.prior, own) {
            (Some(_), true) => Source::SweepAndJob,
            (Some(_), false) => Source::Sweep,
            (None, _) => Source::Job,
        }
    }

    /// The expected output tokens of a prompt capped at `cap`, of `n` still to come.
    pub fn expect(&self, s: &Survival, running: &[u32], cap: u32, n: u64) -> Option<Expectation> {
        if let Some(g) = self.given {
            let g = g.min(f64::from(cap));
            return Some(Expectation {
                tokens: Interval::exact(g),
                source: Source::Given,
                tail_unseen: false,
                longest: Interval::exact(g),
            });
        }
        let tokens = s.mean(cap)?;
        Some(Expectation {
            tokens,
            source: self.source(running),
            tail_unseen: s.tail_unseen(cap),
            longest: s.longest_of(n, cap),
        })
    }
}

/// The work left, as the estimator needs it.
#[derive(Debug, Clone, Copy)]
pub struct Work<'a> {
    /// Prompts not sent yet (nor finished, nor failed).
    pub waiting: u64,
    /// Tokens streamed so far by each request in flight.
    pub running: &'a [u32],
    /// The most output tokens one request may have (`max_tokens`, within the context).
    pub cap: u32,
}

/// Output tokens per second, as a recent window measured it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    pub tok_s: f64,
    /// The lowest and highest rate of the window's halves: how steady it is.
    pub low: f64,
    pub high: f64,
    /// Requests running while it was measured (to know how fast one request goes).
    pub running: f64,
}

/// The ETA, in seconds (`None` while nothing streams), with the expected length it used.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Eta {
    pub secs: Option<Interval>,
    pub length: Expectation,
}

/// Remaining work ÷ live rate, for the waiting prompts and the running requests' rest. Once
/// nothing waits, the upper bound is at least the slowest rest at one request's full-batch
/// speed: the job's last requests end when the slowest of them does, however few tokens the
/// rest add up to. The point and the lower bound do not take it: a shrinking batch decodes
/// each request faster (up to 5x in the benchmark), which overshot the end by 20-34%.
pub fn eta(model: &LengthModel, work: Work<'_>, rate: Rate) -> Option<Eta> {
    let survival = model.survival(work.running);
    let n = work.waiting + work.running.len() as u64;
    let length = model.expect(&survival, work.running, work.cap, n)?;
    let mut tokens = length.tokens.scale(work.waiting as f64);
    let mut slowest = 0.0f64;
    for &so_far in work.running {
        let rest = match model.given {
            Some(g) => Interval::exact((g - f64::from(so_far)).max(0.0)),
            None => survival.rest(so_far, work.cap),
        };
        tokens = tokens.plus(rest);
        slowest = slowest.max(rest.high);
    }
    let mut secs = duration(tokens, &length, rate);
    if let Some(s) = &mut secs
        && work.waiting == 0
        && rate.tok_s > 0.0
    {
        s.high = s.high.max(slowest * rate.running.max(1.0) / rate.tok_s);
    }
    Some(Eta { secs, length })
}

/// How long `tokens` of output take at `rate` (`None` while nothing streams), with a job's
/// end: the last requests run in batches that are no longer full, for up to the longest of
/// them less the mean at one request's speed. The upper bound takes all of that drain; the point takes
/// half, since the last batch's requests end spread between the mean and the longest, and a
/// shrinking batch decodes faster.
pub fn duration(tokens: Interval, length: &Expectation, rate: Rate) -> Option<Interval> {
    if tokens.high <= 0.0 {
        return Some(Interval::exact(0.0));
    }
    if rate.tok_s <= 0.0 {
        return None;
    }
    // A half of the window that still holds the start (batches filling) says nothing of the
    // steady rate: the bounds stay within a factor of two of the rate itself.
    let (fast, slow) = (
        rate.high.clamp(rate.tok_s, 2.0 * rate.tok_s),
        rate.low.clamp(rate.tok_s / 2.0, rate.tok_s),
    );
    let per_request = rate.tok_s / rate.running.max(1.0);
    let drain = |longest: f64| (longest - length.tokens.point).max(0.0) / per_request;
    Some(Interval {
        point: tokens.point / rate.tok_s + drain(length.longest.point) / 2.0,
        low: tokens.low / fast,
        high: tokens.high / slow + drain(length.longest.high),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn work(waiting: u64, running: &[u32], cap: u32) -> Work<'_> {
        Work {
            waiting,
            running,
            cap,
        }
    }

    fn rate(tok_s: f64) -> Rate {
        Rate {
            tok_s,
            low: tok_s * 0.98,
            high: tok_s * 1.02,
            running: 144.0,
        }
    }

    #[test]
    fn the_seed_at_72_s_would_have_read_about_51_hours_not_208() {
        // 73 of 654,676 finished at 988 tokens on average; 256 in flight. The fleet ran
        // ≥ 3,500 tok/s: every request decoded at ≥ 13.7 tok/s for 72 s.
        let mut m = LengthModel::new(None, Some(988.0));
        m.observe(Seen::Finished(988));
        let running = vec![988u32; 256 - 73];
        let e = eta(&m, work(654_676 - 256, &running, 4096), rate(3_500.0)).unwrap();
        let hours = e.secs.unwrap().point / 3600.0;
        assert!((50.0..52.5).contains(&hours), "{hours}");
    }

    #[test]
    fn with_nothing_running_and_nothing_waiting_it_is_over() {
        let m = LengthModel::new(None, None);
        let e = eta(&m, work(0, &[], 100), rate(0.0));
        assert_eq!(e, None, "no length known yet, nothing to say");
        let mut m = LengthModel::new(None, None);
        m.observe(Seen::Finished(50));
        let e = eta(&m, work(0, &[], 100), rate(0.0)).unwrap();
        assert_eq!(e.secs, Some(Interval::exact(0.0)));
    }

    #[test]
    fn at_the_end_the_slowest_request_bounds_the_time_not_the_tokens_left() {
        // Every answer is 1,000 tokens; three requests left, two nearly done and one at 500,
        // each at 16 tok/s.
        let m = LengthModel::new(None, Some(1000.0));
        let mut r = rate(48.0);
        r.running = 3.0;
        let secs = eta(&m, work(0, &[990, 990, 500], 4096), r)
            .unwrap()
            .secs
            .unwrap();
        // 520 tokens left at 48 tok/s is 10.8 s; the last one's 500 at 16 tok/s is 31 s.
        assert!((secs.point - 520.0 / 48.0).abs() < 1e-9, "{secs:?}");
        assert!((secs.high - 500.0 / 16.0).abs() < 1e-9, "{secs:?}");
    }

    #[test]
    fn a_prior_answers_before_the_job_has_seen_anything_and_says_so() {
        let mut sweep = Lengths::default();
        for t in (200..=1776).step_by(4) {
            sweep.add(Seen::Finished(t));
        }
        let prior = sweep.survival(&[]).prior(4096);
        let m = LengthModel::new(Some(&prior), None);
        let e = eta(&m, work(1000, &[], 4096), rate(2_361.0)).unwrap();
        assert_eq!(e.length.source, Source::Sweep);
        assert!((e.length.tokens.point - 988.0).abs() < 30.0, "{e:?}");
        // 1,000 × 988 tokens at 2,361 tok/s is 418 s, and half the drain: the longest of the
        // 1,000 (the curve's end, near 1,776) less the mean, at 2,361 ÷ 144 tok/s a request.
        assert!((e.secs.unwrap().point - 440.0).abs() < 15.0, "{e:?}");
        let mut m = m;
        m.observe(Seen::Finished(500));
        let e = eta(&m, work(999, &[10], 4096), rate(2_361.0)).unwrap();
        assert_eq!(e.length.source, Source::SweepAndJob);
        assert_eq!(
            serde_json::to_value(Source::SweepAndJob).unwrap(),
            Source::SweepAndJob.as_str()
        );
    }
}
