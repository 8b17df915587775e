//! `fleet demo` through the real binary: the whole mission on the simulated local fleet, and
//! its cleanup on Ctrl-C.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::local_fleet::completion_ids;
use serde_json::Value;

/// Ports of the simulated servers the demo's profile names.
fn demo_ports(out: &Path) -> Vec<u16> {
    let profile = std::fs::read_to_string(out.join("profiles/seed-extra-buffer.yaml")).unwrap();
    let base: u16 = profile
        .lines()
        .find_map(|l| l.strip_prefix("port_base: "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    (base..base + 8).collect()
}

/// Two demos at once would race for the same free ports; the tests take turns.
static ONE_DEMO_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn nothing_listens(ports: &[u16]) -> bool {
    ports
        .iter()
        .all(|p| std::net::TcpStream::connect(("127.0.0.1", *p)).is_err())
}

#[test]
fn the_demo_picks_no_buffer_generates_every_prompt_once_and_stops_its_servers() {
    let _turn = ONE_DEMO_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("demo");
    let run = assert_cmd::Command::cargo_bin("fleet")
        .unwrap()
        .args(["--json", "demo", "--out"])
        .arg(&out)
        .timeout(Duration::from_secs(240))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{stderr}");
    let report: Value = serde_json::from_slice(&run.stdout).expect("one JSON document");

    assert_eq!(
        report["sweep"]["winner"], "no_buffer",
        "{:#}",
        report["sweep"]
    );
    let real = report["real_time"].as_array().unwrap();
    assert_eq!(real[0]["label"], "no_buffer");
    assert_eq!(real[0]["cap"], 72);
    assert_eq!(real[1]["label"], "extra_buffer");
    assert_eq!(real[1]["cap"], 37);
    let speedup = real[0]["output_tok_s_per_gpu"].as_f64().unwrap()
        / real[1]["output_tok_s_per_gpu"].as_f64().unwrap();
    assert!(
        speedup > 4.0,
        "no_buffer wins by a wide margin: {speedup:.1}x"
    );

    // The winner as it runs: SGLang 0.5.23 starts no_buffer only with overlap scheduling off.
    let argv = report["plan"][0]["argv"].as_array().unwrap();
    let has = |a: &str| argv.iter().any(|x| x == a);
    assert!(
        has("no_buffer") && has("--disable-overlap-schedule"),
        "{:#}",
        report["plan"]
    );

    assert_eq!(report["generate"]["status"], "done");
    assert_eq!(report["generate"]["completed"], 2000);
    assert_eq!(report["generate"]["failed"], 0);
    assert_eq!(completion_ids(&out.join("completions")).len(), 2000);
    assert!(
        report["saturation"]["ratio"].as_f64().is_some(),
        "{:#}",
        report["saturation"]
    );
    assert!(
        !stderr.contains("WATCHDOG"),
        "the winner runs as fast as the sweep measured it, so the watchdog stays quiet: {stderr}"
    );

    let winner = std::fs::read_to_string(out.join("profiles/winner.yaml")).unwrap();
    assert!(
        winner.contains("extends:") && winner.contains("output_tok_s_per_gpu"),
        "{winner}"
    );
    assert!(
        nothing_listens(&demo_ports(&out)),
        "down stopped every server"
    );
}

#[test]
fn ctrl_c_stops_the_demo_and_its_servers() {
    let _turn = ONE_DEMO_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("demo");
    let mut child = Command::new(env!("CARGO_BIN_EXE_fleet"))
        .args(["-q", "demo", "--out"])
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Interrupt while `fleet up` is starting the servers.
    let deadline = Instant::now() + Duration::from_secs(120);
    // A server is started and recorded (its instance.json): there is something to stop.
    let started = || {
        out.join("run")
            .read_dir()
            .is_ok_and(|mut d| d.any(|e| e.is_ok_and(|e| e.path().join("instance.json").is_file())))
    };
    while !started() {
        assert!(
            Instant::now() < deadline,
            "the demo never started its servers"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // SAFETY: kill(2) on our own child with SIGINT, as a terminal's Ctrl-C would send it.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    let ports = demo_ports(&out);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !nothing_listens(&ports) {
        assert!(
            Instant::now() < deadline,
            "servers left running after Ctrl-C"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
