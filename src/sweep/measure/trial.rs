//! One measurement on ready servers: saturating streamed load (about 1.25x each server's cap
//! in flight, one closed loop per candidate), a warm-up, then a measured window whose
//! client-side token counts (also per bin, for an interval), latencies and `/metrics` counters
//! become each candidate's [`Measured`], or the reason it failed; optionally a first window
//! after which some candidates stop.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::eta::Seen;
use crate::generate::concurrency::ConcurrencyMode;
use crate::generate::core::{
    self, Attempt, Baseline, Core, CoreConfig, Input, ProbeKind, ProbeResult,
};
use crate::generate::drive::{self, Clock, Driver};
use crate::generate::input::Id;
use crate::sglang::client::{ClientError, Completion, CompletionRequest, Health, SglangClient};
use crate::sweep::load::Workload;
use crate::sweep::prune;
use crate::sweep::rank::Measured;
pub use crate::sweep::summary::{Group, Server, TrialFailure};
use crate::sweep::summary::{ServerReading, Stats, Unhealthy, summarize, summarize_first};

#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub warmup: Duration,
    pub duration: Duration,
}

/// Streams the sweep's requests, counting what arrives inside the measured window per server
/// as it arrives (a request cut off at the window's end still counts its tokens).
struct StreamDriver {
    clients: Vec<SglangClient>,
    stats: Vec<Arc<Mutex<Stats>>>,
    window: (Instant, Instant),
    bin: Duration,
    ignore_eos: bool,
}

impl Driver for StreamDriver {
    fn send(
        &self,
        inst: usize,
        req: Arc<CompletionRequest>,
        streamed: Arc<AtomicU64>,
    ) -> BoxFuture<'static, Attempt> {
        let client = self.clients[inst].clone();
        let stats = self.stats[inst].clone();
        let (w0, w1) = self.window;
        let bin = self.bin.as_nanos().max(1);
        let ignore_eos = self.ignore_eos;
        async move {
            let mut unfinished = Unfinished {
                stats: stats.clone(),
                streamed: streamed.clone(),
                ended: false,
            };
            let in_window = |t: Instant| t >= w0 && t < w1;
            let sent = Instant::now();
            let mut last: Option<(Instant, u64)> = None;
            let on_tokens = |cumulative: u64| {
                let now = Instant::now();
                let delta = cumulative - last.map_or(0, |(_, n)| n);
                if in_window(now) {
                    let mut s = stats.lock().unwrap_or_else(|e| e.into_inner());
                    s.window_tokens += delta;
                    s.add_to_bin(((now - w0).as_nanos() / bin) as usize, delta);
                    match last {
                        None => s.ttft.push((now - sent).as_secs_f64()),
                        Some((t, _)) => s.itl.push(((now - t).as_secs_f64() / delta as f64, delta)),
                    }
                }
                last = Some((now, cumulative));
                streamed.store(cumulative, Ordering::Relaxed);
            };
            let result = client.stream(&req, ignore_eos, on_tokens).await;
            let mut s = stats.lock().unwrap_or_else(|e| e.into_inner());
            match result {
                Ok(done) => {
                    unfinished.ended = true;
                    s.lengths.add(Seen::of_answer(
                        done.completion_tokens,
                        done.finish_reason.as_deref(),
                        req.max_tokens,
                    ));
                    if in_window(Instant::now()) {
                        s.completed += 1;
                        s.completed_tokens += done.completion_tokens;
                    }
                    Attempt::Finished {
                        completion: Completion {
                            text: String::new(),
                            reasoning: None,
                            prompt_tokens: 0,
                            completion_tokens: done.completion_tokens,
                            finish_reason: done.finish_reason,
                            body: None,
                            response_id: None,
                            cached_tokens: None,
                        },
                        latency: sent.elapsed(),
                    }
                }
                Err(e) => {
                    // A prompt too long for the context is the dataset's problem, never the
                    // candidate's: the core clamps max_tokens or drops the prompt, as
                    // `fleet generate` does, and the workload notes it for the report.
                    if !matches!(e, ClientError::ContextOverflow { .. }) {
                        s.error(&e);
                    }
                    Attempt::Failed(e)
                }
            }
        }
        .boxed()
    }

    fn probe(&self, inst: usize, kind: ProbeKind) -> BoxFuture<'static, ProbeResult> {
        drive::probe(self.clients[inst].clone(), kind)
    }
}

/// A request that never ended (cut off when its trial stopped, or failed): its length is at
/// least what it streamed, which is what the sweep's length estimate needs of it.
struct Unfinished {
    stats: Arc<Mutex<Stats>>,
    streamed: Arc<AtomicU64>,
    ended: bool,
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        let n = self.streamed.load(Ordering::Relaxed);
        if !self.ended && n > 0 {
            let mut s = self.stats.lock().unwrap_or_else(|e| e.into_inner());
            s.lengths
                .add(Seen::Running(u32::try_from(n).unwrap_or(u32::MAX)));
        }
    }
}

/// The rules of a trial for the generation core: the closed loop (about 1.25x each server's
/// cap in flight), no retries (a failed request is an error of the candidate), no watchdog, and
/// nothing to wait for when the window closes.
fn core_config(timing: Timing) -> CoreConfig {
    let span = timing.warmup + timing.duration;
    CoreConfig {
        api: None,
        max_tokens: 0,
        temperature: None,
        top_p: None,
        concurrency: ConcurrencyMode::Saturate,
        max_retries: 0,
        stall_timeout: span,
        warmup: Duration::MAX,
        abort_below: None,
        grace: Duration::ZERO,
        expected: None,
        timing: crate::generate::Timing::default(),
        files: None,
        seed: 0,
        format: crate::generate::journal::OutputFormat::Fleet,
    }
}

/// `sglang:generation_tokens_total` of every server, per group; `None` for the groups not
/// `wanted`.
async fn read_counters(clients: &[Vec<SglangClient>], wanted: &[bool]) -> Vec<Vec<Option<f64>>> {
    let reads = clients.iter().zip(wanted).map(|(group, wanted)| {
        futures::future::join_all(group.iter().map(|c| async move {
            if !wanted {
                return None;
            }
            c.metrics()
                .await
                .ok()
                .and_then(|m| m.generation_tokens_total)
        }))
    });
    futures::future::join_all(reads).await
}

async fn read_health(clients: &[SglangClient]) -> Vec<Result<(), Unhealthy>> {
    let reads = clients.iter().map(|c| async move {
        match c.health().await {
            Ok(Health::Ready) => Ok(()),
            Ok(Health::NotReady { status }) => Err(Unhealthy::Status(status)),
            Err(e) => Err(Unhealthy::NoAnswer(e.to_string())),
        }
    });
    futures::future::join_all(reads).await
}

/// Successive halving's first window: `length` into the measured window, every group's
/// figures so far go to `decide`, which answers for each whether it goes on (a failed group
/// stops whatever it answers).
pub struct Checkpoint<'a> {
    pub length: Duration,
    #[allow(clippy::type_complexity)]
    pub decide: Box<
        dyn FnOnce(Vec<Result<Measured, TrialFailure>>) -> BoxFuture<'a, Vec<bool>> + Send + 'a,
    >,
}

/// How a group's measurement ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Ended {
    /// Over the full window.
    Measured(Box<Result<Measured, TrialFailure>>),
    /// At the first window, as `decide` was told.
    Stopped,
}

/// Loads every group's servers at once, each group through its own closed loop of the
/// generation core (so that one can stop while the others go on, and every group is sent the
/// same requests in the same order), warms up, measures for `timing.duration` with an
/// optional first window, and returns each group's result in order. `None` when cancelled;
/// the load is stopped and joined either way.
pub async fn measure(
    groups: &[Group],
    workload: Arc<Workload>,
    http: reqwest::Client,
    timing: Timing,
    checkpoint: Option<Checkpoint<'_>>,
    cancel: &CancellationToken,
) -> Option<Vec<Ended>> {
    let bin = prune::bin_width(timing.duration);
    let start = Instant::now();
    let w0 = start + timing.warmup;
    let w1 = w0 + timing.duration;
    let clients: Vec<Vec<SglangClient>> = groups
        .iter()
        .map(|g| {
            g.servers
                .iter()
                .map(|s| SglangClient::new(http.clone(), s.endpoint.clone()))
                .collect()
        })
        .collect();
    let stats: Vec<Vec<Arc<Mutex<Stats>>>> = groups
        .iter()
        .map(|g| g.servers.iter().map(|_| Arc::default()).collect())
        .collect();
    // The load stops when the window closes, or at once on Ctrl-C; a group's alone when it is
    // stopped at the first window.
    let stop = cancel.child_token();
    let group_stops: Vec<CancellationToken> = groups.iter().map(|_| stop.child_token()).collect();
    let loads = groups.iter().enumerate().map(|(g, group)| {
        let mut core = Core::new(
            core_config(timing),
            Baseline::default(),
            group
                .servers
                .iter()
                .map(|s| core::Server {
                    id: s.endpoint.id.clone(),
                    url: s.endpoint.base_url.clone(),
                    info: Ok(s.capacity()),
                })
                .collect(),
        );
        let driver = StreamDriver {
            clients: clients[g].clone(),
            stats: stats[g].clone(),
            window: (w0, w1),
            bin,
            ignore_eos: workload.ignore_eos,
        };
        let seen = workload.clone();
        let workload = workload.clone();
        let supply = futures::stream::iter((0u64..).map(move |i| Input::Request {
            id: Id::line(i),
            req: workload.request(i),
        }));
        let token = group_stops[g].clone();
        async move {
            drive::drive(
                &mut core,
                Clock { start },
                &driver,
                supply,
                futures::stream::pending(),
                &token,
                |out| {
                    seen.observe(&out);
                    Ok(())
                },
            )
            .await
            .map(|_| ())
        }
    });
    let snapshot = |g: usize| -> Vec<Stats> {
        stats[g]
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).clone())
            .collect()
    };
    let controller = async {
        let measured = async {
            tokio::time::sleep_until(w0).await;
            let mut going = vec![true; groups.len()];
            let before = read_counters(&clients, &going).await;
            if let Some(cp) = checkpoint {
                tokio::time::sleep_until(w0 + cp.length).await;
                let screens: Vec<Result<Measured, TrialFailure>> = groups
                    .iter()
                    .enumerate()
                    .map(|(g, group)| {
                        let per_server = snapshot(g)
                            .into_iter()
                            .zip(&before[g])
                            .map(|(s, b)| {
                                let reading = ServerReading {
                                    generation_tokens: (*b, None),
                                    health: Ok(()),
                                };
                                (s, reading)
                            })
                            .collect();
                        summarize_first(group, per_server, cp.length, bin)
                    })
                    .collect();
                let failed: Vec<bool> = screens.iter().map(Result::is_err).collect();
                let verdicts = (cp.decide)(screens).await;
                for (g, go) in going.iter_mut().enumerate() {
                    if failed[g] || !verdicts.get(g).copied().unwrap_or(true) {
                        *go = false;
                        group_stops[g].cancel();
                    }
                }
            }
            // A batch whose every candidate stopped has nothing left to measure.
            if going.iter().any(|g| *g) {
                tokio::time::sleep_until(w1).await;
            }
            let after = read_counters(&clients, &going).await;
            (before, after, going)
        };
        let counters = tokio::select! {
            _ = cancel.cancelled() => None,
            c = measured => Some(c),
        };
        stop.cancel();
        counters
    };
    let (loaded, counters) = tokio::join!(futures::future::join_all(loads), controller);
    let (before, after, going) = counters?;
    let mut healths =
        futures::future::join_all(clients.iter().zip(&going).map(|(c, go)| async move {
            if *go {
                read_health(c).await
            } else {
                Vec::new()
            }
        }))
        .await;
    let mut out = Vec::with_capacity(groups.len());
    for (g, group) in groups.iter().enumerate() {
        if !going[g] {
            out.push(Ended::Stopped);
            continue;
        }
        let per_server = snapshot(g)
            .into_iter()
            .zip(&before[g])
            .zip(&after[g])
            .zip(std::mem::take(&mut healths[g]))
            .map(|(((s, b), a), health)| {
                let reading = ServerReading {
                    generation_tokens: (*b, *a),
                    health,
                };
                (s, reading)
            })
            .collect();
        // A load that broke off measured less than its window: a failed trial, never a figure.
        let result = match &loaded[g] {
            Err(e) => Err(TrialFailure {
                reason: format!("the load failed: {e}"),
                server: None,
            }),
            Ok(()) => summarize(group, per_server, timing.duration, bin),
        };
        out.push(Ended::Measured(Box::new(result)));
    }
    Some(out)
}
