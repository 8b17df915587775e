//! `fleet gpus` through the real binary: the example Proxmox inventory reached through real
//! sshd + fake `pct`, a local host read with the fake `nvidia-smi` (NVML is absent here), the
//! memory a running sglang-sim holds, and the clear failures.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::Sshd;
use common::generate::Sim;
use common::local_fleet::test_path;

const ALIAS: &str = "fleet-gpus-host";
const GPU_NAME: &str = "NVIDIA RTX PRO 6000 Blackwell Server Edition";

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// examples/fleet.yaml, pointed at the test sshd instead of the Proxmox host.
fn example_inventory_for(home: &common::TestHome) -> PathBuf {
    let example =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/fleet.yaml"))
            .unwrap();
    assert!(
        example.contains("root@10.1.2.6") && example.contains("10.1.2.50"),
        "example changed"
    );
    let yaml = example
        .replace("root@10.1.2.6", ALIAS)
        .replace("10.1.2.50", "127.0.0.1")
        .replace(
            "IdentityFile: ~/.ssh/id_ed25519",
            "IdentityFile: ~/.ssh/fleet_test_key",
        );
    home.write_inventory(&yaml)
}

#[test]
fn gpus_of_the_example_proxmox_host_through_ssh_and_pct() {
    // The fake nvidia-smi reads the sims' state from the container's own /tmp: none run there.
    let sshd = Sshd::start();
    let home = sshd.home(ALIAS);
    let config = example_inventory_for(&home);
    let out = home
        .fleet()
        .args(["--config"])
        .arg(&config)
        .arg("gpus")
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{}",
        text(&out.stderr)
    );
    assert!(stdout.contains("ct200 (8 GPUs)"), "{stdout}");
    assert_eq!(stdout.matches(GPU_NAME).count(), 8, "{stdout}");
    assert!(stdout.contains("0 / 97887 MiB"), "{stdout}");

    let out = home
        .fleet()
        .args(["--json", "--config"])
        .arg(&config)
        .arg("gpus")
        .output()
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json[0]["host"], "ct200");
    assert_eq!(json[0]["gpus"].as_array().unwrap().len(), 8);
    assert_eq!(json[0]["gpus"][7]["index"], 7);
    assert_eq!(json[0]["gpus"][7]["memory_total_mib"], 97887);
    assert_eq!(json[0]["error"], serde_json::Value::Null);
}

#[test]
fn a_stopped_container_is_reported_with_the_host_and_exit_1() {
    let sshd = Sshd::start_with_env(&[("FAKE_PCT_RUNNING", "201")]);
    let home = sshd.home(ALIAS);
    let config = example_inventory_for(&home);
    let out = home
        .fleet()
        .args(["--config"])
        .arg(&config)
        .arg("gpus")
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("ct200") && stdout.contains("200"),
        "{stdout}"
    );
    assert!(stdout.contains("not running"), "{stdout}");
}

fn local_inventory(dir: &Path) -> PathBuf {
    let path = dir.join("fleet.yaml");
    std::fs::write(&path, "hosts:\n  - name: local\n    gpus: all\n").unwrap();
    path
}

fn local_gpus(config: &Path, state_dir: &Path) -> serde_json::Value {
    let out = assert_cmd::Command::cargo_bin("fleet")
        .unwrap()
        .args(["--json", "--config"])
        .arg(config)
        .arg("gpus")
        .env("PATH", test_path())
        .env("SGLANG_SIM_GPU_STATE_DIR", state_dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn local_gpus_show_the_memory_a_running_server_holds_and_its_release() {
    let dir = tempfile::tempdir().unwrap();
    let config = local_inventory(dir.path());
    let state = dir.path().join("gpus");
    let mut sim = Sim::start_on_gpu(3, &state, &[]);
    let deadline = Instant::now() + Duration::from_secs(20);
    let used = loop {
        let json = local_gpus(&config, &state);
        let used = json[0]["gpus"][3]["memory_used_mib"].as_u64().unwrap();
        // The CUDA context comes first, the weights and KV pool once the load is done.
        if used > 80_000 || Instant::now() > deadline {
            assert_eq!(
                json[0]["gpus"][2]["memory_used_mib"], 0,
                "other GPUs stay free"
            );
            break used;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        used > 80_000,
        "a 27B model at mem fraction 0.85 holds most of the GPU: {used} MiB"
    );
    sim.kill();
    let json = local_gpus(&config, &state);
    assert_eq!(
        json[0]["gpus"][3]["memory_used_mib"], 0,
        "memory of a dead server is released"
    );
}

#[test]
fn a_machine_without_nvml_or_nvidia_smi_gets_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = local_inventory(dir.path());
    let out = assert_cmd::Command::cargo_bin("fleet")
        .unwrap()
        .args(["--config"])
        .arg(&config)
        .arg("gpus")
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let line = stdout.lines().find(|l| l.contains("local")).unwrap();
    assert!(line.contains("no NVIDIA driver found"), "{line}");
    assert!(line.contains("nvidia-smi"), "{line}");
    assert!(!text(&out.stderr).contains("panicked"));
}

#[test]
fn a_broken_driver_is_reported_with_nvidia_smis_own_words() {
    let dir = tempfile::tempdir().unwrap();
    let config = local_inventory(dir.path());
    let out = assert_cmd::Command::cargo_bin("fleet")
        .unwrap()
        .args(["--config"])
        .arg(&config)
        .arg("gpus")
        .env("PATH", test_path())
        .env("FAKE_NVIDIA_SMI_NO_DRIVER", "1")
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("`nvidia-smi` failed with exit status 9"),
        "{stdout}"
    );
    assert!(
        stdout.contains("couldn't communicate with the NVIDIA driver"),
        "{stdout}"
    );
}

#[test]
fn a_missing_inventory_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = assert_cmd::Command::cargo_bin("fleet")
        .unwrap()
        .args(["--config"])
        .arg(dir.path().join("nope.yaml"))
        .arg("gpus")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("nope.yaml"),
        "{}",
        text(&out.stderr)
    );
}
