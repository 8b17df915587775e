//! The launcher and the job together through the real binary: `fleet up` a local sim fleet,
//! `fleet generate` with no `--url` sends to every instance up started (through the same
//! discovery and port forwards as for remote hosts), then `fleet down`.

mod common;

use std::collections::HashSet;
use std::path::PathBuf;

fn test_path() -> String {
    let bins = PathBuf::from(env!("CARGO_BIN_EXE_sglang-sim"));
    format!(
        "{}:{}:{}",
        common::fixtures_bin().display(),
        bins.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// A base port with `n` free ports after it, so parallel runs on one machine do not collide.
fn free_port_base(n: u16) -> u16 {
    'search: for _ in 0..200 {
        let first = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if first > 65000 {
            continue;
        }
        for p in first..first + n {
            if std::net::TcpListener::bind(("127.0.0.1", p)).is_err() {
                continue 'search;
            }
        }
        return first;
    }
    panic!("no {n} consecutive free ports");
}

/// Runs `fleet down` when the test ends, passed or failed, so no server outlives it.
struct Down<F: Fn() -> assert_cmd::Command>(F);

impl<F: Fn() -> assert_cmd::Command> Drop for Down<F> {
    fn drop(&mut self) {
        let _ = (self.0)().args(["-q", "down", "--grace", "2s"]).output();
    }
}

#[test]
fn generate_uses_every_instance_that_up_started() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("profiles")).unwrap();
    std::fs::write(
        d.join("fleet.yaml"),
        "hosts:\n  - name: local\n    gpus: [0, 1, 2]\n",
    )
    .unwrap();
    std::fs::write(
        d.join("profiles/sim.yaml"),
        format!(
            "model: /models/test\nlauncher: [sglang-sim]\nport_base: {}\n\
             server:\n  mamba_strategy: no_buffer\n\
             env:\n  SGLANG_SIM_TIME_SCALE: \"100\"\n  SGLANG_SIM_STARTUP_SECS: \"50\"\n  SGLANG_SIM_GPU_STATE_DIR: \"{}\"\n\
             health: {{startup_timeout: 60s, poll: 1s}}\n",
            free_port_base(3),
            d.join("gpus").display()
        ),
    )
    .unwrap();
    let prompts: String = (0..300)
        .map(|i| format!("{{\"id\":\"q{i}\",\"prompt\":\"Question {i}: why is the sky blue?\"}}\n"))
        .collect();
    std::fs::write(d.join("prompts.jsonl"), prompts).unwrap();
    let fleet = || {
        let mut c = assert_cmd::Command::cargo_bin("fleet").unwrap();
        c.current_dir(d)
            .env("PATH", test_path())
            .env("FLEET_RUN_DIR", d.join("run"))
            .env_remove("FLEET_CONFIG");
        c
    };

    let _down = Down(fleet);
    let up = fleet()
        .args(["-q", "up", "--profile", "sim"])
        .output()
        .unwrap();
    assert_eq!(
        up.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );

    let generated = fleet()
        .args([
            "-q",
            "--json",
            "generate",
            "--prompts",
            "prompts.jsonl",
            "--out",
            "out",
            "--max-tokens",
            "256",
        ])
        .output()
        .unwrap();
    let down = fleet()
        .args(["-q", "down", "--grace", "5s"])
        .output()
        .unwrap();
    assert_eq!(
        generated.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&generated.stderr)
    );
    assert_eq!(
        down.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&down.stderr)
    );

    let progress: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("out/progress.json")).unwrap()).unwrap();
    assert_eq!(progress["status"], "done");
    assert_eq!(progress["completed"], 300);
    let names: HashSet<String> = progress["instances"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["completed"].as_u64().unwrap() > 0)
        .map(|i| i["name"].as_str().unwrap().to_string())
        .collect();
    let expected: HashSet<String> = (0..3).map(|g| format!("local:gpu{g}")).collect();
    assert_eq!(names, expected, "every instance of the fleet took work");

    let mut ids = HashSet::new();
    for entry in std::fs::read_dir(d.join("out")).unwrap() {
        let path = entry.unwrap().path();
        if path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("completions")
        {
            for line in std::fs::read_to_string(&path).unwrap().lines() {
                let v: serde_json::Value = serde_json::from_str(line).unwrap();
                assert!(
                    ids.insert(v["id"].as_str().unwrap().to_string()),
                    "duplicate {}",
                    v["id"]
                );
            }
        }
    }
    assert_eq!(ids.len(), 300);
}

#[test]
fn generate_without_url_or_running_instances_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("fleet.yaml"),
        "hosts:\n  - name: local\n    gpus: [0]\n",
    )
    .unwrap();
    std::fs::write(
        d.join("prompts.jsonl"),
        "{\"id\":\"a\",\"prompt\":\"hi\"}\n",
    )
    .unwrap();
    let out = assert_cmd::Command::cargo_bin("fleet")
        .unwrap()
        .current_dir(d)
        .env("FLEET_RUN_DIR", d.join("run"))
        .env_remove("FLEET_CONFIG")
        .args(["generate", "--prompts", "prompts.jsonl", "--out", "out"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no running instances") && err.contains("fleet up --profile"),
        "{err}"
    );
}

/// The seed's story in the first minute: a job on the extra_buffer fleet, checked against a
/// profile whose `expected:` a sweep measured for no_buffer, is flagged loudly with the numbers
/// and the cause, and `--abort-below` stops it keeping what was written.
#[test]
fn the_watchdog_flags_a_run_far_below_the_sweeps_numbers_and_can_stop_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("profiles")).unwrap();
    std::fs::write(
        d.join("fleet.yaml"),
        "hosts:\n  - name: local\n    gpus: [0, 1]\n",
    )
    .unwrap();
    let base = format!(
        "model: /models/test\nlauncher: [sglang-sim]\nport_base: {}\n\
         server:\n  mamba_strategy: extra_buffer\n\
         env:\n  SGLANG_SIM_TIME_SCALE: \"20\"\n  SGLANG_SIM_STARTUP_SECS: \"20\"\n  SGLANG_SIM_GPU_STATE_DIR: \"{}\"\n\
         health: {{startup_timeout: 60s, poll: 1s}}\n",
        free_port_base(2),
        d.join("gpus").display()
    );
    std::fs::write(d.join("profiles/seed.yaml"), &base).unwrap();
    // What a sweep wrote for no_buffer at this time scale: 1,180 tok/s per GPU, 20x.
    std::fs::write(
        d.join("profiles/measured.yaml"),
        "extends: seed\nexpected:\n  output_tok_s_per_gpu: 23600\n  max_running_requests: 72\n",
    )
    .unwrap();
    let prompts: String = (0..2000)
        .map(|i| format!("{{\"id\":\"q{i}\",\"prompt\":\"Question {i}: why is the sky blue?\"}}\n"))
        .collect();
    std::fs::write(d.join("prompts.jsonl"), prompts).unwrap();
    let fleet = || {
        let mut c = assert_cmd::Command::cargo_bin("fleet").unwrap();
        c.current_dir(d)
            .env("PATH", test_path())
            .env("FLEET_RUN_DIR", d.join("run"))
            .env_remove("FLEET_CONFIG");
        c
    };
    let _down = Down(fleet);
    let up = fleet()
        .args(["-q", "up", "--profile", "seed"])
        .output()
        .unwrap();
    assert_eq!(
        up.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );

    let run = fleet()
        .args([
            "generate",
            "--prompts",
            "prompts.jsonl",
            "--out",
            "out",
            "--profile",
            "measured",
        ])
        .args(["--warmup", "2s", "--abort-below", "0.5"])
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("measured by sweep"),
        "names what it compares with: {stderr}"
    );
    assert!(
        stderr.contains("23600"),
        "shows the expected number: {stderr}"
    );
    assert!(
        stderr.contains("fleet sweep --strategies extra_buffer,no_buffer"),
        "{stderr}"
    );
    assert!(stderr.contains("stopped by --abort-below"), "{stderr}");
    let progress: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("out/progress.json")).unwrap()).unwrap();
    assert_ne!(progress["status"], "running");
    assert!(progress["completed"].as_u64().unwrap() < 2000);
}
