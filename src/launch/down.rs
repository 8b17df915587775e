//! Stopping what fleet started, from its records on each host (never by name): each server
//! through its backend, which asks it to stop, forces it after the grace period, and confirms
//! its port closed; then, where a host's GPUs can be read, that their memory is released.

use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use crate::launch::backend::machine::AFTER_KILL;
use crate::launch::backend::{Backend, StopState};
use crate::launch::state::{InstanceRecord, StateError};
use crate::server::{ServerId, host_gpu};

/// How often GPU memory is looked at while it is released.
const POLL: Duration = Duration::from_millis(100);
/// GPU memory in use at or below this counts as released: what a driver keeps on an idle GPU
/// is far less, a loaded model far more.
pub const RELEASED_MIB: u64 = 1024;

/// How a recorded server stopped: the stage `down` observes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StopOutcome {
    #[serde(flatten, with = "host_gpu")]
    pub id: ServerId,
    /// Its GPUs and their slowest link, when it spans several.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<crate::layout::Group>,
    pub port: u16,
    pub pid: Option<u32>,
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
    b: &dyn Backend,
    profile: Option<&str>,
    grace: Duration,
) -> Result<Vec<StopOutcome>, StateError> {
    let seen = b.survey().await?;
    let selected = seen
        .iter()
        .map(|s| &s.record)
        .filter(|r| profile.is_none_or(|p| r.profile == p));
    Ok(futures::future::join_all(selected.map(|r| stop(b, r, grace))).await)
}

/// Stops one recorded instance and forgets it.
pub async fn stop(b: &dyn Backend, record: &InstanceRecord, grace: Duration) -> StopOutcome {
    let started = Instant::now();
    let (state, port_closed, error) = match b.stop(record, grace).await {
        Ok(s) => {
            let open = (!s.port_closed).then(|| {
                format!(
                    "port {} still has a listener after the server stopped",
                    record.port
                )
            });
            (s.state, s.port_closed, open)
        }
        Err(e) => (StopState::Failed, false, Some(e.to_string())),
    };
    StopOutcome {
        id: record.id.clone(),
        group: record.group.clone(),
        port: record.port,
        pid: record.handle.pid(),
        profile: record.profile.clone(),
        state,
        took: started.elapsed(),
        port_closed,
        gpu_memory_used_mib: None,
        error,
    }
}

/// Waits (up to [`AFTER_KILL`]) for the GPUs of the instances stopped on `b`'s host to drop to
/// at most [`RELEASED_MIB`] in use, and records what each one reads. A host whose GPUs cannot
/// be read is left without readings.
pub async fn confirm_gpus_released(b: &dyn Backend, outcomes: &mut [StopOutcome]) {
    let deadline = Instant::now() + AFTER_KILL;
    loop {
        let readings = match b.gpus().await {
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
                .find(|g| Some(g.index) == o.id.gpu_index())
                .map(|g| g.memory_used_mib);
            released &= o.gpu_memory_used_mib.is_none_or(|m| m <= RELEASED_MIB);
        }
        if released || Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep(POLL).await;
    }
}
