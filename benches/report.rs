//! `fleet report` of a long job: the timeline a 654,676-prompt job records over ~9 days (one
//! progress snapshot every 2 s on 8 instances, thinned by the recorder as the job writes it, with
//! an instance lost and back every few hours), read back, built into the page and rendered as
//! HTML. Target (issue 24): written in under 2 s, under 2 MB.
//!
//!     cargo bench --bench report [-- --quick]

mod headline;

use std::time::{Duration, Instant};

use criterion::Criterion;
use fleet::generate::Event;
use fleet::generate::core::{DownReason, HostLoss};
use fleet::generate::progress::{InstanceProgress, Progress, Status};
use fleet::generate::timeline::{Recorder, Timeline, Write};
use fleet::remote::LinkLoss;
use fleet::report::page::{self, JobSource, Sources};
use fleet::report::{Format, render};
use fleet::server::ServerId;

const PROMPTS: u64 = 654_676;
const INSTANCES: usize = 8;

fn snapshot(completed: u64) -> Progress {
    let mut p = Progress::before_start(&Default::default(), Status::Running);
    p.total = PROMPTS;
    p.completed = completed;
    p.rate_per_sec = 0.85;
    p.eta_hours = Some((PROMPTS - completed) as f64 / 0.85 / 3600.0);
    p.instances = (0..INSTANCES)
        .map(|i| InstanceProgress {
            name: ServerId::named(format!("ct{}:gpu{i}", 200 + i / 4)),
            url: format!("http://127.0.0.1:{}", 30000 + i),
            healthy: true,
            in_flight: 90,
            concurrency: 90,
            server_cap: Some(72),
            completed: completed / INSTANCES as u64,
            rate_per_sec: 0.1,
            output_tok_s: 140.0 + (completed % 17) as f64,
            output_tokens: completed / INSTANCES as u64 * 900,
            server_tok_s: None,
            cached_fraction: Some(0.5),
            running: Some(72.0),
            queued: Some(18.0),
            token_usage: Some(0.9 + (completed % 7) as f64 / 100.0),
        })
        .collect();
    p
}

/// The job's timeline.jsonl, as its recorder wrote it.
fn timeline_file() -> Vec<u8> {
    let mut r = Recorder::new(Timeline::default(), 2.0);
    let mut file = Vec::new();
    let apply = |w: Option<Write>, file: &mut Vec<u8>| match w {
        Some(Write::Append(b)) => file.extend_from_slice(&b),
        Some(Write::Rewrite(b)) => *file = b,
        None => {}
    };
    let seconds = (PROMPTS as f64 / 0.85) as u64;
    let t0 = 1.7e9;
    for s in (0..seconds).step_by(2) {
        let done = (s as f64 * 0.85) as u64;
        apply(r.point(t0 + s as f64, &snapshot(done), false), &mut file);
        if s % 14_400 == 0 {
            let name = ServerId::named("ct201:gpu5");
            let down = Event::InstanceDown {
                name: name.clone(),
                reason: DownReason::HostLost {
                    host: "ct201".into(),
                    loss: HostLoss::Dropped(LinkLoss::Broken {
                        message: "connection reset".into(),
                    }),
                },
            };
            apply(r.mark(t0 + s as f64, &down), &mut file);
            let up = Event::InstanceUp {
                name,
                server_cap: Some(72),
            };
            apply(r.mark(t0 + s as f64 + 60.0, &up), &mut file);
        }
    }
    apply(
        r.point(t0 + seconds as f64, &snapshot(PROMPTS), true),
        &mut file,
    );
    file
}

/// What `fleet report DIR -o report.html` does once the files are read.
fn report(timeline: &str) -> String {
    let mut progress = snapshot(PROMPTS);
    progress.status = Status::Done;
    let page = page::build(Sources {
        job: Some(JobSource {
            dir: "job".into(),
            progress,
            failures: [("prompt_too_long".to_string(), 73)].into(),
            timeline: Timeline::parse(timeline),
        }),
        ..Sources::default()
    });
    render(&page, Format::Html)
}

fn main() {
    let file = timeline_file();
    let text = String::from_utf8(file).expect("timeline is UTF-8");
    let mut best = Duration::MAX;
    let mut html = String::new();
    for _ in 0..if headline::quick() { 2 } else { 5 } {
        let t = Instant::now();
        html = report(&text);
        best = best.min(t.elapsed());
    }
    let points = text.lines().filter(|l| l.contains("\"point\"")).count();
    eprintln!(
        "timeline.jsonl: {} KB, {points} points; report.html: {} KB",
        text.len() / 1024,
        html.len() / 1024
    );
    headline::line(
        "report.654676_job",
        &format!(
            "{:.0} ms, {} KB (timeline.jsonl {} KB)",
            best.as_secs_f64() * 1e3,
            html.len() / 1024,
            text.len() / 1024
        ),
        "report of a 654,676-prompt job < 2 s, < 2 MB",
        Some(best < Duration::from_secs(2) && html.len() < 2 << 20),
    );
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    c.bench_function("report/654676_prompt_job_html", |b| {
        b.iter(|| report(&text))
    });
    c.final_summary();
}
