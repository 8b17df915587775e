//! `fleet sweep` on a Slurm host through the real `fleet` binary, on a real Slurm 22.05 cluster
//! (tests/common/slurm.rs) with `sglang-sim` as server: every candidate's servers are steps of
//! the one allocation, a candidate after another is new steps in it, not a new allocation, and
//! the sweep's winner is the sim's best.

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::reserve_ports;
use common::slurm::{Options, SlurmCluster};
use common::slurm_fleet::{SlurmFleet, allocation};

#[test]
fn a_sequential_sweep_runs_each_candidate_as_new_steps_of_one_allocation() {
    let cluster = SlurmCluster::start(Options {
        nodes: 1,
        gpus_per_node: 2,
        ..Options::default()
    });
    let ports = reserve_ports(2);
    let f = SlurmFleet::new(cluster, &allocation(2, 10), ports.base);
    std::fs::write(
        f.path().join("profiles/base.yaml"),
        format!(
            "model: /models/sim-27b\nserved_model_name: sim\nlauncher: [sglang-sim]\n\
             port_base: {}\nserver:\n  context_length: 8192\n  mem_fraction_static: 0.85\n\
             env:\n  SGLANG_SIM_TIME_SCALE: \"1\"\n  SGLANG_SIM_STARTUP_SECS: \"0.5\"\n  \
             SGLANG_SIM_MEAN_OUTPUT_TOKENS: \"40\"\n\
             health: {{startup_timeout: 60s, poll: 200ms}}\n",
            ports.base
        ),
    )
    .unwrap();
    // Every job and step of the cluster while the sweep runs, as squeue lists them.
    let done = AtomicBool::new(false);
    let (jobs, steps, out) = std::thread::scope(|s| {
        let watcher = s.spawn(|| {
            let (mut jobs, mut steps) = (BTreeSet::new(), BTreeSet::new());
            while !done.load(Ordering::Relaxed) {
                for l in f
                    .cluster
                    .run(&["squeue", "--noheader", "--format=%i %j"])
                    .lines()
                {
                    jobs.insert(l.trim().to_string());
                }
                for l in f
                    .cluster
                    .run(&["squeue", "--noheader", "--steps", "--format=%i %j"])
                    .lines()
                {
                    steps.insert(l.trim().to_string());
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            (jobs, steps)
        });
        let out = f.fleet(&[
            "--json",
            "sweep",
            "--profile",
            "base",
            "--strategies",
            "extra_buffer,no_buffer",
            "--sequential",
            "--input-len",
            "32",
            "--output-len",
            "24",
            "--warmup",
            "1s",
            "--duration",
            "2s",
        ]);
        done.store(true, Ordering::Relaxed);
        let (jobs, steps) = watcher.join().unwrap();
        (jobs, steps, out)
    });
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["winner"], "no_buffer", "{r:#}");

    // One allocation, fleet's, all along.
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    let (job, name) = jobs.first().unwrap().split_once(' ').unwrap();
    assert_eq!(name, "fleet-hpc");
    // Each candidate's two servers were steps of it, named after their ports: four steps in
    // all, two per port, so the second candidate's servers were new steps.
    let servers: Vec<&String> = steps.iter().filter(|s| s.contains(" fleet-hpc-")).collect();
    assert!(
        servers.iter().all(|s| s.starts_with(&format!("{job}."))),
        "{steps:?}"
    );
    assert_eq!(servers.len(), 4, "{steps:?}");
    for port in [ports.base, ports.base + 1] {
        let on_port = servers
            .iter()
            .filter(|s| s.ends_with(&format!("-{port}")))
            .count();
        assert_eq!(on_port, 2, "{steps:?}");
    }

    // The sweep stopped its servers; `down` gives the allocation back.
    let left = f.sims();
    assert!(
        left.is_empty(),
        "{left:?}\nsteps: {}\nstderr: {stderr}",
        f.cluster.run(&["squeue", "--steps", "--noheader"])
    );
    f.ok(&["-q", "down", "--grace", "5s"]);
    assert_eq!(f.fleet_jobs(), "");
}
