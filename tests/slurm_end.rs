//! The life of fleet's allocation around its servers, through the real `fleet` binary on a
//! real Slurm 22.05 cluster (tests/common/slurm.rs) with `sglang-sim` as server: `up` says the
//! allocation's pending reason while it waits, and `generate` warns when the allocation ends
//! before the job's ETA, stops cleanly ahead of the end, and `--resume` in a new allocation
//! continues exactly.

mod common;

use std::time::Duration;

use common::local_fleet::completion_ids;
use common::reserve_ports;
use common::slurm::{Options, PARTITION, SlurmCluster};
use common::slurm_fleet::{LONG, SlurmFleet, allocation, wait_with_timeout, write_prompts};
use common::watch::Watch;

/// A sim profile at real speed (decode steps of about 25 ms), loading for `startup` s.
fn slow_profile(f: &SlurmFleet, port_base: u16, name: &str, scale: u32) {
    std::fs::write(
        f.path().join(format!("profiles/{name}.yaml")),
        format!(
            "model: /models/test\nlauncher: [sglang-sim]\nport_base: {port_base}\n\
             server:\n  mamba_strategy: no_buffer\n\
             env:\n  SGLANG_SIM_TIME_SCALE: \"{scale}\"\n  SGLANG_SIM_STARTUP_SECS: \"1\"\n\
             health: {{startup_timeout: 60s, poll: 1s}}\n"
        ),
    )
    .unwrap();
}

#[test]
fn generate_stops_ahead_of_the_allocations_end_and_resumes_in_a_new_one() {
    let cluster = SlurmCluster::start(Options {
        nodes: 1,
        gpus_per_node: 2,
        ..Options::default()
    });
    let ports = reserve_ports(2);
    // One minute, Slurm's least: the job stops 40 s before the end, about 20 s after it began.
    let f = SlurmFleet::new(
        cluster,
        &format!(
            "      partition: {PARTITION}\n      gpus: 2\n      time: 1\n      \
             stop_before_end: 40s\n"
        ),
        ports.base,
    );
    slow_profile(&f, ports.base, "slow", 1);
    f.ok(&["-q", "up", "--profile", "slow"]);
    let jobs = f.fleet_jobs();
    let (job, _) = jobs.split_once(' ').expect("fleet's job");
    let job = job.to_string();

    // 3000 prompts at real speed take minutes: more than the allocation has left.
    write_prompts(&f.path().join("prompts.jsonl"), 3000);
    let args = [
        "generate",
        "--prompts",
        "prompts.jsonl",
        "--out",
        "out",
        "--max-tokens",
        "32",
        "--concurrency",
        "16",
        "--grace",
        "5s",
    ];
    let mut generate = f.spawn(&args);
    let said = Watch::stderr(&mut generate);
    said.wait_for("before the job's ETA", 1, LONG);
    let out = wait_with_timeout(&mut generate, LONG).expect("generate stops by itself");
    let stderr = said.finish();
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains(&format!("stopping: job {job} (fleet-hpc) on hpc ends in")),
        "{stderr}"
    );
    assert!(
        stderr.contains("stopped ahead of the allocation's end"),
        "{stderr}"
    );
    // Ahead of the end: the allocation still runs, with time left.
    let left = f.cluster.run(&[
        "squeue",
        "--noheader",
        &format!("--jobs={job}"),
        "--format=%T %L",
    ]);
    assert!(left.trim().starts_with("RUNNING 0:"), "{left}");
    let progress: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(f.path().join("out/progress.json")).unwrap())
            .unwrap();
    let done = progress["completed"].as_u64().unwrap();
    assert!(done > 0 && done < 3000, "{progress}");
    assert_eq!(completion_ids(&f.path().join("out")).len() as u64, done);

    // A new allocation, a faster sim, and --resume writes the rest, each prompt once.
    f.ok(&["-q", "down", "--grace", "5s"]);
    std::fs::write(
        f.path().join("fleet.yaml"),
        format!(
            "hosts:\n  - name: hpc\n    slurm:\n      partition: {PARTITION}\n      gpus: 2\n      \
             time: 10\n"
        ),
    )
    .unwrap();
    slow_profile(&f, ports.base, "fast", 100);
    f.ok(&["-q", "up", "--profile", "fast"]);
    let second = f.fleet_jobs();
    assert!(!second.starts_with(&format!("{job} ")), "{second}");
    let mut resumed = args.to_vec();
    resumed.push("--resume");
    let stderr = String::from_utf8_lossy(&f.fleet(&resumed).stderr).into_owned();
    assert!(
        stderr.contains(&format!("resume: {done} of 3000 prompts already done")),
        "{stderr}"
    );
    assert_eq!(completion_ids(&f.path().join("out")).len(), 3000);
    f.ok(&["-q", "down", "--grace", "5s"]);
    assert_eq!(f.fleet_jobs(), "");
}

#[test]
fn up_says_the_allocations_pending_reason_until_it_runs() {
    let cluster = SlurmCluster::start(Options {
        nodes: 1,
        gpus_per_node: 2,
        ..Options::default()
    });
    // Someone else's job holds every GPU: fleet's allocation waits for Resources.
    let blocker = cluster
        .run(&[
            "sbatch",
            "--parsable",
            "--job-name=blocker",
            "--gres=gpu:2",
            "--time=10",
            &format!(
                "--output={}",
                cluster.dir.path().join("blocker.out").display()
            ),
            "--wrap=exec sleep infinity",
        ])
        .trim()
        .to_string();
    cluster.wait_for("the blocker running", LONG, |c| {
        c.run(&["squeue", "--noheader", "-j", &blocker, "-o", "%T"])
            .trim()
            == "RUNNING"
    });
    let ports = reserve_ports(2);
    let f = SlurmFleet::new(cluster, &allocation(2, 10), ports.base);
    let mut up = f.spawn(&["up", "--profile", "sim"]);
    let said = Watch::stderr(&mut up);
    said.wait_for("pending (Resources)", 1, LONG);
    assert_eq!(
        f.fleet_jobs().split_once(' ').map(|(_, s)| s.to_string()),
        Some("PENDING".to_string())
    );
    f.cluster.run(&["scancel", &blocker]);
    let out = wait_with_timeout(&mut up, Duration::from_secs(180)).expect("up ends");
    let stderr = said.finish();
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    // Said once while it pended, not once per poll.
    assert_eq!(stderr.matches("pending (Resources)").count(), 1, "{stderr}");
    assert_eq!(f.sims().len(), 2);
    f.ok(&["-q", "down", "--grace", "5s"]);
    assert_eq!(f.fleet_jobs(), "");
}
