//! The servers of a sweep: what it runs with, planning a candidate on exactly its GPUs,
//! starting servers as `fleet up` would, stopping them until their GPUs' memory is released,
//! and reading back their records and logs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::{HealthSettings, HostSpec, Profile};
use crate::launch::Fleet;
use crate::launch::backend::{Backend, StopState};
use crate::launch::down::{self, StopOutcome};
use crate::launch::plan::{self, HostFacts, Instance, PlanError};
use crate::launch::preflight::{self, PreflightFailure};
use crate::launch::registry::Registry;
use crate::launch::state::{InstanceRecord, StateError};
use crate::launch::up::{self, LOG_TAIL_LINES, UpError, UpOptions, UpOutcome};
use crate::remote::RemoteError;
use crate::sglang::client::{ClientError, http_client};
use crate::sweep::assign::Slot;
use crate::sweep::file::FileError;
use crate::sweep::load::Workload;
use crate::sweep::predict::{self, Predictor};
use crate::sweep::profiles::{ProfileError, Profiles};
use crate::sweep::space::Candidate;
use crate::sweep::trial::Timing;

/// Everything a sweep runs with.
pub struct Setup<'a> {
    /// How each candidate becomes its profile (the base plus the candidate's settings).
    pub profiles: Profiles,
    /// Every GPU of the sweep, in inventory order.
    pub slots: Vec<Slot>,
    pub hosts: &'a [(HostSpec, HostFacts)],
    /// Every host of the inventory, connected.
    pub fleet: &'a Fleet,
    pub api_key: Option<String>,
    pub health: HealthSettings,
    pub workload: Arc<Workload>,
    pub timing: Timing,
    /// Successive halving's first window, when candidates that are clearly behind stop early.
    pub first_window: Option<Duration>,
    /// SIGTERM grace when the sweep stops servers.
    pub grace: Duration,
    /// What each candidate's memory is predicted from, read before the first start.
    pub predictor: Predictor,
}

#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error(transparent)]
    Up(#[from] UpError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Remote(#[from] RemoteError),
    #[error(transparent)]
    File(#[from] FileError),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("--apply: {0}")]
    ApplyProfile(#[from] ProfileError),
    #[error("--apply: {0}")]
    ApplyPlan(#[from] PlanError),
    #[error("--apply: {0}")]
    ApplyPreflight(#[from] PreflightFailure),
}

/// A server the sweep started and has not stopped yet.
#[derive(Debug)]
pub struct Running {
    /// The candidate's place among the search's proposals.
    pub candidate: usize,
    pub record: InstanceRecord,
}

/// The GPUs each host offers, for the assignment.
pub fn host_gpus(hosts: &[(HostSpec, HostFacts)]) -> Vec<(String, Vec<u32>)> {
    hosts
        .iter()
        .map(|(h, f)| (h.name().to_string(), plan::host_gpus(h, f)))
        .collect()
}

/// Why a candidate cannot be planned on its GPUs.
#[derive(Debug, thiserror::Error)]
pub enum Unplanned {
    #[error(transparent)]
    Profile(#[from] ProfileError),
    #[error(transparent)]
    Plan(#[from] PlanError),
}

/// The instances candidate `c` runs on exactly `slots`, from its profile.
pub fn plan_candidate(
    profiles: &Profiles,
    c: &Candidate,
    hosts: &[(HostSpec, HostFacts)],
    slots: &[Slot],
    api_key: Option<&str>,
    run_root: &str,
) -> Result<Vec<Instance>, Unplanned> {
    let profile = profiles.of(c)?;
    Ok(plan_on(&profile, hosts, slots, api_key, run_root)?)
}

/// The instances of `profile` on exactly `slots`.
pub fn plan_on(
    profile: &Profile,
    hosts: &[(HostSpec, HostFacts)],
    slots: &[Slot],
    api_key: Option<&str>,
    run_root: &str,
) -> Result<Vec<Instance>, PlanError> {
    let mut out = Vec::new();
    for (host, facts) in hosts {
        let gpus: Vec<u32> = slots
            .iter()
            .filter(|s| s.host == host.name())
            .map(|s| s.gpu)
            .collect();
        if gpus.is_empty() {
            continue;
        }
        let one = [(host.clone(), facts.clone())];
        out.extend(plan::plan(profile, &one, Some(&gpus), api_key, run_root)?);
    }
    Ok(out)
}

/// The boards the hosts' facts hold, by host: where a sweep's groups are chosen.
pub fn boards(hosts: &[(HostSpec, HostFacts)]) -> BTreeMap<String, crate::layout::Board> {
    hosts
        .iter()
        .filter_map(|(h, f)| Some((h.name().to_string(), f.topology.board()?.clone())))
        .collect()
}

/// Each candidate's GPUs per server (its layout's group on one node), in `space` order; a
/// candidate whose profile does not load counts as one (its start then says why).
pub fn sizes(profiles: &Profiles, space: &[Candidate]) -> Vec<u32> {
    space
        .iter()
        .map(|c| {
            profiles
                .of(c)
                .map_or(1, |p| p.server.parallel.gpus_per_node().max(1))
        })
        .collect()
}

pub fn facts_by_host(hosts: &[(HostSpec, HostFacts)]) -> BTreeMap<String, HostFacts> {
    hosts
        .iter()
        .map(|(h, f)| (h.name().to_string(), f.clone()))
        .collect()
}

impl Setup<'_> {
    /// What the memory prediction says of `candidate` on `slots`.
    pub fn verdict(&self, candidate: &Candidate, slots: &[Slot]) -> predict::Verdict {
        match self.profiles.of(candidate) {
            Ok(profile) => self.predictor.verdict(&profile, slots),
            Err(_) => predict::Verdict::Unknown,
        }
    }

    /// The backend of `host`, one of the sweep's.
    pub fn backend(&self, host: &str) -> &dyn Backend {
        self.fleet
            .backend(host)
            .expect("a host of the sweep")
            .as_ref()
    }

    /// Starts `instances` as `fleet up` would, replacing whatever ran there: a sweep owns the
    /// GPUs it measures on. The sweep reports its own events, so up's are dropped.
    pub async fn start(
        &self,
        instances: &[Instance],
        cancel: &CancellationToken,
    ) -> Result<Vec<UpOutcome>, SweepError> {
        let http = http_client(crate::launch::PROBE_HTTP)?;
        let (up_events, _) = tokio::sync::mpsc::unbounded_channel();
        let run = up::Run {
            fleet: self.fleet,
            http: &http,
            api_key: self.api_key.as_deref(),
            events: &up_events,
            cancel,
        };
        let options = UpOptions {
            replace: true,
            keep_on_interrupt: false,
            grace: self.grace,
        };
        Ok(up::up(instances, &self.health, &options, &run).await?)
    }

    /// Stops servers and waits (briefly) until their GPUs' memory is released, so that the next
    /// round's servers find the memory they are measured with.
    pub async fn stop(&self, running: Vec<Running>) {
        let stops = running
            .iter()
            .map(|r| down::stop(self.backend(r.record.host()), &r.record, self.grace));
        let outcomes = futures::future::join_all(stops).await;
        for s in &outcomes {
            if s.state == StopState::Failed || !s.port_closed {
                tracing::warn!(
                    "{}: could not stop: {}",
                    s.id.label(s.port),
                    s.error.as_deref().unwrap_or_default()
                );
            }
        }
        let confirms = self.hosts.iter().map(|(h, _)| {
            let mut mine: Vec<StopOutcome> = outcomes
                .iter()
                .filter(|o| o.id.host() == Some(h.name()))
                .cloned()
                .collect();
            let b = self.backend(h.name());
            async move {
                if !mine.is_empty() {
                    down::confirm_gpus_released(b, &mut mine).await;
                }
                mine
            }
        });
        for o in futures::future::join_all(confirms).await.iter().flatten() {
            if let Some(used) = o.gpu_memory_used_mib.filter(|m| *m > down::RELEASED_MIB) {
                tracing::warn!(
                    "{}: still {used} MiB in use on its GPU after stopping",
                    o.id.label(o.port)
                );
            }
        }
    }

    /// The records of the started instances that are still recorded.
    pub async fn records(
        &self,
        started: &[(usize, &Instance)],
    ) -> Result<Vec<Running>, StateError> {
        let hosts: BTreeSet<&str> = started.iter().map(|(_, i)| i.host()).collect();
        let backends: Vec<Arc<dyn Backend>> = hosts
            .iter()
            .filter_map(|h| self.fleet.backend(h).cloned())
            .collect();
        let registry = Registry::survey(&backends).await.whole()?;
        Ok(started
            .iter()
            .filter_map(|(candidate, inst)| {
                let record = registry.get(&inst.id, inst.port)?.clone();
                Some(Running {
                    candidate: *candidate,
                    record,
                })
            })
            .collect())
    }

    pub async fn log_tail(&self, inst: &Instance) -> Vec<String> {
        self.backend(inst.host())
            .log_tail(&inst.files.log, LOG_TAIL_LINES)
            .await
            .map(|s| s.lines().map(str::to_string).collect())
            .unwrap_or_default()
    }

    /// Starts `profile` on every GPU, keeping servers that already run it.
    pub async fn apply(
        &self,
        profile: &Profile,
        cancel: &CancellationToken,
    ) -> Result<Vec<UpOutcome>, SweepError> {
        let instances = plan::plan(
            profile,
            self.hosts,
            None,
            self.api_key.as_deref(),
            self.fleet.run_root(),
        )?;
        preflight::preflight(&instances, &facts_by_host(self.hosts))?;
        self.start(&instances, cancel).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GpuSelection;
    use crate::sglang::flags::tests::profile;

    fn host(name: &str, gpus: GpuSelection) -> (HostSpec, HostFacts) {
        (
            crate::launch::plan::tests::host(name, gpus),
            HostFacts {
                help: None,
                version: None,
                address: "127.0.0.1".into(),
                gpus_present: vec![0, 1],
                places: Vec::new(),
                topology: crate::launch::plan::Topology::NotRead,
            },
        )
    }

    #[test]
    fn a_candidate_runs_exactly_on_its_slots_of_every_host() {
        let hosts = vec![
            host("a", GpuSelection::List(vec![0, 1, 2, 3])),
            host("b", GpuSelection::All),
        ];
        assert_eq!(
            host_gpus(&hosts),
            vec![
                ("a".to_string(), vec![0, 1, 2, 3]),
                ("b".to_string(), vec![0, 1])
            ]
        );
        let slots = [("a", 0), ("b", 1), ("a", 2)].map(|(h, gpu)| Slot {
            host: h.into(),
            gpu,
        });
        let planned = plan_on(&profile(), &hosts, &slots, None, "/tmp/fleet").unwrap();
        let got: Vec<String> = planned.iter().map(Instance::label).collect();
        assert_eq!(got, ["a gpu0 :30000", "a gpu2 :30002", "b gpu1 :30001"]);
    }
}
