//! The sweep's report: the ranked table with the winner marked, each candidate's ratio to the
//! winner, ETAs for the whole dataset, the deciding factor, the pruned with the figures they
//! were stopped on, metrics disagreements and failed rows with their log tails; the same data
//! as JSON; the memory predicted before the start against what the servers reported
//! (`predicted`); and the `--dry-run` plan, round by round. Pure.

pub mod predicted;

use serde::Serialize;

use super::assign::{Mode, Slot};
use super::file::SweepSpec;
use super::load::{Repeated, Unfit, WorkloadSpec};
use super::measured::Measured;
use super::rank::{self, Dataset, Outcome, Percentiles, Ranked, Trial};
use super::slo::Slo;
use super::space::Candidate;
use super::stats::Estimate;
use crate::report::table;

/// Everything the report shows; `--json` prints it as is.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub profile: String,
    pub mode: Mode,
    pub workload: WorkloadSpec,
    pub warmup_s: f64,
    pub duration_s: f64,
    /// Successive halving's first window, when it stopped clear losers.
    pub first_window_s: Option<f64>,
    /// `--slo`: the limits a winner keeps; rows that break them say which.
    #[serde(skip_serializing_if = "Slo::is_empty")]
    pub slo: Slo,
    /// What the ETAs are for.
    pub dataset: Option<Dataset>,
    pub rows: Vec<Ranked>,
    /// The winner's label.
    pub winner: Option<String>,
    pub deciding_factor: Option<String>,
    /// The configs tied with the winner within their windows' noise (see `rank::crown`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tie: Vec<String>,
    /// Candidates with no finished trial (an interrupted sweep).
    pub pending: Vec<String>,
    /// Prompts of the workload longer than the context: left out of every candidate's
    /// figures, never a candidate's failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unfit: Option<Unfit>,
    /// A trial drew more requests than the sample holds, so prompts repeated in it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repeated: Option<Repeated>,
    /// Each measured candidate's predicted cap and KV pool against its servers'.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub predictions: Vec<predicted::CapCheck>,
}

/// Ranks the trials of the candidates the search `proposed` (in case the file holds others)
/// into the report; a proposed candidate without a trial is pending.
pub fn build(
    spec: &SweepSpec,
    proposed: &[Candidate],
    trials: &[Trial],
    dataset: Option<Dataset>,
) -> Report {
    let candidates = proposed;
    let mine: Vec<Trial> = candidates
        .iter()
        .filter_map(|c| trials.iter().find(|t| t.candidate.id == c.id).cloned())
        .collect();
    let pending = candidates
        .iter()
        .filter(|c| !mine.iter().any(|t| t.candidate.id == c.id))
        .map(Candidate::label)
        .collect();
    let rows = rank::rank_within(&mine, dataset, &spec.slo);
    Report {
        profile: spec.profile.clone(),
        mode: spec.mode,
        workload: spec.workload.clone(),
        warmup_s: spec.warmup_s,
        duration_s: spec.duration_s,
        first_window_s: spec.first_window_s,
        slo: spec.slo.clone(),
        dataset,
        winner: rows.iter().find(|r| r.winner).map(|r| r.label.clone()),
        deciding_factor: rank::deciding_factor(&rows),
        predictions: predicted::checks(&rows),
        tie: rows
            .iter()
            .filter(|r| r.tied)
            .map(|r| r.label.clone())
            .collect(),
        rows,
        pending,
        unfit: None,
        repeated: None,
    }
}

impl Report {
    /// The winner's trial.
    pub fn winning(&self) -> Option<&Ranked> {
        self.rows.iter().find(|r| r.winner)
    }
}

/// The line that says the winner tied with others within noise, and why it was crowned.
fn tie_note(r: &Report, w: &Ranked) -> String {
    let tied: Vec<&Ranked> = r.rows.iter().filter(|row| row.tied).collect();
    if tied.is_empty() {
        return String::new();
    }
    let labels: Vec<&str> = tied.iter().map(|row| row.label.as_str()).collect();
    let leaner = tied
        .iter()
        .all(|row| rank::crown::memory_ask(&w.trial.candidate, &row.trial.candidate).is_lt());
    let why = if leaner {
        "it asks the least GPU memory of them, the farthest from the out-of-memory edge"
    } else {
        "the fastest of them, asking no more GPU memory"
    };
    format!(
        "tie within noise: {} and {} (within one standard error of their windows' noise); crowned {}: {why}\n",
        w.label,
        labels.join(", "),
        w.label
    )
}

fn latency(p: Option<Percentiles>) -> String {
    p.map_or("-".into(), |p| {
        format!("{:.0}/{:.0}", p.p50 * 1000.0, p.p99 * 1000.0)
    })
}

/// `1180.3 ±30.1`: a measured figure with its 95% interval, where the window gave one.
fn throughput(m: &Measured) -> String {
    match &m.estimate {
        Some(e) => format!(
            "{:.1} ±{:.1}",
            m.output_tok_s_per_gpu,
            (e.high - e.low) / 2.0
        ),
        None => format!("{:.1}", m.output_tok_s_per_gpu),
    }
}

/// `1180.3 [1150.2, 1210.4]`.
fn interval(e: &Estimate) -> String {
    format!("{:.1} [{:.1}, {:.1}]", e.mean, e.low, e.high)
}

fn seconds(s: f64) -> String {
    humantime::format_duration(std::time::Duration::from_secs_f64(s)).to_string()
}

/// A row's ETA with its interval where the length estimate has one: `19 h (17–22 h)`.
fn eta_cell(row: &Ranked) -> String {
    match (row.eta_hours, row.eta_low_hours, row.eta_high_hours) {
        (Some(h), Some(lo), Some(hi)) => format!("{} ({}–{})", hours(h), hours(lo), hours(hi)),
        (Some(h), ..) => hours(h),
        _ => "-".into(),
    }
}

fn hours(h: f64) -> String {
    if h >= 10.0 {
        format!("{h:.0} h")
    } else if h >= 1.0 {
        format!("{h:.1} h")
    } else if h * 60.0 >= 1.0 {
        format!("{:.0} min", h * 60.0)
    } else {
        format!("{:.0} s", h * 3600.0)
    }
}

/// The share of prompt tokens the radix cache served: `12.5%`.
fn cached(t: &Trial) -> String {
    t.cache
        .and_then(|c| c.share())
        .map_or("-".into(), |s| format!("{:.1}%", s * 100.0))
}

/// What the workload's prompts did to every trial, said once for the sweep.
fn workload_notes(r: &Report) -> String {
    let mut out = String::new();
    if let Some(u) = &r.unfit {
        out.push_str(&format!(
            "{} prompts of the sample do not fit the context: {} (left out of every candidate's figures; `fleet generate` records them as prompt_too_long)\n",
            u.prompts, u.example
        ));
    }
    if let Some(rep) = &r.repeated {
        let more = match rep.usable {
            Some(u) if u > rep.sample => {
                format!("raise --sample (the file has {u} usable prompts)")
            }
            Some(u) => format!(
                "the file has only {u} usable prompts: use a larger one or a shorter --duration"
            ),
            None => "raise --sample".to_string(),
        };
        out.push_str(&format!(
            "warning: a trial drew {} requests from a sample of {} prompts, so prompts repeated and SGLang's radix cache served their prefill again (a candidate with --disable-radix-cache gets no such gift): {more}\n",
            rep.drawn, rep.sample
        ));
    }
    out
}

/// A row without figures: skipped before the start when predicted not to fit, else failed.
fn failed_or_skipped(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::Failed {
            kind: rank::Failure::Predicted,
            ..
        } => "skipped",
        _ => "failed",
    }
}

/// The ranked table and what follows it.
pub fn text(r: &Report) -> String {
    let mut header = vec![
        "#",
        "candidate",
        "strategy",
        "out tok/s/GPU",
        "vs winner",
        "req/s",
        "TTFT p50/p99 ms",
        "ITL p50/p99 ms",
        "cap",
        "in flight",
        "KV tokens",
        "startup",
        "errors",
        "cached",
        "GPUs",
    ];
    if r.dataset.is_some() {
        header.push("ETA");
    }
    let pruning = r.first_window_s.is_some();
    let pooled = r.rows.iter().any(|row| row.windows > 1);
    if pruning || pooled {
        header.push("window");
    }
    let rows = r.rows.iter().map(|row| {
        let name = if row.winner {
            format!("{} *", row.label)
        } else if !row.breaches.is_empty() {
            format!("{} (breaks SLO)", row.label)
        } else {
            row.label.clone()
        };
        let mut cells = vec![row.rank.to_string(), name];
        match row.trial.outcome.measured() {
            Some(m) => {
                cells.extend([
                    m.strategy.clone().unwrap_or_else(|| "-".into()),
                    throughput(m),
                    row.ratio.map_or("-".into(), |x| format!("{x:.2}x")),
                    format!("{:.2}", m.req_s),
                    latency(m.ttft_s),
                    latency(m.itl_s),
                    m.cap.to_string(),
                    m.in_flight.to_string(),
                    m.kv_tokens.to_string(),
                    m.startup_s.map_or("up".into(), |s| format!("{s:.1}s")),
                    m.errors.to_string(),
                    cached(&row.trial),
                    m.gpus.to_string(),
                ]);
                if r.dataset.is_some() {
                    cells.push(eta_cell(row));
                }
                if pruning || pooled {
                    cells.push(match &row.trial.outcome {
                        Outcome::Pruned(_) => {
                            format!("{}, pruned", seconds(r.first_window_s.unwrap_or_default()))
                        }
                        _ if row.windows > 1 => {
                            format!("{} x {}", row.windows, seconds(r.duration_s))
                        }
                        _ => seconds(r.duration_s),
                    });
                }
            }
            None => {
                cells.push(failed_or_skipped(&row.trial.outcome).into());
                let blanks = header.len() - cells.len();
                cells.extend(std::iter::repeat_n("-".to_string(), blanks));
            }
        }
        cells
    });
    let mut out = table(&header, rows);
    out.push('\n');
    if let Some(w) = r.winning() {
        let Outcome::Ok(m) = &w.trial.outcome else {
            unreachable!("a winner is always measured")
        };
        let runner_up = r.rows.get(1).and_then(|x| x.ratio.map(|q| (x, q)));
        out.push_str(&format!(
            "\nwinner: {} ({:.1} output tok/s per GPU",
            w.label, m.output_tok_s_per_gpu
        ));
        if let Some((x, q)) = runner_up.filter(|(_, q)| *q > 0.0) {
            out.push_str(&format!(", {:.2}x {}", 1.0 / q, x.label));
        }
        out.push_str(")\n");
        out.push_str(&tie_note(r, w));
    } else if r.rows.iter().any(|row| !row.breaches.is_empty()) {
        out.push_str(&format!(
            "\nno winner: no candidate kept --slo {}\n",
            r.slo.text()
        ));
    } else if !r.rows.is_empty() {
        out.push_str("\nno winner: no candidate was measured\n");
    }
    for row in r.rows.iter().filter(|row| !row.breaches.is_empty()) {
        let broke: Vec<String> = row.breaches.iter().map(ToString::to_string).collect();
        out.push_str(&format!(
            "breaks --slo: {}: {}\n",
            row.label,
            broke.join(", ")
        ));
    }
    if let Some(f) = &r.deciding_factor {
        out.push_str(&format!("deciding factor: {f}\n"));
    }
    out.push_str(&workload_notes(r));
    if let Some(d) = &r.dataset {
        let etas: Vec<String> = r
            .rows
            .iter()
            .filter_map(|row| {
                let pruned = matches!(row.trial.outcome, Outcome::Pruned(_));
                row.eta_hours.map(|_| {
                    let note = if pruned { " (pruned)" } else { "" };
                    format!("{}: {}{note}", row.label, eta_cell(row))
                })
            })
            .collect();
        if !etas.is_empty() {
            let interval = d
                .output_tokens_interval
                .map_or(String::new(), |(lo, hi)| format!(" ({lo:.0}–{hi:.0})"));
            out.push_str(&format!(
                "ETA for {} prompts x {:.0}{interval} output tokens on {} GPUs: {}\n",
                d.prompts,
                d.output_tokens_per_prompt,
                d.gpus,
                etas.join(", ")
            ));
        }
    }
    let pruned: Vec<String> = r
        .rows
        .iter()
        .filter_map(|row| match (&row.trial.outcome, &row.trial.first_window) {
            (Outcome::Pruned(p), Some(f)) => Some(format!(
                "  {}: {} vs {}: {}\n",
                row.label,
                interval(&f.estimate),
                p.leader_label,
                interval(&p.leader_estimate)
            )),
            _ => None,
        })
        .collect();
    if !pruned.is_empty() {
        out.push_str(&format!(
            "pruned after a first window of {} (output tok/s per GPU, 95% interval wholly below the leader's; `--no-prune` runs every candidate the full {}):\n{}",
            seconds(r.first_window_s.unwrap_or_default()),
            seconds(r.duration_s),
            pruned.concat()
        ));
    }
    for row in &r.rows {
        if let Outcome::Ok(m) = &row.trial.outcome
            && m.metrics_disagree()
        {
            let server = m.metrics_output_tok_s.unwrap_or(0.0);
            out.push_str(&format!(
                "warning: {}: the servers' sglang:generation_tokens_total says {server:.1} tok/s, the client counted {:.1} tok/s for the same finished requests (over 5% apart)",
                row.label, m.completed_output_tok_s
            ));
            out.push_str(if server > m.completed_output_tok_s {
                "; the servers finished more than this client saw: other clients on these servers, or the machine running fleet is short of CPU (then the numbers above are low)\n"
            } else {
                "; the servers counted fewer than this client received: did a server restart and reset its counters?\n"
            });
        }
    }
    out.push_str(&predicted::text(&r.predictions));
    for row in &r.rows {
        if let Outcome::Failed {
            reason, log_tail, ..
        } = &row.trial.outcome
        {
            let what = failed_or_skipped(&row.trial.outcome);
            out.push_str(&format!("{what}: {}: {reason}\n", row.label));
            out.push_str(&crate::render::log_tail(
                log_tail.iter().map(String::as_str),
            ));
        }
    }
    if !r.pending.is_empty() {
        out.push_str(&format!("not measured yet: {}\n", r.pending.join(", ")));
    }
    out
}

/// One candidate of the `--dry-run` plan.
#[derive(Debug, Clone, Serialize)]
pub struct PlannedCandidate {
    pub id: String,
    pub label: String,
    /// 1-based; every candidate of a parallel sweep is in round 1.
    pub round: usize,
    pub gpus: Vec<Slot>,
    /// The first server's argv (secrets masked).
    pub argv: Vec<String>,
    /// Why it would fail at once (preflight), if it would.
    pub problem: Option<String>,
}

/// What `--dry-run` shows; `--json` prints it as is.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub mode: Mode,
    pub gpus: usize,
    pub rounds: usize,
    pub warmup_s: f64,
    pub duration_s: f64,
    pub first_window_s: Option<f64>,
    pub candidates: Vec<PlannedCandidate>,
}

fn slots_text(slots: &[Slot]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut last_host: Option<&str> = None;
    for s in slots {
        if last_host == Some(s.host.as_str()) {
            let prev = out.last_mut().expect("a host entry precedes");
            prev.push_str(&format!(",{}", s.gpu));
        } else {
            out.push(format!("{}:{}", s.host, s.gpu));
            last_host = Some(&s.host);
        }
    }
    out.join(" ")
}

pub fn plan_text(p: &Plan) -> String {
    let rounds = p.mode == Mode::Rounds;
    let rows = p.candidates.iter().map(|c| {
        let mut row = Vec::with_capacity(4);
        if rounds {
            row.push(c.round.to_string());
        }
        row.extend([
            c.label.clone(),
            slots_text(&c.gpus),
            c.problem.clone().unwrap_or_else(|| "ok".into()),
        ]);
        row
    });
    let mut header = vec!["candidate", "GPUs", "preflight"];
    if rounds {
        header.insert(0, "round");
    }
    let n = p.candidates.len();
    let mut out = match p.mode {
        Mode::Parallel => {
            format!("{n} candidates, parallel: candidates run side by side, each on its own GPUs\n")
        }
        Mode::Sequential => {
            format!("{n} candidates, sequential: the whole fleet restarts for each candidate\n")
        }
        Mode::Rounds => format!(
            "{n} candidates on {} GPUs, in {} rounds: one GPU each, side by side; a GPU a candidate frees goes to the next one at once\n",
            p.gpus, p.rounds
        ),
    };
    if rounds {
        out.push_str(&match p.first_window_s {
            Some(first) => format!(
                "successive halving: after its {} warm-up each candidate is measured for a first {}; one whose output tok/s interval (95%) lies below the leader's stops there and frees its GPU, the others run the full {} (--no-prune: all do)\n",
                seconds(p.warmup_s),
                seconds(first),
                seconds(p.duration_s)
            ),
            None => format!(
                "no pruning: every candidate runs the full {}\n",
                seconds(p.duration_s)
            ),
        });
    }
    out.push_str(&table(&header, rows));
    out.push('\n');
    if rounds && p.rounds > 1 {
        out.push_str(
            "GPUs from round 2 on are those a round frees when all of it runs the full window; a candidate takes whichever GPU is freed first\n",
        );
    }
    out
}

#[cfg(test)]
mod tests;
