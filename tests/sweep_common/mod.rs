//! What the `fleet sweep` tests share: a local simulated fleet with a base profile of
//! `sglang-sim` servers, the binary run against it, and readers of its report, `sweep.json`
//! and what it left running. Use it with `mod common; mod sweep_common;`.
#![allow(dead_code)] // each test crate uses a different part of it

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::common::local_fleet::{LocalFleet, SIM};
use crate::common::{Ports, reserve_ports};
use serde_json::Value;

/// Sweeps measure throughput: one at a time, so that they do not share the CPUs they measure.
static SERIAL: Mutex<()> = Mutex::new(());

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A local simulated fleet: an inventory of `gpus` GPUs, a profiles dir, a run dir.
pub struct Fleet {
    pub local: LocalFleet,
    pub gpus: u32,
    /// The base profile's `port_base`: GPU i serves on `port_base + i`.
    pub port_base: u16,
    _ports: Ports,
}

impl Fleet {
    /// `server` and `env` are YAML lines added under the profile's `server:` and `env:`.
    pub fn new(gpus: u32, server: &[&str], env: &[(&str, &str)]) -> Fleet {
        let ports = reserve_ports(gpus as u16);
        let fleet = Fleet {
            local: LocalFleet::new(gpus),
            gpus,
            port_base: ports.base,
            _ports: ports,
        };
        fleet
            .local
            .write_profile("base", &fleet.profile_yaml(server, env, fleet.port_base));
        fleet
    }

    /// The sim's own `ideal_output_tok_s` for the base profile with `settings` (`server.KEY` or
    /// `env.KEY`, as `--set` takes them): started alone on GPU 0, asked, stopped.
    pub fn ideal(&self, settings: &[(&str, &str)]) -> f64 {
        let mut yaml = String::from("extends: base\n");
        for section in ["server", "env"] {
            let mine: Vec<_> = settings
                .iter()
                .filter_map(|(k, v)| Some((k.strip_prefix(&format!("{section}."))?, v)))
                .collect();
            if !mine.is_empty() {
                yaml.push_str(&format!("{section}:\n"));
                for (k, v) in mine {
                    // env values are strings; server values are typed as written.
                    match section {
                        "env" => yaml.push_str(&format!("  {k}: \"{v}\"\n")),
                        _ => yaml.push_str(&format!("  {k}: {v}\n")),
                    }
                }
            }
        }
        self.local.write_profile("ideal", &yaml);
        let (code, _, err) = self.fleet(&["up", "--profile", "ideal", "--gpus", "0"]);
        assert_eq!(code, 0, "{err}");
        let info = http_get(self.port_base, "/server_info");
        let (code, _, err) = self.fleet(&["down", "--grace", "2s"]);
        assert_eq!(code, 0, "{err}");
        let info: Value = serde_json::from_str(&info).unwrap_or_else(|e| panic!("{e}: {info}"));
        info["sim"]["ideal_output_tok_s"]
            .as_f64()
            .unwrap_or_else(|| panic!("no sim.ideal_output_tok_s in {info:#}"))
    }

    pub fn path(&self) -> &Path {
        self.local.path()
    }

    pub fn profile_yaml(&self, server: &[&str], env: &[(&str, &str)], port_base: u16) -> String {
        let mut yaml = format!(
            "model: /models/sim-27b\nserved_model_name: sim\nlauncher: [{SIM}]\nport_base: {port_base}\nserver:\n  context_length: 8192\n"
        );
        for s in server {
            yaml.push_str(&format!("  {s}\n"));
        }
        yaml.push_str("env:\n");
        let gpus = self.local.gpu_state();
        let mut all = vec![
            ("SGLANG_SIM_TIME_SCALE", "1"),
            ("SGLANG_SIM_STARTUP_SECS", "0.5"),
            ("SGLANG_SIM_MEAN_OUTPUT_TOKENS", "40"),
        ];
        all.extend_from_slice(env);
        for (k, v) in all {
            yaml.push_str(&format!("  {k}: \"{v}\"\n"));
        }
        yaml.push_str(&format!(
            "  SGLANG_SIM_GPU_STATE_DIR: {}\nhealth: {{startup_timeout: 60s, poll: 200ms}}\n",
            gpus.display()
        ));
        yaml
    }

    pub fn prompts(&self, n: usize) -> PathBuf {
        let path = self.path().join("prompts.jsonl");
        let lines: Vec<String> = (0..n)
            .map(|i| {
                serde_json::json!({"id": i, "prompt": format!("question {i}: {}", "word ".repeat(20 + i % 50))})
                    .to_string()
            })
            .collect();
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        path
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = self.local.command();
        cmd.args(["--config", "fleet.yaml", "--profiles-dir", "profiles"])
            .args(args);
        cmd
    }

    /// Runs fleet; returns exit code, stdout, stderr.
    pub fn fleet(&self, args: &[&str]) -> (i32, String, String) {
        let out = self.command(args).output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    pub fn sweep_json(&self, args: &[&str]) -> (i32, Value, String) {
        let mut all = vec!["--json", "sweep", "--profile", "base"];
        all.extend_from_slice(args);
        let (code, out, err) = self.fleet(&all);
        let v = serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {out}\nstderr:\n{err}"));
        (code, v, err)
    }

    /// The instance records left on the (local) target: what still runs.
    pub fn records(&self) -> Vec<Value> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(self.local.run_dir())
            .into_iter()
            .flatten()
            .flatten()
        {
            if let Ok(text) = std::fs::read_to_string(e.path().join("instance.json")) {
                out.push(serde_json::from_str(&text).unwrap());
            }
        }
        out
    }

    /// Fake GPU state files of live sims.
    pub fn busy_gpus(&self) -> usize {
        std::fs::read_dir(self.local.gpu_state()).map_or(0, |d| d.count())
    }

    pub fn file(&self) -> Value {
        serde_json::from_str(&std::fs::read_to_string(self.path().join("sweep.json")).unwrap())
            .unwrap()
    }

    /// Starts fleet with `args` in the background, its stderr read line by line as it comes.
    pub fn spawn(&self, args: &[&str]) -> Background {
        let mut child = self
            .command(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Background {
            child,
            lines,
            reader,
            seen: String::new(),
        }
    }

    /// Waits until a running sweep has written `n` trials to sweep.json (within 60 s).
    pub fn wait_trials(&self, n: usize) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let done = std::fs::read_to_string(self.path().join("sweep.json"))
                .ok()
                .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                .map_or(0, |v| v["trials"].as_array().map_or(0, Vec::len));
            if done >= n {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{n} trial(s) did not finish in time"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

/// A fleet command running in the background.
pub struct Background {
    child: Child,
    lines: mpsc::Receiver<String>,
    reader: std::thread::JoinHandle<()>,
    /// Its stderr so far.
    seen: String,
}

impl Background {
    /// Waits (within 120 s) for a line of stderr that contains `text`.
    pub fn wait_for_line(&mut self, text: &str) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            match self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(line) => {
                    let found = line.contains(text);
                    self.seen.push_str(&line);
                    self.seen.push('\n');
                    if found {
                        return;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!("no line with {text:?} in 120 s:\n{}", self.seen)
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("it ended without a line with {text:?}:\n{}", self.seen)
                }
            }
        }
    }

    /// Sends SIGINT and waits for the end: the exit code and the whole of stderr.
    pub fn interrupt(mut self) -> (Option<i32>, String) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let status = self.child.wait().unwrap();
        self.reader.join().unwrap();
        for line in self.lines.try_iter() {
            self.seen.push_str(&line);
            self.seen.push('\n');
        }
        (status.code(), self.seen)
    }
}

/// GET over plain HTTP/1.0 from a server on loopback, returning the body.
pub fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to the sim");
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

/// The trial most tests run: small requests, 1 s of warm-up, 2 s measured.
pub const SHORT_TRIALS: &[&str] = &[
    "--input-len",
    "32",
    "--output-len",
    "24",
    "--warmup",
    "1s",
    "--duration",
    "2s",
];

/// `args` with [`SHORT_TRIALS`].
pub fn short<'a>(args: &[&'a str]) -> Vec<&'a str> {
    [args, SHORT_TRIALS].concat()
}

pub fn row<'a>(report: &'a Value, label: &str) -> &'a Value {
    report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["label"] == label)
        .unwrap_or_else(|| panic!("no row {label}: {report:#}"))
}

pub fn tok_per_gpu(row: &Value) -> f64 {
    row["trial"]["outcome"]["output_tok_s_per_gpu"]
        .as_f64()
        .unwrap()
}
