//! Per-instance in-flight limits: fixed, or adaptive from what the server really runs (its
//! request cap, what its KV pool holds, and its own running/queued gauges) so that its batch
//! stays full while its queue stays short but non-empty; and, in every mode, no more than the
//! process's open files leave room for.

use serde::Serialize;

/// `--concurrency auto|N`, or the sweep's closed loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ConcurrencyMode {
    Auto,
    Fixed(u32),
    /// About [`SATURATE_FACTOR`] times the server's cap in flight, never tuned: a sweep trial
    /// holds every server saturated so candidates compare at full load.
    Saturate,
}

/// In-flight requests per server relative to its cap under [`ConcurrencyMode::Saturate`]:
/// enough that the batch stays full while a finished request's replacement is on its way,
/// without a long queue.
pub const SATURATE_FACTOR: f64 = 1.25;

/// What [`ConcurrencyMode::Saturate`] keeps in flight on a server with `cap`.
pub fn saturating(cap: u32) -> u32 {
    ((f64::from(cap) * SATURATE_FACTOR).ceil() as u32).max(1)
}

/// A `--concurrency` that is neither `auto` nor a positive number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--concurrency must be `auto` or a positive number, got {0:?}")]
pub struct BadConcurrency(pub String);

impl std::str::FromStr for ConcurrencyMode {
    type Err = BadConcurrency;
    fn from_str(s: &str) -> Result<Self, BadConcurrency> {
        if s == "auto" {
            return Ok(ConcurrencyMode::Auto);
        }
        match s.parse::<u32>() {
            Ok(n) if n > 0 => Ok(ConcurrencyMode::Fixed(n)),
            _ => Err(BadConcurrency(s.to_string())),
        }
    }
}

/// Used when a server reports neither cap nor KV pool: SGLang's batches rarely go past this
/// without tuning.
const UNKNOWN_CAP_START: u32 = 64;
const UNKNOWN_CAP_MAX: u32 = 1024;

/// What a server says it can hold, from `/server_info`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Capacity {
    /// `effective_max_running_requests_per_dp`. On a dense model this is SGLang's general
    /// request cap (2048–4096, `mem_cache/kv_cache_configurator.py` `resolve_max_num_reqs`),
    /// not what its KV pool holds.
    pub cap: Option<u64>,
    /// `max_total_num_tokens`: the KV pool.
    pub kv_tokens: Option<u64>,
}

/// One `/metrics` reading of the gauges the controller follows.
///
/// SGLang 0.5.23 refreshes `num_running_reqs`, `num_queue_reqs`, `gen_throughput` and
/// `token_usage` together, at a prefill, when idle and every 40 decode steps
/// (`scheduler_components/metrics_reporter.py`), not per scrape: at a few hundred ms a step
/// one refresh is read for 10 s or more. A reading equal in all four to the last one is that
/// same refresh read again; `gen_throughput` is a float over the last interval, so two
/// refreshes almost never agree in it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Gauges {
    pub running: f64,
    pub queued: f64,
    pub gen_throughput: Option<f64>,
    pub token_usage: Option<f64>,
}

/// The in-flight limit of one instance.
#[derive(Debug, Clone, PartialEq)]
pub struct Controller {
    mode: ConcurrencyMode,
    cap: Option<u32>,
    kv_tokens: Option<u64>,
    /// KV tokens one request holds at its end: prompt plus output, estimated.
    tokens_per_request: f64,
    /// Whether that estimate is the observed mean, not the `max_tokens` worst case.
    observed: bool,
    /// This instance's share of the open files left for sockets.
    ceiling: u32,
    /// What the mode wants in flight; the limit is this within the ceiling.
    want: u32,
    /// The last reading acted on.
    last: Option<Gauges>,
}

impl Controller {
    /// `tokens_per_request` is the estimate of prompt + output tokens a request holds;
    /// `ceiling` the most in flight the open-file budget allows (`u32::MAX` for no bound).
    pub fn new(
        mode: ConcurrencyMode,
        capacity: Capacity,
        tokens_per_request: f64,
        ceiling: u32,
    ) -> Self {
        let mut c = Controller {
            mode,
            cap: capacity.cap.map(|c| c.clamp(1, u32::MAX as u64) as u32),
            kv_tokens: capacity.kv_tokens.filter(|k| *k > 0),
            tokens_per_request: tokens_per_request.max(1.0),
            observed: false,
            ceiling: ceiling.max(1),
            want: 1,
            last: None,
        };
        c.want = c.start();
        c
    }

    pub fn limit(&self) -> u32 {
        self.want.min(self.ceiling).max(1)
    }

    /// What this mode would allow now without the open-file budget.
    pub fn wanted(&self) -> u32 {
        self.want
    }

    /// Whether the open-file budget holds this instance below what its mode wants.
    pub fn held_by_budget(&self) -> bool {
        self.want > self.ceiling
    }

    /// How many requests the server runs at once: its cap, or what its KV pool holds when
    /// that is less.
    pub fn fit(&self) -> Option<u32> {
        let by_kv = self
            .kv_tokens
            .map(|k| ((k as f64 / self.tokens_per_request).floor() as u32).max(1));
        match (self.cap, by_kv) {
            (Some(c), Some(k)) => Some(c.min(k)),
            (c, k) => c.or(k),
        }
    }

    fn start(&self) -> u32 {
        match self.mode {
            ConcurrencyMode::Fixed(n) => n,
            ConcurrencyMode::Auto => self.fit().map_or(UNKNOWN_CAP_START, |f| f + margin(f)),
            ConcurrencyMode::Saturate => saturating(self.cap.unwrap_or(1)),
        }
    }

    /// The most auto goes to: twice what the server runs, plus a margin. While what it runs
    /// comes from the `max_tokens` worst case, only its cap bounds: the queue says when it is
    /// full.
    fn max(&self) -> u32 {
        let twice = |f: u32| f.saturating_mul(2).saturating_add(margin(f));
        let by_fit = self.fit().map_or(UNKNOWN_CAP_MAX, twice);
        let most = match self.cap {
            Some(c) if self.kv_tokens.is_some() && !self.observed => twice(c).max(by_fit),
            _ => by_fit,
        };
        most.max(self.start())
    }

    /// The observed mean prompt + output tokens of a request, once requests have finished: the
    /// KV estimate follows what the job really asks, not the `max_tokens` worst case. A
    /// larger fit raises the limit to it at once.
    pub fn set_tokens_per_request(&mut self, tokens: f64) {
        if !(tokens.is_finite() && tokens >= 1.0) {
            return;
        }
        self.tokens_per_request = tokens;
        self.observed = true;
        if self.mode == ConcurrencyMode::Auto {
            self.want = self.want.max(self.start()).min(self.max());
        }
    }

    /// Adjusts the limit from one `/metrics` reading; `in_flight` is what this client has
    /// outstanding there right now. Returns whether the reading was a new one, acted on.
    pub fn observe(&mut self, g: Gauges, in_flight: u32) -> bool {
        if self.mode != ConcurrencyMode::Auto || self.last == Some(g) {
            return false;
        }
        let previous = self.last.replace(g);
        let m = self.fit().map_or(UNKNOWN_CAP_START / 8, margin);
        let below_cap = self.cap.is_none_or(|c| g.running < f64::from(c));
        if g.queued < 1.0 && below_cap && in_flight + 1 >= self.limit() {
            // The server has room and nothing waiting: this client is what holds it back.
            // Multiplicative, so a start from a pessimistic KV estimate catches up in a few
            // readings.
            let step = (self.limit() / 4).max(m / 2).max(1);
            self.want = self.want.saturating_add(step).min(self.max());
        } else if g.queued > f64::from(2 * m) && previous.is_some_and(|p| g.running <= p.running) {
            // Requests wait while the batch has stopped growing: the server is full, and what
            // waits adds latency, not throughput. (While it still grows, the queue is
            // prefill catching up with what was just sent.) Keep what it runs plus a margin.
            let floor = (g.running.round() as u32).saturating_add(m).max(1);
            let excess = (g.queued as u32).saturating_sub(m);
            self.want = self
                .want
                .saturating_sub((excess / 2).max(1))
                .max(floor)
                .min(self.want);
        }
        true
    }
}

/// Descriptors a job holds besides its sockets to the servers: journal shards, progress.json
/// and its temp file, failed/retry files, the lock, the input reader, uploads, the runtime's
/// own, with room to spare.
const FILES_RESERVED: u64 = 64;
/// Per server besides its requests: a forward's listener and the probes' connections.
const FILES_PER_SERVER: u64 = 4;
/// The share of the sockets' room kept for connections opening and closing around the ones in
/// flight: the HTTP pool opens a new connection when a finished one is not back in the pool
/// yet, and a forward's accepted socket lives until the server's side of the channel closes.
/// Filled to the last descriptor, a job measured 2.02 per request, and on a slower machine it
/// ran out (`accept failed: Too many open files`, then progress.json).
const CHURN_DIVISOR: u64 = 8;

/// How many requests the open-file limit leaves room for, over all servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct FileBudget {
    /// The soft `RLIMIT_NOFILE` the run has, after raising it to the hard limit.
    pub open_files_limit: u64,
    /// The most requests in flight over all servers.
    pub max_in_flight: u32,
}

impl FileBudget {
    /// `open_now`: descriptors already open; `servers`: how many the job sends to;
    /// `fds_per_request`: 1 on a direct connection, 2 through fleet's own port forward (the
    /// client's socket and the one the forward accepts).
    pub fn new(limit: u64, open_now: u64, servers: usize, fds_per_request: u32) -> FileBudget {
        let reserve = open_now + FILES_RESERVED + FILES_PER_SERVER * servers as u64;
        let sockets = limit.saturating_sub(reserve);
        let room = (sockets - sockets / CHURN_DIVISOR) / u64::from(fds_per_request.max(1));
        FileBudget {
            open_files_limit: limit,
            max_in_flight: room.clamp(1, u64::from(u32::MAX)) as u32,
        }
    }

    /// One server's share.
    pub fn per_server(&self, servers: usize) -> u32 {
        (self.max_in_flight / servers.max(1) as u32).max(1)
    }
}

/// A small queue so a finishing request is replaced at once: an eighth of the fit, at least 2.
fn margin(fit: u32) -> u32 {
    (fit / 8).max(2)
}

#[cfg(test)]
mod tests;
