//! The Slurm backend through the real `fleet` binary on a real Slurm 22.05 cluster (two nodes
//! of eight fake GPUs, tests/common/slurm.rs), with `sglang-sim` as the server: `up` of 16
//! servers as steps of fleet's own allocation, `status`, `generate` over them, and `down`
//! leaving no job, step or server; an allocation the user holds, used and left running; and
//! up and down under proctrack/cgroup.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Duration;

use common::local_fleet::completion_ids;
use common::reserve_ports;
use common::slurm::{Options, Proctrack, SlurmCluster};
use common::slurm_fleet::{
    LONG, SlurmFleet, allocation, wait_until, wait_with_timeout, write_prompts,
};

#[test]
fn sixteen_servers_as_steps_of_fleets_allocation_generate_and_down_leaves_nothing() {
    let cluster = SlurmCluster::start(Options::default());
    let ports = reserve_ports(16);
    let f = SlurmFleet::new(cluster, &allocation(16, 30), ports.base);
    let up = f.ok(&["--json", "up", "--profile", "sim"]);
    let outcomes: serde_json::Value = serde_json::from_str(&up).unwrap();
    let outcomes = outcomes.as_array().expect("one outcome per server");
    assert_eq!(outcomes.len(), 16, "{up}");
    assert!(outcomes.iter().all(|o| o["state"] == "ready"), "{up}");

    // One job of fleet's, named so; every server a step of it, on its node's address, with a
    // GPU of its own on its node.
    let jobs = f.fleet_jobs();
    let (job, state) = jobs.split_once(' ').expect("fleet's job in squeue");
    assert_eq!(state, "RUNNING", "{jobs}");
    let sims = f.sims();
    assert_eq!(sims.len(), 16, "{sims:?}");
    let addr: BTreeMap<String, String> = f
        .cluster
        .nodes
        .iter()
        .map(|n| (n.name.clone(), n.addr.clone()))
        .collect();
    let mut gpus: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for p in &sims {
        assert_eq!(p.env.get("SLURM_JOB_ID").map(String::as_str), Some(job));
        let node = p.env["SLURMD_NODENAME"].clone();
        let host = p.cmdline.iter().position(|a| a == "--host").unwrap();
        assert_eq!(p.cmdline[host + 1], addr[&node], "{p:?}");
        gpus.entry(node)
            .or_default()
            .insert(p.env["CUDA_VISIBLE_DEVICES"].clone());
    }
    let eight: BTreeSet<String> = (0..8).map(|g| g.to_string()).collect();
    assert_eq!(gpus.len(), 2, "{gpus:?}");
    assert!(gpus.values().all(|g| *g == eight), "{gpus:?}");
    // The allocation's output went into the run directory, never into the working directory.
    assert!(
        std::fs::read_dir(f.path())
            .unwrap()
            .flatten()
            .all(|e| !e.file_name().to_string_lossy().starts_with("slurm-")),
        "a slurm-N.out in the working directory"
    );

    // status names each server's step, node and GPU.
    let status = f.ok(&["--json", "status"]);
    let rows: serde_json::Value = serde_json::from_str(&status).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 16, "{status}");
    let steps: HashSet<String> = rows
        .iter()
        .map(|r| {
            assert_eq!(
                r["job"].as_u64().map(|j| j.to_string()).as_deref(),
                Some(job)
            );
            assert!(addr.contains_key(r["node"].as_str().unwrap()), "{r}");
            format!("{}.{}", r["job"], r["step"])
        })
        .collect();
    assert_eq!(steps.len(), 16, "{status}");

    // generate over the 16 servers: each prompt written exactly once.
    assert_eq!(f.job(3000, 16), 3000);

    // down: no job, step, server or srun of fleet's is left.
    f.ok(&["-q", "down", "--grace", "5s"]);
    assert_eq!(f.fleet_jobs(), "");
    assert!(f.sims().is_empty());
    wait_until("no srun left", || {
        !f.cluster.processes().iter().any(|p| p.program() == "srun")
    });
    let status = f.ok(&["--json", "status"]);
    assert_eq!(status.trim(), "[]");
}

#[test]
fn an_allocation_the_user_holds_is_used_and_left_running() {
    let cluster = SlurmCluster::start(Options::default());
    let out = cluster.dir.path().join("held.out");
    let job = cluster
        .run(&[
            "sbatch",
            "--parsable",
            "--job-name=mine",
            "--nodes=1",
            "--ntasks-per-node=4",
            "--gres=gpu:4",
            "--time=10",
            &format!("--output={}", out.display()),
            "--wrap=exec sleep infinity",
        ])
        .trim()
        .to_string();
    let ports = reserve_ports(2);
    let f = SlurmFleet::new(
        cluster,
        &format!("      job: {job}\n      gpus: 2\n"),
        ports.base,
    );
    let up = f.ok(&["--json", "up", "--profile", "sim"]);
    let outcomes: serde_json::Value = serde_json::from_str(&up).unwrap();
    assert_eq!(outcomes.as_array().unwrap().len(), 2, "{up}");
    let sims = f.sims();
    assert_eq!(sims.len(), 2, "{sims:?}");
    assert!(sims.iter().all(|p| p.env["SLURM_JOB_ID"] == job));
    let gpus: BTreeSet<&String> = sims
        .iter()
        .map(|p| &p.env["CUDA_VISIBLE_DEVICES"])
        .collect();
    assert_eq!(gpus.len(), 2, "{sims:?}");

    // The step's output file is the server's log.
    let log = f.ok(&["logs", "hpc:1", "-n", "50"]);
    assert!(!log.trim().is_empty(), "an empty log");

    f.ok(&["-q", "down", "--grace", "5s"]);
    assert!(f.sims().is_empty());
    let state = f.cluster.run(&[
        "squeue",
        "--noheader",
        &format!("--jobs={job}"),
        "--format=%T",
    ]);
    assert_eq!(state.trim(), "RUNNING", "the user's job was touched");
    f.cluster.run(&["scancel", &job]);
}

#[test]
fn a_node_killed_mid_job_loses_nothing() {
    let cluster = SlurmCluster::start(Options {
        gpus_per_node: 2,
        ..Options::default()
    });
    let ports = reserve_ports(4);
    let mut f = SlurmFleet::new(cluster, &allocation(4, 30), ports.base);
    f.ok(&["-q", "up", "--profile", "sim"]);
    let on_first: usize = f
        .sims()
        .iter()
        .filter(|p| p.env["SLURMD_NODENAME"] == f.cluster.nodes[0].name)
        .count();
    assert_eq!(on_first, 2, "two servers on each node");
    write_prompts(&f.path().join("prompts.jsonl"), 800);
    let mut generate = f.spawn(&[
        "-q",
        "generate",
        "--prompts",
        "prompts.jsonl",
        "--out",
        "out",
        "--max-tokens",
        "64",
    ]);
    let progress = f.path().join("out/progress.json");
    wait_until("the job under way", || {
        std::fs::read_to_string(&progress)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| v["completed"].as_u64())
            .is_some_and(|c| c >= 100)
    });
    f.cluster.kill_node(1);
    let out = wait_with_timeout(&mut generate, Duration::from_secs(180)).expect("generate ends");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&progress).unwrap()).unwrap();
    assert_eq!(v["status"], "done", "{v}");
    assert_eq!(completion_ids(&f.path().join("out")).len(), 800);
    let lost = f.cluster.nodes[1].name.clone();
    // Once Slurm has marked the node DOWN, status says its servers are dead (and exits
    // non-zero for them), and down stops the rest and cancels the allocation.
    f.cluster.wait_for("the node DOWN", LONG, |c| {
        c.node_state(1).starts_with("DOWN")
    });
    let status = f.fleet(&["--json", "status"]);
    assert_ne!(status.status.code(), Some(0));
    let status = String::from_utf8_lossy(&status.stdout).into_owned();
    let rows: serde_json::Value = serde_json::from_str(&status).unwrap();
    let on_lost: Vec<&serde_json::Value> = rows
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["node"] == lost.as_str())
        .collect();
    assert_eq!(on_lost.len(), 2, "{status}");
    assert!(on_lost.iter().all(|r| r["liveness"] == "dead"), "{status}");
    f.ok(&["-q", "down", "--grace", "5s"]);
    // Cancelled; Slurm keeps it COMPLETING until the DOWN node is back.
    let left = f.fleet_jobs();
    assert!(left.is_empty() || left.ends_with(" COMPLETING"), "{left}");
    assert!(f.sims().is_empty());
}

#[test]
fn under_proctrack_cgroup_up_and_down_leave_nothing() {
    let cluster = SlurmCluster::start(Options {
        nodes: 1,
        gpus_per_node: 2,
        proctrack: Proctrack::Cgroup,
        ..Options::default()
    });
    let ports = reserve_ports(2);
    let f = SlurmFleet::new(cluster, &allocation(2, 10), ports.base);
    f.ok(&["-q", "up", "--profile", "sim"]);
    // The server is the step's own process, so the step's cgroup holds it and it lives.
    let sims = f.sims();
    assert_eq!(sims.len(), 2, "{sims:?}");
    let gpus: BTreeSet<&String> = sims
        .iter()
        .map(|p| &p.env["CUDA_VISIBLE_DEVICES"])
        .collect();
    assert_eq!(gpus.len(), 2, "{sims:?}");
    let status = f.ok(&["--json", "status"]);
    let rows: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert!(
        rows.as_array()
            .unwrap()
            .iter()
            .all(|r| r["liveness"] == "running"),
        "{status}"
    );
    f.ok(&["-q", "down", "--grace", "5s"]);
    assert_eq!(f.fleet_jobs(), "");
    assert!(f.sims().is_empty());
}

/// A fleet of 16 GPUs on a fresh two-node cluster with profile `name`: the sim's, with
/// `server` lines added (its layout).
fn layout_fleet(name: &str, server: &str) -> (SlurmFleet, common::Ports) {
    let cluster = SlurmCluster::start(Options::default());
    let ports = reserve_ports(16);
    let f = SlurmFleet::new(cluster, &allocation(16, 30), ports.base);
    let sim = std::fs::read_to_string(f.path().join("profiles/sim.yaml")).unwrap();
    std::fs::write(
        f.path().join(format!("profiles/{name}.yaml")),
        sim.replace("server:\n", &format!("server:\n{server}")),
    )
    .unwrap();
    (f, ports)
}

/// `up --profile NAME`'s outcomes, each of them ready.
fn up_ready(f: &SlurmFleet, name: &str) -> Vec<serde_json::Value> {
    let up = f.ok(&["--json", "up", "--profile", name]);
    let outcomes: Vec<serde_json::Value> = serde_json::from_str(&up).unwrap();
    assert!(outcomes.iter().all(|o| o["state"] == "ready"), "{up}");
    outcomes
}

#[test]
fn tensor_parallel_servers_are_steps_of_four_gpus_on_one_node() {
    let (f, _ports) = layout_fleet("tp4", "  tp_size: 4\n");
    let outcomes = up_ready(&f, "tp4");
    assert_eq!(
        outcomes.len(),
        4,
        "16 GPUs make four TP4 servers: {outcomes:?}"
    );

    // Each server is one step holding four GPUs of one node, and says it runs TP4.
    let sims = f.sims();
    assert_eq!(sims.len(), 4, "{sims:?}");
    let mut per_node: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for p in &sims {
        let visible = &p.env["CUDA_VISIBLE_DEVICES"];
        assert_eq!(visible.split(',').count(), 4, "{p:?}");
        let tp = p.cmdline.iter().position(|a| a == "--tp-size").unwrap();
        assert_eq!(p.cmdline[tp + 1], "4", "{p:?}");
        let gpus = per_node
            .entry(p.env["SLURMD_NODENAME"].clone())
            .or_default();
        for g in visible.split(',') {
            assert!(
                gpus.insert(g.to_string()),
                "GPU {g} given twice: {per_node:?}"
            );
        }
    }
    assert_eq!(per_node.len(), 2, "{per_node:?}");

    assert_eq!(f.job(400, 16), 400);

    f.ok(&["-q", "down", "--grace", "5s"]);
    assert_eq!(f.fleet_jobs(), "");
    assert!(f.sims().is_empty());
}

#[test]
fn a_tp16_server_over_both_nodes_runs_a_job_and_is_lost_with_a_rank() {
    let (f, _ports) = layout_fleet("tp16", "  tp_size: 16\n  nnodes: 2\n");
    let outcomes = up_ready(&f, "tp16");
    assert_eq!(
        outcomes.len(),
        1,
        "one server over both nodes: {outcomes:?}"
    );

    // Two ranks, a step each on its own node with its eight GPUs, meeting at rank 0's node.
    let sims = f.sims();
    assert_eq!(sims.len(), 2, "{sims:?}");
    let rank = |p: &common::slurm::Proc| {
        let at = p.cmdline.iter().position(|a| a == "--node-rank").unwrap();
        p.cmdline[at + 1].clone()
    };
    let nodes: BTreeSet<String> = sims
        .iter()
        .map(|p| p.env["SLURMD_NODENAME"].clone())
        .collect();
    assert_eq!(nodes.len(), 2, "{sims:?}");
    assert!(
        sims.iter()
            .all(|p| p.env["CUDA_VISIBLE_DEVICES"].split(',').count() == 8)
    );
    let dist: BTreeSet<String> = sims
        .iter()
        .map(|p| {
            let at = p
                .cmdline
                .iter()
                .position(|a| a == "--dist-init-addr")
                .unwrap();
            p.cmdline[at + 1].clone()
        })
        .collect();
    assert_eq!(dist.len(), 1, "one rendezvous for both ranks: {dist:?}");

    let status: serde_json::Value = serde_json::from_str(&f.ok(&["--json", "status"])).unwrap();
    let rows = status.as_array().unwrap();
    assert_eq!(rows.len(), 1, "{status:#}");
    assert_eq!(rows[0]["state"], "ready", "{status:#}");

    assert_eq!(f.job(300, 16), 300);

    // Rank 1 killed: the server is lost, as status tells within 30 s.
    let rank1 = sims.iter().find(|p| rank(p) == "1").expect("rank 1");
    let killed = std::time::Instant::now();
    assert!(
        std::process::Command::new("kill")
            .args(["-9", &rank1.pid.to_string()])
            .status()
            .unwrap()
            .success()
    );
    // status exits 1 once a server is not ready: its JSON still says why.
    wait_until("the server reported lost", || {
        let out = f.fleet(&["--json", "status"]);
        let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        s[0]["state"] != "ready"
    });
    assert!(
        killed.elapsed() < Duration::from_secs(30),
        "{:?}",
        killed.elapsed()
    );

    // `up` again: what is left of the lost server (rank 0, which SGLang does not promise to end)
    // is stopped, and the server starts anew on both nodes.
    let rank0 = sims.iter().find(|p| rank(p) == "0").expect("rank 0");
    let again = up_ready(&f, "tp16");
    assert_eq!(again.len(), 1, "{again:?}");
    let now = f.sims();
    assert_eq!(now.len(), 2, "{now:?}");
    assert!(
        now.iter().all(|p| p.pid != rank0.pid),
        "the old rank 0 was stopped: {now:?}"
    );

    f.ok(&["-q", "down", "--grace", "5s"]);
    assert_eq!(f.fleet_jobs(), "");
    assert!(f.sims().is_empty());
}
