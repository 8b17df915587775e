//! `fleet report` end to end: a 4-candidate sweep on `sglang-sim` servers and a 2,500-prompt
//! `fleet generate` job on two more (one prompt too long for the context) become one HTML page,
//! through the real `fleet` binary; the page is checked for its numbers, for having nothing
//! remote, and rendered offline in headless Chromium (Debian's `chromium`, every host
//! unresolvable), which must draw its charts and make no network request. A longer job that
//! loses a server gets its own page, checked in Chromium for what its charts tell: one colour per
//! instance on every chart, rates that fall to 0 when a server dies, the events marked, and
//! charts that take the page's width.

mod common;
mod sweep_common;

use std::path::Path;

use common::chromium::chromium;
use common::generate::{Sim, generate, write_lines};
use serde_json::{Value, json};
use sweep_common::{Fleet, serial, short};

fn job_dir(tmp: &Path) -> std::path::PathBuf {
    let a = Sim::start(&["--context-length", "512", "--sim-time-scale", "100"]);
    let b = Sim::start(&["--context-length", "512", "--sim-time-scale", "100"]);
    let prompts = tmp.join("prompts.jsonl");
    let mut lines: Vec<String> = (0..2499)
        .map(|i| {
            json!({"id": i, "prompt": format!("question {i}: {}", "word ".repeat(10 + i % 20))})
                .to_string()
        })
        .collect();
    // The sim counts ceil(chars / 4) tokens: 1000 of them is over the 512 context.
    lines.insert(
        1234,
        json!({"id": "too-long", "prompt": "y".repeat(4000)}).to_string(),
    );
    write_lines(&prompts, &lines);
    let out = tmp.join("job");
    let o = generate(&out, &prompts, &[&a.url, &b.url])
        .args(["--max-tokens", "16"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(1),
        "one prompt fails: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        stdout.contains(&format!(
            "report: fleet report {} -o report.html",
            out.display()
        )),
        "{stdout}"
    );
    out
}

#[test]
fn a_sweep_and_a_job_become_one_offline_page_that_chromium_renders() {
    let _g = serial();
    let f = Fleet::new(2, &["mamba_strategy: extra_buffer"], &[]);
    let (code, out, err) = f.fleet(&short(&[
        "sweep",
        "--profile",
        "base",
        "--strategies",
        "extra_buffer,no_buffer",
        "--set",
        "server.mem_fraction_static=0.30,0.85",
    ]));
    // The sim cannot load the model in 30% of its memory, as SGLang cannot: those candidates fail.
    assert_eq!(code, 1, "{err}");
    assert!(
        out.contains("report: fleet report sweep.json -o report.html"),
        "{out}"
    );
    let sweep = f.file();
    let labels: Vec<String> = sweep["search"]["proposed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            c["settings"]
                .as_array()
                .unwrap()
                .iter()
                .map(|kv| {
                    // As `Candidate::label` names it.
                    let (k, v) = (kv[0].as_str().unwrap(), kv[1].as_str().unwrap());
                    match k.strip_prefix("server.").unwrap_or(k) {
                        "mamba_strategy" => v.to_string(),
                        k => format!("{k}={v}"),
                    }
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    assert_eq!(labels.len(), 4, "{labels:?}");

    let tmp = tempfile::tempdir().unwrap();
    let job = job_dir(tmp.path());
    let timeline = std::fs::read_to_string(job.join("timeline.jsonl")).unwrap();
    assert!(timeline.lines().count() >= 3, "{timeline}");
    // Each instance's KV token usage, as the sims' /metrics report it.
    assert!(timeline.contains(r#""token_usage":"#), "{timeline}");

    let html = tmp.path().join("report.html");
    let o = f
        .command(&["report", "sweep.json"])
        .arg(&job)
        .arg("-o")
        .arg(&html)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.len() < 300_000, "{} bytes", page.len());
    // Nothing remote, and nothing to load at all: no script, link, image or font.
    for remote in [
        "http://", "https://", "src=", "href=", "<script", "@import", "url(",
    ] {
        assert!(!page.contains(remote), "the page has {remote:?}");
    }
    for l in &labels {
        assert!(page.contains(l.as_str()), "no candidate {l} in the page");
    }
    assert!(page.contains("prompt_too_long"));
    let progress: Value =
        serde_json::from_str(&std::fs::read_to_string(job.join("progress.json")).unwrap()).unwrap();
    assert_eq!(progress["completed"], 2499);
    assert!(page.contains(r#"<td id="job-completed">2499</td>"#));
    assert!(page.contains(r#"<td id="job-total">2500</td>"#));
    // The winner's figure as sweep.json has it, to the table's precision.
    let (code, json_out, err) = f.fleet(&["--json", "report", "sweep.json"]);
    assert_eq!(code, 0, "{err}");
    let model: Value = serde_json::from_str(&json_out).unwrap();
    let rows = model["sweep"]["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4);
    let failed: Vec<_> = rows.iter().filter(|r| r["state"] == "failed").collect();
    assert_eq!(failed.len(), 2, "the two 0.30 candidates: {rows:?}");
    // Why they failed, in the words of the server's log (the sim's, as SGLang's
    // model_runner.py raises it), not only that the server exited.
    for r in &failed {
        let line = r["log_line"].as_str().unwrap_or_else(|| panic!("{r}"));
        assert!(line.starts_with("RuntimeError: Not enough memory"), "{r}");
        assert!(
            page.contains(&format!("<code>{line}</code>")),
            "the failed candidates' table shows {line:?}"
        );
        assert!(
            page.contains(&format!("failed: {line} (")),
            "the finding says {line:?}"
        );
    }
    let trials = sweep["trials"].as_array().unwrap();
    for r in rows.iter().filter(|r| r["state"] != "failed") {
        let t = trials
            .iter()
            .find(|t| {
                let m = &t["outcome"];
                m["output_tok_s_per_gpu"] == r["tok_s_per_gpu"]
            })
            .unwrap_or_else(|| panic!("{r} is not a trial of sweep.json"));
        assert!(t["outcome"]["cap"] == r["cap"], "{r} vs {t}");
    }

    // Offline in a real browser: the DOM it builds has the charts and the numbers.
    let profile = tmp.path().join("chromium");
    let netlog = tmp.path().join("net.json");
    let url = format!("file://{}", html.display());
    let dom = chromium(
        &profile,
        &[
            &format!("--log-net-log={}", netlog.display()),
            "--dump-dom",
            &url,
        ],
    );
    assert!(
        dom.status.success(),
        "{}",
        String::from_utf8_lossy(&dom.stderr)
    );
    let dom_text = String::from_utf8_lossy(&dom.stdout);
    let charts = dom_text.matches("<svg class=\"chart\"").count();
    assert!(charts >= 4, "{charts} charts in the rendered DOM");
    assert!(dom_text.contains("polyline"), "the time series are drawn");
    assert!(
        dom_text.contains(r#"id="job-token-usage""#),
        "the token usage chart"
    );
    assert!(dom_text.contains("prompt_too_long"));
    for l in &labels {
        assert!(dom_text.contains(l.as_str()), "no {l} in the rendered DOM");
    }
    assert!(
        !String::from_utf8_lossy(&dom.stderr).contains("Uncaught"),
        "a script error: {}",
        String::from_utf8_lossy(&dom.stderr)
    );
    // The browser's record of its requests: none came from the page. (Chromium's own
    // background requests, initiated by no origin, fail on the unresolvable hosts.)
    assert_eq!(page_requests(&netlog), Vec::<String>::new());
    // The same check catches a page that does fetch something.
    let remote = tmp.path().join("remote.html");
    std::fs::write(
        &remote,
        r#"<!DOCTYPE html><img src="https://cdn.example.com/x.png">"#,
    )
    .unwrap();
    let control = tmp.path().join("control.json");
    let o = chromium(
        &tmp.path().join("chromium2"),
        &[
            &format!("--log-net-log={}", control.display()),
            "--dump-dom",
            &format!("file://{}", remote.display()),
        ],
    );
    assert!(o.status.success());
    assert_eq!(page_requests(&control), ["https://cdn.example.com/x.png"]);

    // The job's page wants a job long enough to draw: its own, with an instance lost.
    let long = long_job(tmp.path()).display().to_string();
    let job_page = tmp.path().join("report-job.html");
    let o = f
        .command(&["report", &long, "-o"])
        .arg(&job_page)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    job_page_tells_its_story(tmp.path(), &job_page);

    // `FLEET_REPORT_SCREENSHOT=DIR`: keep the page and screenshots of it, of the sweep's page
    // and of the job's (docs/report.png, docs/report-sweep.png, docs/report-job.png).
    if let Some(dir) = std::env::var_os("FLEET_REPORT_SCREENSHOT") {
        let dir = Path::new(&dir);
        std::fs::copy(&html, dir.join("report.html")).unwrap();
        let job = job.display().to_string();
        for (name, sources, height) in [
            ("report", vec!["sweep.json", job.as_str()], 2500),
            // The seed's dataset and a GPU-hour price: the ETA, GPU-hour and cost columns.
            (
                "report-sweep",
                vec!["sweep.json", "--total", "654676", "--gpu-hour-cost", "2.5"],
                1150,
            ),
            ("report-job", vec![long.as_str()], 2200),
        ] {
            let page = dir.join(format!("{name}.html"));
            let o = f
                .command(&["report"])
                .args(&sources)
                .arg("-o")
                .arg(&page)
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            let shot = chromium(
                &tmp.path().join(format!("chromium-{name}")),
                &[
                    &format!("--screenshot={}", dir.join(format!("{name}.png")).display()),
                    &format!("--window-size=1400,{height}"),
                    "--hide-scrollbars",
                    &format!("file://{}", page.display()),
                ],
            );
            assert!(shot.status.success());
        }
    }
}

/// Checks the long job's page as Chromium builds and lays it out, at 1400 px wide: each
/// instance drawn in one colour on every chart (its legend's), `b`'s rate at 0 once it is dead,
/// its loss marked on the charts, and the charts across the page.
fn job_page_tells_its_story(tmp: &Path, page: &Path) {
    // A copy measures its own layout: a script writes the charts' boxes into the DOM (the
    // page's content security policy, which allows no script, left out of the copy only).
    let html = std::fs::read_to_string(page).unwrap();
    let csp = html
        .find(r#"<meta http-equiv="Content-Security-Policy""#)
        .expect("the page has its policy");
    let csp_end = csp + html[csp..].find('>').unwrap() + 1;
    let measured = format!("{}{}", &html[..csp], &html[csp_end..]).replace(
        "</body>",
        r#"<script>
const boxes = [...document.querySelectorAll('svg.chart')].map(c => {
  const r = c.getBoundingClientRect();
  return [c.id, Math.round(r.left), Math.round(r.right)];
});
const pre = document.createElement('pre');
pre.id = 'measured';
pre.textContent = JSON.stringify({width: window.innerWidth, boxes});
document.body.appendChild(pre);
</script></body>"#,
    );
    let copy = tmp.join("measured.html");
    std::fs::write(&copy, measured).unwrap();
    let o = chromium(
        &tmp.join("chromium-job"),
        &[
            "--window-size=1400,1100",
            "--dump-dom",
            &format!("file://{}", copy.display()),
        ],
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(!stderr.contains("Uncaught"), "a script error: {stderr}");
    let dom = String::from_utf8_lossy(&o.stdout).into_owned();

    // One colour per instance, the same on every chart and in the legend, and no two alike.
    let legend_html = section(&dom, r#"id="instance-legend""#, "</ul>");
    let legend: Vec<(&str, &str)> = tags(legend_html, "<li")
        .filter_map(|li| attr(li, "data-instance"))
        .map(|name| {
            let at = legend_html
                .find(&format!(r#"data-instance="{name}""#))
                .unwrap();
            let swatch = tags(&legend_html[at..], "<i").next().unwrap();
            let colour = attr(swatch, "style").unwrap().trim_start_matches("--c:");
            (name, colour)
        })
        .collect();
    let names: Vec<&str> = legend.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, ["a", "b"], "the instance legend: {legend_html}");
    assert_ne!(legend[0].1, legend[1].1);
    let drawn: Vec<(&str, &str)> = tags(&dom, "<polyline")
        .filter_map(|t| Some((attr(t, "data-instance")?, attr(t, "stroke")?)))
        .collect();
    for (name, colour) in &legend {
        let on_charts: Vec<&str> = drawn
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, c)| *c)
            .collect();
        // Throughput, in flight, queued and KV usage: a line on each at least.
        assert!(on_charts.len() >= 3, "{name}: {on_charts:?}");
        assert!(
            on_charts.iter().all(|c| c == colour),
            "{name}: {on_charts:?} vs {colour}"
        );
    }

    // `b` was killed a third of the way in: its rate over the last window is 0 at the end,
    // where the run's mean is not; `a`'s is not.
    let last_rate = |name: &str| -> f64 {
        let row = section(&dom, &format!(r#"<tr data-instance="{name}">"#), "</tr>");
        let cell = section(row, r#"<td class="last-rate">"#, "</td>");
        cell.trim_start_matches(r#"<td class="last-rate">"#)
            .parse()
            .unwrap_or_else(|_| panic!("{name}: {row}"))
    };
    assert_eq!(last_rate("b"), 0.0);
    assert!(last_rate("a") > 0.0);
    let throughput = section(&dom, r#"id="job-throughput""#, "</svg></div>");
    let b_line = tags(throughput, "<polyline")
        .find(|t| attr(t, "data-instance") == Some("b"))
        .expect("b's line");
    let points = attr(b_line, "points").unwrap();
    let last_y = points.split(' ').next_back().unwrap().split(',').nth(1);
    assert_eq!(last_y, Some("1000.0"), "b's line ends at 0: {points}");

    // Its loss, as a red line with the whole event in its tooltip and a label beside it.
    assert!(
        throughput
            .split(r#"<line class="mark trouble""#)
            .skip(1)
            .any(|l| l[..l.find("</title>").unwrap_or(0)].contains("instance down b")),
        "{throughput}"
    );
    assert!(
        throughput
            .split(r#"<text class="mark-label trouble""#)
            .skip(1)
            .any(|l| l[l.find('>').unwrap() + 1..].starts_with("b down")),
        "{throughput}"
    );

    // The charts use the page's width: together they span most of the window.
    let measured = section(&dom, r#"<pre id="measured">"#, "</pre>");
    let m: Value =
        serde_json::from_str(measured.trim_start_matches(r#"<pre id="measured">"#)).unwrap();
    let width = m["width"].as_f64().unwrap();
    let boxes = m["boxes"].as_array().unwrap();
    assert!(boxes.len() >= 5, "{m}");
    let edge = |i: usize| boxes.iter().map(move |b| b[i].as_f64().unwrap());
    let (left, right) = (
        edge(1).fold(f64::MAX, f64::min),
        edge(2).fold(0.0, f64::max),
    );
    assert!(
        right - left > 0.85 * width,
        "the charts span {left}..{right} of {width}: {m}"
    );
    for (l, r) in edge(1).zip(edge(2)) {
        assert!(r - l > 500.0, "a chart {} px wide: {m}", r - l);
    }
}

/// `text` from `start` up to (not with) the first `end` after it.
fn section<'a>(text: &'a str, start: &str, end: &str) -> &'a str {
    let at = text.find(start).unwrap_or_else(|| panic!("no {start}"));
    let rest = &text[at..];
    &rest[..rest.find(end).unwrap_or(rest.len())]
}

/// Each `<name …>` tag in `text`, to its `>`.
fn tags<'a>(text: &'a str, open: &'a str) -> impl Iterator<Item = &'a str> {
    text.match_indices(open)
        .filter(move |(i, _)| {
            // `<i` is no `<input`, `<li` no `<link`.
            matches!(text.as_bytes().get(i + open.len()), Some(b' ' | b'>'))
        })
        .map(move |(i, _)| &text[i..i + text[i..].find('>').unwrap_or(0) + 1])
}

/// The value of attribute `name` in `tag`.
fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let key = format!(r#" {name}=""#);
    let at = tag.find(&key)? + key.len();
    Some(&tag[at..at + tag[at..].find('"')?])
}

/// A job of 2,500 prompts (one too long) on two servers at an eighth of the test's speed, so
/// that its timeline has a few dozen points; server `b` is killed a third of the way in.
fn long_job(tmp: &Path) -> std::path::PathBuf {
    let sim = || Sim::start(&["--context-length", "512", "--sim-time-scale", "12"]);
    let (a, mut b) = (sim(), sim());
    let prompts = tmp.join("long-prompts.jsonl");
    let mut lines: Vec<String> = (0..2499)
        .map(|i| {
            json!({"id": i, "prompt": format!("q {i}: {}", "word ".repeat(10 + i % 20))})
                .to_string()
        })
        .collect();
    lines.insert(
        700,
        json!({"id": "too-long", "prompt": "y".repeat(4000)}).to_string(),
    );
    write_lines(&prompts, &lines);
    let out = tmp.join("long-job");
    let mut child = generate(
        &out,
        &prompts,
        &[&format!("a={}", a.url), &format!("b={}", b.url)],
    )
    .args(["--max-tokens", "16"])
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null())
    .spawn()
    .unwrap();
    let completed = || -> u64 {
        std::fs::read_to_string(out.join("progress.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .and_then(|p| p["completed"].as_u64())
            .unwrap_or(0)
    };
    while completed() < 800 {
        assert!(child.try_wait().unwrap().is_none(), "the job ended early");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    b.kill();
    child.wait().unwrap();
    out
}

/// URLs of the requests a document asked for, from Chromium's net log: those with an
/// initiator origin (a `file://` page's is `null`), unlike the browser's own.
fn page_requests(netlog: &Path) -> Vec<String> {
    let log: Value = serde_json::from_str(&std::fs::read_to_string(netlog).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", netlog.display()));
    let start = &log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"];
    assert!(
        start.is_number(),
        "no URL_REQUEST_START_JOB in the net log's constants"
    );
    log["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| &e["type"] == start)
        .filter_map(|e| {
            let url = e["params"]["url"].as_str()?;
            (e["params"]["initiator"] != "not an origin").then(|| url.to_string())
        })
        .collect()
}
