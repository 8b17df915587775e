//! `timeline.jsonl`: what a job looked like over time, for `fleet report`. One line per progress
//! snapshot (each instance's figures) and one per event (down, up, host lost, pause, watchdog,
//! upload), with wall-clock times so that a `--resume`d job appends to the same axis. Pure: the
//! [`Recorder`] says what to write; the journal's writer thread writes it.
//!
//! The file stays small over days: once it holds [`MAX_POINTS`] points, every other point is
//! dropped (the file rewritten) and points are kept at twice the spacing from then on, so a job
//! of any length has between half and all of [`MAX_POINTS`] points, evenly spread. Events are
//! all kept up to [`MAX_MARKS`]; past that the oldest go first.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::progress::Progress;
use super::{Event, upload::UploadEvent};

pub use super::journal::{TIMELINE_FILE, TimelineWrite as Write};

/// Points kept before the timeline is thinned.
pub const MAX_POINTS: usize = 1440;
/// Events kept.
pub const MAX_MARKS: usize = 2000;

/// One instance's figures at a point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstancePoint {
    pub name: String,
    pub healthy: bool,
    pub in_flight: u32,
    pub concurrency: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_cap: Option<u64>,
    pub output_tok_s: f64,
    /// Output tokens it streamed this run so far (absent in files of older fleets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
    /// `/metrics`' running and queued requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued: Option<f64>,
    /// `/metrics`' token usage, 0 to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_usage: Option<f64>,
}

/// The job at one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// Unix time, seconds.
    pub t: f64,
    pub completed: u64,
    pub failed: u64,
    pub waiting_retry: u64,
    pub rate_per_sec: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_hours: Option<f64>,
    pub instances: Vec<InstancePoint>,
}

impl Point {
    pub fn of(t: f64, p: &Progress) -> Point {
        Point {
            t,
            completed: p.completed,
            failed: p.failed,
            waiting_retry: p.waiting_retry,
            rate_per_sec: p.rate_per_sec,
            eta_hours: p.eta_hours,
            instances: p
                .instances
                .iter()
                .map(|i| InstancePoint {
                    name: i.name.to_string(),
                    healthy: i.healthy,
                    in_flight: i.in_flight,
                    concurrency: i.concurrency,
                    server_cap: i.server_cap,
                    output_tok_s: super::progress::round(i.output_tok_s, 1),
                    output_tokens: Some(i.output_tokens),
                    running: i.running,
                    queued: i.queued,
                    token_usage: i.token_usage,
                })
                .collect(),
        }
    }

    /// Output tok/s of the whole fleet.
    pub fn output_tok_s(&self) -> f64 {
        self.instances.iter().map(|i| i.output_tok_s).sum()
    }
}

/// What kind of event a mark is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MarkKind {
    Started,
    InstanceDown,
    InstanceUp,
    Paused,
    Resumed,
    HostLost,
    HostBack,
    Watchdog,
    Uploaded,
    UploadFailed,
    Stopping,
}

impl MarkKind {
    pub fn as_str(self) -> &'static str {
        match self {
            MarkKind::Started => "started",
            MarkKind::InstanceDown => "instance down",
            MarkKind::InstanceUp => "instance up",
            MarkKind::Paused => "paused",
            MarkKind::Resumed => "resumed",
            MarkKind::HostLost => "host lost",
            MarkKind::HostBack => "host back",
            MarkKind::Watchdog => "watchdog",
            MarkKind::Uploaded => "uploaded",
            MarkKind::UploadFailed => "upload failed",
            MarkKind::Stopping => "stopping",
        }
    }

    /// Whether the mark is bad news (drawn in red).
    pub fn is_trouble(self) -> bool {
        matches!(
            self,
            MarkKind::InstanceDown
                | MarkKind::Paused
                | MarkKind::HostLost
                | MarkKind::Watchdog
                | MarkKind::UploadFailed
        )
    }
}

/// An event on the job's time axis.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Mark {
    pub t: f64,
    pub kind: MarkKind,
    /// The instance, host or shard it is about.
    pub subject: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

impl Mark {
    /// The mark an event leaves, for those the report shows.
    pub fn of(t: f64, e: &Event) -> Option<Mark> {
        let (kind, subject, detail) = match e {
            Event::Started { instances, .. } => (
                MarkKind::Started,
                format!("{} instances", instances.len()),
                String::new(),
            ),
            Event::InstanceDown { name, reason } => {
                (MarkKind::InstanceDown, name.to_string(), reason.to_string())
            }
            Event::InstanceUp { name, .. } => {
                (MarkKind::InstanceUp, name.to_string(), String::new())
            }
            Event::Paused {
                instance, reason, ..
            } => (MarkKind::Paused, instance.to_string(), reason.to_string()),
            Event::Resumed => (MarkKind::Resumed, String::new(), String::new()),
            Event::HostLost { host, reason } => {
                (MarkKind::HostLost, host.clone(), reason.to_string())
            }
            Event::HostBack { host } => (MarkKind::HostBack, host.clone(), String::new()),
            Event::Watchdog(f) => (MarkKind::Watchdog, String::new(), f.message()),
            Event::Upload(UploadEvent::Uploaded { shard, bytes, .. }) => {
                (MarkKind::Uploaded, shard.clone(), format!("{bytes} bytes"))
            }
            Event::Upload(UploadEvent::Failed { shard, error }) => {
                (MarkKind::UploadFailed, shard.clone(), error.clone())
            }
            Event::Stopping { reason, in_flight } => (
                MarkKind::Stopping,
                reason.to_string(),
                format!("{in_flight} in flight"),
            ),
            _ => return None,
        };
        Some(Mark {
            t,
            kind,
            subject,
            detail,
        })
    }
}

/// One line of the file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "line", rename_all = "snake_case")]
pub enum Line {
    Point(Point),
    Mark(Mark),
}

/// The timeline as read back: its points and marks in time order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timeline {
    pub points: Vec<Point>,
    pub marks: Vec<Mark>,
}

impl Timeline {
    /// Reads the file's lines; a torn last line (a killed job) and unknown lines are skipped.
    pub fn parse(text: &str) -> Timeline {
        let mut t = Timeline::default();
        for l in text.lines() {
            match serde_json::from_str::<Line>(l) {
                Ok(Line::Point(p)) => t.points.push(p),
                Ok(Line::Mark(m)) => t.marks.push(m),
                Err(_) => {}
            }
        }
        t
    }
}

/// Decides which snapshots and events go into the file, keeping it bounded.
#[derive(Debug, Clone)]
pub struct Recorder {
    /// Seconds between kept points; doubles at each thinning.
    spacing: f64,
    points: VecDeque<Point>,
    marks: VecDeque<Mark>,
}

fn encode(line: &Line, out: &mut Vec<u8>) {
    serde_json::to_writer(&mut *out, line).expect("timeline lines always serialize");
    out.push(b'\n');
}

impl Recorder {
    /// Continues `earlier` (what a resumed job's file holds) keeping points `spacing` seconds
    /// apart at least (the spacing it had grown to is recovered from its points).
    pub fn new(earlier: Timeline, spacing: f64) -> Recorder {
        let mut spacing = spacing.max(0.0);
        // The file was thinned k times when its points are about 2^k times further apart.
        let n = earlier.points.len();
        if n >= 2 && spacing > 0.0 {
            let span = earlier.points[n - 1].t - earlier.points[0].t;
            while span / (n - 1) as f64 >= spacing * 2.0 {
                spacing *= 2.0;
            }
        }
        Recorder {
            spacing,
            points: earlier.points.into(),
            marks: earlier.marks.into(),
        }
    }

    /// A progress snapshot at `t`: written when it is far enough from the last point, or
    /// `force`d (the job's last snapshot).
    pub fn point(&mut self, t: f64, p: &Progress, force: bool) -> Option<Write> {
        if let Some(last) = self.points.back()
            && !force
            && t - last.t < self.spacing
        {
            return None;
        }
        let point = Point::of(t, p);
        self.points.push_back(point.clone());
        if self.points.len() > MAX_POINTS {
            self.thin();
            return Some(Write::Rewrite(self.contents()));
        }
        let mut out = Vec::new();
        encode(&Line::Point(point), &mut out);
        Some(Write::Append(out))
    }

    /// An event at `t`, when the report shows its kind.
    pub fn mark(&mut self, t: f64, e: &Event) -> Option<Write> {
        let mark = Mark::of(t, e)?;
        self.marks.push_back(mark.clone());
        if self.marks.len() > MAX_MARKS {
            self.marks.pop_front();
            return Some(Write::Rewrite(self.contents()));
        }
        let mut out = Vec::new();
        encode(&Line::Mark(mark), &mut out);
        Some(Write::Append(out))
    }

    /// Drops every other point (the first and the newest stay) and doubles the spacing.
    fn thin(&mut self) {
        let last = self.points.len() - 1;
        let kept: VecDeque<Point> = std::mem::take(&mut self.points)
            .into_iter()
            .enumerate()
            .filter(|(i, _)| i % 2 == 0 || *i == last)
            .map(|(_, p)| p)
            .collect();
        self.points = kept;
        self.spacing = if self.spacing > 0.0 {
            self.spacing * 2.0
        } else {
            // Unspaced points: space them by what they span now.
            let n = self.points.len();
            (self.points[n - 1].t - self.points[0].t) / (n - 1).max(1) as f64
        };
    }

    /// Every kept line, points and marks merged in time order.
    fn contents(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let (mut p, mut m) = (self.points.iter().peekable(), self.marks.iter().peekable());
        loop {
            let take_point = match (p.peek(), m.peek()) {
                (Some(a), Some(b)) => a.t <= b.t,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => break,
            };
            if take_point {
                encode(&Line::Point(p.next().expect("peeked").clone()), &mut out);
            } else {
                encode(&Line::Mark(m.next().expect("peeked").clone()), &mut out);
            }
        }
        out
    }

    pub fn spacing(&self) -> f64 {
        self.spacing
    }

    pub fn len(&self) -> usize {
        self.points.len()
    }

    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::super::progress::{InstanceProgress, Status};
    use super::*;
    use crate::server::ServerId;

    fn progress(completed: u64) -> Progress {
        let mut p = Progress::before_start(&Default::default(), Status::Running);
        p.completed = completed;
        p.instances = vec![InstanceProgress {
            name: ServerId::named("a"),
            url: "http://a".into(),
            healthy: true,
            in_flight: 3,
            concurrency: 4,
            server_cap: Some(4),
            completed,
            rate_per_sec: 1.0,
            output_tok_s: 100.0,
            output_tokens: 1000,
            server_tok_s: None,
            cached_fraction: None,
            running: Some(3.0),
            queued: None,
            token_usage: Some(0.42),
        }];
        p
    }

    /// Applies writes to a file held in memory.
    fn apply(file: &mut Vec<u8>, w: Option<Write>) {
        match w {
            Some(Write::Append(b)) => file.extend_from_slice(&b),
            Some(Write::Rewrite(b)) => *file = b,
            None => {}
        }
    }

    #[test]
    fn points_closer_than_the_spacing_are_skipped_unless_forced() {
        let mut r = Recorder::new(Timeline::default(), 10.0);
        let mut file = Vec::new();
        for (t, force) in [(0.0, false), (4.0, false), (10.0, false), (12.0, true)] {
            apply(&mut file, r.point(t, &progress(t as u64), force));
        }
        let t = Timeline::parse(std::str::from_utf8(&file).unwrap());
        let times: Vec<f64> = t.points.iter().map(|p| p.t).collect();
        assert_eq!(times, [0.0, 10.0, 12.0]);
        assert_eq!(t.points[1].output_tok_s(), 100.0);
    }

    #[test]
    fn a_job_of_days_stays_within_the_bound_and_evenly_spread() {
        let mut r = Recorder::new(Timeline::default(), 2.0);
        let mut file = Vec::new();
        // Two days at one snapshot every 2 s.
        let n = 2 * 86_400 / 2;
        for i in 0..n {
            apply(&mut file, r.point(i as f64 * 2.0, &progress(i), false));
        }
        let t = Timeline::parse(std::str::from_utf8(&file).unwrap());
        assert!(
            (MAX_POINTS / 2..=MAX_POINTS).contains(&t.points.len()),
            "{}",
            t.points.len()
        );
        assert_eq!(t.points[0].t, 0.0, "the start stays");
        let gaps: Vec<f64> = t.points.windows(2).map(|w| w[1].t - w[0].t).collect();
        let max = gaps.iter().cloned().fold(0.0, f64::max);
        assert!(max <= r.spacing() + 1e-9, "{max} vs {}", r.spacing());
        assert!(file.len() < 400_000, "{} bytes", file.len());
    }

    #[test]
    fn a_resumed_job_continues_the_file_at_the_spacing_it_had_grown_to() {
        let mut r = Recorder::new(Timeline::default(), 2.0);
        let mut file = Vec::new();
        for i in 0..(MAX_POINTS as u64 * 3) {
            apply(&mut file, r.point(i as f64 * 2.0, &progress(i), false));
        }
        let grown = r.spacing();
        assert!(grown >= 4.0);
        let earlier = Timeline::parse(std::str::from_utf8(&file).unwrap());
        let before = earlier.points.len();
        let again = Recorder::new(earlier, 2.0);
        assert_eq!(again.spacing(), grown);
        assert_eq!(again.len(), before);
    }

    #[test]
    fn events_become_marks_in_time_order_with_the_points() {
        let mut r = Recorder::new(Timeline::default(), 1.0);
        let mut file = Vec::new();
        apply(&mut file, r.point(0.0, &progress(0), false));
        apply(
            &mut file,
            r.mark(
                1.0,
                &Event::HostLost {
                    host: "box2".into(),
                    reason: crate::generate::core::HostLoss::Dropped(
                        crate::remote::LinkLoss::Broken {
                            message: "reset".into(),
                        },
                    ),
                },
            ),
        );
        apply(&mut file, r.mark(1.5, &Event::Progress(progress(1))));
        apply(&mut file, r.point(2.0, &progress(2), false));
        let t = Timeline::parse(std::str::from_utf8(&file).unwrap());
        assert_eq!(t.points.len(), 2);
        assert_eq!(t.marks.len(), 1, "progress is no mark");
        assert_eq!(
            (t.marks[0].kind, t.marks[0].subject.as_str()),
            (MarkKind::HostLost, "box2")
        );
        assert!(t.marks[0].detail.contains("reset"), "{:?}", t.marks[0]);
    }

    #[test]
    fn a_torn_last_line_is_skipped() {
        let mut r = Recorder::new(Timeline::default(), 1.0);
        let mut file = Vec::new();
        apply(&mut file, r.point(0.0, &progress(0), false));
        file.extend_from_slice(b"{\"line\":\"point\",\"t\":1");
        assert_eq!(
            Timeline::parse(std::str::from_utf8(&file).unwrap())
                .points
                .len(),
            1
        );
    }
}
