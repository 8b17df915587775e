//! One measurement round on ready servers: saturating streamed load (about 1.25x each server's
//! cap in flight), a warm-up, then a measured window whose client-side token counts, latencies
//! and `/metrics` counters become each candidate's [`Measured`], or the reason it failed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::load::Workload;
use super::rank::{Measured, Percentiles};
use crate::sglang::client::{ClientError, Endpoint, Health, SglangClient};
use crate::sglang::stream;

/// In-flight requests per server relative to its cap: enough that the batch stays full while a
/// finished request's replacement is on its way, without a long queue.
pub const IN_FLIGHT_FACTOR: f64 = 1.25;
/// A trial whose requests fail more often than this is a failed row, not a number.
const MAX_ERROR_FRACTION: f64 = 0.05;
/// Pause after a connection failure so that a dead server does not spin its workers.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

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

pub fn in_flight(cap: u32) -> u32 {
    ((f64::from(cap) * IN_FLIGHT_FACTOR).ceil() as u32).max(1)
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

/// Everything a load worker shares.
struct Shared {
    http: reqwest::Client,
    workload: Arc<Workload>,
    next: AtomicU64,
    window: (Instant, Instant),
    stop: CancellationToken,
}

/// Keeps one request in flight until stopped.
async fn worker(shared: Arc<Shared>, endpoint: Endpoint) -> Stats {
    let (w0, w1) = shared.window;
    let in_window = |t: Instant| t >= w0 && t < w1;
    let mut s = Stats::default();
    while !shared.stop.is_cancelled() {
        let i = shared.next.fetch_add(1, Ordering::Relaxed);
        let req = shared.workload.request(i);
        let sent = Instant::now();
        let mut last: Option<(Instant, u64)> = None;
        let (mut tokens, mut ttft, mut itl) = (0u64, None, Vec::new());
        let on_tokens = |cumulative: u64| {
            let now = Instant::now();
            let delta = cumulative - last.map_or(0, |(_, n)| n);
            if in_window(now) {
                tokens += delta;
                match last {
                    None => ttft = Some((now - sent).as_secs_f64()),
                    Some((t, _)) => itl.push(((now - t).as_secs_f64() / delta as f64, delta)),
                }
            }
            last = Some((now, cumulative));
        };
        let result = tokio::select! {
            _ = shared.stop.cancelled() => None,
            r = stream::stream(&shared.http, &endpoint, req, shared.workload.ignore_eos, on_tokens) => Some(r),
        };
        s.window_tokens += tokens;
        s.ttft.extend(ttft);
        s.itl.extend(itl);
        match result {
            None => break,
            Some(Ok(done)) => {
                if in_window(Instant::now()) {
                    s.completed += 1;
                    s.completed_tokens += done.completion_tokens;
                }
            }
            Some(Err(e)) => {
                s.error(&e);
                if e.is_unreachable() {
                    tokio::select! {
                        _ = shared.stop.cancelled() => break,
                        _ = tokio::time::sleep(RETRY_PAUSE) => {}
                    }
                }
            }
        }
    }
    s
}

async fn read_counters(http: &reqwest::Client, servers: &[&Server]) -> Vec<Option<f64>> {
    let reads = servers.iter().map(|s| async move {
        let client = SglangClient::new(http.clone(), s.endpoint.clone());
        client
            .metrics()
            .await
            .ok()
            .and_then(|m| m.generation_tokens_total)
    });
    futures::future::join_all(reads).await
}

async fn read_health(http: &reqwest::Client, servers: &[&Server]) -> Vec<Result<(), String>> {
    let reads = servers.iter().map(|s| async move {
        let client = SglangClient::new(http.clone(), s.endpoint.clone());
        match client.health().await {
            Ok(Health::Ready) => Ok(()),
            Ok(Health::NotReady { status }) => Err(format!("/health answered {status}")),
            Err(e) => Err(e.to_string()),
        }
    });
    futures::future::join_all(reads).await
}

/// Loads every group's servers at once (so that all candidates share one window), warms up,
/// measures for `timing.duration`, and returns each group's result in order. `None` when
/// cancelled; the load is stopped and joined either way.
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
    let shared = Arc::new(Shared {
        http: http.clone(),
        workload,
        next: AtomicU64::new(0),
        window: (w0, w1),
        stop: cancel.child_token(),
    });
    let servers: Vec<(usize, usize, &Server)> = groups
        .iter()
        .enumerate()
        .flat_map(|(g, group)| {
            group
                .servers
                .iter()
                .enumerate()
                .map(move |(i, s)| (g, i, s))
        })
        .collect();
    let mut tasks = JoinSet::new();
    for (k, (_, _, server)) in servers.iter().enumerate() {
        for _ in 0..in_flight(server.cap) {
            let (shared, endpoint) = (shared.clone(), server.endpoint.clone());
            tasks.spawn(async move { (k, worker(shared, endpoint).await) });
        }
    }
    let flat: Vec<&Server> = servers.iter().map(|(_, _, s)| *s).collect();
    let completed = async {
        tokio::time::sleep_until(w0).await;
        let before = read_counters(&http, &flat).await;
        tokio::time::sleep_until(w1).await;
        let after = read_counters(&http, &flat).await;
        (before, after)
    };
    let counters = tokio::select! {
        _ = cancel.cancelled() => None,
        c = completed => Some(c),
    };
    shared.stop.cancel();
    let mut stats = vec![Stats::default(); flat.len()];
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((k, s)) => stats[k].merge(s),
            Err(e) => tracing::error!("a load task failed: {e}"),
        }
    }
    let (before, after) = counters?;
    let health = read_health(&http, &flat).await;
    let readings = health
        .into_iter()
        .enumerate()
        .map(|(k, health)| ServerReading {
            generation_tokens: (before[k], after[k]),
            health,
        });
    let mut per_group: Vec<Vec<(Stats, ServerReading)>> =
        groups.iter().map(|_| Vec::new()).collect();
    for ((g, _, _), (s, r)) in servers.iter().zip(stats.into_iter().zip(readings)) {
        per_group[*g].push((s, r));
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
