//! fleet's Slurm layer against a real Slurm 22.05 cluster on this machine (two nodes of eight
//! fake GPUs, tests/common/slurm.rs), and the facts of Slurm that the Slurm backend is built
//! on, each checked as a user of the cluster would see it.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::local_fleet::SIM;
use common::slurm::{Options, Proctrack, SlurmCluster};
use fleet::backoff::Backoff;
use fleet::slurm::{AllocationRequest, JobId, JobState, Shape, SlurmTime, Step, StepRequest};
use tokio_util::sync::CancellationToken;

const LONG: Duration = Duration::from_secs(90);

/// A shell script as a step's program: each task writes the GPUs it saw to
/// `$0/cvd.<step>.<task>`, then waits for `$0/go` (the test's signal, so that steps provably
/// run at the same time).
///
/// Written aside and renamed: a reader that sees `cvd.*` sees it whole (the shell creates the
/// file before `echo` writes it, and the test once read it empty).
const REPORT_AND_WAIT: &str = r#"f="$0/cvd.$SLURM_STEP_ID.$SLURM_PROCID"
echo "$CUDA_VISIBLE_DEVICES" >"$0/.tmp.$$" && mv "$0/.tmp.$$" "$f"
while [ ! -e "$0/go" ]; do sleep 0.05; done"#;

fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "no {what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An allocation named `name` of the test partition, for ten minutes.
fn request(cluster: &SlurmCluster, name: &str, shape: Shape) -> AllocationRequest {
    AllocationRequest {
        name: name.into(),
        partition: Some(common::slurm::PARTITION.into()),
        shape,
        cpus_per_task: None,
        time: SlurmTime::Limited(Duration::from_secs(600)),
        output: cluster
            .dir
            .path()
            .join("alloc-%j.out")
            .display()
            .to_string(),
        extra: vec![],
    }
}

/// An allocation of `tasks_per_node` tasks and GPUs on each of `nodes` nodes, running.
async fn allocation(cluster: &SlurmCluster, nodes: u32, tasks_per_node: u32) -> JobId {
    let slurm = cluster.layer();
    let shape = Shape::PerNode {
        nodes,
        servers_per_node: tasks_per_node,
    };
    let job = slurm
        .submit(&request(cluster, "fleet-facts", shape))
        .await
        .expect("sbatch");
    let poll = Backoff::new(Duration::from_millis(50), Duration::from_millis(500));
    tokio::time::timeout(
        LONG,
        slurm.wait_running(job, poll, &CancellationToken::new(), |_| {}),
    )
    .await
    .unwrap_or_else(|_| panic!("job {job} not running:\n{}", cluster.logs()))
    .expect("wait for RUNNING");
    job
}

/// `srun` of this cluster with `args`, as a child with its stderr in `log`.
fn srun(cluster: &SlurmCluster, args: &[&str], log: &Path) -> std::process::Child {
    let file = std::fs::File::create(log).expect("srun log");
    cluster
        .command("srun")
        .args(args)
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .expect("srun")
}

fn read(path: impl AsRef<Path>) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn alive(pid: u32) -> bool {
    // A zombie (reaped later by init) is dead: it has no state but Z.
    read(format!("/proc/{pid}/stat"))
        .rsplit_once(") ")
        .is_some_and(|(_, rest)| !rest.starts_with('Z'))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cluster_comes_up_with_its_gpus_and_leaves_nothing_behind() {
    for proctrack in [Proctrack::Linuxproc, Proctrack::Cgroup] {
        let mut cluster = SlurmCluster::start(Options {
            proctrack,
            ..Options::default()
        });
        eprintln!("{proctrack:?}: cluster up in {:?}", cluster.startup);
        let slurm = cluster.layer();
        let nodes = slurm.nodes(&cluster.node_names().join(",")).await.unwrap();
        let seen: Vec<(String, String, Option<String>)> = nodes
            .into_iter()
            .map(|n| (n.name, n.addr, n.gres))
            .collect();
        let expected: Vec<(String, String, Option<String>)> = cluster
            .nodes
            .iter()
            .map(|n| (n.name.clone(), n.addr.clone(), Some("gpu:8".to_string())))
            .collect();
        assert_eq!(seen, expected);
        assert_eq!(slurm.job(JobId(999)).await.unwrap(), None, "an unknown job");
        let refused = slurm
            .submit(&AllocationRequest {
                partition: Some("nope".into()),
                ..request(&cluster, "fleet-refused", Shape::Spread { servers: 1 })
            })
            .await
            .unwrap_err();
        let shown = refused.to_string();
        assert!(
            shown.starts_with("slurm: `sbatch --parsable ")
                && shown.contains("--partition=nope")
                && shown.contains("Invalid partition name specified")
                && shown.contains("hint: check the Slurm host's `partition:`"),
            "{shown}"
        );
        let names = cluster.node_names();
        let job = allocation(&cluster, 2, 1).await;
        let jobid = format!("--jobid={job}");
        let task = |secs: &str| {
            cluster
                .job_processes()
                .into_iter()
                .find(|p| {
                    p.program() == "sleep" && p.cmdline.last().map(String::as_str) == Some(secs)
                })
                .map(|p| p.pid)
        };
        // srun is its step's lifeline: when the client dies, Slurm ends the step.
        let log = cluster.dir.path().join("lifeline.log");
        let mut lifeline = srun(&cluster, &[&jobid, "--exact", "-n1", "sleep", "300"], &log);
        wait_until("the step's task", LONG, || task("300").is_some());
        let pid = task("300").unwrap();
        lifeline.kill().unwrap();
        lifeline.wait().unwrap();
        let t0 = Instant::now();
        wait_until("the step to end with its srun", LONG, || !alive(pid));
        eprintln!(
            "{proctrack:?}: step ended {:?} after its srun was killed",
            t0.elapsed()
        );
        // A task left running for the teardown to end.
        let log = cluster.dir.path().join("sleeper.log");
        let mut sleeper = srun(&cluster, &[&jobid, "--exact", "-n1", "sleep", "301"], &log);
        wait_until("a task of the job", LONG, || task("301").is_some());
        cluster.stop();
        let _ = sleeper.wait();
        let left: Vec<_> = common::slurm::scan()
            .into_iter()
            .filter(|p| {
                p.env.get("SLURM_CONF") == Some(&cluster.conf.display().to_string())
                    || p.files.iter().any(|f| f.starts_with(cluster.dir.path()))
            })
            .collect();
        assert!(left.is_empty(), "{proctrack:?}: left behind: {left:?}");
        for name in &names {
            let cgroups: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
                .unwrap()
                .flatten()
                .map(|h| h.path().join(format!("slurm_{name}")))
                .filter(|p| p.exists())
                .collect();
            assert!(cgroups.is_empty(), "{proctrack:?}: {cgroups:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn overlapping_steps_share_the_first_gpu_and_a_whole_allocation_step_blocks_the_rest() {
    let cluster = SlurmCluster::start(Options::default());
    let job = allocation(&cluster, 1, 4).await;
    let jobid = format!("--jobid={job}");
    let d = cluster.dir.path().join("overlap");
    std::fs::create_dir_all(&d).unwrap();
    let ds = d.display().to_string();
    // Three steps with --overlap, each asking for one GPU, running at the same time.
    let mut steps: Vec<_> = (0..3)
        .map(|i| {
            let log = d.join(format!("srun-{i}.log"));
            let args = [
                jobid.as_str(),
                "--overlap",
                "--exact",
                "-N1",
                "-n1",
                "--gres=gpu:1",
                "sh",
                "-c",
                REPORT_AND_WAIT,
                &ds,
            ];
            srun(&cluster, &args, &log)
        })
        .collect();
    let cvd = |dir: &Path| -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("cvd."))
            .map(|e| read(e.path()).trim().to_string())
            .collect()
    };
    wait_until("three overlapping steps", LONG, || cvd(&d).len() == 3);
    assert_eq!(cvd(&d), ["0", "0", "0"], "every --overlap step got GPU 0");
    std::fs::write(d.join("go"), "").unwrap();
    for s in &mut steps {
        assert!(s.wait().unwrap().success());
    }

    // A step without --exact and -n takes the whole allocation on its node (one task, every
    // GPU and CPU): the next one waits for it.
    let w = cluster.dir.path().join("whole");
    std::fs::create_dir_all(&w).unwrap();
    let ws = w.display().to_string();
    let mut whole = srun(
        &cluster,
        &[&jobid, "sh", "-c", REPORT_AND_WAIT, &ws],
        &w.join("srun-whole.log"),
    );
    wait_until("the whole-allocation step", LONG, || !cvd(&w).is_empty());
    assert_eq!(
        cvd(&w),
        ["0,1,2,3"],
        "one task, holding every GPU of the node"
    );
    let small_log = w.join("srun-small.log");
    let small_marker = w.join("small-ran");
    let asked = cluster.rpc_count("REQUEST_JOB_STEP_CREATE");
    let mut small = srun(
        &cluster,
        &[
            &jobid,
            "--exact",
            "-N1",
            "-n1",
            "--gres=gpu:1",
            "touch",
            small_marker.to_str().unwrap(),
        ],
        &small_log,
    );
    // Once slurmctld has answered the small step's request, it waits: the whole one holds all.
    wait_until("slurmctld to answer the small step's request", LONG, || {
        cluster.rpc_count("REQUEST_JOB_STEP_CREATE") > asked
    });
    assert!(
        !small_marker.exists(),
        "the small step ran beside the whole one"
    );
    std::fs::write(w.join("go"), "").unwrap();
    assert!(whole.wait().unwrap().success());
    assert!(small.wait().unwrap().success(), "{}", read(&small_log));
    assert!(small_marker.exists());
    // srun says so only once the step is made, after the wait.
    let said = read(&small_log);
    assert!(
        said.contains("step creation temporarily disabled, retrying (Requested nodes are busy)"),
        "{said}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_spread_allocation_gives_each_step_its_own_gpu() {
    let cluster = SlurmCluster::start(Options::default());
    let slurm = cluster.layer();
    let job = slurm
        .submit(&request(
            &cluster,
            "fleet-spread",
            Shape::Spread { servers: 16 },
        ))
        .await
        .unwrap();
    let poll = Backoff::new(Duration::from_millis(50), Duration::from_millis(500));
    let cancel = CancellationToken::new();
    let running = tokio::time::timeout(LONG, slurm.wait_running(job, poll, &cancel, |_| {}))
        .await
        .expect("running in time")
        .unwrap();
    // Eight GPUs a node: Slurm put eight tasks on each.
    let record = slurm.job_record(job).await.unwrap();
    assert_eq!(
        record.allocated,
        [(running.nodes.clone(), "gpu:8(IDX:0-7)".to_string())]
    );
    let d = cluster.dir.path().join("spread");
    std::fs::create_dir_all(&d).unwrap();
    let ds = d.display().to_string();
    let jobid = format!("--jobid={job}");
    let mut sruns = Vec::new();
    for node in slurm.hostnames(&running.nodes).await.unwrap() {
        let nd = d.join(&node);
        std::fs::create_dir_all(&nd).unwrap();
        for k in 0..8 {
            let nodelist = format!("--nodelist={node}");
            let dir = format!("{ds}/{node}");
            let args = [
                jobid.as_str(),
                "--exact",
                "-N1",
                "-n1",
                "--gres=gpu:1",
                &nodelist,
                "sh",
                "-c",
                REPORT_AND_WAIT,
                &dir,
            ];
            sruns.push(srun(&cluster, &args, &nd.join(format!("srun-{k}.log"))));
        }
        let gpus = || -> BTreeSet<String> {
            std::fs::read_dir(&nd)
                .unwrap()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("cvd."))
                .map(|e| read(e.path()).trim().to_string())
                .collect()
        };
        wait_until("eight steps on the node", LONG, || gpus().len() == 8);
        let all: BTreeSet<String> = (0..8).map(|g| g.to_string()).collect();
        assert_eq!(gpus(), all, "{node}");
        std::fs::write(nd.join("go"), "").unwrap();
    }
    for mut s in sruns {
        assert!(s.wait().unwrap().success());
    }
}

/// A step whose program starts a process that leaves it (`setsid`, `nohup ... &`) and exits.
async fn escape_a_step(proctrack: Proctrack) -> (SlurmCluster, Vec<u32>) {
    let cluster = SlurmCluster::start(Options {
        nodes: 1,
        proctrack,
        ..Options::default()
    });
    let job = allocation(&cluster, 1, 1).await;
    let d = cluster.dir.path().to_path_buf();
    let script = r#"setsid sleep 600 </dev/null >/dev/null 2>&1 &
echo $! >"$0/setsid.pid"
nohup sleep 601 </dev/null >/dev/null 2>&1 &
echo $! >"$0/nohup.pid""#;
    let mut step = srun(
        &cluster,
        &[
            &format!("--jobid={job}"),
            "--exact",
            "-n1",
            "--gres=gpu:1",
            "sh",
            "-c",
            script,
            d.to_str().unwrap(),
        ],
        &d.join("srun-escape.log"),
    );
    assert!(
        step.wait().unwrap().success(),
        "{}",
        read(d.join("srun-escape.log"))
    );
    let pids = ["setsid.pid", "nohup.pid"]
        .map(|f| read(d.join(f)).trim().parse::<u32>().expect(f))
        .to_vec();
    (cluster, pids)
}

#[tokio::test(flavor = "multi_thread")]
async fn under_linuxproc_a_process_that_leaves_its_step_outlives_it() {
    let (cluster, pids) = escape_a_step(Proctrack::Linuxproc).await;
    // The step is over (srun returned): both still run, untracked by Slurm.
    for pid in &pids {
        assert!(alive(*pid), "pid {pid} died with its step under linuxproc");
    }
    drop(cluster); // the harness kills them, by the cluster's SLURM_CONF in their environment
    for pid in &pids {
        wait_until("the escaped process to be killed", LONG, || !alive(*pid));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn under_proctrack_cgroup_a_process_that_leaves_its_step_dies_with_it() {
    let (cluster, pids) = escape_a_step(Proctrack::Cgroup).await;
    for pid in &pids {
        wait_until("the escaped process to end with its step", LONG, || {
            !alive(*pid)
        });
    }
    drop(cluster);
}

#[tokio::test(flavor = "multi_thread")]
async fn time_left_node_addresses_and_a_node_that_goes_down() {
    let mut cluster = SlurmCluster::start(Options::default());
    let slurm = cluster.layer();
    let job = allocation(&cluster, 2, 1).await;
    let status = slurm.job(job).await.unwrap().expect("the job");
    let left = status.time_left.and_then(|t| t.duration()).expect("%L");
    assert!(
        left <= Duration::from_secs(600) && left > Duration::from_secs(500),
        "{left:?}"
    );
    let nodes = slurm.nodes(&status.nodes).await.unwrap();
    let addrs: Vec<&str> = nodes.iter().map(|n| n.addr.as_str()).collect();
    assert_eq!(addrs, ["127.0.0.2", "127.0.0.3"]);

    // A step on each node, then the second node dies as a node that loses power.
    let mut sruns: Vec<_> = cluster
        .node_names()
        .iter()
        .map(|n| {
            let log = cluster.dir.path().join(format!("srun-{n}.log"));
            let (jobid, nodelist) = (format!("--jobid={job}"), format!("--nodelist={n}"));
            let args = [&jobid, "--exact", "-N1", "-n1", "--gres=gpu:1", &nodelist];
            srun(&cluster, &[&args[..], &["sleep", "600"]].concat(), &log)
        })
        .collect();
    let numbered = |steps: &[fleet::slurm::StepStatus]| {
        steps
            .iter()
            .filter(|s| matches!(s.id.step, Step::Numbered(_)))
            .count()
    };
    let t0 = Instant::now();
    loop {
        let steps = slurm.steps(job).await.unwrap();
        if numbered(&steps) == 2 {
            break;
        }
        assert!(t0.elapsed() < LONG, "{steps:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Listed is not launched: wait for the task itself on each node.
    for n in cluster.node_names() {
        wait_until("the step's task", LONG, || {
            cluster
                .job_processes()
                .iter()
                .any(|p| p.env.get("SLURMD_NODENAME") == Some(&n) && p.program() == "sleep")
        });
    }
    let dead = cluster.nodes[1].name.clone();
    let t0 = Instant::now();
    cluster.kill_node(1);
    let mut state = None;
    while t0.elapsed() < LONG {
        let n = slurm.nodes(&dead).await.unwrap().remove(0);
        if n.state.is_down() {
            state = Some(n);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let node = state.unwrap_or_else(|| panic!("{dead} never DOWN:\n{}", cluster.logs()));
    eprintln!("{dead} DOWN after {:?}: {}", t0.elapsed(), node.state);
    assert!(node.state.has("NOT_RESPONDING"), "{}", node.state);
    assert_eq!(
        node.reason
            .as_deref()
            .map(|r| r.starts_with("Not responding")),
        Some(true)
    );
    // --no-kill: the allocation runs on, on the node that is left.
    let after = slurm.job(job).await.unwrap().unwrap();
    assert_eq!(after.state, JobState::Running);
    assert_eq!(
        (after.node_count, after.nodes.as_str()),
        (1, cluster.nodes[0].name.as_str())
    );
    // The dead node's step is still listed, as RUNNING: the step list alone does not tell a
    // lost server.
    let listed = slurm.steps(job).await.unwrap();
    assert!(
        listed.iter().any(|s| s.nodes == dead),
        "the step on {dead} left squeue: {listed:?}"
    );
    // Its srun, on the submitting host, ends, saying why, but with exit status 0.
    let srun_of_dead = sruns.remove(1).wait().unwrap();
    let said = read(cluster.dir.path().join(format!("srun-{dead}.log")));
    assert!(said.contains(&format!("Node failure on {dead}")), "{said}");
    assert!(srun_of_dead.success(), "{srun_of_dead}: {said}");

    cluster.restart_node(1);
    wait_until("the node back in service", LONG, || {
        let s = cluster.node_state(1);
        s.starts_with("IDLE") || s.starts_with("MIXED")
    });
    slurm.cancel_job(job).await.unwrap();
    assert!(!sruns.remove(0).wait().unwrap().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn sixteen_sim_servers_as_steps_on_two_nodes() {
    let cluster = SlurmCluster::start(Options::default());
    let slurm = cluster.layer();
    let dir = cluster.dir.path().to_path_buf();
    // Another user's job holds one GPU, so fleet's allocation has to wait for Resources.
    cluster.run(&[
        "sbatch",
        "--job-name=someone-else",
        "--ntasks=1",
        "--gres=gpu:1",
        "--time=10",
        &format!("--output={}/other.out", dir.display()),
        "--wrap=exec sleep infinity",
    ]);
    wait_until("the other job running", LONG, || {
        cluster.run(&["squeue", "--noheader", "--format=%T"]).trim() == "RUNNING"
    });
    let name = "fleet-sixteen";
    let shape = Shape::PerNode {
        nodes: 2,
        servers_per_node: 8,
    };
    let job = slurm.submit(&request(&cluster, name, shape)).await.unwrap();
    // The scheduler gives its reason once it has looked at the job.
    let mut reasons = BTreeSet::new();
    let t0 = Instant::now();
    loop {
        let s = slurm.job(job).await.unwrap().expect("the job");
        assert_eq!(s.state, JobState::Pending);
        if let Some(r) = s.reason.0 {
            reasons.insert(r);
            break;
        }
        assert!(t0.elapsed() < LONG, "no pending reason");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(reasons, BTreeSet::from(["Resources".to_string()]));

    // A step before the allocation runs is refused.
    let early = StepRequest {
        job,
        node: cluster.nodes[0].name.clone(),
        name: "too-early".into(),
        gpus: 1,
        cpus: None,
        output: dir.join("early.out").display().to_string(),
        argv: vec!["true".into()],
    };
    let early_log = dir.join("srun-early.log");
    let pid = slurm
        .start_step(
            &early,
            &BTreeMap::new(),
            early_log.to_str().unwrap(),
            dir.join("early.pid").to_str().unwrap(),
        )
        .await
        .unwrap();
    wait_until("the early srun to give up", LONG, || !alive(pid));
    assert!(
        read(&early_log).contains("Job is pending execution"),
        "{}",
        read(&early_log)
    );

    let other = cluster.run(&["squeue", "--noheader", "--name=someone-else", "--format=%i"]);
    cluster.run(&["scancel", other.trim()]);
    let poll = Backoff::new(Duration::from_millis(50), Duration::from_millis(500));
    let running = tokio::time::timeout(
        LONG,
        slurm.wait_running(job, poll, &CancellationToken::new(), |s| {
            reasons.extend(s.reason.0.clone());
        }),
    )
    .await
    .expect("running in time")
    .unwrap();
    assert!(reasons.contains("Resources"), "{reasons:?}");
    assert_eq!(running.node_count, 2);
    let nodes = slurm.nodes(&running.nodes).await.unwrap();
    assert_eq!(nodes.len(), 2);
    assert_eq!(
        slurm.hostnames(&running.nodes).await.unwrap(),
        cluster.node_names()
    );
    let record = slurm.job_record(job).await.unwrap();
    assert_eq!((record.name.as_str(), record.tasks), (name, 16));
    assert_eq!(
        record.batch_host.as_deref(),
        Some(cluster.nodes[0].name.as_str())
    );
    assert_eq!(
        record.allocated,
        [(running.nodes.clone(), "gpu:8(IDX:0-7)".to_string())]
    );

    // Eight servers per node on the same eight ports, each bound to its node's NodeAddr.
    let ports = common::reserve_ports(8);
    let state_dir = dir.join("gpu-state");
    let mut servers = Vec::new();
    for node in &nodes {
        for (k, port) in ports.range().enumerate() {
            let step = StepRequest {
                job,
                node: node.name.clone(),
                name: format!("{name}-{}-{k}", node.name),
                gpus: 1,
                cpus: None,
                output: dir
                    .join(format!("{}-{k}.log", node.name))
                    .display()
                    .to_string(),
                argv: [
                    SIM,
                    "--model-path",
                    "/models/test",
                    "--host",
                    &node.addr,
                    "--port",
                    &port.to_string(),
                    "--sim-startup-secs",
                    "0.2",
                    "--sim-gpu-state-dir",
                    state_dir.to_str().unwrap(),
                ]
                .map(String::from)
                .into(),
            };
            let srun_log = dir.join(format!("srun-{}-{k}.log", node.name));
            let pidfile = dir.join(format!("srun-{}-{k}.pid", node.name));
            slurm
                .start_step(
                    &step,
                    &BTreeMap::new(),
                    srun_log.to_str().unwrap(),
                    pidfile.to_str().unwrap(),
                )
                .await
                .unwrap();
            servers.push((node.addr.clone(), port, step.output));
        }
    }
    let http = fleet::sglang::client::http_client(Default::default()).unwrap();
    for (addr, port, log) in &servers {
        let url = format!("http://{addr}:{port}/health");
        let t0 = Instant::now();
        loop {
            let ok = http
                .get(&url)
                .timeout(Duration::from_secs(30))
                .send()
                .await
                .is_ok_and(|r| r.status() == 200);
            if ok {
                break;
            }
            assert!(t0.elapsed() < LONG, "{url} never healthy:\n{}", read(log));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    let steps = slurm.steps(job).await.unwrap();
    let ours: BTreeSet<String> = steps
        .iter()
        .filter(|s| matches!(s.id.step, Step::Numbered(_)) && s.name.starts_with(name))
        .map(|s| s.name.clone())
        .collect();
    assert_eq!(ours.len(), 16, "{steps:?}");
    let sims: Vec<_> = cluster
        .job_processes()
        .into_iter()
        .filter(|p| p.program() == "sglang-sim")
        .collect();
    assert_eq!(sims.len(), 16, "{sims:?}");
    let mut gpus: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for p in &sims {
        assert_eq!(p.env.get("SLURM_JOB_ID"), Some(&job.to_string()), "{p:?}");
        let node = p.env["SLURMD_NODENAME"].clone();
        gpus.entry(node)
            .or_default()
            .insert(p.env["CUDA_VISIBLE_DEVICES"].clone());
    }
    let all: BTreeSet<String> = (0..8).map(|g| g.to_string()).collect();
    for node in &nodes {
        assert_eq!(gpus.get(&node.name), Some(&all), "GPUs on {}", node.name);
    }

    // One server stopped alone: its step ends, the others serve on.
    let sims_now = || {
        cluster
            .job_processes()
            .into_iter()
            .filter(|p| p.program() == "sglang-sim")
            .count()
    };
    let first = steps
        .iter()
        .find(|s| s.name == format!("{name}-{}-0", nodes[0].name))
        .expect("the first server's step");
    slurm.cancel_step(first.id).await.unwrap();
    wait_until("the first server's step to end", LONG, || sims_now() == 15);
    let (addr, port, _) = &servers[1];
    let r = http
        .get(format!("http://{addr}:{port}/health"))
        .send()
        .await;
    assert!(r.is_ok_and(|r| r.status() == 200));

    slurm.cancel_job(job).await.unwrap();
    wait_until("no sim left", LONG, || sims_now() == 0);
    wait_until("no srun client left", LONG, || {
        !cluster.processes().iter().any(|p| p.program() == "srun")
    });
    let t0 = Instant::now();
    loop {
        let left = slurm.jobs_named(name).await.unwrap();
        if left.is_empty() {
            break;
        }
        assert!(t0.elapsed() < LONG, "squeue still lists {left:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // squeue --states=all still shows it, for MinJobAge (300 s).
    let ended = slurm.job(job).await.unwrap().expect("the ended job");
    assert_eq!(ended.state, JobState::Cancelled);
}
