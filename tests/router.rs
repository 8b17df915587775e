//! The gateway in front of a fleet, through the real binary, real sshd, the fake `pct`, the real
//! `smg` 1.13.0 from PyPI (installed by `scripts/smg-env`) and 8 `sglang-sim` servers: `up`
//! starts it with all 8 as workers, 400 requests through it all succeed and reach every server,
//! a server killed with SIGKILL leaves its worker list within 20 s while `up --watch` runs and
//! 200 more requests all succeed, `status` shows it, `logs router` reads its log, and `down`
//! stops it first.

mod common;

use std::io::{BufRead, Read, Write};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::smg::smg;
use common::world::World;
use serde_json::Value;

/// `GET path` on `addr`: the status code and body.
fn get(addr: &str, path: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("{addr}: {e}"));
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (code, body.to_string())
}

/// The URLs the gateway lists, whatever their status.
fn listed(gateway: &str) -> Vec<String> {
    let (code, body) = get(gateway, "/workers");
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let mut urls: Vec<String> = v["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["url"].as_str().unwrap().to_string())
        .collect();
    urls.sort();
    urls
}

/// Requests the server at `addr` has finished (`sglang:num_requests_total`).
fn served(addr: &str) -> f64 {
    let (code, body) = get(addr, "/metrics");
    assert_eq!(code, 200, "{addr}: {body}");
    body.lines()
        .filter(|l| l.starts_with("sglang:num_requests_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

struct Fleet {
    world: World,
    address: String,
    port_base: u16,
    gateway: String,
    /// `TEST_FLEET_KEY` for every `fleet`, when the profile names it.
    key: Option<&'static str>,
}

impl Fleet {
    /// `gpus` sims behind a `round_robin` gateway; `key`: with `api_key_env`.
    fn new(gpus: u16, key: Option<&'static str>) -> Fleet {
        let world = World::new(1);
        let list: Vec<String> = (0..gpus).map(|g| g.to_string()).collect();
        world.inventory(&format!("[{}]", list.join(", ")));
        let port_base = common::free_port_base(gpus);
        let router_port = loop {
            let p = common::free_port_base(2);
            if !(port_base..port_base + 64).contains(&p) {
                break p;
            }
        };
        let address = world.hosts[0].address.clone();
        let dir = world.home.path().join("profiles");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("sim.yaml"),
            format!(
                "model: /models/test\nlauncher: [{}]\nport_base: {port_base}\nserver:\n  \
                 mamba_strategy: no_buffer\nenv:\n  SGLANG_SIM_STARTUP_SECS: \"1\"\n  \
                 SGLANG_SIM_TIME_SCALE: \"50\"\nrouter:\n  launcher: [{}, launch]\n  \
                 port: {router_port}\n  policy: round_robin\n{}",
                common::local_fleet::SIM,
                smg().display(),
                if key.is_some() {
                    "api_key_env: TEST_FLEET_KEY\n"
                } else {
                    ""
                }
            ),
        )
        .unwrap();
        Fleet {
            gateway: format!("{address}:{router_port}"),
            address,
            port_base,
            world,
            key,
        }
    }

    fn command(&self, args: &[&str]) -> std::process::Command {
        let mut c = self.world.fleet(args);
        if let Some(k) = self.key {
            c.env("TEST_FLEET_KEY", k);
        }
        c
    }

    fn fleet(&self, args: &[&str]) -> (i32, String, String) {
        let o = self.command(args).output().unwrap();
        (
            o.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    }

    fn server(&self, gpu: u16) -> String {
        format!("{}:{}", self.address, self.port_base + gpu)
    }

    fn url(&self, gpu: u16) -> String {
        format!("http://{}", self.server(gpu))
    }

    /// `fleet generate --via-router` over `n` prompts (`tag` keeps ids apart); its progress.
    fn through_gateway(&self, n: usize, tag: &str) -> Value {
        let home = self.world.home.path();
        let prompts = home.join(format!("{tag}.jsonl"));
        let lines: String = (0..n)
            .map(|i| format!("{{\"id\": \"{tag}-{i}\", \"prompt\": \"question {tag} {i}\"}}\n"))
            .collect();
        std::fs::write(&prompts, lines).unwrap();
        let out = home.join(format!("out-{tag}"));
        let (code, stdout, stderr) = self.fleet(&[
            "generate",
            "--via-router",
            "--prompts",
            prompts.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--max-tokens",
            "8",
            "--concurrency",
            "32",
        ]);
        assert_eq!(code, 0, "generate --via-router:\n{stdout}\n{stderr}");
        serde_json::from_str(&std::fs::read_to_string(out.join("progress.json")).unwrap()).unwrap()
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let _ = self.fleet(&["down", "--grace", "5s"]);
    }
}

#[test]
fn the_gateway_fronts_eight_servers_and_drops_a_lost_one_within_20s() {
    let f = Fleet::new(8, None);
    let (code, out, err) = f.fleet(&["up", "--profile", "sim"]);
    assert_eq!(code, 0, "up:\n{out}\n{err}");
    assert!(
        out.contains(&format!("gateway http://{} on ct200 (started", f.gateway))
            && out.contains("8 of 8 workers ready"),
        "{out}"
    );
    let all: Vec<String> = (0..8).map(|g| f.url(g)).collect();
    assert_eq!(listed(&f.gateway), all);
    // Idempotent: a second up keeps the same gateway.
    let (code, out, err) = f.fleet(&["up", "--profile", "sim"]);
    assert_eq!(code, 0, "second up:\n{out}\n{err}");
    assert!(out.contains("(already running"), "{out}");

    let before: Vec<f64> = (0..8).map(|g| served(&f.server(g))).collect();
    let p = f.through_gateway(400, "a");
    assert_eq!(
        (p["completed"].as_u64(), p["failed"].as_u64()),
        (Some(400), Some(0)),
        "{p}"
    );
    let per: Vec<f64> = (0..8)
        .map(|g| served(&f.server(g)) - before[g as usize])
        .collect();
    assert_eq!(per.iter().sum::<f64>(), 400.0, "{per:?}");
    assert!(
        per.iter().all(|&n| n > 0.0),
        "every server gets some: {per:?}"
    );

    // The watch that keeps the gateway's list true at run time.
    let mut watch = f
        .command(&["up", "--profile", "sim", "--watch"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Killed before the watch's own `up` is over, the server would be started again.
    let mut stderr = std::io::BufReader::new(watch.stderr.take().unwrap());
    let mut log = String::new();
    while !log.contains("keeping the gateway's workers in step") {
        let mut line = String::new();
        let n = stderr.read_line(&mut line).unwrap();
        assert!(n > 0, "the watch ended early: {log}");
        log.push_str(&line);
    }
    let (_, status, _) = f.fleet(&["status", "--json"]);
    let rows: Value = serde_json::from_str(&status).unwrap();
    let victim = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["gpu"] == 3)
        .and_then(|r| r["pid"].as_u64())
        .unwrap_or_else(|| panic!("{rows}"));
    let killed = Instant::now();
    let ok = std::process::Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    let gone = f.url(3);
    while listed(&f.gateway).contains(&gone) {
        assert!(
            killed.elapsed() < Duration::from_secs(20),
            "gpu3's worker still listed 20 s after kill -9: {:?}",
            listed(&f.gateway)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let left: Vec<String> = all.iter().filter(|u| **u != gone).cloned().collect();
    assert_eq!(listed(&f.gateway), left);
    let p = f.through_gateway(200, "b");
    assert_eq!(
        (p["completed"].as_u64(), p["failed"].as_u64()),
        (Some(200), Some(0)),
        "{p}"
    );

    let interrupted = std::process::Command::new("kill")
        .args(["-INT", &watch.id().to_string()])
        .status()
        .unwrap();
    assert!(interrupted.success());
    stderr.read_to_string(&mut log).unwrap();
    let ended = watch.wait().unwrap();
    assert_eq!(ended.code(), Some(130), "{log}");
    assert!(log.contains(&format!("removed worker {gone}")), "{log}");

    let (_, status, _) = f.fleet(&["status"]);
    assert!(
        status.contains(&format!("gateway http://{} on ct200", f.gateway))
            && status.contains("policy round_robin")
            && status.contains("7 workers:")
            && !status.contains(&format!("{gone}  ")),
        "{status}"
    );
    let (code, log, err) = f.fleet(&["logs", "router", "-n", "400"]);
    assert_eq!(code, 0, "{err}");
    assert!(log.contains("/workers"), "{log}");

    let (code, _, err) = f.fleet(&["down", "--grace", "5s"]);
    assert!(
        err.contains(&format!("gateway http://{} on ct200: stopped", f.gateway)),
        "code {code}: {err}"
    );
    assert!(
        std::net::TcpStream::connect(&f.gateway).is_err(),
        "still listening"
    );
    let (_, status, err) = f.fleet(&["status"]);
    assert!(
        !status.contains("gateway") && !err.contains("gateway"),
        "{status}{err}"
    );
}

/// Every process's argv on this machine that holds `needle` (the containers run here too).
fn argvs_holding(needle: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let argv = std::fs::read(e.path().join("cmdline")).ok()?;
            let argv = String::from_utf8_lossy(&argv).replace('\0', " ");
            argv.contains(needle).then_some(argv)
        })
        .collect()
}

/// `GET path` on `addr` with a bearer token: the status code.
fn get_with(addr: &str, path: &str, key: &str) -> u16 {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[test]
fn the_gateway_holds_the_key_as_the_servers_do() {
    use std::os::unix::fs::PermissionsExt;
    const KEY: &str = "sk-gateway-test-7e1d";
    let f = Fleet::new(2, Some(KEY));
    let (code, plan, err) = f.fleet(&["up", "--profile", "sim", "--dry-run"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        plan.contains(&format!("gateway on ct200 at http://{}: ", f.gateway))
            && plan.contains(&format!("--worker-urls {} {}", f.url(0), f.url(1)))
            && !plan.contains(KEY)
            && !plan.contains("--api-key"),
        "{plan}"
    );
    let (code, out, err) = f.fleet(&["-vv", "up", "--profile", "sim"]);
    assert_eq!(code, 0, "up:\n{out}\n{err}");
    assert!(out.contains("2 of 2 workers ready"), "{out}");
    assert!(!out.contains(KEY) && !err.contains(KEY), "up shows the key");
    assert_eq!(
        argvs_holding(KEY),
        Vec::<String>::new(),
        "the key is in an argv"
    );

    let dir = f.world.container_path(0, "/tmp/fleet/router");
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join("key")), 0o600);
    assert_eq!(std::fs::read_to_string(dir.join("key")).unwrap(), KEY);
    let record = std::fs::read_to_string(dir.join("router.json")).unwrap();
    assert!(!record.contains(KEY), "{record}");
    let log = std::fs::read_to_string(dir.join("router.log")).unwrap();
    assert!(!log.contains(KEY), "the gateway logs the key");
    let pid = serde_json::from_str::<Value>(&record).unwrap()["pid"]
        .as_u64()
        .unwrap();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    assert!(
        !String::from_utf8_lossy(&environ).contains(KEY),
        "the key is in its environment"
    );

    // It holds the key: it asks clients for it, and reaches the servers, which want it too.
    // (`/v1/models` it answers to anyone; generation and its worker API only with the key.)
    assert_eq!(get_with(&f.gateway, "/workers", "wrong"), 401);
    assert_eq!(get_with(&f.gateway, "/workers", KEY), 200);
    let p = f.through_gateway(20, "k");
    assert_eq!(
        (p["completed"].as_u64(), p["failed"].as_u64()),
        (Some(20), Some(0)),
        "{p}"
    );
    let (_, status, err) = f.fleet(&["status"]);
    assert!(
        status.contains("2 workers:") && !status.contains(KEY),
        "{status}{err}"
    );
}
