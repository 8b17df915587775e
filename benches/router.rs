//! The gateway against fleet's own placement (issue 40), through the real `fleet` binary, the
//! real `smg` 1.13.0 (`scripts/smg-env`) and 8 real `sglang-sim` servers, on the prefix issue's
//! shared-prefix job (tests/prefix_job: 40 long system prompts × 400 short questions,
//! shuffled, on sims whose caches hold about 7 system prompts each): `fleet generate` placing
//! every prompt itself (`--placement auto`, which picks prefix), and the same job sent through
//! the gateway under `cache_aware` and under `round_robin`, with as many requests in flight in
//! all (16 per server; through the gateway's one endpoint, 128). For each: time, prompt tokens
//! served from the cache, and that every prompt was answered exactly once.
//!
//!     cargo bench --bench router [-- --quick]
//!
//! `--quick` runs 40 × 40 prompts: a smoke test, not the numbers.

#[path = "../tests/generate_common/mod.rs"]
mod generate_common;
mod headline;
#[path = "../tests/prefix_job/mod.rs"]
mod prefix_job;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use generate_common::{Sim, assert_exactly_once, progress, write_lines};
use prefix_job::*;

#[path = "../tests/common/smg.rs"]
mod smg;
use smg::smg;

const PREFILL_PER_TOKEN_MS: &str = "0.02";

/// The gateway over `workers`, on a free port, ready with all of them.
struct Gateway {
    child: Child,
    url: String,
}

impl Gateway {
    fn start(workers: &[&str], policy: &str, log: &Path) -> Gateway {
        let port = free_port();
        let mut c = Command::new(smg());
        c.args(["launch", "--host", "127.0.0.1", "--port", &port.to_string()])
            .args([
                "--prometheus-host",
                "127.0.0.1",
                "--prometheus-port",
                &free_port().to_string(),
            ])
            .args(["--policy", policy, "--log-level", "warn", "--worker-urls"])
            .args(workers)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(log).unwrap())
            .stderr(Stdio::null());
        let gw = Gateway {
            child: c.spawn().unwrap(),
            url: format!("http://127.0.0.1:{port}"),
        };
        let t0 = Instant::now();
        while ready(port) < workers.len() {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "the gateway did not come up"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        gw
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Workers the gateway on `port` lists as ready (0 while it does not answer).
fn ready(port: u16) -> usize {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return 0;
    };
    let _ = write!(s, "GET /workers HTTP/1.0\r\nHost: x\r\n\r\n");
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text.matches("\"status\":\"ready\"").count()
}

fn share(out: &Path) -> f64 {
    let p = progress(out);
    p["cached_tokens"].as_u64().unwrap_or(0) as f64
        / p["total_input_tokens"].as_u64().unwrap().max(1) as f64
}

/// One run of the job over fresh sims, through the gateway under `policy` or (None) placed by
/// fleet: its time and the share of prompt tokens cached; exactly-once is asserted.
fn one_run(dir: &Path, prompts: &Path, n: usize, policy: Option<&str>) -> (Duration, f64) {
    let sims: Vec<Sim> = (0..SERVERS)
        .map(|_| Sim::start(&sim_args(PREFILL_PER_TOKEN_MS)))
        .collect();
    let urls: Vec<&str> = sims.iter().map(|s| s.url.as_str()).collect();
    let name = policy.unwrap_or("placement");
    let gateway = policy.map(|p| Gateway::start(&urls, p, &dir.join(format!("{name}.log"))));
    let targets: Vec<&str> = match &gateway {
        Some(g) => vec![g.url.as_str()],
        None => urls.clone(),
    };
    let out = dir.join(name);
    // `--concurrency` is per endpoint: through the gateway's one, the same total in flight.
    let total = (16 * SERVERS).to_string();
    let mut args: Vec<&str> = RUN_ARGS.to_vec();
    if gateway.is_some() {
        let at = args.iter().position(|a| *a == "--concurrency").unwrap() + 1;
        args[at] = &total;
    }
    let mut c = Command::new(env!("CARGO_BIN_EXE_fleet"));
    c.args(["-q", "generate", "--prompts"])
        .arg(prompts)
        .arg("--out")
        .arg(&out)
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for u in &targets {
        c.arg("--url").arg(u);
    }
    let t0 = Instant::now();
    let o = c.output().unwrap();
    let took = t0.elapsed();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_exactly_once(&out, n);
    (took, share(&out))
}

fn main() {
    let questions = if headline::quick() { 40 } else { 400 };
    let n = SYSTEMS * questions;
    let tmp = tempfile::tempdir().unwrap();
    let prompts = tmp.path().join("prompts.jsonl");
    let order = shuffled(n);
    write_lines(
        &prompts,
        &order.iter().map(|&i| line(i)).collect::<Vec<_>>(),
    );
    let (placed, placed_hits) = one_run(tmp.path(), &prompts, n, None);
    let (cache, cache_hits) = one_run(tmp.path(), &prompts, n, Some("cache_aware"));
    let (rr, rr_hits) = one_run(tmp.path(), &prompts, n, Some("round_robin"));
    println!(
        "{n} prompts on {SERVERS} sims: fleet placement {placed:.2?} ({:.1}% cached), gateway \
         cache_aware {cache:.2?} ({:.1}% cached), gateway round_robin {rr:.2?} ({:.1}% cached); \
         every prompt answered exactly once in each",
        placed_hits * 100.0,
        cache_hits * 100.0,
        rr_hits * 100.0
    );
    let row = |t: Duration, h: f64| {
        format!(
            "{:.1} s, {:.1}% cached, {:.0} prompts/s, exactly once",
            t.as_secs_f64(),
            h * 100.0,
            n as f64 / t.as_secs_f64()
        )
    };
    headline::line(
        "router.placement",
        &row(placed, placed_hits),
        "the shared-prefix job placed by fleet (`--placement auto`), for comparison",
        None,
    );
    headline::line(
        "router.cache_aware",
        &row(cache, cache_hits),
        "the same job through the gateway (smg 1.13.0, `cache_aware`)",
        None,
    );
    headline::line(
        "router.round_robin",
        &row(rr, rr_hits),
        "the same job through the gateway (`round_robin`)",
        None,
    );
}
