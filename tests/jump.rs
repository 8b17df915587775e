//! ProxyJump as users have it in `~/.ssh/config`: a Proxmox host this machine cannot reach,
//! behind a bastion, each an sshd in a network namespace the test made (see
//! `common::netns`). Through the real binary: `exec`, `gpus`, `up`/`down` of a sim, unknown
//! host keys on each hop, a target down behind its bastion, two hops, a refused ProxyCommand.
//! `jump_reconnect.rs` loses a jump host's connection under a running forward.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::netns::Hops;
use common::{Sshd, TestHome};
use serde_json::Value;

const TARGET: &str = "pve";

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The Proxmox host (`pve`) and its container 200, both reached as `ssh: pve`.
fn inventory(home: &TestHome) -> PathBuf {
    home.write_inventory(&format!(
        "hosts:\n  - name: host\n    ssh: {TARGET}\n  - name: ct200\n    ssh: {TARGET}\n    container: 200\n    address: 127.0.0.1\n"
    ))
}

fn exec(home: &TestHome, config: &PathBuf, args: &[&str]) -> std::process::Output {
    home.fleet()
        .arg("--config")
        .arg(config)
        .args(args)
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap()
}

fn logins(sshd: &Sshd) -> usize {
    sshd.log().matches("Accepted publickey").count()
}

#[test]
fn exec_and_gpus_reach_a_host_only_through_its_bastion() {
    let hops = Hops::start(1, &[("FAKE_PCT_RUNNING", "200")]);
    let (bastion, target) = (hops.bastion(0), hops.target());
    let home = hops.home(TARGET);
    let config = inventory(&home);

    // This machine cannot reach the target at all: only the bastion can.
    let direct = std::net::TcpStream::connect_timeout(
        &format!("{}:{}", target.listen, target.port)
            .parse()
            .unwrap(),
        Duration::from_secs(2),
    );
    assert!(
        direct.is_err(),
        "the target is reachable directly: {direct:?}"
    );

    let out = exec(
        &home,
        &config,
        &[
            "exec",
            "--",
            "sh",
            "-c",
            "echo \"$SSH_CONNECTION\" | cut -d' ' -f1,3",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    // sshd on the target saw the connections come from the bastion's side of their link.
    let from = format!("{} {}", hops.chain.peer_addr(1), target.listen);
    assert_eq!(
        stdout(&out),
        format!("== host ==\n{from}\n== ct200 ==\n{from}\n")
    );
    assert!(
        target.log().contains(&format!(
            "Accepted publickey for {} from {} ",
            target.user,
            hops.chain.peer_addr(1)
        )),
        "{}",
        target.log()
    );
    // Two hosts behind the same bastion share one connection to it; each has its own to pve.
    assert_eq!(logins(bastion), 1, "{}", bastion.log());
    assert_eq!(logins(target), 2, "{}", target.log());
    assert!(
        bastion
            .log()
            .contains(&format!("from {} ", hops.chain.peer_addr(0))),
        "{}",
        bastion.log()
    );

    let out = exec(&home, &config, &["--json", "gpus"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    for row in json.as_array().unwrap() {
        assert_eq!(row["gpus"].as_array().map(Vec::len), Some(8), "{row}");
        assert!(row["error"].is_null(), "{row}");
    }
}

#[test]
fn an_unknown_host_key_is_refused_naming_the_hop_it_belongs_to() {
    let hops = Hops::start(1, &[]);
    let (bastion, target) = (hops.bastion(0), hops.target());
    let home = hops.home(TARGET);
    let config = inventory(&home);

    // The bastion's key is unknown: the message names the bastion and its fingerprint.
    std::fs::write(home.known_hosts(), target.known_hosts_line() + "\n").unwrap();
    let out = exec(&home, &config, &["exec", "--host", "host", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    assert!(
        text.contains(&format!(
            "host: cannot reach {TARGET} through bastion: bastion: the host key of [{}]:{} is unknown ({})",
            bastion.listen,
            bastion.port,
            bastion.host_fingerprint()
        )),
        "{text}"
    );
    assert!(text.contains("--accept-new-host-key"), "{text}");
    assert_eq!(logins(target), 0);

    // The target's key is unknown: the message names the target, not the bastion.
    std::fs::write(home.known_hosts(), bastion.known_hosts_line() + "\n").unwrap();
    let out = exec(&home, &config, &["exec", "--host", "host", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    assert!(
        text.contains(&format!(
            "host: the host key of [{}]:{} is unknown ({})",
            target.listen,
            target.port,
            target.host_fingerprint()
        )),
        "{text}"
    );
    assert!(!text.contains(&bastion.host_fingerprint()), "{text}");

    // Accepting records each hop's key under its own name, once.
    std::fs::write(home.known_hosts(), "").unwrap();
    let out = exec(
        &home,
        &config,
        &["--accept-new-host-key", "exec", "--", "true"],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let recorded = std::fs::read_to_string(home.known_hosts()).unwrap();
    let mut lines: Vec<&str> = recorded.lines().filter(|l| !l.is_empty()).collect();
    lines.sort();
    let mut expected = [bastion.known_hosts_line(), target.known_hosts_line()];
    expected.sort();
    assert_eq!(lines, expected);
}

#[test]
fn a_target_down_behind_a_live_bastion_is_named_with_the_hop_that_failed() {
    let mut hops = Hops::start(1, &[]);
    let home = hops.home(TARGET);
    let config = inventory(&home);
    hops.target_mut().stop();
    let out = exec(&home, &config, &["exec", "--host", "host", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    let target = hops.target();
    assert!(
        text.contains(&format!(
            "host: cannot reach {TARGET} through bastion: bastion: cannot open a connection to {}:{}: the jump host could not connect there",
            target.listen, target.port
        )),
        "{text}"
    );
}

#[test]
fn two_hops_as_a_list_or_as_each_hosts_own_proxy_jump() {
    let hops = Hops::start(2, &[]);
    let home = hops.home(TARGET);
    let config = inventory(&home);
    let from = format!("{} {}", hops.chain.peer_addr(2), hops.target().listen);
    let want = format!("== host ==\n{from}\n");
    let args = [
        "exec",
        "--host",
        "host",
        "--",
        "sh",
        "-c",
        "echo \"$SSH_CONNECTION\" | cut -d' ' -f1,3",
    ];
    let out = exec(&home, &config, &args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert_eq!(stdout(&out), want);

    // The same chain written hop by hop: pve through bastion2, bastion2 through bastion1.
    let cfg = home.path().join(".ssh/config");
    let text = std::fs::read_to_string(&cfg).unwrap();
    let text = text
        .replace("  ProxyJump bastion1,bastion2\n", "  ProxyJump bastion2\n")
        .replace("Host bastion2\n", "Host bastion2\n  ProxyJump bastion1\n");
    std::fs::write(&cfg, text).unwrap();
    let out = exec(&home, &config, &args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert_eq!(stdout(&out), want);
    for (i, sshd) in hops.sshds.iter().enumerate() {
        assert_eq!(logins(sshd), 2, "hop {i}:\n{}", sshd.log());
    }
}

#[test]
fn up_and_down_of_a_sim_through_the_bastion() {
    let hops = Hops::start(1, &[("FAKE_PCT_RUNNING", "200")]);
    let home = hops.home(TARGET);
    home.write_inventory(&format!(
        "hosts:\n  - name: ct200\n    ssh: {TARGET}\n    container: 200\n    address: 127.0.0.1\n    gpus: [0, 1]\n"
    ));
    std::fs::create_dir_all(home.path().join("profiles")).unwrap();
    std::fs::write(
        home.path().join("profiles/sim.yaml"),
        format!(
            "model: /models/test\nlauncher: [{}]\nport_base: 25000\nserver:\n  mamba_strategy: no_buffer\nenv:\n  SGLANG_SIM_STARTUP_SECS: \"1\"\n",
            common::local_fleet::SIM
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
        let value: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: {e}\n{}", stderr(&out)));
        (out.status.code(), value, stderr(&out))
    };
    let (code, up, err) = fleet(&["up", "--profile", "sim"]);
    assert_eq!(code, Some(0), "{err}");
    let rows = up.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert!(rows.iter().all(|r| r["state"] == "ready"), "{up}");
    // Health through the forwarded ports: local port -> bastion -> pve -> the container.
    let (code, status, err) = fleet(&["status"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        status
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["health"] == 200),
        "{status}"
    );
    let (code, down, err) = fleet(&["down"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        down.as_array()
            .unwrap()
            .iter()
            .all(|d| d["state"] == "stopped" && d["port_closed"] == true),
        "{down}"
    );
    let log = hops
        .target()
        .container_path(200, "/tmp/fleet/25000/server.log");
    assert!(
        std::fs::read_to_string(&log)
            .unwrap()
            .contains("ready to roll")
    );
}

#[test]
fn a_proxy_command_is_refused_naming_its_file_and_line() {
    let sshd = Sshd::start();
    let home = sshd.home(TARGET);
    home.append_config("Host *\n  ServerAliveInterval 30\n  ProxyCommand ssh -W %h:%p bastion\n");
    let config = inventory(&home);
    let out = exec(&home, &config, &["exec", "--host", "host", "--", "true"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let text = stdout(&out);
    let file = home.path().join(".ssh/config");
    assert!(
        text.contains(&format!(
            "host: SSH configuration: {}:8: `ProxyCommand ssh -W %h:%p bastion` is not supported by fleet",
            file.display()
        )),
        "{text}"
    );
    assert!(text.contains("use `ProxyJump host`"), "{text}");
    assert_eq!(logins(&sshd), 0, "nothing may connect");
}
