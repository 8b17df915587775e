//! `fleet up` of 8 sglang-sim instances with the shipped 5 s simulated load
//! (profiles/sim-no-buffer.yaml, examples/local-sim.yaml) and `fleet down` of 8, through the
//! real binary. Targets: up ≤ 5 s + 1.5 s (parallel start, readiness seen within 1 s);
//! down ≤ 2 s (servers that exit on SIGTERM). Prints the median of each over several rounds.
//!
//!     cargo bench --bench launch [-- --quick]

mod headline;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

struct Bench {
    run_dir: tempfile::TempDir,
}

impl Bench {
    fn fleet(&self, args: &[&str]) -> Duration {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let bin_dir = PathBuf::from(env!("CARGO_BIN_EXE_sglang-sim"))
            .parent()
            .unwrap()
            .to_path_buf();
        let path = format!(
            "{}:{}",
            bin_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let started = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_fleet"))
            .current_dir(root)
            .env("PATH", path)
            .env("FLEET_RUN_DIR", self.run_dir.path())
            .args(["-q", "--config", "examples/local-sim.yaml"])
            .args(args)
            .output()
            .expect("run fleet");
        let took = started.elapsed();
        assert!(
            out.status.success(),
            "fleet {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
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
    let (mut ups, mut downs) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
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
        "  down  median {:>6} s  (all: {})",
        secs(&median(downs.clone())),
        downs.iter().map(secs).collect::<Vec<_>>().join(", ")
    );
    let (up, down) = (median(ups), median(downs));
    headline::line(
        "launch.up",
        &format!("{} s (median of {rounds})", secs(&up)),
        "`fleet up` of 8 sims with a 5 s load ≤ 6.5 s (parallel start, readiness seen within 1 s)",
        Some(up <= Duration::from_millis(6500)),
    );
    headline::line(
        "launch.down",
        &format!("{} s (median of {rounds})", secs(&down)),
        "`fleet down` of 8 instances ≤ 2 s",
        Some(down <= Duration::from_secs(2)),
    );
}
