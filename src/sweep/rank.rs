//! Trial results, the ranking by output tok/s per GPU, ETA projection and the deciding factor.
//! Pure: the sweep's report and `sweep.json` are rendered from these values.

use serde::{Deserialize, Serialize};

use super::assign::Slot;
use super::space::Candidate;

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
}

impl Measured {
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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Outcome {
    Ok(Measured),
    Failed {
        reason: String,
        log_tail: Vec<String>,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trial {
    pub candidate: Candidate,
    pub gpus: Vec<Slot>,
    pub outcome: Outcome,
}

/// A ranked row of the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Ranked {
    pub rank: usize,
    pub label: String,
    pub winner: bool,
    /// Throughput per GPU relative to the winner (1.0 for the winner).
    pub ratio: Option<f64>,
    /// Projected hours for the whole dataset on all the sweep's GPUs running this candidate.
    pub eta_hours: Option<f64>,
    pub trial: Trial,
}

/// The dataset a projection is for.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Dataset {
    pub prompts: u64,
    pub output_tokens_per_prompt: f64,
    /// GPUs the real job will use.
    pub gpus: usize,
}

/// Ranks finished trials by output tok/s per GPU (failed ones last, in input order).
pub fn rank(trials: &[Trial], dataset: Option<Dataset>) -> Vec<Ranked> {
    let mut ok: Vec<(&Trial, &Measured)> = trials
        .iter()
        .filter_map(|t| match &t.outcome {
            Outcome::Ok(m) => Some((t, m)),
            Outcome::Failed { .. } => None,
        })
        .collect();
    ok.sort_by(|a, b| {
        b.1.output_tok_s_per_gpu
            .total_cmp(&a.1.output_tok_s_per_gpu)
    });
    let best = ok
        .first()
        .map(|(_, m)| m.output_tok_s_per_gpu)
        .filter(|b| *b > 0.0);
    let mut rows: Vec<Ranked> = ok
        .iter()
        .enumerate()
        .map(|(i, (t, m))| Ranked {
            rank: i + 1,
            label: t.candidate.label(),
            winner: i == 0 && best.is_some(),
            ratio: best.map(|b| m.output_tok_s_per_gpu / b),
            eta_hours: dataset.and_then(|d| eta_hours(d, m.output_tok_s_per_gpu)),
            trial: (*t).clone(),
        })
        .collect();
    let failed = trials
        .iter()
        .filter(|t| matches!(t.outcome, Outcome::Failed { .. }));
    for t in failed {
        rows.push(Ranked {
            rank: rows.len() + 1,
            label: t.candidate.label(),
            winner: false,
            ratio: None,
            eta_hours: None,
            trial: t.clone(),
        });
    }
    rows
}

pub fn eta_hours(d: Dataset, tok_s_per_gpu: f64) -> Option<f64> {
    let fleet_tok_s = tok_s_per_gpu * d.gpus as f64;
    (fleet_tok_s > 0.0)
        .then(|| d.prompts as f64 * d.output_tokens_per_prompt / fleet_tok_s / 3600.0)
}

/// Why the winner won, when the numbers show it: a higher server cap, or faster steps.
pub fn deciding_factor(rows: &[Ranked]) -> Option<String> {
    let measured = |r: &Ranked| match &r.trial.outcome {
        Outcome::Ok(m) => Some(m.clone()),
        Outcome::Failed { .. } => None,
    };
    let (w, r) = (rows.first()?, rows.get(1)?);
    let (wm, rm) = (measured(w)?, measured(r)?);
    if wm.cap as f64 >= rm.cap as f64 * 1.15 {
        return Some(format!(
            "{}: cap {} vs {} running requests per server ({})",
            w.label, wm.cap, rm.cap, r.label
        ));
    }
    if let (Some(wi), Some(ri)) = (wm.itl_s, rm.itl_s)
        && ri.p50 > 0.0
        && wi.p50 > 0.0
        && ri.p50 >= wi.p50 * 1.15
    {
        return Some(format!(
            "{}: inter-token latency p50 {:.0} ms vs {:.0} ms ({}) at similar caps",
            w.label,
            wi.p50 * 1000.0,
            ri.p50 * 1000.0,
            r.label
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trial(strategy: &str, tok_s_per_gpu: f64, cap: u32, itl: f64) -> Trial {
        Trial {
            candidate: Candidate {
                id: format!("server.mamba_strategy={strategy}"),
                settings: vec![("server.mamba_strategy".into(), strategy.into())],
            },
            gpus: vec![],
            outcome: Outcome::Ok(Measured {
                gpus: 4,
                output_tok_s: tok_s_per_gpu * 4.0,
                output_tok_s_per_gpu: tok_s_per_gpu,
                req_s: 1.0,
                completed: 10,
                errors: 0,
                mean_output_tokens: 988.0,
                ttft_s: None,
                itl_s: Some(Percentiles {
                    p50: itl,
                    p99: itl * 2.0,
                }),
                cap,
                in_flight: cap * 5 / 4,
                kv_tokens: 100_000,
                strategy: None,
                startup_s: Some(5.0),
                completed_output_tok_s: tok_s_per_gpu * 4.0,
                metrics_output_tok_s: Some(tok_s_per_gpu * 4.0 * 1.01),
            }),
        }
    }

    fn failed(strategy: &str) -> Trial {
        let mut t = trial(strategy, 0.0, 0, 0.0);
        t.outcome = Outcome::Failed {
            reason: "CUDA out of memory".into(),
            log_tail: vec![],
        };
        t
    }

    #[test]
    fn the_seed_scenario_ranks_no_buffer_first_with_etas() {
        let d = Dataset {
            prompts: 654_676,
            output_tokens_per_prompt: 988.0,
            gpus: 8,
        };
        let rows = rank(
            &[
                trial("extra_buffer", 107.0, 37, 0.34),
                failed("extra_buffer_lazy"),
                trial("no_buffer", 1180.0, 72, 0.061),
            ],
            Some(d),
        );
        assert_eq!(rows[0].label, "no_buffer");
        assert!(rows[0].winner && !rows[1].winner);
        assert!((rows[1].ratio.unwrap() - 107.0 / 1180.0).abs() < 1e-9);
        let eta_nb = rows[0].eta_hours.unwrap();
        let eta_eb = rows[1].eta_hours.unwrap();
        assert!((eta_nb - 19.0).abs() < 0.5, "{eta_nb}");
        assert!((eta_eb - 209.0).abs() < 2.0, "{eta_eb}");
        assert_eq!(rows[2].label, "extra_buffer_lazy");
        assert_eq!(rows[2].ratio, None);
        assert_eq!(
            deciding_factor(&rows).unwrap(),
            "no_buffer: cap 72 vs 37 running requests per server (extra_buffer)"
        );
    }

    #[test]
    fn equal_caps_are_decided_by_step_speed() {
        let rows = rank(
            &[
                trial("no_buffer", 900.0, 48, 0.053),
                trial("extra_buffer", 1000.0, 48, 0.048),
            ],
            None,
        );
        assert_eq!(rows[0].label, "extra_buffer");
        assert!(
            deciding_factor(&rows).is_none(),
            "a 10% ITL gap is not decisive"
        );
        let rows = rank(
            &[
                trial("no_buffer", 700.0, 48, 0.070),
                trial("extra_buffer", 1000.0, 48, 0.048),
            ],
            None,
        );
        assert!(
            deciding_factor(&rows)
                .unwrap()
                .contains("inter-token latency p50 48 ms vs 70 ms")
        );
    }

    #[test]
    fn metrics_disagreement_over_five_percent_is_flagged() {
        let Outcome::Ok(mut m) = trial("no_buffer", 1000.0, 72, 0.06).outcome else {
            unreachable!()
        };
        assert!(!m.metrics_disagree());
        m.metrics_output_tok_s = Some(m.completed_output_tok_s * 0.9);
        assert!(m.metrics_disagree());
        m.metrics_output_tok_s = None;
        assert!(!m.metrics_disagree(), "no /metrics: nothing to compare");
    }

    #[test]
    fn all_failed_has_no_winner() {
        let rows = rank(&[failed("a"), failed("b")], None);
        assert!(rows.iter().all(|r| !r.winner));
    }
}
