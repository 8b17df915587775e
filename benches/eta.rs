//! The first minute as a user reads it: `fleet generate` (the release binary) on two sims at
//! the seed's speed (no_buffer, cap 72), whose output lengths follow seeded distributions the
//! estimator never sees, run 20 times faster than real time with fleet's cadences 20 times
//! shorter (`FLEET_TIME_SCALE`), so each figure is in real-speed seconds. For each
//! distribution and seed: the ETA's error at 60 s and 120 s against how long the job really
//! took, whether the 90% interval held the truth, and the live rate against the servers' own
//! `gen_throughput`; and whether the watchdog said anything (a healthy job: it must not).
//!
//!     cargo bench --bench eta [-- --quick]
//!
//! `--quick` runs one seed of each distribution.

#[path = "../tests/generate_common/mod.rs"]
mod generate_common;
mod headline;

use std::path::Path;
use std::time::Duration;

use generate_common::{SEED_SPEED_SCALE, Sim, watch_progress, write_prompts};
use serde_json::Value;

const PROMPTS: usize = 700;

/// (name, `--sim-output-dist`): uniform like the job, a heavy log-normal tail, and a
/// bimodal one whose long mode hits `max_tokens` (4096).
const DISTS: [(&str, &str); 3] = [
    ("uniform 200-1776", "uniform:200:1776"),
    ("log-normal, median 700, sigma 0.6", "lognormal:700:0.6"),
    ("bimodal, 15% at max_tokens", "bimodal:600:6000:0.15"),
];

struct Run {
    /// (real-speed seconds, progress.json) as the job wrote it.
    seen: Vec<(f64, Value)>,
    total: f64,
    warned: bool,
}

fn fleet_bin() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    dir.join("fleet")
}

fn run(dist: &str, seed: u64) -> Run {
    let (a, b) = (
        Sim::at_seed_speed(dist, seed),
        Sim::at_seed_speed(dist, seed),
    );
    let tmp = tempfile::tempdir().unwrap();
    let prompts = tmp.path().join("prompts.jsonl");
    write_prompts(&prompts, PROMPTS);
    let out = tmp.path().join("out");
    let mut child = std::process::Command::new(fleet_bin())
        .args(["generate", "--max-tokens", "4096", "--warmup", "3s", "-q"])
        .arg("--prompts")
        .arg(&prompts)
        .arg("--out")
        .arg(&out)
        .args(["--url", &a.url, "--url", &b.url])
        .env("FLEET_TIME_SCALE", SEED_SPEED_SCALE.to_string())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let (_, seen) = watch_progress(&mut child, &out, Duration::from_secs(600));
    let end = read(&out).expect("the job's last progress.json");
    Run {
        total: end["elapsed_hours"].as_f64().unwrap() * 3600.0 * SEED_SPEED_SCALE,
        warned: !end["warnings"].is_null(),
        seen,
    }
}

fn read(dir: &Path) -> Option<Value> {
    let text = std::fs::read_to_string(dir.join("progress.json")).ok()?;
    serde_json::from_str(&text).ok()
}

/// At `t` s: (ETA error, interval held the truth, live rate ÷ servers' rate).
fn at(r: &Run, t: f64) -> (f64, bool, f64) {
    let (s, p) = r.seen.iter().find(|(s, _)| *s >= t).expect("a reading");
    let left = r.total - s;
    let h = |k: &str| p[k].as_f64().unwrap_or(f64::NAN) * 3600.0 * SEED_SPEED_SCALE;
    let live = p["output_tok_s"].as_f64().unwrap_or(0.0);
    let servers: f64 = p["instances"]
        .as_array()
        .map(|v| v.iter().filter_map(|i| i["server_tok_s"].as_f64()).sum())
        .unwrap_or(0.0);
    (
        (h("eta_hours") - left) / left,
        h("eta_low_hours") <= left * 1.02 && left <= h("eta_high_hours") * 1.02,
        live / servers,
    )
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let seeds: u64 = if headline::quick() { 1 } else { 5 };
    let mut warned = 0;
    for (name, dist) in DISTS {
        let (mut e60, mut e120, mut rate) = (Vec::new(), Vec::new(), Vec::new());
        let mut held = 0;
        for seed in 1..=seeds {
            let r = run(dist, seed);
            let (a, h60, q) = at(&r, 60.0);
            let (b, h120, _) = at(&r, 120.0);
            println!(
                "{name} seed {seed}: job {:.0} s; ETA error {:+.1}% at 60 s (interval {}), \
                 {:+.1}% at 120 s (interval {}); live rate {:.3} of the servers'",
                r.total,
                a * 100.0,
                if h60 { "held" } else { "missed" },
                b * 100.0,
                if h120 { "held" } else { "missed" },
                q
            );
            held += usize::from(h60) + usize::from(h120);
            warned += usize::from(r.warned);
            e60.push(a.abs());
            e120.push(b.abs());
            rate.push((q - 1.0).abs());
        }
        let worst = |v: &[f64]| v.iter().cloned().fold(0.0, f64::max);
        let (w60, w120) = (worst(&e60), worst(&e120));
        headline::line(
            &format!("eta {name}: ETA error at 60 s, no sweep (median / worst)"),
            &format!("{:.1}% / {:.1}%", median(&mut e60) * 100.0, w60 * 100.0),
            "interval holds the truth",
            None,
        );
        headline::line(
            &format!("eta {name}: ETA error at 120 s, no sweep (median / worst)"),
            &format!("{:.1}% / {:.1}%", median(&mut e120) * 100.0, w120 * 100.0),
            "≤ 10%",
            Some(w120 <= 0.10),
        );
        headline::line(
            &format!("eta {name}: the 90% interval held the truth"),
            &format!("{held} of {}", 2 * seeds),
            "all",
            Some(held as u64 == 2 * seeds),
        );
        headline::line(
            &format!("eta {name}: live tok/s against the servers' gen_throughput at 60 s"),
            &format!("worst {:.1}% off", worst(&rate) * 100.0),
            "≤ 10%",
            Some(worst(&rate) <= 0.10),
        );
    }
    headline::line(
        "eta: watchdog findings on healthy jobs",
        &warned.to_string(),
        "0",
        Some(warned == 0),
    );
}
