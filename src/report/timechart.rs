//! The report's time series charts: as wide as the page, whatever its width, with text at its
//! own size. Pure maud markup.
//!
//! A `viewBox` scaled to the page's width would scale the labels with it (tiny on a laptop,
//! huge on a wide screen), so only the plotted lines live in a stretched inner `<svg>`
//! (`preserveAspectRatio="none"`, strokes kept at their width by `non-scaling-stroke`); the
//! axis labels, event labels and dots are placed in percentages of the chart's real width, and
//! the y axis' labels sit in a fixed-width `<svg>` beside it.

use maud::{Markup, html};

use super::svg::{nice_max, short};

/// Height of the plotted area, and the room above it and below it (for the time axis).
const PLOT_H: f64 = 190.0;
const TOP: f64 = 8.0;
const BOTTOM: f64 = 20.0;
/// Width of the y axis' labels.
const AXIS_W: f64 = 52.0;
/// The inner plot's coordinates: time along 0..SCALE, the value down SCALE..0.
const SCALE: f64 = 1000.0;

/// A line of a time series, in its own colour.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub colour: &'static str,
    pub dashed: bool,
    /// The instance it is about, so a reader (and the tests) can tell its colour is the
    /// instance's on every chart.
    pub instance: Option<String>,
}

/// An event: a vertical line across each chart, with its label beside it and the whole of
/// what it says in its tooltip.
pub struct Event {
    pub t: f64,
    /// Drawn beside the line.
    pub label: String,
    /// The tooltip, with the time.
    pub detail: String,
    pub trouble: bool,
}

/// Seconds as `0.5s`, `42s`, `17m`, `3.5h` for time-axis ticks.
pub fn since(s: f64) -> String {
    if s < 10.0 {
        // A short job's quarter ticks are fractions of a second apart.
        let t = format!("{s:.1}");
        format!("{}s", t.strip_suffix(".0").unwrap_or(&t))
    } else if s < 120.0 {
        format!("{s:.0}s")
    } else if s < 7200.0 {
        format!("{:.0}m", s / 60.0)
    } else {
        format!("{:.1}h", s / 3600.0)
    }
}

fn pct(f: f64) -> String {
    format!("{:.3}%", f * 100.0)
}

/// Series over time since `t0` (Unix seconds), with the job's events as vertical lines.
pub fn time_chart(
    id: &str,
    title: &str,
    unit: &str,
    t0: f64,
    series: &[Series],
    events: &[Event],
) -> Markup {
    let all = series.iter().flat_map(|s| s.points.iter());
    let t_end = all
        .clone()
        .map(|p| p.0)
        .chain(events.iter().map(|e| e.t))
        .fold(t0, f64::max);
    let span = (t_end - t0).max(1.0);
    let max = nice_max(all.map(|p| p.1).fold(0.0, f64::max));
    // Where a time falls, as a share of the width; where a value falls, in pixels.
    let fx = |t: f64| ((t - t0) / span).clamp(0.0, 1.0);
    let y = |v: f64| TOP + PLOT_H * (1.0 - (v / max).clamp(0.0, 1.0));
    let h = TOP + PLOT_H + BOTTOM;
    html! {
        figure.tchart {
            figcaption { span.title { (title) } " " span.unit { (unit) } }
            div.plot {
                svg.yaxis width=(AXIS_W) height=(h) aria-hidden="true" {
                    @for i in 0..=4 {
                        @let v = max * i as f64 / 4.0;
                        text.tick x=(AXIS_W - 6.0) y=(y(v) + 4.0) text-anchor="end" { (super::svg::tick(v)) }
                    }
                }
                svg.chart id=(id) width="100%" height=(h) role="img" aria-label=(title) {
                    @for i in 0..=4 {
                        @let v = max * i as f64 / 4.0;
                        line.grid x1="0" x2="100%" y1=(y(v)) y2=(y(v)) {}
                    }
                    line.axis x1="0" x2="0" y1=(TOP) y2=(TOP + PLOT_H) {}
                    @for i in 0..=4 {
                        text.tick x=(pct(i as f64 / 4.0)) y=(TOP + PLOT_H + 15.0)
                            text-anchor=(match i { 0 => "start", 4 => "end", _ => "middle" }) { (since(span * i as f64 / 4.0)) }
                    }
                    @for e in events {
                        line class=(if e.trouble { "mark trouble" } else { "mark" }) x1=(pct(fx(e.t))) x2=(pct(fx(e.t))) y1=(TOP) y2=(TOP + PLOT_H) {
                            title { (e.detail) }
                        }
                    }
                    svg.lines x="0" y=(TOP) width="100%" height=(PLOT_H) viewBox={"0 0 " (SCALE) " " (SCALE)} preserveAspectRatio="none" overflow="visible" {
                        @for s in series {
                            @let pts = s.points.iter().map(|&(t, v)| format!("{:.1},{:.1}", fx(t) * SCALE, (1.0 - (v / max).clamp(0.0, 1.0)) * SCALE)).collect::<Vec<_>>().join(" ");
                            polyline.series points=(pts) stroke=(s.colour) stroke-dasharray=(if s.dashed { "6 4" } else { "none" })
                                vector-effect="non-scaling-stroke" data-instance=[s.instance.as_deref()] {
                                title { (s.name) }
                            }
                        }
                    }
                    // One point is no line: it is drawn as a dot, outside the stretched plot
                    // so that it stays round.
                    @for s in series {
                        @if let [(t, v)] = s.points[..] {
                            circle cx=(pct(fx(t))) cy=(y(v)) r="3" fill=(s.colour) data-instance=[s.instance.as_deref()] { title { (s.name) ": " (short(v)) } }
                        }
                    }
                    @for e in events.iter().filter(|e| !e.label.is_empty()) {
                        text class=(if e.trouble { "mark-label trouble" } else { "mark-label" }) x=(pct(fx(e.t))) dx="7" y=(TOP + 3.0) { (e.label) }
                    }
                }
            }
            ul.legend {
                @for s in series {
                    li data-instance=[s.instance.as_deref()] {
                        i class=(if s.dashed { "swatch dashed" } else { "swatch" }) style={ "--c:" (s.colour) } {}
                        (s.name)
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
    fn short_spans_tick_in_tenths_of_a_second() {
        let ticks: Vec<String> = [0.0, 0.455, 0.91, 1.82, 42.0].map(since).into();
        assert_eq!(ticks, ["0s", "0.5s", "0.9s", "1.8s", "42s"]);
    }

    fn series(name: &str, colour: &'static str, points: Vec<(f64, f64)>) -> Series {
        Series {
            name: name.into(),
            points,
            colour,
            dashed: false,
            instance: Some(name.into()),
        }
    }

    #[test]
    fn lines_stretch_with_the_page_and_keep_their_colour_and_stroke() {
        let svg = time_chart(
            "c",
            "tok/s",
            "tok/s",
            100.0,
            &[series("a", "#123456", vec![(100.0, 0.0), (110.0, 50.0)])],
            &[],
        )
        .into_string();
        assert!(svg.contains(r#"width="100%""#), "{svg}");
        assert!(svg.contains(r#"preserveAspectRatio="none""#), "{svg}");
        // The axis reaches 50 at the top; the line ends at the right edge, at the top.
        assert!(
            svg.contains(r##"points="0.0,1000.0 1000.0,0.0" stroke="#123456""##),
            "{svg}"
        );
        assert!(svg.contains(r#"vector-effect="non-scaling-stroke" data-instance="a""#));
        assert!(
            svg.contains(r##"style="--c:#123456""##),
            "the legend's swatch: {svg}"
        );
    }

    #[test]
    fn an_event_is_a_line_with_its_label_and_its_detail_as_tooltip() {
        let svg = time_chart(
            "c",
            "tok/s",
            "tok/s",
            0.0,
            &[series("a", "#123456", vec![(0.0, 1.0), (100.0, 1.0)])],
            &[Event {
                t: 25.0,
                label: "b down".into(),
                detail: "25s: instance down b: connection refused".into(),
                trouble: true,
            }],
        )
        .into_string();
        assert!(
            svg.contains(r#"<line class="mark trouble" x1="25.000%" x2="25.000%""#),
            "{svg}"
        );
        assert!(
            svg.contains("<title>25s: instance down b: connection refused</title>"),
            "{svg}"
        );
        assert!(
            svg.contains(
                r#"<text class="mark-label trouble" x="25.000%" dx="7" y="11">b down</text>"#
            ),
            "{svg}"
        );
    }

    #[test]
    fn a_lone_point_is_a_round_dot_where_the_line_would_be() {
        let svg = time_chart(
            "c",
            "t",
            "u",
            0.0,
            &[series("a", "#123456", vec![(10.0, 4.0)])],
            &[],
        )
        .into_string();
        // A 10 s span of nothing else: the dot at the right edge, at the top of a 4-high axis.
        assert!(
            svg.contains(r##"<circle cx="100.000%" cy="8" r="3" fill="#123456""##),
            "{svg}"
        );
    }
}
