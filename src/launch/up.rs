//! Starting a planned fleet: lock each host's run directory, survey what already runs
//! (idempotence, `--replace`, foreign ports), start and record every instance detached in
//! parallel, release the locks, follow each to readiness or failure, and undo what was started
//! when interrupted.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::mpsc::UnboundedSender;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::HealthSettings;
use crate::launch::backend::{Backend, Seen, StopState};
use crate::launch::claim::{Action, Survey, decide};
pub use crate::launch::claim::{Conflict, UpError};
use crate::launch::down;
use crate::launch::fleet::Fleet;
use crate::launch::gate::Gate;
use crate::launch::lock::{self, HostLock, LockError};
use crate::launch::owner::unowned_note;
use crate::launch::plan::Instance;
use crate::launch::state::{Handle, InstanceRecord, StateError};
use crate::remote::Tunnel;
use crate::server::{ServerId, host_gpu};
use crate::sglang::client::{Endpoint, Health, ServerInfo, SglangClient};

/// First wait between health checks; doubled up to the profile's poll period (at most 1 s).
const FIRST_POLL: Duration = Duration::from_millis(100);
const MAX_POLL: Duration = Duration::from_secs(1);
/// Wait between connection attempts while the port is still closed. A refused connection
/// costs the server nothing (SGLang opens its port only after the model load, and every
/// `/health` it answers runs a generation), so readiness is seen soon after the port opens.
const CLOSED_POLL: Duration = Duration::from_millis(100);
/// How often, at most, a server that does not answer yet is checked for being alive: each
/// check is a remote command (through ssh and `pct exec`, a fork and exec on the host).
const ALIVE_EVERY: Duration = Duration::from_secs(1);
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
    pub fleet: &'a Fleet,
    /// Shared by every health check and `/server_info` read.
    pub http: &'a reqwest::Client,
    /// The API key the servers are started with, sent on every request.
    pub api_key: Option<&'a str>,
    pub events: &'a UnboundedSender<UpEvent>,
    pub cancel: &'a CancellationToken,
}

/// Progress of one instance, keyed by its index in the plan.
#[derive(Debug, Clone, PartialEq)]
pub enum UpEvent {
    Started { key: usize, handle: Handle },
    AlreadyRunning { key: usize, handle: Handle },
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

/// How a planned server came up: the stage `up` observes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UpOutcome {
    #[serde(flatten, with = "host_gpu")]
    pub id: ServerId,
    /// Its GPUs and their slowest link, when it spans several.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<crate::layout::Group>,
    pub port: u16,
    pub pid: Option<u32>,
    pub state: UpState,
    /// A server was recorded for it (started, or kept from an earlier `up`), whatever became
    /// of it: whoever undoes this `up` has it to stop.
    #[serde(skip)]
    pub recorded: bool,
    /// Seconds from start to the first healthy answer.
    pub ready_after: Option<f64>,
    #[serde(flatten)]
    pub info: Capacity,
    pub error: Option<String>,
    pub log_tail: Option<String>,
    /// The server argv with secrets masked.
    pub argv: Vec<String>,
    /// Where the time went (shown with `-v`, not part of the JSON).
    #[serde(skip)]
    pub phases: Phases,
}

/// How long each step of bringing one server up took, as far as it got.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Phases {
    /// Starting and recording the process (the remote spawn).
    pub spawn: Option<Duration>,
    /// From the spawn to the first HTTP answer on the port (any status).
    pub port_open: Option<Duration>,
    /// From the port opening to `/health` answering 200.
    pub health_200: Option<Duration>,
    /// Reading `/server_info` once ready.
    pub server_info: Option<Duration>,
    /// `/health` requests sent, and liveness checks (remote commands) run, while waiting.
    pub health_polls: u32,
    pub alive_checks: u32,
}

impl Phases {
    /// One line for `-v`: `spawn 0.12s, port open +3.01s, health 200 +0.20s, ...`.
    pub fn summary(&self) -> String {
        let secs = |d: Duration| format!("{:.2}s", d.as_secs_f64());
        let mut parts = Vec::new();
        if let Some(d) = self.spawn {
            parts.push(format!("spawn {}", secs(d)));
        }
        if let Some(d) = self.port_open {
            parts.push(format!("port open +{}", secs(d)));
        }
        if let Some(d) = self.health_200 {
            parts.push(format!("health 200 +{}", secs(d)));
        }
        if let Some(d) = self.server_info {
            parts.push(format!("server_info {}", secs(d)));
        }
        parts.push(format!(
            "{} /health polls, {} liveness checks",
            self.health_polls, self.alive_checks
        ));
        parts.join(", ")
    }
}

/// The capacity a ready server reports in `/server_info`, as `up` shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Capacity {
    pub version: Option<String>,
    pub max_total_num_tokens: Option<u64>,
    /// `effective_max_running_requests_per_dp` summed over the DP ranks: the real cap.
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

/// Starts the planned instances and waits for each to become ready or fail. Refuses (starting
/// nothing) when a port runs another config without `replace`, or a foreign process holds it.
///
/// Each host's run directory is locked (see [`lock`]) from the look at what runs there until
/// every new server is recorded, so a concurrent `up` of the same GPUs waits and then finds
/// them running; readiness is awaited while the locks are released.
pub async fn up(
    instances: &[Instance],
    health: &HealthSettings,
    opts: &UpOptions,
    run: &Run<'_>,
) -> Result<Vec<UpOutcome>, UpError> {
    let hosts: BTreeSet<&str> = instances.iter().map(Instance::host).collect();
    let backends = hosts.iter().filter_map(|h| run.fleet.backend(h).cloned());
    let held = hold(backends.collect(), run.cancel).await;
    start(instances, held, health, opts, run).await
}

/// [`up`] on hosts already [`hold`]: the locks are released here, whatever happens.
pub async fn start(
    instances: &[Instance],
    held: Held,
    health: &HealthSettings,
    opts: &UpOptions,
    run: &Run<'_>,
) -> Result<Vec<UpOutcome>, UpError> {
    let Run { fleet, cancel, .. } = *run;
    let Held { locks, surveys } = held;
    let seen = surveys.values().flatten().flat_map(|s| &s.seen);
    if let Some(note) = unowned_note(seen.map(|s| &s.record)) {
        tracing::info!("{note}");
    }
    let mut actions = Vec::with_capacity(instances.len());
    let mut conflicts = Vec::new();
    for instance in instances {
        let s = match surveys.get(instance.host()) {
            Some(Ok(s)) => s,
            // That host's instances fail; the other hosts go on.
            Some(Err(why)) => {
                actions.push(why.action());
                continue;
            }
            None => {
                let why = format!("{}: not connected", instance.host());
                actions.push(Action::Unavailable(why));
                continue;
            }
        };
        match decide(instance, s, opts.replace, &fleet.owner.fleet) {
            Ok(action) => actions.push(action),
            Err(found) => conflicts.extend(found),
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
        .map(|(key, (instance, action))| launch(key, instance, action, opts, run));
    let launched = futures::future::join_all(launches).await;
    let follows = instances
        .iter()
        .zip(launched)
        .enumerate()
        .map(|(key, (instance, launched))| follow(key, instance, launched, health, opts, run));
    // Every new server is recorded: the release (a command on each host, through `pct exec`
    // most of a second) goes beside the readiness waits, not before them.
    let ((), results) = tokio::join!(release(locks), futures::future::join_all(follows));
    if cancel.is_cancelled() && !opts.keep_on_interrupt {
        let started = results.iter().filter_map(|(_, record)| record.as_ref());
        let stops = started.map(|r| down::stop(surveyed(run, r.host()), r, opts.grace));
        for stopped in futures::future::join_all(stops).await {
            if stopped.state == StopState::Failed {
                tracing::warn!(
                    "{}: could not stop after the interrupt: {}",
                    stopped.id.label(stopped.port),
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

/// Each host's run directory locked, with what runs there: what [`start`] decides on.
pub struct Held {
    locks: Vec<HostLock>,
    surveys: BTreeMap<String, Result<Survey, Unavailable>>,
}

impl Held {
    /// Gives the locks back, for an `up` that ends before [`start`].
    pub async fn release(self) {
        release(self.locks).await;
    }
}

/// Locks the run directory of each host, one host after the other in name order (so two
/// `up`s of overlapping hosts never wait for each other in a circle), and looks at what runs on
/// each locked host. Needs no plan, so a command can hold its hosts while it learns them.
///
/// The look is sent beside the `take`, through a [`Gate`]: each of its commands runs on the
/// host only once the lock names this `up`, so both cost one round trip (through `pct exec`,
/// most of a second each). Where the lock was another's, the look is made again once taken.
pub async fn hold(mut backends: Vec<Arc<dyn Backend>>, cancel: &CancellationToken) -> Held {
    backends.sort_by(|a, b| a.host().cmp(b.host()));
    let (me, token) = (lock::Owner::me(), lock::token());
    let mut locks = Vec::new();
    let mut surveys = BTreeMap::new();
    for b in backends {
        let host = b.host().to_string();
        let gate = Gate::new(b.shell().clone(), b.run_root(), &token);
        let early = b.through(gate.clone());
        let beside = async {
            let early = early.as_deref()?;
            tokio::select! {
                _ = cancel.cancelled() => None,
                seen = look(early) => Some(seen),
            }
        };
        let (taken, early) = tokio::join!(
            lock::acquire(b.shell().clone(), b.run_root(), &me, &token, cancel),
            beside
        );
        let found = match taken {
            Ok(l) => {
                locks.push(l);
                match early {
                    Some(seen) if !gate.refused() => seen,
                    _ => look(b.as_ref()).await,
                }
                .survey()
            }
            Err(LockError::Interrupted) => Err(Unavailable::Interrupted),
            Err(e) => Err(Unavailable::Failed(e.to_string())),
        };
        surveys.insert(host, found);
    }
    Held { locks, surveys }
}

/// What runs on a host, as read: its recorded servers, the ports in use and the GPUs' processes.
struct Look {
    seen: Result<Vec<Seen>, StateError>,
    ports_in_use: Result<BTreeSet<u16>, StateError>,
    processes: Result<Vec<crate::gpu::GpuProcess>, crate::gpu::GpuError>,
}

/// Three reads, each a command on the host: at the same time.
async fn look(b: &dyn Backend) -> Look {
    let (seen, ports_in_use, processes) =
        tokio::join!(b.survey(), b.ports_in_use(), b.gpu_processes());
    Look {
        seen,
        ports_in_use,
        processes,
    }
}

impl Look {
    /// What runs, for [`decide`]: a host without a driver runs no GPU process to collide with;
    /// any other failure to read them is said.
    fn survey(self) -> Result<Survey, Unavailable> {
        use crate::gpu::GpuError;
        let processes = match self.processes {
            Ok(p) => p,
            Err(e @ (GpuError::NoNvidiaSmi { .. } | GpuError::NoDriver { .. })) => {
                tracing::debug!("{e}");
                Vec::new()
            }
            Err(e) => {
                tracing::warn!("{e}; processes fleet did not start are not checked for");
                Vec::new()
            }
        };
        match (self.seen, self.ports_in_use) {
            (Ok(seen), Ok(ports_in_use)) => Ok(Survey {
                seen,
                ports_in_use,
                processes,
            }),
            (Err(e), _) | (_, Err(e)) => Err(Unavailable::Failed(e.to_string())),
        }
    }
}

/// The backend of a host whose run directory `up` locked and surveyed, which it reached.
fn surveyed<'a>(run: &Run<'a>, host: &str) -> &'a dyn Backend {
    let b = run.fleet.backend(host);
    b.expect("a host up surveyed is connected").as_ref()
}

async fn release(locks: Vec<HostLock>) {
    futures::future::join_all(locks.into_iter().map(HostLock::release)).await;
}

/// An instance whose process runs, after the locked part of `up`.
struct Launched {
    record: InstanceRecord,
    /// Started by this `up` (not one it found running).
    started_here: bool,
    /// How long the spawn took, when this `up` started it.
    spawn: Option<Duration>,
}

fn outcome_of(instance: &Instance) -> UpOutcome {
    UpOutcome {
        id: instance.id.clone(),
        group: instance.group.if_multi(),
        port: instance.port,
        pid: None,
        state: UpState::Failed,
        recorded: false,
        ready_after: None,
        info: Capacity::default(),
        error: None,
        log_tail: None,
        argv: instance.display_argv(),
        phases: Phases::default(),
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
    opts: &UpOptions,
    run: &Run<'_>,
) -> Result<Launched, UpOutcome> {
    let outcome = outcome_of(instance);
    let b = || surveyed(run, instance.host());
    match action {
        Action::Keep(record) => {
            return Ok(Launched {
                record: record.clone(),
                started_here: false,
                spawn: None,
            });
        }
        Action::Replace(records) => {
            let stops = records.iter().map(|r| down::stop(b(), r, opts.grace));
            let stopped = futures::future::join_all(stops).await;
            for (record, stopped) in records.iter().zip(stopped) {
                if stopped.state == StopState::Failed || !stopped.port_closed {
                    let why = stopped.error.unwrap_or_default();
                    let handle = &record.handle;
                    let reason = format!("could not stop the old server ({handle}): {why}");
                    return Err(fail(run, key, outcome, reason));
                }
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
    let spawning = Instant::now();
    match b().start(instance, &run.fleet.owner).await {
        Ok(record) => {
            let _ = run.events.send(UpEvent::Started {
                key,
                handle: record.handle.clone(),
            });
            Ok(Launched {
                record,
                started_here: true,
                spawn: Some(spawning.elapsed()),
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
    health: &HealthSettings,
    opts: &UpOptions,
    run: &Run<'_>,
) -> (UpOutcome, Option<InstanceRecord>) {
    let Launched {
        record,
        started_here,
        spawn,
    } = match launched {
        Ok(l) => l,
        Err(outcome) => return (outcome, None),
    };
    let b = surveyed(run, instance.host());
    let Run { events, cancel, .. } = *run;
    let mut outcome = UpOutcome {
        pid: record.handle.pid(),
        recorded: true,
        ..outcome_of(instance)
    };
    outcome.phases.spawn = spawn;
    // Only what this run started is undone after an interrupt.
    let ours = started_here.then(|| record.clone());
    let started = Instant::now();
    // An instance left running by an earlier `up` may still be loading: it is waited for too.
    let waited = tokio::select! {
        _ = cancel.cancelled() => None,
        w = wait_ready(b, instance, &record, health, run, &mut outcome.phases) => Some(w),
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
                    handle: record.handle.clone(),
                });
                outcome.state = UpState::AlreadyRunning;
            }
            let reading = Instant::now();
            let info = server_info(b, instance, &record, run).await;
            outcome.phases.server_info = Some(reading.elapsed());
            match info {
                Ok(info) => outcome.info = Capacity::from(&info),
                Err(e) => tracing::warn!("{}: /server_info: {e}", instance.label()),
            }
        }
        Some(Err(failure)) => {
            let mut reason = failure.to_string();
            if started_here && matches!(failure, Failure::Timeout(_)) {
                // A server that never became ready still holds its GPU.
                down::stop(b, &record, opts.grace).await;
                reason.push_str("; stopped it");
            }
            outcome.log_tail = failure_log(b, &record).await;
            outcome = fail(run, key, outcome, reason);
        }
    }
    (outcome, ours)
}

/// The log that says why a server failed: rank 0's, then that of every other rank whose log
/// ends on a traceback. A rank that fails takes the whole server down, and rank 0's log then
/// shows only that it stopped, while the cause is in the failed rank's own log.
async fn failure_log(b: &dyn Backend, record: &InstanceRecord) -> Option<String> {
    let mut tail = b.log_tail(&record.log, LOG_TAIL_LINES).await.ok();
    for (i, rank) in record.ranks.iter().enumerate() {
        let Ok(theirs) = b.log_tail(&rank.log, LOG_TAIL_LINES).await else {
            continue;
        };
        if theirs.contains("Traceback") || theirs.contains("Error") {
            let mine = tail.get_or_insert_with(String::new);
            mine.push_str(&format!("-- rank {} ({}):\n{theirs}", i + 1, rank.log));
        }
    }
    tail
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
/// passes. While the port is closed it only tries to connect (every [`CLOSED_POLL`]); once the
/// server answers, `/health` is asked quickly at first, then every `health.poll` (at most 1 s),
/// one request at a time. Liveness, a remote command, is checked at most every [`ALIVE_EVERY`].
async fn wait_ready(
    b: &dyn Backend,
    instance: &Instance,
    record: &InstanceRecord,
    health: &HealthSettings,
    run: &Run<'_>,
    phases: &mut Phases,
) -> Result<(), Failure> {
    let tunnel = b.endpoint(&record.address, record.port).await?;
    let client = client(run, instance, &tunnel);
    let started = Instant::now();
    let Phases {
        port_open,
        health_200,
        health_polls,
        alive_checks,
        ..
    } = phases;
    // An error is nothing listening yet (or the tunnel not reaching it): still loading.
    let polling = async {
        let mut opened: Option<Instant> = None;
        let mut waits = poll_waits(health.poll);
        loop {
            *health_polls += 1;
            if let Ok(answer) = client.health().await {
                let now = Instant::now();
                let since = *opened.get_or_insert(now);
                port_open.get_or_insert(since - started);
                if answer == Health::Ready {
                    *health_200 = Some(now - since);
                    return;
                }
            }
            let wait = match opened {
                None => CLOSED_POLL,
                Some(_) => waits.next().unwrap_or(MAX_POLL),
            };
            tokio::time::sleep(wait).await;
        }
    };
    // Beside the polls, not between them: a liveness check is a command on the host (through
    // `pct exec`, most of a second), and a port that opens must not wait for one.
    let watching = async {
        loop {
            *alive_checks += 1;
            match b.alive(record).await {
                Ok(true) => {}
                Ok(false) => return Failure::Died,
                Err(e) => return Failure::from(e),
            }
            tokio::time::sleep(ALIVE_EVERY).await;
        }
    };
    let result = tokio::select! {
        () = polling => Ok(()),
        failure = watching => Err(failure),
        () = tokio::time::sleep(health.startup_timeout) => {
            Err(Failure::Timeout(health.startup_timeout))
        }
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
    b: &dyn Backend,
    instance: &Instance,
    record: &InstanceRecord,
    run: &Run<'_>,
) -> Result<ServerInfo, Box<dyn std::error::Error + Send + Sync>> {
    let tunnel = b.endpoint(&record.address, record.port).await?;
    let info = client(run, instance, &tunnel).server_info().await;
    tunnel.close().await;
    Ok(info?)
}

fn client(run: &Run<'_>, instance: &Instance, tunnel: &Tunnel) -> SglangClient {
    SglangClient::new(
        run.http.clone(),
        Endpoint {
            id: instance.id.clone(),
            base_url: format!("http://{}", tunnel.local_addr()),
            api_key: run.api_key.map(str::to_string),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch::backend::fake::{FakeBackend, record};
    use crate::launch::state::RankRecord;

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

    #[tokio::test]
    async fn a_failed_servers_log_adds_each_rank_whose_own_log_has_the_cause() {
        // The fake answers a log's tail with "the end of PATH".
        let b = FakeBackend::new("hpc", "/tmp/fleet", "127.0.0.1:9".parse().unwrap());
        let mut r = record("hpc", 0, 30000, "f");
        let rank = |log: &str| RankRecord {
            handle: r.handle.clone(),
            log: log.into(),
            pidfile: "/dev/null".into(),
        };
        r.ranks = vec![
            rank("/run/rank1/Traceback.log"),
            rank("/run/rank2/quiet.log"),
        ];
        let tail = failure_log(&b, &r).await.unwrap();
        assert!(tail.starts_with(&format!("the end of {}", r.log)), "{tail}");
        assert!(
            tail.contains("-- rank 1 (/run/rank1/Traceback.log):"),
            "{tail}"
        );
        assert!(
            !tail.contains("quiet"),
            "a rank with no error adds nothing: {tail}"
        );
    }
}
