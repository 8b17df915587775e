//! `progress.json`: its schema (the seed script's fields plus per-instance rates), sliding-window
//! rates for an honest ETA, and the atomic temp-file-and-rename write.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::server::ServerId;

pub const PROGRESS_FILE: &str = "progress.json";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Running,
    /// Nothing is healthy: probing, and going on by itself when something is back.
    Paused,
    Done,
    Failed,
    Interrupted,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Running => "running",
            Status::Paused => "paused",
            Status::Done => "done",
            Status::Failed => "failed",
            Status::Interrupted => "interrupted",
        }
    }
}

/// What earlier runs of a resumed job already wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Baseline {
    /// Prompt lines in the input (up to `--limit`).
    pub total: u64,
    pub completed: u64,
    pub failed: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// The document written to `DIR/progress.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    pub total: u64,
    /// Completions in the output, including those of earlier runs of a resumed job.
    pub completed: u64,
    /// Failed for good (the prompt's own fault), in `failed.jsonl`.
    pub failed: u64,
    /// Failed by the fleet this run (retries exhausted), in `retry.jsonl`: `--resume` sends
    /// them again.
    #[serde(default)]
    pub waiting_retry: u64,
    /// Completions per second over the recent window (not the lifetime average).
    pub rate_per_sec: f64,
    /// Remaining work ÷ live output tok/s (`crate::eta`); `null` until both are known.
    pub eta_hours: Option<f64>,
    /// The ETA's 90% interval: wide while the long requests' tail is unseen.
    #[serde(default)]
    pub eta_low_hours: Option<f64>,
    #[serde(default)]
    pub eta_high_hours: Option<f64>,
    /// Expected output tokens of a prompt (capped by `max_tokens`), counting the requests
    /// still streaming as at least what they have streamed.
    #[serde(default)]
    pub expected_output_tokens: Option<f64>,
    /// Where that expectation comes from and how sure it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub length_estimate: Option<LengthEstimate>,
    /// Output tokens per second of the whole fleet as they stream, over the recent window.
    #[serde(default)]
    pub output_tok_s: f64,
    pub total_input_tokens: u64,
    pub total_output_tokens: u64,
    /// Prompt tokens this run's answers say the radix cache served: the prefill saved.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cached_tokens: u64,
    pub avg_output_tokens: u64,
    /// Wall time of this run.
    pub elapsed_hours: f64,
    pub s3_uploaded: u64,
    pub s3_bytes: u64,
    pub status: Status,
    pub instances: Vec<InstanceProgress>,
    /// What the watchdog said, so that `fleet jobs` and `fleet progress` show it too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// What the expected output length rests on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LengthEstimate {
    /// `sweep` (the profile's measured distribution), `job`, `sweep+job` or `given`.
    pub source: crate::eta::Source,
    /// The 90% interval of the expected output tokens.
    pub low: f64,
    pub high: f64,
    /// Requests that ended this run, and those streaming (counted as at least what they have).
    pub finished: u64,
    pub running: u64,
    /// The unseen tail still widens the interval.
    pub tail_unseen: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceProgress {
    pub name: ServerId,
    pub url: String,
    pub healthy: bool,
    pub in_flight: u32,
    /// The in-flight limit fleet currently allows this instance.
    pub concurrency: u32,
    /// The server's own cap (effective max running requests), when it reports one.
    pub server_cap: Option<u64>,
    pub completed: u64,
    pub rate_per_sec: f64,
    /// Output tokens per second as they stream, over the recent window.
    pub output_tok_s: f64,
    /// Output tokens streamed from it this run, so far: what a report takes differences of
    /// for its rate over any window.
    #[serde(default)]
    pub output_tokens: u64,
    /// The server's own `sglang:gen_throughput` of the last reading, to hold the streamed
    /// count against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_tok_s: Option<f64>,
    /// The share of its answers' prompt tokens the radix cache served (`meta_info.cached_tokens`);
    /// `null` until an answer says.
    #[serde(default)]
    pub cached_fraction: Option<f64>,
    /// Last `/metrics` reading.
    pub running: Option<f64>,
    pub queued: Option<f64>,
    /// `sglang:token_usage` of the last reading: the share of the KV pool (or of the mamba
    /// state pool, when it is the fuller) in use, 0 to 1.
    #[serde(default)]
    pub token_usage: Option<f64>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Progress {
    /// What an output directory shows before any request of this run went out.
    pub fn before_start(b: &Baseline, status: Status) -> Self {
        Progress {
            total: b.total,
            completed: b.completed,
            failed: b.failed,
            waiting_retry: 0,
            rate_per_sec: 0.0,
            eta_hours: None,
            eta_low_hours: None,
            eta_high_hours: None,
            expected_output_tokens: None,
            length_estimate: None,
            output_tok_s: 0.0,
            total_input_tokens: b.input_tokens,
            total_output_tokens: b.output_tokens,
            cached_tokens: 0,
            avg_output_tokens: b.output_tokens.checked_div(b.completed).unwrap_or(0),
            elapsed_hours: 0.0,
            s3_uploaded: 0,
            s3_bytes: 0,
            status,
            instances: vec![],
            warnings: vec![],
        }
    }
}

impl Progress {
    /// The ETA as a person reads it, with its interval: `5.2 h (4.9–6.0)`, or in minutes
    /// under an hour; `None` while unknown.
    pub fn eta_text(&self) -> Option<String> {
        let h = self.eta_hours?;
        let (k, unit) = if h < 1.0 { (60.0, "min") } else { (1.0, "h") };
        let v = |x: f64| {
            let x = x * k;
            if x < 10.0 {
                format!("{x:.1}")
            } else {
                format!("{x:.0}")
            }
        };
        Some(match (self.eta_low_hours, self.eta_high_hours) {
            (Some(lo), Some(hi)) if hi > lo => {
                format!("{} {unit} ({}–{})", v(h), v(lo), v(hi))
            }
            _ => format!("{} {unit}", v(h)),
        })
    }
}

/// Rounds for display in JSON without pretending to precision the window does not have.
pub fn round(x: f64, decimals: i32) -> f64 {
    let f = 10f64.powi(decimals);
    (x * f).round() / f
}

/// Counts of completions and output tokens sampled over time (measured from any fixed start);
/// rates come from the oldest and newest samples inside the window.
#[derive(Debug, Clone)]
pub struct RateWindow {
    window: Duration,
    samples: VecDeque<(Duration, u64, u64)>,
}

impl RateWindow {
    pub fn new(window: Duration) -> Self {
        RateWindow {
            window,
            samples: VecDeque::new(),
        }
    }

    /// Records the running totals at `now`.
    pub fn record(&mut self, now: Duration, completed: u64, tokens: u64) {
        self.samples.push_back((now, completed, tokens));
        // Keep one sample older than the window so the rate spans the whole window.
        while self.samples.len() > 2 && now.saturating_sub(self.samples[1].0) >= self.window {
            self.samples.pop_front();
        }
    }

    /// (completions/s, output tokens/s) over the window; zero until two samples exist. While
    /// the run is younger than twice the window, the window is its recent half, so the start
    /// (servers filling their batches) weighs on the rate for no longer than it lasted.
    pub fn rates(&self) -> (f64, f64) {
        let Some(last) = self.samples.back() else {
            return (0.0, 0.0);
        };
        let span = self.window.min(last.0 / 2);
        self.between(last.0.saturating_sub(span), last.0)
    }

    /// Output tokens/s over each half of the span [`Self::rates`] uses: how steady it is.
    pub fn token_halves(&self) -> (f64, f64) {
        let Some(last) = self.samples.back() else {
            return (0.0, 0.0);
        };
        let span = self.window.min(last.0 / 2);
        let mid = last.0.saturating_sub(span / 2);
        (
            self.between(last.0.saturating_sub(span), mid).1,
            self.between(mid, last.0).1,
        )
    }

    /// Rates from the last sample at or before `from` to the last at or before `to`.
    fn between(&self, from: Duration, to: Duration) -> (f64, f64) {
        let at = |t: Duration| {
            let i = self.samples.partition_point(|s| s.0 <= t);
            self.samples.get(i.saturating_sub(1))
        };
        let (Some(a), Some(b)) = (at(from), at(to)) else {
            return (0.0, 0.0);
        };
        let dt = b.0.saturating_sub(a.0).as_secs_f64();
        if dt <= 0.0 {
            return (0.0, 0.0);
        }
        (
            b.1.saturating_sub(a.1) as f64 / dt,
            b.2.saturating_sub(a.2) as f64 / dt,
        )
    }

    /// Whether two samples at different times exist, so [`Self::rates`] means something.
    pub fn is_measured(&self) -> bool {
        match (self.samples.front(), self.samples.back()) {
            (Some(a), Some(b)) => b.0 > a.0,
            _ => false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProgressError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not a fleet progress file: {source}", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// Writes `dir/progress.json` via a temp file and rename, so readers never see half a file;
/// blocking, as it may wait for a descriptor (`files`).
pub fn write_atomic(dir: &Path, p: &Progress) -> Result<(), ProgressError> {
    let path = dir.join(PROGRESS_FILE);
    let tmp = dir.join(".progress.json.tmp");
    let err = |source| ProgressError::Io {
        path: path.clone(),
        source,
    };
    let body = serde_json::to_vec_pretty(p).expect("progress always serializes");
    super::files::when_a_descriptor_frees(|| std::fs::write(&tmp, &body)).map_err(err)?;
    std::fs::rename(&tmp, &path).map_err(err)
}

/// Reads a progress file (a directory means its `progress.json`).
pub fn read(path: &Path) -> Result<Progress, ProgressError> {
    let path = if path.is_dir() {
        path.join(PROGRESS_FILE)
    } else {
        path.to_path_buf()
    };
    let text = std::fs::read_to_string(&path).map_err(|source| ProgressError::Io {
        path: path.clone(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| ProgressError::Parse { path, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_rate_forgets_the_slow_start() {
        let mut w = RateWindow::new(Duration::from_secs(10));
        let t0 = Duration::from_secs(7);
        // 1/s for 30 s, then 10/s for 20 s: the window sees only the recent 10/s.
        let mut done = 0;
        for s in 0..=50u64 {
            if s > 0 {
                done += if s <= 30 { 1 } else { 10 };
            }
            w.record(t0 + Duration::from_secs(s), done, done * 100);
        }
        let (rate, tok) = w.rates();
        assert!((rate - 10.0).abs() < 1e-9, "{rate}");
        assert!((tok - 1000.0).abs() < 1e-9);
    }

    #[test]
    fn the_eta_reads_with_its_interval() {
        let mut p = Progress::before_start(&Baseline::default(), Status::Running);
        assert_eq!(p.eta_text(), None);
        p.eta_hours = Some(5.2);
        p.eta_low_hours = Some(4.9);
        p.eta_high_hours = Some(6.0);
        assert_eq!(p.eta_text().unwrap(), "5.2 h (4.9–6.0)");
        p.eta_hours = Some(0.12);
        p.eta_low_hours = Some(0.1);
        p.eta_high_hours = Some(0.15);
        assert_eq!(p.eta_text().unwrap(), "7.2 min (6.0–9.0)");
        p.eta_low_hours = None;
        assert_eq!(p.eta_text().unwrap(), "7.2 min");
    }

    #[test]
    fn a_young_run_s_rate_is_its_recent_half() {
        let mut w = RateWindow::new(Duration::from_secs(60));
        // Two seconds of filling batches, then 1,000 tok/s.
        let mut tok = 0;
        for s in 0..=12u64 {
            if s > 2 {
                tok += 1000;
            }
            w.record(Duration::from_secs(s), 0, tok);
        }
        assert!((w.rates().1 - 1000.0).abs() < 1e-9, "{:?}", w.rates());
        assert_eq!(w.token_halves(), (1000.0, 1000.0));
    }

    #[test]
    fn has_the_seed_fields_plus_instances_waiting_retry_and_the_eta_s_interval() {
        let p = Progress {
            waiting_retry: 0,
            total: 654_676,
            completed: 73,
            failed: 0,
            rate_per_sec: 0.87,
            eta_hours: Some(208.61),
            eta_low_hours: None,
            eta_high_hours: None,
            expected_output_tokens: None,
            length_estimate: None,
            output_tok_s: 0.0,
            total_input_tokens: 7033,
            total_output_tokens: 72126,
            cached_tokens: 0,
            avg_output_tokens: 988,
            elapsed_hours: 0.02,
            s3_uploaded: 0,
            s3_bytes: 0,
            status: Status::Running,
            instances: vec![],
            warnings: vec![],
        };
        let v = serde_json::to_value(&p).unwrap();
        let mut keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "avg_output_tokens",
                "completed",
                "elapsed_hours",
                "eta_high_hours",
                "eta_hours",
                "eta_low_hours",
                "expected_output_tokens",
                "failed",
                "instances",
                "output_tok_s",
                "rate_per_sec",
                "s3_bytes",
                "s3_uploaded",
                "status",
                "total",
                "total_input_tokens",
                "total_output_tokens",
                "waiting_retry"
            ]
        );
        assert_eq!(v["status"], "running");
        let dir = tempfile::tempdir().unwrap();
        write_atomic(dir.path(), &p).unwrap();
        assert_eq!(read(dir.path()).unwrap(), p);
    }
}
