//! The launcher and the job together through the real binary: `fleet up` a local sim fleet,
//! `fleet generate` with no `--url` sends to every instance up started (through the same
//! discovery and port forwards as for remote hosts), then `fleet down`.

mod common;

use std::collections::HashSet;

use common::local_fleet::{LocalFleet, completion_ids};
use common::reserve_ports;

/// Writes `n` prompts with ids `q0`, `q1`, ...
fn write_questions(path: &std::path::Path, n: usize) {
    let prompts: String = (0..n)
        .map(|i| format!("{{\"id\":\"q{i}\",\"prompt\":\"Question {i}: why is the sky blue?\"}}\n"))
        .collect();
    std::fs::write(path, prompts).unwrap();
}

/// `fleet up --profile PROFILE`, which must succeed.
fn up(f: &LocalFleet, profile: &str) {
    let up = f
        .fleet()
        .args(["-q", "up", "--profile", profile])
        .output()
        .unwrap();
    assert_eq!(
        up.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
}

#[test]
fn generate_uses_every_instance_that_up_started() {
    let f = LocalFleet::new(3);
    let ports = reserve_ports(3);
    let d = f.path();
    f.write_profile(
        "sim",
        &format!(
            "model: /models/test\nlauncher: [sglang-sim]\nport_base: {}\n\
             server:\n  mamba_strategy: no_buffer\n\
             env:\n  SGLANG_SIM_TIME_SCALE: \"100\"\n  SGLANG_SIM_STARTUP_SECS: \"50\"\n  SGLANG_SIM_GPU_STATE_DIR: \"{}\"\n\
             health: {{startup_timeout: 60s, poll: 1s}}\n",
            ports.base,
            f.gpu_state().display()
        ),
    );
    write_questions(&d.join("prompts.jsonl"), 300);
    up(&f, "sim");

    let generated = f
        .fleet()
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
    let down = f
        .fleet()
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

    assert_eq!(completion_ids(&d.join("out")).len(), 300);
}

#[test]
fn generate_without_url_or_running_instances_says_what_to_do() {
    let f = LocalFleet::new(1);
    let d = f.path();
    std::fs::write(
        d.join("prompts.jsonl"),
        "{\"id\":\"a\",\"prompt\":\"hi\"}\n",
    )
    .unwrap();
    let out = f
        .fleet()
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
    let f = LocalFleet::new(2);
    let ports = reserve_ports(2);
    let d = f.path();
    let base = format!(
        "model: /models/test\nlauncher: [sglang-sim]\nport_base: {}\n\
         server:\n  mamba_strategy: extra_buffer\n\
         env:\n  SGLANG_SIM_TIME_SCALE: \"20\"\n  SGLANG_SIM_STARTUP_SECS: \"20\"\n  SGLANG_SIM_GPU_STATE_DIR: \"{}\"\n\
         health: {{startup_timeout: 60s, poll: 1s}}\n",
        ports.base,
        f.gpu_state().display()
    );
    f.write_profile("seed", &base);
    // What a sweep wrote for no_buffer at this time scale: 1,180 tok/s per GPU, 20x.
    f.write_profile(
        "measured",
        "extends: seed\nexpected:\n  output_tok_s_per_gpu: 23600\n  max_running_requests: 72\n",
    );
    write_questions(&d.join("prompts.jsonl"), 2000);
    up(&f, "seed");

    let run = f
        .fleet()
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
    assert_eq!(run.status.code(), Some(3), "{stderr}");
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
