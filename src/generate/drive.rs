//! The async loop around the [`Core`]: it runs the core's requests and probes as joined tasks,
//! feeds it input while it has room, wakes it when it asked to be woken, and passes cancellation
//! on. What a request or probe is (a plain completion, a streamed one) is the [`Driver`]'s, and
//! what becomes of journal lines, events and progress is the caller's `sink`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rustc_hash::FxHashMap;

use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use super::core::{
    Action, Attempt, Core, End, Input, ProbeKind, ProbeResult, ReqId, ReviveError, Time,
};
use super::journal::Entry;
use super::progress::Progress;
use super::{Event, GenerateError};
use crate::sglang::client::{CompletionRequest, Health, SglangClient};

/// How the shell reaches the servers.
pub trait Driver {
    /// Sends `req` to instance `inst`, keeping `streamed` at the output tokens received so far
    /// (a driver that does not stream leaves it at 0).
    fn send(
        &self,
        inst: usize,
        req: Arc<CompletionRequest>,
        streamed: Arc<AtomicU64>,
    ) -> BoxFuture<'static, Attempt>;
    /// Asks instance `inst`.
    fn probe(&self, inst: usize, kind: ProbeKind) -> BoxFuture<'static, ProbeResult>;
}

/// What the core produced for the caller.
#[derive(Debug)]
pub enum Output {
    Write(Entry),
    Event(Event),
    Progress(Progress),
}

/// The run's clock: the core sees time as the duration since `start`.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    pub start: Instant,
}

impl Clock {
    pub fn now(&self) -> Time {
        self.start.elapsed()
    }
}

/// Runs `core` until it finishes. `feed` yields its input (lines or requests) and is read only
/// while the core has room; `events` yields inputs taken whenever they come (uploads). Every
/// task is joined before it returns, on every path.
pub async fn drive<D: Driver>(
    core: &mut Core,
    clock: Clock,
    driver: &D,
    mut feed: impl Stream<Item = Input> + Unpin,
    mut events: impl Stream<Item = Input> + Unpin,
    cancel: &CancellationToken,
    mut sink: impl FnMut(Output) -> Result<(), GenerateError>,
) -> Result<End, GenerateError> {
    let instances = core.instances().len();
    let mut run = Tasks {
        requests: JoinSet::new(),
        probes: JoinSet::new(),
        aborts: (0..instances).map(|_| CancellationToken::new()).collect(),
        streams: FxHashMap::default(),
    };
    let result = async {
        let mut cancel_seen = false;
        let mut pending = core.on(clock.now(), Input::Tick);
        loop {
            for action in pending.drain(..) {
                if let Some(end) = run.execute(action, driver, &mut sink)? {
                    return Ok(end);
                }
            }
            // Lines that are already read go in without a trip through `select!`.
            if core.wants_input()
                && let Some(next) = feed.next().now_or_never()
            {
                pending = run.step(core, clock.now(), next.unwrap_or(Input::InputEnd));
                continue;
            }
            let wake = core.next_wake().map(|t| clock.start + t);
            let input = tokio::select! {
                biased;
                _ = cancel.cancelled(), if !cancel_seen => {
                    cancel_seen = true;
                    Input::Cancel
                }
                Some(joined) = run.requests.join_next() => match joined {
                    Ok(Some((id, attempt))) => {
                        run.streams.remove(&id);
                        Input::Done { id, attempt }
                    }
                    // Dropped with its instance: the core took its job back already.
                    Ok(None) => continue,
                    Err(e) => return Err(GenerateError::Task(e)),
                },
                Some(joined) = run.probes.join_next() => match joined {
                    Ok((inst, result)) => Input::Probe { inst, result },
                    Err(e) => return Err(GenerateError::Task(e)),
                },
                next = feed.next(), if core.wants_input() => next.unwrap_or(Input::InputEnd),
                Some(e) = events.next() => e,
                _ = sleep_until(wake.unwrap_or_else(Instant::now)), if wake.is_some() => Input::Tick,
            };
            pending = run.step(core, clock.now(), input);
        }
    }
    .await;
    run.shutdown().await;
    result
}

struct Tasks {
    requests: JoinSet<Option<(ReqId, Attempt)>>,
    probes: JoinSet<(usize, ProbeResult)>,
    /// Per instance: cancelled (and replaced) when the core takes its requests back.
    aborts: Vec<CancellationToken>,
    /// What each request in flight has streamed so far, and its instance.
    streams: FxHashMap<ReqId, (usize, Arc<AtomicU64>)>,
}

impl Tasks {
    /// Carries out one action; `Some` when the core has finished.
    fn execute<D: Driver>(
        &mut self,
        action: Action,
        driver: &D,
        sink: &mut impl FnMut(Output) -> Result<(), GenerateError>,
    ) -> Result<Option<End>, GenerateError> {
        match action {
            Action::Send { id, inst, req } => {
                let abort = self.aborts[inst].clone();
                let streamed = Arc::new(AtomicU64::new(0));
                self.streams.insert(id, (inst, streamed.clone()));
                let sent = driver.send(inst, req, streamed);
                self.requests.spawn(async move {
                    tokio::select! {
                        _ = abort.cancelled() => None,
                        attempt = sent => Some((id, attempt)),
                    }
                });
            }
            Action::Abort(inst) => {
                self.streams.retain(|_, (i, _)| *i != inst);
                self.aborts[inst].cancel();
                self.aborts[inst] = CancellationToken::new();
            }
            Action::Probe { inst, kind } => {
                let probe = driver.probe(inst, kind);
                self.probes.spawn(probe.map(move |r| (inst, r)));
            }
            Action::Write(e) => sink(Output::Write(e))?,
            Action::Event(e) => sink(Output::Event(e))?,
            Action::Progress(p) => sink(Output::Progress(p))?,
            Action::Finish(end) => return Ok(Some(end)),
        }
        Ok(None)
    }

    /// Hands `input` to the core. Periodic work (rates, progress) that falls due is done on
    /// whichever input comes first, so the core first learns what has streamed by now: a
    /// snapshot with counts a tick old would hold a request that just ended as longer than
    /// those still running beside it.
    fn step(&self, core: &mut Core, now: Time, input: Input) -> Vec<Action> {
        if core.next_wake().is_none_or(|w| w > now) {
            return core.on(now, input);
        }
        let mut out = core.on(now, Input::Streamed(self.streamed()));
        if !matches!(input, Input::Tick) {
            out.extend(core.on(now, input));
        }
        out
    }

    /// The output tokens each request in flight has streamed so far.
    fn streamed(&self) -> Vec<(ReqId, u64)> {
        self.streams
            .iter()
            .map(|(id, (_, n))| (*id, n.load(Ordering::Relaxed)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// Drops what is still in flight (unwritten: a resume sends it again) and joins every task.
    async fn shutdown(mut self) {
        for a in &self.aborts {
            a.cancel();
        }
        self.requests.shutdown().await;
        self.probes.shutdown().await;
    }
}

/// Asks one server what `kind` wants to know.
pub fn probe(client: SglangClient, kind: ProbeKind) -> BoxFuture<'static, ProbeResult> {
    async move {
        match kind {
            ProbeKind::Metrics => ProbeResult::Metrics(client.metrics().await),
            ProbeKind::Alive => ProbeResult::Alive(client.server_info().await.map(|_| ())),
            ProbeKind::Revive => ProbeResult::Revive(match client.health().await {
                Ok(Health::Ready) => client.server_info().await.map_err(ReviveError::from),
                Ok(Health::NotReady { status }) => Err(ReviveError::NotReady { status }),
                Err(e) => Err(e.into()),
            }),
        }
    }
    .boxed()
}
