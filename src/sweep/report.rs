//! The sweep's report: the ranked table with the winner marked, each candidate's ratio to the
//! winner, ETAs for the whole dataset, the deciding factor, metrics disagreements and failed
//! rows with their log tails; the same data as JSON; and the `--dry-run` plan. Pure.

use serde::Serialize;

use super::assign::{Mode, Slot};
use super::load::WorkloadSpec;
use super::rank::{self, Dataset, Outcome, Percentiles, Ranked, Trial};
use super::space::Candidate;
use crate::report::table;

/// Everything the report shows; `--json` prints it as is.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub profile: String,
    pub mode: Mode,
    pub workload: WorkloadSpec,
    pub warmup_s: f64,
    pub duration_s: f64,
    /// What the ETAs are for.
    pub dataset: Option<Dataset>,
    pub rows: Vec<Ranked>,
    /// The winner's label.
    pub winner: Option<String>,
    pub deciding_factor: Option<String>,
    /// Candidates with no finished trial (an interrupted sweep).
    pub pending: Vec<String>,
}

/// The mean output tokens per request to project with: `--expected-output-tokens`, else the mean
/// the trials measured (weighted by finished requests).
pub fn output_tokens_per_prompt(trials: &[Trial], given: Option<f64>) -> Option<f64> {
    if given.is_some() {
        return given;
    }
    let (mut tokens, mut n) = (0.0, 0u64);
    for t in trials {
        if let Outcome::Ok(m) = &t.outcome {
            tokens += m.mean_output_tokens * m.completed as f64;
            n += m.completed;
        }
    }
    (n > 0).then(|| tokens / n as f64)
}

/// Ranks the trials of `candidates` (in case the file holds others) into the report.
#[allow(clippy::too_many_arguments)]
pub fn build(
    profile: &str,
    mode: Mode,
    workload: WorkloadSpec,
    warmup_s: f64,
    duration_s: f64,
    candidates: &[Candidate],
    trials: &[Trial],
    dataset: Option<Dataset>,
) -> Report {
    let mine: Vec<Trial> = candidates
        .iter()
        .filter_map(|c| trials.iter().find(|t| t.candidate.id == c.id).cloned())
        .collect();
    let pending = candidates
        .iter()
        .filter(|c| !mine.iter().any(|t| t.candidate.id == c.id))
        .map(Candidate::label)
        .collect();
    let rows = rank::rank(&mine, dataset);
    Report {
        profile: profile.to_string(),
        mode,
        workload,
        warmup_s,
        duration_s,
        dataset,
        winner: rows.iter().find(|r| r.winner).map(|r| r.label.clone()),
        deciding_factor: rank::deciding_factor(&rows),
        rows,
        pending,
    }
}

impl Report {
    /// The winner's trial.
    pub fn winning(&self) -> Option<&Ranked> {
        self.rows.iter().find(|r| r.winner)
    }
}

fn latency(p: Option<Percentiles>) -> String {
    p.map_or("-".into(), |p| {
        format!("{:.0}/{:.0}", p.p50 * 1000.0, p.p99 * 1000.0)
    })
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
        "GPUs",
    ];
    if r.dataset.is_some() {
        header.push("ETA");
    }
    let rows = r.rows.iter().map(|row| {
        let name = if row.winner {
            format!("{} *", row.label)
        } else {
            row.label.clone()
        };
        let mut cells = vec![row.rank.to_string(), name];
        match &row.trial.outcome {
            Outcome::Ok(m) => {
                cells.extend([
                    m.strategy.clone().unwrap_or_else(|| "-".into()),
                    format!("{:.1}", m.output_tok_s_per_gpu),
                    row.ratio.map_or("-".into(), |x| format!("{x:.2}x")),
                    format!("{:.2}", m.req_s),
                    latency(m.ttft_s),
                    latency(m.itl_s),
                    m.cap.to_string(),
                    m.in_flight.to_string(),
                    m.kv_tokens.to_string(),
                    m.startup_s.map_or("up".into(), |s| format!("{s:.1}s")),
                    m.errors.to_string(),
                    m.gpus.to_string(),
                ]);
                if r.dataset.is_some() {
                    cells.push(row.eta_hours.map_or("-".into(), hours));
                }
            }
            Outcome::Failed { .. } => {
                cells.push("failed".into());
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
    } else if !r.rows.is_empty() {
        out.push_str("\nno winner: no candidate was measured\n");
    }
    if let Some(f) = &r.deciding_factor {
        out.push_str(&format!("deciding factor: {f}\n"));
    }
    if let Some(d) = &r.dataset {
        let etas: Vec<String> = r
            .rows
            .iter()
            .filter_map(|row| {
                row.eta_hours
                    .map(|h| format!("{}: {}", row.label, hours(h)))
            })
            .collect();
        if !etas.is_empty() {
            out.push_str(&format!(
                "ETA for {} prompts x {:.0} output tokens on {} GPUs: {}\n",
                d.prompts,
                d.output_tokens_per_prompt,
                d.gpus,
                etas.join(", ")
            ));
        }
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
    for row in &r.rows {
        if let Outcome::Failed { reason, log_tail } = &row.trial.outcome {
            out.push_str(&format!("failed: {}: {reason}\n", row.label));
            for line in log_tail {
                out.push_str(&format!("    | {line}\n"));
            }
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
    pub gpus: Vec<Slot>,
    /// The first server's argv (secrets masked).
    pub argv: Vec<String>,
    /// Why it would fail at once (preflight), if it would.
    pub problem: Option<String>,
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

pub fn plan_text(mode: Mode, planned: &[PlannedCandidate]) -> String {
    let rows = planned.iter().map(|p| {
        vec![
            p.label.clone(),
            slots_text(&p.gpus),
            p.problem.clone().unwrap_or_else(|| "ok".into()),
        ]
    });
    let mode = match mode {
        Mode::Parallel => "parallel: candidates run side by side, each on its own GPUs",
        Mode::Sequential => "sequential: the whole fleet restarts for each candidate",
    };
    format!(
        "{} candidates, {mode}\n{}\n",
        planned.len(),
        table(&["candidate", "GPUs", "preflight"], rows)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::rank::Measured;

    fn slot(gpu: u32) -> Slot {
        Slot {
            host: "local".into(),
            gpu,
        }
    }

    fn cand(s: &str) -> Candidate {
        Candidate {
            id: format!("server.mamba_strategy={s}"),
            settings: vec![("server.mamba_strategy".into(), s.into())],
        }
    }

    fn ok(s: &str, tok: f64, cap: u32, metrics: f64) -> Trial {
        Trial {
            candidate: cand(s),
            gpus: vec![slot(0), slot(2)],
            outcome: Outcome::Ok(Measured {
                gpus: 2,
                output_tok_s: tok * 2.0,
                output_tok_s_per_gpu: tok,
                req_s: 1.0,
                completed: 10,
                errors: 0,
                mean_output_tokens: 988.0,
                ttft_s: Some(Percentiles { p50: 0.2, p99: 0.9 }),
                itl_s: Some(Percentiles {
                    p50: 0.061,
                    p99: 0.08,
                }),
                cap,
                in_flight: cap * 5 / 4,
                kv_tokens: 278_118,
                strategy: Some("no_buffer".into()),
                startup_s: Some(31.0),
                completed_output_tok_s: 1000.0,
                metrics_output_tok_s: Some(metrics),
            }),
        }
    }

    #[test]
    fn the_seed_report_names_winner_factor_etas_and_failures() {
        let trials = vec![
            ok("extra_buffer", 107.0, 37, 1000.0),
            Trial {
                candidate: cand("extra_buffer_lazy"),
                gpus: vec![slot(1)],
                outcome: Outcome::Failed {
                    reason: "local gpu1 :30001: the server process exited during startup".into(),
                    log_tail: vec!["CUDA out of memory.".into()],
                },
            },
            ok("no_buffer", 1180.0, 72, 1200.0),
        ];
        let all = [
            cand("extra_buffer"),
            cand("no_buffer"),
            cand("extra_buffer_lazy"),
            cand("auto"),
        ];
        let tokens = output_tokens_per_prompt(&trials, None).unwrap();
        assert_eq!(tokens, 988.0);
        let d = Dataset {
            prompts: 654_676,
            output_tokens_per_prompt: tokens,
            gpus: 8,
        };
        let r = build(
            "blackwell",
            Mode::Parallel,
            WorkloadSpec::Synthetic {
                input_len: 1,
                output_len: 2,
            },
            15.0,
            60.0,
            &all,
            &trials,
            Some(d),
        );
        assert_eq!(r.winner.as_deref(), Some("no_buffer"));
        assert_eq!(r.pending, vec!["auto".to_string()]);
        let t = text(&r);
        assert!(t.contains("no_buffer *"), "{t}");
        assert!(
            t.contains("winner: no_buffer (1180.0 output tok/s per GPU, 11.03x extra_buffer)"),
            "{t}"
        );
        assert!(
            t.contains("deciding factor: no_buffer: cap 72 vs 37"),
            "{t}"
        );
        assert!(t.contains("ETA for 654676 prompts x 988 output tokens on 8 GPUs: no_buffer: 19 h, extra_buffer: 210 h"), "{t}");
        assert!(t.contains("0.09x"), "{t}");
        assert!(t.contains("200/900"), "TTFT p50/p99 in ms: {t}");
        assert_eq!(hours(0.5), "30 min");
        assert_eq!(hours(0.001), "4 s");
        assert_eq!(hours(2.25), "2.2 h");
        assert!(
            t.contains("failed: extra_buffer_lazy: local gpu1 :30001: the server process exited"),
            "{t}"
        );
        assert!(t.contains("    | CUDA out of memory."), "{t}");
        assert!(
            t.contains(
                "warning: no_buffer: the servers' sglang:generation_tokens_total says 1200.0"
            ),
            "{t}"
        );
        assert!(!t.contains("warning: extra_buffer:"), "{t}");
        assert!(t.contains("not measured yet: auto"));
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["rows"][0]["label"], "no_buffer");
        assert_eq!(json["rows"][0]["trial"]["outcome"]["state"], "ok");
        assert_eq!(json["rows"][2]["trial"]["outcome"]["state"], "failed");
    }

    #[test]
    fn dry_run_lists_candidates_and_their_gpus() {
        let p = vec![PlannedCandidate {
            id: "x".into(),
            label: "no_buffer".into(),
            gpus: vec![
                slot(0),
                slot(2),
                Slot {
                    host: "b".into(),
                    gpu: 1,
                },
            ],
            argv: vec![],
            problem: None,
        }];
        let t = plan_text(Mode::Parallel, &p);
        assert!(t.contains("local:0,2 b:1"), "{t}");
        assert!(t.starts_with("1 candidates, parallel"), "{t}");
    }
}
