//! What the sweep benchmarks share: a local fleet of 8 simulated GPUs in a directory of its own
//! (`fleet.yaml`, `profiles/base.yaml` with sglang-sim as the launcher on free ports) and the
//! real `fleet` binary run in it.

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;

pub const SIM: &str = env!("CARGO_BIN_EXE_sglang-sim");
pub const FLEET: &str = env!("CARGO_BIN_EXE_fleet");
pub const GPUS: u16 = 8;

/// A base port with the 8 ports above it free now.
pub fn port_base() -> u16 {
    (41_000..60_000)
        .step_by(97)
        .find(|b| (0..GPUS).all(|k| TcpListener::bind(("127.0.0.1", b + k)).is_ok()))
        .expect("free ports")
}

/// `fleet.yaml` with one local host of 8 GPUs, and an empty `profiles/`.
pub fn write_fleet(dir: &Path) {
    let gpus: Vec<String> = (0..GPUS).map(|g| g.to_string()).collect();
    std::fs::write(
        dir.join("fleet.yaml"),
        format!("hosts:\n  - name: local\n    gpus: [{}]\n", gpus.join(", ")),
    )
    .unwrap();
    std::fs::create_dir_all(dir.join("profiles")).unwrap();
}

/// `profiles/base.yaml`: the sim at `mem_fraction_static: 0.85`, a 1 s load, answers of
/// `output_tokens` on average, ports from `port_base`.
#[allow(dead_code)]
pub fn write_base(dir: &Path, port_base: u16, output_tokens: u64) {
    write_base_with(dir, port_base, output_tokens, &[]);
}

/// [`write_base`] with more of the sim's environment (`SGLANG_SIM_*`): a model the sweep is
/// not told about.
pub fn write_base_with(dir: &Path, port_base: u16, output_tokens: u64, env: &[(&str, String)]) {
    let more: String = env
        .iter()
        .map(|(k, v)| format!("  {k}: \"{v}\"\n"))
        .collect();
    std::fs::write(
        dir.join("profiles/base.yaml"),
        format!(
            "model: /models/sim-27b\nlauncher: [{SIM}]\nport_base: {port_base}\nserver:\n  mem_fraction_static: 0.85\n  context_length: 8192\nenv:\n  SGLANG_SIM_STARTUP_SECS: \"1\"\n  SGLANG_SIM_MEAN_OUTPUT_TOKENS: \"{output_tokens}\"\n{more}  SGLANG_SIM_GPU_STATE_DIR: {}\nhealth: {{startup_timeout: 60s, poll: 200ms}}\n",
            dir.join("gpus").display()
        ),
    )
    .unwrap();
}

/// `fleet ARGS` in `dir`, with its run directory there too.
pub fn command(dir: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(FLEET);
    cmd.args(["--config", "fleet.yaml", "--profiles-dir", "profiles"])
        .args(args)
        .current_dir(dir)
        .env("FLEET_RUN_DIR", dir.join("run"))
        .env_remove("FLEET_LOG");
    cmd
}

/// `fleet ARGS` run to its end: whether it succeeded, its stdout and its stderr.
pub fn fleet(dir: &Path, args: &[&str]) -> (bool, String, String) {
    let out = command(dir, args).output().expect("run fleet");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
