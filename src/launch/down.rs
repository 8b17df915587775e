//! Stopping what fleet started, from its records on each host (never by name): SIGTERM to the
//! process group, SIGKILL after the grace period, then confirm the port is closed.

use std::future::Future;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use crate::gpu::{GpuError, GpuReading};
use crate::launch::state::{self, InstanceRecord, Liveness, StateError};
use crate::remote::Transport;

/// How often a stopping group and a closing port are looked at.
const POLL: Duration = Duration::from_millis(100);
/// GPU memory in use at or below this counts as released: what a driver keeps on an idle GPU
/// is far less, a loaded model far more.
pub const RELEASED_MIB: u64 = 1024;
/// How long after SIGKILL (or after the group is gone, for the port) before giving up.
const AFTER_KILL: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopState {
    /// Exited after SIGTERM.
    Stopped,
    /// Needed SIGKILL after the grace period.
    Killed,
    /// Was gone before fleet looked.
    AlreadyDead,
    /// Its pid belongs to another process now; nothing was signalled.
    PidReused,
    /// Still there after SIGKILL, or the host could not be asked.
    Failed,
}

impl StopState {
    pub fn as_str(self) -> &'static str {
        match self {
            StopState::Stopped => "stopped",
            StopState::Killed => "killed",
            StopState::AlreadyDead => "already dead",
            StopState::PidReused => "pid reused",
            StopState::Failed => "failed",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StopOutcome {
    pub host: String,
    pub gpu: u32,
    pub port: u16,
    pub pid: u32,
    pub profile: String,
    pub state: StopState,
    #[serde(with = "secs")]
    pub took: Duration,
    /// Whether nothing listens on the port any more.
    pub port_closed: bool,
    /// Memory in use on the instance's GPU afterwards, when the host's GPUs can be read.
    pub gpu_memory_used_mib: Option<u64>,
    pub error: Option<String>,
}

mod secs {
    pub fn serialize<S: serde::Serializer>(
        d: &std::time::Duration,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_f64((d.as_secs_f64() * 1000.0).round() / 1000.0)
    }
}

/// Stops every recorded instance on one host (those of `profile` only, when given), in
/// parallel. What was already gone is reported and its record removed.
pub async fn down_host(
    t: &dyn Transport,
    run_root: &str,
    profile: Option<&str>,
    grace: Duration,
) -> Result<Vec<StopOutcome>, StateError> {
    let records = state::read_records(t, run_root).await?;
    let selected = records
        .iter()
        .filter(|r| profile.is_none_or(|p| r.profile == p));
    Ok(futures::future::join_all(selected.map(|r| stop(t, r, grace))).await)
}

/// Stops one recorded instance and forgets it.
pub async fn stop(t: &dyn Transport, record: &InstanceRecord, grace: Duration) -> StopOutcome {
    let started = Instant::now();
    let (state, error) = match stop_group(t, record, grace).await {
        Ok(state) => (state, None),
        Err(e) => (StopState::Failed, Some(e.to_string())),
    };
    let port_closed = match state {
        StopState::Failed => false,
        _ => wait_port_closed(t, record.port).await.unwrap_or(false),
    };
    let error = error.or_else(|| {
        (!port_closed && state != StopState::Failed).then(|| {
            format!(
                "port {} still has a listener after the server stopped",
                record.port
            )
        })
    });
    if state != StopState::Failed
        && let Err(e) = state::remove_record(t, record).await
    {
        tracing::warn!("{e}");
    }
    StopOutcome {
        host: record.host.clone(),
        gpu: record.gpu,
        port: record.port,
        pid: record.pid,
        profile: record.profile.clone(),
        state,
        took: started.elapsed(),
        port_closed,
        gpu_memory_used_mib: None,
        error,
    }
}

/// Waits (up to [`AFTER_KILL`]) for the GPUs of the stopped instances to drop to at most
/// [`RELEASED_MIB`] in use, and records what each one reads. `read` reads the host's GPUs; a
/// host whose GPUs cannot be read is left without readings.
pub async fn confirm_gpus_released<F, Fut>(outcomes: &mut [StopOutcome], read: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Vec<GpuReading>, GpuError>>,
{
    let deadline = Instant::now() + AFTER_KILL;
    loop {
        let readings = match read().await {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!("not checking GPU memory: {e}");
                return;
            }
        };
        let mut released = true;
        for o in outcomes.iter_mut().filter(|o| o.state != StopState::Failed) {
            o.gpu_memory_used_mib = readings
                .iter()
                .find(|g| g.index == o.gpu)
                .map(|g| g.memory_used_mib);
            released &= o.gpu_memory_used_mib.is_none_or(|m| m <= RELEASED_MIB);
        }
        if released || Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep(POLL).await;
    }
}

async fn stop_group(
    t: &dyn Transport,
    record: &InstanceRecord,
    grace: Duration,
) -> Result<StopState, StateError> {
    let table = state::proc_table(t).await?;
    let members = table.group(record.pid);
    match table.liveness(record.pid, record.start_ticks) {
        Liveness::Reused => return Ok(StopState::PidReused),
        // The leader is gone, but workers it left in its group still hold the GPU: while the
        // group exists its id cannot have been handed to anyone else, so it is still ours.
        Liveness::Dead if members.is_empty() => return Ok(StopState::AlreadyDead),
        Liveness::Dead | Liveness::Running => {}
    }
    state::signal_group(t, record.pid, "TERM").await?;
    if wait_group_gone(t, record.pid, grace).await? {
        return Ok(StopState::Stopped);
    }
    tracing::warn!(
        "{} gpu{} :{}: still running {}s after SIGTERM; sending SIGKILL",
        record.host,
        record.gpu,
        record.port,
        grace.as_secs()
    );
    state::signal_group(t, record.pid, "KILL").await?;
    if wait_group_gone(t, record.pid, AFTER_KILL).await? {
        Ok(StopState::Killed)
    } else {
        Err(StateError::Command {
            host: t.host().to_string(),
            command: format!("kill -KILL -- -{}", record.pid),
            stderr: "the process group is still there".to_string(),
        })
    }
}

async fn wait_group_gone(
    t: &dyn Transport,
    pgid: u32,
    within: Duration,
) -> Result<bool, StateError> {
    let deadline = Instant::now() + within;
    loop {
        if state::proc_table(t).await?.group(pgid).is_empty() {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(POLL).await;
    }
}

async fn wait_port_closed(t: &dyn Transport, port: u16) -> Result<bool, StateError> {
    let deadline = Instant::now() + AFTER_KILL;
    loop {
        if !state::listening_ports(t).await?.contains(&port) {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(POLL).await;
    }
}
