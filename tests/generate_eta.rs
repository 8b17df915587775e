//! The first minute tells the truth, through the real binary: two sims at the seed's speed
//! (no_buffer, cap 72, outputs of 200 to 1,776 tokens, so a request takes 12 to 108 s), run
//! 20 times faster than real time with fleet's cadences 20 times shorter (`FLEET_TIME_SCALE`),
//! so that fleet sees the job as a user would at real speed. progress.json is read as the job
//! writes it, and held against how long the job really took.

mod common;

use std::time::Duration;

use common::generate::*;
use serde_json::Value;

/// One progress.json as read, at the job's own elapsed time (in real-speed seconds).
struct Seen {
    at: f64,
    p: Value,
}

#[test]
fn the_live_rate_and_the_eta_interval_are_right_in_the_first_minutes() {
    let dist = "uniform:200:1776";
    let (a, b) = (Sim::at_seed_speed(dist, 3), Sim::at_seed_speed(dist, 3));
    let (_tmp, prompts, out) = prompts_and_out(700);
    let mut child = generate(&out, &prompts, &[&a.url, &b.url])
        .args(["--max-tokens", "4096", "--warmup", "3s"])
        .env("FLEET_TIME_SCALE", SEED_SPEED_SCALE.to_string())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (status, seen) = watch_progress(&mut child, &out, Duration::from_secs(300));
    let seen: Vec<Seen> = seen.into_iter().map(|(at, p)| Seen { at, p }).collect();
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "{stderr}");
    assert_exactly_once(&out, 700);
    let end = progress(&out);
    let total = end["elapsed_hours"].as_f64().unwrap() * 3600.0 * SEED_SPEED_SCALE;
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

    // Without a sweep: from 30 s until the last minute, the 90% interval holds the time really
    // left; once the first cohort has ended (the longest request is 108 s), the ETA is within
    // 10% (checked over the next minute: near the end, a few seconds are a large share).
    for s in seen.iter().filter(|s| s.at >= 30.0 && total - s.at >= 60.0) {
        let left = total - s.at;
        let hours = |k: &str| s.p[k].as_f64().unwrap() * 3600.0 * SEED_SPEED_SCALE;
        let (eta, low, high) = (
            hours("eta_hours"),
            hours("eta_low_hours"),
            hours("eta_high_hours"),
        );
        assert!(
            low <= left * 1.02 && left <= high * 1.02,
            "at {:.0} s: {left:.0} s left, outside {low:.0}–{high:.0} (ETA {eta:.0})",
            s.at
        );
        if (120.0..=180.0).contains(&s.at) {
            assert!(
                (eta - left).abs() / left < 0.10,
                "at {:.0} s: ETA {eta:.0} s, {left:.0} s left",
                s.at
            );
        }
    }
    let early = &at(60.0).p;
    assert_eq!(early["length_estimate"]["source"], "job", "{early}");
    let width = |p: &Value| {
        (p["eta_high_hours"].as_f64().unwrap() - p["eta_low_hours"].as_f64().unwrap())
            / p["eta_hours"].as_f64().unwrap()
    };
    assert!(
        width(&at(150.0).p) < width(&at(40.0).p) / 2.0,
        "the interval narrows as the tail is seen"
    );
    // The expected length: the mean of the draws, not of the short ones that finished first.
    let lines = completions(&out);
    let mean = lines
        .iter()
        .map(|l| l["completion_tokens"].as_f64().unwrap())
        .sum::<f64>()
        / lines.len() as f64;
    let expected = at(150.0).p["expected_output_tokens"].as_f64().unwrap();
    assert!(
        (expected - mean).abs() / mean < 0.05,
        "{expected} expected, {mean} measured"
    );
    let finished_first = at(60.0).p["avg_output_tokens"].as_f64().unwrap();
    assert!(
        finished_first < 0.8 * mean,
        "at 60 s the finished requests are the short ones: {finished_first} against {mean}"
    );
    // A healthy job is no finding.
    assert!(!stderr.contains("WATCHDOG"), "{stderr}");
    assert!(end["warnings"].is_null(), "{end}");
}
