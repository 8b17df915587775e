//! The `sglang-sim` binary under test: started on a reserved loopback port with a fast load,
//! its HTTP client, and the helpers its tests share (`tests/sim.rs`, `tests/sim_serving.rs`).

#![allow(dead_code)] // each test crate uses a different part of it

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_sglang-sim");

pub struct Sim {
    pub child: Child,
    pub port: u16,
    pub _port: crate::common::Ports,
    pub dir: tempfile::TempDir,
    pub http: reqwest::Client,
}

impl Sim {
    /// Starts the sim with a fast default load (0.2 s); `args` come last so they win.
    pub fn spawn(args: &[&str], env: &[(&str, &str)]) -> Sim {
        let dir = tempfile::tempdir().unwrap();
        let reserved = crate::common::reserve_ports(1);
        let port = reserved.base;
        let log = std::fs::File::create(dir.path().join("log")).unwrap();
        let mut cmd = Command::new(BIN);
        cmd.args(["--model-path", "/models/test", "--port", &port.to_string()])
            .args(["--sim-startup-secs", "0.2"])
            .arg("--sim-gpu-state-dir")
            .arg(dir.path().join("gpus"))
            .args(args)
            .env_remove("CUDA_VISIBLE_DEVICES")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log));
        for (k, v) in env {
            cmd.env(k, v);
        }
        Sim {
            child: cmd.spawn().unwrap(),
            port,
            _port: reserved,
            dir,
            http: fleet::sglang::client::http_client(Default::default()).unwrap(),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    pub fn state_files(&self) -> Vec<PathBuf> {
        match std::fs::read_dir(self.dir.path().join("gpus")) {
            Ok(rd) => rd
                .map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|x| x == "json"))
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    pub async fn health(&self) -> Option<u16> {
        self.http
            .get(self.url("/health"))
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .ok()
            .map(|r| r.status().as_u16())
    }

    /// Polls /health until 200; returns every status seen (None: no answer).
    pub async fn wait_ready(&mut self, limit: Duration) -> Vec<Option<u16>> {
        let start = Instant::now();
        let mut seen = Vec::new();
        loop {
            let h = self.health().await;
            if seen.last() != Some(&h) {
                seen.push(h);
            }
            if h == Some(200) {
                return seen;
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("sim exited ({status}) before ready:\n{}", self.log());
            }
            assert!(
                start.elapsed() < limit,
                "not ready after {limit:?}:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Some(s) = self.child.try_wait().unwrap() {
                return Some(s);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    pub fn signal(&self, sig: i32) {
        let pid = i32::try_from(self.child.id()).unwrap();
        // SAFETY: kill(2) on the child this test spawned and still owns.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
    }

    pub async fn get_json(&self, path: &str) -> Value {
        let r = self.http.get(self.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "GET {path}");
        r.json().await.unwrap()
    }

    /// `/metrics` as it reads now.
    pub async fn metrics(&self) -> String {
        let r = self.http.get(self.url("/metrics")).send().await.unwrap();
        r.text().await.unwrap()
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, String) {
        let r = self
            .http
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn run(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `data:` payloads of an SSE body, checking the framing of every event.
pub fn sse_events(body: &str) -> Vec<String> {
    assert!(
        body.ends_with("\n\n"),
        "SSE body must end with a blank line"
    );
    body.trim_end_matches("\n\n")
        .split("\n\n")
        .map(|e| {
            e.strip_prefix("data: ")
                .unwrap_or_else(|| panic!("event without data: prefix: {e:?}"))
                .to_string()
        })
        .collect()
}
