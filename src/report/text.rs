//! The report as text for a terminal: the findings, the candidates and the job's totals. Pure.

use super::page::{Page, State};
use super::svg::short;
use super::table;

pub fn render(p: &Page) -> String {
    let mut out = String::new();
    for f in &p.findings {
        out.push_str(&f.sentence());
        out.push('\n');
    }
    if let Some(s) = &p.sweep {
        out.push_str(&format!("\nsweep {} (profile {})\n", s.source, s.profile));
        let opt = |v: Option<f64>| v.map_or("-".to_string(), short);
        let rows = s.rows.iter().map(|r| {
            vec![
                r.label.clone(),
                match r.state {
                    State::Measured if r.winner => "winner".into(),
                    state => state.word().into(),
                },
                opt(r.tok_s_per_gpu),
                r.interval.map_or("-".into(), |e| {
                    format!("{}-{}", short(e.low), short(e.high))
                }),
                r.cap.map_or("-".into(), |c| c.to_string()),
                r.strategy.clone().unwrap_or_else(|| "-".into()),
                opt(r.eta_hours),
            ]
        });
        out.push_str(&table(
            &[
                "CANDIDATE",
                "STATE",
                "TOK/S/GPU",
                "95%",
                "CAP",
                "STRATEGY",
                "ETA H",
            ],
            rows,
        ));
        out.push('\n');
    }
    if let Some(j) = &p.job {
        let g = &j.progress;
        out.push_str(&format!(
            "\njob {}: {} of {} completed, {} failed, {} waiting retry ({}); {} timeline points, {} events\n",
            j.source,
            g.completed,
            g.total,
            g.failed,
            g.waiting_retry,
            g.status.as_str(),
            j.points.len(),
            j.marks.len()
        ));
    }
    out
}
