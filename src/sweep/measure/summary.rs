//! What a trial's counts mean, pure: each candidate's servers and their stats over a window
//! become its [`Measured`] (per GPU, with a throughput interval from the window's bins) or the
//! reason it failed.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::eta::Lengths;
use crate::generate::concurrency::saturating;
use crate::sglang::client::{ClientError, Endpoint, ServerInfo};
use crate::sglang::overflow::Remedy;
use crate::sweep::rank::{Measured, Percentiles};
use crate::sweep::stats;

/// A trial whose requests fail more often than this is a failed row, not a number.
const MAX_ERROR_FRACTION: f64 = 0.05;

/// A ready server of one candidate.
#[derive(Debug, Clone)]
pub struct Server {
    pub label: String,
    pub endpoint: Endpoint,
    /// The GPUs it spans (its layout's group): throughput is compared per GPU.
    pub gpus: u32,
    /// Effective max running requests.
    pub cap: u32,
    pub kv_tokens: u64,
    /// The mamba strategy the server resolved (`/server_info`).
    pub strategy: Option<String>,
}

impl Server {
    /// What the generation core needs to know of it.
    pub(super) fn capacity(&self) -> ServerInfo {
        ServerInfo {
            version: None,
            max_total_num_tokens: Some(self.kv_tokens),
            effective_max_running_requests: Some(u64::from(self.cap)),
            max_running_requests: None,
            context_length: None,
            served_model_name: None,
            model_path: None,
            mamba_strategy: self.strategy.clone(),
            raw: serde_json::Value::Null,
        }
    }
}

/// One candidate's servers in a round.
#[derive(Debug, Clone)]
pub struct Group {
    pub servers: Vec<Server>,
    pub startup_s: Option<f64>,
}

/// Why a candidate's measurement is not a number; `server` names whose log to show.
#[derive(Debug, Clone, PartialEq)]
pub struct TrialFailure {
    pub reason: String,
    pub server: Option<usize>,
}

/// What the closed loop keeps in flight on a server with `cap`.
pub fn in_flight(cap: u32) -> u32 {
    saturating(cap)
}

/// What kind of failure a request met, named as `fleet generate` names the same failure in
/// `failed.jsonl`, whether it came as a status line or inside a 200 stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ErrorClass {
    /// The prompt alone is over the context or the scheduler's input limit.
    PromptTooLong,
    /// Prompt plus max_tokens are over the context.
    ContextOverflow,
    /// Another 4xx.
    Rejected,
    /// 5xx, 429, timeouts, dropped connections, aborts without a code: may succeed later.
    Retryable,
    /// A 200 whose body is not a completion.
    BadResponse,
}

impl ErrorClass {
    pub fn of(e: &ClientError) -> ErrorClass {
        match e {
            ClientError::ContextOverflow { overflow, .. } => match overflow.remedy() {
                Remedy::PromptTooLong => ErrorClass::PromptTooLong,
                Remedy::MaxTokens(_) => ErrorClass::ContextOverflow,
            },
            ClientError::Decode { .. } => ErrorClass::BadResponse,
            e if e.is_retryable() => ErrorClass::Retryable,
            _ => ErrorClass::Rejected,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::PromptTooLong => "prompt_too_long",
            ErrorClass::ContextOverflow => "context_overflow",
            ErrorClass::Rejected => "rejected",
            ErrorClass::Retryable => "retryable",
            ErrorClass::BadResponse => "bad_response",
        }
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one server's load saw.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    /// Output tokens that arrived inside the window (streamed chunks).
    pub window_tokens: u64,
    /// Requests that finished inside the window, and their output tokens.
    pub completed: u64,
    pub completed_tokens: u64,
    /// Failed requests over warm-up and window, and how many of each class.
    pub errors: u64,
    pub error_classes: BTreeMap<ErrorClass, u64>,
    pub first_error: Option<String>,
    /// A request could not reach the server.
    pub unreachable: bool,
    /// Time to first token of requests whose first token arrived in the window, seconds.
    pub ttft: Vec<f64>,
    /// (seconds per token, tokens) per chunk in the window.
    pub itl: Vec<(f64, u64)>,
    /// Output tokens per bin of the window, from its start.
    pub bins: Vec<u64>,
    /// The output lengths of every request sent, warm-up included.
    pub lengths: Lengths,
}

impl Stats {
    fn merge(&mut self, o: Stats) {
        self.window_tokens += o.window_tokens;
        self.completed += o.completed;
        self.completed_tokens += o.completed_tokens;
        self.errors += o.errors;
        for (class, n) in o.error_classes {
            *self.error_classes.entry(class).or_default() += n;
        }
        self.first_error = self.first_error.take().or(o.first_error);
        self.unreachable |= o.unreachable;
        self.ttft.extend(o.ttft);
        self.itl.extend(o.itl);
        if self.bins.len() < o.bins.len() {
            self.bins.resize(o.bins.len(), 0);
        }
        for (a, b) in self.bins.iter_mut().zip(o.bins) {
            *a += b;
        }
        self.lengths.merge(&o.lengths);
    }

    pub(super) fn add_to_bin(&mut self, bin: usize, tokens: u64) {
        if self.bins.len() <= bin {
            self.bins.resize(bin + 1, 0);
        }
        self.bins[bin] += tokens;
    }

    pub(super) fn error(&mut self, e: &ClientError) {
        self.errors += 1;
        *self.error_classes.entry(ErrorClass::of(e)).or_default() += 1;
        self.unreachable |= e.is_unreachable();
        if self.first_error.is_none() {
            self.first_error = Some(e.to_string());
        }
    }
}

/// The `q` quantile (0..=1) of weighted values (nearest rank by cumulative weight).
pub fn weighted_quantile(values: &mut [(f64, u64)], q: f64) -> f64 {
    values.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total: u64 = values.iter().map(|v| v.1).sum();
    if total == 0 {
        return 0.0;
    }
    let target = (q * total as f64).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (v, w) in values.iter() {
        seen += w;
        if seen >= target {
            return *v;
        }
    }
    values.last().map_or(0.0, |v| v.0)
}

fn percentiles(values: &mut [(f64, u64)]) -> Option<Percentiles> {
    (!values.is_empty()).then(|| Percentiles {
        p50: weighted_quantile(values, 0.50),
        p99: weighted_quantile(values, 0.99),
    })
}

/// What a server's `/metrics` counter and health said around the window.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerReading {
    /// `sglang:generation_tokens_total` at the window's start and end.
    pub generation_tokens: (Option<f64>, Option<f64>),
    /// `/health` after the window: `Err` with why it is not healthy.
    pub health: Result<(), Unhealthy>,
}

/// Why a server's `/health` after a window was not a 200.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Unhealthy {
    #[error("/health answered {0}")]
    Status(u16),
    /// No answer: the client's error, as it reads.
    #[error("{0}")]
    NoAnswer(String),
}

/// Turns one candidate's stats over a window of `window` (sampled in bins of `bin`) into its
/// measurement or failure. Pure.
pub fn summarize(
    group: &Group,
    per_server: Vec<(Stats, ServerReading)>,
    window: Duration,
    bin: Duration,
) -> Result<Measured, TrialFailure> {
    let m = figures(group, per_server, window, bin)?;
    if m.output_tok_s == 0.0 {
        return Err(TrialFailure {
            reason: "no output tokens arrived in the measured window".into(),
            server: None,
        });
    }
    Ok(m)
}

/// [`summarize`] for a first window: one in which no token arrived yet is a figure of 0 with no
/// estimate (a slow decode step can outlast it), not a failure.
pub fn summarize_first(
    group: &Group,
    per_server: Vec<(Stats, ServerReading)>,
    window: Duration,
    bin: Duration,
) -> Result<Measured, TrialFailure> {
    figures(group, per_server, window, bin)
}

fn figures(
    group: &Group,
    per_server: Vec<(Stats, ServerReading)>,
    window: Duration,
    bin: Duration,
) -> Result<Measured, TrialFailure> {
    for (i, (stats, reading)) in per_server.iter().enumerate() {
        if let Err(why) = &reading.health {
            return Err(TrialFailure {
                reason: format!(
                    "{} stopped answering mid-trial: {why}",
                    group.servers[i].label
                ),
                server: Some(i),
            });
        }
        if stats.unreachable {
            return Err(TrialFailure {
                reason: format!(
                    "{} stopped answering mid-trial: {}",
                    group.servers[i].label,
                    stats.first_error.as_deref().unwrap_or("connection failed")
                ),
                server: Some(i),
            });
        }
    }
    let metrics_deltas: Option<f64> = per_server
        .iter()
        .map(|(_, r)| match r.generation_tokens {
            (Some(a), Some(b)) => Some(b - a),
            _ => None,
        })
        .sum();
    let worst = per_server
        .iter()
        .enumerate()
        .max_by_key(|(_, (s, _))| s.errors)
        .map(|(i, _)| i);
    let mut all = Stats::default();
    for (s, _) in per_server {
        all.merge(s);
    }
    let secs = window.as_secs_f64();
    let attempts = all.completed + all.errors;
    if all.errors > 0 && all.errors as f64 > MAX_ERROR_FRACTION * attempts as f64 {
        let classes: Vec<String> = all
            .error_classes
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(class, n)| format!("{n} {class}"))
            .collect();
        return Err(TrialFailure {
            reason: format!(
                "{} requests failed ({}; {} finished in the window); first: {}",
                all.errors,
                classes.join(", "),
                all.completed,
                all.first_error.as_deref().unwrap_or("?")
            ),
            server: worst,
        });
    }
    let gpus: usize = group.servers.iter().map(|s| s.gpus.max(1) as usize).sum();
    let output_tok_s = all.window_tokens as f64 / secs;
    let cap = group.servers.iter().map(|s| s.cap).min().unwrap_or(0);
    let mut ttft: Vec<(f64, u64)> = all.ttft.iter().map(|&t| (t, 1)).collect();
    // Only whole bins: a window that is not a multiple of the bin leaves a shorter last one.
    let whole = (window.as_nanos() / bin.as_nanos().max(1)) as usize;
    let per_gpu_bin = bin.as_secs_f64() * gpus.max(1) as f64;
    let samples: Vec<f64> = (0..whole)
        .map(|i| all.bins.get(i).copied().unwrap_or(0) as f64 / per_gpu_bin)
        .collect();
    Ok(Measured {
        gpus,
        server_gpus: group
            .servers
            .iter()
            .map(|s| s.gpus)
            .max()
            .unwrap_or(1)
            .max(1),
        output_tok_s,
        output_tok_s_per_gpu: output_tok_s / gpus.max(1) as f64,
        req_s: all.completed as f64 / secs,
        completed: all.completed,
        errors: all.errors,
        mean_output_tokens: if all.completed > 0 {
            all.completed_tokens as f64 / all.completed as f64
        } else {
            0.0
        },
        ttft_s: percentiles(&mut ttft),
        itl_s: percentiles(&mut all.itl),
        cap,
        in_flight: in_flight(cap),
        kv_tokens: group.servers.iter().map(|s| s.kv_tokens).min().unwrap_or(0),
        strategy: group.servers.iter().find_map(|s| s.strategy.clone()),
        startup_s: group.startup_s,
        completed_output_tok_s: all.completed_tokens as f64 / secs,
        metrics_output_tok_s: metrics_deltas.map(|d| d / secs),
        estimate: stats::estimate(&samples, bin.as_secs_f64()),
        lengths: all.lengths,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(n: usize, cap: u32) -> Group {
        Group {
            servers: (0..n)
                .map(|i| Server {
                    gpus: 1,
                    label: format!("local gpu{i} :3000{i}"),
                    endpoint: Endpoint::from_url(&format!("http://127.0.0.1:3000{i}")),
                    cap,
                    kv_tokens: 1000 + i as u64,
                    strategy: Some("no_buffer".into()),
                })
                .collect(),
            startup_s: Some(1.5),
        }
    }

    fn stats(tokens: u64, completed: u64, errors: u64) -> Stats {
        Stats {
            window_tokens: tokens,
            completed,
            completed_tokens: completed * 100,
            errors,
            error_classes: BTreeMap::from([(ErrorClass::Retryable, errors)]),
            first_error: (errors > 0).then(|| "HTTP 500".to_string()),
            ttft: vec![0.1, 0.2, 0.3],
            itl: vec![(0.01, 90), (0.05, 10)],
            ..Stats::default()
        }
    }

    const SECOND: Duration = Duration::from_secs(1);

    fn ok_reading(a: f64, b: f64) -> ServerReading {
        ServerReading {
            generation_tokens: (Some(a), Some(b)),
            health: Ok(()),
        }
    }

    #[test]
    fn measurements_are_per_gpu_over_the_window_with_a_metrics_cross_check() {
        let m = summarize(
            &group(2, 72),
            vec![
                (stats(4000, 20, 0), ok_reading(0.0, 2000.0)),
                (stats(6000, 30, 1), ok_reading(500.0, 3500.0)),
            ],
            Duration::from_secs(10),
            SECOND,
        )
        .unwrap();
        assert_eq!(m.gpus, 2);
        assert_eq!(m.output_tok_s, 1000.0);
        assert_eq!(m.output_tok_s_per_gpu, 500.0);
        assert_eq!(m.req_s, 5.0);
        assert_eq!(m.errors, 1);
        assert_eq!(m.mean_output_tokens, 100.0);
        assert_eq!(m.completed_output_tok_s, 500.0);
        assert_eq!(m.metrics_output_tok_s, Some(500.0));
        assert!(!m.metrics_disagree());
        assert_eq!((m.cap, m.in_flight, m.kv_tokens), (72, 90, 1000));
        assert_eq!(m.strategy.as_deref(), Some("no_buffer"));
        let (itl, ttft) = (m.itl_s.unwrap(), m.ttft_s.unwrap());
        assert_eq!((itl.p50, itl.p99), (0.01, 0.05));
        assert_eq!(ttft.p50, 0.2);
        assert_eq!(m.startup_s, Some(1.5));
    }

    #[test]
    fn failures_are_classed_as_generate_classes_them_and_never_completions() {
        use crate::sglang::overflow::Overflow;
        let too_long = ClientError::ContextOverflow {
            url: "u".into(),
            overflow: Overflow::InputLimit {
                prompt_tokens: 507,
                max_input: 506,
            },
            message: "Input length (507 tokens) exceeds the maximum allowed length (506 tokens)."
                .into(),
        };
        let full = ClientError::Status {
            url: "u".into(),
            status: 503,
            body: "The request queue is full.".into(),
        };
        let bad = ClientError::Status {
            url: "u".into(),
            status: 400,
            body: "temperature".into(),
        };
        assert_eq!(ErrorClass::of(&too_long), ErrorClass::PromptTooLong);
        assert_eq!(ErrorClass::of(&full), ErrorClass::Retryable);
        assert_eq!(ErrorClass::of(&bad), ErrorClass::Rejected);
        let mut s = Stats {
            window_tokens: 300,
            completed: 3,
            completed_tokens: 300,
            ..Stats::default()
        };
        for e in [&too_long, &too_long, &full] {
            s.error(e);
        }
        let f = summarize(
            &group(1, 8),
            vec![(s.clone(), ok_reading(0.0, 300.0))],
            Duration::from_secs(1),
            SECOND,
        )
        .unwrap_err();
        assert!(
            f.reason.starts_with(
                "3 requests failed (2 prompt_too_long, 1 retryable; 3 finished in the window)"
            ),
            "{}",
            f.reason
        );
        // Under the error threshold the failures are counted, and the mean output is over the
        // completions alone.
        s.completed = 100;
        s.completed_tokens = 10_000;
        let m = summarize(
            &group(1, 8),
            vec![(s, ok_reading(0.0, 300.0))],
            Duration::from_secs(1),
            SECOND,
        )
        .unwrap();
        assert_eq!((m.errors, m.completed), (3, 100));
        assert_eq!(m.mean_output_tokens, 100.0);
    }

    #[test]
    fn a_dead_server_or_many_errors_fail_the_trial() {
        let mut dead = stats(100, 1, 3);
        dead.unreachable = true;
        let f = summarize(
            &group(2, 8),
            vec![
                (stats(100, 5, 0), ok_reading(0.0, 1.0)),
                (dead, ok_reading(0.0, 1.0)),
            ],
            Duration::from_secs(1),
            SECOND,
        )
        .unwrap_err();
        assert_eq!(f.server, Some(1));
        assert!(
            f.reason
                .starts_with("local gpu1 :30001 stopped answering mid-trial"),
            "{}",
            f.reason
        );
        let f = summarize(
            &group(1, 8),
            vec![(
                stats(100, 10, 0),
                ServerReading {
                    generation_tokens: (None, None),
                    health: Err(Unhealthy::NoAnswer("connection refused".into())),
                },
            )],
            Duration::from_secs(1),
            SECOND,
        )
        .unwrap_err();
        assert!(f.reason.contains("connection refused"));
        let f = summarize(
            &group(1, 8),
            vec![(stats(100, 10, 2), ok_reading(0.0, 1.0))],
            Duration::from_secs(1),
            SECOND,
        )
        .unwrap_err();
        assert!(
            f.reason.starts_with(
                "2 requests failed (2 retryable; 10 finished in the window); first: HTTP 500"
            ),
            "{}",
            f.reason
        );
        let m = summarize(
            &group(1, 8),
            vec![(
                stats(100, 100, 2),
                (ServerReading {
                    generation_tokens: (Some(1.0), None),
                    health: Ok(()),
                }),
            )],
            Duration::from_secs(1),
            SECOND,
        )
        .unwrap();
        assert_eq!(m.errors, 2, "a few errors are counted, not fatal");
        assert_eq!(
            m.metrics_output_tok_s, None,
            "a missing scrape gives no cross-check"
        );
    }

    #[test]
    fn the_bins_give_an_interval_per_gpu_and_a_first_window_may_be_empty() {
        let mut a = stats(4000, 20, 0);
        a.bins = vec![390, 410, 400, 405, 395, 400, 410, 390, 400, 400, 7];
        let mut b = stats(6000, 30, 0);
        b.bins = vec![600; 10];
        let m = summarize(
            &group(2, 72),
            vec![(a, ok_reading(0.0, 1.0)), (b, ok_reading(0.0, 1.0))],
            Duration::from_secs(10),
            SECOND,
        )
        .unwrap();
        let e = m.estimate.unwrap();
        assert_eq!(e.samples, 10, "the partial 11th bin is left out");
        assert_eq!(e.mean, 500.0, "per GPU");
        assert!(
            e.low < 500.0 && e.high > 500.0 && e.high - e.low < 10.0,
            "{e:?}"
        );

        // Nothing arrived yet after a short first window: a zero figure, not a failure.
        let mut empty = stats(0, 0, 0);
        empty.ttft.clear();
        empty.itl.clear();
        let f = summarize_first(
            &group(1, 37),
            vec![(empty.clone(), ok_reading(0.0, 0.0))],
            Duration::from_millis(500),
            Duration::from_millis(62),
        )
        .unwrap();
        assert_eq!((f.output_tok_s, f.estimate), (0.0, None));
        assert!(
            summarize(
                &group(1, 37),
                vec![(empty, ok_reading(0.0, 0.0))],
                Duration::from_secs(2),
                SECOND,
            )
            .is_err(),
            "over a whole window it is"
        );
    }

    #[test]
    fn weighted_quantiles_and_in_flight() {
        let mut v = vec![(3.0, 1), (1.0, 1), (2.0, 2)];
        assert_eq!(weighted_quantile(&mut v, 0.5), 2.0);
        assert_eq!(weighted_quantile(&mut v, 0.99), 3.0);
        assert_eq!(weighted_quantile(&mut [], 0.5), 0.0);
        assert_eq!(in_flight(72), 90);
        assert_eq!(in_flight(37), 47);
        assert_eq!(in_flight(0), 1);
    }
}
