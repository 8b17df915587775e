//! Whole-run benchmarks of prefix-aware placement (issues 26 and 38) through the real `fleet`
//! binary and 8 real `sglang-sim` servers:
//!
//! - for each of 5 seeds (`--seeds=N` for 1..=N, `--seed=K` for one; `PREFIX_BENCH_KEEP=DIR`
//!   keeps each seed's journals and timelines), a job of 40 system prompts × questions, shuffled, whose
//!   hidden parameters the seed draws (benches/prefix_seeds: prompt lengths, the KV pool, group
//!   sizes, each server's speed and cap), placed by hand (8 `fleet` processes) and under
//!   `--placement auto` in the same run: the median and the worst of the ratios, and the
//!   cached fractions;
//! - the job of tests/prefix_job under `least-loaded`, for contrast;
//! - a job with no shared prefixes under `auto` (which picks least-loaded) and `least-loaded`;
//! - the prefix scan (`fleet generate --dry-run`) of 654,676 prompts: time and peak RSS.
//!
//!     cargo bench --bench prefix [-- [FILTER] [--quick]]
//!
//! `--quick` runs 1,600-prompt jobs and a 50,000-line scan: a smoke test, not the targets.

#[path = "../tests/generate_common/mod.rs"]
mod generate_common;
mod headline;
#[path = "../tests/prefix_job/mod.rs"]
mod prefix_job;
mod prefix_seeds;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use generate_common::{Sim, assert_exactly_once, progress, write_lines};
use prefix_job::*;
use prefix_seeds::Scenario;
use serde_json::json;

/// A token's prefill, in ms: a miss of a ~1,000-token system prompt costs 20 ms of a server's
/// time, which is what a least-loaded job pays again and again.
const PREFILL_PER_TOKEN_MS: &str = "0.02";
const SCAN_TOTAL: usize = 654_676;

fn sims() -> Vec<Sim> {
    (0..SERVERS)
        .map(|_| Sim::start(&sim_args(PREFILL_PER_TOKEN_MS)))
        .collect()
}

/// The sims of a seed's scenario, each with its own speed and cap.
fn scenario_sims(s: &Scenario) -> Vec<Sim> {
    (0..prefix_seeds::SERVERS)
        .map(|k| {
            let args = s.sim_args(k);
            Sim::start(&args.iter().map(String::as_str).collect::<Vec<_>>())
        })
        .collect()
}

fn fleet_generate(prompts: &Path, out: &Path, urls: &[&str], extra: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fleet"));
    c.args(["-q", "generate", "--prompts"])
        .arg(prompts)
        .arg("--out")
        .arg(out)
        .args(RUN_ARGS)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for u in urls {
        c.arg("--url").arg(u);
    }
    c
}

/// Prompt tokens the caches served, and all prompt tokens, from a run's progress.json.
fn hits(out: &Path) -> (u64, u64) {
    let p = progress(out);
    (
        p["cached_tokens"].as_u64().unwrap_or(0),
        p["total_input_tokens"].as_u64().unwrap(),
    )
}

fn share((cached, total): (u64, u64)) -> f64 {
    cached as f64 / total.max(1) as f64
}

/// One run of `prompts` by one `fleet` process over `sims`: its time and cache hits.
fn one_run_on(
    sims: &[Sim],
    prompts: &Path,
    out: &Path,
    n: usize,
    extra: &[&str],
) -> (Duration, (u64, u64), String) {
    let urls: Vec<&str> = sims.iter().map(|s| s.url.as_str()).collect();
    let t0 = Instant::now();
    let o = fleet_generate(prompts, out, &urls, extra).output().unwrap();
    let took = t0.elapsed();
    let stderr = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.status.success(), "{stderr}");
    assert_exactly_once(out, n);
    (took, hits(out), stderr)
}

/// One run of `prompts` by one `fleet` process over fresh sims: its time and cache hits.
fn one_run(prompts: &Path, out: &Path, n: usize, extra: &[&str]) -> (Duration, (u64, u64), String) {
    one_run_on(&sims(), prompts, out, n, extra)
}

/// The job placed by hand: one `fleet` process per server, each over its own `inputs[k]`.
fn hand_run(sims: &[Sim], dir: &Path, inputs: &[Vec<String>]) -> (Duration, (u64, u64)) {
    let mut files = Vec::new();
    for (k, lines) in inputs.iter().enumerate() {
        let p = dir.join(format!("hand-{k}.jsonl"));
        write_lines(&p, lines);
        files.push((p, dir.join(format!("hand-{k}"))));
    }
    let t0 = Instant::now();
    let children: Vec<_> = files
        .iter()
        .zip(sims)
        .map(|((p, out), sim)| fleet_generate(p, out, &[&sim.url], &[]).spawn().unwrap())
        .collect();
    for c in children {
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let took = t0.elapsed();
    let mut total = (0, 0);
    for (_, out) in &files {
        let (c, t) = hits(out);
        total.0 += c;
        total.1 += t;
    }
    (took, total)
}

/// Seeds of the placement bench: `--seed=K` (that one only), `--seeds=N` (1..=N), else 1..=5.
fn seeds() -> Vec<u64> {
    let arg = |name: &str| {
        std::env::args().find_map(|a| a.strip_prefix(name).map(|n| n.parse::<u64>().unwrap()))
    };
    match arg("--seed=") {
        Some(k) => vec![k],
        None => (1..=arg("--seeds=").unwrap_or(5)).collect(),
    }
}

/// Hand-placed against `auto` for each seed's scenario, in the same run over fresh sims of the
/// same draw each: the median and the worst of the ratios.
fn placement_job() {
    let n = if headline::quick() { 1_600 } else { 16_000 };
    let mut rows = Vec::new();
    for seed in seeds() {
        let s = Scenario::draw(seed, n);
        let tmp = tempfile::tempdir().unwrap();
        let lines = s.lines();
        let prompts = tmp.path().join("prompts.jsonl");
        write_lines(
            &prompts,
            &lines.iter().map(|(_, l)| l.clone()).collect::<Vec<_>>(),
        );
        let inputs: Vec<Vec<String>> = (0..prefix_seeds::SERVERS)
            .map(|k| s.hand_placed(&lines, k))
            .collect();
        let (hand, hand_hits) = hand_run(&scenario_sims(&s), tmp.path(), &inputs);
        let (auto, auto_hits, stderr) = one_run_on(
            &scenario_sims(&s),
            &prompts,
            &tmp.path().join("auto"),
            n,
            &[],
        );
        assert!(stderr.contains("placement: prefix (auto:"), "{stderr}");
        // PREFIX_BENCH_KEEP=DIR keeps each seed's runs (journals, timelines) for a look after.
        if let Some(dir) = std::env::var_os("PREFIX_BENCH_KEEP") {
            let to = Path::new(&dir).join(format!("seed-{seed}"));
            let _ = std::fs::remove_dir_all(&to);
            let ok = Command::new("cp")
                .arg("-r")
                .arg(tmp.path())
                .arg(&to)
                .status();
            assert!(ok.is_ok_and(|s| s.success()), "keeping the runs in {to:?}");
        }
        let ratio = hand.as_secs_f64() / auto.as_secs_f64();
        let (h, a) = (share(hand_hits), share(auto_hits));
        println!(
            "{}\n  hand-placed {hand:.2?} ({:.1}% cached), auto {auto:.2?} ({:.1}% cached): \
             {ratio:.2} of hand-placed",
            s.describe(),
            h * 100.0,
            a * 100.0
        );
        rows.push((ratio, auto.as_secs_f64(), hand.as_secs_f64(), a, h));
    }
    rows.sort_by(|x, y| x.0.total_cmp(&y.0));
    let median = rows[rows.len() / 2];
    let worst = rows[0];
    let hits_gap = rows.iter().map(|r| r.4 - r.3).fold(f64::MIN, f64::max);
    headline::line(
        "prefix.ratio",
        &format!(
            "median {:.2}, worst {:.2} over {} seeds ({n} prompts each; worst {:.1} s vs {:.1} s hand-placed)",
            median.0,
            worst.0,
            rows.len(),
            worst.1,
            worst.2
        ),
        "`--placement auto` on 40 system prompts of seeded sizes, lengths, caches and server speeds, shuffled, 8 sims: ≥ 0.90 of the speed of the job placed by hand (8 processes), median and worst over ≥ 5 seeds",
        Some(worst.0 >= 0.9),
    );
    headline::line(
        "prefix.hits",
        &format!(
            "{:.1}% cached at worst seed (hand-placed {:.1}%); largest gap {:.1} points",
            worst.3 * 100.0,
            worst.4 * 100.0,
            hits_gap * 100.0
        ),
        "the same jobs' prompt tokens served from the cache: within 5 points of hand-placed",
        Some(hits_gap <= 0.05),
    );
}

/// The issue-26 job (40 system prompts × 400 questions, equal groups) under `least-loaded`, for
/// contrast: what placement by prefix saves.
fn least_loaded_job() {
    let questions = if headline::quick() { 40 } else { 400 };
    let n = SYSTEMS * questions;
    let tmp = tempfile::tempdir().unwrap();
    let order = shuffled(n);
    let prompts = tmp.path().join("prompts.jsonl");
    write_lines(
        &prompts,
        &order.iter().map(|&i| line(i)).collect::<Vec<_>>(),
    );
    let hand_inputs: Vec<Vec<String>> = (0..SERVERS).map(|k| hand_placed(&order, k)).collect();
    let (hand, _) = hand_run(&sims(), tmp.path(), &hand_inputs);
    let (least, ll_hits, _) = one_run(
        &prompts,
        &tmp.path().join("least-loaded"),
        n,
        &["--placement", "least-loaded"],
    );
    let l = share(ll_hits);
    println!(
        "least-loaded on the issue-26 job: {least:.2?} ({:.1}% cached), hand-placed {hand:.2?}",
        l * 100.0
    );
    headline::line(
        "prefix.least_loaded",
        &format!(
            "{:.1} s, {:.1}% cached ({:.2} of hand-placed)",
            least.as_secs_f64(),
            l * 100.0,
            hand.as_secs_f64() / least.as_secs_f64()
        ),
        "40 system prompts × 400 questions under `--placement least-loaded`, for contrast",
        None,
    );
}

/// Prompts that share nothing but a two-word head: `auto` must find no group and run as
/// least-loaded does.
fn no_prefix_job() {
    let n = if headline::quick() { 2_000 } else { 16_000 };
    let tmp = tempfile::tempdir().unwrap();
    let prompts = tmp.path().join("prompts.jsonl");
    let lines: Vec<String> = (0..n)
        .map(|i| {
            let mut x = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            let mut text = format!("Question {i}: ");
            while text.len() < 400 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                text.push_str(&format!("{:x} ", x % 4096));
            }
            json!({"id": format!("p{i}"), "prompt": text}).to_string()
        })
        .collect();
    write_lines(&prompts, &lines);
    let (auto, _, stderr) = one_run(&prompts, &tmp.path().join("auto"), n, &[]);
    assert!(
        stderr.contains("placement: least-loaded (auto:"),
        "{stderr}"
    );
    let (least, _, _) = one_run(
        &prompts,
        &tmp.path().join("least-loaded"),
        n,
        &["--placement", "least-loaded"],
    );
    let ratio = least.as_secs_f64() / auto.as_secs_f64();
    println!(
        "no shared prefixes, {n} prompts: auto {auto:.2?} (least-loaded picked), least-loaded {least:.2?}"
    );
    headline::line(
        "prefix.no_prefix",
        &format!(
            "{ratio:.2} ({:.1} s under auto, {:.1} s least-loaded, {n} prompts)",
            auto.as_secs_f64(),
            least.as_secs_f64()
        ),
        "a job with no shared prefixes under `auto` (picks least-loaded): ≥ 0.95 of least-loaded's speed",
        Some(ratio >= 0.95),
    );
}

/// `fleet generate --dry-run` over 654,676 prompts, half of them in 20 groups of a shared
/// ~1,000-byte instruction: the scan's time (as it reports it) and the process's peak RSS.
#[allow(clippy::zombie_processes, reason = "reaped by wait4")]
fn scan() {
    let total = if headline::quick() {
        50_000
    } else {
        SCAN_TOTAL
    };
    let tmp = tempfile::tempdir().unwrap();
    let prompts = tmp.path().join("prompts.jsonl");
    let heads: Vec<String> = (0..20)
        .map(|g| {
            format!(
                "Instruction set {g}. {}",
                "Answer with care and cite. ".repeat(36)
            )
        })
        .collect();
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&prompts).unwrap());
        for i in 0..total {
            let prompt = if i % 2 == 0 {
                format!("{}\nQuestion {i}?", heads[i / 2 % 20])
            } else {
                format!("Prompt {i}: {}", "lorem ipsum dolor sit amet ".repeat(10))
            };
            writeln!(f, "{}", json!({"id": i, "prompt": prompt})).unwrap();
        }
    }
    let bytes = std::fs::metadata(&prompts).unwrap().len();
    let t0 = Instant::now();
    let child = Command::new(env!("CARGO_BIN_EXE_fleet"))
        .args(["--json", "generate", "--dry-run", "--prompts"])
        .arg(&prompts)
        .arg("--out")
        .arg(tmp.path().join("out"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut child.stdout.unwrap(), &mut stdout).unwrap();
    let mut status = 0;
    // SAFETY: waiting for the child spawned above, by its pid, with a valid rusage buffer.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::wait4(pid, &mut status, 0, &mut usage) }, pid);
    let secs = t0.elapsed().as_secs_f64();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "fleet generate --dry-run failed: {stdout}"
    );
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["prompts"], total as u64, "{report}");
    assert_eq!(report["groups"], 20, "{report}");
    let rss_mb = usage.ru_maxrss as f64 / 1024.0;
    let scan_s = report["scan_seconds"].as_f64().unwrap();
    println!(
        "prefix scan (--dry-run): {total} prompts, {:.0} MB, in {scan_s:.2} s ({secs:.2} s the whole process), peak RSS {rss_mb:.1} MB: {report}",
        bytes as f64 / 1e6
    );
    headline::line(
        "prefix.scan",
        &format!(
            "{scan_s:.2} s, {rss_mb:.1} MB peak RSS ({total} prompts, {:.0} MB, 20 groups)",
            bytes as f64 / 1e6
        ),
        "the prefix scan of a 654,676-prompt input (`--dry-run`) within the 64 MB RSS target",
        Some(rss_mb < 64.0),
    );
}

fn main() {
    let filter = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .unwrap_or_default();
    for (name, bench) in [
        ("placement", placement_job as fn()),
        ("least_loaded", least_loaded_job),
        ("no_prefix", no_prefix_job),
        ("scan", scan),
    ] {
        if filter.is_empty() || name.contains(&filter) {
            bench();
        }
    }
}
