//! Benchmarks of `fleet generate`'s client side against in-process instant SGLang stand-ins:
//! completed requests/s (engine and binary), peak RSS on a 654,676-prompt input, and the time
//! from start to the first new request when resuming with 600,000 prompts done.
//!
//!     cargo bench --bench generate [-- [FILTER] [--quick]]
//!
//! `--quick` uses smaller inputs and shorter windows (a smoke test, not the targets).

#[path = "../tests/generate_common/mod.rs"]
mod generate_common;
mod headline;
#[allow(dead_code)]
#[path = "../tests/common/real.rs"]
mod real;

use std::io::Write;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use fleet::generate::{self, Endpoint, GenerateConfig};
use generate_common::{Sim, StubSpec, start_stub, write_lines, write_prompts};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const SEED_TOTAL: usize = 654_676;

fn instant() -> StubSpec {
    StubSpec {
        latency: Duration::ZERO,
        cap: 64,
        record: false,
        ..StubSpec::default()
    }
}

fn config(prompts: &Path, out: &Path) -> GenerateConfig {
    let mut c = GenerateConfig::new(prompts.into(), out.into());
    c.grace = Duration::ZERO;
    c
}

/// Completed requests/s of the engine over 20,000 prompts and two instant servers.
fn engine_throughput(c: &mut Criterion, rt: &tokio::runtime::Runtime) {
    let stubs: Vec<_> = (0..2).map(|_| start_stub(instant())).collect();
    let tmp = tempfile::tempdir().unwrap();
    let prompts = tmp.path().join("prompts.jsonl");
    const N: usize = 20_000;
    write_prompts(&prompts, N);
    let mut g = c.benchmark_group("generate");
    g.sample_size(10).throughput(Throughput::Elements(N as u64));
    let mut round = 0;
    let mut took = Vec::new();
    g.bench_function("engine_20k_instant", |b| {
        b.iter(|| {
            round += 1;
            let t0 = Instant::now();
            let out = tmp.path().join(format!("out{round}"));
            let endpoints: Vec<Endpoint> =
                stubs.iter().map(|s| Endpoint::from_url(&s.url)).collect();
            let s = rt
                .block_on(generate::run(
                    config(&prompts, &out),
                    endpoints.into(),
                    |_| {},
                    CancellationToken::new(),
                ))
                .unwrap();
            assert_eq!(s.progress.completed, N as u64);
            took.push(t0.elapsed());
            std::fs::remove_dir_all(&out).unwrap();
        })
    });
    g.finish();
    if took.is_empty() {
        return; // criterion's filter left this benchmark out
    }
    let median = median(took);
    headline::line(
        "generate.engine_req_s",
        &format!(
            "{:.0} req/s (engine, {N} prompts in {:.2} s)",
            N as f64 / median.as_secs_f64(),
            median.as_secs_f64()
        ),
        "the generate engine in-process against 2 instant stub servers (no target)",
        None,
    );
}

/// The middle sample (the upper one of an even count).
fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// Start of a resumed run with 600,000 of 654,676 prompts done, to its first new request.
fn resume_to_first_request(c: &mut Criterion, rt: &tokio::runtime::Runtime) {
    let stub = start_stub(instant());
    let tmp = tempfile::tempdir().unwrap();
    let prompts = tmp.path().join("prompts.jsonl");
    write_prompts(&prompts, SEED_TOTAL);
    let out = tmp.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let mut shard = std::io::BufWriter::new(
        std::fs::File::create(out.join("completions-00000.jsonl")).unwrap(),
    );
    for i in 0..600_000 {
        writeln!(
            shard,
            r#"{{"id":"p{i}","output":"a completion of moderate length","prompt_tokens":3,"completion_tokens":7,"finish_reason":"length","instance":"a","latency_s":0.1}}"#
        )
        .unwrap();
    }
    drop(shard);
    let mut g = c.benchmark_group("generate");
    g.sample_size(10);
    let mut took = Vec::new();
    g.bench_function("resume_600k_done_to_first_request", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let before = stub.state.requests.load(Ordering::SeqCst);
                let mut cfg = config(&prompts, &out);
                cfg.resume = true;
                let cancel = CancellationToken::new();
                let t0 = Instant::now();
                let run = rt.spawn(generate::run(
                    cfg,
                    vec![Endpoint::from_url(&stub.url)].into(),
                    |_| {},
                    cancel.clone(),
                ));
                while stub.state.requests.load(Ordering::SeqCst) == before {
                    std::thread::sleep(Duration::from_micros(200));
                }
                total += t0.elapsed();
                took.push(t0.elapsed());
                cancel.cancel();
                rt.block_on(run).unwrap().unwrap();
            }
            total
        })
    });
    g.finish();
    if took.is_empty() {
        return; // criterion's filter left this benchmark out
    }
    let first = median(took);
    headline::line(
        "generate.resume",
        &format!("{:.2} s (median)", first.as_secs_f64()),
        "resuming after 600,000 of 654,676 done reaches its first new request in < 2 s",
        Some(first < Duration::from_secs(2)),
    );
}

/// `n` OpenAI Batch API chat lines, `{"custom_id":"p{i}",…}`.
fn write_batch_prompts(path: &Path, n: usize) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for i in 0..n {
        let line = json!({"custom_id": format!("p{i}"), "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": format!("prompt number {i}")}]}});
        writeln!(f, "{line}").unwrap();
    }
}

/// The real binary over the seed's 654,676 prompts against two instant servers: req/s and
/// the process's peak RSS (from wait4's rusage). With `batch`, the input is OpenAI Batch API
/// lines and the output the Batch API's (each body kept whole).
#[allow(
    clippy::zombie_processes,
    reason = "reaped by wait4, which also reports its rusage"
)]
fn binary_run(batch: bool) {
    let total = if headline::quick() {
        50_000
    } else {
        SEED_TOTAL
    };
    let a = start_stub(instant());
    let b = start_stub(instant());
    let tmp = tempfile::tempdir().unwrap();
    let prompts = tmp.path().join("prompts.jsonl");
    if batch {
        write_batch_prompts(&prompts, total);
    } else {
        write_prompts(&prompts, total);
    }
    let out = tmp.path().join("out");
    let t0 = Instant::now();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_fleet"))
        .args(["-q", "generate", "--prompts"])
        .arg(&prompts)
        .arg("--out")
        .arg(&out)
        .args(["--url", &a.url, "--url", &b.url])
        .spawn()
        .unwrap();
    let mut status = 0;
    // SAFETY: waiting for the child spawned above, by its pid, with a valid rusage buffer.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    let secs = t0.elapsed().as_secs_f64();
    assert_eq!(pid, child.id() as i32);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "fleet generate failed"
    );
    let rss_mb = usage.ru_maxrss as f64 / 1024.0;
    let written = std::fs::read_to_string(out.join("completions-00000.jsonl")).unwrap();
    let first: serde_json::Value = serde_json::from_str(written.lines().next().unwrap()).unwrap();
    assert_eq!(
        first.get("custom_id").is_some(),
        batch,
        "the output format: {first}"
    );
    let rate = total as f64 / secs;
    println!(
        "fleet generate (binary{}): {total} prompts in {secs:.1} s = {rate:.0} completed req/s, peak RSS {rss_mb:.1} MB",
        if batch { ", openai-batch" } else { "" },
    );
    if batch {
        // The same targets as fleet's records: < 64 MB, and the 10,000 req/s of the sim run.
        headline::line(
            "generate.batch_peak_rss",
            &format!("{rss_mb:.1} MB, {rate:.0} req/s ({total} prompts)"),
            "`--output-format openai-batch` on a 654,676-line Batch API file: peak RSS < 64 MB and ≥ 10,000 req/s",
            Some(rss_mb < 64.0 && rate >= 10_000.0),
        );
        return;
    }
    headline::line(
        "generate.peak_rss",
        &format!("{rss_mb:.1} MB ({total} prompts, {rate:.0} req/s)"),
        "`fleet generate`'s peak RSS on a 654,676-prompt input < 64 MB",
        Some(rss_mb < 64.0),
    );
}

/// Output tok/s of 8 no_buffer sims driven by the engine, measured by the sims' own counters
/// over the steady middle of the run, against the sum of their ideal throughput.
fn saturation(rt: &tokio::runtime::Runtime) {
    const SCALE: &str = "20";
    let sims: Vec<Sim> = (0..8)
        .map(|_| {
            Sim::start(&[
                "--mamba-radix-cache-strategy",
                "no_buffer",
                "--disable-overlap-schedule",
                "--sim-time-scale",
                SCALE,
            ])
        })
        .collect();
    let ideal: f64 = sims.iter().map(Sim::ideal_output_tok_s).sum();
    let (settle, window) = if headline::quick() { (2, 4) } else { (6, 15) };
    let tmp = tempfile::tempdir().unwrap();
    let prompts = tmp.path().join("prompts.jsonl");
    // The workload behind the sims' ideal: ~96-token prompts, natural outputs (mean 988).
    let lines: Vec<String> = (0..100_000)
        .map(|i| json!({"id": i, "prompt": format!("{i:08} {}", "lorem ipsum dolor sit amet ".repeat(14))}).to_string())
        .collect();
    write_lines(&prompts, &lines);
    for (label, mode) in [
        ("auto", generate::ConcurrencyMode::Auto),
        ("fixed 32", generate::ConcurrencyMode::Fixed(32)),
    ] {
        let out = tmp.path().join(format!("out-{}", label.replace(' ', "-")));
        let mut cfg = config(&prompts, &out);
        cfg.concurrency = mode;
        let cancel = CancellationToken::new();
        let endpoints: Vec<Endpoint> = sims.iter().map(|s| Endpoint::from_url(&s.url)).collect();
        let run = rt.spawn(generate::run(cfg, endpoints.into(), |_| {}, cancel.clone()));
        std::thread::sleep(Duration::from_secs(settle));
        let t1 = Instant::now();
        let before: f64 = sims.iter().map(Sim::generated_tokens).sum();
        std::thread::sleep(Duration::from_secs(window));
        let after: f64 = sims.iter().map(Sim::generated_tokens).sum();
        let measured = (after - before) / t1.elapsed().as_secs_f64();
        cancel.cancel();
        rt.block_on(run).unwrap().unwrap();
        println!(
            "saturation, 8 no_buffer sims at time scale {SCALE}, --concurrency {label}: \
             {measured:.0} output tok/s = {:.1}% of the sims' ideal {ideal:.0}",
            100.0 * measured / ideal
        );
        let share = 100.0 * measured / ideal;
        let measured = format!(
            "{share:.1}% ({measured:.0} of {ideal:.0} tok/s, {window} s window after {settle} s)"
        );
        match mode {
            generate::ConcurrencyMode::Auto => headline::line(
                "generate.saturation",
                &measured,
                "`fleet generate` on 8 no_buffer sims ≥ 97% of their ideal output tok/s",
                Some(share >= 97.0),
            ),
            _ => headline::line(
                "generate.saturation_fixed32",
                &measured,
                "the seed's fixed 32 per server, same sims (DESIGN: about 32/72 = 44%)",
                None,
            ),
        }
    }
}

/// Completed requests/s of the binary against two `--sim-instant` sims.
#[allow(clippy::zombie_processes, reason = "reaped by wait4")]
fn instant_sims() {
    let sims: Vec<Sim> = (0..2).map(|_| Sim::start(&["--sim-instant"])).collect();
    let tmp = tempfile::tempdir().unwrap();
    let prompts = tmp.path().join("prompts.jsonl");
    let n = if headline::quick() { 20_000 } else { 200_000 };
    write_prompts(&prompts, n);
    let t0 = Instant::now();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_fleet"))
        .args(["-q", "generate", "--max-tokens", "16", "--prompts"])
        .arg(&prompts)
        .arg("--out")
        .arg(tmp.path().join("out"))
        .args(["--url", &sims[0].url, "--url", &sims[1].url])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut status = 0;
    // SAFETY: waiting for the child spawned above, by its pid.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "fleet generate failed"
    );
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "fleet generate (binary) vs 2 --sim-instant sims: {n} prompts in {secs:.1} s = {:.0} completed req/s, peak RSS {:.1} MB",
        n as f64 / secs,
        usage.ru_maxrss as f64 / 1024.0
    );
    let rate = n as f64 / secs;
    headline::line(
        "generate.req_s",
        &format!("{rate:.0} req/s ({n} prompts in {secs:.1} s)"),
        "`fleet generate` against 2 `--sim-instant` sims ≥ 10,000 completed req/s on 2 cores",
        Some(rate >= 10_000.0),
    );
}

/// What one client run cost: its wall time from `t0`, its peak RSS and its own CPU time (user +
/// system), from wait4's rusage.
struct Run {
    secs: f64,
    rss_mb: f64,
    cpu_secs: f64,
}

fn wait_rusage(child: &std::process::Child, t0: Instant, what: &str) -> Run {
    let mut status = 0;
    // SAFETY: waiting for a child this bench spawned, by its pid, with a valid rusage buffer.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    let secs = t0.elapsed().as_secs_f64();
    assert_eq!(pid, child.id() as i32);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{what} failed"
    );
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Run {
        secs,
        rss_mb: usage.ru_maxrss as f64 / 1024.0,
        cpu_secs: tv(usage.ru_utime) + tv(usage.ru_stime),
    }
}

/// `fleet generate` against the seed-style aiohttp client (tests/fixtures/seed_client.py, run
/// with the real-SGLang venv's python, which has aiohttp), the same prompts, the same 8
/// `--sim-instant` sims, one after the other in one run: completed req/s of each and the ratio
/// (DESIGN §11: ≥ 5×).
#[allow(clippy::zombie_processes, reason = "reaped by wait4")]
fn vs_peer() {
    let python = real::RealSglang::find().python;
    let sims: Vec<Sim> = (0..8).map(|_| Sim::start(&["--sim-instant"])).collect();
    let urls: Vec<&str> = sims.iter().map(|s| s.url.as_str()).collect();
    let tmp = tempfile::tempdir().unwrap();
    let prompts = tmp.path().join("prompts.jsonl");
    let n = if headline::quick() { 20_000 } else { 200_000 };
    write_prompts(&prompts, n);

    // The sims' own CPU during a run: on 2 cores the servers and the client share the CPU, so
    // what the sims spend per request bounds the rate any client can reach here.
    let sims_cpu = || sims.iter().map(Sim::cpu_secs).sum::<f64>();
    let fleet_run = |bin: &std::ffi::OsStr, out: &str| {
        let before = sims_cpu();
        let t0 = Instant::now();
        let mut fleet = std::process::Command::new(bin);
        fleet
            .args(["-q", "generate", "--max-tokens", "16", "--prompts"])
            .arg(&prompts)
            .arg("--out")
            .arg(tmp.path().join(out))
            .stdout(std::process::Stdio::null());
        for url in &urls {
            fleet.args(["--url", url]);
        }
        let child = fleet.spawn().unwrap();
        let run = wait_rusage(&child, t0, "fleet generate");
        (run, sims_cpu() - before)
    };
    let (fleet, fleet_sims_cpu) = fleet_run(env!("CARGO_BIN_EXE_fleet").as_ref(), "out");
    // FLEET_AB_BIN: another build of fleet (e.g. an older commit's), run on the same sims and
    // prompts in the same run, for an A/B of the client.
    if let Some(ab) = std::env::var_os("FLEET_AB_BIN") {
        let (run, _) = fleet_run(&ab, "out-ab");
        println!(
            "A/B: {} {:.0} req/s ({:.1} s, {:.1} s of CPU, peak RSS {:.1} MB) against this build's {:.0} req/s",
            ab.to_string_lossy(),
            n as f64 / run.secs,
            run.secs,
            run.cpu_secs,
            run.rss_mb,
            n as f64 / fleet.secs
        );
    }

    let peer_out = tmp.path().join("peer.jsonl");
    let before = sims_cpu();
    let t0 = Instant::now();
    let mut peer = std::process::Command::new(&python);
    peer.arg(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/seed_client.py"
    ))
    .arg("--prompts")
    .arg(&prompts)
    .arg("--out")
    .arg(&peer_out)
    .args(["--max-tokens", "16"])
    .stdout(std::process::Stdio::null());
    for url in &urls {
        peer.args(["--url", url]);
    }
    let child = peer.spawn().unwrap();
    let peer_run = wait_rusage(&child, t0, "the seed-style aiohttp client");
    let peer_sims_cpu = sims_cpu() - before;
    let peer_lines = std::fs::read_to_string(&peer_out).unwrap().lines().count();
    assert_eq!(peer_lines, n, "the peer wrote one line per prompt");

    let n_f = n as f64;
    let (fleet_rate, peer_rate) = (n_f / fleet.secs, n_f / peer_run.secs);
    let ratio = fleet_rate / peer_rate;
    // The floor. On 2 cores fleet, its 8 sims and nothing else share the CPU, so what both
    // spend per request bounds fleet's rate; the peer is one Python thread, bound by one core.
    // The ratio any client can reach here follows, and so does the CPU per request fleet would
    // need for 5×.
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get()) as f64;
    let ms = |cpu: f64| cpu / n_f * 1e3;
    let (fleet_ms, sims_ms, peer_ms) = (
        ms(fleet.cpu_secs),
        ms(fleet_sims_cpu),
        ms(peer_run.cpu_secs),
    );
    let fleet_cap = cores / ((fleet_ms + sims_ms) / 1e3);
    let peer_cap = 1.0 / (peer_ms / 1e3);
    let need_ms = (cores / (5.0 * peer_rate) * 1e3 - sims_ms).max(0.0);
    println!(
        "8 --sim-instant sims, {n} prompts: fleet generate {fleet_rate:.0} req/s ({:.1} s, \
         {fleet_ms:.3} ms of CPU per request, peak RSS {:.1} MB), seed-style aiohttp \
         {peer_rate:.0} req/s ({:.1} s, {peer_ms:.3} ms of CPU per request, peak RSS {:.1} MB): \
         {ratio:.2}×; the sims spent {sims_ms:.3} ms of CPU per request under fleet ({:.3} under \
         the peer); fleet + sims cap fleet at {fleet_cap:.0} req/s on {cores} cores (it reached \
         {:.0}%), one core caps the peer at {peer_cap:.0} req/s (it reached {:.0}%); 5× needs \
         fleet at ≤ {need_ms:.3} ms of CPU per request",
        fleet.secs,
        fleet.rss_mb,
        peer_run.secs,
        peer_run.rss_mb,
        ms(peer_sims_cpu),
        fleet_rate / fleet_cap * 100.0,
        peer_rate / peer_cap * 100.0,
    );
    headline::line(
        "generate.vs_peer",
        &format!(
            "{ratio:.2}× ({fleet_rate:.0} vs {peer_rate:.0} req/s, {n} prompts, one run); floor: \
             fleet ({fleet_ms:.3} ms of CPU per request) and the 8 sims ({sims_ms:.3} ms) share \
             the {cores} cores, which caps fleet at {fleet_cap:.0} req/s (reached {:.0}%), while \
             the peer's one thread ({peer_ms:.3} ms) caps it at {peer_cap:.0} req/s (reached \
             {:.0}%); 5× here needs ≤ {need_ms:.3} ms of CPU per request",
            fleet_rate / fleet_cap * 100.0,
            peer_rate / peer_cap * 100.0,
        ),
        "`fleet generate` against 8 `--sim-instant` sims ≥ 5× the seed-style aiohttp client (32 per server) in the same run",
        Some(ratio >= 5.0),
    );
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut c = Criterion::default().configure_from_args();
    let filter = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .unwrap_or_default();
    if filter.is_empty() || "binary_654676".contains(&filter) {
        binary_run(false);
    }
    if filter.is_empty() || "batch_654676".contains(&filter) {
        binary_run(true);
    }
    if filter.is_empty() || "instant_sims".contains(&filter) {
        instant_sims();
    }
    if filter.is_empty() || "vs_peer".contains(&filter) {
        vs_peer();
    }
    if filter.is_empty() || "saturation".contains(&filter) {
        saturation(&rt);
    }
    engine_throughput(&mut c, &rt);
    resume_to_first_request(&mut c, &rt);
    c.final_summary();
}
