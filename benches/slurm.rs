//! `fleet up` of 16 sims (3 s load) as job steps on a real two-node Slurm cluster (the tests'
//! cluster, tests/common/slurm.rs), against the same 16 servers started by hand in the same
//! run: `sbatch` of an allocation of the same shape, squeue polled every 20 ms until it runs,
//! then one `srun --jobid J --exact -N1 -n1 --gres=gpu:1 -w NODE` per server, all at once, each
//! with the command line and environment `fleet up --dry-run` gives, and /health polled every
//! 10 ms per server until it answers 200. Target: `up` ≤ 1.3× by hand, medians of the rounds.
//! Needs root, Debian's slurm-wlm and munge (scripts/test installs them).
//!
//!     cargo bench --bench slurm [-- --quick]

#[path = "../tests/common/mod.rs"]
mod common;
mod headline;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::local_fleet::{SIM, test_path};
use common::slurm::{Options, PARTITION, SlurmCluster};
use serde_json::Value;

const SERVERS: u16 = 16;
const LIMIT: Duration = Duration::from_secs(120);

/// Whether `GET /health` at `address:port` answers 200.
fn healthy(address: &str, port: u16) -> bool {
    let Ok(mut s) = std::net::TcpStream::connect((address, port)) else {
        return false;
    };
    let _ = s.write_all(b"GET /health HTTP/1.0\r\nHost: x\r\n\r\n");
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && head.ends_with(b"200")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A fleet directory beside the cluster: one Slurm host of 16 GPUs and the sim profile.
struct Bench {
    dir: tempfile::TempDir,
    cluster: SlurmCluster,
}

impl Bench {
    fn new(cluster: SlurmCluster, port_base: u16) -> Bench {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("profiles")).unwrap();
        std::fs::write(
            d.join("fleet.yaml"),
            format!(
                "hosts:\n  - name: hpc\n    slurm:\n      partition: {PARTITION}\n      \
                 gpus: {SERVERS}\n      time: 30\n"
            ),
        )
        .unwrap();
        std::fs::write(
            d.join("profiles/sim.yaml"),
            format!(
                "model: /models/test\nlauncher: [{SIM}]\nport_base: {port_base}\nserver:\n  \
                 mamba_strategy: no_buffer\nenv:\n  SGLANG_SIM_STARTUP_SECS: \"3\"\n"
            ),
        )
        .unwrap();
        Bench { dir, cluster }
    }

    fn fleet(&self, args: &[&str]) -> Output {
        let (k, v) = self.cluster.env();
        let out = Command::new(env!("CARGO_BIN_EXE_fleet"))
            .current_dir(self.dir.path())
            .env("PATH", test_path())
            .env("FLEET_RUN_DIR", self.dir.path().join("run"))
            .env(k, v)
            .env_remove("FLEET_CONFIG")
            .env_remove("FLEET_PROFILES_DIR")
            .env_remove("FLEET_LOG")
            .stdin(Stdio::null())
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "fleet {args:?}:\n{}\n{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        out
    }

    /// fleet's and the by-hand jobs that are not over.
    fn jobs(&self) -> String {
        self.cluster
            .run(&["squeue", "--noheader", "--format=%i %j %T"])
            .trim()
            .to_string()
    }

    /// Waits until squeue lists no job and no sim of the cluster runs.
    fn wait_idle(&self) {
        let t0 = Instant::now();
        loop {
            let sims = self
                .cluster
                .job_processes()
                .iter()
                .filter(|p| p.program() == "sglang-sim")
                .count();
            if sims == 0 && self.jobs().is_empty() {
                return;
            }
            assert!(t0.elapsed() < LIMIT, "still there: {}", self.jobs());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `fleet up`, timed; `-v` shows the phases, kept in the log.
    fn up(&self) -> Duration {
        let started = Instant::now();
        let out = self.fleet(&["-v", "up", "--profile", "sim"]);
        let took = started.elapsed();
        for line in text(&out.stderr).lines().filter(|l| l.contains("phase")) {
            println!("  {line}");
        }
        self.fleet(&["-q", "down", "--grace", "10s"]);
        self.wait_idle();
        took
    }

    /// The same servers by hand, timed from `sbatch` to every /health 200.
    fn by_hand(&self, plan: &[Server]) -> Duration {
        let out_file = self.dir.path().join("by-hand-%j.out");
        let started = Instant::now();
        let job = self
            .cluster
            .run(&[
                "sbatch",
                "--parsable",
                "--job-name=by-hand",
                &format!("--partition={PARTITION}"),
                &format!("--ntasks={SERVERS}"),
                "--gpus-per-task=1",
                "--time=30",
                &format!("--output={}", out_file.display()),
                "--wrap=exec sleep infinity",
            ])
            .trim()
            .to_string();
        loop {
            let state = self
                .cluster
                .run(&["squeue", "--noheader", "-j", &job, "-o", "%T"]);
            if state.trim() == "RUNNING" {
                break;
            }
            assert!(started.elapsed() < LIMIT, "job {job}: {state}");
            std::thread::sleep(Duration::from_millis(20));
        }
        let logs = self.dir.path().join("by-hand");
        std::fs::create_dir_all(&logs).unwrap();
        let mut sruns: Vec<Child> = plan
            .iter()
            .map(|s| {
                let log = logs.join(format!("{}.log", s.port));
                let mut cmd = self.cluster.command("srun");
                cmd.args([
                    &format!("--jobid={job}"),
                    "--exact",
                    "-N1",
                    "-n1",
                    "--gres=gpu:1",
                    "-w",
                    &s.node,
                    &format!("--output={}", log.display()),
                    "--",
                ])
                .args(&s.argv)
                .envs(&s.env)
                .env("PATH", test_path())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
                cmd.spawn().expect("srun")
            })
            .collect();
        // One poller per server: a server still warming up holds a /health request open.
        std::thread::scope(|scope| {
            for s in plan {
                scope.spawn(move || {
                    while !healthy(&s.addr, s.port) {
                        assert!(started.elapsed() < LIMIT, "never ready by hand");
                        std::thread::sleep(Duration::from_millis(10));
                    }
                });
            }
        });
        let took = started.elapsed();
        self.cluster.run(&["scancel", &job]);
        for s in &mut sruns {
            s.wait().unwrap();
        }
        self.wait_idle();
        took
    }
}

/// One server of the dry run: where it runs and how.
struct Server {
    node: String,
    addr: String,
    port: u16,
    argv: Vec<String>,
    env: BTreeMap<String, String>,
}

/// The servers `up --dry-run` plans, each on the node whose NodeAddr it binds. The dry run
/// looks at the allocation, so it makes one; `down` gives it back.
fn plan(b: &Bench) -> Vec<Server> {
    let out = b.fleet(&["--json", "up", "--profile", "sim", "--dry-run"]);
    b.fleet(&["-q", "down", "--grace", "10s"]);
    b.wait_idle();
    let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
    let node_of: BTreeMap<&str, &str> = b
        .cluster
        .nodes
        .iter()
        .map(|n| (n.addr.as_str(), n.name.as_str()))
        .collect();
    plan.as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let argv: Vec<String> = s["argv"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap().to_string())
                .collect();
            let host = argv.iter().position(|a| a == "--host").unwrap();
            let addr = argv[host + 1].clone();
            Server {
                node: node_of[addr.as_str()].to_string(),
                port: s["port"].as_u64().unwrap() as u16,
                env: s["env"]
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                    .collect(),
                argv,
                addr,
            }
        })
        .collect()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let rounds = if headline::quick() { 1 } else { 3 };
    let cluster = SlurmCluster::start(Options::default());
    println!("cluster up in {:.2} s", cluster.startup.as_secs_f64());
    let b = Bench::new(cluster, common::free_port_base(SERVERS));
    let plan = plan(&b);
    assert_eq!(plan.len(), SERVERS as usize);
    let (mut ups, mut hands) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        // Alternate which goes first, so neither always meets a cluster just used.
        if round % 2 == 0 {
            hands.push(b.by_hand(&plan));
            ups.push(b.up());
        } else {
            ups.push(b.up());
            hands.push(b.by_hand(&plan));
        }
        println!(
            "round {round}: up {:.2} s, by hand {:.2} s",
            ups[round].as_secs_f64(),
            hands[round].as_secs_f64()
        );
    }
    let secs = |d: &Duration| format!("{:.2}", d.as_secs_f64());
    println!(
        "up: {}; by hand: {}",
        ups.iter().map(secs).collect::<Vec<_>>().join(", "),
        hands.iter().map(secs).collect::<Vec<_>>().join(", ")
    );
    let (up, hand) = (median(ups), median(hands));
    let ratio = up.as_secs_f64() / hand.as_secs_f64();
    headline::line(
        "slurm.up_vs_hand",
        &format!(
            "{ratio:.2}× ({} s vs {} s by hand, medians of {rounds})",
            secs(&up),
            secs(&hand)
        ),
        "`fleet up` of 16 sims (3 s load) as steps on 2 Slurm nodes ≤ 1.3× `sbatch` + 16 `srun` by hand",
        Some(ratio <= 1.3),
    );
}
