//! One box, several fleets, through the real binary, real sshd and the fake `pct`: two
//! inventories on one container, each run from its own working directory (`a.yaml`: GPUs 0
//! and 1, `b.yaml`: GPUs 2 and 3, and `b01.yaml`: GPUs 0 and 1 again). Each fleet's `down`
//! stops only its own servers while the other's job runs on, `status` tells whose is whose, `up`
//! refuses a GPU another fleet, another profile or a process fleet did not start holds, and
//! `down --all` stops every fleet's servers on its inventory's GPUs.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use common::generate::{Sim, assert_exactly_once, completions, progress, write_prompts};
use common::local_fleet::SIM;
use common::world::World;
use serde_json::Value;

struct Box {
    world: World,
    /// Each user's working directory: `a/` holds a.yaml, `b/` holds b.yaml and b01.yaml.
    a: PathBuf,
    b: PathBuf,
    /// Ports of profile `acc` (port_base + GPU) and of profile `accb`.
    acc: common::Ports,
    accb: common::Ports,
}

impl Box {
    fn new() -> Box {
        let world = World::new(1);
        let (acc, accb) = (common::reserve_ports(4), common::reserve_ports(4));
        let b = Box {
            a: world.home.path().join("a"),
            b: world.home.path().join("b"),
            world,
            acc,
            accb,
        };
        b.inventory(&b.a, "a.yaml", "[0, 1]");
        b.inventory(&b.b, "b.yaml", "[2, 3]");
        b.inventory(&b.b, "b01.yaml", "[0, 1]");
        for dir in [&b.a, &b.b] {
            b.profile(dir, "acc", b.acc.base);
            b.profile(dir, "accb", b.accb.base);
        }
        b
    }

    fn inventory(&self, dir: &Path, file: &str, gpus: &str) {
        let h = &self.world.hosts[0];
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(
            dir.join(file),
            format!(
                "hosts:\n  - name: {}\n    ssh: {}\n    container: {}\n    address: {}\n    gpus: {gpus}\n",
                h.name, h.alias, h.container, h.address
            ),
        )
        .unwrap();
    }

    fn profile(&self, dir: &Path, name: &str, port_base: u16) {
        std::fs::create_dir_all(dir.join("profiles")).unwrap();
        std::fs::write(
            dir.join(format!("profiles/{name}.yaml")),
            format!(
                "model: /models/test\nlauncher: [{SIM}]\nport_base: {port_base}\nserver:\n  \
                 mamba_strategy: no_buffer\n  max_running_requests: 8\nenv:\n  \
                 SGLANG_SIM_STARTUP_SECS: \"1\"\n  SGLANG_SIM_TIME_SCALE: \"4\"\n"
            ),
        )
        .unwrap();
    }

    /// `fleet --config FILE ARGS` in `dir`.
    fn command(&self, dir: &Path, file: &str, args: &[&str]) -> std::process::Command {
        let mut c = self.world.fleet(&["--config", file]);
        c.args(args).current_dir(dir);
        c
    }

    fn run(&self, dir: &Path, file: &str, args: &[&str]) -> Output {
        self.command(dir, file, args).output().unwrap()
    }

    /// Runs with `--json`: (exit code, stdout as JSON rows, stderr).
    fn json(&self, dir: &Path, file: &str, args: &[&str]) -> (i32, Vec<Value>, String) {
        let out = self.run(dir, file, &[args, &["--json"]].concat());
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let rows: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{file} {args:?}: {e}\nstderr:\n{stderr}"));
        let rows = rows.as_array().expect("rows").clone();
        (out.status.code().unwrap_or(-1), rows, stderr)
    }

    /// The record fleet keeps on the host for the server on `port`.
    fn record(&self, port: u16) -> Option<Value> {
        let path = self
            .world
            .container_path(0, &format!("/tmp/fleet/{port}/instance.json"));
        let text = std::fs::read_to_string(path).ok()?;
        Some(serde_json::from_str(&text).unwrap())
    }
}

impl Drop for Box {
    fn drop(&mut self) {
        let _ = self.run(&self.b, "b.yaml", &["down", "--all", "--grace", "2s"]);
        let _ = self.run(&self.a, "a.yaml", &["down", "--all", "--grace", "2s"]);
    }
}

fn alive(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    })
}

fn listening(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(
        &(std::net::Ipv4Addr::new(127, 0, 0, 2), port).into(),
        Duration::from_millis(200),
    )
    .is_ok()
}

fn pids(rows: &[Value]) -> Vec<u64> {
    rows.iter().map(|r| r["pid"].as_u64().unwrap()).collect()
}

fn of<'a>(rows: &'a [Value], key: &str, value: &str) -> Vec<&'a Value> {
    rows.iter().filter(|r| r[key] == value).collect()
}

#[test]
fn two_fleets_on_one_container_keep_to_their_own_servers_and_gpus() {
    let x = Box::new();

    // 1. a starts two servers on GPUs 0 and 1, each recorded as a's.
    let (code, up_a, stderr) = x.json(&x.a, "a.yaml", &["up", "--profile", "acc"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(up_a.len(), 2);
    let a_pids = pids(&up_a);
    let record = x.record(x.acc.base).expect("a's record of GPU 0");
    let a_id = record["owner"]["fleet"].as_str().unwrap().to_string();
    assert!(a_id.starts_with("a-"), "{record}");
    assert!(
        record["owner"]["by"].as_str().unwrap().contains('@'),
        "{record}"
    );
    assert_eq!(
        record["owner"]["inventory"],
        std::fs::canonicalize(x.a.join("a.yaml"))
            .unwrap()
            .display()
            .to_string()
    );
    assert_eq!(
        (&record["profile"], &record["gpu"]),
        (&"acc".into(), &0.into())
    );
    assert!(record["started_at"].as_u64().unwrap() > 0);

    // b starts its own on GPUs 2 and 3, with another profile.
    let (code, up_b, stderr) = x.json(&x.b, "b.yaml", &["up", "--profile", "accb"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(up_b.len(), 2);
    let b_id = x.record(x.accb.base + 2).unwrap()["owner"]["fleet"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(b_id.starts_with("b-") && b_id != a_id, "{b_id}");

    // 2. b's status shows the whole container, a's servers as a's; --mine only b's.
    let (code, status, stderr) = x.json(&x.b, "b.yaml", &["status"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(status.len(), 4, "{status:?}");
    let theirs: Vec<&Value> = status.iter().filter(|s| s["mine"] == false).collect();
    assert_eq!(
        pids(&theirs.iter().map(|v| (*v).clone()).collect::<Vec<_>>()),
        a_pids
    );
    assert!(theirs.iter().all(|s| s["owner"]["fleet"] == a_id.as_str()));
    let text = x.run(&x.b, "b.yaml", &["status"]);
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    let other_rows: Vec<&str> = text.lines().filter(|l| l.contains(" (other)")).collect();
    assert_eq!(other_rows.len(), 2, "{text}");
    assert!(
        other_rows
            .iter()
            .all(|l| l.contains(&a_id) && l.contains("acc")),
        "{text}"
    );
    let (_, mine, _) = x.json(&x.b, "b.yaml", &["status", "--mine"]);
    assert_eq!(
        mine.iter()
            .map(|s| s["gpu"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [2, 3]
    );

    // 3. a's job runs while b goes down: b stops its own two, lists a's as left running, and
    // a's job goes on without a pause and finishes every prompt exactly once, on a's servers.
    let dir = tempfile::tempdir().unwrap();
    let (prompts, out) = (dir.path().join("p.jsonl"), dir.path().join("out"));
    write_prompts(&prompts, 300);
    let job = x
        .command(
            &x.a,
            "a.yaml",
            &[
                "generate",
                "--prompts",
                prompts.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
                "--max-tokens",
                "48",
                "--warmup",
                "0s",
            ],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while progress_done(&out) == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "a's job made no progress"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (code, down, stderr) = x.json(&x.b, "b.yaml", &["down"]);
    assert_eq!(code, 0, "{stderr}");
    let stopped = of(&down, "state", "stopped");
    assert_eq!(
        stopped
            .iter()
            .map(|d| d["gpu"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [2, 3],
        "{down:?}"
    );
    let left = of(&down, "state", "left_running");
    assert_eq!(left.len(), 2, "{down:?}");
    assert!(
        left.iter()
            .all(|d| d["owner"]["fleet"] == a_id.as_str() && d["profile"] == "acc")
    );
    assert!(
        a_pids.iter().all(|p| alive(*p)),
        "b's down stopped a's servers"
    );
    assert!(
        progress(&out)["status"] == "running",
        "a's job ended before b's down: make it longer"
    );
    let finished = job.wait_with_output().unwrap();
    let job_stderr = String::from_utf8_lossy(&finished.stderr);
    assert_eq!(finished.status.code(), Some(0), "{job_stderr}");
    assert!(!job_stderr.contains("paused"), "{job_stderr}");
    assert_exactly_once(&out, 300);
    let servers: std::collections::BTreeSet<String> = completions(&out)
        .iter()
        .map(|c| c["instance"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        servers.into_iter().collect::<Vec<_>>(),
        ["ct200:gpu0", "ct200:gpu1"]
    );

    // 4. Another fleet (b01.yaml, GPUs 0 and 1) is refused before anything starts, each GPU
    // named with its holder and the way out.
    let refused = x.run(&x.b, "b01.yaml", &["up", "--profile", "accb"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(3), "{stderr}");
    for gpu in 0..2 {
        let line = stderr
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("ct200 gpu{gpu} (for ")))
            .unwrap_or_else(|| panic!("no line for gpu{gpu}:\n{stderr}"));
        assert!(
            line.contains(&format!("(fleet {a_id}, "))
                && line.contains("profile acc)")
                && line.contains(&format!("`fleet down --fleet {a_id}`")),
            "{line}"
        );
    }
    assert!(x.record(x.accb.base).is_none() && !listening(x.accb.base));
    assert!(x.record(x.accb.base + 1).is_none() && !listening(x.accb.base + 1));

    // a's own inventory with another profile is refused too, unless --replace.
    let refused = x.run(&x.a, "a.yaml", &["up", "--profile", "accb"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("ct200 gpu0 (for ct200 gpu0 :")
            && stderr.contains("this fleet's server of profile acc")
            && stderr.contains("--replace stops it"),
        "{stderr}"
    );
    assert!(a_pids.iter().all(|p| alive(*p)));

    // 5. A process fleet did not start holds GPU 2's memory: b's up is refused naming it, and
    // goes once it is gone.
    let state = x.world.container_path(0, "/tmp/sglang-sim-gpus");
    let squatter = Sim::start_on_gpu(2, &state, &[]);
    let refused = x.run(&x.b, "b.yaml", &["up", "--profile", "accb"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "ct200 gpu2 (for ct200 gpu2 :{}): its memory is in use by a process fleet did not start: pid {} (",
            x.accb.base + 2,
            squatter.pid()
        )),
        "{stderr}"
    );
    assert!(!stderr.contains("ct200 gpu3 (for"), "{stderr}");
    assert!(!listening(x.accb.base + 3), "GPU 3 must not start either");
    drop(squatter);
    let (code, _, stderr) = x.json(&x.b, "b.yaml", &["up", "--profile", "accb"]);
    assert_eq!(code, 0, "{stderr}");

    // 6. down --all from b01.yaml (GPUs 0 and 1) says what it stops, stops a's servers, and
    // leaves b's on GPUs 2 and 3; --fleet NAME --dry-run names the same.
    let dry = x.run(&x.b, "b01.yaml", &["down", "--fleet", &a_id, "--dry-run"]);
    let text = String::from_utf8_lossy(&dry.stdout);
    assert_eq!(text.matches("would stop ct200 gpu").count(), 2, "{text}");
    assert!(a_pids.iter().all(|p| alive(*p)));
    let (code, down, stderr) = x.json(&x.b, "b01.yaml", &["down", "--all"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr
            .contains("stopping every server fleet started on this inventory's GPUs: 2 server(s)")
            && stderr.contains(&format!("ct200 gpu0 :{} (fleet {a_id}", x.acc.base)),
        "{stderr}"
    );
    assert_eq!(of(&down, "state", "stopped").len(), 2, "{down:?}");
    assert_eq!(of(&down, "state", "left_running").len(), 2, "{down:?}");
    assert!(a_pids.iter().all(|p| !alive(*p)));
    let (_, left, _) = x.json(&x.b, "b.yaml", &["status", "--mine"]);
    assert_eq!(left.len(), 2);
    assert!(left.iter().all(|s| s["health"] == 200), "{left:?}");
}

fn progress_done(out: &Path) -> u64 {
    std::fs::read_to_string(out.join("progress.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|p| p["completed"].as_u64())
        .unwrap_or(0)
}
