//! `fleet report` end to end: a 4-candidate sweep on `sglang-sim` servers and a 2,500-prompt
//! `fleet generate` job on two more (one prompt too long for the context) become one HTML page,
//! through the real `fleet` binary; the page is checked for its numbers, for having nothing
//! remote, and rendered offline in headless Chromium (Debian's `chromium`, every host
//! unresolvable), which must draw its charts and make no network request.

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

    // `FLEET_REPORT_SCREENSHOT=DIR`: keep the page and screenshots of it, of the sweep's page
    // and of the job's (docs/report.png, docs/report-sweep.png, docs/report-job.png).
    if let Some(dir) = std::env::var_os("FLEET_REPORT_SCREENSHOT") {
        let dir = Path::new(&dir);
        std::fs::copy(&html, dir.join("report.html")).unwrap();
        let job = job.display().to_string();
        // The job's page wants a job long enough to draw: its own, with an instance lost.
        let long = long_job(tmp.path()).display().to_string();
        for (name, sources, height) in [
            ("report", vec!["sweep.json", job.as_str()], 3400),
            // The seed's dataset and a GPU-hour price: the ETA, GPU-hour and cost columns.
            (
                "report-sweep",
                vec!["sweep.json", "--total", "654676", "--gpu-hour-cost", "2.5"],
                1400,
            ),
            ("report-job", vec![long.as_str()], 2700),
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
                    &format!("--window-size=1000,{height}"),
                    "--hide-scrollbars",
                    &format!("file://{}", page.display()),
                ],
            );
            assert!(shot.status.success());
        }
    }
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
