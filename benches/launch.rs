//! `fleet up` of 8 sglang-sim instances with the shipped 5 s simulated load
//! (profiles/sim-no-buffer.yaml, examples/local-sim.yaml) and `fleet down` of 8, through the
//! real binary. Targets: up ≤ 5 s + 1.5 s (parallel start, readiness seen within 1 s);
//! down ≤ 2 s (servers that exit on SIGTERM).
//!
//!     cargo bench --bench launch

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};

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

fn launch(c: &mut Criterion) {
    let b = Bench {
        run_dir: tempfile::tempdir().unwrap(),
    };
    let mut group = c.benchmark_group("launch");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_secs(70));
    group.bench_function("up 8 sim instances, 5 s load", |bench| {
        bench.iter_custom(|iters| {
            (0..iters)
                .map(|_| {
                    let took = b.up();
                    b.down();
                    took
                })
                .sum()
        })
    });
    group.bench_function("down 8 instances", |bench| {
        bench.iter_custom(|iters| {
            (0..iters)
                .map(|_| {
                    b.up();
                    b.down()
                })
                .sum()
        })
    });
    group.finish();
}

criterion_group!(benches, launch);
criterion_main!(benches);
