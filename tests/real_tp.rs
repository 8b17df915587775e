//! One real SGLang 0.5.23 server over two (CPU) GPUs with tensor parallel, through the real
//! binary, real sshd and the fake `pct`: `up` starts one TP2 server on the container's two
//! GPUs (said to take contiguous GPUs, as the fake board reports no topology), the server
//! itself reports `tp_size` 2, a job runs exactly once on it, and `down` leaves no process.

mod common;

use std::path::{Path, PathBuf};

use common::generate::{assert_exactly_once, write_lines};
use common::real::RealSglang;
use common::world::World;
use serde_json::{Value, json};

struct Down<'a>(&'a World);

impl Drop for Down<'_> {
    fn drop(&mut self) {
        let _ = self.0.fleet(&["down", "--grace", "10s"]).output();
    }
}

#[test]
fn a_tensor_parallel_real_server_through_ssh_and_pct() {
    let real = RealSglang::find();
    let world = World::new(1);
    world.inventory("[0, 1]");
    let calls: PathBuf = Path::new(env!("CARGO_TARGET_TMPDIR")).join(common::unique("tp-calls"));
    let port_base = common::free_port_base(2);
    let profiles = world.home.path().join("profiles");
    std::fs::create_dir_all(&profiles).unwrap();
    // Two ranks on two cores: the CPU engine wants one core list per rank (RUNTIME.md).
    let profile = real.profile(port_base, &calls, &["tp_size: 2"]).replace(
        "\nenv:\n",
        "\nenv:\n  SGLANG_CPU_OMP_THREADS_BIND: \"0|1\"\n",
    );
    std::fs::write(profiles.join("tp2.yaml"), profile).unwrap();
    let _down = Down(&world);
    let fleet = |args: &[&str]| {
        let o = world.fleet(args).output().unwrap();
        let (out, err) = (
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        );
        assert!(
            o.status.success(),
            "fleet {args:?}: {:?}\n{out}\n{err}",
            o.status
        );
        (out, err)
    };

    let (up, up_err) = fleet(&["up", "--profile", "tp2"]);
    eprintln!("{up}{up_err}");
    let rows: Vec<&str> = up.lines().filter(|l| l.contains(" ready ")).collect();
    assert_eq!(rows.len(), 1, "one server over both GPUs:\n{up}");
    assert!(
        rows[0].contains(" 0+1 "),
        "its group in the GPU column:\n{up}"
    );
    assert_eq!(
        up_err.matches("no GPU topology").count(),
        1,
        "the fallback to contiguous groups is said once:\n{up_err}"
    );

    // The server's own word: two tensor-parallel ranks, one DP rank's cap.
    let status: Value = serde_json::from_str(&fleet(&["status", "--json"]).0).unwrap();
    let rows = status.as_array().unwrap();
    assert_eq!(rows.len(), 1, "{status:#}");
    assert_eq!(rows[0]["group"]["gpus"], json!([0, 1]), "{status:#}");
    let port = rows[0]["port"].as_u64().unwrap();
    let info = common::get_json(
        &format!("{}:{port}", world.hosts[0].address),
        "/server_info",
    );
    assert_eq!(
        (info["tp_size"].as_u64(), info["dp_size"].as_u64()),
        (Some(2), Some(1))
    );
    assert_eq!(info["internal_states"].as_array().map(Vec::len), Some(1));

    // A job on it, exactly once.
    let dir = tempfile::tempdir().unwrap();
    let prompts = dir.path().join("p.jsonl");
    let lines: Vec<String> = (0..40)
        .map(|i| json!({"id": format!("p{i}"), "prompt": format!("count to {i}")}).to_string())
        .collect();
    write_lines(&prompts, &lines);
    let out = dir.path().join("out");
    let p = prompts.to_str().unwrap();
    let o = out.to_str().unwrap();
    fleet(&["generate", "--prompts", p, "--out", o, "--max-tokens", "16"]);
    assert_exactly_once(&out, 40);

    // down: both ranks' processes, and every other process of the server, are gone.
    fleet(&["down", "--grace", "30s"]);
    let left = RealSglang::processes(&calls);
    assert!(left.is_empty(), "processes left after down: {left:?}");
}
