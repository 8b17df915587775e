//! Trial results, the ranking by output tok/s per GPU, ETA projection and the deciding factor.
//! Pure: the sweep's report and `sweep.json` are rendered from these values.

pub mod crown;
pub mod slo;

use serde::{Deserialize, Serialize};

use crate::eta::{Expectation, Interval, LengthModel, LengthPrior, Lengths, Rate, Source};

use super::assign::Slot;
pub use super::measured::{Measured, Percentiles};
use super::slo::{Breach, Slo};
use super::space::Candidate;
use super::stats::Estimate;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Outcome {
    /// Measured over the full window.
    Ok(Measured),
    /// Stopped after its first window, clearly behind a leader.
    Pruned(Pruned),
    Failed {
        /// What kind of failure, read from the server's log where it tells (files before
        /// this field read as [`Failure::Other`]).
        #[serde(default)]
        kind: Failure,
        reason: String,
        log_tail: Vec<String>,
    },
}

/// Why a candidate failed, as the search learns from it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Failure {
    /// CUDA ran out of memory (graph capture, activations): more memory on any axis fails too.
    OutOfMemory,
    /// The static pool cannot hold the weights and a cache (SGLang's "Not enough memory"):
    /// a smaller static fraction fails too.
    NotEnoughMemory,
    /// Refused before it started (the plan or preflight).
    Refused,
    /// Skipped before it started: predicted not to fit (`sweep::predict`). Where the weights
    /// outgrow the static pool, a smaller static fraction fails too, as with NotEnoughMemory.
    Predicted,
    /// Anything else: a server that did not come up or died, a load that broke off.
    #[default]
    Other,
}

impl Failure {
    /// `default`, unless the reason or the server's log says it ran out of memory: the
    /// messages of `torch.OutOfMemoryError` ("CUDA out of memory"), of a failed graph capture,
    /// and of `model_runner.py`'s `init_memory_pool` ("Not enough memory").
    pub fn read(default: Failure, reason: &str, log: &[String]) -> Failure {
        let says = |needle: &str| {
            std::iter::once(reason)
                .chain(log.iter().map(String::as_str))
                .any(|l| l.to_ascii_lowercase().contains(needle))
        };
        if says("not enough memory") {
            Failure::NotEnoughMemory
        } else if says("out of memory") || says("outofmemoryerror") {
            Failure::OutOfMemory
        } else {
            default
        }
    }
}

impl Outcome {
    /// What was measured, over the full window or (pruned) the first one.
    pub fn measured(&self) -> Option<&Measured> {
        match self {
            Outcome::Ok(m) => Some(m),
            Outcome::Pruned(p) => Some(&p.measured),
            Outcome::Failed { .. } => None,
        }
    }
}

/// A candidate stopped after its first window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pruned {
    /// Its figures over the first window.
    #[serde(flatten)]
    pub measured: Measured,
    /// The candidate whose interval lay wholly above its own, and that interval.
    pub leader: String,
    pub leader_label: String,
    pub leader_estimate: Estimate,
}

/// A candidate's figure after its first window: what pruning decided on.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FirstWindow {
    /// Seconds into the measured window.
    pub after_s: f64,
    pub estimate: Estimate,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trial {
    pub candidate: Candidate,
    pub gpus: Vec<Slot>,
    pub outcome: Outcome,
    /// With successive halving: the first window's estimate, pruned or not (a resumed sweep
    /// judges its remaining candidates against these).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_window: Option<FirstWindow>,
    /// What SGLang's radix cache served over the trial (warm-up included); `None` when the
    /// servers' `/metrics` could not tell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheUse>,
    /// What the memory prediction said of the candidate before it started (`sweep::predict`),
    /// to hold against what its servers report; `None` where nothing was predicted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prediction: Option<crate::layout::predict::Prediction>,
}

/// Prompt tokens the servers counted over a trial, and how many of them the radix cache
/// served (`sglang:cached_tokens_total`, `sglang:prompt_tokens_total`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CacheUse {
    pub cached_tokens: u64,
    pub prompt_tokens: u64,
}

impl CacheUse {
    /// The cached share of the prompt tokens, 0 to 1.
    pub fn share(&self) -> Option<f64> {
        (self.prompt_tokens > 0).then(|| self.cached_tokens as f64 / self.prompt_tokens as f64)
    }
}

/// A ranked row of the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Ranked {
    pub rank: usize,
    pub label: String,
    pub winner: bool,
    /// Tied with the winner within their windows' noise: the winner was crowned for asking
    /// less memory (or, if it is the fastest, the tie is the margin it won by).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub tied: bool,
    /// Throughput per GPU relative to the winner (1.0 for the winner).
    pub ratio: Option<f64>,
    /// Projected hours for the whole dataset on all the sweep's GPUs running this candidate.
    pub eta_hours: Option<f64>,
    /// Its 90% interval, from the expected output length's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eta_low_hours: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eta_high_hours: Option<f64>,
    /// Its figures: with several windows (a search's confirmation), the first trial with
    /// their pooled measurement.
    pub trial: Trial,
    /// The full windows the figures pool; shown when more than one.
    #[serde(skip_serializing_if = "is_one")]
    pub windows: usize,
    /// The `--slo` limits it broke: shown, never crowned.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub breaches: Vec<Breach>,
}

fn is_one(n: &usize) -> bool {
    *n == 1
}

/// The dataset a projection is for.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Dataset {
    pub prompts: u64,
    pub output_tokens_per_prompt: f64,
    /// The 90% interval of the expected output tokens per prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens_interval: Option<(f64, f64)>,
    /// Where the expected output length comes from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens_source: Option<crate::eta::Source>,
    /// The length the longest request may reach (expected, at most), for the job's drain at
    /// its end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub longest_output_tokens: Option<(f64, f64)>,
    /// GPUs the real job will use.
    pub gpus: usize,
}

/// Ranks finished trials without an SLO (see [`rank_within`]).
pub fn rank(trials: &[Trial], dataset: Option<Dataset>) -> Vec<Ranked> {
    rank_within(trials, dataset, &Slo::default())
}

/// Ranks finished trials: those measured over the full window that keep `slo` by output tok/s
/// per GPU, then those that break it, then pruned ones by their first window's figure, then
/// failed ones in input order. Only a fully measured candidate that keeps the SLO can win, and
/// where a search confirmed its leaders (a second window, measured together), only a confirmed
/// one: the others were never measured beside them. The fastest wins unless another ties with
/// it within their windows' noise ([`crown`]); then the one farther from the out-of-memory edge
/// is crowned and ranked first, and the others tied are marked. Ratios (to the winner, or
/// without one to the fastest) and ETAs are given for every figure.
pub fn rank_within(trials: &[Trial], dataset: Option<Dataset>, slo: &Slo) -> Vec<Ranked> {
    let pooled = pooled(trials);
    let windows = |t: &Trial| {
        pooled
            .iter()
            .find(|(p, _)| p.candidate.id == t.candidate.id)
            .map_or(1, |(_, n)| *n)
    };
    let confirmed = pooled.iter().any(|(_, n)| *n > 1);
    // Each config's full windows' rates, in the order they ran: what a tie is judged on.
    let rates: Vec<Vec<f64>> = pooled
        .iter()
        .map(|(p, _)| {
            trials
                .iter()
                .filter(|t| t.candidate.settings == p.candidate.settings)
                .filter_map(|t| match &t.outcome {
                    Outcome::Ok(m) => Some(m.output_tok_s_per_gpu),
                    _ => None,
                })
                .collect()
        })
        .collect();
    let rates_of = |t: &Trial| {
        pooled
            .iter()
            .position(|(p, _)| p.candidate.id == t.candidate.id)
            .map_or(&[][..], |i| &rates[i][..])
    };
    let trials: Vec<Trial> = pooled.iter().map(|(t, _)| t.clone()).collect();
    let by_figure = |pruned: bool, keeps: bool| {
        let mut v: Vec<(&Trial, &Measured)> = trials
            .iter()
            .filter(|t| matches!(t.outcome, Outcome::Pruned(_)) == pruned)
            .filter_map(|t| Some((t, t.outcome.measured()?)))
            .filter(|(_, m)| pruned || slo.keeps(m) == keeps)
            .collect();
        v.sort_by(|a, b| {
            b.1.output_tok_s_per_gpu
                .total_cmp(&a.1.output_tok_s_per_gpu)
        });
        v
    };
    let (mut kept, broke, pruned) = (
        by_figure(false, true),
        by_figure(false, false),
        by_figure(true, true),
    );
    // The contenders, fastest first; the crowned one moves to the top, the rest keep order.
    let contenders: Vec<usize> = (0..kept.len())
        .filter(|&i| !confirmed || windows(kept[i].0) > 1)
        .collect();
    let race: Vec<crown::Entry> = contenders
        .iter()
        .map(|&i| crown::Entry {
            candidate: &kept[i].0.candidate,
            windows: rates_of(kept[i].0),
        })
        .collect();
    let (crowned, tied): (bool, Vec<String>) = match crown::crown(&race) {
        Some((pick, tied)) => {
            let ids = tied
                .iter()
                .chain(std::iter::once(&0))
                .filter(|&&i| i != pick)
                .map(|&i| race[i].candidate.id.clone())
                .collect();
            let first = kept.remove(contenders[pick]);
            kept.insert(0, first);
            (true, ids)
        }
        None => (false, Vec::new()),
    };
    let best = kept
        .first()
        .or(broke.first())
        .map(|(_, m)| m.output_tok_s_per_gpu)
        .filter(|b| *b > 0.0);
    let projection = |m: &Measured| dataset.and_then(|d| d.hours(m));
    let interval = dataset.is_some_and(|d| d.output_tokens_interval.is_some());
    let mut rows: Vec<Ranked> = kept
        .iter()
        .chain(&broke)
        .chain(&pruned)
        .enumerate()
        .map(|(i, (t, m))| Ranked {
            rank: i + 1,
            label: t.candidate.label(),
            winner: i == 0 && crowned && best.is_some(),
            tied: crowned && best.is_some() && tied.contains(&t.candidate.id),
            ratio: best.map(|b| m.output_tok_s_per_gpu / b),
            eta_hours: projection(m).map(|h| h.point),
            eta_low_hours: projection(m).map(|h| h.low).filter(|_| interval),
            eta_high_hours: projection(m).map(|h| h.high).filter(|_| interval),
            trial: (*t).clone(),
            windows: windows(t),
            breaches: slo.breaches(m),
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
            tied: false,
            ratio: None,
            eta_hours: None,
            eta_low_hours: None,
            eta_high_hours: None,
            trial: t.clone(),
            windows: 1,
            breaches: Vec::new(),
        });
    }
    rows
}

/// The trials with each config's full windows pooled into its first trial (a search runs a
/// close leader again to confirm it), in order, with how many windows each stands for.
fn pooled(trials: &[Trial]) -> Vec<(Trial, usize)> {
    fn full(t: &Trial) -> Option<&Measured> {
        match &t.outcome {
            Outcome::Ok(m) => Some(m),
            _ => None,
        }
    }
    let mut out = Vec::new();
    for (i, t) in trials.iter().enumerate() {
        let same = |o: &&Trial| o.candidate.settings == t.candidate.settings;
        if full(t).is_none() {
            out.push((t.clone(), 1));
            continue;
        }
        if trials[..i].iter().filter(same).any(|o| full(o).is_some()) {
            continue;
        }
        let windows: Vec<&Measured> = trials[i..].iter().filter(same).filter_map(full).collect();
        let mut first = t.clone();
        if let Some(m) = Measured::pool(&windows) {
            first.outcome = Outcome::Ok(m);
        }
        out.push((first, windows.len()));
    }
    out
}

impl Dataset {
    /// The projection for `prompts` prompts of the expected length on `gpus` GPUs.
    pub fn new(prompts: u64, length: Expectation, gpus: usize) -> Dataset {
        Dataset {
            prompts,
            output_tokens_per_prompt: length.tokens.point,
            output_tokens_interval: Some((length.tokens.low, length.tokens.high))
                .filter(|(lo, hi)| hi > lo),
            output_tokens_source: Some(length.source),
            longest_output_tokens: Some((length.longest.point, length.longest.high)),
            gpus,
        }
    }

    /// Hours for the whole dataset on all the GPUs running a candidate measured at `m` (as many
    /// of its servers as the GPUs hold): the job's own estimator (`crate::eta::duration`), every
    /// server full at its cap.
    pub fn hours(&self, m: &Measured) -> Option<Interval> {
        let point = self.output_tokens_per_prompt;
        let (low, high) = self.output_tokens_interval.unwrap_or((point, point));
        let length = Expectation {
            tokens: Interval { point, low, high },
            source: self.output_tokens_source.unwrap_or(Source::Sweep),
            tail_unseen: false,
            longest: self
                .longest_output_tokens
                .map_or(Interval::exact(point), |(p, high)| Interval {
                    point: p,
                    low: p,
                    high,
                }),
        };
        // A fleet of this layout runs as many whole servers as the GPUs hold.
        let servers = (self.gpus / m.server_gpus.max(1) as usize) as f64;
        let tok_s = m.output_tok_s_per_gpu * servers * f64::from(m.server_gpus.max(1));
        let rate = Rate {
            tok_s,
            low: tok_s,
            high: tok_s,
            running: f64::from(m.cap) * servers,
        };
        crate::eta::duration(length.tokens.scale(self.prompts as f64), &length, rate)
            .filter(|_| tok_s > 0.0)
            .map(|s| s.scale(1.0 / 3600.0))
    }
}

/// Why the winner won, when the numbers show it: a higher server cap, or faster steps.
pub fn deciding_factor(rows: &[Ranked]) -> Option<String> {
    let (w, r) = (rows.first()?, rows.get(1)?);
    let (wm, rm) = (w.trial.outcome.measured()?, r.trial.outcome.measured()?);
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

/// Every trial's output lengths pooled, each trial weighing 1/T: the trials draw the same
/// prompts in the same order, so their requests are one sample seen T times (with other
/// cut-offs), not T samples.
pub fn pooled_lengths(trials: &[Trial]) -> Lengths {
    let seen: Vec<&Lengths> = trials
        .iter()
        .filter_map(|t| t.outcome.measured())
        .map(|m| &m.lengths)
        .filter(|l| !l.is_empty())
        .collect();
    let mut all = Lengths::default();
    for l in &seen {
        all.merge_weighted(l, 1.0 / seen.len() as f64);
    }
    all
}

/// The expected output tokens per prompt (capped at `cap`) of `prompts` to project with:
/// `--expected-output-tokens`, else the pooled lengths of every trial, requests cut off
/// counted as at least what they had streamed (a product-limit estimate: `crate::eta`); a
/// sweep.json without lengths falls back to the mean of the finished requests.
pub fn output_tokens(
    trials: &[Trial],
    given: Option<f64>,
    cap: u32,
    prompts: u64,
) -> Option<Expectation> {
    let model = LengthModel::new(None, given);
    let pooled = pooled_lengths(trials);
    if given.is_none() && pooled.is_empty() {
        let (mut tokens, mut n) = (0.0, 0u64);
        for t in trials {
            if let Some(m) = t.outcome.measured() {
                tokens += m.mean_output_tokens * m.completed as f64;
                n += m.completed;
            }
        }
        return (n > 0).then(|| Expectation {
            tokens: Interval::exact(tokens / n as f64),
            source: Source::Sweep,
            tail_unseen: false,
            longest: Interval::exact(tokens / n as f64),
        });
    }
    let survival = pooled.survival(&[]);
    model
        .expect(&survival, &[], cap, prompts)
        .map(|e| Expectation {
            source: match e.source {
                Source::Job => Source::Sweep,
                s => s,
            },
            ..e
        })
}

/// The length distribution the trials measured, as `sweep.json` and `--write-profile`
/// record it.
pub fn length_prior(trials: &[Trial], cap: u32) -> Option<LengthPrior> {
    let pooled = pooled_lengths(trials);
    (!pooled.is_empty()).then(|| pooled.survival(&[]).prior(cap))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_s_kind_is_read_from_its_log() {
        let log = |l: &str| vec![l.to_string()];
        let cuda =
            "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 1.2 GiB.";
        assert_eq!(
            Failure::read(Failure::Other, "exited during startup", &log(cuda)),
            Failure::OutOfMemory
        );
        assert_eq!(
            Failure::read(Failure::Other, "x", &log("torch.OutOfMemoryError: boom")),
            Failure::OutOfMemory
        );
        assert_eq!(
            Failure::read(
                Failure::Other,
                "x",
                &log(
                    "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
                )
            ),
            Failure::NotEnoughMemory
        );
        assert_eq!(
            Failure::read(Failure::Refused, "no such GPU", &[]),
            Failure::Refused
        );
        // A file written before the kind was recorded reads as `other`.
        let old: Outcome =
            serde_json::from_str(r#"{"state":"failed","reason":"r","log_tail":[]}"#).unwrap();
        assert!(matches!(
            old,
            Outcome::Failed {
                kind: Failure::Other,
                ..
            }
        ));
    }

    pub(super) fn trial(strategy: &str, tok_s_per_gpu: f64, cap: u32, itl: f64) -> Trial {
        Trial {
            candidate: Candidate::new(
                format!("server.mamba_strategy={strategy}"),
                vec![("server.mamba_strategy".into(), strategy.into())],
            ),
            gpus: vec![],
            outcome: Outcome::Ok(Measured {
                gpus: 4,
                server_gpus: 1,
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
                estimate: None,
                lengths: Default::default(),
            }),
            first_window: None,
            cache: None,
            prediction: None,
        }
    }

    fn pruned(strategy: &str, tok_s_per_gpu: f64, behind: &str) -> Trial {
        let mut t = trial(strategy, tok_s_per_gpu, 37, 0.3);
        let Outcome::Ok(measured) = t.outcome else {
            unreachable!()
        };
        let e = |mean: f64| Estimate {
            mean,
            low: mean * 0.9,
            high: mean * 1.1,
            samples: 8,
            sample_s: 1.0,
        };
        t.outcome = Outcome::Pruned(Pruned {
            measured,
            leader: format!("server.mamba_strategy={behind}"),
            leader_label: behind.into(),
            leader_estimate: e(1000.0),
        });
        t.first_window = Some(FirstWindow {
            after_s: 2.5,
            estimate: e(tok_s_per_gpu),
        });
        t
    }

    #[test]
    fn pruned_candidates_rank_after_the_fully_measured_and_never_win() {
        let rows = rank(
            &[
                failed("x"),
                pruned("extra_buffer", 107.0, "no_buffer"),
                trial("lazy", 90.0, 46, 0.4),
                pruned("auto", 300.0, "no_buffer"),
            ],
            Some(Dataset {
                prompts: 1000,
                output_tokens_per_prompt: 100.0,
                output_tokens_interval: None,
                output_tokens_source: None,
                longest_output_tokens: None,
                gpus: 1,
            }),
        );
        let labels: Vec<&str> = rows.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(labels, vec!["lazy", "auto", "extra_buffer", "x"]);
        assert!(rows[0].winner && !rows[1].winner);
        assert!((rows[1].ratio.unwrap() - 300.0 / 90.0).abs() < 1e-9);
        assert!(
            rows[2].eta_hours.is_some(),
            "a pruned figure still projects"
        );
        let only_pruned = rank(&[pruned("eb", 107.0, "nb")], None);
        assert!(!only_pruned[0].winner && only_pruned[0].ratio.is_none());
        // sweep.json round trip: the pruned state with its figures and leader.
        let t = pruned("extra_buffer", 107.0, "no_buffer");
        let json = serde_json::to_value(&t).unwrap();
        assert_eq!(json["outcome"]["state"], "pruned");
        assert_eq!(json["outcome"]["output_tok_s_per_gpu"], 107.0);
        assert_eq!(json["outcome"]["leader_label"], "no_buffer");
        assert_eq!(json["first_window"]["after_s"], 2.5);
        assert_eq!(serde_json::from_value::<Trial>(json).unwrap(), t);
    }

    fn failed(strategy: &str) -> Trial {
        let mut t = trial(strategy, 0.0, 0, 0.0);
        t.outcome = Outcome::Failed {
            kind: Failure::OutOfMemory,
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
            output_tokens_interval: None,
            output_tokens_source: None,
            longest_output_tokens: None,
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
    fn a_config_measured_twice_is_one_row_of_its_pooled_windows() {
        let window = |tok: f64, half: f64| {
            let mut t = trial("no_buffer", tok, 72, 0.06);
            if let Outcome::Ok(m) = &mut t.outcome {
                m.estimate = Some(Estimate::around(tok, half));
            }
            t
        };
        let first = window(1200.0, 30.0);
        let mut again = window(1160.0, 40.0);
        again.candidate = first.candidate.again();
        assert_eq!(again.candidate.id, "server.mamba_strategy=no_buffer#2");
        // Pooled, its figure is below the rival's one window; but only a confirmed config,
        // measured beside the other leaders, is crowned: the rival's window was taken under
        // another load.
        let rows = rank(
            &[first, trial("extra_buffer", 1190.0, 37, 0.3), again],
            None,
        );
        assert_eq!(rows.len(), 2);
        let (pooled, rival) = (&rows[0], &rows[1]);
        assert!(pooled.winner && !rival.winner);
        assert_eq!((pooled.label.as_str(), pooled.windows), ("no_buffer", 2));
        assert_eq!(rival.label, "extra_buffer");
        assert!((rival.ratio.unwrap() - 1190.0 / 1180.0).abs() < 1e-9);
        let m = pooled.trial.outcome.measured().unwrap();
        assert_eq!(m.output_tok_s_per_gpu, 1180.0);
        assert_eq!(m.completed, 20);
        let e = m.estimate.unwrap();
        assert!((e.high - e.mean - 25.0).abs() < 1e-9, "{e:?}");
        let json = serde_json::to_value(&rows).unwrap();
        assert_eq!(json[0]["windows"], 2);
        assert!(json[1].get("windows").is_none());
    }

    #[test]
    fn all_failed_has_no_winner() {
        let rows = rank(&[failed("a"), failed("b")], None);
        assert!(rows.iter().all(|r| !r.winner));
    }
}
