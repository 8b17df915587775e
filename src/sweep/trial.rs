//! One measurement round on ready servers: saturating streamed load (about 1.25x each server's
//! cap in flight), a warm-up, then a measured window whose client-side token counts, latencies
//! and `/metrics` counters become each candidate's [`Measured`], or the reason it failed.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::load::Workload;
use super::rank::{Measured, Percentiles};
use crate::generate::concurrency::{ConcurrencyMode, saturating};
use crate::generate::core::{
    self, Attempt, Baseline, Core, CoreConfig, Input, ProbeKind, ProbeResult,
};
use crate::generate::drive::{self, Clock, Driver};
use crate::generate::input::Id;
use crate::sglang::client::{
    ClientError, Completion, CompletionRequest, Endpoint, Health, ServerInfo, SglangClient,
};

/// A trial whose requests fail more often than this is a failed row, not a number.
const MAX_ERROR_FRACTION: f64 = 0.05;

/// A ready server of one candidate.
#[derive(Debug, Clone)]
pub struct Server {
    pub label: String,
    pub endpoint: Endpoint,
    /// Effective max running requests.
    pub cap: u32,
    pub kv_tokens: u64,
    /// The mamba strategy the server resolved (`/server_info`).
    pub strategy: Option<String>,
}

impl Server {
    /// What the generation core needs to know of it.
    fn capacity(&self) -> ServerInfo {
        ServerInfo {
            version: None,
            max_total_num_tokens: Some(self.kv_tokens),
            effective_max_running_requests: Some(u64::from(self.cap)),
            max_running_requests: None,
            context_length: None,
            served_model_name: None,
            model_path: None,
            mamba_strategy: self.strategy.clone(),
            raw: serde_json::Value::Null,
        }
    }
}

/// One candidate's servers in a round.
#[derive(Debug, Clone)]
pub struct Group {
    pub servers: Vec<Server>,
    pub startup_s: Option<f64>,
}

#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub warmup: Duration,
    pub duration: Duration,
}

/// Why a candidate's measurement is not a number; `server` names whose log to show.
#[derive(Debug, Clone, PartialEq)]
pub struct TrialFailure {
    pub reason: String,
    pub server: Option<usize>,
}

/// What the closed loop keeps in flight on a server with `cap`.
pub fn in_flight(cap: u32) -> u32 {
    saturating(cap)
}

/// What one server's load saw.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    /// Output tokens that arrived inside the window (streamed chunks).
    pub window_tokens: u64,
    /// Requests that finished inside the window, and their output tokens.
    pub completed: u64,
    pub completed_tokens: u64,
    /// Failed requests over warm-up and window.
    pub errors: u64,
    pub first_error: Option<String>,
    /// A request could not reach the server.
    pub unreachable: bool,
    /// Time to first token of requests whose first token arrived in the window, seconds.
    pub ttft: Vec<f64>,
    /// (seconds per token, tokens) per chunk in the window.
    pub itl: Vec<(f64, u64)>,
}

impl Stats {
    fn merge(&mut self, o: Stats) {
        self.window_tokens += o.window_tokens;
        self.completed += o.completed;
        self.completed_tokens += o.completed_tokens;
        self.errors += o.errors;
        self.first_error = self.first_error.take().or(o.first_error);
        self.unreachable |= o.unreachable;
        self.ttft.extend(o.ttft);
        self.itl.extend(o.itl);
    }

    fn error(&mut self, e: &ClientError) {
        self.errors += 1;
        self.unreachable |= e.is_unreachable();
        if self.first_error.is_none() {
            self.first_error = Some(e.to_string());
        }
    }
}

/// The `q` quantile (0..=1) of weighted values (nearest rank by cumulative weight).
pub fn weighted_quantile(values: &mut [(f64, u64)], q: f64) -> f64 {
    values.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total: u64 = values.iter().map(|v| v.1).sum();
    if total == 0 {
        return 0.0;
    }
    let target = (q * total as f64).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (v, w) in values.iter() {
        seen += w;
        if seen >= target {
            return *v;
        }
    }
    values.last().map_or(0.0, |v| v.0)
}

fn percentiles(values: &mut [(f64, u64)]) -> Option<Percentiles> {
    (!values.is_empty()).then(|| Percentiles {
        p50: weighted_quantile(values, 0.50),
        p99: weighted_quantile(values, 0.99),
    })
}

/// What a server's `/metrics` counter and health said around the window.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerReading {
    /// `sglang:generation_tokens_total` at the window's start and end.
    pub generation_tokens: (Option<f64>, Option<f64>),
    /// `/health` after the window: `Err` with why it is not healthy.
    pub health: Result<(), String>,
}

/// Turns one candidate's stats into its measurement or failure. Pure.
pub fn summarize(
    group: &Group,
    per_server: Vec<(Stats, ServerReading)>,
    duration: Duration,
) -> Result<Measured, TrialFailure> {
    for (i, (stats, reading)) in per_server.iter().enumerate() {
        if let Err(why) = &reading.health {
            return Err(TrialFailure {
                reason: format!(
                    "{} stopped answering mid-trial: {why}",
                    group.servers[i].label
                ),
                server: Some(i),
            });
        }
        if stats.unreachable {
            return Err(TrialFailure {
                reason: format!(
                    "{} stopped answering mid-trial: {}",
                    group.servers[i].label,
                    stats.first_error.as_deref().unwrap_or("connection failed")
                ),
                server: Some(i),
            });
        }
    }
    let metrics_deltas: Option<f64> = per_server
        .iter()
        .map(|(_, r)| match r.generation_tokens {
            (Some(a), Some(b)) => Some(b - a),
            _ => None,
        })
        .sum();
    let worst = per_server
        .iter()
        .enumerate()
        .max_by_key(|(_, (s, _))| s.errors)
        .map(|(i, _)| i);
    let mut all = Stats::default();
    for (s, _) in per_server {
        all.merge(s);
    }
    let secs = duration.as_secs_f64();
    let attempts = all.completed + all.errors;
    if all.errors > 0 && all.errors as f64 > MAX_ERROR_FRACTION * attempts as f64 {
        return Err(TrialFailure {
            reason: format!(
                "{} requests failed ({} finished in the window); first: {}",
                all.errors,
                all.completed,
                all.first_error.as_deref().unwrap_or("?")
            ),
            server: worst,
        });
    }
    if all.window_tokens == 0 {
        return Err(TrialFailure {
            reason: "no output tokens arrived in the measured window".into(),
            server: None,
        });
    }
    let gpus = group.servers.len();
    let output_tok_s = all.window_tokens as f64 / secs;
    let cap = group.servers.iter().map(|s| s.cap).min().unwrap_or(0);
    let mut ttft: Vec<(f64, u64)> = all.ttft.iter().map(|&t| (t, 1)).collect();
    Ok(Measured {
        gpus,
        output_tok_s,
        output_tok_s_per_gpu: output_tok_s / gpus.max(1) as f64,
        req_s: all.completed as f64 / secs,
        completed: all.completed,
        errors: all.errors,
        mean_output_tokens: if all.completed > 0 {
            all.completed_tokens as f64 / all.completed as f64
        } else {
            0.0
        },
        ttft_s: percentiles(&mut ttft),
        itl_s: percentiles(&mut all.itl),
        cap,
        in_flight: in_flight(cap),
        kv_tokens: group.servers.iter().map(|s| s.kv_tokens).min().unwrap_or(0),
        strategy: group.servers.iter().find_map(|s| s.strategy.clone()),
        startup_s: group.startup_s,
        completed_output_tok_s: all.completed_tokens as f64 / secs,
        metrics_output_tok_s: metrics_deltas.map(|d| d / secs),
    })
}

/// Streams the sweep's requests, counting what arrives inside the measured window per server
/// as it arrives (a request cut off at the window's end still counts its tokens).
struct StreamDriver {
    clients: Vec<SglangClient>,
    stats: Vec<Arc<Mutex<Stats>>>,
    window: (Instant, Instant),
    ignore_eos: bool,
}

impl Driver for StreamDriver {
    fn send(&self, inst: usize, req: Arc<CompletionRequest>) -> BoxFuture<'static, Attempt> {
        let client = self.clients[inst].clone();
        let stats = self.stats[inst].clone();
        let (w0, w1) = self.window;
        let ignore_eos = self.ignore_eos;
        async move {
            let in_window = |t: Instant| t >= w0 && t < w1;
            let sent = Instant::now();
            let mut last: Option<(Instant, u64)> = None;
            let on_tokens = |cumulative: u64| {
                let now = Instant::now();
                let delta = cumulative - last.map_or(0, |(_, n)| n);
                if in_window(now) {
                    let mut s = stats.lock().unwrap_or_else(|e| e.into_inner());
                    s.window_tokens += delta;
                    match last {
                        None => s.ttft.push((now - sent).as_secs_f64()),
                        Some((t, _)) => s.itl.push(((now - t).as_secs_f64() / delta as f64, delta)),
                    }
                }
                last = Some((now, cumulative));
            };
            let result = client.stream(&req, ignore_eos, on_tokens).await;
            let mut s = stats.lock().unwrap_or_else(|e| e.into_inner());
            match result {
                Ok(done) => {
                    if in_window(Instant::now()) {
                        s.completed += 1;
                        s.completed_tokens += done.completion_tokens;
                    }
                    Attempt::Finished {
                        completion: Completion {
                            text: String::new(),
                            prompt_tokens: 0,
                            completion_tokens: done.completion_tokens,
                            finish_reason: done.finish_reason,
                        },
                        latency: sent.elapsed(),
                    }
                }
                Err(e) => {
                    s.error(&e);
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
        seed: 0,
    }
}

async fn read_counters(clients: &[SglangClient]) -> Vec<Option<f64>> {
    let reads = clients.iter().map(|c| async move {
        c.metrics()
            .await
            .ok()
            .and_then(|m| m.generation_tokens_total)
    });
    futures::future::join_all(reads).await
}

async fn read_health(clients: &[SglangClient]) -> Vec<Result<(), String>> {
    let reads = clients.iter().map(|c| async move {
        match c.health().await {
            Ok(Health::Ready) => Ok(()),
            Ok(Health::NotReady { status }) => Err(format!("/health answered {status}")),
            Err(e) => Err(e.to_string()),
        }
    });
    futures::future::join_all(reads).await
}

/// Loads every group's servers at once (so that all candidates share one window) through the
/// generation core, warms up, measures for `timing.duration`, and returns each group's result
/// in order. `None` when cancelled; the load is stopped and joined either way.
pub async fn measure(
    groups: &[Group],
    workload: Arc<Workload>,
    http: reqwest::Client,
    timing: Timing,
    cancel: &CancellationToken,
) -> Option<Vec<Result<Measured, TrialFailure>>> {
    let start = Instant::now();
    let w0 = start + timing.warmup;
    let w1 = w0 + timing.duration;
    let servers: Vec<(usize, &Server)> = groups
        .iter()
        .enumerate()
        .flat_map(|(g, group)| group.servers.iter().map(move |s| (g, s)))
        .collect();
    let clients: Vec<SglangClient> = servers
        .iter()
        .map(|(_, s)| SglangClient::new(http.clone(), s.endpoint.clone()))
        .collect();
    let stats: Vec<Arc<Mutex<Stats>>> = servers.iter().map(|_| Arc::default()).collect();
    let mut core = Core::new(
        core_config(timing),
        Baseline::default(),
        servers
            .iter()
            .map(|(_, s)| core::Server {
                name: s.label.clone(),
                url: s.endpoint.base_url.clone(),
                host: None,
                info: Ok(s.capacity()),
            })
            .collect(),
    );
    let driver = StreamDriver {
        clients: clients.clone(),
        stats: stats.clone(),
        window: (w0, w1),
        ignore_eos: workload.ignore_eos,
    };
    let supply = futures::stream::iter((0u64..).map(|i| Input::Request {
        id: Id::line(i),
        req: workload.request(i).clone(),
    }));
    // The load stops when the window closes, or at once on Ctrl-C.
    let stop = cancel.child_token();
    let counters = async {
        let measured = async {
            tokio::time::sleep_until(w0).await;
            let before = read_counters(&clients).await;
            tokio::time::sleep_until(w1).await;
            let after = read_counters(&clients).await;
            (before, after)
        };
        let counters = tokio::select! {
            _ = cancel.cancelled() => None,
            c = measured => Some(c),
        };
        stop.cancel();
        counters
    };
    let load = drive::drive(
        &mut core,
        Clock { start },
        &driver,
        supply,
        futures::stream::pending(),
        &stop,
        |_| Ok(()),
    );
    let (ended, counters) = tokio::join!(load, counters);
    if let Err(e) = ended {
        tracing::error!("the sweep's load failed: {e}");
    }
    let (before, after) = counters?;
    let health = read_health(&clients).await;
    let mut per_group: Vec<Vec<(Stats, ServerReading)>> =
        groups.iter().map(|_| Vec::new()).collect();
    for (k, ((g, _), health)) in servers.iter().zip(health).enumerate() {
        let s = std::mem::take(&mut *stats[k].lock().unwrap_or_else(|e| e.into_inner()));
        let reading = ServerReading {
            generation_tokens: (before[k], after[k]),
            health,
        };
        per_group[*g].push((s, reading));
    }
    Some(
        groups
            .iter()
            .zip(per_group)
            .map(|(group, per_server)| summarize(group, per_server, timing.duration))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(n: usize, cap: u32) -> Group {
        Group {
            servers: (0..n)
                .map(|i| Server {
                    label: format!("local gpu{i} :3000{i}"),
                    endpoint: Endpoint::from_url(&format!("http://127.0.0.1:3000{i}")),
                    cap,
                    kv_tokens: 1000 + i as u64,
                    strategy: Some("no_buffer".into()),
                })
                .collect(),
            startup_s: Some(1.5),
        }
    }

    fn stats(tokens: u64, completed: u64, errors: u64) -> Stats {
        Stats {
            window_tokens: tokens,
            completed,
            completed_tokens: completed * 100,
            errors,
            first_error: (errors > 0).then(|| "HTTP 500".to_string()),
            ttft: vec![0.1, 0.2, 0.3],
            itl: vec![(0.01, 90), (0.05, 10)],
            ..Stats::default()
        }
    }

    fn ok_reading(a: f64, b: f64) -> ServerReading {
        ServerReading {
            generation_tokens: (Some(a), Some(b)),
            health: Ok(()),
        }
    }

    #[test]
    fn measurements_are_per_gpu_over_the_window_with_a_metrics_cross_check() {
        let m = summarize(
            &group(2, 72),
            vec![
                (stats(4000, 20, 0), ok_reading(0.0, 2000.0)),
                (stats(6000, 30, 1), ok_reading(500.0, 3500.0)),
            ],
            Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!(m.gpus, 2);
        assert_eq!(m.output_tok_s, 1000.0);
        assert_eq!(m.output_tok_s_per_gpu, 500.0);
        assert_eq!(m.req_s, 5.0);
        assert_eq!(m.errors, 1);
        assert_eq!(m.mean_output_tokens, 100.0);
        assert_eq!(m.completed_output_tok_s, 500.0);
        assert_eq!(m.metrics_output_tok_s, Some(500.0));
        assert!(!m.metrics_disagree());
        assert_eq!((m.cap, m.in_flight, m.kv_tokens), (72, 90, 1000));
        assert_eq!(m.strategy.as_deref(), Some("no_buffer"));
        let (itl, ttft) = (m.itl_s.unwrap(), m.ttft_s.unwrap());
        assert_eq!((itl.p50, itl.p99), (0.01, 0.05));
        assert_eq!(ttft.p50, 0.2);
        assert_eq!(m.startup_s, Some(1.5));
    }

    #[test]
    fn a_dead_server_or_many_errors_fail_the_trial() {
        let mut dead = stats(100, 1, 3);
        dead.unreachable = true;
        let f = summarize(
            &group(2, 8),
            vec![
                (stats(100, 5, 0), ok_reading(0.0, 1.0)),
                (dead, ok_reading(0.0, 1.0)),
            ],
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert_eq!(f.server, Some(1));
        assert!(
            f.reason
                .starts_with("local gpu1 :30001 stopped answering mid-trial"),
            "{}",
            f.reason
        );
        let f = summarize(
            &group(1, 8),
            vec![(
                stats(100, 10, 0),
                ServerReading {
                    generation_tokens: (None, None),
                    health: Err("connection refused".into()),
                },
            )],
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert!(f.reason.contains("connection refused"));
        let f = summarize(
            &group(1, 8),
            vec![(stats(100, 10, 2), ok_reading(0.0, 1.0))],
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert!(
            f.reason
                .starts_with("2 requests failed (10 finished in the window); first: HTTP 500"),
            "{}",
            f.reason
        );
        let m = summarize(
            &group(1, 8),
            vec![(
                stats(100, 100, 2),
                (ServerReading {
                    generation_tokens: (Some(1.0), None),
                    health: Ok(()),
                }),
            )],
            Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!(m.errors, 2, "a few errors are counted, not fatal");
        assert_eq!(
            m.metrics_output_tok_s, None,
            "a missing scrape gives no cross-check"
        );
    }

    #[test]
    fn weighted_quantiles_and_in_flight() {
        let mut v = vec![(3.0, 1), (1.0, 1), (2.0, 2)];
        assert_eq!(weighted_quantile(&mut v, 0.5), 2.0);
        assert_eq!(weighted_quantile(&mut v, 0.99), 3.0);
        assert_eq!(weighted_quantile(&mut [], 0.5), 0.0);
        assert_eq!(in_flight(72), 90);
        assert_eq!(in_flight(37), 47);
        assert_eq!(in_flight(0), 1);
    }
}
