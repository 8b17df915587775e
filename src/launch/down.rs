//! Stopping what fleet started, from its records on each host (never by name): which servers
//! `down` stops and which it leaves to other fleets ([`choose`], pure), then each server
//! through its backend, which asks it to stop, forces it after the grace period, and confirms
//! its port closed; then, where a host's GPUs can be read, that their memory is released.

use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use crate::launch::backend::machine::AFTER_KILL;
use crate::launch::backend::{Backend, Seen, StopState};
use crate::launch::owner::{Owner, is_of};
use crate::launch::state::InstanceRecord;
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
    /// Who started it; `None` for a server from before owners were recorded.
    pub owner: Option<Owner>,
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

/// Whose servers `down` stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Whose<'a> {
    /// This fleet's (its id).
    Mine(&'a str),
    /// Fleet NAME's (`--fleet NAME`).
    Fleet(&'a str),
    /// Every server fleet started, whoever started it (`--all`).
    All,
}

/// What `down` does with one host's recorded servers.
#[derive(Debug, Default, PartialEq)]
pub struct Choice<'a> {
    pub stop: Vec<&'a InstanceRecord>,
    /// Servers still holding their GPUs that `down` leaves alone: other fleets', and this
    /// fleet's that `--profile` or the inventory's GPUs leave out.
    pub left: Vec<&'a InstanceRecord>,
}

/// Which of a host's servers to stop: `whose`, of `profile` when given, with a GPU among
/// `gpus` (the inventory's list for the host; `None` for all of them). A dead record of those
/// is chosen too, so that its record goes.
pub fn choose<'a>(
    seen: &'a [Seen],
    whose: Whose<'_>,
    profile: Option<&str>,
    gpus: Option<&[u32]>,
) -> Choice<'a> {
    let mut choice = Choice::default();
    for s in seen {
        let r = &s.record;
        let theirs = match whose {
            Whose::Mine(id) | Whose::Fleet(id) => is_of(r, id),
            Whose::All => true,
        };
        let on_gpus = gpus.is_none_or(|g| r.gpus().iter().any(|x| g.contains(x)));
        if theirs && on_gpus && profile.is_none_or(|p| r.profile == p) {
            choice.stop.push(r);
        } else if s.holds_gpu() {
            choice.left.push(r);
        }
    }
    choice
}

/// A server `down` leaves running, as its outcome.
pub fn left_running(record: &InstanceRecord) -> StopOutcome {
    StopOutcome {
        state: StopState::LeftRunning,
        port_closed: false,
        ..outcome_of(record)
    }
}

fn outcome_of(record: &InstanceRecord) -> StopOutcome {
    StopOutcome {
        id: record.id.clone(),
        group: record.group.clone(),
        port: record.port,
        pid: record.handle.pid(),
        profile: record.profile.clone(),
        owner: record.owner.clone(),
        state: StopState::Failed,
        took: Duration::ZERO,
        port_closed: false,
        gpu_memory_used_mib: None,
        error: None,
    }
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
        state,
        took: started.elapsed(),
        port_closed,
        error,
        ..outcome_of(record)
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
        let stopped =
            |o: &&mut StopOutcome| !matches!(o.state, StopState::Failed | StopState::LeftRunning);
        for o in outcomes.iter_mut().filter(stopped) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch::backend::fake::record;
    use crate::launch::state::Liveness;

    fn server(gpu: u32, fleet: Option<&str>, profile: &str, liveness: Liveness) -> Seen {
        let mut r = record("ct200", gpu, 30000 + gpu as u16, "f");
        r.profile = profile.into();
        r.owner = fleet.map(|f| Owner {
            fleet: f.into(),
            by: "u@m".into(),
            inventory: format!("/w/{f}.yaml"),
        });
        Seen {
            record: r,
            liveness,
            lingering: false,
        }
    }

    fn ports(records: &[&InstanceRecord]) -> Vec<u16> {
        records.iter().map(|r| r.port).collect()
    }

    /// a on GPUs 0 and 1, b on 2 (and a dead record on 3), one from before owners on 4.
    fn host() -> Vec<Seen> {
        vec![
            server(0, Some("a"), "acc", Liveness::Running),
            server(1, Some("a"), "acc", Liveness::Running),
            server(2, Some("b"), "accb", Liveness::Running),
            server(3, Some("b"), "accb", Liveness::Dead),
            server(4, None, "old", Liveness::Running),
        ]
    }

    #[test]
    fn down_stops_its_own_fleets_servers_on_its_gpus_and_leaves_the_rest_running() {
        let seen = host();
        let b = choose(&seen, Whose::Mine("b"), None, Some(&[2, 3]));
        assert_eq!(ports(&b.stop), [30002, 30003]);
        assert_eq!(ports(&b.left), [30000, 30001, 30004]);
        // Its own server outside the inventory's GPUs is left too.
        let narrowed = choose(&seen, Whose::Mine("b"), None, Some(&[3]));
        assert_eq!(ports(&narrowed.stop), [30003]);
        assert_eq!(ports(&narrowed.left), [30000, 30001, 30002, 30004]);
        let other_profile = choose(&seen, Whose::Mine("a"), Some("other"), None);
        assert!(other_profile.stop.is_empty());
    }

    #[test]
    fn all_and_fleet_name_stop_others_but_only_on_the_inventorys_gpus() {
        let seen = host();
        let all = choose(&seen, Whose::All, None, Some(&[0, 1, 4]));
        assert_eq!(ports(&all.stop), [30000, 30001, 30004]);
        assert_eq!(ports(&all.left), [30002]);
        let a = choose(&seen, Whose::Fleet("a"), None, Some(&[1, 2, 3]));
        assert_eq!(ports(&a.stop), [30001]);
        assert_eq!(ports(&a.left), [30000, 30002, 30004]);
        let everything = choose(&seen, Whose::All, None, None);
        assert_eq!(everything.stop.len(), 5);
        let left = left_running(all.left[0]);
        assert_eq!(
            (left.state, left.owner.map(|o| o.fleet)),
            (StopState::LeftRunning, Some("b".into()))
        );
    }
}
