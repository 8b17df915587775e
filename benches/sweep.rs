//! Benchmark of `fleet sweep` on a local fleet of 8 simulated GPUs: the wall time of a
//! 2-candidate parallel sweep against a 1-candidate sweep with the same warm-up and duration
//! (target: at most 1.25x), and whether every run ranks the candidates in the order of the
//! sims' own ideal throughputs (`/server_info` `sim.ideal_output_tok_s`).
//!
//! Runs the real binaries; `cargo bench --bench sweep [-- RUNS WARMUP_S DURATION_S]`
//! (defaults 3, 3, 10; with `--quick` 1, 1, 3).

mod headline;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use serde_json::Value;

const SIM: &str = env!("CARGO_BIN_EXE_sglang-sim");
const FLEET: &str = env!("CARGO_BIN_EXE_fleet");
const GPUS: u16 = 8;
const CANDIDATES: [&str; 2] = ["extra_buffer", "no_buffer"];

fn port_base() -> u16 {
    (41_000..60_000)
        .step_by(97)
        .find(|b| (0..GPUS).all(|k| TcpListener::bind(("127.0.0.1", b + k)).is_ok()))
        .expect("free ports")
}

fn fleet(dir: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(FLEET)
        .args(["--config", "fleet.yaml", "--profiles-dir", "profiles"])
        .args(args)
        .current_dir(dir)
        .env("FLEET_RUN_DIR", dir.join("run"))
        .env_remove("FLEET_LOG")
        .output()
        .expect("run fleet");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// GET over plain HTTP/1.0 (the sim on loopback), returning the body.
fn get(port: u16, path: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect to the sim");
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

/// The sim's ideal output tok/s for a candidate: start it on GPU 0, ask, stop it.
fn ideal(dir: &Path, strategy: &str, port_base: u16) -> f64 {
    std::fs::write(
        dir.join(format!("profiles/{strategy}.yaml")),
        format!("extends: base\nserver:\n  mamba_strategy: {strategy}\n"),
    )
    .unwrap();
    let (ok, _, err) = fleet(dir, &["up", "--profile", strategy, "--gpus", "0"]);
    assert!(ok, "{err}");
    let info: Value = serde_json::from_str(&get(port_base, "/server_info")).unwrap();
    let (ok, _, err) = fleet(dir, &["down", "--grace", "2s"]);
    assert!(ok, "{err}");
    info["sim"]["ideal_output_tok_s"]
        .as_f64()
        .expect("sim.ideal_output_tok_s")
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let num = |i: usize, d: u32| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(d);
    let (runs, warmup, duration) = if headline::quick() {
        (num(0, 1), num(1, 1), num(2, 3))
    } else {
        (num(0, 3), num(1, 3), num(2, 10))
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let base = port_base();
    let gpus: Vec<String> = (0..GPUS).map(|g| g.to_string()).collect();
    std::fs::write(
        dir.join("fleet.yaml"),
        format!("hosts:\n  - name: local\n    gpus: [{}]\n", gpus.join(", ")),
    )
    .unwrap();
    std::fs::create_dir_all(dir.join("profiles")).unwrap();
    std::fs::write(
        dir.join("profiles/base.yaml"),
        format!(
            "model: /models/sim-27b\nlauncher: [{SIM}]\nport_base: {base}\nserver:\n  mem_fraction_static: 0.85\n  context_length: 8192\nenv:\n  SGLANG_SIM_STARTUP_SECS: \"1\"\n  SGLANG_SIM_MEAN_OUTPUT_TOKENS: \"100\"\n  SGLANG_SIM_GPU_STATE_DIR: {}\nhealth: {{startup_timeout: 60s, poll: 200ms}}\n",
            dir.join("gpus").display()
        ),
    )
    .unwrap();
    let prompts: Vec<String> = (0..2000)
        .map(|i| {
            serde_json::json!({"id": i, "prompt": format!("q{i} {}", "word ".repeat(20 + i % 80))})
                .to_string()
        })
        .collect();
    std::fs::write(dir.join("prompts.jsonl"), prompts.join("\n") + "\n").unwrap();

    let ideals: Vec<f64> = CANDIDATES.iter().map(|s| ideal(dir, s, base)).collect();
    let ideal_order = order(&CANDIDATES, &ideals);
    println!(
        "ideal output tok/s per GPU: {}",
        CANDIDATES
            .iter()
            .zip(&ideals)
            .map(|(c, t)| format!("{c} {t:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "run  1-candidate s  2-candidate s  ratio  measured tok/s/GPU (eb, nb)  ranking agrees"
    );
    let (w, d) = (format!("{warmup}s"), format!("{duration}s"));
    let mut worst: f64 = 0.0;
    let mut all_agree = true;
    let mut one_s = Vec::new();
    let mut agreed = 0;
    for run in 0..runs {
        let sweep = |strategies: &str| {
            let _ = std::fs::remove_file(dir.join("sweep.json"));
            let t = Instant::now();
            let (ok, out, err) = fleet(
                dir,
                &[
                    "--json",
                    "sweep",
                    "--profile",
                    "base",
                    "--strategies",
                    strategies,
                    "--prompts",
                    "prompts.jsonl",
                    "--sample",
                    "200",
                    "--warmup",
                    &w,
                    "--duration",
                    &d,
                    "--parallel",
                ],
            );
            assert!(ok, "{err}");
            (
                t.elapsed().as_secs_f64(),
                serde_json::from_str::<Value>(&out).unwrap(),
            )
        };
        let (one, _) = sweep("no_buffer");
        let (two, report) = sweep(&CANDIDATES.join(","));
        let measured: Vec<f64> = CANDIDATES
            .iter()
            .map(|c| {
                report["rows"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|r| r["label"] == *c)
                    .and_then(|r| r["trial"]["outcome"]["output_tok_s_per_gpu"].as_f64())
                    .expect("measured")
            })
            .collect();
        let agrees = order(&CANDIDATES, &measured) == ideal_order;
        all_agree &= agrees;
        agreed += usize::from(agrees);
        worst = worst.max(two / one);
        one_s.push(one);
        println!(
            "{:>3}  {one:>14.2}  {two:>13.2}  {:>5.3}  {:>10.0} {:>10.0}               {agrees}",
            run + 1,
            two / one,
            measured[0],
            measured[1]
        );
    }
    println!(
        "worst ratio {worst:.3} (target <= 1.25): {}; ranking agreed in every run: {all_agree}",
        if worst <= 1.25 { "met" } else { "MISSED" }
    );
    let slowest_one = one_s.iter().copied().fold(0.0, f64::max);
    headline::line(
        "sweep.parallel",
        &format!(
            "worst of {runs}: {worst:.3}× (one candidate ≤ {slowest_one:.1} s; {warmup} s warm-up + {duration} s window)"
        ),
        "2 sweep candidates in parallel on 8 sim GPUs take ≤ 1.25× one",
        Some(worst <= 1.25),
    );
    headline::line(
        "sweep.ranking",
        &format!("agreed in {agreed} of {runs} runs"),
        "the sweep ranks the candidates in the order of the sims' ideal tok/s",
        Some(all_agree),
    );
}

fn order<'a>(names: &[&'a str], values: &[f64]) -> Vec<&'a str> {
    let mut v: Vec<(&str, f64)> = names.iter().copied().zip(values.iter().copied()).collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1));
    v.into_iter().map(|(n, _)| n).collect()
}
