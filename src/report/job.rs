//! The job's part of the report page: its totals, and its timeline as charts on which each
//! instance keeps one colour, rates are taken over a recent window, and events are marked.
//! Pure: the job's view in, markup out.

use std::collections::BTreeMap;

use maud::{Markup, html};

use crate::generate::progress::Status;
use crate::generate::timeline::{InstancePoint, Mark, MarkKind, Point};

use super::page::{JobView, completions_per_minute, sample};
use super::svg::short;
use super::timechart::{Event, Series, since, time_chart};

/// Rows a table of a time series shows at most.
const TABLE_ROWS: usize = 24;

/// Instances' colours: distinct hues first, then lighter tones of them; a fleet of more
/// instances than this reuses them in the same order.
pub const PALETTE: [&str; 16] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
    "#bcbd22", "#7f7f7f", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94",
];
/// The whole job's series are near-black and grey, so no instance's colour means two things.
const FLEET: &str = "#222222";
const IDEAL: &str = "#888888";
const RETRY: &str = "#666666";

/// The longest window a rate is taken over.
const MAX_RATE_WINDOW_S: f64 = 30.0;

/// Each instance's colour on every chart of a page: by its place among the sorted names of all
/// the instances in the timeline, so that it does not hang on which series a chart draws first.
#[derive(Debug, Clone, PartialEq)]
pub struct Colours(BTreeMap<String, &'static str>);

impl Colours {
    pub fn of(points: &[Point]) -> Colours {
        let names: std::collections::BTreeSet<&str> = points
            .iter()
            .flat_map(|p| p.instances.iter().map(|i| i.name.as_str()))
            .collect();
        Colours(
            names
                .into_iter()
                .enumerate()
                .map(|(i, n)| (n.to_string(), PALETTE[i % PALETTE.len()]))
                .collect(),
        )
    }

    pub fn get(&self, name: &str) -> &'static str {
        self.0.get(name).copied().unwrap_or(IDEAL)
    }

    /// The instances' names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }
}

/// Seconds a rate is taken over: 30 s, or about a twelfth of a shorter job, so that a job of a
/// minute still shows its changes instead of its average since the start.
pub fn rate_window(points: &[Point]) -> f64 {
    match (points.first(), points.last()) {
        // Rounded up, so that the charts' titles say `2 s`, not `1.99 s`.
        (Some(a), Some(b)) => super::svg::nice_max((b.t - a.t) / 12.0).min(MAX_RATE_WINDOW_S),
        _ => MAX_RATE_WINDOW_S,
    }
}

/// Each instance's output tok/s at each point (`None` where the point does not have it): the
/// tokens it streamed over the last `window` seconds (or since the point before, when points
/// are further apart), over that time. So a server that died reads 0 one window later; the
/// rate the job recorded ([`InstancePoint::output_tok_s`]) fell slowly, its own window being a
/// minute, or the whole run at the end. A timeline of an older fleet has no token counts: its
/// recorded rates are used, and a server that is down reads 0.
pub fn windowed_rates(points: &[Point], window: f64) -> BTreeMap<String, Vec<Option<f64>>> {
    let colours = Colours::of(points);
    colours
        .names()
        .map(|name| {
            let at: Vec<Option<&InstancePoint>> = points
                .iter()
                .map(|p| p.instances.iter().find(|i| i.name == name))
                .collect();
            (name.to_string(), rates_of(points, &at, window))
        })
        .collect()
}

/// One instance's rates; `at[k]` is its figures at `points[k]`.
fn rates_of(points: &[Point], at: &[Option<&InstancePoint>], window: f64) -> Vec<Option<f64>> {
    // Tokens counted across the job: each run (`--resume`) counts from 0 again, so a count
    // below the one before starts a new run's; a point without a count starts over.
    let mut total: Vec<Option<u64>> = Vec::with_capacity(at.len());
    // The instance's own count and the job's total at the last point that had a count.
    let mut prev: Option<(u64, u64)> = None;
    for i in at {
        match i.map(|i| i.output_tokens) {
            // Not in this point: what came before still counts.
            None => total.push(None),
            Some(None) => {
                prev = None;
                total.push(None);
            }
            Some(Some(n)) => {
                let sum = match prev {
                    Some((count, sum)) if n >= count => sum + (n - count),
                    Some((_, sum)) => sum + n,
                    None => n,
                };
                prev = Some((n, sum));
                total.push(Some(sum));
            }
        }
    }
    (0..at.len())
        .map(|k| {
            let here = at[k]?;
            let fallback = if here.healthy { here.output_tok_s } else { 0.0 };
            let Some(n) = total[k] else {
                return Some(fallback);
            };
            // The earliest point inside the window with a count, else the one just before.
            let t = points[k].t;
            let from = (0..k)
                .find(|&j| points[j].t >= t - window && total[j].is_some())
                .or_else(|| (0..k).rev().find(|&j| total[j].is_some()));
            Some(match from {
                Some(j) if points[j].t < t => {
                    n.saturating_sub(total[j].unwrap_or(0)) as f64 / (t - points[j].t)
                }
                _ => fallback,
            })
        })
        .collect()
}

/// What an event is called beside its line: short, as the table below the charts has the rest.
/// `run` counts the job's runs so far (its `started` marks).
fn label(m: &Mark, run: usize) -> String {
    match m.kind {
        // The first start is the chart's left edge.
        MarkKind::Started if run <= 1 => String::new(),
        MarkKind::Started => format!("run {run} (--resume)"),
        MarkKind::InstanceDown => format!("{} down", m.subject),
        MarkKind::InstanceUp => format!("{} up", m.subject),
        MarkKind::HostLost => format!("{} lost", m.subject),
        MarkKind::HostBack => format!("{} back", m.subject),
        // One a shard: a long job has hundreds, and they are no news.
        MarkKind::Uploaded => String::new(),
        k => k.as_str().to_string(),
    }
}

/// The job's marks as the charts' events. Labels closer than a sixtieth of the time axis
/// (`span` seconds) would print over each other: the first of such a run of marks says them
/// all, and the others draw only their lines.
pub fn events(marks: &[Mark], t0: f64, span: f64) -> Vec<Event> {
    let mut out: Vec<Event> = Vec::with_capacity(marks.len());
    let mut run = 0;
    // Index of the event that labels the current group, and when the group began.
    let mut head: Option<(usize, f64)> = None;
    for m in marks {
        if m.kind == MarkKind::Started {
            run += 1;
        }
        let text = label(m, run);
        let detail = format!(
            "{}: {} {} {}",
            since(m.t - t0),
            if m.kind == MarkKind::Started && run > 1 {
                "run resumed (--resume):"
            } else {
                m.kind.as_str()
            },
            m.subject,
            m.detail
        );
        let mut own = text.clone();
        if !text.is_empty() {
            match head {
                Some((h, t)) if m.t - t < span / 60.0 => {
                    let group = &mut out[h];
                    let n = group.label.matches(", ").count() + 1;
                    if n < 3 {
                        group.label = format!("{}, {text}", group.label);
                    } else if n == 3 {
                        group.label.push_str(", …");
                    }
                    group.trouble |= m.kind.is_trouble();
                    own = String::new();
                }
                _ => head = Some((out.len(), m.t)),
            }
        }
        out.push(Event {
            t: m.t,
            label: own,
            detail: detail.trim().to_string(),
            trouble: m.kind.is_trouble(),
        });
    }
    out
}

/// One series per instance of `f` over the timeline's points, in the instance's colour.
fn per_instance(
    j: &JobView,
    colours: &Colours,
    suffix: &str,
    dashed: bool,
    f: impl Fn(usize, &InstancePoint) -> Option<f64>,
) -> Vec<Series> {
    colours
        .names()
        .map(|n| Series {
            name: format!("{n}{suffix}"),
            points: j
                .points
                .iter()
                .enumerate()
                .filter_map(|(k, p)| {
                    let i = p.instances.iter().find(|i| i.name == n)?;
                    Some((p.t, f(k, i)?))
                })
                .collect(),
            colour: colours.get(n),
            dashed,
            instance: Some(n.to_string()),
        })
        .filter(|s| !s.points.is_empty())
        .collect()
}

fn whole(name: &str, colour: &'static str, dashed: bool, points: Vec<(f64, f64)>) -> Series {
    Series {
        name: name.into(),
        points,
        colour,
        dashed,
        instance: None,
    }
}

fn opt(v: Option<f64>) -> String {
    v.map_or("-".into(), short)
}

/// The job's section of the page.
pub fn html(j: &JobView) -> Markup {
    let p = &j.progress;
    let t0 = j
        .points
        .first()
        .map(|p| p.t)
        .into_iter()
        .chain(j.marks.first().map(|m| m.t))
        .fold(f64::INFINITY, f64::min);
    let t0 = if t0.is_finite() { t0 } else { 0.0 };
    let t_end = j
        .points
        .last()
        .map(|p| p.t)
        .into_iter()
        .chain(j.marks.last().map(|m| m.t))
        .fold(t0, f64::max);
    let colours = Colours::of(&j.points);
    let window = rate_window(&j.points);
    let rates = windowed_rates(&j.points, window);
    let rate = |n: &str, k: usize| rates.get(n).and_then(|r| r[k]);
    let fleet: Vec<(f64, f64)> = j
        .points
        .iter()
        .enumerate()
        .map(|(k, pt)| {
            let sum = pt.instances.iter().filter_map(|i| rate(&i.name, k)).sum();
            (pt.t, sum)
        })
        .collect();
    let mut throughput = vec![whole("fleet", FLEET, false, fleet.clone())];
    throughput.extend(per_instance(j, &colours, "", false, |k, i| {
        rate(&i.name, k)
    }));
    if let (Some(ideal), Some(first), Some(last)) =
        (j.ideal_tok_s, j.points.first(), j.points.last())
    {
        throughput.push(whole(
            "sweep winner × instances",
            IDEAL,
            true,
            vec![(first.t, ideal), (last.t, ideal)],
        ));
    }
    let mut load = per_instance(j, &colours, " in flight", false, |_, i| {
        Some(f64::from(i.in_flight))
    });
    load.extend(per_instance(j, &colours, " queued", true, |_, i| {
        i.queued.filter(|_| i.healthy)
    }));
    // A down instance's last /metrics reading is stale: its gauges stop where it went down.
    let usage = per_instance(j, &colours, "", false, |_, i| {
        i.token_usage.filter(|_| i.healthy).map(|u| u * 100.0)
    });
    let cpm = vec![whole(
        "completions/min",
        FLEET,
        false,
        completions_per_minute(&j.points),
    )];
    let outcomes = vec![
        whole(
            "failed for good",
            FLEET,
            false,
            j.points.iter().map(|p| (p.t, p.failed as f64)).collect(),
        ),
        whole(
            "waiting retry",
            RETRY,
            true,
            j.points
                .iter()
                .map(|p| (p.t, p.waiting_retry as f64))
                .collect(),
        ),
    ];
    let eta = vec![whole(
        "ETA",
        FLEET,
        false,
        j.points
            .iter()
            .filter_map(|p| Some((p.t, p.eta_hours?)))
            .collect(),
    )];
    let events = events(&j.marks, t0, (t_end - t0).max(1.0));
    let last_rate = |n: &str| {
        let k = j.points.len().checked_sub(1)?;
        rate(n, k)
    };
    let ended = !matches!(p.status, Status::Running | Status::Paused);
    let window_text = format!("{} s", super::svg::tick(window));
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
            thead { tr { th { "instance" } th { "healthy" } th { "completed" }
                // An ended run's figure is its mean over the run: a server lost early still has one.
                th { @if ended { "mean tok/s" } @else { "tok/s" } }
                @if !j.points.is_empty() { th { "tok/s, last " (window_text) } }
                th { "in flight" } th { "limit" } th { "server cap" } } }
            tbody { @for i in &p.instances {
                @let name = i.name.to_string();
                tr data-instance=(name) {
                    td { i.swatch style={ "--c:" (colours.get(&name)) } {} (name) }
                    td { (if i.healthy { "yes" } else { "no" }) }
                    td { (i.completed) }
                    td { (short(i.output_tok_s)) }
                    @if !j.points.is_empty() { td.last-rate { (opt(last_rate(&name))) } }
                    td { (i.in_flight) } td { (i.concurrency) }
                    td { @if let Some(c) = i.server_cap { (c) } @else { "-" } }
                }
            } }
        }
        @if j.points.is_empty() {
            p { "No timeline: the job was run by a fleet that did not record timeline.jsonl." }
        } @else {
            h3 { "Over time" }
            ul.legend #instance-legend {
                @for n in colours.names() {
                    li data-instance=(n) { i.swatch style={ "--c:" (colours.get(n)) } {} (n) }
                }
                li { i.swatch style={ "--c:" (FLEET) } {} "fleet (the whole job)" }
            }
            div.charts {
                (time_chart("job-throughput", &format!("Output tok/s over the last {window_text}, fleet and per instance"), "tok/s", t0, &throughput, &events))
                (time_chart("job-load", "Requests in flight (solid) and queued (dashed), per instance", "requests", t0, &load, &events))
                @if !usage.is_empty() {
                    (time_chart("job-token-usage", "KV token usage, per instance (sglang:token_usage)", "% of the pool", t0, &usage, &events))
                }
                (time_chart("job-completions", "Completions per minute", "per min", t0, &cpm, &events))
                (time_chart("job-failures", "Failed prompts and retries", "prompts", t0, &outcomes, &events))
                @if !eta[0].points.is_empty() {
                    (time_chart("job-eta", "ETA", "hours", t0, &eta, &events))
                }
            }
            details open {
                summary { "The timeline's numbers (" (rows.len()) " of " (j.points.len()) " points)" }
                table #timeline-table {
                    thead { tr { th { "s" } th { "completed" } th { "failed" } th { "retry" } th { "tok/s, last " (window_text) } th { "ETA h" } } }
                    tbody { @for (k, pt) in rows.iter().map(|pt| (j.points.iter().position(|q| std::ptr::eq(q, *pt)).unwrap_or(0), pt)) {
                        tr { td { (short(pt.t - t0)) } td { (pt.completed) } td { (pt.failed) } td { (pt.waiting_retry) } td { (short(fleet[k].1)) } td { (opt(pt.eta_hours)) } }
                    } }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn inst(name: &str, healthy: bool, tokens: Option<u64>, recorded: f64) -> InstancePoint {
        InstancePoint {
            name: name.into(),
            healthy,
            in_flight: 0,
            concurrency: 8,
            server_cap: None,
            output_tok_s: recorded,
            output_tokens: tokens,
            running: None,
            queued: None,
            token_usage: None,
        }
    }

    fn point(t: f64, instances: Vec<InstancePoint>) -> Point {
        Point {
            t,
            completed: 0,
            failed: 0,
            waiting_retry: 0,
            rate_per_sec: 0.0,
            eta_hours: None,
            instances,
        }
    }

    #[test]
    fn a_server_that_died_reads_zero_one_window_later() {
        // `b` streams 100 tok/s until it dies at 20 s; the job recorded a slowly falling rate.
        let points: Vec<Point> = (0..=6)
            .map(|k| {
                let t = 10.0 * k as f64;
                let b_tokens = (t.min(20.0) * 100.0) as u64;
                point(
                    t,
                    vec![
                        inst("a", true, Some((t * 50.0) as u64), 50.0),
                        inst("b", t < 25.0, Some(b_tokens), b_tokens as f64 / t.max(1.0)),
                    ],
                )
            })
            .collect();
        let r = windowed_rates(&points, 10.0);
        assert_eq!(
            r["b"],
            [
                Some(0.0),
                Some(100.0),
                Some(100.0),
                Some(0.0),
                Some(0.0),
                Some(0.0),
                Some(0.0)
            ]
        );
        assert!(r["a"][1..].iter().all(|x| *x == Some(50.0)), "{:?}", r["a"]);
        // Over 30 s: 40 s in, the window holds b's last 10 s; 60 s in, none of them.
        assert_eq!(windowed_rates(&points, 30.0)["b"][4], Some(1000.0 / 30.0));
        assert_eq!(windowed_rates(&points, 30.0)["b"][6], Some(0.0));
    }

    #[test]
    fn a_resumed_run_counting_from_zero_again_is_no_negative_rate() {
        let points = vec![
            point(0.0, vec![inst("a", true, Some(0), 0.0)]),
            point(10.0, vec![inst("a", true, Some(1000), 90.0)]),
            // The job stopped; the resumed run counts its own tokens.
            point(110.0, vec![inst("a", true, Some(0), 0.0)]),
            point(120.0, vec![inst("a", true, Some(500), 50.0)]),
        ];
        assert_eq!(
            windowed_rates(&points, 30.0)["a"],
            [Some(0.0), Some(100.0), Some(0.0), Some(50.0)]
        );
    }

    #[test]
    fn an_older_timeline_without_counts_uses_its_rates_and_a_down_server_reads_zero() {
        let points = vec![
            point(0.0, vec![inst("a", true, None, 40.0)]),
            point(10.0, vec![inst("a", false, None, 35.0)]),
            point(20.0, vec![]),
        ];
        assert_eq!(
            windowed_rates(&points, 30.0)["a"],
            [Some(40.0), Some(0.0), None]
        );
    }

    #[test]
    fn the_window_is_30_s_or_a_twelfth_of_a_short_job() {
        let p = |t| point(t, vec![]);
        assert_eq!(rate_window(&[p(100.0), p(124.0)]), 2.0);
        assert_eq!(rate_window(&[p(100.0), p(123.9)]), 2.0);
        assert_eq!(rate_window(&[p(0.0), p(3600.0)]), 30.0);
    }

    #[test]
    fn an_instance_has_one_colour_by_its_sorted_name_whatever_each_point_lists() {
        let points = vec![
            point(
                0.0,
                vec![inst("c", true, None, 0.0), inst("a", true, None, 0.0)],
            ),
            point(1.0, vec![inst("b", true, None, 0.0)]),
        ];
        let c = Colours::of(&points);
        assert_eq!(
            [c.get("a"), c.get("b"), c.get("c")],
            [PALETTE[0], PALETTE[1], PALETTE[2]]
        );
        assert_eq!(c.names().collect::<Vec<_>>(), ["a", "b", "c"]);
    }

    fn mark(t: f64, kind: MarkKind, subject: &str) -> Mark {
        Mark {
            t,
            kind,
            subject: subject.into(),
            detail: "why".into(),
        }
    }

    #[test]
    fn events_are_labelled_and_close_ones_share_a_label() {
        let marks = [
            mark(0.0, MarkKind::Started, "2 instances"),
            mark(30.0, MarkKind::InstanceDown, "b"),
            mark(30.4, MarkKind::Paused, "b"),
            mark(40.0, MarkKind::Uploaded, "shard-1"),
            mark(60.0, MarkKind::Started, "2 instances"),
        ];
        let e = events(&marks, 0.0, 100.0);
        let labels: Vec<&str> = e.iter().map(|e| e.label.as_str()).collect();
        assert_eq!(labels, ["", "b down, paused", "", "", "run 2 (--resume)"]);
        assert!(e[1].trouble && !e[4].trouble);
        assert_eq!(e[2].detail, "30s: paused b why");
        assert_eq!(e[4].detail, "60s: run resumed (--resume): 2 instances why");
    }
}
