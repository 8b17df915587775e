//! The search in `fleet report`: for an adaptive sweep, every explored point over each axis of
//! its space (throughput against that axis, failures marked by kind along the bottom, `--slo`
//! breakers hollow) and the best value found after each trial. Pure: a view of the sweep file,
//! drawn as inline SVG, with the numbers in a table beside the charts.

use maud::{Markup, html};
use serde::Serialize;

use super::svg::{RIGHT, W, nice_max, short, value_grid};
use crate::sweep::file::SweepFile;
use crate::sweep::range::Domain;
use crate::sweep::rank::{Failure, Outcome};
use crate::sweep::search::SearchSpec;

/// What became of one explored point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Measured,
    Pruned,
    /// Measured, but broke a `--slo` limit.
    Breaks,
    OutOfMemory,
    /// Never started: predicted not to fit.
    Skipped,
    Failed,
}

/// One explored point: its coordinate on each axis (a list value as its index) and figure.
#[derive(Debug, Clone, Serialize)]
pub struct Explored {
    pub label: String,
    pub at: Vec<f64>,
    /// Output tok/s per GPU; `None` when it failed.
    pub tok_s: Option<f64>,
    pub kind: Kind,
    pub winner: bool,
}

/// One axis of the space: a range (`lo`, `hi`, log scale) or a list of values.
#[derive(Debug, Clone, Serialize)]
pub struct AxisView {
    pub key: String,
    pub lo: f64,
    pub hi: f64,
    pub log: bool,
    /// The values of a list axis, whose coordinates index them.
    pub values: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SearchView {
    pub axes: Vec<AxisView>,
    /// In the order the trials finished.
    pub points: Vec<Explored>,
    /// The best figure kept after each trial (1-based); failures and breakers leave it as it
    /// was.
    pub best: Vec<(usize, f64)>,
    pub stopped: Option<String>,
}

/// The view of an adaptive search; `None` for a grid, whose table already shows every point.
pub fn view(file: &SweepFile, winner: Option<&str>) -> Option<SearchView> {
    let SearchSpec::Adaptive { dims, .. } = &file.spec.search else {
        return None;
    };
    let axes: Vec<AxisView> = dims
        .iter()
        .map(|d| match &d.domain {
            Domain::List { values } => AxisView {
                key: d.key.clone(),
                lo: 0.0,
                hi: values.len().saturating_sub(1) as f64,
                log: false,
                values: values.clone(),
            },
            Domain::Range { lo, hi, log, .. } => AxisView {
                key: d.key.clone(),
                lo: *lo,
                hi: *hi,
                log: *log,
                values: Vec::new(),
            },
        })
        .collect();
    let mut points = Vec::new();
    let mut best = Vec::new();
    let mut top: Option<f64> = None;
    for (i, t) in file.trials.iter().enumerate() {
        let at = axes
            .iter()
            .map(|a| {
                let v = t
                    .candidate
                    .settings
                    .iter()
                    .find(|(k, _)| *k == a.key)
                    .map(|(_, v)| v.as_str())?;
                match a.values.iter().position(|x| x == v) {
                    Some(p) => Some(p as f64),
                    None => v.parse().ok(),
                }
            })
            .collect::<Option<Vec<f64>>>();
        let Some(at) = at else { continue };
        let measured = t.outcome.measured();
        let kind = match &t.outcome {
            Outcome::Ok(m) if file.spec.slo.keeps(m) => Kind::Measured,
            Outcome::Ok(_) => Kind::Breaks,
            Outcome::Pruned(_) => Kind::Pruned,
            Outcome::Failed {
                kind: Failure::OutOfMemory,
                ..
            } => Kind::OutOfMemory,
            Outcome::Failed {
                kind: Failure::Predicted,
                ..
            } => Kind::Skipped,
            Outcome::Failed { .. } => Kind::Failed,
        };
        if kind == Kind::Measured {
            let v = measured.map_or(0.0, |m| m.output_tok_s_per_gpu);
            top = Some(top.map_or(v, |b| b.max(v)));
        }
        if let Some(b) = top {
            best.push((i + 1, b));
        }
        points.push(Explored {
            label: match t.candidate.repeat {
                0 => t.candidate.label(),
                _ => format!(
                    "{} (window {})",
                    t.candidate.label(),
                    t.candidate.repeat + 1
                ),
            },
            at,
            tok_s: measured.map(|m| m.output_tok_s_per_gpu),
            kind,
            winner: winner == Some(t.candidate.label().as_str()),
        });
    }
    Some(SearchView {
        axes,
        points,
        best,
        stopped: file.search.stopped.map(|s| s.to_string()),
    })
}

const H: f64 = 260.0;
const LEFT: f64 = 60.0;
const TOP: f64 = 28.0;
const BOTTOM: f64 = 40.0;

fn class(k: Kind) -> &'static str {
    match k {
        Kind::Measured => "measured",
        Kind::Pruned => "pruned",
        Kind::Breaks => "breaks",
        Kind::OutOfMemory => "oom",
        Kind::Skipped => "skipped",
        Kind::Failed => "failed",
    }
}

/// Where `v` lies along `a`, 0 to 1: a list's values at the middles of equal slots, so the
/// first and last are not drawn (nor their names cut) at the chart's edges.
fn unit(a: &AxisView, v: f64) -> f64 {
    let u = if !a.values.is_empty() {
        (v + 0.5) / a.values.len() as f64
    } else if a.log && a.lo > 0.0 && v > 0.0 {
        (v / a.lo).ln() / (a.hi / a.lo).ln()
    } else if a.hi > a.lo {
        (v - a.lo) / (a.hi - a.lo)
    } else {
        0.5
    };
    u.clamp(0.0, 1.0)
}

/// Throughput against one axis; a failed point sits on the bottom line, a cross for OOM.
fn scatter(id: &str, a: &AxisView, points: &[Explored], d: usize) -> Markup {
    let max = nice_max(points.iter().filter_map(|p| p.tok_s).fold(0.0, f64::max));
    let x = |v: f64| LEFT + (W - LEFT - RIGHT) * unit(a, v);
    let y = |v: f64| TOP + (H - TOP - BOTTOM) * (1.0 - (v / max).clamp(0.0, 1.0));
    let base = H - BOTTOM;
    let ticks: Vec<(f64, String)> = if a.values.is_empty() {
        (0..=4)
            .map(|i| {
                let u = i as f64 / 4.0;
                let v = if a.log && a.lo > 0.0 {
                    a.lo * (a.hi / a.lo).powf(u)
                } else {
                    a.lo + (a.hi - a.lo) * u
                };
                (v, short(v))
            })
            .collect()
    } else {
        a.values
            .iter()
            .enumerate()
            .map(|(i, v)| (i as f64, v.clone()))
            .collect()
    };
    let title = format!("Output tok/s per GPU against {}", a.key);
    html! {
        svg.chart id=(id) viewBox={"0 0 " (W) " " (H)} role="img" aria-label=(title) {
            text.title x="4" y="16" { (title) }
            (value_grid(LEFT, max, y))
            @for (v, t) in &ticks {
                text.tick x=(x(*v)) y=(base + 16.0) text-anchor="middle" { (t) }
            }
            text.tick x=(W - RIGHT) y=(H - 6.0) text-anchor="end" { (a.key) @if a.log { " (log)" } }
            @for p in points {
                @let cx = x(p.at[d]);
                @match p.tok_s {
                    Some(v) => {
                        circle class=(class(p.kind)) cx=(cx) cy=(y(v)) r=(if p.winner { 6.0 } else { 4.0 }) {
                            title { (p.label) ": " (short(v)) " tok/s/GPU" @if p.kind == Kind::Breaks { ", breaks the SLO" } @if p.kind == Kind::Pruned { ", pruned" } @if p.winner { ", winner" } }
                        }
                    }
                    None => {
                        path class=(class(p.kind)) d={"M" (cx - 4.0) " " (base - 4.0) " l8 8 m0 -8 l-8 8"} {
                            title { (p.label) ": " (match p.kind { Kind::OutOfMemory => "out of memory", Kind::Skipped => "predicted not to fit", _ => "failed" }) }
                        }
                    }
                }
            }
        }
    }
}

/// The best figure kept after each trial, as steps.
fn progress(points: &[(usize, f64)], trials: usize) -> Markup {
    let max = nice_max(points.iter().map(|p| p.1).fold(0.0, f64::max));
    let n = trials.max(1) as f64;
    let x = |i: usize| LEFT + (W - LEFT - RIGHT) * (i as f64 / n);
    let y = |v: f64| TOP + (H - TOP - BOTTOM) * (1.0 - (v / max).clamp(0.0, 1.0));
    // A step line: along at the best so far, up where a trial beat it, on to the last trial.
    let mut d = String::new();
    for (k, (i, v)) in points.iter().enumerate() {
        if k == 0 {
            d.push_str(&format!("M{:.1} {:.1} ", x(*i), y(*v)));
        } else {
            d.push_str(&format!("H{:.1} V{:.1} ", x(*i), y(*v)));
        }
    }
    if !points.is_empty() {
        d.push_str(&format!("H{:.1}", x(trials)));
    }
    let title = "Best output tok/s per GPU found, by trial";
    html! {
        svg.chart id="search-best" viewBox={"0 0 " (W) " " (H)} role="img" aria-label=(title) {
            text.title x="4" y="16" { (title) }
            (value_grid(LEFT, max, y))
            @for i in 0..=4 {
                @let t = (trials * i).div_ceil(4);
                text.tick x=(x(t)) y=(H - BOTTOM + 16.0) text-anchor="middle" { (t) }
            }
            text.tick x=(W - RIGHT) y=(H - 6.0) text-anchor="end" { "trials" }
            path.best d=(d) fill="none" {}
            @for (i, v) in points {
                circle.measured cx=(x(*i)) cy=(y(*v)) r="2" { title { "after trial " (i) ": " (short(*v)) } }
            }
        }
    }
}

pub fn html(v: &SearchView) -> Markup {
    let legend = "filled: measured; grey: pruned after its first window; hollow: breaks --slo; red cross on the axis: out of memory; light grey cross: predicted not to fit, never started; grey cross: other failure; large: winner";
    html! {
        h3 { "Search" }
        @if let Some(s) = &v.stopped { p.meta { "The search stopped: " (s) "." } }
        p.meta { (legend) }
        @for (d, a) in v.axes.iter().enumerate() {
            (scatter(&format!("search-axis-{d}"), a, &v.points, d))
        }
        (progress(&v.best, v.points.len()))
        table #search-table {
            thead { tr { th { "#" } th { "candidate" } th { "tok/s/GPU" } th { "outcome" } th { "best so far" } } }
            tbody {
                @for (i, p) in v.points.iter().enumerate() {
                    tr class=(if p.winner { "winner" } else { "" }) {
                        td { (i + 1) }
                        td { (p.label) }
                        td { @if let Some(t) = p.tok_s { (short(t)) } @else { "-" } }
                        td { (class(p.kind)) }
                        td { @match v.best.iter().find(|(n, _)| *n == i + 1) { Some((_, b)) => (short(*b)), None => "-" } }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_axis_places_its_ends_and_middle() {
        let a = AxisView {
            key: "flag.cuda-graph-max-bs-decode".into(),
            lo: 16.0,
            hi: 256.0,
            log: true,
            values: vec![],
        };
        assert_eq!(unit(&a, 16.0), 0.0);
        assert!((unit(&a, 64.0) - 0.5).abs() < 1e-9);
        assert_eq!(unit(&a, 999.0), 1.0);
    }

    #[test]
    fn a_list_axis_puts_its_values_in_the_middles_of_equal_slots() {
        let a = AxisView {
            key: "server.mamba_strategy".into(),
            lo: 0.0,
            hi: 1.0,
            log: false,
            values: vec!["no_buffer".into(), "extra_buffer".into()],
        };
        assert_eq!((unit(&a, 0.0), unit(&a, 1.0)), (0.25, 0.75));
    }

    #[test]
    fn the_best_line_starts_at_the_first_measured_trial_and_only_goes_right() {
        let svg = progress(&[(9, 1215.0), (10, 1215.0), (12, 1300.0)], 12).into_string();
        let d = svg
            .split(" d=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        // SVG repeats a command for bare numbers after it ("H593 64.5" is two H moves, the
        // second back to x = 64.5): after the first move, every number has its letter.
        let moves: Vec<&str> = d.split_whitespace().skip(2).collect();
        assert!(moves.iter().all(|m| m.starts_with(['H', 'V'])), "{d}");
        let xs: Vec<f64> = std::iter::once(d.split_whitespace().next().unwrap())
            .chain(moves.iter().copied().filter(|m| m.starts_with('H')))
            .map(|m| m[1..].parse().unwrap())
            .collect();
        assert!(xs.windows(2).all(|w| w[0] <= w[1]), "{d}");
        assert_eq!(xs.first(), Some(&(LEFT + (W - LEFT - RIGHT) * 9.0 / 12.0)));
    }
}
