//! The `fleet` binary beside a real Slurm cluster ([`super::slurm`]): a temp dir with a
//! `fleet.yaml` of one Slurm host `hpc`, a sim profile, and the run directory, and the commands
//! pointed at the cluster by `SLURM_CONF` as a user's shell would be.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::local_fleet::test_path;
use super::slurm::{PARTITION, Proc, SlurmCluster};

pub const LONG: Duration = Duration::from_secs(90);

/// A fleet directory (inventory, profiles, run directory) beside a cluster.
pub struct SlurmFleet {
    pub dir: tempfile::TempDir,
    pub cluster: SlurmCluster,
}

impl SlurmFleet {
    pub fn new(cluster: SlurmCluster, slurm_block: &str, port_base: u16) -> SlurmFleet {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("profiles")).unwrap();
        std::fs::write(
            d.join("fleet.yaml"),
            format!("hosts:\n  - name: hpc\n    slurm:\n{slurm_block}"),
        )
        .unwrap();
        std::fs::write(
            d.join("profiles/sim.yaml"),
            format!(
                "model: /models/test\nlauncher: [sglang-sim]\nport_base: {port_base}\n\
                 server:\n  mamba_strategy: no_buffer\n\
                 env:\n  SGLANG_SIM_TIME_SCALE: \"100\"\n  SGLANG_SIM_STARTUP_SECS: \"20\"\n\
                 health: {{startup_timeout: 60s, poll: 1s}}\n"
            ),
        )
        .unwrap();
        SlurmFleet { dir, cluster }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `fleet ARGS`, pointed at the cluster by SLURM_CONF as a user's shell would be.
    pub fn fleet(&self, args: &[&str]) -> Output {
        let mut child = self.spawn(args);
        let out = wait_with_timeout(&mut child, Duration::from_secs(180));
        out.unwrap_or_else(|| panic!("fleet {args:?} ran for 3 minutes"))
    }

    /// `fleet ARGS` started, its output piped.
    pub fn spawn(&self, args: &[&str]) -> std::process::Child {
        let (k, v) = self.cluster.env();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_fleet"));
        cmd.current_dir(self.path())
            .env("PATH", test_path())
            .env("FLEET_RUN_DIR", self.path().join("run"))
            .env(k, v)
            .env_remove("FLEET_CONFIG")
            .env_remove("FLEET_PROFILES_DIR")
            .env_remove("FLEET_LOG")
            .stdin(Stdio::null())
            .args(args);
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.fleet(args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "fleet {args:?}:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn sims(&self) -> Vec<Proc> {
        self.cluster
            .job_processes()
            .into_iter()
            .filter(|p| p.program() == "sglang-sim")
            .collect()
    }

    /// `generate` of `n` prompts into `out` at `max_tokens`: the ids answered, each once (a
    /// second answer to one fails the read).
    pub fn job(&self, n: usize, max_tokens: u32) -> usize {
        write_prompts(&self.path().join("prompts.jsonl"), n);
        let max = max_tokens.to_string();
        self.ok(&[
            "-q",
            "generate",
            "--prompts",
            "prompts.jsonl",
            "--out",
            "out",
            "--max-tokens",
            &max,
        ]);
        super::local_fleet::completion_ids(&self.path().join("out")).len()
    }

    /// fleet's jobs in squeue, by name, that are not over.
    pub fn fleet_jobs(&self) -> String {
        self.cluster
            .run(&["squeue", "--noheader", "--name=fleet-hpc", "--format=%i %T"])
            .trim()
            .to_string()
    }
}

pub fn wait_with_timeout(child: &mut std::process::Child, limit: Duration) -> Option<Output> {
    let t0 = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            let mut stdout = Vec::new();
            let mut stderr = Vec::new();
            use std::io::Read;
            // A pipe a caller took (to watch it as it comes) is theirs to read.
            if let Some(mut out) = child.stdout.take() {
                out.read_to_end(&mut stdout).ok();
            }
            if let Some(mut err) = child.stderr.take() {
                err.read_to_end(&mut stderr).ok();
            }
            let status = child.wait().unwrap();
            return Some(Output {
                status,
                stdout,
                stderr,
            });
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The `slurm:` block of a host that asks the test partition for `gpus` GPUs for `minutes`.
pub fn allocation(gpus: u32, minutes: u32) -> String {
    format!("      partition: {PARTITION}\n      gpus: {gpus}\n      time: {minutes}\n")
}

pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < LONG, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn write_prompts(path: &PathBuf, n: usize) {
    let prompts: String = (0..n)
        .map(|i| format!("{{\"id\":\"q{i}\",\"prompt\":\"Question {i}: why is the sky blue?\"}}\n"))
        .collect();
    std::fs::write(path, prompts).unwrap();
}
