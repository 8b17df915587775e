//! The report as one self-contained HTML page: inline CSS and SVG, no script, no font, no URL
//! to fetch, so that it opens from `file://` with no network and prints as it shows. Pure.

use maud::{DOCTYPE, Markup, html};

use super::page::{CandidateRow, Page, State, SweepView};
use super::svg::{self, Bar, Span, short};

const CSS: &str = r#"
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#222;max-width:1600px;margin:24px auto;padding:0 24px}
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
svg.chart{display:block}
svg.chart[viewBox]{width:100%;height:auto;max-width:900px;margin:8px 0}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(100%,560px),1fr));gap:4px 32px}
figure.tchart,figure.rchart{margin:8px 0 16px;min-width:0}
figure.tchart figcaption,figure.rchart figcaption{display:flex;justify-content:space-between;font-size:13px;font-weight:600}
figure.tchart figcaption{margin-left:52px}
figure figcaption .unit{font-weight:400;color:#555;font-size:11px}
div.plot{display:flex}div.plot svg.yaxis,div.plot svg.labels{flex:none}div.plot svg.chart{flex:1 1 auto;min-width:0;overflow:visible}
ul.legend{list-style:none;margin:2px 0 0 52px;padding:0;display:flex;flex-wrap:wrap;gap:2px 16px;font-size:12px}
#instance-legend{margin:4px 0 8px;font-size:13px}
i.swatch{display:inline-block;width:16px;height:0;border-top:3px solid var(--c);vertical-align:middle;margin-right:6px}
i.swatch.dashed{border-top-style:dashed}
td.why{text-align:left}td.log-line code{font:12px ui-monospace,Menlo,Consolas,monospace;color:#b00}
svg text{font:11px system-ui,sans-serif;fill:#333}
svg text.title{font-size:13px;font-weight:600}
svg .grid{stroke:#e6e6e6}
svg rect.winner{fill:#2ca02c}svg rect.measured{fill:#1f77b4}svg rect.pruned{fill:#ff7f0e}svg rect.failed{fill:#d62728}svg rect.skipped{fill:#bbbbbb}
svg circle.measured{fill:#1f77b4}svg circle.pruned{fill:#7f7f7f}svg circle.breaks{fill:none;stroke:#9467bd;stroke-width:1.5}svg path.oom{stroke:#d62728;stroke-width:2}svg path.failed{stroke:#7f7f7f;stroke-width:2}svg path.skipped{stroke:#bbbbbb;stroke-width:2}svg path.best{stroke:#2ca02c;stroke-width:2}
svg .whisker{stroke:#000;stroke-width:1.5}
svg .series{fill:none;stroke-width:1.8}
svg .mark{stroke:#888;stroke-width:1;stroke-dasharray:2 3}
svg .mark.trouble{stroke:#d62728;stroke-width:1.2}
svg .axis{stroke:#bbb}
svg text.mark-label{font-size:10px;fill:#555;writing-mode:vertical-rl;paint-order:stroke;stroke:#fff;stroke-width:3px;stroke-linejoin:round}
svg text.mark-label.trouble{fill:#b00}
details{margin:4px 0 12px}
@media print{body{max-width:none;margin:0;font-size:11px}h2{break-after:avoid}svg.chart,figure.tchart,table{break-inside:avoid}details>summary{display:none}}
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
                @if let Some(j) = &p.job { (super::job::html(j)) }
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
        state => state.word(),
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
            note: r.failure.as_ref().map(|_| match (&r.state, &r.log_line) {
                (State::Skipped, _) => "skipped: predicted not to fit".into(),
                (_, Some(l)) => format!("failed: {}", l.split(": ").next().unwrap_or(l)),
                (_, None) => "failed".into(),
            }),
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
                (State::Skipped, _, _) => "skipped before the start".into(),
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
                        td { (r.state.word()) }
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
        @let skipped: Vec<&CandidateRow> = s.rows.iter().filter(|r| r.state == State::Skipped).collect();
        @if !skipped.is_empty() {
            h3 { "Skipped before the start" }
            table #skipped-candidates {
                thead { tr { th { "candidate" } th.why { "why: the memory predicted from the model's files" } } }
                tbody { @for r in skipped { tr {
                    td { (r.label) }
                    td.why { (r.failure.as_deref().unwrap_or("")) }
                } } }
            }
        }
        @let failed: Vec<&CandidateRow> = s.rows.iter().filter(|r| r.state == State::Failed).collect();
        @if !failed.is_empty() {
            h3 { "Failed candidates" }
            table #failed-candidates {
                thead { tr { th { "candidate" } th.why { "why: its server's log" } th.why { "what fleet saw" } } }
                tbody { @for r in failed { tr {
                    td { (r.label) }
                    td.why.log-line { @if let Some(l) = &r.log_line { code { (l) } } @else { "-" } }
                    td.why { (r.failure.as_deref().unwrap_or("")) }
                } } }
            }
        }
        @if !s.pending.is_empty() { p { "Not measured yet: " (s.pending.join(", ")) } }
        @if let Some(v) = &s.search { (super::search::html(v)) }
    }
}
