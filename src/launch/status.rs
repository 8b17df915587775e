//! What is up on a host: each recorded instance's liveness (as its backend sees it), `/health`,
//! and load from `/metrics`.

use serde::Serialize;

use crate::gpu::GpuReading;
use crate::launch::backend::{Backend, Seen};
use crate::launch::owner::{Owner, is_of};
use crate::launch::state::{Liveness, StateError};
use crate::launch::up::LOG_TAIL_LINES;
use crate::server::{ServerId, host_gpu};
use crate::sglang::client::{Health, SglangClient};
use crate::sglang::metrics::Metrics;

/// A recorded server as `status` finds it: the stage it observes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InstanceStatus {
    #[serde(flatten, with = "host_gpu")]
    pub id: ServerId,
    /// Its GPUs and their slowest link, when it spans several.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<crate::layout::Group>,
    pub port: u16,
    pub pid: Option<u32>,
    /// On a Slurm host, the server's job step, its node, and the GPU Slurm gave it.
    #[serde(flatten)]
    pub slurm: Option<SlurmStep>,
    pub profile: String,
    /// Who started it; `None` for a server from before owners were recorded.
    pub owner: Option<Owner>,
    /// Whether it is this fleet's: `down` stops it, `generate` uses it.
    pub mine: bool,
    pub liveness: Liveness,
    /// `ready`, `loading` (starting, or its port not open yet), `unreachable`, `failing` (the
    /// launcher is gone but its workers still run: SGLang tearing itself down), `dead` or
    /// `gone`.
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

/// Where Slurm runs a server: `job`, `step`, `node` and `slurm_gpus` in `status --json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SlurmStep {
    pub job: crate::slurm::JobId,
    pub step: u32,
    pub node: String,
    /// The step's `CUDA_VISIBLE_DEVICES`, as Slurm set it.
    pub slurm_gpus: String,
}

impl SlurmStep {
    fn of(handle: &crate::launch::state::Handle) -> Option<SlurmStep> {
        match handle {
            crate::launch::state::Handle::Step {
                job,
                step,
                node,
                gpus,
            } => Some(SlurmStep {
                job: *job,
                step: *step,
                node: node.clone(),
                slurm_gpus: gpus.clone(),
            }),
            crate::launch::state::Handle::Process { .. } => None,
        }
    }
}

/// Gives each instance of `host` the reading of its GPU; a server over several GPUs gets
/// their sum (memory) and busiest (utilization), under its first GPU's name.
pub fn attach_gpus(statuses: &mut [InstanceStatus], host: &str, readings: &[GpuReading]) {
    for s in statuses.iter_mut().filter(|s| s.id.host() == Some(host)) {
        let gpus: Vec<u32> = match &s.group {
            Some(g) => g.gpus.clone(),
            None => s.id.gpu_index().into_iter().collect(),
        };
        let mine: Vec<&GpuReading> = readings
            .iter()
            .filter(|g| gpus.contains(&g.index))
            .collect();
        s.gpu_reading = mine.split_first().map(|(first, rest)| {
            rest.iter().fold((*first).clone(), |mut sum, g| {
                sum.memory_total_mib += g.memory_total_mib;
                sum.memory_used_mib += g.memory_used_mib;
                sum.memory_free_mib += g.memory_free_mib;
                sum.utilization_pct = sum.utilization_pct.max(g.utilization_pct);
                sum
            })
        });
    }
}

impl InstanceStatus {
    /// `ready`, `loading`, `unreachable`, `failing`, `dead` or `gone` (pid reused).
    pub fn state(&self) -> &'static str {
        self.state
    }
}

/// What `liveness` and the port's answer add up to. `lingering`: what the server started still
/// runs after it.
fn state_of(
    liveness: Liveness,
    health: Option<u16>,
    port_closed: bool,
    lingering: bool,
) -> &'static str {
    match (liveness, health) {
        // After a scheduler crash SGLang's processes go down over some seconds: until the last
        // one has, the server is failing, not dead.
        (Liveness::Dead, _) if lingering => "failing",
        (Liveness::Dead, _) => "dead",
        (Liveness::Reused, _) => "gone",
        (Liveness::Running, Some(200)) => "ready",
        (Liveness::Running, Some(_)) => "loading",
        (Liveness::Running, None) if port_closed => "loading",
        (Liveness::Running, None) => "unreachable",
    }
}

/// How `status` looks at a host's servers.
#[derive(Debug, Clone, Copy)]
pub struct Look<'a> {
    /// Also read the log of each dead server.
    pub dead_log_tails: bool,
    pub now_unix: u64,
    /// This fleet's id.
    pub me: &'a str,
    /// Only this fleet's servers (`--mine`).
    pub only_mine: bool,
}

/// The status of every instance recorded on one host, every fleet's unless `look.only_mine`.
pub async fn host_status(
    b: &dyn Backend,
    http: &reqwest::Client,
    look: Look<'_>,
) -> Result<Vec<InstanceStatus>, StateError> {
    let seen = b.survey().await?;
    let looks = seen
        .iter()
        .filter(|s| !look.only_mine || is_of(&s.record, look.me))
        .map(|s| instance_status(b, s, http, look));
    Ok(futures::future::join_all(looks).await)
}

async fn instance_status(
    b: &dyn Backend,
    seen: &Seen,
    http: &reqwest::Client,
    look: Look<'_>,
) -> InstanceStatus {
    let Look {
        dead_log_tails,
        now_unix,
        ..
    } = look;
    let Seen {
        record: r,
        liveness,
        lingering,
    } = seen;
    let liveness = *liveness;
    let mut status = InstanceStatus {
        id: r.id.clone(),
        group: r.group.clone(),
        port: r.port,
        pid: r.handle.pid(),
        slurm: SlurmStep::of(&r.handle),
        profile: r.profile.clone(),
        owner: r.owner.clone(),
        mine: is_of(r, look.me),
        liveness,
        state: state_of(liveness, None, false, *lingering),
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
            status.log_tail = b.log_tail(&r.log, LOG_TAIL_LINES).await.ok();
        }
        return status;
    }
    match b.endpoint(&r.address, r.port).await {
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
                status.load = load.ok().map(idle_throughput);
                status.mamba_strategy = info.ok().and_then(|i| i.mamba_strategy);
            }
            status.state = state_of(liveness, status.health, status.port_closed, false);
            tunnel.close().await;
        }
        Err(e) => tracing::warn!("{e}"),
    }
    status
}

/// SGLang refreshes `gen_throughput` only while it decodes (`metrics_reporter.py`): an idle
/// server keeps showing its last busy rate. Nothing running and nothing queued generates
/// nothing.
fn idle_throughput(mut m: Metrics) -> Metrics {
    let idle = m.num_running_reqs == Some(0.0) && m.num_queue_reqs.is_none_or(|q| q == 0.0);
    if idle && m.gen_throughput.is_some() {
        m.gen_throughput = Some(0.0);
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_launcher_gone_with_its_workers_still_up_is_failing_not_dead() {
        assert_eq!(state_of(Liveness::Dead, None, false, true), "failing");
        assert_eq!(state_of(Liveness::Dead, None, false, false), "dead");
        assert_eq!(
            state_of(Liveness::Running, Some(200), false, false),
            "ready"
        );
        assert_eq!(state_of(Liveness::Running, None, true, false), "loading");
    }

    #[test]
    fn an_idle_server_generates_nothing_whatever_its_stale_gauge_says() {
        let stale = Metrics {
            num_running_reqs: Some(0.0),
            num_queue_reqs: Some(0.0),
            gen_throughput: Some(2480.3),
            ..Metrics::default()
        };
        assert_eq!(idle_throughput(stale).gen_throughput, Some(0.0));
        let busy = Metrics {
            num_running_reqs: Some(8.0),
            gen_throughput: Some(2480.3),
            ..Metrics::default()
        };
        assert_eq!(idle_throughput(busy).gen_throughput, Some(2480.3));
    }
}
