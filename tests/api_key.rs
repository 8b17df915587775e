//! The API key through the real `fleet` binary, over real sshd and the fake `pct`, against
//! sglang-sim servers that are as leaky as SGLang 0.5.23 (the key in plain text in the log's
//! `server_args=` and in `/server_info`): it reaches the servers, and is in no process's argv,
//! no file others can read, and nothing fleet prints or stores.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::local_fleet::SIM;
use serde_json::Value;

const KEY: &str = "sk-fleet-test-4f9c2a7d";

/// Every process's argv on this machine (the fake pct's containers run here too).
fn argvs_holding(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let argv = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if argv.contains(needle) {
            found.push(format!("{}: {argv}", entry.file_name().to_string_lossy()));
        }
    }
    found
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else {
            out.push(path);
        }
    }
    out
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// `GET path` on a server with an optional bearer token: the status code and body.
fn get(port: u16, path: &str, key: Option<&str>) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (code, body)
}

#[test]
fn the_api_key_reaches_the_servers_and_nothing_else_through_ssh_and_pct() {
    let sshd = common::Sshd::start();
    let ports = common::reserve_ports(2);
    let home = sshd.home("pve");
    home.write_inventory(
        "hosts:\n  - name: ct200\n    ssh: pve\n    container: 200\n    address: 127.0.0.1\n    gpus: [0, 1]\n",
    );
    std::fs::create_dir_all(home.path().join("profiles")).unwrap();
    std::fs::write(
        home.path().join("profiles/keyed.yaml"),
        format!(
            "model: /models/test\nlauncher: [{SIM}]\nport_base: {}\napi_key_env: TEST_FLEET_KEY\nserver:\n  mamba_strategy: no_buffer\nenv:\n  SGLANG_SIM_STARTUP_SECS: \"1\"\n",
            ports.base,
        ),
    )
    .unwrap();
    let fleet = |args: &[&str]| {
        let out = home
            .fleet()
            .env_remove("FLEET_RUN_DIR")
            .env("TEST_FLEET_KEY", KEY)
            .timeout(Duration::from_secs(120))
            .args(args)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}:\n{stderr}\n{}",
            sshd.log()
        );
        assert!(
            !stdout.contains(KEY) && !stderr.contains(KEY),
            "fleet {args:?} shows the key:\n{stdout}\n{stderr}"
        );
        (stdout, stderr)
    };
    let (up, stderr) = fleet(&["-vv", "up", "--profile", "keyed", "--json"]);
    let up: Value = serde_json::from_str(&up).unwrap();
    assert!(
        up.as_array().unwrap().iter().all(|r| r["state"] == "ready"),
        "{up}"
    );
    assert!(
        stderr.contains("--config"),
        "-vv shows the commands sent:\n{stderr}"
    );

    // The servers run with the key: they refuse a request without it and answer one with it.
    for port in ports.range() {
        assert_eq!(get(port, "/v1/models", None).0, 401);
        assert_eq!(get(port, "/v1/models", Some(KEY)).0, 200);
        // And they leak it as 0.5.23 does, so what follows is checked against a leaky world.
        let (code, info) = get(port, "/server_info", Some(KEY));
        assert_eq!(code, 200);
        let info: Value = serde_json::from_str(&info).unwrap();
        assert_eq!(info["api_key"], KEY);
        assert!(info["launch_command"].as_str().unwrap().contains(KEY));
    }
    assert_eq!(
        argvs_holding(KEY),
        Vec::<String>::new(),
        "the key is in an argv"
    );

    let run_dir = sshd.container_path(200, "/tmp/fleet");
    let mut leaky_log = false;
    for file in files_under(&run_dir) {
        let text = String::from_utf8_lossy(&std::fs::read(&file).unwrap()).into_owned();
        if text.contains(KEY) {
            assert_eq!(
                mode(&file) & 0o077,
                0,
                "{} holds the key and others can read it",
                file.display()
            );
            leaky_log |= file.ends_with("server.log");
        }
        if file.ends_with("instance.json") {
            assert!(
                text.contains("TEST_FLEET_KEY") && !text.contains(KEY),
                "{text}"
            );
        }
    }
    assert!(leaky_log, "the server log shows the key, as SGLang's does");
    let secrets = run_dir.join(format!("{}/secrets.yaml", ports.base));
    assert_eq!(mode(&secrets), 0o600);
    assert_eq!(
        mode(&run_dir.join(format!("{}/server.log", ports.base))),
        0o600
    );

    let (status, _) = fleet(&["-vv", "status", "--json"]);
    let status: Value = serde_json::from_str(&status).unwrap();
    assert!(
        status
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["health"] == 200)
    );
    fleet(&["-vv", "status"]);
    let (log, _) = fleet(&["logs", "ct200:0", "-n", "1000"]);
    assert!(
        log.contains("server_args={") && log.contains("'api_key': '***'"),
        "{log}"
    );

    let (down, _) = fleet(&["down", "--json"]);
    assert!(down.contains("stopped"), "{down}");
    assert!(!secrets.exists(), "down removes the secrets file");
    // The stopped server's log is still read masked.
    let (log, _) = fleet(&["logs", &ports.base.to_string()]);
    assert!(!log.is_empty());
}
