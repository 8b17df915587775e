//! What is up on a host: each recorded instance's liveness (pid and start time still ours),
//! `/health`, and load from `/metrics`.

use serde::Serialize;

use crate::gpu::GpuReading;
use crate::launch::state::{self, InstanceRecord, Liveness, StateError};
use crate::launch::up::LOG_TAIL_LINES;
use crate::remote::Transport;
use crate::sglang::client::{Health, SglangClient};
use crate::sglang::metrics::Metrics;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InstanceStatus {
    pub host: String,
    pub gpu: u32,
    pub port: u16,
    pub pid: u32,
    pub profile: String,
    pub liveness: Liveness,
    /// `ready`, `loading` (starting, or its port not open yet), `unreachable`, `dead` or `gone`.
    pub state: &'static str,
    /// `/health`'s status code; `None` when dead or unreachable.
    pub health: Option<u16>,
    /// The process runs but nothing answers on its port yet: SGLang opens it only after the
    /// model has loaded.
    pub port_closed: bool,
    /// The mamba strategy the server resolved, from `/server_info`.
    pub mamba_strategy: Option<String>,
    /// `None` when dead, unreachable or started without `--enable-metrics`.
    pub load: Option<Metrics>,
    /// Seconds since `up` started it.
    pub uptime: u64,
    /// The log's last lines, for a dead instance when asked for.
    pub log_tail: Option<String>,
    /// The instance's GPU, when the host's GPUs could be read.
    pub gpu_reading: Option<GpuReading>,
}

/// Gives each instance the reading of its GPU.
pub fn attach_gpus(statuses: &mut [InstanceStatus], host: &str, readings: &[GpuReading]) {
    for s in statuses.iter_mut().filter(|s| s.host == host) {
        s.gpu_reading = readings.iter().find(|g| g.index == s.gpu).cloned();
    }
}

impl InstanceStatus {
    /// `ready`, `loading`, `unreachable`, `dead` or `gone` (pid reused).
    pub fn state(&self) -> &'static str {
        self.state
    }
}

/// What `liveness` and the port's answer add up to.
fn state_of(liveness: Liveness, health: Option<u16>, port_closed: bool) -> &'static str {
    match (liveness, health) {
        (Liveness::Dead, _) => "dead",
        (Liveness::Reused, _) => "gone",
        (Liveness::Running, Some(200)) => "ready",
        (Liveness::Running, Some(_)) => "loading",
        (Liveness::Running, None) if port_closed => "loading",
        (Liveness::Running, None) => "unreachable",
    }
}

/// The status of every instance recorded on one host; `dead_log_tails` also reads the log of
/// each dead one.
pub async fn host_status(
    t: &dyn Transport,
    run_root: &str,
    http: &reqwest::Client,
    dead_log_tails: bool,
    now_unix: u64,
) -> Result<Vec<InstanceStatus>, StateError> {
    let records = state::read_records(t, run_root).await?;
    let table = state::proc_table(t).await?;
    let looks = records.iter().map(|r| {
        let liveness = table.liveness(r.pid, r.start_ticks);
        instance_status(t, r, liveness, http, dead_log_tails, now_unix)
    });
    Ok(futures::future::join_all(looks).await)
}

async fn instance_status(
    t: &dyn Transport,
    r: &InstanceRecord,
    liveness: Liveness,
    http: &reqwest::Client,
    dead_log_tails: bool,
    now_unix: u64,
) -> InstanceStatus {
    let mut status = InstanceStatus {
        host: r.host.clone(),
        gpu: r.gpu,
        port: r.port,
        pid: r.pid,
        profile: r.profile.clone(),
        liveness,
        state: state_of(liveness, None, false),
        health: None,
        port_closed: false,
        mamba_strategy: None,
        load: None,
        uptime: now_unix.saturating_sub(r.started_at),
        log_tail: None,
        gpu_reading: None,
    };
    if liveness != Liveness::Running {
        if dead_log_tails {
            status.log_tail = state::tail(t, &r.log, LOG_TAIL_LINES).await.ok();
        }
        return status;
    }
    match t.forward(&r.address, r.port).await {
        Ok(tunnel) => {
            let client = SglangClient::new(http.clone(), r.endpoint(tunnel.local_addr()));
            // Load first: SGLang's /health runs a 1-token generation of its own, which the
            // running count would include.
            let (info, load) = tokio::join!(client.server_info(), client.metrics());
            match client.health().await {
                Ok(Health::Ready) => status.health = Some(200),
                Ok(Health::NotReady { status: code }) => status.health = Some(code),
                Err(e) => status.port_closed = e.is_unreachable(),
            }
            if status.health == Some(200) {
                status.load = load.ok();
                status.mamba_strategy = info.ok().and_then(|i| i.mamba_strategy);
            }
            status.state = state_of(liveness, status.health, status.port_closed);
            tunnel.close().await;
        }
        Err(e) => tracing::warn!("{e}"),
    }
    status
}
