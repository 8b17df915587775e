//! Running a sweep: rounds of candidates (all at once in parallel mode, one per round in
//! sequential mode) started through the launcher on their own GPUs, measured together, each
//! trial recorded as it ends; then the winner started on every GPU (`--apply`) or everything
//! the sweep started stopped.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use super::assign::{Assignment, Slot};
use super::file::{FileError, Store};
use super::load::Workload;
use super::rank::{Outcome, Trial};
use super::space::Candidate;
use super::trial::{self, Group, Server, Timing};
use crate::config::{HealthSettings, HostSpec, Profile};
use crate::gpu;
use crate::launch::down::{self, StopOutcome, StopState};
use crate::launch::plan::{self, HostFacts, Instance, PlanError};
use crate::launch::preflight::{self, PreflightFailure};
use crate::launch::state::{self, InstanceRecord, StateError};
use crate::launch::up::{self, LOG_TAIL_LINES, UpError, UpOptions, UpOutcome, UpState};
use crate::remote::{RemoteError, Transport, Tunnel};
use crate::sglang::client::{ClientError, Endpoint, HttpOptions, http_client};

/// Everything a sweep runs with.
pub struct Setup<'a> {
    /// Each candidate with its profile (the base plus the candidate's settings).
    pub candidates: Vec<(Candidate, Profile)>,
    pub assignment: &'a Assignment,
    pub hosts: &'a [(HostSpec, HostFacts)],
    pub transports: &'a BTreeMap<String, Arc<dyn Transport>>,
    pub run_root: &'a str,
    pub api_key: Option<String>,
    pub health: HealthSettings,
    pub workload: Arc<Workload>,
    pub timing: Timing,
    /// SIGTERM grace when the sweep stops servers.
    pub grace: Duration,
}

/// Progress, for the command to show.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Starting { labels: Vec<String>, servers: usize },
    Measuring { labels: Vec<String> },
    TrialDone(Box<Trial>),
    Applying { label: String, servers: usize },
}

#[derive(Debug)]
pub struct Ended {
    pub interrupted: bool,
    /// The winner's servers on every GPU, with `--apply`.
    pub applied: Option<Vec<UpOutcome>>,
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
    ApplyPlan(#[from] PlanError),
    #[error("--apply: {0}")]
    ApplyPreflight(#[from] PreflightFailure),
}

/// A server the sweep started and has not stopped yet.
struct Running {
    candidate: usize,
    record: InstanceRecord,
}

/// The GPUs each host offers, for the assignment.
pub fn host_gpus(hosts: &[(HostSpec, HostFacts)]) -> Vec<(String, Vec<u32>)> {
    hosts
        .iter()
        .map(|(h, f)| (h.name.clone(), plan::host_gpus(h, f)))
        .collect()
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
    async fn start(
        &self,
        instances: &[Instance],
        cancel: &CancellationToken,
    ) -> Result<Vec<UpOutcome>, SweepError> {
        // Health checks and `/server_info` reads while starting answer fast or not at all.
        let http = http_client(HttpOptions {
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(10),
        })?;
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
    async fn stop(&self, running: Vec<Running>) {
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
            let local = h.ssh.is_none() && h.container.is_none();
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
    async fn records(&self, started: &[(usize, &Instance)]) -> Result<Vec<Running>, StateError> {
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

    async fn log_tail(&self, inst: &Instance) -> Vec<String> {
        let t = self.transports[&inst.host].as_ref();
        state::tail(t, &inst.files.log, LOG_TAIL_LINES)
            .await
            .map(|s| s.lines().map(str::to_string).collect())
            .unwrap_or_default()
    }

    fn failed(&self, c: usize, reason: String, log_tail: Vec<String>) -> Trial {
        Trial {
            candidate: self.candidates[c].0.clone(),
            gpus: self.assignment.gpus[c].clone(),
            outcome: Outcome::Failed { reason, log_tail },
        }
    }

    /// Starts, measures and records the candidates `round`; returns what it left running and
    /// whether it was interrupted.
    async fn round(
        &self,
        round: &[usize],
        store: &mut Store,
        events: &UnboundedSender<Event>,
        cancel: &CancellationToken,
    ) -> Result<(Vec<Running>, bool), SweepError> {
        let facts = facts_by_host(self.hosts);
        let mut planned: Vec<(usize, Vec<Instance>)> = Vec::new();
        for &c in round {
            let profile = &self.candidates[c].1;
            let gpus = &self.assignment.gpus[c];
            let checked = plan_on(
                profile,
                self.hosts,
                gpus,
                self.api_key.as_deref(),
                self.run_root,
            )
            .map_err(|e| e.to_string())
            .and_then(|i| {
                preflight::preflight(&i, &facts)
                    .map(|()| i)
                    .map_err(|e| e.to_string())
            });
            match checked {
                Ok(instances) => planned.push((c, instances)),
                Err(reason) => {
                    let t = self.failed(c, reason, Vec::new());
                    store.record(t.clone())?;
                    let _ = events.send(Event::TrialDone(Box::new(t)));
                }
            }
        }
        if planned.is_empty() {
            return Ok((Vec::new(), false));
        }
        let all: Vec<Instance> = planned
            .iter()
            .flat_map(|(_, i)| i.iter().cloned())
            .collect();
        let owner: Vec<usize> = planned
            .iter()
            .flat_map(|(c, i)| std::iter::repeat_n(*c, i.len()))
            .collect();
        let _ = events.send(Event::Starting {
            labels: planned
                .iter()
                .map(|(c, _)| self.candidates[*c].0.label())
                .collect(),
            servers: all.len(),
        });
        let outcomes = self.start(&all, cancel).await?;
        if cancel.is_cancelled() {
            // `up` stopped what it started; stop what was already running too.
            let started: Vec<(usize, &Instance)> = owner.iter().copied().zip(all.iter()).collect();
            self.stop(self.records(&started).await?).await;
            return Ok((Vec::new(), true));
        }
        let started: Vec<(usize, &Instance)> = owner
            .iter()
            .copied()
            .zip(all.iter())
            .zip(&outcomes)
            .filter(|(_, o)| o.pid.is_some())
            .map(|(ci, _)| ci)
            .collect();
        let mut running = self.records(&started).await?;

        // A candidate with a server that did not come up is a failed row; its others stop now.
        let mut measured: Vec<(usize, Vec<(&Instance, &UpOutcome)>)> = Vec::new();
        for (c, _) in &planned {
            let mine: Vec<(&Instance, &UpOutcome)> = all
                .iter()
                .zip(&outcomes)
                .zip(&owner)
                .filter(|(_, o)| **o == *c)
                .map(|(io, _)| io)
                .collect();
            let bad = mine.iter().find(|(_, o)| {
                !matches!(o.state, UpState::Ready | UpState::AlreadyRunning)
                    || o.info.effective_max_running_requests.is_none()
            });
            match bad {
                None => measured.push((*c, mine)),
                Some((inst, o)) => {
                    let reason = match (&o.error, o.state) {
                        (Some(e), _) => format!("{}: {e}", inst.label()),
                        (None, UpState::Ready | UpState::AlreadyRunning) => format!(
                            "{}: /server_info gave no effective max running requests",
                            inst.label()
                        ),
                        (None, s) => format!("{}: {}", inst.label(), s.as_str()),
                    };
                    let tail = match &o.log_tail {
                        Some(t) => t.lines().map(str::to_string).collect(),
                        None => self.log_tail(inst).await,
                    };
                    let (theirs, rest): (Vec<Running>, Vec<Running>) =
                        running.into_iter().partition(|r| r.candidate == *c);
                    running = rest;
                    self.stop(theirs).await;
                    let t = self.failed(*c, reason, tail);
                    store.record(t.clone())?;
                    let _ = events.send(Event::TrialDone(Box::new(t)));
                }
            }
        }
        if measured.is_empty() {
            return Ok((running, false));
        }

        let mut tunnels: Vec<Tunnel> = Vec::new();
        let mut groups: Vec<Group> = Vec::new();
        for (_, mine) in &measured {
            let mut servers = Vec::new();
            for (inst, o) in mine {
                let tunnel = self.transports[&inst.host]
                    .forward(&inst.address, inst.port)
                    .await?;
                servers.push(Server {
                    label: inst.label(),
                    endpoint: Endpoint {
                        name: inst.label(),
                        base_url: format!("http://{}", tunnel.local_addr()),
                        api_key: self.api_key.clone(),
                    },
                    cap: o.info.effective_max_running_requests.unwrap_or(0) as u32,
                    kv_tokens: o.info.max_total_num_tokens.unwrap_or(0),
                    strategy: o.info.mamba_strategy.clone(),
                });
                tunnels.push(tunnel);
            }
            let startup = mine
                .iter()
                .map(|(_, o)| o.ready_after)
                .collect::<Option<Vec<f64>>>()
                .map(|v| v.into_iter().fold(0.0, f64::max));
            groups.push(Group {
                servers,
                startup_s: startup,
            });
        }
        let _ = events.send(Event::Measuring {
            labels: measured
                .iter()
                .map(|(c, _)| self.candidates[*c].0.label())
                .collect(),
        });
        let http = http_client(HttpOptions::default())?;
        let results =
            trial::measure(&groups, self.workload.clone(), http, self.timing, cancel).await;
        for t in tunnels {
            t.close().await;
        }
        let Some(results) = results else {
            return Ok((running, true));
        };
        for ((c, mine), result) in measured.iter().zip(results) {
            let outcome = match result {
                Ok(m) => Outcome::Ok(m),
                Err(f) => {
                    let log_tail = match f.server {
                        Some(i) => self.log_tail(mine[i].0).await,
                        None => Vec::new(),
                    };
                    Outcome::Failed {
                        reason: f.reason,
                        log_tail,
                    }
                }
            };
            let t = Trial {
                candidate: self.candidates[*c].0.clone(),
                gpus: self.assignment.gpus[*c].clone(),
                outcome,
            };
            store.record(t.clone())?;
            let _ = events.send(Event::TrialDone(Box::new(t)));
        }
        Ok((running, false))
    }

    /// Starts `profile` on every GPU, keeping servers that already run it.
    async fn apply(
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

/// Runs every candidate not yet in `store`, then applies the winner (`apply`) or stops what the
/// sweep started. `winner` picks the winner from the finished trials.
pub async fn run(
    setup: &Setup<'_>,
    store: &mut Store,
    apply: bool,
    winner: impl Fn(&[Trial]) -> Option<String>,
    events: &UnboundedSender<Event>,
    cancel: &CancellationToken,
) -> Result<Ended, SweepError> {
    let pending: Vec<usize> = (0..setup.candidates.len())
        .filter(|&c| !store.is_done(&setup.candidates[c].0.id))
        .collect();
    let rounds: Vec<Vec<usize>> = match setup.assignment.mode {
        super::assign::Mode::Parallel => vec![pending],
        super::assign::Mode::Sequential => pending.into_iter().map(|c| vec![c]).collect(),
    };
    let mut running: Vec<Running> = Vec::new();
    for round in rounds.iter().filter(|r| !r.is_empty()) {
        // Sequential mode restarts the whole fleet for each candidate.
        setup.stop(std::mem::take(&mut running)).await;
        if cancel.is_cancelled() {
            return Ok(Ended {
                interrupted: true,
                applied: None,
            });
        }
        let result = setup.round(round, store, events, cancel).await;
        let (left, interrupted) = match result {
            Ok(r) => r,
            Err(e) => {
                setup.stop(running).await;
                return Err(e);
            }
        };
        running = left;
        if interrupted {
            setup.stop(running).await;
            return Ok(Ended {
                interrupted: true,
                applied: None,
            });
        }
    }
    let best = winner(store.trials());
    let chosen = best
        .as_deref()
        .filter(|_| apply)
        .and_then(|id| setup.candidates.iter().position(|(c, _)| c.id == id));
    let Some(w) = chosen else {
        setup.stop(running).await;
        return Ok(Ended {
            interrupted: false,
            applied: None,
        });
    };
    // The winner's servers stay up; `up` keeps them (same config) and fills the other GPUs.
    let losers = running.into_iter().filter(|r| r.candidate != w).collect();
    setup.stop(losers).await;
    let profile = &setup.candidates[w].1;
    let servers =
        plan::plan(profile, setup.hosts, None, None, setup.run_root).map_or(0, |i| i.len());
    let _ = events.send(Event::Applying {
        label: setup.candidates[w].0.label(),
        servers,
    });
    let applied = setup.apply(profile, cancel).await?;
    Ok(Ended {
        interrupted: cancel.is_cancelled(),
        applied: Some(applied),
    })
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
