//! The model of `fleet report`: a sweep's candidates and a job's totals and timeline as data,
//! with what they show as typed findings. Pure: built from values already read; rendered as
//! text, JSON or HTML by the renderers.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::generate::progress::Progress;
use crate::generate::timeline::{Mark, Point, Timeline};
use crate::sweep::file::SweepFile;
use crate::sweep::rank::output_tokens;
use crate::sweep::rank::{self, Dataset, Failure, FirstWindow, Outcome, Percentiles};
use crate::sweep::stats::Estimate;

/// Everything one report shows.
#[derive(Debug, Clone, Serialize)]
pub struct Page {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sweep: Option<SweepView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job: Option<JobView>,
    pub findings: Vec<Finding>,
}

/// What the page says in words, as values: each renderer phrases them.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "finding", rename_all = "snake_case")]
pub enum Finding {
    Winner {
        label: String,
        deciding_factor: Option<String>,
    },
    Pruned {
        label: String,
        leader: String,
    },
    CandidateFailed {
        label: String,
        reason: String,
        /// The error its server's log ended on, where it has one: what to act on.
        #[serde(skip_serializing_if = "Option::is_none")]
        log_line: Option<String>,
    },
    /// Never started: predicted not to fit.
    Skipped {
        label: String,
        reason: String,
    },
    Pending {
        label: String,
    },
    PromptsFailed {
        reason: String,
        prompts: u64,
    },
    WaitingRetry {
        prompts: u64,
    },
    Trouble {
        kind: String,
        subject: String,
        times: usize,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Measured,
    Pruned,
    Failed,
    /// Never started: predicted before the start not to fit in GPU memory.
    Skipped,
}

impl State {
    /// The state as the tables name it.
    pub fn word(self) -> &'static str {
        match self {
            State::Measured => "measured",
            State::Pruned => "pruned",
            State::Failed => "failed",
            State::Skipped => "skipped",
        }
    }
}

/// One candidate of the sweep.
#[derive(Debug, Clone, Serialize)]
pub struct CandidateRow {
    pub rank: usize,
    pub label: String,
    pub state: State,
    pub winner: bool,
    pub gpus: Vec<String>,
    pub tok_s_per_gpu: Option<f64>,
    pub interval: Option<Estimate>,
    /// Full windows its figures pool (a search's confirmation runs a close leader twice).
    pub windows: usize,
    pub ttft_s: Option<Percentiles>,
    pub itl_s: Option<Percentiles>,
    pub cap: Option<u32>,
    pub kv_tokens: Option<u64>,
    pub strategy: Option<String>,
    /// Seconds of the measured window it ran (the first window when pruned, 0 when failed).
    pub measured_s: f64,
    pub first_window: Option<FirstWindow>,
    pub pruned_by: Option<String>,
    pub failure: Option<String>,
    /// The error its server's log ended on, when it failed: `torch.OutOfMemoryError: …`
    /// where the failure itself only says the server exited.
    pub log_line: Option<String>,
    pub eta_hours: Option<f64>,
    /// The ETA's 90% interval, from the expected output length's.
    pub eta_interval: Option<(f64, f64)>,
    pub gpu_hours: Option<f64>,
    /// With `--gpu-hour-cost`: what 1M output tokens cost on this candidate.
    pub cost_per_m_tokens: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SweepView {
    pub source: String,
    pub profile: String,
    pub warmup_s: f64,
    pub duration_s: f64,
    pub first_window_s: Option<f64>,
    pub dataset: Option<Dataset>,
    pub gpu_hour_cost: Option<f64>,
    pub rows: Vec<CandidateRow>,
    pub winner: Option<String>,
    pub deciding_factor: Option<String>,
    pub pending: Vec<String>,
    /// An adaptive search's explored points and best over time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub search: Option<super::search::SearchView>,
}

/// A job's output directory.
#[derive(Debug, Clone, Serialize)]
pub struct JobView {
    pub source: String,
    pub progress: Progress,
    /// failed.jsonl's prompts by reason.
    pub failures: BTreeMap<String, u64>,
    pub points: Vec<Point>,
    pub marks: Vec<Mark>,
    /// Output tok/s the fleet should reach: the sweep winner's per GPU times the job's
    /// instances (one GPU each), when a sweep is in the report.
    pub ideal_tok_s: Option<f64>,
}

/// The sources of a report, read.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    pub sweep: Option<(String, SweepFile)>,
    pub job: Option<JobSource>,
    /// Prompts the ETAs are for (default: the job's total, else the sweep's dataset).
    pub total: Option<u64>,
    pub gpu_hour_cost: Option<f64>,
}

#[derive(Debug, Clone)]
pub struct JobSource {
    pub dir: String,
    pub progress: Progress,
    /// The `reason` of every failed.jsonl line.
    pub failures: BTreeMap<String, u64>,
    pub timeline: Timeline,
}

pub fn build(s: Sources) -> Page {
    let total = s
        .total
        .or(s.job.as_ref().map(|j| j.progress.total).filter(|t| *t > 0));
    let sweep = s
        .sweep
        .map(|(source, file)| sweep_view(source, &file, total, s.gpu_hour_cost));
    let job = s.job.map(|j| {
        let ideal = sweep
            .as_ref()
            .and_then(|sw| sw.rows.iter().find(|r| r.winner))
            .and_then(|w| w.tok_s_per_gpu)
            .map(|t| t * j.progress.instances.len() as f64)
            .filter(|t| *t > 0.0);
        JobView {
            source: j.dir,
            progress: j.progress,
            failures: j.failures,
            points: j.timeline.points,
            marks: j.timeline.marks,
            ideal_tok_s: ideal,
        }
    });
    let findings = findings(sweep.as_ref(), job.as_ref());
    Page {
        sweep,
        job,
        findings,
    }
}

fn sweep_view(
    source: String,
    file: &SweepFile,
    total: Option<u64>,
    cost: Option<f64>,
) -> SweepView {
    let proposed = &file.search.proposed;
    let trials: Vec<_> = proposed
        .iter()
        .filter_map(|c| file.trials.iter().find(|t| t.candidate.id == c.id).cloned())
        .collect();
    let mut slots: Vec<String> = trials
        .iter()
        .flat_map(|t| t.gpus.iter().map(|g| format!("{}:{}", g.host, g.gpu)))
        .collect();
    slots.sort();
    slots.dedup();
    let dataset = total.and_then(|prompts| {
        let cap = file.spec.workload.max_output_tokens();
        output_tokens(&trials, None, cap, prompts)
            .map(|length| Dataset::new(prompts, length, slots.len().max(1)))
    });
    let ranked = rank::rank_within(&trials, dataset, &file.spec.slo);
    let rows = ranked
        .iter()
        .map(|r| {
            let m = r.trial.outcome.measured();
            let log_line = match &r.trial.outcome {
                Outcome::Failed { log_tail, .. } => error_line(log_tail),
                _ => None,
            };
            let (state, measured_s, pruned_by, failure) = match &r.trial.outcome {
                Outcome::Ok(_) => (State::Measured, file.spec.duration_s, None, None),
                Outcome::Pruned(p) => (
                    State::Pruned,
                    r.trial
                        .first_window
                        .map_or(file.spec.first_window_s.unwrap_or(0.0), |f| f.after_s),
                    Some(p.leader_label.clone()),
                    None,
                ),
                Outcome::Failed {
                    kind: Failure::Predicted,
                    reason,
                    ..
                } => (State::Skipped, 0.0, None, Some(reason.clone())),
                Outcome::Failed { reason, .. } => (State::Failed, 0.0, None, Some(reason.clone())),
            };
            let tok = m.map(|m| m.output_tok_s_per_gpu);
            let gpu_hours = r.eta_hours.zip(dataset).map(|(h, d)| h * d.gpus as f64);
            CandidateRow {
                rank: r.rank,
                label: r.label.clone(),
                state,
                winner: r.winner,
                gpus: r
                    .trial
                    .gpus
                    .iter()
                    .map(|g| format!("{}:{}", g.host, g.gpu))
                    .collect(),
                tok_s_per_gpu: tok,
                interval: m.and_then(|m| m.estimate),
                windows: r.windows,
                ttft_s: m.and_then(|m| m.ttft_s),
                itl_s: m.and_then(|m| m.itl_s),
                cap: m.map(|m| m.cap),
                kv_tokens: m.map(|m| m.kv_tokens),
                strategy: m.and_then(|m| m.strategy.clone()),
                measured_s,
                first_window: r.trial.first_window,
                pruned_by,
                failure,
                log_line,
                eta_hours: r.eta_hours,
                eta_interval: r.eta_low_hours.zip(r.eta_high_hours),
                gpu_hours,
                cost_per_m_tokens: cost
                    .zip(tok.filter(|t| *t > 0.0))
                    .map(|(c, t)| c / (t * 3600.0) * 1e6),
            }
        })
        .collect();
    let winner = ranked.iter().find(|r| r.winner).map(|r| r.label.clone());
    SweepView {
        search: super::search::view(file, winner.as_deref()),
        source,
        profile: file.spec.profile.clone(),
        warmup_s: file.spec.warmup_s,
        duration_s: file.spec.duration_s,
        first_window_s: file.spec.first_window_s,
        dataset,
        gpu_hour_cost: cost,
        rows,
        winner,
        deciding_factor: rank::deciding_factor(&ranked),
        pending: proposed
            .iter()
            .filter(|c| !trials.iter().any(|t| t.candidate.id == c.id))
            .map(|c| c.label())
            .collect(),
    }
}

fn findings(sweep: Option<&SweepView>, job: Option<&JobView>) -> Vec<Finding> {
    let mut out = Vec::new();
    if let Some(s) = sweep {
        if let Some(w) = &s.winner {
            out.push(Finding::Winner {
                label: w.clone(),
                deciding_factor: s.deciding_factor.clone(),
            });
        }
        for r in &s.rows {
            if let Some(leader) = &r.pruned_by {
                out.push(Finding::Pruned {
                    label: r.label.clone(),
                    leader: leader.clone(),
                });
            }
            if let (State::Skipped, Some(reason)) = (r.state, &r.failure) {
                out.push(Finding::Skipped {
                    label: r.label.clone(),
                    reason: reason.clone(),
                });
            } else if let Some(reason) = &r.failure {
                out.push(Finding::CandidateFailed {
                    label: r.label.clone(),
                    reason: reason.clone(),
                    log_line: r.log_line.clone(),
                });
            }
        }
        out.extend(
            s.pending
                .iter()
                .map(|l| Finding::Pending { label: l.clone() }),
        );
    }
    if let Some(j) = job {
        for (reason, n) in &j.failures {
            out.push(Finding::PromptsFailed {
                reason: reason.clone(),
                prompts: *n,
            });
        }
        if j.progress.waiting_retry > 0 {
            out.push(Finding::WaitingRetry {
                prompts: j.progress.waiting_retry,
            });
        }
        let mut trouble: BTreeMap<(String, String), usize> = BTreeMap::new();
        for m in j.marks.iter().filter(|m| m.kind.is_trouble()) {
            *trouble
                .entry((m.kind.as_str().to_string(), m.subject.clone()))
                .or_default() += 1;
        }
        out.extend(
            trouble
                .into_iter()
                .map(|((kind, subject), times)| Finding::Trouble {
                    kind,
                    subject,
                    times,
                }),
        );
    }
    out
}

impl Finding {
    /// The finding in a sentence.
    pub fn sentence(&self) -> String {
        match self {
            Finding::Winner {
                label,
                deciding_factor,
            } => match deciding_factor {
                Some(f) => format!("winner: {label} ({f})"),
                None => format!("winner: {label}"),
            },
            Finding::Pruned { label, leader } => {
                format!("{label} was pruned after its first window: {leader} was clearly ahead")
            }
            Finding::CandidateFailed {
                label,
                reason,
                log_line: None,
            } => format!("{label} failed: {reason}"),
            Finding::CandidateFailed {
                label,
                reason,
                log_line: Some(line),
            } => format!("{label} failed: {line} ({reason})"),
            Finding::Skipped { label, reason } => {
                format!("{label} was skipped before the start: {reason}")
            }
            Finding::Pending { label } => format!("{label} has no finished trial yet"),
            Finding::PromptsFailed { reason, prompts } => {
                format!("{prompts} prompt(s) failed for good: {reason} (see failed.jsonl)")
            }
            Finding::WaitingRetry { prompts } => {
                format!("{prompts} prompt(s) wait for a retry: `--resume` sends them again")
            }
            Finding::Trouble {
                kind,
                subject,
                times,
            } => format!("{kind}: {subject} ({times}x)"),
        }
    }
}

/// The error a server's log ended on: its last line that names a Python exception
/// (`torch.OutOfMemoryError: CUDA out of memory. …`, `RuntimeError: Not enough memory. …`, a
/// bare `AssertionError`), from the exception's name on (a log prefix such as `[TP0]` dropped).
/// The line the traceback ends on says why; `raise ValueError(` above it does not, having no
/// `: ` after the name.
pub fn error_line(log: &[String]) -> Option<String> {
    log.iter().rev().find_map(|l| exception_in(l.trim()))
}

fn exception_in(line: &str) -> Option<String> {
    let is_name = |w: &str| {
        let last = w.rsplit('.').next().unwrap_or(w);
        (last.ends_with("Error") || last.ends_with("Exception"))
            && last.starts_with(|c: char| c.is_ascii_uppercase())
            && w.split('.').all(|part| {
                !part.is_empty() && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            })
    };
    if is_name(line) {
        return Some(line.to_string());
    }
    // Where a name ending the word before `: ` starts.
    line.match_indices(": ").find_map(|(end, _)| {
        let start = line[..end]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
            .map_or(0, |i| i + 1);
        is_name(&line[start..end]).then(|| line[start..].to_string())
    })
}

/// At most `n` of `points`, evenly picked, the first and last always among them: what a
/// table of a long series shows.
pub fn sample<T>(points: &[T], n: usize) -> Vec<&T> {
    if points.len() <= n || n < 2 {
        return points.iter().collect();
    }
    let step = (points.len() - 1) as f64 / (n - 1) as f64;
    (0..n)
        .map(|i| &points[((i as f64 * step).round() as usize).min(points.len() - 1)])
        .collect()
}

/// Completions per minute between consecutive points, at the later point's time.
pub fn completions_per_minute(points: &[Point]) -> Vec<(f64, f64)> {
    points
        .windows(2)
        .filter(|w| w[1].t > w[0].t)
        .map(|w| {
            let done = w[1].completed.saturating_sub(w[0].completed) as f64;
            (w[1].t, done / (w[1].t - w[0].t) * 60.0)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(t: f64, completed: u64) -> Point {
        Point {
            t,
            completed,
            failed: 0,
            waiting_retry: 0,
            rate_per_sec: 0.0,
            eta_hours: None,
            instances: vec![],
        }
    }

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(str::to_string).collect()
    }

    #[test]
    fn the_reason_is_the_last_exception_its_log_names() {
        let oom = lines(
            "[2026-01-02 10:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File \"/sgl-workspace/sglang/python/sglang/srt/model_executor/cuda_graph_runner.py\", line 471
    raise RuntimeError(
RuntimeError: Capture cuda graph failed
During handling of the above exception, another exception occurred:
[2026-01-02 10:00:01 TP0] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB
CUDA kernel errors might be asynchronously reported at some other API call
[2026-01-02 10:00:02] Received sigquit from a child process. It usually means the child failed.",
        );
        assert_eq!(
            error_line(&oom).as_deref(),
            Some("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
        );
        assert_eq!(
            error_line(&lines("  assert x > 0\nAssertionError\nexiting")).as_deref(),
            Some("AssertionError")
        );
        assert_eq!(
            error_line(&lines("ValueError: bad --tp\nkilled")).as_deref(),
            Some("ValueError: bad --tp")
        );
        // An error in prose, a lower-case `exception:` and a `raise` are no exception's line.
        let none = lines(
            "Scheduler hit an exception: see above\nerror: connection refused\nraise KeyError(\nhttp_error: 503",
        );
        assert_eq!(error_line(&none), None);
    }

    #[test]
    fn a_failed_candidate_is_told_by_its_log_line_with_what_fleet_saw_after() {
        let f = Finding::CandidateFailed {
            label: "no_buffer".into(),
            reason: "local gpu0 :30000: the server process exited during startup".into(),
            log_line: Some("torch.OutOfMemoryError: CUDA out of memory".into()),
        };
        assert_eq!(
            f.sentence(),
            "no_buffer failed: torch.OutOfMemoryError: CUDA out of memory (local gpu0 :30000: the server process exited during startup)"
        );
    }

    #[test]
    fn a_sample_keeps_the_ends_and_spreads_evenly() {
        let v: Vec<u32> = (0..100).collect();
        let s: Vec<u32> = sample(&v, 5).into_iter().copied().collect();
        assert_eq!(s, [0, 25, 50, 74, 99]);
        assert_eq!(sample(&v[..3], 5).len(), 3);
    }

    #[test]
    fn completions_per_minute_come_from_consecutive_points() {
        let p = [
            point(0.0, 0),
            point(30.0, 60),
            point(30.0, 60),
            point(90.0, 120),
        ];
        assert_eq!(completions_per_minute(&p), [(30.0, 120.0), (90.0, 60.0)]);
    }
}
