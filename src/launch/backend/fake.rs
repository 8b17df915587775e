//! A backend in memory, for the seam's unit tests: its servers are rows that `start` adds and
//! `stop` removes, what becomes of each is what the test says, and a server that runs answers
//! `/health` and `/server_info` from a small HTTP server of the test's own on 127.0.0.1. Its
//! shell is this machine, for what launch keeps there (the `up` lock).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use axum::Json;
use axum::routing::get;

use super::{Backend, Home, Seen, StopState, Stopped};
use crate::gpu::{GpuError, GpuProcess, GpuReading};
use crate::launch::owner::Owner;
use crate::launch::plan::{HostFacts, Instance, RunFiles, Topology};
use crate::launch::preflight::{FactsError, Learn};
use crate::launch::state::{Handle, InstanceRecord, Liveness, StateError};
use crate::remote::{LocalTransport, RemoteError, Tunnel};
use crate::server::ServerId;

/// A record of `host`'s `gpu` on `port` with the config `fingerprint`, started by profile `p`.
pub(crate) fn record(host: &str, gpu: u32, port: u16, fingerprint: &str) -> InstanceRecord {
    let files = RunFiles::new("/tmp/fleet", port);
    InstanceRecord {
        id: ServerId::gpu(host, gpu),
        port,
        profile: "p".into(),
        fingerprint: fingerprint.into(),
        argv: vec!["sglang-sim".into()],
        address: "127.0.0.1".into(),
        handle: Handle::Process {
            pid: u32::from(port),
            start_ticks: 1,
        },
        started_at: 0,
        api_key_env: None,
        dir: files.dir,
        log: files.log,
        pidfile: files.pidfile,
        record: files.record,
        group: None,
        ranks: Vec::new(),
        owner: Some(test_owner()),
    }
}

/// The owner of what the tests' fleet (`fleet: test`) starts.
pub(crate) fn test_owner() -> Owner {
    Owner {
        fleet: "test".into(),
        by: "tester@box".into(),
        inventory: "/w/fleet.yaml".into(),
    }
}

/// A planned server of `host`'s `gpu` on `port`, profile `p`.
pub(crate) fn planned(host: &str, gpu: u32, port: u16, fingerprint: &str) -> Instance {
    Instance {
        id: ServerId::gpu(host, gpu),
        group: crate::layout::Group {
            gpus: vec![gpu],
            slowest: None,
        },
        port,
        argv: vec!["sglang-sim".into()],
        launcher_len: 1,
        env: Default::default(),
        address: "127.0.0.1".into(),
        files: RunFiles::new("/tmp/fleet", port),
        fingerprint: fingerprint.into(),
        profile: "p".into(),
        api_key_env: None,
        secrets: None,
        ranks: Vec::new(),
    }
}

/// What the fake holds and was asked, for the test to set and look at.
#[derive(Debug, Default)]
pub(crate) struct Table {
    pub seen: Vec<Seen>,
    /// Ports some other process listens on.
    pub foreign: BTreeSet<u16>,
    /// Ports whose start fails.
    pub refuse: BTreeSet<u16>,
    /// Ports whose server exits at once.
    pub dies: BTreeSet<u16>,
    /// Ports whose server does not stop.
    pub stuck: BTreeSet<u16>,
    /// Memory in use per GPU.
    pub gpu_used_mib: BTreeMap<u32, u64>,
    /// What nvidia-smi would list as using each GPU.
    pub processes: Vec<GpuProcess>,
    /// `start :PORT` and `stop :PORT`, in order.
    pub calls: Vec<String>,
}

#[derive(Debug)]
pub(crate) struct FakeBackend {
    home: Home,
    /// Where a running server answers.
    ready: SocketAddr,
    table: Mutex<Table>,
}

impl FakeBackend {
    /// `run_root` is a directory on this machine; running servers answer at `ready`.
    pub fn new(host: &str, run_root: &str, ready: SocketAddr) -> FakeBackend {
        FakeBackend {
            home: Home {
                host: host.to_string(),
                shell: Arc::new(LocalTransport::new(host)),
                run_root: run_root.to_string(),
            },
            ready,
            table: Mutex::default(),
        }
    }

    pub fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().expect("not poisoned")
    }

    /// Records a server found running.
    pub fn running(&self, record: InstanceRecord) {
        self.table().seen.push(Seen {
            record,
            liveness: Liveness::Running,
            lingering: false,
        });
    }

    fn err(&self, what: &str) -> StateError {
        StateError::Command {
            host: self.home.host.clone(),
            command: what.to_string(),
            stderr: "refused by the test".into(),
        }
    }
}

/// An HTTP server that answers as a ready SGLang server with a cap of `cap`. Ends when the
/// test's runtime does.
pub(crate) async fn ready_server(cap: u64) -> SocketAddr {
    let info = serde_json::json!({
        "version": "0.5.23", "max_total_num_tokens": 400_000, "context_length": 8192,
        "mamba_radix_cache_strategy": "no_buffer",
        "internal_states": [{"effective_max_running_requests_per_dp": cap}],
    });
    let app = axum::Router::new()
        .route("/health", get(|| async { "" }))
        .route("/server_info", get(move || async move { Json(info) }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// A port on 127.0.0.1 that nothing listens on.
pub(crate) fn closed_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

#[async_trait]
impl Backend for FakeBackend {
    fn home(&self) -> &Home {
        &self.home
    }

    async fn facts(&self, _learn: &Learn<'_>) -> Result<HostFacts, FactsError> {
        Ok(HostFacts {
            help: None,
            version: Some("0.5.23".into()),
            address: "127.0.0.1".into(),
            gpus_present: vec![0, 1],
            places: Vec::new(),
            topology: Topology::NotRead,
        })
    }

    async fn survey(&self) -> Result<Vec<Seen>, StateError> {
        let mut seen = self.table().seen.clone();
        seen.sort_by_key(|s| (s.record.id.gpu_index(), s.record.port));
        Ok(seen)
    }

    async fn ports_in_use(&self) -> Result<BTreeSet<u16>, StateError> {
        let t = self.table();
        let ours = t
            .seen
            .iter()
            .filter(|s| s.holds_gpu())
            .map(|s| s.record.port);
        Ok(t.foreign.iter().copied().chain(ours).collect())
    }

    async fn start(&self, planned: &Instance, owner: &Owner) -> Result<InstanceRecord, StateError> {
        let mut t = self.table();
        t.calls.push(format!("start :{}", planned.port));
        if t.refuse.contains(&planned.port) {
            drop(t);
            return Err(self.err("start"));
        }
        let mut r = record(
            &self.home.host,
            planned.id.gpu_index().unwrap_or(0),
            planned.port,
            &planned.fingerprint,
        );
        r.profile = planned.profile.clone();
        r.owner = Some(owner.clone());
        let liveness = match t.dies.contains(&planned.port) {
            true => Liveness::Dead,
            false => Liveness::Running,
        };
        t.seen.retain(|s| s.record.port != planned.port);
        t.seen.push(Seen {
            record: r.clone(),
            liveness,
            lingering: false,
        });
        Ok(r)
    }

    async fn alive(&self, record: &InstanceRecord) -> Result<bool, StateError> {
        let t = self.table();
        Ok(t.seen
            .iter()
            .any(|s| s.record == *record && s.liveness == Liveness::Running))
    }

    async fn stop(&self, record: &InstanceRecord, _grace: Duration) -> Result<Stopped, StateError> {
        let mut t = self.table();
        t.calls.push(format!("stop :{}", record.port));
        if t.stuck.contains(&record.port) {
            drop(t);
            return Err(self.err("stop"));
        }
        let Some(i) = t.seen.iter().position(|s| s.record.port == record.port) else {
            return Ok(Stopped {
                state: StopState::AlreadyDead,
                port_closed: true,
            });
        };
        let gone = t.seen.remove(i);
        let state = match gone.holds_gpu() {
            true => StopState::Stopped,
            false => StopState::AlreadyDead,
        };
        Ok(Stopped {
            state,
            port_closed: !t.foreign.contains(&record.port),
        })
    }

    async fn log_tail(&self, log: &str, _lines: usize) -> Result<String, StateError> {
        Ok(format!("the end of {log}\n"))
    }

    async fn endpoint(&self, _address: &str, port: u16) -> Result<Tunnel, RemoteError> {
        let running = self
            .table()
            .seen
            .iter()
            .any(|s| s.record.port == port && s.liveness == Liveness::Running);
        Ok(Tunnel::direct(if running {
            self.ready
        } else {
            closed_port()
        }))
    }

    async fn gpu_processes(&self) -> Result<Vec<GpuProcess>, GpuError> {
        Ok(self.table().processes.clone())
    }

    async fn gpus(&self) -> Result<Vec<GpuReading>, GpuError> {
        let t = self.table();
        Ok(t.gpu_used_mib
            .iter()
            .map(|(index, used)| GpuReading {
                index: *index,
                uuid: format!("GPU-{index}"),
                name: "fake".into(),
                memory_total_mib: 98_000,
                memory_used_mib: *used,
                memory_free_mib: 98_000 - used,
                utilization_pct: None,
                temperature_c: None,
                power_w: None,
            })
            .collect())
    }
}
