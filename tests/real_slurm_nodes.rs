//! One real SGLang 0.5.23 server over the two nodes of the Slurm test cluster, through the real
//! binary: `up` with `tp_size: 2, nnodes: 2` makes a rank on each node (their node addresses,
//! 127.0.0.2 and 127.0.0.3, keep the ranks' ports apart), the server itself reports `tp_size` 2
//! and serves a job exactly once, and `down` leaves no job and no process. Before that, a rank
//! that fails at start-up is shown in its own log's words, and `up` again starts the server anew.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::real::RealSglang;
use common::reserve_ports;
use common::slurm::{Options, SlurmCluster};
use common::slurm_fleet::{SlurmFleet, allocation};

#[test]
fn a_real_server_over_two_slurm_nodes_serves_a_job_and_down_leaves_nothing() {
    let real = RealSglang::find();
    let cluster = SlurmCluster::start(Options::default());
    let ports = reserve_ports(2);
    let f = SlurmFleet::new(cluster, &allocation(2, 30), ports.base);
    let calls: PathBuf = Path::new(env!("CARGO_TARGET_TMPDIR")).join(common::unique("nodes-calls"));
    let profile = real.profile(ports.base, &calls, &["tp_size: 2", "nnodes: 2"]);
    std::fs::write(f.path().join("profiles/real.yaml"), &profile).unwrap();
    struct Down<'a>(&'a SlurmFleet);
    impl Drop for Down<'_> {
        fn drop(&mut self) {
            let _ = self.0.fleet(&["down", "--grace", "10s"]);
        }
    }
    let _down = Down(&f);

    // Both "nodes" are this machine: without a core of its own for each rank (RUNTIME.md, CPU
    // tensor parallel), the CPU engine refuses two ranks on one NUMA node. `up` says so in the
    // failing rank's own words, whichever rank that is.
    let failed = f.fleet(&["up", "--profile", "real"]);
    let (out, err) = (
        String::from_utf8_lossy(&failed.stdout),
        String::from_utf8_lossy(&failed.stderr),
    );
    assert_eq!(failed.status.code(), Some(1), "{out}\n{err}");
    assert!(
        err.contains("should be smaller than or equal to number of numa node"),
        "the rank's reason:\n{out}\n{err}"
    );

    // With a core for each, `up` again stops what is left of the failed server and starts it.
    let profile = profile.replace(
        "\nenv:\n",
        "\nenv:\n  SGLANG_CPU_OMP_THREADS_BIND: \"0|1\"\n",
    );
    std::fs::write(f.path().join("profiles/real.yaml"), profile).unwrap();

    let up: Vec<serde_json::Value> =
        serde_json::from_str(&f.ok(&["--json", "up", "--profile", "real"])).unwrap();
    assert_eq!(up.len(), 1, "one server over both nodes: {up:?}");
    assert_eq!(up[0]["state"], "ready", "{up:?}");

    // A rank on each node, each its own process tree, meeting at one rendezvous.
    let ranks: Vec<Vec<String>> = RealSglang::processes(&calls)
        .into_iter()
        .filter_map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            // The servers themselves, not the `srun`s that started them.
            let server = Path::new(&args[0]) == real.python
                && args.iter().any(|a| a == "sglang.launch_server");
            server.then_some(args)
        })
        .collect();
    let value = |args: &[String], flag: &str| {
        let at = args.iter().position(|a| a == flag).expect(flag);
        args[at + 1].clone()
    };
    assert_eq!(ranks.len(), 2, "{ranks:?}");
    let hosts: BTreeSet<String> = ranks.iter().map(|a| value(a, "--host")).collect();
    assert_eq!(hosts.len(), 2, "each rank at its node's address: {ranks:?}");
    let rendezvous: BTreeSet<String> = ranks.iter().map(|a| value(a, "--dist-init-addr")).collect();
    assert_eq!(rendezvous.len(), 1, "{ranks:?}");

    // The server's own word, from rank 0: two tensor-parallel ranks.
    let status: serde_json::Value = serde_json::from_str(&f.ok(&["--json", "status"])).unwrap();
    let rows = status.as_array().unwrap();
    assert_eq!(rows.len(), 1, "{status:#}");
    assert_eq!(rows[0]["state"], "ready", "{status:#}");
    let rank0 = ranks
        .iter()
        .find(|a| value(a, "--node-rank") == "0")
        .expect("rank 0");
    let address = format!("{}:{}", value(rank0, "--host"), rows[0]["port"]);
    let info = common::get_json(&address, "/server_info");
    assert_eq!(info["tp_size"].as_u64(), Some(2), "{info:#}");

    assert_eq!(f.job(30, 8), 30);

    f.ok(&["-q", "down", "--grace", "30s"]);
    assert_eq!(f.fleet_jobs(), "");
    let left = RealSglang::processes(&calls);
    assert!(left.is_empty(), "processes left after down: {left:?}");
}
