//! The `sglang-sim` binary over several GPUs and nodes: a TP2 server on a board, DP ranks'
//! caps, the heads and device refusals, and two ranks that rendezvous over `--dist-init-addr`
//! on two loopback addresses, where rank 1 serves only a dummy `/health` and a lost rank ends
//! rank 0. The fake `nvidia-smi` is read for `topo -m` and the processes on each GPU.

mod common;
mod sim_common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sim_common::*;

fn board(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/boards")
        .join(name)
        .display()
        .to_string()
}

fn nvidia_smi() -> PathBuf {
    common::fixtures_bin().join("nvidia-smi")
}

/// Whether the GPU state file of `gpu` for the sim's pid exists, and its memory.
fn state_memory(sim: &Sim, gpu: u32) -> Option<u64> {
    let path = sim
        .dir
        .path()
        .join("gpus")
        .join(format!("gpu{gpu}-{}.json", sim.child.id()));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
    v["memory_used_mib"].as_u64()
}

#[tokio::test]
async fn a_tp2_server_on_a_switch_pair_fills_both_gpus_and_reports_its_layout() {
    let topo = board("pcie-8-unordered.txt");
    let mut sim = Sim::spawn(
        &["--tp-size", "2", "--sim-weights-gib", "120"],
        &[
            ("CUDA_VISIBLE_DEVICES", "2,0"),
            ("FAKE_NVIDIA_SMI_TOPO", &topo),
        ],
    );
    sim.wait_ready(Duration::from_secs(30)).await;
    let info = sim.get_json("/server_info").await;
    assert_eq!(info["tp_size"], 2);
    assert_eq!(info["dp_size"], 1);
    assert_eq!(info["sim"]["gpus"], json!([2, 0]));
    assert_eq!(info["sim"]["allreduce_link"], "PIX");
    let states = info["internal_states"].as_array().unwrap();
    assert_eq!(states.len(), 1);
    assert_eq!(states[0]["memory_usage"]["weight"], 60.0);
    // Both GPUs of the group hold the same share, well past the 60 GiB of weights.
    let (m2, m0) = (
        state_memory(&sim, 2).unwrap(),
        state_memory(&sim, 0).unwrap(),
    );
    assert_eq!(m2, m0);
    assert!(m2 > 60 * 1024, "{m2}");
    assert!(state_memory(&sim, 1).is_none());

    // The fake nvidia-smi lists the process on both GPUs, and prints the board.
    let dir = sim.dir.path().join("gpus");
    let out = Command::new(nvidia_smi())
        .args([
            "--query-compute-apps=pid,gpu_uuid,used_memory",
            "--format=csv,noheader,nounits",
        ])
        .env("SGLANG_SIM_GPU_STATE_DIR", &dir)
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let pid = sim.child.id();
    let rows: Vec<&str> = text.lines().collect();
    assert_eq!(
        rows,
        [
            format!("{pid}, GPU-6c1f2a9e-4b1d-4c3e-9a7f-000000000000, {m0}"),
            format!("{pid}, GPU-6c1f2a9e-4b1d-4c3e-9a7f-000000000002, {m2}"),
        ]
    );
    let topo_out = Command::new(nvidia_smi())
        .args(["topo", "-m"])
        .env("FAKE_NVIDIA_SMI_TOPO", &topo)
        .output()
        .unwrap();
    assert!(topo_out.status.success());
    assert_eq!(topo_out.stdout, std::fs::read(&topo).unwrap());
    let bare = Command::new(nvidia_smi())
        .args(["topo", "-m"])
        .env_remove("FAKE_NVIDIA_SMI_TOPO")
        .output()
        .unwrap();
    assert!(!bare.status.success());
    assert!(String::from_utf8_lossy(&bare.stderr).contains("Not Supported"));

    // Across sockets the same TP2 all-reduces over SYS.
    let across = Sim::spawn(
        &["--tp-size", "2", "--sim-weights-gib", "120"],
        &[
            ("CUDA_VISIBLE_DEVICES", "0,4"),
            ("FAKE_NVIDIA_SMI_TOPO", &topo),
        ],
    );
    let mut across = across;
    across.wait_ready(Duration::from_secs(30)).await;
    let info_across = across.get_json("/server_info").await;
    assert_eq!(info_across["sim"]["allreduce_link"], "SYS");
    assert!(
        info["sim"]["ideal_output_tok_s"].as_f64().unwrap()
            > info_across["sim"]["ideal_output_tok_s"].as_f64().unwrap()
    );
}

#[tokio::test]
async fn dp_replicas_each_report_their_cap() {
    let mut sim = Sim::spawn(
        &["--tp-size", "2", "--dp-size", "2"],
        &[("CUDA_VISIBLE_DEVICES", "0,1,2,3")],
    );
    sim.wait_ready(Duration::from_secs(30)).await;
    let info = sim.get_json("/server_info").await;
    assert_eq!(
        (info["tp_size"].as_u64(), info["dp_size"].as_u64()),
        (Some(2), Some(2))
    );
    let states = info["internal_states"].as_array().unwrap();
    assert_eq!(states.len(), 2);
    let per_dp = states[0]["effective_max_running_requests_per_dp"]
        .as_u64()
        .unwrap();
    assert_eq!(
        info["sim"]["effective_max_running_requests"].as_u64(),
        Some(2 * per_dp)
    );
    for gpu in 0..4 {
        assert!(state_memory(&sim, gpu).is_some(), "GPU {gpu}");
    }
}

#[tokio::test]
async fn heads_and_devices_refuse_as_sglang_does() {
    let mut heads = Sim::spawn(&["--tp-size", "3"], &[("CUDA_VISIBLE_DEVICES", "0,1,2")]);
    let status = heads.wait_exit(Duration::from_secs(30)).await.unwrap();
    assert_eq!(status.code(), Some(1));
    assert!(
        heads.log().contains(
            "AssertionError: Total number of attention heads (32) must be divisible by tensor \
             parallel size (3)."
        ),
        "{}",
        heads.log()
    );
    let mut few = Sim::spawn(&["--tp-size", "4"], &[("CUDA_VISIBLE_DEVICES", "0,1")]);
    let status = few.wait_exit(Duration::from_secs(30)).await.unwrap();
    assert_eq!(status.code(), Some(1));
    assert!(
        few.log()
            .contains("torch.AcceleratorError: CUDA error: invalid device ordinal"),
        "{}",
        few.log()
    );
}

/// One rank of a two-node server on its own loopback address.
struct Rank {
    child: Child,
    host: &'static str,
    port: u16,
    log: PathBuf,
}

impl Rank {
    fn spawn(dir: &Path, rank: u32, host: &'static str, port: u16, dist: &str) -> Rank {
        let log = dir.join(format!("rank{rank}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(BIN)
            .args(["--model-path", "/models/test", "--sim-startup-secs", "0.2"])
            .args(["--host", host, "--port", &port.to_string()])
            .args(["--tp-size", "2", "--nnodes", "2"])
            .args(["--node-rank", &rank.to_string(), "--dist-init-addr", dist])
            .arg("--sim-gpu-state-dir")
            .arg(dir.join("gpus"))
            .env("CUDA_VISIBLE_DEVICES", "0")
            .stdin(Stdio::null())
            .stdout(Stdio::from(file.try_clone().unwrap()))
            .stderr(Stdio::from(file))
            .spawn()
            .unwrap();
        Rank {
            child,
            host,
            port,
            log,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}:{}{path}", self.host, self.port)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn status(&self, http: &reqwest::Client, path: &str) -> Option<u16> {
        http.get(self.url(path))
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .ok()
            .map(|r| r.status().as_u16())
    }

    /// Polls `/health` until 200.
    async fn wait_healthy(&mut self, http: &reqwest::Client) {
        let start = Instant::now();
        while self.status(http, "/health").await != Some(200) {
            if let Some(s) = self.child.try_wait().unwrap() {
                panic!("rank exited ({s}) before healthy:\n{}", self.log());
            }
            assert!(start.elapsed() < Duration::from_secs(30), "{}", self.log());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Polls the log until it holds `text`.
    async fn wait_log(&self, text: &str) {
        let start = Instant::now();
        while !self.log().contains(text) {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no `{text}` in:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Some(s) = self.child.try_wait().unwrap() {
                return Some(s);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    fn signal(&self, sig: i32) {
        let pid = i32::try_from(self.child.id()).unwrap();
        // SAFETY: kill(2) on the child this test spawned and still owns.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
    }
}

impl Drop for Rank {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Two ranks on 127.0.0.2 and 127.0.0.3, both on the same API port (each its own address),
/// rendezvousing at rank 0's address on a second port.
fn two_ranks(dir: &Path) -> (Rank, Rank, common::Ports) {
    let ports = common::reserve_ports(2);
    let dist = format!("127.0.0.2:{}", ports.base + 1);
    let r0 = Rank::spawn(dir, 0, "127.0.0.2", ports.base, &dist);
    let r1 = Rank::spawn(dir, 1, "127.0.0.3", ports.base, &dist);
    (r0, r1, ports)
}

#[tokio::test]
async fn two_ranks_rendezvous_and_a_lost_rank_ends_rank_0() {
    let dir = tempfile::tempdir().unwrap();
    let http = fleet::sglang::client::http_client(Default::default()).unwrap();
    let ports = common::reserve_ports(2);
    let dist = format!("127.0.0.2:{}", ports.base + 1);
    let mut r0 = Rank::spawn(dir.path(), 0, "127.0.0.2", ports.base, &dist);
    // Rank 0 waits at the rendezvous with its API closed until rank 1 joins.
    r0.wait_log("Init torch distributed begin.").await;
    assert_eq!(r0.status(&http, "/health").await, None);
    let mut r1 = Rank::spawn(dir.path(), 1, "127.0.0.3", ports.base, &dist);
    r0.wait_healthy(&http).await;
    r1.wait_healthy(&http).await;
    assert!(
        r1.log().contains(&format!(
            "Dummy health check server started in background thread at 127.0.0.3:{}",
            ports.base
        )),
        "{}",
        r1.log()
    );

    // Rank 0 serves the API; rank 1 only its dummy health.
    let r = http
        .post(r0.url("/generate"))
        .json(&json!({"text": "hello", "sampling_params": {"max_new_tokens": 4}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["meta_info"]["completion_tokens"], 4);
    let info: Value = http
        .get(r0.url("/server_info"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (info["tp_size"].as_u64(), info["nnodes"].as_u64()),
        (Some(2), Some(2))
    );
    assert_eq!(r1.status(&http, "/health_generate").await, Some(200));
    assert_eq!(r1.status(&http, "/server_info").await, Some(404));
    let post = http
        .post(r1.url("/generate"))
        .json(&json!({"text": "hello"}))
        .send()
        .await
        .unwrap();
    assert_eq!(post.status(), 404);

    // Rank 1 killed: rank 0's collectives fail and it exits.
    r1.signal(libc::SIGKILL);
    let status = r0
        .wait_exit(Duration::from_secs(5))
        .await
        .unwrap_or_else(|| panic!("rank 0 still running:\n{}", r0.log()));
    assert_eq!(status.code(), Some(1));
    assert!(
        r0.log()
            .contains("RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.3]"),
        "{}",
        r0.log()
    );
}

#[tokio::test]
async fn rank_1_waits_for_rank_0_to_stop_it_and_times_out_alone() {
    let dir = tempfile::tempdir().unwrap();
    let http = fleet::sglang::client::http_client(Default::default()).unwrap();
    let (mut r0, mut r1, _ports) = two_ranks(dir.path());
    r0.wait_healthy(&http).await;
    r1.wait_healthy(&http).await;
    // SGLang's rank >= 1 ignores SIGTERM and waits for rank 0's shutdown broadcast.
    r1.signal(libc::SIGTERM);
    r1.wait_log("SIGTERM received on node_rank 1; waiting for the rank-0 ShutdownReq broadcast")
        .await;
    assert_eq!(r1.status(&http, "/health").await, Some(200));
    r0.signal(libc::SIGTERM);
    let s0 = r0.wait_exit(Duration::from_secs(10)).await.unwrap();
    let s1 = r1.wait_exit(Duration::from_secs(10)).await.unwrap();
    assert_eq!((s0.code(), s1.code()), (Some(0), Some(0)), "{}", r1.log());
    assert_eq!(
        std::fs::read_dir(dir.path().join("gpus")).unwrap().count(),
        0,
        "every rank removes its GPU state"
    );

    // A rank 1 whose rank 0 never comes fails at the rendezvous timeout.
    let ports = common::reserve_ports(2);
    let out = Command::new(BIN)
        .args(["--model-path", "/m", "--host", "127.0.0.3"])
        .args(["--port", &ports.base.to_string(), "--tp-size", "2"])
        .args(["--nnodes", "2", "--node-rank", "1", "--dist-timeout", "1"])
        .args(["--dist-init-addr", &format!("127.0.0.2:{}", ports.base + 1)])
        .arg("--sim-gpu-state-dir")
        .arg(dir.path().join("gpus"))
        .env("CUDA_VISIBLE_DEVICES", "0")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "torch.distributed.DistNetworkError: The client socket has timed out after 1000ms \
             while trying to connect to (127.0.0.2, {}).",
            ports.base + 1
        )),
        "{err}"
    );
}
