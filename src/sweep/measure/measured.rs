//! What one trial measured on one candidate: throughput, latency percentiles and the limits the
//! servers resolved. The ranking and the SLO both read it.

use serde::{Deserialize, Serialize};

use crate::eta::Lengths;
use crate::sweep::stats::Estimate;

/// Latency percentiles in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p99: f64,
}

/// What one trial measured on one candidate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    pub gpus: usize,
    /// GPUs per server (its layout's group): how many servers of it a fleet's GPUs hold.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub server_gpus: u32,
    /// Output tokens per second over the measured window, from the client's own counts.
    pub output_tok_s: f64,
    pub output_tok_s_per_gpu: f64,
    pub req_s: f64,
    pub completed: u64,
    pub errors: u64,
    pub mean_output_tokens: f64,
    /// `None` when no request's first token (no chunk, for ITL) arrived in the window.
    pub ttft_s: Option<Percentiles>,
    pub itl_s: Option<Percentiles>,
    /// Effective max running requests per server (`internal_states`), lowest over replicas.
    pub cap: u32,
    /// In-flight requests the load kept on each server (about 1.25x the cap).
    pub in_flight: u32,
    pub kv_tokens: u64,
    /// The mamba strategy the servers resolved (what `auto` became); `None` when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<String>,
    /// Seconds from start to ready, slowest replica; `None` when the server was already up.
    pub startup_s: Option<f64>,
    /// Output tokens of the requests that finished in the window, per second: what
    /// `sglang:generation_tokens_total` counts (SGLang adds a request's tokens when it finishes).
    pub completed_output_tok_s: f64,
    /// Output tok/s from the servers' `sglang:generation_tokens_total` over the same window.
    pub metrics_output_tok_s: Option<f64>,
    /// Output tok/s per GPU with its 95% interval, from the window's bins; `None` when the
    /// window is too short or empty to tell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate: Option<Estimate>,
    /// The output lengths of the trial's requests, warm-up included: ended ones, and those
    /// still streaming (or stopped by `max_tokens`) as at least what they had.
    #[serde(default, skip_serializing_if = "Lengths::is_empty")]
    pub lengths: Lengths,
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

impl Measured {
    /// One config's windows as one measurement: the mean of each rate and latency percentile
    /// (percentiles of equal windows, averaged), the counts summed, the lowest cap and KV pool,
    /// and the interval of the mean of the windows' means. `None` for no window.
    pub fn pool(windows: &[&Measured]) -> Option<Measured> {
        let (first, n) = (*windows.first()?, windows.len() as f64);
        let mean = |f: &dyn Fn(&Measured) -> f64| windows.iter().map(|m| f(m)).sum::<f64>() / n;
        let percentiles = |f: &dyn Fn(&Measured) -> Option<Percentiles>| {
            let all: Option<Vec<Percentiles>> = windows.iter().map(|m| f(m)).collect();
            all.map(|p| Percentiles {
                p50: p.iter().map(|x| x.p50).sum::<f64>() / n,
                p99: p.iter().map(|x| x.p99).sum::<f64>() / n,
            })
        };
        let completed: u64 = windows.iter().map(|m| m.completed).sum();
        let estimates: Option<Vec<Estimate>> = windows.iter().map(|m| m.estimate).collect();
        Some(Measured {
            gpus: first.gpus,
            server_gpus: first.server_gpus,
            output_tok_s: mean(&|m| m.output_tok_s),
            output_tok_s_per_gpu: mean(&|m| m.output_tok_s_per_gpu),
            req_s: mean(&|m| m.req_s),
            completed,
            errors: windows.iter().map(|m| m.errors).sum(),
            mean_output_tokens: if completed == 0 {
                mean(&|m| m.mean_output_tokens)
            } else {
                windows
                    .iter()
                    .map(|m| m.mean_output_tokens * m.completed as f64)
                    .sum::<f64>()
                    / completed as f64
            },
            ttft_s: percentiles(&|m| m.ttft_s),
            itl_s: percentiles(&|m| m.itl_s),
            cap: windows.iter().map(|m| m.cap).min().unwrap_or(first.cap),
            in_flight: first.in_flight,
            kv_tokens: windows.iter().map(|m| m.kv_tokens).min().unwrap_or(0),
            strategy: first.strategy.clone(),
            startup_s: first.startup_s,
            completed_output_tok_s: mean(&|m| m.completed_output_tok_s),
            metrics_output_tok_s: windows
                .iter()
                .map(|m| m.metrics_output_tok_s)
                .sum::<Option<f64>>()
                .map(|s| s / n),
            estimate: estimates.and_then(|e| Estimate::of_mean(&e)),
            lengths: {
                let mut l = Lengths::default();
                for m in windows {
                    l.merge(&m.lengths);
                }
                l
            },
        })
    }

    /// The servers' own count disagrees with the client's by more than 5%.
    pub fn metrics_disagree(&self) -> bool {
        match self.metrics_output_tok_s {
            Some(m) if self.completed_output_tok_s > 0.0 => {
                ((m - self.completed_output_tok_s) / self.completed_output_tok_s).abs() > 0.05
            }
            Some(m) => m > 0.0,
            None => false,
        }
    }
}
