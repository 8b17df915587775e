//! Starting a planned fleet: lock each host's run directory, survey what already runs
//! (idempotence, `--replace`, foreign ports), start and record every instance detached in
//! parallel, release the locks, follow each to readiness or failure, and undo what was started
//! when interrupted.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::sync::mpsc::UnboundedSender;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::HealthSettings;
use crate::launch::down::{self, StopState};
use crate::launch::lock::{self, HostLock, LockError};
use crate::launch::plan::Instance;
use crate::launch::state::{self, InstanceRecord, Liveness, ProcTable, StateError};
use crate::remote::{Detached, Transport, Tunnel};
use crate::sglang::client::{Endpoint, Health, ServerInfo, SglangClient};

/// First wait between health checks; doubled up to the profile's poll period (at most 1 s).
const FIRST_POLL: Duration = Duration::from_millis(100);
const MAX_POLL: Duration = Duration::from_secs(1);
/// Log lines shown for an instance that failed.
pub const LOG_TAIL_LINES: usize = 20;

#[derive(Debug, Clone)]
pub struct UpOptions {
    pub replace: bool,
    pub keep_on_interrupt: bool,
    /// SIGTERM grace when stopping (a replaced config, a timed-out start, an interrupt).
    pub grace: Duration,
}

/// Where an `up` runs: the hosts, HTTP to the servers, and where progress and Ctrl-C go.
#[derive(Clone, Copy)]
pub struct Run<'a> {
    pub transports: &'a BTreeMap<String, Arc<dyn Transport>>,
    /// Shared by every health check and `/server_info` read.
    pub http: &'a reqwest::Client,
    /// The API key the servers are started with, sent on every request.
    pub api_key: Option<&'a str>,
    pub run_root: &'a str,
    pub events: &'a UnboundedSender<UpEvent>,
    pub cancel: &'a CancellationToken,
}

/// Progress of one instance, keyed by its index in the plan.
#[derive(Debug, Clone, PartialEq)]
pub enum UpEvent {
    Started { key: usize, pid: u32 },
    AlreadyRunning { key: usize, pid: u32 },
    Ready { key: usize, after: Duration },
    Failed { key: usize, reason: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UpState {
    Ready,
    /// Was already running this exact config; left alone.
    AlreadyRunning,
    Failed,
    /// Ctrl-C came first.
    Interrupted,
}

impl UpState {
    pub fn as_str(self) -> &'static str {
        match self {
            UpState::Ready => "ready",
            UpState::AlreadyRunning => "already running",
            UpState::Failed => "failed",
            UpState::Interrupted => "interrupted",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UpOutcome {
    pub host: String,
    pub gpu: u32,
    pub port: u16,
    pub pid: Option<u32>,
    pub state: UpState,
    /// Seconds from start to the first healthy answer.
    pub ready_after: Option<f64>,
    #[serde(flatten)]
    pub info: Capacity,
    pub error: Option<String>,
    pub log_tail: Option<String>,
    /// The server argv with secrets masked.
    pub argv: Vec<String>,
}

/// The capacity a ready server reports in `/server_info`, as `up` shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Capacity {
    pub version: Option<String>,
    pub max_total_num_tokens: Option<u64>,
    /// `internal_states[0].effective_max_running_requests_per_dp`: the real cap.
    pub effective_max_running_requests: Option<u64>,
    pub context_length: Option<u64>,
    /// The mamba strategy the server resolved (what `auto` became).
    pub mamba_strategy: Option<String>,
}

impl From<&ServerInfo> for Capacity {
    fn from(info: &ServerInfo) -> Capacity {
        Capacity {
            version: info.version.clone(),
            max_total_num_tokens: info.max_total_num_tokens,
            effective_max_running_requests: info.effective_max_running_requests,
            context_length: info.context_length,
            mamba_strategy: info.mamba_strategy.clone(),
        }
    }
}

/// Why nothing was started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Conflict {
    /// Our instance runs a different config on this port.
    DifferentConfig {
        label: String,
        pid: u32,
        profile: String,
    },
    /// Something fleet did not start listens on the port.
    ForeignPort { label: String },
}

/// Why `up` started nothing: every conflict on every port, at once.
#[derive(Debug, thiserror::Error)]
pub enum UpError {
    #[error("{}", conflicts_message(.0))]
    Conflicts(Vec<Conflict>),
}

fn conflicts_message(conflicts: &[Conflict]) -> String {
    let mut out = String::from("nothing was started:");
    let mut different = false;
    for c in conflicts {
        match c {
            Conflict::DifferentConfig { label, pid, profile } => {
                different = true;
                out.push_str(&format!(
                    "\n  {label}: already running a different config (profile {profile}, pid {pid})"
                ));
            }
            Conflict::ForeignPort { label } => out.push_str(&format!(
                "\n  {label}: the port is in use by a process fleet did not start; stop it or change port_base"
            )),
        }
    }
    if different {
        out.push_str("\n  hint: --replace restarts them with this config; `fleet down` stops them");
    }
    out
}

/// Starts the planned instances and waits for each to become ready or fail. Refuses (starting
/// nothing) when a port runs another config without `replace`, or a foreign process holds it.
///
/// Each host's run directory is locked (see [`lock`]) from the look at what runs there until
/// every new server is recorded, so a concurrent `up` of the same GPUs waits and then finds
/// them running; readiness is awaited after the locks are released.
pub async fn up(
    instances: &[Instance],
    health: &HealthSettings,
    opts: &UpOptions,
    run: &Run<'_>,
) -> Result<Vec<UpOutcome>, UpError> {
    let Run {
        transports,
        run_root,
        cancel,
        ..
    } = *run;
    let (locks, surveys) = lock_and_survey(instances, transports, run_root, cancel).await;
    let mut actions = Vec::with_capacity(instances.len());
    let mut conflicts = Vec::new();
    for instance in instances {
        let s = match &surveys[&instance.host] {
            Ok(s) => s,
            // That host's instances fail; the other hosts go on.
            Err(why) => {
                actions.push(why.action());
                continue;
            }
        };
        match decide(instance, s, opts.replace) {
            Ok(action) => actions.push(action),
            Err(conflict) => conflicts.push(conflict),
        }
    }
    if !conflicts.is_empty() {
        release(locks).await;
        return Err(UpError::Conflicts(conflicts));
    }
    let launches = instances
        .iter()
        .zip(actions)
        .enumerate()
        .map(|(key, (instance, action))| {
            let t = transports[&instance.host].as_ref();
            launch(key, instance, action, t, opts, run)
        });
    let launched = futures::future::join_all(launches).await;
    release(locks).await;
    let follows = instances
        .iter()
        .zip(launched)
        .enumerate()
        .map(|(key, (instance, launched))| {
            let t = transports[&instance.host].as_ref();
            follow(key, instance, launched, t, health, opts, run)
        });
    let results = futures::future::join_all(follows).await;
    if cancel.is_cancelled() && !opts.keep_on_interrupt {
        let started = results.iter().filter_map(|(_, record)| record.as_ref());
        let stops = started.map(|r| down::stop(transports[&r.host].as_ref(), r, opts.grace));
        for stopped in futures::future::join_all(stops).await {
            if stopped.state == StopState::Failed {
                tracing::warn!(
                    "{} :{}: could not stop after the interrupt: {}",
                    stopped.host,
                    stopped.port,
                    stopped.error.unwrap_or_default()
                );
            }
        }
    }
    Ok(results.into_iter().map(|(outcome, _)| outcome).collect())
}

/// Why a host's instances cannot start.
enum Unavailable {
    Failed(String),
    Interrupted,
}

impl Unavailable {
    fn action(&self) -> Action<'static> {
        match self {
            Unavailable::Failed(why) => Action::Unavailable(why.clone()),
            Unavailable::Interrupted => Action::Interrupted,
        }
    }
}

/// Locks the run directory of every host with planned instances, one host after the other in
/// name order (so two `up`s of overlapping hosts never wait for each other in a circle), then
/// looks at what runs on each locked host.
async fn lock_and_survey(
    instances: &[Instance],
    transports: &BTreeMap<String, Arc<dyn Transport>>,
    run_root: &str,
    cancel: &CancellationToken,
) -> (Vec<HostLock>, BTreeMap<String, Result<Survey, Unavailable>>) {
    let hosts: BTreeSet<&str> = instances.iter().map(|i| i.host.as_str()).collect();
    let (me, token) = (lock::Owner::me(), lock::token());
    let mut locks = Vec::new();
    let mut locked = Vec::new();
    let mut surveys = BTreeMap::new();
    for host in hosts {
        let t = &transports[host];
        match lock::acquire(t.clone(), run_root, &me, &token, cancel).await {
            Ok(l) => {
                locks.push(l);
                locked.push((host, t.as_ref()));
            }
            Err(LockError::Interrupted) => {
                surveys.insert(host.to_string(), Err(Unavailable::Interrupted));
            }
            Err(e) => {
                surveys.insert(host.to_string(), Err(Unavailable::Failed(e.to_string())));
            }
        }
    }
    let looks = locked.into_iter().map(|(host, t)| async move {
        let look = async {
            Ok::<_, StateError>(Survey {
                records: state::read_records(t, run_root).await?,
                table: state::proc_table(t).await?,
                listening: state::listening_ports(t).await?,
            })
        };
        let found = look.await.map_err(|e| Unavailable::Failed(e.to_string()));
        (host.to_string(), found)
    });
    surveys.extend(futures::future::join_all(looks).await);
    (locks, surveys)
}

async fn release(locks: Vec<HostLock>) {
    futures::future::join_all(locks.into_iter().map(HostLock::release)).await;
}

/// What already runs on a host, looked at once before starting anything.
#[derive(Default)]
struct Survey {
    records: Vec<InstanceRecord>,
    table: ProcTable,
    listening: BTreeSet<u16>,
}

#[derive(Debug, PartialEq)]
enum Action<'a> {
    Start,
    Keep(&'a InstanceRecord),
    Replace(&'a InstanceRecord),
    /// The host could not be looked at.
    Unavailable(String),
    /// Interrupted before the host could be looked at.
    Interrupted,
}

/// What to do with a planned instance given what already runs on its host: keep a live
/// instance of the same config, replace (or refuse) one of another config, refuse a port some
/// other process listens on, else start.
fn decide<'a>(instance: &Instance, s: &'a Survey, replace: bool) -> Result<Action<'a>, Conflict> {
    // Ours while its leader runs, or while workers it left in its group still do. A reused
    // pid is someone else's, and so is its group: Linux hands out no pid still in use as a
    // group id, so our group was empty by then.
    let ours = s.records.iter().find(|r| {
        r.port == instance.port
            && match s.table.liveness(r.pid, r.start_ticks) {
                Liveness::Running => true,
                Liveness::Dead => !s.table.group(r.pid).is_empty(),
                Liveness::Reused => false,
            }
    });
    match ours {
        Some(r) if r.fingerprint == instance.fingerprint => Ok(Action::Keep(r)),
        Some(r) if replace => Ok(Action::Replace(r)),
        Some(r) => Err(Conflict::DifferentConfig {
            label: instance.label(),
            pid: r.pid,
            profile: r.profile.clone(),
        }),
        None if s.listening.contains(&instance.port) => Err(Conflict::ForeignPort {
            label: instance.label(),
        }),
        None => Ok(Action::Start),
    }
}

/// An instance whose process runs, after the locked part of `up`.
struct Launched {
    record: InstanceRecord,
    /// Started by this `up` (not one it found running).
    started_here: bool,
}

fn outcome_of(instance: &Instance) -> UpOutcome {
    UpOutcome {
        host: instance.host.clone(),
        gpu: instance.gpu,
        port: instance.port,
        pid: None,
        state: UpState::Failed,
        ready_after: None,
        info: Capacity::default(),
        error: None,
        log_tail: None,
        argv: instance.display_argv(),
    }
}

fn fail(run: &Run<'_>, key: usize, mut outcome: UpOutcome, reason: String) -> UpOutcome {
    let _ = run.events.send(UpEvent::Failed {
        key,
        reason: reason.clone(),
    });
    outcome.error = Some(reason);
    outcome
}

/// The locked part of one instance: keep it, or stop the old config and start and record the
/// new one. `Err` is the instance's final outcome.
async fn launch(
    key: usize,
    instance: &Instance,
    action: Action<'_>,
    t: &dyn Transport,
    opts: &UpOptions,
    run: &Run<'_>,
) -> Result<Launched, UpOutcome> {
    let outcome = outcome_of(instance);
    match action {
        Action::Keep(record) => {
            return Ok(Launched {
                record: record.clone(),
                started_here: false,
            });
        }
        Action::Replace(record) => {
            let stopped = down::stop(t, record, opts.grace).await;
            if stopped.state == StopState::Failed || !stopped.port_closed {
                let why = stopped.error.unwrap_or_default();
                let reason = format!("could not stop the old server (pid {}): {why}", record.pid);
                return Err(fail(run, key, outcome, reason));
            }
        }
        Action::Start => {}
        Action::Unavailable(why) => return Err(fail(run, key, outcome, why)),
        Action::Interrupted => {
            return Err(UpOutcome {
                state: UpState::Interrupted,
                ..outcome
            });
        }
    }
    if run.cancel.is_cancelled() {
        return Err(UpOutcome {
            state: UpState::Interrupted,
            ..outcome
        });
    }
    match start(t, instance).await {
        Ok(record) => {
            let _ = run.events.send(UpEvent::Started {
                key,
                pid: record.pid,
            });
            Ok(Launched {
                record,
                started_here: true,
            })
        }
        Err(e) => Err(fail(run, key, outcome, e.to_string())),
    }
}

/// One launched instance to ready, failed or interrupted. Also returns the record of a
/// process this run started and left running, for cleanup after an interrupt.
async fn follow(
    key: usize,
    instance: &Instance,
    launched: Result<Launched, UpOutcome>,
    t: &dyn Transport,
    health: &HealthSettings,
    opts: &UpOptions,
    run: &Run<'_>,
) -> (UpOutcome, Option<InstanceRecord>) {
    let Launched {
        record,
        started_here,
    } = match launched {
        Ok(l) => l,
        Err(outcome) => return (outcome, None),
    };
    let Run { events, cancel, .. } = *run;
    let mut outcome = UpOutcome {
        pid: Some(record.pid),
        ..outcome_of(instance)
    };
    // Only what this run started is undone after an interrupt.
    let ours = started_here.then(|| record.clone());
    let started = Instant::now();
    // An instance left running by an earlier `up` may still be loading: it is waited for too.
    let waited = tokio::select! {
        _ = cancel.cancelled() => None,
        w = wait_ready(t, instance, &record, health, run) => Some(w),
    };
    let after = started.elapsed();
    match waited {
        None => outcome.state = UpState::Interrupted,
        Some(Ok(())) => {
            if started_here {
                let _ = events.send(UpEvent::Ready { key, after });
                outcome.state = UpState::Ready;
                outcome.ready_after = Some((after.as_secs_f64() * 10.0).round() / 10.0);
            } else {
                let _ = events.send(UpEvent::AlreadyRunning {
                    key,
                    pid: record.pid,
                });
                outcome.state = UpState::AlreadyRunning;
            }
            match server_info(t, instance, run).await {
                Ok(info) => outcome.info = Capacity::from(&info),
                Err(e) => tracing::warn!("{}: /server_info: {e}", instance.label()),
            }
        }
        Some(Err(failure)) => {
            let mut reason = failure.to_string();
            if started_here && matches!(failure, Failure::Timeout(_)) {
                // A server that never became ready still holds its GPU.
                down::stop(t, &record, opts.grace).await;
                reason.push_str("; stopped it");
            }
            outcome.log_tail = state::tail(t, &instance.files.log, LOG_TAIL_LINES)
                .await
                .ok();
            outcome = fail(run, key, outcome, reason);
        }
    }
    (outcome, ours)
}

async fn start(t: &dyn Transport, instance: &Instance) -> Result<InstanceRecord, StateError> {
    state::prepare_run_dir(t, &instance.files, instance.secrets.as_ref()).await?;
    let pid = t
        .spawn_detached(&Detached {
            argv: instance.argv.clone(),
            env: instance.env.clone(),
            log: instance.files.log.clone(),
            pidfile: instance.files.pidfile.clone(),
        })
        .await?;
    match record_started(t, instance, pid).await {
        Ok(record) => Ok(record),
        Err(e) => {
            // Unrecorded, nothing would ever stop it (`down` goes by the records): the group
            // `setsid` made goes now, while its pid is surely the one just started.
            let _ = state::signal_group(t, pid, "KILL").await;
            Err(e)
        }
    }
}

async fn record_started(
    t: &dyn Transport,
    instance: &Instance,
    pid: u32,
) -> Result<InstanceRecord, StateError> {
    // A process that died at once has no stat; record start time 0 so it reads as dead.
    let start_ticks = state::proc_stat(t, pid).await?.map_or(0, |p| p.start_ticks);
    let record = InstanceRecord {
        host: instance.host.clone(),
        gpu: instance.gpu,
        port: instance.port,
        profile: instance.profile.clone(),
        fingerprint: instance.fingerprint.clone(),
        argv: instance.display_argv(),
        address: instance.address.clone(),
        pid,
        start_ticks,
        started_at: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        api_key_env: instance.api_key_env.clone(),
        dir: instance.files.dir.clone(),
        log: instance.files.log.clone(),
        pidfile: instance.files.pidfile.clone(),
        record: instance.files.record.clone(),
    };
    state::write_record(t, &record).await?;
    Ok(record)
}

#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error("the server process exited during startup")]
    Died,
    #[error("not ready after {}", humantime::format_duration(*.0))]
    Timeout(Duration),
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Remote(#[from] crate::remote::RemoteError),
}

/// Polls `/health` until 200, failing as soon as the process is gone or the startup timeout
/// passes. Polls quickly at first, then every `health.poll` (at most 1 s).
async fn wait_ready(
    t: &dyn Transport,
    instance: &Instance,
    record: &InstanceRecord,
    health: &HealthSettings,
    run: &Run<'_>,
) -> Result<(), Failure> {
    let tunnel = t.forward(&instance.address, instance.port).await?;
    let client = client(run, instance, &tunnel);
    let started = Instant::now();
    let mut waits = poll_waits(health.poll);
    let result = loop {
        if let Ok(Health::Ready) = client.health().await {
            break Ok(());
        }
        let alive = state::proc_stat(t, record.pid)
            .await?
            .is_some_and(|p| p.running() && p.start_ticks == record.start_ticks);
        if !alive {
            break Err(Failure::Died);
        }
        if started.elapsed() >= health.startup_timeout {
            break Err(Failure::Timeout(health.startup_timeout));
        }
        tokio::time::sleep(waits.next().unwrap_or(MAX_POLL)).await;
    };
    tunnel.close().await;
    result
}

/// The waits between health checks: doubling from [`FIRST_POLL`] up to the profile's poll
/// period, never more than [`MAX_POLL`], so a server turning ready is seen within a second.
fn poll_waits(poll: Duration) -> impl Iterator<Item = Duration> {
    let cap = poll.clamp(FIRST_POLL, MAX_POLL);
    std::iter::successors(Some(FIRST_POLL.min(cap)), move |w| Some((*w * 2).min(cap)))
}

async fn server_info(
    t: &dyn Transport,
    instance: &Instance,
    run: &Run<'_>,
) -> Result<ServerInfo, Box<dyn std::error::Error + Send + Sync>> {
    let tunnel = t.forward(&instance.address, instance.port).await?;
    let info = client(run, instance, &tunnel).server_info().await;
    tunnel.close().await;
    Ok(info?)
}

fn client(run: &Run<'_>, instance: &Instance, tunnel: &Tunnel) -> SglangClient {
    SglangClient::new(
        run.http.clone(),
        Endpoint {
            name: instance.label(),
            base_url: format!("http://{}", tunnel.local_addr()),
            api_key: run.api_key.map(str::to_string),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waits(poll_ms: u64) -> Vec<u64> {
        poll_waits(Duration::from_millis(poll_ms))
            .take(7)
            .map(|d| d.as_millis() as u64)
            .collect()
    }

    #[test]
    fn health_polls_start_fast_and_never_exceed_a_second() {
        assert_eq!(waits(1000), [100, 200, 400, 800, 1000, 1000, 1000]);
        assert_eq!(waits(5000), [100, 200, 400, 800, 1000, 1000, 1000]);
        assert_eq!(waits(300), [100, 200, 300, 300, 300, 300, 300]);
        assert_eq!(waits(10), [100, 100, 100, 100, 100, 100, 100]);
    }

    fn record(port: u16, pid: u32, start_ticks: u64, fingerprint: &str) -> InstanceRecord {
        InstanceRecord {
            host: "h".into(),
            gpu: 0,
            port,
            profile: "p".into(),
            fingerprint: fingerprint.into(),
            argv: vec![],
            address: "127.0.0.1".into(),
            pid,
            start_ticks,
            started_at: 0,
            api_key_env: None,
            dir: String::new(),
            log: String::new(),
            pidfile: String::new(),
            record: String::new(),
        }
    }

    fn instance(port: u16, fingerprint: &str) -> Instance {
        let files = crate::launch::plan::RunFiles::new("/tmp/fleet", port);
        Instance {
            host: "h".into(),
            gpu: 0,
            port,
            argv: vec!["sglang-sim".into()],
            launcher_len: 1,
            env: Default::default(),
            address: "127.0.0.1".into(),
            files,
            fingerprint: fingerprint.into(),
            profile: "p".into(),
            api_key_env: None,
            secrets: None,
        }
    }

    /// A process table line: `pid (name) state ppid pgrp ...` with start time at field 22.
    fn proc(pid: u32, state: char, pgrp: u32, start: u64) -> String {
        format!(
            "{pid} (sglang-sim) {state} 1 {pgrp} {pgrp} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {start} 0 0\n"
        )
    }

    #[test]
    fn same_config_is_kept_another_is_refused_or_replaced() {
        let survey = Survey {
            records: vec![record(30000, 10, 500, "aaa")],
            table: ProcTable::parse(&proc(10, 'S', 10, 500)),
            listening: [30000].into(),
        };
        let same = instance(30000, "aaa");
        assert_eq!(
            decide(&same, &survey, false),
            Ok(Action::Keep(&survey.records[0]))
        );
        let other = instance(30000, "bbb");
        assert_eq!(
            decide(&other, &survey, true),
            Ok(Action::Replace(&survey.records[0]))
        );
        assert_eq!(
            decide(&other, &survey, false),
            Err(Conflict::DifferentConfig {
                label: "h gpu0 :30000".into(),
                pid: 10,
                profile: "p".into()
            })
        );
    }

    #[test]
    fn dead_or_reused_records_free_the_port_unless_someone_else_listens() {
        // pid 10 is now another process (other start time); pid 20 is a zombie.
        let survey = Survey {
            records: vec![record(30000, 10, 500, "aaa"), record(30001, 20, 600, "aaa")],
            table: ProcTable::parse(&(proc(10, 'S', 10, 999) + &proc(20, 'Z', 20, 600))),
            listening: [30000].into(),
        };
        assert_eq!(
            decide(&instance(30000, "aaa"), &survey, true),
            Err(Conflict::ForeignPort {
                label: "h gpu0 :30000".into()
            })
        );
        assert_eq!(
            decide(&instance(30001, "aaa"), &survey, false),
            Ok(Action::Start)
        );
        assert_eq!(
            decide(&instance(30002, "aaa"), &Survey::default(), false),
            Ok(Action::Start)
        );
    }

    #[test]
    fn workers_outliving_their_leader_still_count_as_ours() {
        let survey = Survey {
            records: vec![record(30000, 10, 500, "aaa")],
            table: ProcTable::parse(&proc(11, 'S', 10, 510)),
            listening: [30000].into(),
        };
        assert_eq!(
            decide(&instance(30000, "aaa"), &survey, false),
            Ok(Action::Keep(&survey.records[0]))
        );
    }

    #[test]
    fn conflicts_name_each_instance_and_the_way_out() {
        let message = conflicts_message(&[
            Conflict::DifferentConfig {
                label: "ct200 gpu0 :30000".into(),
                pid: 7,
                profile: "old".into(),
            },
            Conflict::ForeignPort {
                label: "ct200 gpu1 :30001".into(),
            },
        ]);
        assert_eq!(
            message,
            "nothing was started:\n  \
             ct200 gpu0 :30000: already running a different config (profile old, pid 7)\n  \
             ct200 gpu1 :30001: the port is in use by a process fleet did not start; stop it or change port_base\n  \
             hint: --replace restarts them with this config; `fleet down` stops them"
        );
    }
}
