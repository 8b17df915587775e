//! The launch tests' fleet: a local fleet of 8 fake GPUs on ports reserved for the test, its
//! profiles, `--json` runs, and readings of the servers' processes and ports.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common;
use crate::common::local_fleet::LocalFleet;

/// A local fleet of 8 GPUs whose profiles start at a port base reserved for the test.
pub struct Fleet {
    local: LocalFleet,
    pub port_base: u16,
    _ports: common::Ports,
}

impl std::ops::Deref for Fleet {
    type Target = LocalFleet;

    fn deref(&self) -> &LocalFleet {
        &self.local
    }
}

impl Fleet {
    pub fn new() -> Fleet {
        let ports = common::reserve_ports(8);
        Fleet {
            local: LocalFleet::new(8),
            port_base: ports.base,
            _ports: ports,
        }
    }

    /// The port of GPU `gpu`.
    pub fn port(&self, gpu: u16) -> u16 {
        self.port_base + gpu
    }

    /// Writes `profiles/NAME.yaml`: a sim profile whose `server:` and `env:` get `server` and
    /// `env` (YAML lines, indented by the caller's two spaces).
    pub fn profile(&self, name: &str, server: &str, env: &str) {
        // A 1 s simulated load unless the test sets its own.
        let startup = if env.contains("SGLANG_SIM_STARTUP_SECS") {
            ""
        } else {
            "  SGLANG_SIM_STARTUP_SECS: \"1\"\n"
        };
        let yaml = format!(
            "model: /models/test\n\
             launcher: [sglang-sim]\n\
             port_base: {}\n\
             server:\n  mem_fraction_static: 0.85\n{server}\
             env:\n{startup}  SGLANG_SIM_GPU_STATE_DIR: \"{}\"\n{env}\
             health: {{startup_timeout: 60s, poll: 1s}}\n",
            self.port_base,
            self.gpu_state().display()
        );
        self.write_profile(name, &yaml);
    }

    /// Runs fleet with `args` plus `--json` and returns (exit code, stdout JSON, stderr).
    pub fn json(&self, args: &[&str]) -> (i32, Value, String) {
        let out = self.fleet().args(args).arg("--json").output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
            panic!("fleet {args:?}: stdout is not JSON ({e}):\n{stdout}\nstderr:\n{stderr}")
        });
        (out.status.code().unwrap_or(-1), value, stderr)
    }
}

pub fn rows(v: &Value) -> &Vec<Value> {
    v.as_array().expect("a JSON array")
}

pub fn field<'a>(rows: &'a [Value], key: &str) -> Vec<&'a Value> {
    rows.iter().map(|r| &r[key]).collect()
}

pub fn listening(port: u16) -> bool {
    TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200)).is_ok()
}

pub fn alive(pid: u64) -> bool {
    // A zombie (exited, never reaped by this sandbox's init) is not alive.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

pub fn pids(rows: &[Value]) -> Vec<u64> {
    rows.iter()
        .map(|r| r["pid"].as_u64().expect("pid"))
        .collect()
}

/// Waits until `pid` has died: kill(1) returns once the signal is sent, not once it has acted.
pub fn wait_dead(pid: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid) {
        assert!(Instant::now() < deadline, "pid {pid} did not die");
        std::thread::sleep(Duration::from_millis(10));
    }
}
