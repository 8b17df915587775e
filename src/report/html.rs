//! The report as one self-contained HTML page: inline CSS and SVG, no script, no font, no URL
//! to fetch, so that it opens from `file://` with no network and prints as it shows. Pure.

use maud::{DOCTYPE, Markup, html};

use crate::generate::timeline::InstancePoint;

use super::page::{CandidateRow, JobView, Page, State, SweepView, completions_per_minute, sample};
use super::svg::{self, Bar, Event, Series, Span, short};

/// Rows a table of a time series shows at most.
const TABLE_ROWS: usize = 24;

const CSS: &str = r#"
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#222;max-width:980px;margin:24px auto;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ccc}
h3{font-size:15px;margin:18px 0 6px}
.meta{color:#555}
table{border-collapse:collapse;margin:6px 0 14px;font-variant-numeric:tabular-nums}
th,td{padding:2px 8px;border-bottom:1px solid #e4e4e4;text-align:right}
th:first-child,td:first-child{text-align:left}
tr.winner td{font-weight:600}
#sweep-table{font-size:12.5px}#sweep-table th,#sweep-table td{padding:2px 5px}
#sweep-table td+td,#rounds-table td+td{white-space:nowrap}
#rounds-table td:last-child{white-space:normal;text-align:left}
ul.findings li.trouble{color:#b00}
svg.chart{width:100%;height:auto;max-width:760px;display:block;margin:8px 0}
svg text{font:11px system-ui,sans-serif;fill:#333}
svg text.title{font-size:13px;font-weight:600}
svg .grid{stroke:#e6e6e6}
svg rect.winner{fill:#2ca02c}svg rect.measured{fill:#1f77b4}svg rect.pruned{fill:#ff7f0e}svg rect.failed{fill:#d62728}
svg circle.measured{fill:#1f77b4}svg circle.pruned{fill:#7f7f7f}svg circle.breaks{fill:none;stroke:#9467bd;stroke-width:1.5}svg path.oom{stroke:#d62728;stroke-width:2}svg path.failed{stroke:#7f7f7f;stroke-width:2}svg path.best{stroke:#2ca02c;stroke-width:2}
svg .whisker{stroke:#000;stroke-width:1.5}
svg .series{fill:none;stroke-width:1.8}
svg .mark{stroke:#888;stroke-width:1;stroke-dasharray:2 3}
svg .mark.trouble{stroke:#d62728;stroke-width:1.2}
details{margin:4px 0 12px}
@media print{body{max-width:none;margin:0;font-size:11px}h2{break-after:avoid}svg.chart,table{break-inside:avoid}details>summary{display:none}}
"#;

/// The whole page.
pub fn render(p: &Page) -> String {
    let title = match (&p.sweep, &p.job) {
        (Some(_), Some(_)) => "fleet report: sweep and job",
        (Some(_), None) => "fleet report: sweep",
        _ => "fleet report: job",
    };
    let page = html! {
        (DOCTYPE)
        html lang="en" {
            (crate::render::html::head(title, CSS))
            body {
                h1 { (title) }
                @if !p.findings.is_empty() {
                    h2 { "Findings" }
                    ul.findings {
                        @for f in &p.findings {
                            li class=(if matches!(f, super::page::Finding::Trouble { .. } | super::page::Finding::CandidateFailed { .. } | super::page::Finding::PromptsFailed { .. }) { "trouble" } else { "" }) { (f.sentence()) }
                        }
                    }
                }
                @if let Some(s) = &p.sweep { (sweep(s)) }
                @if let Some(j) = &p.job { (job(j)) }
            }
        }
    };
    page.into_string()
}

fn opt(v: Option<f64>) -> String {
    v.map_or("-".into(), short)
}

fn ms(p: Option<crate::sweep::rank::Percentiles>) -> (String, String) {
    p.map_or(("-".into(), "-".into()), |p| {
        (format!("{:.0}", p.p50 * 1e3), format!("{:.0}", p.p99 * 1e3))
    })
}

fn class(r: &CandidateRow) -> &'static str {
    match r.state {
        _ if r.winner => "winner",
        State::Measured => "measured",
        State::Pruned => "pruned",
        State::Failed => "failed",
    }
}

fn sweep(s: &SweepView) -> Markup {
    let bars: Vec<Bar> = s
        .rows
        .iter()
        .map(|r| Bar {
            label: r.label.clone(),
            value: r.tok_s_per_gpu.unwrap_or(0.0),
            interval: r.interval.map(|e| (e.low, e.high)),
            class: class(r),
            note: r.failure.as_ref().map(|_| "failed".to_string()),
        })
        .collect();
    let spans: Vec<Span> = s
        .rows
        .iter()
        .map(|r| Span {
            label: r.label.clone(),
            end_s: r.measured_s,
            class: class(r),
            note: match (&r.state, &r.pruned_by, &r.failure) {
                (State::Pruned, Some(l), _) => format!("pruned by {l}"),
                (State::Failed, _, Some(_)) => "failed".into(),
                _ if r.windows > 1 && r.winner => format!("{} full windows, winner", r.windows),
                _ if r.windows > 1 => format!("{} full windows", r.windows),
                _ if r.winner => "full window, winner".into(),
                _ => "full window".into(),
            },
        })
        .collect();
    html! {
        h2 { "Sweep" }
        p.meta { (s.source) ": profile " (s.profile) ", warm-up " (short(s.warmup_s)) " s, window " (short(s.duration_s)) " s"
            @if let Some(f) = s.first_window_s { ", first window " (short(f)) " s" }
            @if let Some(d) = s.dataset { "; ETAs for " (d.prompts) " prompts on " (d.gpus) " GPUs at " (short(d.output_tokens_per_prompt)) @if let Some((lo, hi)) = d.output_tokens_interval { " (90%: " (short(lo)) "–" (short(hi)) ")" } " output tokens each" } }
        @if let Some(w) = &s.winner {
            p { "Winner: " strong { (w) } @if let Some(f) = &s.deciding_factor { " (" (f) ")" } }
        }
        (svg::bars("sweep-throughput", "Output tok/s per GPU, with its 95% interval", "tok/s/GPU", &bars))
        table #sweep-table {
            thead { tr { th { "candidate" } th { "state" } th { "tok/s/GPU" } th { "95% interval" } th { "TTFT p50/p99 ms" } th { "ITL p50/p99 ms" } th { "cap" } th { "KV tokens" } th { "mamba strategy" } th { "ETA h (90%)" } th { "GPU-hours" } @if s.gpu_hour_cost.is_some() { th { "cost / 1M tok" } } } }
            tbody {
                @for r in &s.rows {
                    @let (t50, t99) = ms(r.ttft_s);
                    @let (i50, i99) = ms(r.itl_s);
                    tr class=(if r.winner { "winner" } else { "" }) {
                        td { (r.label) }
                        td { @match r.state { State::Measured => "measured", State::Pruned => "pruned", State::Failed => "failed" } }
                        td { (opt(r.tok_s_per_gpu)) }
                        td { @if let Some(e) = r.interval { (short(e.low)) "–" (short(e.high)) } @else { "-" } }
                        td { (t50) " / " (t99) }
                        td { (i50) " / " (i99) }
                        td { @if let Some(c) = r.cap { (c) } @else { "-" } }
                        td { @if let Some(k) = r.kv_tokens { (k) } @else { "-" } }
                        td { (r.strategy.as_deref().unwrap_or("-")) }
                        td { (opt(r.eta_hours)) @if let Some((lo, hi)) = r.eta_interval { " (" (short(lo)) "–" (short(hi)) ")" } }
                        td { (opt(r.gpu_hours)) }
                        @if s.gpu_hour_cost.is_some() { td { (opt(r.cost_per_m_tokens)) } }
                    }
                }
            }
        }
        h3 { "Rounds and successive halving" }
        (svg::spans("sweep-rounds", "Seconds of the measured window each candidate ran", s.duration_s, s.first_window_s, &spans))
        table #rounds-table {
            thead { tr { th { "candidate" } th { "GPUs" } th { "ran s" } th { "first window tok/s/GPU" } th { "pruned by" } } }
            tbody {
                @for r in &s.rows {
                    tr { td { (r.label) } td { (r.gpus.join(" ")) } td { (short(r.measured_s)) }
                         td { @if let Some(f) = r.first_window { (short(f.estimate.mean)) " [" (short(f.estimate.low)) ", " (short(f.estimate.high)) "] after " (short(f.after_s)) " s" } @else { "-" } }
                         td { (r.pruned_by.as_deref().unwrap_or("-")) } }
                }
            }
        }
        @let failed: Vec<&CandidateRow> = s.rows.iter().filter(|r| r.failure.is_some()).collect();
        @if !failed.is_empty() {
            h3 { "Failed candidates" }
            table #failed-candidates { tbody { @for r in failed { tr { td { (r.label) } td style="text-align:left" { (r.failure.as_deref().unwrap_or("")) } } } } }
        }
        @if !s.pending.is_empty() { p { "Not measured yet: " (s.pending.join(", ")) } }
        @if let Some(v) = &s.search { (super::search::html(v)) }
    }
}

/// One series per instance of `f` over the timeline's points.
fn per_instance(
    j: &JobView,
    names: &[String],
    suffix: &str,
    f: impl Fn(&InstancePoint) -> Option<f64>,
) -> Vec<Series> {
    names
        .iter()
        .map(|n| Series {
            name: format!("{n}{suffix}"),
            points: j
                .points
                .iter()
                .filter_map(|p| {
                    let i = p.instances.iter().find(|i| &i.name == n)?;
                    Some((p.t, f(i)?))
                })
                .collect(),
            dashed: false,
        })
        .collect()
}

fn job(j: &JobView) -> Markup {
    let p = &j.progress;
    let t0 = j
        .points
        .first()
        .map(|p| p.t)
        .into_iter()
        .chain(j.marks.first().map(|m| m.t))
        .fold(f64::INFINITY, f64::min);
    let t0 = if t0.is_finite() { t0 } else { 0.0 };
    let names: Vec<String> = j
        .points
        .last()
        .map(|p| p.instances.iter().map(|i| i.name.clone()).collect())
        .unwrap_or_default();
    let mut throughput = vec![Series {
        name: "fleet".into(),
        points: j.points.iter().map(|p| (p.t, p.output_tok_s())).collect(),
        dashed: false,
    }];
    throughput.extend(per_instance(j, &names, "", |i| Some(i.output_tok_s)));
    if let (Some(ideal), Some(first), Some(last)) =
        (j.ideal_tok_s, j.points.first(), j.points.last())
    {
        throughput.push(Series {
            name: "sweep winner × instances".into(),
            points: vec![(first.t, ideal), (last.t, ideal)],
            dashed: true,
        });
    }
    let mut load = per_instance(j, &names, " in flight", |i| Some(f64::from(i.in_flight)));
    load.extend(
        per_instance(j, &names, " queued", |i| i.queued.filter(|_| i.healthy))
            .into_iter()
            .filter(|s| !s.points.is_empty()),
    );
    // A down instance's last /metrics reading is stale: its gauges stop where it went down.
    let usage: Vec<Series> = per_instance(j, &names, "", |i| {
        i.token_usage.filter(|_| i.healthy).map(|u| u * 100.0)
    })
    .into_iter()
    .filter(|s| !s.points.is_empty())
    .collect();
    let cpm = completions_per_minute(&j.points);
    let outcomes = vec![
        Series {
            name: "failed for good".into(),
            points: j.points.iter().map(|p| (p.t, p.failed as f64)).collect(),
            dashed: false,
        },
        Series {
            name: "waiting retry".into(),
            points: j
                .points
                .iter()
                .map(|p| (p.t, p.waiting_retry as f64))
                .collect(),
            dashed: true,
        },
    ];
    let eta = vec![Series {
        name: "ETA".into(),
        points: j
            .points
            .iter()
            .filter_map(|p| Some((p.t, p.eta_hours?)))
            .collect(),
        dashed: false,
    }];
    let events: Vec<Event> = j
        .marks
        .iter()
        .map(|m| Event {
            t: m.t,
            label: format!("{} {} {}", m.kind.as_str(), m.subject, m.detail)
                .trim()
                .to_string(),
            trouble: m.kind.is_trouble(),
        })
        .collect();
    let rows = sample(&j.points, TABLE_ROWS);
    html! {
        h2 { "Job" }
        p.meta { (j.source) ": " (p.status.as_str()) }
        table #job-totals {
            tbody {
                tr { td { "prompts" } td #job-total { (p.total) } }
                tr { td { "completed" } td #job-completed { (p.completed) } }
                tr { td { "failed for good" } td #job-failed { (p.failed) } }
                tr { td { "waiting retry" } td { (p.waiting_retry) } }
                tr { td { "output tokens" } td { (p.total_output_tokens) } }
                tr { td { "this run, hours" } td { (short(p.elapsed_hours)) } }
                tr { td { "ETA, hours" } td { (opt(p.eta_hours)) } }
            }
        }
        @if !j.failures.is_empty() {
            h3 { "Failures by reason" }
            table #job-failures { thead { tr { th { "reason" } th { "prompts" } } }
                tbody { @for (r, n) in &j.failures { tr { td { (r) } td { (n) } } } } }
        }
        h3 { "Instances" }
        table #job-instances {
            thead { tr { th { "instance" } th { "healthy" } th { "completed" } th { "tok/s" } th { "in flight" } th { "limit" } th { "server cap" } } }
            tbody { @for i in &p.instances { tr { td { (i.name) } td { (if i.healthy { "yes" } else { "no" }) } td { (i.completed) } td { (short(i.output_tok_s)) } td { (i.in_flight) } td { (i.concurrency) } td { @if let Some(c) = i.server_cap { (c) } @else { "-" } } } } }
        }
        @if j.points.is_empty() {
            p { "No timeline: the job was run by a fleet that did not record timeline.jsonl." }
        } @else {
            h3 { "Over time" }
            (svg::time_chart("job-throughput", "Output tok/s, fleet and per instance", "tok/s", t0, &throughput, &events))
            (svg::time_chart("job-load", "Requests in flight and queued, per instance", "requests", t0, &load, &events))
            @if !usage.is_empty() {
                (svg::time_chart("job-token-usage", "KV token usage, per instance (sglang:token_usage)", "% of the pool", t0, &usage, &events))
            }
            (svg::time_chart("job-completions", "Completions per minute", "per min", t0, &[Series { name: "completions/min".into(), points: cpm, dashed: false }], &events))
            (svg::time_chart("job-failures", "Failed prompts and retries", "prompts", t0, &outcomes, &events))
            @if !eta[0].points.is_empty() {
                (svg::time_chart("job-eta", "ETA", "hours", t0, &eta, &events))
            }
            details open {
                summary { "The timeline's numbers (" (rows.len()) " of " (j.points.len()) " points)" }
                table #timeline-table {
                    thead { tr { th { "s" } th { "completed" } th { "failed" } th { "retry" } th { "tok/s" } th { "ETA h (90%)" } } }
                    tbody { @for pt in rows { tr { td { (short(pt.t - t0)) } td { (pt.completed) } td { (pt.failed) } td { (pt.waiting_retry) } td { (short(pt.output_tok_s())) } td { (opt(pt.eta_hours)) } } } }
                }
            }
        }
        @if !j.marks.is_empty() {
            h3 { "Events" }
            table #job-events {
                thead { tr { th { "s" } th { "event" } th { "about" } th { "detail" } } }
                tbody { @for m in &j.marks { tr { td { (short(m.t - t0)) } td { (m.kind.as_str()) } td { (m.subject) } td style="text-align:left" { (m.detail) } } } }
            }
        }
    }
}
