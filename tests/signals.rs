//! SIGTERM (systemd stopping a unit, `kill`) and SIGHUP (a closed terminal, `tmux
//! kill-session`) take the Ctrl-C path through the real binary: `fleet up` stops the servers it
//! started and exits 143 or 129, and `fleet logs -f` ends with the signal's exit code.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};

use common::local_fleet::LocalFleet;

/// A fleet of 2 GPUs with a profile whose servers load for a minute.
fn slow_fleet() -> (LocalFleet, common::Ports) {
    let f = LocalFleet::new(2);
    let ports = common::reserve_ports(2);
    f.write_profile(
        "slow",
        &format!(
            "model: /models/test\nlauncher: [sglang-sim]\nport_base: {}\n\
             server:\n  mamba_strategy: no_buffer\n\
             env:\n  SGLANG_SIM_STARTUP_SECS: \"60\"\n  SGLANG_SIM_GPU_STATE_DIR: \"{}\"\n\
             health: {{startup_timeout: 2m, poll: 1s}}\n",
            ports.base,
            f.gpu_state().display()
        ),
    );
    (f, ports)
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    })
}

fn signal(child: &Child, name: &str) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{name}");
}

/// Reads `fleet up`'s log lines until both servers say they started; returns their pids.
fn started_pids(stderr: &mut impl BufRead) -> Vec<u32> {
    let mut pids = Vec::new();
    let mut seen = String::new();
    while pids.len() < 2 {
        let mut line = String::new();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "fleet up ended before starting both servers:\n{seen}"
        );
        seen.push_str(&line);
        // `local gpu0 :PORT: started (pid N), loading`
        if let Some(rest) = line.split("started (pid ").nth(1) {
            pids.push(rest.split(')').next().unwrap().parse().unwrap());
        }
    }
    pids
}

fn interrupt_up(name: &str, code: i32) {
    let (f, _ports) = slow_fleet();
    let mut child = f
        .command()
        .args(["up", "--profile", "slow"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let servers = started_pids(&mut stderr);
    assert!(servers.iter().all(|p| alive(*p)));
    signal(&child, name);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(code), "{rest}");
    assert!(
        rest.contains(&format!("interrupted (SIG{name})")),
        "says which signal: {rest}"
    );
    assert!(
        servers.iter().all(|p| !alive(*p)),
        "the interrupted up stops the servers it started: {rest}"
    );
    let status = f.fleet().args(["--json", "status"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&status.stdout).trim(), "[]");
}

#[test]
fn sigterm_during_up_stops_what_it_started_and_exits_143() {
    interrupt_up("TERM", 143);
}

#[test]
fn sighup_during_up_stops_what_it_started_and_exits_129() {
    interrupt_up("HUP", 129);
}

#[test]
fn sigterm_ends_logs_follow_with_143() {
    let (f, ports) = slow_fleet();
    let mut up = f
        .command()
        .args([
            "up",
            "--profile",
            "slow",
            "--gpus",
            "0",
            "--keep-on-interrupt",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut up_err = BufReader::new(up.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("started (pid ") {
        line.clear();
        assert!(up_err.read_line(&mut line).unwrap() > 0, "up ended early");
    }
    let mut logs = f
        .command()
        .args(["logs", &ports.base.to_string(), "-f"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The tail arrives: the follower is running.
    let mut out = BufReader::new(logs.stdout.take().unwrap());
    let mut first = String::new();
    assert!(out.read_line(&mut first).unwrap() > 0, "no log line");
    signal(&logs, "TERM");
    assert_eq!(logs.wait().unwrap().code(), Some(143));
    signal(&up, "TERM");
    assert_eq!(up.wait().unwrap().code(), Some(143));
}
