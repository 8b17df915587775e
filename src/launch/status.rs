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
    /// `/health`'s status code; `None` when dead or unreachable.
    pub health: Option<u16>,
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
        match (self.liveness, self.health) {
            (Liveness::Dead, _) => "dead",
            (Liveness::Reused, _) => "gone",
            (Liveness::Running, Some(200)) => "ready",
            (Liveness::Running, Some(_)) => "loading",
            (Liveness::Running, None) => "unreachable",
        }
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
        health: None,
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
            status.health = match client.health().await {
                Ok(Health::Ready) => Some(200),
                Ok(Health::NotReady { status }) => Some(status),
                Err(_) => None,
            };
            if status.health == Some(200) {
                status.load = client.metrics().await.ok();
            }
            tunnel.close().await;
        }
        Err(e) => tracing::warn!("{e}"),
    }
    status
}
