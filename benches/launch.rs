//! `fleet up` of 8 sglang-sim instances with the shipped 5 s simulated load
//! (profiles/sim-no-buffer.yaml, examples/local-sim.yaml) and `fleet down` of 8, through the
//! real binary. Targets: up ≤ the time one such server takes to turn ready on its own + 1.5 s
//! (parallel start, readiness seen within 1 s: DESIGN §11); down ≤ 2 s (servers that exit on
//! SIGTERM). Prints the median of each over several rounds.
//!
//! The server's own time to ready is measured here, not assumed: like SGLang 0.5.23 the sim opens
//! its port only after the load and answers /health 200 only after a warm-up generation, so it
//! is ready some time after its 5 s load.
//!
//!     cargo bench --bench launch [-- --quick]

mod headline;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct Bench {
    run_dir: tempfile::TempDir,
}

/// `PATH` with the built sglang-sim first, as the shipped profile finds it there.
fn path() -> String {
    let bin_dir = PathBuf::from(env!("CARGO_BIN_EXE_sglang-sim"))
        .parent()
        .unwrap()
        .to_path_buf();
    format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// Whether `GET /health` on the port answers 200.
fn healthy(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && head.ends_with(b"200")
}

impl Bench {
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_fleet"));
        cmd.current_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
            .env("PATH", path())
            .env("FLEET_RUN_DIR", self.run_dir.path())
            .args(["-q", "--config", "examples/local-sim.yaml"])
            .args(args);
        cmd
    }

    fn fleet(&self, args: &[&str]) -> Duration {
        let started = Instant::now();
        let out = self.command(args).output().expect("run fleet");
        let took = started.elapsed();
        assert!(
            out.status.success(),
            "fleet {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        took
    }

    /// How long one server of the profile takes from its start to /health 200 on its own: the
    /// command line and environment `up --dry-run` gives for GPU 0, started here directly and
    /// polled every 10 ms.
    fn ready_alone(&self) -> Duration {
        let out = self
            .command(&[
                "--json",
                "up",
                "--profile",
                "sim-no-buffer",
                "--gpus",
                "0",
                "--dry-run",
            ])
            .output()
            .expect("run fleet");
        let plan: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("the dry run's JSON");
        let server = &plan[0];
        let argv: Vec<&str> = server["argv"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        let port = server["port"].as_u64().unwrap() as u16;
        let mut cmd = Command::new(argv[0]);
        cmd.args(&argv[1..])
            .env("PATH", path())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        for (k, v) in server["env"].as_object().unwrap() {
            cmd.env(k, v.as_str().unwrap());
        }
        let started = Instant::now();
        let mut child = cmd.spawn().expect("start the sim");
        while !healthy(port) {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the sim never turned ready"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let took = started.elapsed();
        // SAFETY: signalling the child this bench spawned, by its pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let _ = child.wait();
        took
    }
    fn up(&self) -> Duration {
        self.fleet(&["up", "--profile", "sim-no-buffer"])
    }
    fn down(&self) -> Duration {
        self.fleet(&["down", "--grace", "10s"])
    }
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn main() {
    // Each round is a whole up and down of 8 servers (about 7 s), so a few rounds give a
    // stable median; criterion's minimum of 10 samples per number would take minutes.
    let rounds = if headline::quick() { 1 } else { 5 };
    let b = Bench {
        run_dir: tempfile::tempdir().unwrap(),
    };
    let (mut ups, mut downs, mut alone) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        alone.push(b.ready_alone());
        ups.push(b.up());
        downs.push(b.down());
    }
    let secs = |d: &Duration| format!("{:.2}", d.as_secs_f64());
    println!("fleet up/down of 8 sim instances with a 5 s load ({rounds} rounds)");
    println!(
        "  up    median {:>6} s  (all: {})",
        secs(&median(ups.clone())),
        ups.iter().map(secs).collect::<Vec<_>>().join(", ")
    );
    println!(
        "  one server alone, start to /health 200: median {:>6} s  (all: {})",
        secs(&median(alone.clone())),
        alone.iter().map(secs).collect::<Vec<_>>().join(", ")
    );
    println!(
        "  down  median {:>6} s  (all: {})",
        secs(&median(downs.clone())),
        downs.iter().map(secs).collect::<Vec<_>>().join(", ")
    );
    let (up, down, alone) = (median(ups), median(downs), median(alone));
    let limit = alone + Duration::from_millis(1500);
    headline::line(
        "launch.up",
        &format!(
            "{} s (median of {rounds}; one server alone is ready after {} s, so ≤ {} s)",
            secs(&up),
            secs(&alone),
            secs(&limit)
        ),
        "`fleet up` of 8 sims with a 5 s load ≤ one alone + 1.5 s (parallel start, readiness seen within 1 s)",
        Some(up <= limit),
    );
    headline::line(
        "launch.down",
        &format!("{} s (median of {rounds})", secs(&down)),
        "`fleet down` of 8 instances ≤ 2 s",
        Some(down <= Duration::from_secs(2)),
    );
}
