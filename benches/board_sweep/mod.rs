//! The world the layout benches share: `fleet sweep` (the real binary) of one profile on 8
//! simulated GPUs of a board, with the fake `nvidia-smi` printing that board's `topo -m`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde_json::Value;

pub const SIM: &str = env!("CARGO_BIN_EXE_sglang-sim");
const FLEET: &str = env!("CARGO_BIN_EXE_fleet");

pub struct BoardWorld {
    pub dir: tempfile::TempDir,
    board: PathBuf,
    profile: String,
}

impl BoardWorld {
    /// 8 GPUs of `board` (a `tests/fixtures/boards` name) and the profile `profile`, whose
    /// YAML `yaml` writes from the world's directory and a port base whose 8 ports are free.
    pub fn new(board: &str, profile: &str, yaml: impl FnOnce(&Path, u16) -> String) -> BoardWorld {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("fleet.yaml"),
            "hosts:\n  - name: local\n    gpus: [0, 1, 2, 3, 4, 5, 6, 7]\n",
        )
        .unwrap();
        std::fs::create_dir_all(dir.path().join("profiles")).unwrap();
        let text = yaml(dir.path(), free_base());
        std::fs::write(dir.path().join(format!("profiles/{profile}.yaml")), text).unwrap();
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        BoardWorld {
            board: root.join(format!("tests/fixtures/boards/{board}.txt")),
            dir,
            profile: profile.to_string(),
        }
    }

    /// `fleet --json sweep --profile PROFILE ARGS --out OUT` (OUT in the world's directory):
    /// its JSON and wall seconds.
    pub fn sweep(&self, args: &[&str], out: &str) -> (Value, f64) {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let path = format!(
            "{}:{}:{}",
            root.join("tests/fixtures/bin").display(),
            Path::new(SIM).parent().unwrap().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let began = Instant::now();
        let out = Command::new(FLEET)
            .current_dir(self.dir.path())
            .env("PATH", path)
            .env("FAKE_NVIDIA_SMI_TOPO", &self.board)
            .env("FLEET_RUN_DIR", self.dir.path().join("run"))
            .env("SGLANG_SIM_GPU_STATE_DIR", self.dir.path().join("gpus"))
            .env_remove("FLEET_CONFIG")
            .args(["--config", "fleet.yaml", "--json", "sweep", "--profile"])
            .arg(&self.profile)
            .args(args)
            .arg("--out")
            .arg(self.dir.path().join(out))
            .output()
            .unwrap();
        let wall = began.elapsed().as_secs_f64();
        let text = String::from_utf8_lossy(&out.stdout);
        let v = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{e}: {text}\n{}", String::from_utf8_lossy(&out.stderr)));
        (v, wall)
    }
}

/// A port base whose 8 ports are free now (GPU i serves on base + i).
fn free_base() -> u16 {
    (20000u16..60000)
        .step_by(97)
        .find(|base| (0..8).all(|i| std::net::TcpListener::bind(("127.0.0.1", base + i)).is_ok()))
        .expect("8 free ports")
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
