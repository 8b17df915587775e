//! `fleet up/status/down/logs` through the real binary against real sglang-sim servers on this
//! machine (and one case over real sshd + fake pct). Each test has its own ports (reserved
//! across processes by `common::reserve_ports`), run directory and fake-GPU state, so tests run
//! in parallel, under `cargo test` as under cargo-nextest.

mod common;
mod launch_common;

use std::time::{Duration, Instant};

use common::local_fleet::SIM;
use launch_common::{Fleet, alive, field, listening, pids, rows, wait_dead};
use serde_json::Value;

#[test]
fn up_status_down_on_eight_instances() {
    let f = Fleet::new();
    f.profile("sim", "  mamba_strategy: no_buffer\n", "");
    let started = Instant::now();
    let (code, up, stderr) = f.json(&["up", "--profile", "sim"]);
    assert_eq!(code, 0, "{stderr}");
    let up = rows(&up);
    assert_eq!(up.len(), 8);
    assert!(up.iter().all(|r| r["state"] == "ready"), "{up:?}");
    assert_eq!(
        field(up, "port")
            .iter()
            .map(|p| p.as_u64().unwrap())
            .collect::<Vec<_>>(),
        (f.port(0)..f.port(8)).map(u64::from).collect::<Vec<_>>()
    );
    assert!(up.iter().all(|r| r["version"] == "0.5.23"));
    assert!(
        up.iter()
            .all(|r| r["effective_max_running_requests"].as_u64().unwrap() > 0)
    );
    assert!(
        up.iter()
            .all(|r| r["max_total_num_tokens"].as_u64().unwrap() > 0)
    );
    // Started in parallel: eight 1 s loads take about one, not eight.
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
    let up_pids = pids(up);
    assert!(up_pids.iter().all(|p| alive(*p)));

    let (code, status, stderr) = f.json(&["status"]);
    assert_eq!(code, 0, "{stderr}");
    let status = rows(&status);
    assert_eq!(status.len(), 8);
    assert!(
        status
            .iter()
            .all(|s| s["liveness"] == "running" && s["health"] == 200),
        "{status:?}"
    );
    assert!(
        status
            .iter()
            .all(|s| s["load"]["num_running_reqs"].as_f64() == Some(0.0))
    );
    assert_eq!(pids(status), up_pids);
    // The fake nvidia-smi reads the sims' GPU state: each GPU shows its server's memory.
    assert!(
        status
            .iter()
            .all(|s| s["gpu_reading"]["memory_used_mib"].as_u64().unwrap() > 1024)
    );

    let text = f
        .fleet()
        .arg("status")
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8_lossy(&text);
    assert!(text.lines().next().unwrap().contains("GEN TOK/S"), "{text}");
    assert_eq!(
        text.lines().filter(|l| l.contains(" ready ")).count(),
        8,
        "{text}"
    );

    let started = Instant::now();
    let (code, down, stderr) = f.json(&["down"]);
    assert_eq!(code, 0, "{stderr}");
    let down = rows(&down);
    assert_eq!(down.len(), 8);
    assert!(
        down.iter()
            .all(|d| d["state"] == "stopped" && d["port_closed"] == true),
        "{down:?}"
    );
    assert!(
        down.iter().all(|d| d["gpu_memory_used_mib"] == 0),
        "{down:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(up_pids.iter().all(|p| !alive(*p)));
    assert!((f.port(0)..f.port(8)).all(|p| !listening(p)));

    // Idempotent: nothing left to stop, nothing left to show.
    let (code, down, _) = f.json(&["down"]);
    assert_eq!((code, rows(&down).len()), (0, 0));
    let (code, status, _) = f.json(&["status"]);
    assert_eq!((code, rows(&status).len()), (0, 0));
}

#[test]
fn up_again_leaves_the_same_config_alone_and_refuses_another_without_replace() {
    let f = Fleet::new();
    f.profile("sim", "", "");
    let (code, first, stderr) = f.json(&["up", "--profile", "sim", "--gpus", "0,1"]);
    assert_eq!(code, 0, "{stderr}");
    let first_pids = pids(rows(&first));

    let (code, again, stderr) = f.json(&["up", "--profile", "sim", "--gpus", "0,1"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        rows(&again).iter().all(|r| r["state"] == "already_running"),
        "{again:?}"
    );
    assert_eq!(pids(rows(&again)), first_pids);

    // The same profile name with another setting is another config.
    f.profile("sim", "  context_length: 4096\n", "");
    let out = f
        .fleet()
        .args(["up", "--profile", "sim", "--gpus", "0,1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "local gpu0 :{}: already running a different config",
            f.port(0)
        )),
        "{stderr}"
    );
    assert!(stderr.contains("--replace"), "{stderr}");
    assert!(
        first_pids.iter().all(|p| alive(*p)),
        "a refused up must not touch the servers"
    );

    let (code, replaced, stderr) =
        f.json(&["up", "--profile", "sim", "--gpus", "0,1", "--replace"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        rows(&replaced).iter().all(|r| r["state"] == "ready"),
        "{replaced:?}"
    );
    let new_pids = pids(rows(&replaced));
    assert!(new_pids.iter().all(|p| !first_pids.contains(p)));
    assert!(first_pids.iter().all(|p| !alive(*p)));
    assert!(
        rows(&replaced)[0]["argv"]
            .as_array()
            .unwrap()
            .contains(&Value::from("4096"))
    );
}

#[test]
fn a_server_dying_during_load_fails_at_once_with_its_log_tail() {
    let f = Fleet::new();
    // An 8 s load that never finishes: the sim crashes a quarter of the way in (2 s).
    f.profile(
        "dies",
        "",
        "  SGLANG_SIM_DIE_AFTER: \"0\"\n  SGLANG_SIM_STARTUP_SECS: \"8\"\n",
    );
    let started = Instant::now();
    let out = f
        .fleet()
        .args(["up", "--profile", "dies", "--gpus", "3"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    // Well before the load would have ended, let alone the 60 s startup timeout.
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
    assert!(
        stderr.contains(&format!(
            "local gpu3 :{}: the server process exited during startup",
            f.port(3)
        )),
        "{stderr}"
    );
    // The log tail follows, each line marked.
    assert!(stderr.contains("    | "), "{stderr}");
    assert!(
        stderr.contains("    | torch.AcceleratorError: CUDA error"),
        "{stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.lines().nth(1).unwrap().contains("failed"),
        "{stdout}"
    );
    // It stays listed as dead, with its log on -v, until `down` forgets it.
    let (code, status, _) = f.json(&["status"]);
    assert_eq!(code, 1);
    assert_eq!(rows(&status)[0]["liveness"], "dead");
    let out = f.fleet().args(["status", "-v"]).output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains(&format!("local gpu3 :{} (dead):", f.port(3)))
    );
    let (code, down, _) = f.json(&["down"]);
    assert_eq!(code, 0);
    assert_eq!(rows(&down)[0]["state"], "already_dead");
}

#[test]
fn preflight_reports_every_flag_the_hosts_sglang_rejects_before_starting_anything() {
    let f = Fleet::new();
    f.profile(
        "old",
        "  mamba_strategy: extra_buffer_lazy\n  extra_args: [--trust-remote-cod, --dtype, bfloat17]\n",
        "  SGLANG_SIM_VERSION: \"0.5.10\"\n",
    );
    let started = Instant::now();
    let out = f.fleet().args(["up", "--profile", "old"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    for expected in [
        "preflight: 3 flag problem(s); nothing was started",
        "local (SGLang 0.5.10, `sglang-sim --help`)",
        "--mamba-scheduler-strategy: invalid choice 'extra_buffer_lazy' (choose from auto, no_buffer, extra_buffer)",
        "unrecognized argument --trust-remote-cod (did you mean --trust-remote-code?)",
        "--dtype: invalid choice 'bfloat17'",
    ] {
        assert!(
            stderr.contains(expected),
            "missing {expected:?} in:\n{stderr}"
        );
    }
    assert!(
        !f.run_dir().exists(),
        "nothing may start after a failed preflight"
    );
    assert!((f.port(0)..f.port(8)).all(|p| !listening(p)));

    // --skip-preflight reads no --help: the newest flag name is rendered, unchecked.
    let (code, plan, stderr) = f.json(&["up", "--profile", "old", "--dry-run", "--skip-preflight"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        rows(&plan)[0]["argv"]
            .as_array()
            .unwrap()
            .contains(&Value::from("--mamba-radix-cache-strategy"))
    );

    // The same profile on the newer version renders the newer flag name, which accepts it.
    f.profile(
        "new",
        "  mamba_strategy: extra_buffer_lazy\n",
        "  SGLANG_SIM_VERSION: \"0.5.23\"\n",
    );
    let (code, plan, stderr) = f.json(&["up", "--profile", "new", "--dry-run"]);
    assert_eq!(code, 0, "{stderr}");
    let argv = rows(&plan)[0]["argv"].as_array().unwrap();
    let at = argv
        .iter()
        .position(|a| a == "--mamba-radix-cache-strategy")
        .expect("new flag");
    assert_eq!(argv[at + 1], "extra_buffer_lazy");
}

#[test]
fn dry_run_prints_the_exact_argv_and_env_with_the_api_key_masked() {
    let f = Fleet::new();
    std::fs::write(
        f.path().join("profiles/keyed.yaml"),
        format!(
            "model: /models/test\nlauncher: [sglang-sim]\nport_base: {}\nserved_model_name: q\napi_key_env: TEST_FLEET_KEY\nserver:\n  mamba_strategy: no_buffer\nenv: {{SGLANG_SIM_GPU_STATE_DIR: \"{}\"}}\n",
            f.port_base,
            f.gpu_state().display()
        ),
    )
    .unwrap();
    let out = f
        .fleet()
        .env("TEST_FLEET_KEY", "sk-very-secret")
        .args([
            "-v",
            "up",
            "--profile",
            "keyed",
            "--gpus",
            "5",
            "--dry-run",
            "--json",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stdout.contains("sk-very-secret") && !stderr.contains("sk-very-secret"));
    let plan: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        plan,
        serde_json::json!([{
            "host": "local", "gpu": 5, "port": f.port(5),
            "argv": ["sglang-sim", "--model-path", "/models/test", "--served-model-name", "q",
                     "--host", "127.0.0.1", "--port", f.port(5).to_string(),
                     "--mamba-radix-cache-strategy", "no_buffer",
                     "--config", format!("{}/{}/secrets.yaml", f.run_dir().display(), f.port(5)),
                     "--disable-overlap-schedule", "--enable-metrics"],
            "env": {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "5",
                    "SGLANG_SIM_GPU_STATE_DIR": f.gpu_state().display().to_string()},
        }])
    );
    assert!(!f.run_dir().exists());

    // Started for real: the key reaches the server (its /server_info demands it) and no log
    // line, table or record shows it.
    let out = f
        .fleet()
        .env("TEST_FLEET_KEY", "sk-very-secret")
        .env("SGLANG_SIM_STARTUP_SECS", "1")
        .args(["-vv", "up", "--profile", "keyed", "--gpus", "5", "--json"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("--config"),
        "-vv shows the commands sent:\n{stderr}"
    );
    assert!(
        !stdout.contains("sk-very-secret") && !stderr.contains("sk-very-secret"),
        "{stderr}"
    );
    let up: Value = serde_json::from_str(&stdout).unwrap();
    assert!(
        rows(&up)[0]["effective_max_running_requests"]
            .as_u64()
            .unwrap()
            > 0
    );
    let record =
        std::fs::read_to_string(f.run_dir().join(format!("{}/instance.json", f.port(5)))).unwrap();
    assert!(
        record.contains("TEST_FLEET_KEY") && !record.contains("sk-very-secret"),
        "{record}"
    );

    let out = f
        .fleet()
        .args(["up", "--profile", "keyed", "--dry-run"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("TEST_FLEET_KEY is not set"));
}

#[test]
fn down_with_one_instance_already_dead_stops_the_rest() {
    let f = Fleet::new();
    f.profile("sim", "", "");
    let (code, up, stderr) = f.json(&["up", "--profile", "sim", "--gpus", "0,1,2"]);
    assert_eq!(code, 0, "{stderr}");
    let up_pids = pids(rows(&up));
    // SIGKILL the second server behind fleet's back (by the pid fleet reported).
    assert!(
        std::process::Command::new("kill")
            .args(["-KILL", &up_pids[1].to_string()])
            .status()
            .unwrap()
            .success()
    );
    wait_dead(up_pids[1]);
    let (code, status, _) = f.json(&["status"]);
    assert_eq!(code, 1, "a dead instance makes status partial");
    assert_eq!(
        field(rows(&status), "liveness"),
        ["running", "dead", "running"]
    );

    let (code, down, stderr) = f.json(&["down"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        field(rows(&down), "state"),
        ["stopped", "already_dead", "stopped"]
    );
    assert!(up_pids.iter().all(|p| !alive(*p)));
}

#[test]
fn a_server_ignoring_sigterm_is_killed_after_the_grace_period() {
    let f = Fleet::new();
    f.profile("stubborn", "  extra_args: [--sim-ignore-sigterm]\n", "");
    let (code, up, stderr) = f.json(&["up", "--profile", "stubborn", "--gpus", "0"]);
    assert_eq!(code, 0, "{stderr}");
    let started = Instant::now();
    let (code, down, stderr) = f.json(&["down", "--grace", "1s"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(rows(&down)[0]["state"], "killed");
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert!(!alive(pids(rows(&up))[0]));
}

#[test]
fn a_foreign_process_on_a_port_is_a_clear_error_and_nothing_starts() {
    let f = Fleet::new();
    f.profile("sim", "", "");
    let _squatter = std::net::TcpListener::bind(("127.0.0.1", f.port(1))).unwrap();
    let out = f
        .fleet()
        .args(["up", "--profile", "sim", "--gpus", "0,1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "local gpu1 :{}: the port is in use by a process fleet did not start",
            f.port(1)
        )),
        "{stderr}"
    );
    assert!(!listening(f.port(0)), "GPU 0 must not start either");
}

#[test]
fn logs_by_host_gpu_and_by_port() {
    let f = Fleet::new();
    f.profile("sim", "", "");
    let (code, _, stderr) = f.json(&["up", "--profile", "sim", "--gpus", "4"]);
    assert_eq!(code, 0, "{stderr}");
    let out = f
        .fleet()
        .args(["logs", "local:4", "-n", "50"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        text.contains("The server is fired up and ready to roll!"),
        "{text}"
    );
    assert!(text.lines().count() <= 50);
    let by_port = f
        .fleet()
        .args(["logs", &f.port(4).to_string(), "-n", "1"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&by_port.stdout).lines().count(), 1);
    let out = f.fleet().args(["logs", "local:6"]).output().unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no instance local:6"));
    let out = f.fleet().args(["logs", "local:x"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));

    // Stopped, its log is still there and still found, by host:gpu as by port.
    assert_eq!(f.json(&["down"]).0, 0);
    for selector in ["local:4".to_string(), f.port(4).to_string()] {
        let out = f
            .fleet()
            .args(["logs", &selector, "-n", "20"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{selector}");
        assert!(
            text.contains("Received SIGTERM"),
            "the end of its log: {text}"
        );
    }
    // A new server on the port replaces the old log, and the stopped record with it.
    f.profile("other", "  context_length: 4096\n", "");
    assert_eq!(f.json(&["up", "--profile", "other", "--gpus", "4"]).0, 0);
    let stopped = f.run_dir().join(format!("{}/stopped.json", f.port(4)));
    assert!(!stopped.exists());
    // Gone with its directory, a stopped server's log is not found.
    assert_eq!(f.json(&["down"]).0, 0);
    std::fs::remove_dir_all(f.run_dir().join(f.port(4).to_string())).unwrap();
    let out = f.fleet().args(["logs", "local:4"]).output().unwrap();
    assert_eq!(out.status.code(), Some(3));
}

#[test]
fn ctrl_c_during_up_stops_what_it_started() {
    let f = Fleet::new();
    f.profile("slow", "", "  SGLANG_SIM_STARTUP_SECS: \"60\"\n");
    let mut cmd = f.command();
    cmd.args(["up", "--profile", "slow", "--gpus", "0,1"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut child = cmd.spawn().unwrap();
    let pidfile = f.run_dir().join(format!("{}/pid", f.port(1)));
    let deadline = Instant::now() + Duration::from_secs(20);
    let record = f.run_dir().join(format!("{}/instance.json", f.port(1)));
    while !(pidfile.exists() && record.exists()) {
        assert!(Instant::now() < deadline, "the servers did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let server: u64 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        std::process::Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .unwrap()
            .success()
    );
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    assert!(
        !alive(server),
        "the interrupted up must stop the servers it started"
    );
    let (_, status, _) = f.json(&["status"]);
    assert_eq!(rows(&status).len(), 0);
}

#[test]
fn up_status_down_through_ssh_and_pct() {
    let sshd = common::Sshd::start();
    let ports = common::reserve_ports(2);
    let home = sshd.home("pve");
    home.write_inventory(
        "hosts:\n  - name: ct200\n    ssh: pve\n    container: 200\n    address: 127.0.0.1\n    gpus: [0, 1]\n",
    );
    std::fs::create_dir_all(home.path().join("profiles")).unwrap();
    std::fs::write(
        home.path().join("profiles/sim.yaml"),
        format!(
            // The run dir (/tmp/fleet) and the sims' GPU state (/tmp/sglang-sim-gpus) are the
            // defaults, inside the container's own /tmp.
            "model: /models/test\nlauncher: [{}]\nport_base: {}\nserver:\n  mamba_strategy: no_buffer\nenv:\n  SGLANG_SIM_STARTUP_SECS: \"1\"\n",
            SIM,
            ports.base,
        ),
    )
    .unwrap();
    let fleet = |args: &[&str]| {
        let out = home
            .fleet()
            .env_remove("FLEET_RUN_DIR")
            .timeout(Duration::from_secs(120))
            .args(args)
            .arg("--json")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let value: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: {e}\nstderr:\n{stderr}\n{}", sshd.log()));
        (out.status.code(), value, stderr)
    };
    let (code, up, stderr) = fleet(&["-v", "up", "--profile", "sim"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        rows(&up)
            .iter()
            .all(|r| r["state"] == "ready" && r["host"] == "ct200"),
        "{up:?}"
    );
    // -v says where the time went: connect, preflight's reads, and each server's phases.
    for phase in [
        "phase connect: ",
        "phase preflight ct200: --help ",
        "phase up ",
    ] {
        assert!(stderr.contains(phase), "no `{phase}` in:\n{stderr}");
    }
    let phases: Vec<&str> = stderr.lines().filter(|l| l.contains("phases ")).collect();
    assert_eq!(phases.len(), 2, "{stderr}");
    for (line, row) in phases.iter().zip(rows(&up)) {
        for part in ["spawn ", "port open +", "health 200 +", "server_info "] {
            assert!(line.contains(part), "no `{part}` in {line}");
        }
        // Liveness is a remote command through ssh and `pct exec`: at most one a second while
        // waiting (plus the first), however often /health is tried.
        let checks: u64 = line
            .split(", ")
            .last()
            .and_then(|p| p.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no liveness count in {line}"));
        let waited = row["ready_after"].as_f64().unwrap();
        assert!(
            checks <= waited.ceil() as u64 + 1,
            "{checks} checks in {waited}s: {line}"
        );
    }
    // The servers run detached on the far side: they outlive fleet's SSH session.
    let (code, status, stderr) = fleet(&["status"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(rows(&status).iter().all(|s| s["health"] == 200));
    let (code, down, stderr) = fleet(&["down"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        rows(&down)
            .iter()
            .all(|d| d["state"] == "stopped" && d["port_closed"] == true)
    );
    assert!(ports.range().all(|p| !listening(p)));
    // What fleet left on the target is inside the container, not in this machine's /tmp.
    let log = sshd.container_path(200, format!("/tmp/fleet/{}/server.log", ports.base));
    let text = std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    assert!(text.contains("fired up and ready to roll"), "{text}");
}

#[test]
fn a_server_not_ready_by_the_startup_timeout_fails_and_is_stopped() {
    let f = Fleet::new();
    f.profile("slow", "", "  SGLANG_SIM_STARTUP_SECS: \"60\"\n");
    let path = f.path().join("profiles/slow.yaml");
    let yaml = std::fs::read_to_string(&path)
        .unwrap()
        .replace("startup_timeout: 60s", "startup_timeout: 2s");
    std::fs::write(&path, yaml).unwrap();
    let (code, up, stderr) = f.json(&["up", "--profile", "slow", "--gpus", "0"]);
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(rows(&up)[0]["state"], "failed");
    assert_eq!(rows(&up)[0]["error"], "not ready after 2s; stopped it");
    let tail = rows(&up)[0]["log_tail"].as_str().unwrap();
    // The tail ends with the server shutting down on fleet's SIGTERM.
    assert!(tail.contains("Received SIGTERM"), "{tail}");
    assert!(!alive(pids(rows(&up))[0]));
    assert!(!listening(f.port(0)));
}

#[test]
fn logs_follow_prints_new_lines_until_interrupted() {
    use std::io::{BufRead, BufReader};
    let f = Fleet::new();
    // A 3 s load logs its phases over time: following shows them as they come.
    f.profile("sim", "", "  SGLANG_SIM_STARTUP_SECS: \"3\"\n");
    let mut up = f
        .command()
        .args(["-q", "up", "--profile", "sim", "--gpus", "0"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f
        .run_dir()
        .join(format!("{}/instance.json", f.port(0)))
        .exists()
    {
        assert!(Instant::now() < deadline, "the server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut child = f
        .command()
        .args(["logs", &f.port(0).to_string(), "-n", "1", "-f"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Lines arrive through a thread, so a server that never gets ready fails the test in time
    // instead of blocking it on a read.
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen: Vec<String> = Vec::new();
    while !seen
        .iter()
        .any(|l| l.contains("The server is fired up and ready to roll!"))
    {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => seen.push(line),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("no ready line followed: {seen:?}");
            }
        }
    }
    assert!(seen.len() > 2, "only the tail and the end: {seen:?}");
    assert!(
        std::process::Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .unwrap()
            .success()
    );
    assert_eq!(child.wait().unwrap().code(), Some(130));
    reader.join().unwrap();
    assert_eq!(up.wait().unwrap().code(), Some(0));
}

#[test]
fn down_with_a_profile_stops_only_that_profiles_instances() {
    let f = Fleet::new();
    f.profile("a", "", "");
    f.profile("b", "  context_length: 4096\n", "");
    assert_eq!(f.json(&["up", "--profile", "a", "--gpus", "0"]).0, 0);
    assert_eq!(f.json(&["up", "--profile", "b", "--gpus", "1"]).0, 0);
    let (code, down, stderr) = f.json(&["down", "--profile", "b"]);
    assert_eq!(code, 0, "{stderr}");
    // The other profile's server is listed as left running, never signalled.
    let states: Vec<(u64, &str)> = rows(&down)
        .iter()
        .map(|d| (d["port"].as_u64().unwrap(), d["state"].as_str().unwrap()))
        .collect();
    assert_eq!(
        states,
        [
            (u64::from(f.port(1)), "stopped"),
            (u64::from(f.port(0)), "left_running")
        ]
    );
    let (_, status, _) = f.json(&["status"]);
    assert_eq!(field(rows(&status), "profile"), ["a"]);
    assert!(listening(f.port(0)) && !listening(f.port(1)));
}
