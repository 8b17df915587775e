//! The first minute tells the truth, through the real binary: two sims at the seed's speed
//! (no_buffer, cap 72, outputs of 200 to 1,776 tokens, so a request takes 12 to 108 s), run
//! 20 times faster than real time with fleet's cadences 20 times shorter (`FLEET_TIME_SCALE`),
//! so that fleet sees the job as a user would at real speed. progress.json is read as the job
//! writes it, and held against how long the job really took.

mod common;

use std::time::{Duration, Instant};

use common::generate::*;
use serde_json::Value;

const SCALE: f64 = 20.0;

/// One progress.json as read, at the job's own elapsed time (in real-speed seconds).
struct Seen {
    at: f64,
    p: Value,
}

#[test]
fn the_live_rate_and_the_eta_interval_are_right_in_the_first_minutes() {
    let args = [
        "--mamba-radix-cache-strategy",
        "no_buffer",
        "--disable-overlap-schedule",
        "--sim-time-scale",
        "20",
        "--sim-output-dist",
        "uniform:200:1776",
        "--sim-output-seed",
        "3",
        // A chunk per 8 decode steps, as the demo streams: one per token is 20 times as many
        // chunks at 20x, on 2 cores.
        "--stream-interval",
        "8",
    ];
    let (a, b) = (Sim::start(&args), Sim::start(&args));
    let (_tmp, prompts, out) = prompts_and_out(700);
    let mut child = generate(&out, &prompts, &[&a.url, &b.url])
        .args(["--max-tokens", "4096", "--warmup", "3s"])
        .env("FLEET_TIME_SCALE", SCALE.to_string())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen: Vec<Seen> = Vec::new();
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(start.elapsed() < Duration::from_secs(300), "the job hangs");
        // Written atomically (temp file and rename), a few times a second at this scale.
        if let Ok(text) = std::fs::read_to_string(out.join("progress.json"))
            && let Ok(p) = serde_json::from_str::<Value>(&text)
        {
            let at = p["elapsed_hours"].as_f64().unwrap() * 3600.0 * SCALE;
            if seen.last().is_none_or(|l| l.at < at) {
                seen.push(Seen { at, p });
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "{stderr}");
    assert_exactly_once(&out, 700);
    let end = progress(&out);
    let total = end["elapsed_hours"].as_f64().unwrap() * 3600.0 * SCALE;
    assert!(total > 200.0, "a job of minutes at real speed: {total} s");
    let at = |t: f64| {
        seen.iter()
            .find(|s| s.at >= t)
            .unwrap_or_else(|| panic!("no progress.json read after {t} s"))
    };

    // The live rate, 10 s after the batches filled: against what the servers can do at full
    // batch (their ideal, at the sim's speed), and later against their own gen_throughput
    // (refreshed every 40 decode steps, and no oftener than the sim's log gap).
    let ideal = a.ideal_output_tok_s() + b.ideal_output_tok_s();
    for t in [15.0, 60.0, 120.0] {
        let p = &at(t).p;
        let live = p["output_tok_s"].as_f64().unwrap();
        assert!(
            (live - ideal).abs() / ideal < 0.10,
            "at {t} s: streamed {live} tok/s against the servers' ideal {ideal}"
        );
        if t >= 60.0 {
            let servers: f64 = p["instances"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|i| i["server_tok_s"].as_f64())
                .sum();
            assert!(
                (live - servers).abs() / servers < 0.10,
                "at {t} s: streamed {live} tok/s against the servers' gen_throughput {servers}"
            );
        }
    }

    // Every reading carries the ETA's interval and what the expected length rests on.
    let early = &at(60.0).p;
    assert_eq!(early["length_estimate"]["source"], "job", "{early}");
    assert!(
        early["eta_low_hours"].as_f64().unwrap() <= early["eta_hours"].as_f64().unwrap()
            && early["eta_hours"].as_f64().unwrap() <= early["eta_high_hours"].as_f64().unwrap(),
        "{early}"
    );
    // A healthy job is no finding, and the progress line shows the interval.
    assert!(!stderr.contains("WATCHDOG"), "{stderr}");
    assert!(end["warnings"].is_null(), "{end}");
}
