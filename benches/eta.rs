//! The first minute as a user reads it: `fleet generate` (the release binary) on two sims at
//! the seed's speed (no_buffer, cap 72), whose output lengths follow seeded distributions the
//! estimator never sees, run 20 times faster than real time with fleet's cadences 20 times
//! shorter (`FLEET_TIME_SCALE`), so each figure is in real-speed seconds. For each
//! distribution and seed: the ETA's error at 60 s and 120 s against how long the job really
//! took, whether the 90% interval held the truth, and the live rate against the servers' own
//! `gen_throughput`; and whether the watchdog said anything (a healthy job: it must not).
//! Then the same job after `fleet sweep --write-profile` on a sample of its prompts, on the
//! fleet `fleet up` starts from the written profile: the sweep's projection against the job's
//! real duration, and the job's ETA at 60 s with the sweep's lengths as its prior. Last, the
//! seed's extra_buffer job run with that profile: how long until the watchdog flags it.
//!
//!     cargo bench --bench eta [-- --quick]
//!
//! `--quick` runs one seed of each distribution.

#[path = "../tests/generate_common/mod.rs"]
mod generate_common;
mod headline;
#[allow(dead_code)]
mod sim_fleet;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use generate_common::{SEED_SPEED_SCALE, Sim, completions, watch_progress, write_prompts};
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
    /// What the watchdog said, if anything.
    warnings: Vec<String>,
    /// When the first cohort (the requests sent at the start) had all ended, real-speed
    /// seconds: from then on the ETA rests on a fair sample.
    cohort_end: f64,
    /// (real-speed seconds, progress.json) as the job wrote it.
    seen: Vec<(f64, Value)>,
    total: f64,
}

/// `cmd generate ARGS` (the release binary) of [`PROMPTS`] prompts into `out`, watched to its
/// end.
fn job(mut cmd: Command, args: &[String], prompts: &Path, out: &Path) -> Run {
    let mut child = cmd
        .args(["-q", "generate", "--max-tokens", "4096", "--warmup", "3s"])
        .args(args)
        .arg("--prompts")
        .arg(prompts)
        .arg("--out")
        .arg(out)
        .env("FLEET_TIME_SCALE", SEED_SPEED_SCALE.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (_, seen) = watch_progress(&mut child, out, Duration::from_secs(600));
    let end = read(out).unwrap_or_else(|| {
        let mut err = String::new();
        let _ = child.stderr.take().unwrap().read_to_string(&mut err);
        panic!("the job wrote no progress.json: {err}")
    });
    Run {
        total: end["elapsed_hours"].as_f64().unwrap() * 3600.0 * SEED_SPEED_SCALE,
        cohort_end: cohort_end(&seen, out),
        warnings: end["warnings"]
            .as_array()
            .map(|w| w.iter().map(|x| x.to_string()).collect())
            .unwrap_or_default(),
        seen,
    }
}

/// The job on two sims started by hand, with nothing known of its lengths.
fn run(dist: &str, seed: u64, prompts: &Path) -> Run {
    let (a, b) = (
        Sim::at_seed_speed(dist, seed),
        Sim::at_seed_speed(dist, seed),
    );
    let out = prompts.with_file_name("out-plain");
    let urls = ["--url", &a.url, "--url", &b.url].map(String::from);
    job(Command::new(sim_fleet::FLEET), &urls, prompts, &out)
}

/// What the sweep said, and the job on the fleet `up` started from the profile it wrote.
struct Swept {
    /// The sweep's projection for the whole input on both GPUs, real-speed seconds.
    projected: f64,
    /// Its 90% interval held the job's real duration.
    projection_held: bool,
    run: Run,
    /// Real-speed seconds until the watchdog flagged the extra_buffer job run with the
    /// written profile (`None`: it never did).
    flagged: Option<f64>,
}

fn swept(dist: &str, seed: u64, prompts: &Path) -> Swept {
    let dir = prompts.parent().unwrap();
    std::fs::write(
        dir.join("fleet.yaml"),
        "hosts:\n  - name: local\n    gpus: [0, 1]\n",
    )
    .unwrap();
    std::fs::create_dir_all(dir.join("profiles")).unwrap();
    std::fs::write(
        dir.join("profiles/base.yaml"),
        format!(
            "model: /models/sim-27b\nlauncher: [{}]\nport_base: {}\nserver:\n  \
             mamba_strategy: no_buffer\n  extra_args: [--stream-interval, \"8\"]\nenv:\n  \
             SGLANG_SIM_TIME_SCALE: \"{SEED_SPEED_SCALE}\"\n  SGLANG_SIM_STARTUP_SECS: \"1\"\n  \
             SGLANG_SIM_OUTPUT_DIST: \"{dist}\"\n  SGLANG_SIM_OUTPUT_SEED: \"{seed}\"\n  \
             SGLANG_SIM_GPU_STATE_DIR: {}\nhealth: {{startup_timeout: 60s, poll: 200ms}}\n",
            sim_fleet::SIM,
            sim_fleet::port_base(),
            dir.join("gpus").display()
        ),
    )
    .unwrap();
    let fleet = |args: &[&str]| {
        let (ok, out, err) = sim_fleet::fleet(dir, args);
        assert!(ok, "fleet {args:?}: {err}");
        out
    };
    // 3 s + 3 s at 20x: a minute of warm-up and a minute measured, as on GPUs.
    let report: Value = serde_json::from_str(&fleet(&[
        "--json",
        "sweep",
        "--profile",
        "base",
        "--strategies",
        "no_buffer",
        "--prompts",
        prompts.to_str().unwrap(),
        "--sample",
        "200",
        "--warmup",
        "3s",
        "--duration",
        "3s",
        "--write-profile",
        "profiles/tuned.yaml",
    ]))
    .unwrap();
    let hours =
        |k: &str| report["rows"][0][k].as_f64().unwrap_or(f64::NAN) * 3600.0 * SEED_SPEED_SCALE;
    let (projected, low, high) = (
        hours("eta_hours"),
        hours("eta_low_hours"),
        hours("eta_high_hours"),
    );
    fleet(&["up", "--profile", "tuned"]);
    let out = dir.join("out-swept");
    let run = job(sim_fleet::command(dir, &[]), &[], prompts, &out);
    fleet(&["down", "--grace", "2s"]);

    // The seed's mistake, made with the profile the sweep wrote.
    let slow = [
        "--mamba-radix-cache-strategy",
        "extra_buffer",
        "--sim-time-scale",
        "20",
        "--sim-output-dist",
        dist,
        "--stream-interval",
        "8",
    ];
    let (a, b) = (Sim::start(&slow), Sim::start(&slow));
    let out = dir.join("out-slow");
    let args = ["--url", &a.url, "--url", &b.url, "--abort-below", "0.5"]
        .into_iter()
        .chain(["--grace", "1s", "--profile", "tuned"])
        .map(String::from)
        .collect::<Vec<_>>();
    let slow = job(sim_fleet::command(dir, &[]), &args, prompts, &out);
    let flagged = slow
        .seen
        .iter()
        .find(|(_, p)| !p["warnings"].is_null())
        .map(|(t, _)| *t);
    Swept {
        projected,
        projection_held: low <= run.total * 1.02 && run.total <= high * 1.02,
        run,
        flagged,
    }
}

/// The first cohort is the first prompts (`p0`, `p1`, …) as many as were in flight at the
/// first reading; it has ended when the slowest of them has.
fn cohort_end(seen: &[(f64, Value)], out: &Path) -> f64 {
    let first: u64 = seen
        .iter()
        .map(|(_, p)| {
            p["instances"].as_array().map_or(0, |v| {
                v.iter().filter_map(|i| i["in_flight"].as_u64()).sum()
            })
        })
        .find(|n| *n > 0)
        .unwrap_or(0);
    completions(out)
        .iter()
        .filter(|c| {
            c["id"]
                .as_str()
                .and_then(|id| id.strip_prefix('p')?.parse::<u64>().ok())
                .is_some_and(|n| n < first)
        })
        .filter_map(|c| c["latency_s"].as_f64())
        .fold(0.0, f64::max)
        * SEED_SPEED_SCALE
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
    let mut flags = Vec::new();
    let worst = |v: &[f64]| v.iter().cloned().fold(0.0, f64::max);
    for (name, dist) in DISTS {
        let (mut e60, mut e120, mut rate) = (Vec::new(), Vec::new(), Vec::new());
        let mut at120 = Vec::new();
        let (mut projection, mut prior60) = (Vec::new(), Vec::new());
        let (mut held, mut projection_held) = (0, 0);
        for seed in 1..=seeds {
            let tmp = tempfile::tempdir().unwrap();
            let prompts = tmp.path().join("prompts.jsonl");
            write_prompts(&prompts, PROMPTS);
            let r = run(dist, seed, &prompts);
            let (a, h60, q) = at(&r, 60.0);
            // Without a sweep the ETA is within 10% once the first cohort has ended: by 120 s
            // for the 12-108 s requests, later for a tail that runs longer.
            let cohort = r.cohort_end.ceil();
            let (b, h120, _) = at(&r, cohort);
            let (c120, _, _) = at(&r, 120.0);
            let s = swept(dist, seed, &prompts);
            let (p60, _, _) = at(&s.run, 60.0);
            let projected = (s.projected - s.run.total) / s.run.total;
            println!(
                "{name} seed {seed}: job {:.0} s; no sweep: ETA error {:+.1}% at 60 s \
                 (interval {}), {:+.1}% at 120 s, {:+.1}% at {cohort:.0} s when the first cohort \
                 had ended (interval {}), live rate {:.3} of the \
                 servers'; after a sweep: projection {:.0} s against {:.0} s ({:+.1}%, interval \
                 {}), ETA \
                 error at 60 s {:+.1}%; extra_buffer flagged at {}",
                r.total,
                a * 100.0,
                if h60 { "held" } else { "missed" },
                c120 * 100.0,
                b * 100.0,
                if h120 { "held" } else { "missed" },
                q,
                s.projected,
                s.run.total,
                projected * 100.0,
                if s.projection_held { "held" } else { "missed" },
                p60 * 100.0,
                s.flagged.map_or("never".into(), |t| format!("{t:.0} s")),
            );
            for w in r.warnings.iter().chain(&s.run.warnings) {
                println!("  finding on a healthy job: {w}");
            }
            held += usize::from(h60) + usize::from(h120);
            projection_held += usize::from(s.projection_held);
            warned += r.warnings.len() + s.run.warnings.len();
            e60.push(a.abs());
            e120.push(b.abs());
            at120.push(c120.abs());
            rate.push((q - 1.0).abs());
            projection.push(projected.abs());
            prior60.push(p60.abs());
            flags.push(s.flagged.unwrap_or(f64::INFINITY));
        }
        let pct = |v: &mut Vec<f64>| {
            let w = worst(v);
            (format!("{:.1}% / {:.1}%", median(v) * 100.0, w * 100.0), w)
        };
        let (t60, _) = pct(&mut e60);
        headline::line(
            &format!("eta {name}: ETA error at 60 s, no sweep (median / worst)"),
            &t60,
            "interval holds the truth",
            None,
        );
        let (t, _) = pct(&mut at120);
        headline::line(
            &format!("eta {name}: ETA error at 120 s, no sweep (median / worst)"),
            &t,
            "≤ 10% once the first cohort ended",
            None,
        );
        let (t120, w120) = pct(&mut e120);
        headline::line(
            &format!(
                "eta {name}: ETA error once the first cohort ended, no sweep (median / worst)"
            ),
            &t120,
            "≤ 10%",
            Some(w120 <= 0.10),
        );
        headline::line(
            &format!(
                "eta {name}: the 90% interval held the truth at 60 s and at the first cohort's end, no sweep"
            ),
            &format!("{held} of {}", 2 * seeds),
            "all",
            Some(held as u64 == 2 * seeds),
        );
        let (tp, wp) = pct(&mut projection);
        headline::line(
            &format!("eta {name}: the sweep's projection against the job (median / worst)"),
            &tp,
            "≤ 10%",
            Some(wp <= 0.10),
        );
        headline::line(
            &format!("eta {name}: the sweep's projection interval held the job's duration"),
            &format!("{projection_held} of {seeds}"),
            "all",
            Some(projection_held as u64 == seeds),
        );
        let (ts, ws) = pct(&mut prior60);
        headline::line(
            &format!("eta {name}: ETA error at 60 s after a sweep (median / worst)"),
            &ts,
            "≤ 10%",
            Some(ws <= 0.10),
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
    let latest = worst(&flags);
    headline::line(
        "eta: the seed's extra_buffer job flagged (worst, real-speed seconds)",
        &if latest.is_finite() {
            format!("{latest:.0} s")
        } else {
            "not always".into()
        },
        "≤ 90 s",
        Some(latest <= 90.0),
    );
}
