//! `fleet up` against itself, through the real binary on a local simulated fleet: two `up`s of
//! one profile at once leave every server recorded (so `down` stops them all), an `up` waits for
//! another that holds the run directory's lock, and a lock whose owner is gone is taken over.

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::local_fleet::LocalFleet;
use serde_json::{Value, json};

const GPUS: u16 = 4;

struct Fleet {
    local: LocalFleet,
    ports: common::Ports,
}

impl Fleet {
    fn new() -> Fleet {
        let f = Fleet {
            local: LocalFleet::new(GPUS.into()),
            ports: common::reserve_ports(GPUS),
        };
        f.local.write_profile(
            "sim",
            &format!(
                "model: /models/test\nlauncher: [sglang-sim]\nport_base: {}\n\
                 server:\n  mamba_strategy: no_buffer\n\
                 env:\n  SGLANG_SIM_STARTUP_SECS: \"1\"\n  SGLANG_SIM_GPU_STATE_DIR: \"{}\"\n\
                 health: {{startup_timeout: 60s, poll: 1s}}\n",
                f.ports.base,
                f.local.gpu_state().display()
            ),
        );
        f
    }

    fn lock_file(&self) -> std::path::PathBuf {
        let mut lock = self.local.run_dir().into_os_string();
        lock.push(".up.lock");
        lock.into()
    }

    /// The pids of the instance records, by port.
    fn recorded(&self) -> Vec<(u16, u64)> {
        let mut found = Vec::new();
        for port in self.ports.range() {
            let path = self.local.run_dir().join(format!("{port}/instance.json"));
            if let Ok(text) = std::fs::read_to_string(path) {
                let v: Value = serde_json::from_str(&text).unwrap();
                found.push((port, v["pid"].as_u64().unwrap()));
            }
        }
        found
    }
}

fn listening(port: u16) -> bool {
    TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200)).is_ok()
}

fn alive(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    })
}

/// A lock file as `fleet up` writes it: a token, then the owner.
fn write_lock(path: &std::path::Path, owner: Value) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, format!("test-token\n{owner}\n")).unwrap();
}

/// This test process as a lock owner fleet can check (same boot, same pid namespace).
fn me(start_ticks: u64) -> Value {
    let read = |p: &str| std::fs::read_to_string(p).unwrap().trim().to_string();
    json!({
        "pid": std::process::id(),
        "machine": read("/proc/sys/kernel/hostname"),
        "boot_id": read("/proc/sys/kernel/random/boot_id"),
        "pid_ns": std::fs::read_link("/proc/self/ns/pid").unwrap().display().to_string(),
        "start_ticks": start_ticks,
        "since": SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs(),
        "command": "the test",
    })
}

fn own_start_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let rest = stat.rsplit_once(')').unwrap().1;
    rest.split_whitespace().nth(19).unwrap().parse().unwrap()
}

#[test]
fn two_ups_at_once_leave_every_server_recorded_and_down_stops_them_all() {
    let f = Fleet::new();
    let start = || {
        f.local
            .command()
            .args(["--json", "up", "--profile", "sim"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (start(), start());
    let outputs = [a.wait_with_output().unwrap(), b.wait_with_output().unwrap()];
    let mut reported = BTreeSet::new();
    for out in &outputs {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{stderr}");
        let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
        for r in rows.as_array().unwrap() {
            assert!(
                r["state"] == "ready" || r["state"] == "already_running",
                "{r}\n{stderr}"
            );
            reported.insert((
                r["port"].as_u64().unwrap() as u16,
                r["pid"].as_u64().unwrap(),
            ));
        }
    }
    // Both runs saw the same servers: the ones recorded, one per port, each running.
    let recorded = f.recorded();
    assert_eq!(recorded.len(), usize::from(GPUS), "{recorded:?}");
    assert_eq!(reported, recorded.iter().copied().collect(), "{outputs:?}");
    assert!(recorded.iter().all(|(_, pid)| alive(*pid)));
    assert!(!f.lock_file().exists(), "both runs released the lock");

    let down = f.local.fleet().args(["--json", "down"]).output().unwrap();
    assert_eq!(down.status.code(), Some(0));
    assert!(
        f.ports.range().all(|p| !listening(p)),
        "a server nobody recorded"
    );
    assert!(recorded.iter().all(|(_, pid)| !alive(*pid)));
}

#[test]
fn up_waits_for_the_up_that_holds_the_lock_then_starts() {
    let f = Fleet::new();
    // This (live) test process holds the lock, as another `fleet up` would.
    write_lock(&f.lock_file(), me(own_start_ticks()));
    let mut child = f
        .local
        .command()
        .args(["up", "--profile", "sim", "--gpus", "0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "fleet up ended without waiting: {seen}"
        );
        seen.push_str(&line);
        if line.contains("waiting for another `fleet up` to finish here") {
            break;
        }
    }
    assert!(seen.contains("(the test)"), "names the holder: {seen}");
    assert!(
        f.recorded().is_empty(),
        "nothing starts while the lock is held"
    );
    std::fs::remove_file(f.lock_file()).unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(0), "{seen}{rest}");
    assert_eq!(f.recorded().len(), 1);
    assert!(!f.lock_file().exists());
}

#[test]
fn a_lock_whose_owner_is_gone_or_silent_is_taken_over() {
    let f = Fleet::new();
    // An owner on this machine whose process is gone: its pid now has another start time.
    write_lock(&f.lock_file(), me(own_start_ticks() + 1));
    let out = f
        .local
        .fleet()
        .args(["up", "--profile", "sim", "--gpus", "0"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("the run directory lock's owner (pid") && stderr.contains("is gone"),
        "{stderr}"
    );

    // An owner elsewhere is judged by its heartbeat: a minute of silence is too long.
    let mut elsewhere = me(0);
    elsewhere["boot_id"] = json!("another-machine");
    write_lock(&f.lock_file(), elsewhere);
    let minute_ago = SystemTime::now() - Duration::from_secs(60);
    std::fs::File::options()
        .write(true)
        .open(f.lock_file())
        .unwrap()
        .set_modified(minute_ago)
        .unwrap();
    let out = f
        .local
        .fleet()
        .args(["up", "--profile", "sim", "--gpus", "1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("took over the run directory lock of pid"),
        "{stderr}"
    );
    assert_eq!(f.recorded().len(), 2);
}
