//! The servers of a sweep: what it runs with, planning a candidate on exactly its GPUs,
//! starting servers as `fleet up` would, stopping them until their GPUs' memory is released,
//! and reading back their records and logs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::assign::Slot;
use super::file::FileError;
use super::load::Workload;
use super::profiles::{ProfileError, Profiles};
use super::space::Candidate;
use super::trial::Timing;
use crate::config::{HealthSettings, HostSpec, Profile};
use crate::gpu;
use crate::launch::down::{self, StopOutcome, StopState};
use crate::launch::plan::{self, HostFacts, Instance, PlanError};
use crate::launch::preflight::{self, PreflightFailure};
use crate::launch::state::{self, InstanceRecord, StateError};
use crate::launch::up::{self, LOG_TAIL_LINES, UpError, UpOptions, UpOutcome};
use crate::remote::{RemoteError, Transport};
use crate::sglang::client::{ClientError, http_client};

/// Everything a sweep runs with.
pub struct Setup<'a> {
    /// How each candidate becomes its profile (the base plus the candidate's settings).
    pub profiles: Profiles,
    /// Every GPU of the sweep, in inventory order.
    pub slots: Vec<Slot>,
    pub hosts: &'a [(HostSpec, HostFacts)],
    pub transports: &'a BTreeMap<String, Arc<dyn Transport>>,
    pub run_root: &'a str,
    pub api_key: Option<String>,
    pub health: HealthSettings,
    pub workload: Arc<Workload>,
    pub timing: Timing,
    /// Successive halving's first window, when candidates that are clearly behind stop early.
    pub first_window: Option<Duration>,
    /// SIGTERM grace when the sweep stops servers.
    pub grace: Duration,
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
        .map(|(h, f)| (h.name.clone(), plan::host_gpus(h, f)))
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
            .filter(|s| s.host == host.name)
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

pub fn facts_by_host(hosts: &[(HostSpec, HostFacts)]) -> BTreeMap<String, HostFacts> {
    hosts
        .iter()
        .map(|(h, f)| (h.name.clone(), f.clone()))
        .collect()
}

impl Setup<'_> {
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
            transports: self.transports,
            http: &http,
            api_key: self.api_key.as_deref(),
            run_root: self.run_root,
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
        let stops = running.iter().map(|r| {
            down::stop(
                self.transports[&r.record.host].as_ref(),
                &r.record,
                self.grace,
            )
        });
        let outcomes = futures::future::join_all(stops).await;
        for s in &outcomes {
            if s.state == StopState::Failed || !s.port_closed {
                tracing::warn!(
                    "{} gpu{} :{}: could not stop: {}",
                    s.host,
                    s.gpu,
                    s.port,
                    s.error.as_deref().unwrap_or_default()
                );
            }
        }
        let confirms = self.hosts.iter().map(|(h, _)| {
            let mut mine: Vec<StopOutcome> = outcomes
                .iter()
                .filter(|o| o.host == h.name)
                .cloned()
                .collect();
            let t = self.transports[&h.name].clone();
            let local = h.is_local();
            async move {
                if !mine.is_empty() {
                    down::confirm_gpus_released(&mut mine, || gpu::read_host(t.clone(), local))
                        .await;
                }
                mine
            }
        });
        for o in futures::future::join_all(confirms).await.iter().flatten() {
            if let Some(used) = o.gpu_memory_used_mib.filter(|m| *m > down::RELEASED_MIB) {
                tracing::warn!(
                    "{} gpu{}: still {used} MiB in use after stopping :{}",
                    o.host,
                    o.gpu,
                    o.port
                );
            }
        }
    }

    /// The records of the started instances that are still running.
    pub async fn records(
        &self,
        started: &[(usize, &Instance)],
    ) -> Result<Vec<Running>, StateError> {
        let hosts: BTreeSet<&str> = started.iter().map(|(_, i)| i.host.as_str()).collect();
        let mut out = Vec::new();
        for host in hosts {
            let records =
                state::read_records(self.transports[host].as_ref(), self.run_root).await?;
            for (candidate, inst) in started.iter().filter(|(_, i)| i.host == host) {
                if let Some(r) = records.iter().find(|r| r.port == inst.port) {
                    out.push(Running {
                        candidate: *candidate,
                        record: r.clone(),
                    });
                }
            }
        }
        Ok(out)
    }

    pub async fn log_tail(&self, inst: &Instance) -> Vec<String> {
        let t = self.transports[&inst.host].as_ref();
        state::tail(t, &inst.files.log, LOG_TAIL_LINES)
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
            self.run_root,
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
        let got: Vec<(String, u32, u16)> = planned
            .iter()
            .map(|i| (i.host.clone(), i.gpu, i.port))
            .collect();
        assert_eq!(
            got,
            vec![
                ("a".into(), 0, 30000),
                ("a".into(), 2, 30002),
                ("b".into(), 1, 30001)
            ]
        );
    }
}
