//! Benchmark of `fleet sweep` on a local fleet of 8 simulated GPUs, each sweep timed against a
//! 1-candidate sweep with the same warm-up and duration in the same run:
//! - 2 candidates side by side (target: at most 1.25x), ranked in the order of the sims' own
//!   ideal throughputs (`/server_info` `sim.ideal_output_tok_s`);
//! - 12 candidates (2 strategies x 6 mem fractions) in rounds with successive halving (target:
//!   at most 3x), picking the candidate with the highest ideal;
//! - the README's 18 (3 strategies x 3 mem fractions x 2 caps), reported the same way.
//!
//! Runs the real binaries; `cargo bench --bench sweep [-- RUNS WARMUP_S DURATION_S]`
//! (defaults 3, 3, 10; with `--quick` 1, 1, 3).

mod headline;
mod sim_fleet;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Stdio;
use std::time::Instant;

use serde_json::Value;
use sim_fleet::{GPUS, command, fleet, port_base, write_base, write_fleet};

/// The sweeps, as `fleet sweep` axes.
const TWO: &[&str] = &["--strategies", "extra_buffer,no_buffer", "--parallel"];
const TWELVE: &[&str] = &[
    "--strategies",
    "extra_buffer,no_buffer",
    "--set",
    "server.mem_fraction_static=0.70,0.75,0.80,0.85,0.88,0.89",
];
const EIGHTEEN: &[&str] = &[
    "--strategies",
    "extra_buffer,no_buffer,extra_buffer_lazy",
    "--set",
    "server.mem_fraction_static=0.8,0.85,0.88",
    "--set",
    "server.max_running_requests=48,96",
];

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

/// A candidate of a report: its id and `(key, value)` settings.
fn candidates(report: &Value) -> Vec<(String, Vec<(String, String)>)> {
    report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let c = &r["trial"]["candidate"];
            let settings = c["settings"]
                .as_array()
                .unwrap()
                .iter()
                .map(|kv| {
                    let s = |i: usize| kv[i].as_str().unwrap().to_string();
                    (s(0), s(1))
                })
                .collect();
            (c["id"].as_str().unwrap().to_string(), settings)
        })
        .collect()
}

/// The sim's ideal output tok/s of each candidate not yet in `known`: up to 8 at a time, each
/// started alone on a GPU of its own, asked, and stopped.
fn ideals(
    dir: &Path,
    port_base: u16,
    wanted: &[(String, Vec<(String, String)>)],
    known: &mut BTreeMap<String, f64>,
) {
    let missing: Vec<_> = wanted
        .iter()
        .filter(|(id, _)| !known.contains_key(id))
        .collect();
    for chunk in missing.chunks(GPUS as usize) {
        let ups: Vec<_> = chunk
            .iter()
            .enumerate()
            .map(|(gpu, (_, settings))| {
                let mut yaml = String::from("extends: base\nserver:\n");
                for (k, v) in settings {
                    yaml.push_str(&format!("  {}: {v}\n", k.trim_start_matches("server.")));
                }
                let name = format!("ideal{gpu}");
                std::fs::write(dir.join(format!("profiles/{name}.yaml")), yaml).unwrap();
                command(dir, &["up", "--profile", &name, "--gpus", &gpu.to_string()])
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("run fleet up")
            })
            .collect();
        for up in ups {
            let up = up.wait_with_output().expect("run fleet up");
            assert!(
                up.status.success(),
                "{}",
                String::from_utf8_lossy(&up.stderr)
            );
        }
        for (gpu, (id, _)) in chunk.iter().enumerate() {
            let info: Value =
                serde_json::from_str(&get(port_base + gpu as u16, "/server_info")).unwrap();
            let ideal = info["sim"]["ideal_output_tok_s"]
                .as_f64()
                .expect("sim.ideal_output_tok_s");
            known.insert(id.clone(), ideal);
        }
        let (ok, _, err) = fleet(dir, &["down", "--grace", "2s"]);
        assert!(ok, "{err}");
    }
}

/// The id with the highest value; `None` on a tie at the top (no single right answer).
fn best(values: &BTreeMap<String, f64>) -> Option<&str> {
    let mut v: Vec<(&String, &f64)> = values.iter().collect();
    v.sort_by(|a, b| b.1.total_cmp(a.1));
    match v.as_slice() {
        [(id, a), (_, b), ..] if a > b => Some(id.as_str()),
        [(id, _)] => Some(id.as_str()),
        _ => None,
    }
}

/// What one sweep of the benchmark measured, over its runs.
#[derive(Default)]
struct Series {
    ratios: Vec<f64>,
    secs: Vec<f64>,
    agreed: usize,
    pruned: Vec<usize>,
}

impl Series {
    fn worst(&self) -> f64 {
        self.ratios.iter().copied().fold(0.0, f64::max)
    }
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
    write_fleet(dir);
    write_base(dir, base, 100);
    let prompts: Vec<String> = (0..2000)
        .map(|i| {
            serde_json::json!({"id": i, "prompt": format!("q{i} {}", "word ".repeat(20 + i % 80))})
                .to_string()
        })
        .collect();
    std::fs::write(dir.join("prompts.jsonl"), prompts.join("\n") + "\n").unwrap();

    let (w, d) = (format!("{warmup}s"), format!("{duration}s"));
    let sweep = |axes: &[&str]| {
        let _ = std::fs::remove_file(dir.join("sweep.json"));
        let mut all = vec![
            "--json",
            "sweep",
            "--profile",
            "base",
            "--prompts",
            "prompts.jsonl",
            "--sample",
            "200",
            "--warmup",
            &w,
            "--duration",
            &d,
        ];
        all.extend_from_slice(axes);
        let t = Instant::now();
        let (ok, out, err) = fleet(dir, &all);
        assert!(ok, "{err}");
        (
            t.elapsed().as_secs_f64(),
            serde_json::from_str::<Value>(&out).unwrap(),
        )
    };
    let figure = |report: &Value, id: &str| {
        report["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["trial"]["candidate"]["id"] == id)
            .and_then(|r| r["trial"]["outcome"]["output_tok_s_per_gpu"].as_f64())
            .expect("measured")
    };
    let mut ideal: BTreeMap<String, f64> = BTreeMap::new();
    let (mut two, mut twelve, mut eighteen) =
        (Series::default(), Series::default(), Series::default());
    let mut one_s: Vec<f64> = Vec::new();
    println!("run  sweep  wall s  vs 1 candidate  winner (ideal tok/s)  agrees  pruned");
    for run in 0..runs {
        let (one, _) = sweep(&["--strategies", "no_buffer"]);
        one_s.push(one);
        println!("{:>3}  1      {one:>6.2}", run + 1);
        for (name, axes, series) in [
            ("2", TWO, &mut two),
            ("12", TWELVE, &mut twelve),
            ("18", EIGHTEEN, &mut eighteen),
        ] {
            let (secs, report) = sweep(axes);
            let cands = candidates(&report);
            ideals(dir, base, &cands, &mut ideal);
            let mine: BTreeMap<String, f64> = cands
                .iter()
                .map(|(id, _)| (id.clone(), ideal[id]))
                .collect();
            let agrees = if name == "2" {
                // Two candidates: the whole order, from the measured figures.
                let measured: BTreeMap<String, f64> = cands
                    .iter()
                    .map(|(id, _)| (id.clone(), figure(&report, id)))
                    .collect();
                best(&measured) == best(&mine)
            } else {
                let winner = report["rows"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|r| r["winner"] == true)
                    .map(|r| r["trial"]["candidate"]["id"].as_str().unwrap().to_string());
                winner.as_deref() == best(&mine)
            };
            let pruned = report["rows"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| r["trial"]["outcome"]["state"] == "pruned")
                .count();
            series.ratios.push(secs / one);
            series.secs.push(secs);
            series.agreed += usize::from(agrees);
            series.pruned.push(pruned);
            println!(
                "{:>3}  {name:<5}  {secs:>6.2}  {:>14.3}  {} ({:.0})  {agrees}  {pruned}",
                run + 1,
                secs / one,
                report["winner"].as_str().unwrap_or("-"),
                best(&mine).map_or(0.0, |b| mine[b]),
            );
        }
    }
    let slowest_one = one_s.iter().copied().fold(0.0, f64::max);
    let worst = two.worst();
    println!(
        "worst ratios: 2 candidates {worst:.3} (target <= 1.25), 12 candidates {:.3} (target <= 3), 18 candidates {:.3}",
        twelve.worst(),
        eighteen.worst()
    );
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
        &format!("agreed in {} of {runs} runs", two.agreed),
        "the sweep ranks the candidates in the order of the sims' ideal tok/s",
        Some(two.agreed == runs as usize),
    );
    let pruned = |s: &Series| {
        let (lo, hi) = (
            s.pruned.iter().min().copied().unwrap_or(0),
            s.pruned.iter().max().copied().unwrap_or(0),
        );
        if lo == hi {
            format!("{lo}")
        } else {
            format!("{lo}-{hi}")
        }
    };
    let slowest = |s: &Series| s.secs.iter().copied().fold(0.0, f64::max);
    headline::line(
        "sweep.rounds12",
        &format!(
            "worst of {runs}: {:.2}× ({:.1} s; {} of 12 pruned after the first window)",
            twelve.worst(),
            slowest(&twelve),
            pruned(&twelve)
        ),
        "12 sweep candidates (2 strategies × 6 mem fractions) on 8 sim GPUs take ≤ 3× one",
        Some(twelve.worst() <= 3.0),
    );
    headline::line(
        "sweep.rounds12.winner",
        &format!("agreed in {} of {runs} runs", twelve.agreed),
        "the 12-candidate sweep picks the candidate with the highest ideal tok/s",
        Some(twelve.agreed == runs as usize),
    );
    headline::line(
        "sweep.rounds18",
        &format!(
            "worst of {runs}: {:.2}× ({:.1} s; {} of 18 pruned after the first window)",
            eighteen.worst(),
            slowest(&eighteen),
            pruned(&eighteen)
        ),
        "18 sweep candidates (3 strategies × 3 mem fractions × 2 caps) on 8 sim GPUs, vs one",
        None,
    );
    headline::line(
        "sweep.rounds18.winner",
        &format!("agreed in {} of {runs} runs", eighteen.agreed),
        "the 18-candidate sweep picks the candidate with the highest ideal tok/s",
        Some(eighteen.agreed == runs as usize),
    );
}
