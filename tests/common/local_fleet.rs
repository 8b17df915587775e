//! A local simulated fleet for tests of the real binary: a temp dir holding `fleet.yaml` (one
//! host `local` with N GPUs), `profiles/`, the run dir and the sims' fake-GPU state, and the
//! `fleet` command pointed at it with `sglang-sim` and the fake `nvidia-smi` on PATH. Dropping
//! it runs `fleet down`, so no server outlives a test, passed or failed.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use tempfile::TempDir;

use super::fixtures_bin;

/// `sglang-sim`, built with the tests.
pub const SIM: &str = env!("CARGO_BIN_EXE_sglang-sim");

/// PATH with the fake `nvidia-smi` and the built binaries first (so `launcher: [sglang-sim]`
/// resolves).
pub fn test_path() -> String {
    format!(
        "{}:{}:{}",
        fixtures_bin().display(),
        Path::new(SIM).parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// A local simulated fleet in a temp dir; `fleet down` runs when it is dropped.
pub struct LocalFleet {
    pub dir: TempDir,
}

impl LocalFleet {
    /// `fleet.yaml` with one host `local` holding GPUs `0..gpus`, and an empty `profiles/`.
    pub fn new(gpus: u32) -> LocalFleet {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("profiles")).unwrap();
        let list: Vec<String> = (0..gpus).map(|g| g.to_string()).collect();
        std::fs::write(
            dir.path().join("fleet.yaml"),
            format!("hosts:\n  - name: local\n    gpus: [{}]\n", list.join(", ")),
        )
        .unwrap();
        LocalFleet { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `FLEET_RUN_DIR`: the instance records of the local host.
    pub fn run_dir(&self) -> PathBuf {
        self.path().join("run")
    }

    /// `SGLANG_SIM_GPU_STATE_DIR`: the memory the sims hold, as the fake `nvidia-smi` reads it.
    pub fn gpu_state(&self) -> PathBuf {
        self.path().join("gpus")
    }

    /// Writes `profiles/NAME.yaml`.
    pub fn write_profile(&self, name: &str, yaml: &str) {
        std::fs::write(self.path().join(format!("profiles/{name}.yaml")), yaml).unwrap();
    }

    /// `fleet`, run from the fleet's dir with its run dir, no stdin and none of the caller's
    /// `FLEET_*` settings; for tests that spawn it.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_fleet"));
        cmd.current_dir(self.path())
            .env("PATH", test_path())
            .env("FLEET_RUN_DIR", self.run_dir())
            .env("SGLANG_SIM_GPU_STATE_DIR", self.gpu_state())
            .env_remove("FLEET_CONFIG")
            .env_remove("FLEET_PROFILES_DIR")
            .env_remove("FLEET_LOG")
            .stdin(Stdio::null());
        cmd
    }

    /// [`LocalFleet::command`], killed if it runs for more than two minutes.
    pub fn fleet(&self) -> assert_cmd::Command {
        let mut cmd = assert_cmd::Command::from_std(self.command());
        cmd.timeout(Duration::from_secs(120));
        cmd
    }
}

impl Drop for LocalFleet {
    fn drop(&mut self) {
        let _ = self.command().args(["down", "--grace", "2s"]).output();
    }
}

/// The ids of every completion in a `generate` output dir, failing the test on an id written
/// twice.
pub fn completion_ids(out: &Path) -> HashSet<String> {
    let mut ids = HashSet::new();
    for v in super::generate::completions(out) {
        let id = v["id"].as_str().unwrap().to_string();
        assert!(ids.insert(id), "id {} written twice", v["id"]);
    }
    ids
}
