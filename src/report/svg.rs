//! The report's row charts as inline SVG (maud markup), as wide as the page: horizontal bars
//! with 95% intervals and bars along a window (the time series are [`super::timechart`]'s),
//! and the axes the search's fixed-size charts share. Pure; every drawn value also has a
//! `<title>` tooltip, and the page puts the numbers in a table next to each chart.

use maud::{Markup, html};

/// Every chart's width, and the room right of its plot.
pub const W: f64 = 720.0;
pub const RIGHT: f64 = 20.0;

/// Where a row chart's labels go: left of the bars while the longest (at 11px, about 6.2px a
/// character) fits in half the width; else each above its bar at full length, since a search's
/// candidates (`no_buffer mem_fraction_static=0.893 flag.cuda-graph-max-bs-decode=214`) would
/// be cut at the left edge and what tells them apart is at both ends.
struct Rows {
    /// Width of the labels' column left of the bars.
    left: f64,
    /// Height of one row.
    height: f64,
    /// From a row's top to its bar's top: the label's line when labels are above.
    bar_dy: f64,
    above: bool,
}

impl Rows {
    fn new<'a>(labels: impl Iterator<Item = &'a str>, bar_height: f64) -> Rows {
        let longest = labels.map(|l| l.chars().count()).max().unwrap_or(0);
        let left = (longest as f64 * 6.2 + 12.0).max(80.0);
        if left <= 340.0 {
            Rows {
                left,
                height: bar_height,
                bar_dy: 0.0,
                above: false,
            }
        } else {
            Rows {
                left: 12.0,
                height: bar_height + 14.0,
                bar_dy: 14.0,
                above: true,
            }
        }
    }

    /// A row's label: right-aligned before its bar, or above it.
    fn label(&self, y: f64, text: &str) -> Markup {
        html! {
            @if self.above {
                text.label x="0" y=(y + 11.0) { (text) }
            } @else {
                text.label x=(self.left - 6.0) y=(y + 15.0) text-anchor="end" { (text) }
            }
        }
    }
}

/// A tick-friendly upper bound at or above `x`: a power of ten times 1, 1.5, 2, 2.5, 3, 4, 5, 6
/// or 8, so the data fills most of the axis and its quarter ticks stay round.
pub fn nice_max(x: f64) -> f64 {
    if x <= 0.0 || !x.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(x.log10().floor());
    for m in [1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0] {
        if m * p >= x {
            return m * p;
        }
    }
    10.0 * p
}

/// `1234.5` as `1235`, `12.345` as `12.3`, `0.01234` as `0.0123`: short labels.
pub fn short(x: f64) -> String {
    let a = x.abs();
    if a == 0.0 {
        "0".to_string()
    } else if a >= 100.0 {
        format!("{x:.0}")
    } else if a >= 10.0 {
        format!("{x:.1}")
    } else if a >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

/// An axis tick: [`short`] without trailing zeros (`0.5`, `45`, `1`), as ticks are round.
pub(super) fn tick(x: f64) -> String {
    let s = short(x);
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// One horizontal bar.
pub struct Bar {
    pub label: String,
    pub value: f64,
    /// A 95% interval drawn as a whisker.
    pub interval: Option<(f64, f64)>,
    /// CSS class of the bar (`winner`, `pruned`, `failed`).
    pub class: &'static str,
    /// What the bar says when there is no value (`failed`).
    pub note: Option<String>,
}

/// Where a share of a row chart's plot falls, as an SVG length.
fn pct(f: f64) -> String {
    format!("{:.3}%", f * 100.0)
}

/// From the top of a row chart's plot to its first row.
const ROWS_TOP: f64 = 6.0;

/// A row chart as wide as the page: its labels in a column as wide as the longest needs (or
/// above each row, in the plot), the plot in percentages of the rest, text at its own size.
fn row_chart(
    id: &str,
    title: &str,
    unit: &str,
    layout: &Rows,
    h: f64,
    labels: Markup,
    plot: Markup,
) -> Markup {
    html! {
        figure.rchart {
            figcaption { span.title { (title) } " " span.unit { (unit) } }
            div.plot {
                @if !layout.above {
                    svg.labels width=(layout.left) height=(h) aria-hidden="true" { (labels) }
                }
                svg.chart id=(id) width="100%" height=(h) role="img" aria-label=(title) {
                    @if layout.above { (labels) }
                    (plot)
                }
            }
        }
    }
}

/// Horizontal bars on one axis from zero, labelled on the left.
pub fn bars(id: &str, title: &str, unit: &str, rows: &[Bar]) -> Markup {
    let layout = Rows::new(rows.iter().map(|r| r.label.as_str()), 26.0);
    let row_h = layout.height;
    let axis_y = ROWS_TOP + row_h * rows.len() as f64;
    let h = axis_y + 22.0;
    let max = nice_max(
        rows.iter()
            .map(|r| r.interval.map_or(r.value, |(_, hi)| hi.max(r.value)))
            .fold(0.0, f64::max),
    );
    // The last tenth is room for the value beside the longest bar.
    let x = |v: f64| pct(0.9 * (v / max).clamp(0.0, 1.0));
    let labels = html! {
        @for (i, r) in rows.iter().enumerate() {
            (layout.label(ROWS_TOP + row_h * i as f64, &r.label))
        }
    };
    let plot = html! {
        @for i in 0..=4 {
            @let v = max * i as f64 / 4.0;
            line.grid x1=(x(v)) x2=(x(v)) y1="0" y2=(axis_y) {}
            text.tick x=(x(v)) y=(axis_y + 16.0) text-anchor=(if i == 0 { "start" } else { "middle" }) { (tick(v)) }
        }
        @for (i, r) in rows.iter().enumerate() {
            @let y = ROWS_TOP + row_h * i as f64 + layout.bar_dy;
            @let row_h = row_h - layout.bar_dy;
            @if let Some(note) = &r.note {
                text.note x="4" y=(y + 15.0) { (note) }
            } @else {
                rect class=(r.class) x="0" y=(y + 4.0) width=(x(r.value)) height=(row_h - 8.0) {
                    title { (r.label) ": " (short(r.value)) " " (unit)
                        @if let Some((lo, hi)) = r.interval { " [" (short(lo)) ", " (short(hi)) "]" } }
                }
                @if let Some((lo, hi)) = r.interval {
                    line.whisker x1=(x(lo)) x2=(x(hi)) y1=(y + row_h / 2.0) y2=(y + row_h / 2.0) {}
                    line.whisker x1=(x(lo)) x2=(x(lo)) y1=(y + 7.0) y2=(y + row_h - 7.0) {}
                    line.whisker x1=(x(hi)) x2=(x(hi)) y1=(y + 7.0) y2=(y + row_h - 7.0) {}
                }
                text.value x=(x(r.interval.map_or(r.value, |(_, hi)| hi.max(r.value)))) dx="4" y=(y + 15.0) { (short(r.value)) }
            }
        }
    };
    row_chart(id, title, unit, &layout, h, labels, plot)
}

/// One candidate's run along the measured window: pruned ones stop at their first window.
pub struct Span {
    pub label: String,
    pub end_s: f64,
    pub class: &'static str,
    pub note: String,
}

/// A chart's value axis from 0 to `max`: five grid lines across, each with its value at
/// `left`; `y` places a value.
pub fn value_grid(left: f64, max: f64, y: impl Fn(f64) -> f64) -> Markup {
    html! {
        @for i in 0..=4 {
            @let v = max * i as f64 / 4.0;
            line.grid x1=(left) x2=(W - RIGHT) y1=(y(v)) y2=(y(v)) {}
            text.tick x=(left - 4.0) y=(y(v) + 4.0) text-anchor="end" { (tick(v)) }
        }
    }
}

/// The sweep's candidates along the measured window, with where pruning stopped them.
pub fn spans(
    id: &str,
    title: &str,
    window_s: f64,
    first_window_s: Option<f64>,
    rows: &[Span],
) -> Markup {
    let layout = Rows::new(rows.iter().map(|r| r.label.as_str()), 24.0);
    let row_h = layout.height;
    let axis_y = ROWS_TOP + row_h * rows.len() as f64;
    // Below the ticks, the first window's name.
    let h = axis_y + 36.0;
    let max = window_s.max(1.0);
    // The last quarter is room for the notes beside the bars.
    let share = |v: f64| 0.75 * (v / max).clamp(0.0, 1.0);
    let x = |v: f64| pct(share(v));
    let labels = html! {
        @for (i, r) in rows.iter().enumerate() {
            (layout.label(ROWS_TOP + row_h * i as f64, &r.label))
        }
    };
    let plot = html! {
        @for i in 0..=4 {
            @let v = max * i as f64 / 4.0;
            line.grid x1=(x(v)) x2=(x(v)) y1="0" y2=(axis_y) {}
            text.tick x=(x(v)) y=(axis_y + 16.0) text-anchor=(if i == 0 { "start" } else { "middle" }) { (tick(v)) "s" }
        }
        @if let Some(f) = first_window_s {
            line.mark.trouble x1=(x(f)) x2=(x(f)) y1="0" y2=(axis_y) {
                title { "first window: " (short(f)) " s" }
            }
            text.tick x=(x(f)) y=(axis_y + 30.0) text-anchor="middle" { "first window" }
        }
        @for (i, r) in rows.iter().enumerate() {
            @let y = ROWS_TOP + row_h * i as f64 + layout.bar_dy;
            @let row_h = row_h - layout.bar_dy;
            // A candidate that ran no time still shows a sliver where it stopped.
            @let end = pct(share(r.end_s).max(0.003));
            rect class=(r.class) x="0" y=(y + 4.0) width=(end) height=(row_h - 8.0) {
                title { (r.label) ": " (r.note) }
            }
            text.note x=(end) dx="6" y=(y + 15.0) { (r.note) }
        }
    };
    row_chart(id, title, "", &layout, h, labels, plot)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_bounds_are_round_numbers_at_or_above_the_data() {
        assert_eq!(nice_max(0.0), 1.0);
        assert_eq!(nice_max(3.2), 4.0);
        assert_eq!(nice_max(1180.0), 1500.0);
        assert_eq!(nice_max(1216.0), 1500.0);
        assert_eq!(nice_max(6100.0), 8000.0);
        assert_eq!(nice_max(100.0), 100.0);
    }

    #[test]
    fn ticks_drop_trailing_zeros() {
        let ticks: Vec<String> = [0.0, 0.5, 0.375, 45.0, 1125.0, 1.0].map(tick).into();
        assert_eq!(ticks, ["0", "0.5", "0.375", "45", "1125", "1"]);
    }

    #[test]
    fn a_bar_chart_escapes_labels_and_tells_each_value() {
        let svg = bars(
            "t",
            "tok/s",
            "tok/s/GPU",
            &[Bar {
                label: "<b>".into(),
                value: 120.0,
                interval: Some((110.0, 130.0)),
                class: "winner",
                note: None,
            }],
        )
        .into_string();
        assert!(svg.contains("&lt;b&gt;: 120 tok/s/GPU [110, 130]"), "{svg}");
        assert!(!svg.contains("<b>"));
    }

    #[test]
    fn labels_too_long_for_the_left_go_above_their_bars_whole() {
        let label = "no_buffer mem_fraction_static=0.893 flag.cuda-graph-max-bs-decode=214";
        let row = |label: &str| Bar {
            label: label.into(),
            value: 1215.0,
            interval: None,
            class: "winner",
            note: None,
        };
        let long = bars("t", "tok/s", "tok/s/GPU", &[row(label)]).into_string();
        assert!(
            long.contains(&format!(
                r#"<text class="label" x="0" y="17">{label}</text>"#
            )),
            "{long}"
        );
        let short = bars("t", "tok/s", "tok/s/GPU", &[row("no_buffer")]).into_string();
        assert!(
            short.contains(r#"text-anchor="end">no_buffer</text>"#),
            "{short}"
        );
    }
}
