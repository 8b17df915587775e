//! The continuous-batching scheduler on a virtual clock: runs the prefill and decode steps that
//! [`Batch`] decides, for the simulated durations the model gives, and delivers tokens to the
//! clients when each step ends.
//!
//! Steps at high time scales are shorter than the timer resolution, so the loop keeps a virtual
//! clock: each step advances it by its scaled duration and the loop sleeps only while the
//! virtual clock is ahead of the wall clock. Oversleeping is then repaid by running the next
//! steps back to back, which keeps throughput exact on average. When idle it awaits new work.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::sim::batch::{Batch, Lengths, Limits, Step};
use crate::sim::log;
use crate::sim::model::Plan;

/// The most the virtual clock may lag the wall clock; beyond it (e.g. after the process was
/// starved of CPU) the lost time is forgiven instead of replayed as a burst.
const MAX_DEBT: Duration = Duration::from_millis(250);
/// Decode steps between `Decode batch` log lines (SGLang's decode_log_interval)...
const DECODE_LOG_STEPS: u64 = 40;
/// ...and the least wall time between two of them, so high time scales do not flood the log.
const MIN_LOG_GAP: Duration = Duration::from_secs(1);
/// Decode steps between checks for clients that went away (their requests are aborted).
const ABORT_CHECK_STEPS: u64 = 32;

/// Live counters, read by `/metrics`, `/server_info` and the fake GPU state.
#[derive(Debug, Default)]
pub struct Metrics {
    pub running: AtomicU64,
    pub queued: AtomicU64,
    pub kv_used: AtomicU64,
    gen_throughput_bits: AtomicU64,
    /// The new-token ratio admission used at the last prefill (metrics_reporter.py sets
    /// `sglang:new_token_ratio` from the prefill's stats).
    new_token_ratio_bits: AtomicU64,
    pub prompt_tokens_total: AtomicU64,
    pub generation_tokens_total: AtomicU64,
    pub requests_total: AtomicU64,
    /// The part of the three counters above from streamed requests (SGLang labels its
    /// counters `is_streaming`).
    pub streamed_prompt_tokens: AtomicU64,
    pub streamed_generation_tokens: AtomicU64,
    pub streamed_requests: AtomicU64,
    /// Prompt tokens served from the radix cache (counted as requests are admitted).
    pub cached_tokens_total: AtomicU64,
    /// Scheduler steps that sent output to the tokenizer side, which is what SGLang's health
    /// check watches (`last_receive_tstamp` in srt/entrypoints/http_server.py).
    pub steps_out: AtomicU64,
}

impl Metrics {
    pub fn gen_throughput(&self) -> f64 {
        f64::from_bits(self.gen_throughput_bits.load(Ordering::Relaxed))
    }

    pub fn new_token_ratio(&self) -> f64 {
        f64::from_bits(self.new_token_ratio_bits.load(Ordering::Relaxed))
    }

    fn set_gen_throughput(&self, v: f64) {
        self.gen_throughput_bits
            .store(v.to_bits(), Ordering::Relaxed);
    }

    /// Counts a finished request: SGLang adds a request's tokens to the counters when it
    /// finishes (`observe_one_finished_request`, srt/observability/metrics_collector.py).
    pub fn finished(&self, prompt: u64, completion: u64, streamed: bool) {
        self.prompt_tokens_total
            .fetch_add(prompt, Ordering::Relaxed);
        self.generation_tokens_total
            .fetch_add(completion, Ordering::Relaxed);
        self.requests_total.fetch_add(1, Ordering::Relaxed);
        if streamed {
            self.streamed_prompt_tokens
                .fetch_add(prompt, Ordering::Relaxed);
            self.streamed_generation_tokens
                .fetch_add(completion, Ordering::Relaxed);
            self.streamed_requests.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Why the scheduler ended a request without running it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Abort {
    /// `--max-queued-requests` was reached when it arrived (srt/managers/scheduler.py
    /// `_abort_on_queued_limit`).
    QueueFull,
}

impl Abort {
    /// The HTTP status SGLang gives it.
    pub fn status(self) -> u16 {
        match self {
            Abort::QueueFull => 503,
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            Abort::QueueFull => "The request queue is full.",
        }
    }
}

/// How far a streamed request has got.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Progress {
    pub generated: u64,
    pub done: bool,
    /// Set with `done` when the scheduler aborted it.
    pub aborted: Option<Abort>,
}

pub enum Reply {
    /// Answered once, when the request finishes, with its completion tokens.
    Once(oneshot::Sender<Result<u64, Abort>>),
    /// Updated after every step that produced a token for it.
    Stream(watch::Sender<Progress>),
}

impl Reply {
    fn is_closed(&self) -> bool {
        match self {
            Reply::Once(tx) => tx.is_closed(),
            Reply::Stream(tx) => tx.is_closed(),
        }
    }

    fn abort(self, why: Abort) {
        // The client may have gone; nothing is owed to it then.
        match self {
            Reply::Once(tx) => {
                let _ = tx.send(Err(why));
            }
            Reply::Stream(tx) => {
                let _ = tx.send(Progress {
                    generated: 0,
                    done: true,
                    aborted: Some(why),
                });
            }
        }
    }
}

/// One generation request, with its lengths already decided.
pub struct Job {
    pub prompt_tokens: u64,
    /// Of them, served from the radix cache: neither prefilled nor held again in the KV pool
    /// (srt/managers/schedule_policy.py `PrefillAdder` counts the prompt less its prefix).
    pub cached_tokens: u64,
    /// Tokens it will generate (≥ 1): its natural length capped by max tokens and context.
    pub output_tokens: u64,
    /// `max_new_tokens` as the request asked, or the room left in the context: what admission
    /// expects it may generate.
    pub max_new_tokens: u64,
    /// Whether it counts toward `--sim-die-after` (the warm-up request does not).
    pub counts: bool,
    /// Whether its tokens reach the metrics counters: not for `/health`'s probe, which SGLang
    /// sends with `log_metrics=False` (srt/entrypoints/http_server.py).
    pub log_metrics: bool,
    pub reply: Reply,
}

/// What the batch carries for each request besides its lengths.
struct Owed {
    counts: bool,
    log_metrics: bool,
    reply: Reply,
}

/// How the scheduler loop ended.
#[derive(Debug, PartialEq, Eq)]
pub enum End {
    Cancelled,
    /// `--sim-die-after` requests completed: the process must crash now.
    Crashed,
}

pub struct Scheduler {
    plan: Arc<Plan>,
    time_scale: f64,
    metrics: Arc<Metrics>,
    die_after: Option<u64>,
    /// `--max-queued-requests`.
    max_queued: Option<u64>,
    batch: Batch<Owed>,
    /// Decode steps run.
    steps: u64,
    completed: u64,
}

impl Scheduler {
    pub fn new(
        plan: Arc<Plan>,
        time_scale: f64,
        metrics: Arc<Metrics>,
        die_after: Option<u64>,
    ) -> Self {
        let settings = &plan.settings;
        let batch = Batch::new(Limits {
            pool: plan.pool_tokens(),
            cap: plan.running_cap(),
            chunk: settings.chunked_prefill_size,
            max_prefill: settings.max_prefill_tokens,
            conservativeness: settings.schedule_conservativeness,
        });
        Scheduler {
            plan,
            time_scale,
            metrics,
            die_after,
            max_queued: None,
            batch,
            steps: 0,
            completed: 0,
        }
    }

    /// With `--max-queued-requests`: a request that arrives to a full waiting queue is aborted.
    pub fn with_max_queued(mut self, max: Option<u64>) -> Self {
        self.max_queued = max;
        self
    }

    /// srt/managers/scheduler.py `_abort_on_queued_limit`: without priority scheduling the
    /// arriving request is the one aborted, with a 503.
    fn enqueue(&mut self, job: Job) {
        if self
            .max_queued
            .is_some_and(|max| self.batch.queued() as u64 + 1 > max)
        {
            job.reply.abort(Abort::QueueFull);
            return;
        }
        let len = Lengths {
            prompt: job.prompt_tokens,
            cached: job.cached_tokens,
            output: job.output_tokens,
            max_new: job.max_new_tokens,
        };
        let owed = Owed {
            counts: job.counts,
            log_metrics: job.log_metrics,
            reply: job.reply,
        };
        self.batch.push(len, owed);
    }

    fn publish(&self) {
        let m = &self.metrics;
        m.running
            .store(self.batch.running() as u64, Ordering::Relaxed);
        m.queued
            .store(self.batch.queued() as u64, Ordering::Relaxed);
        m.kv_used.store(self.batch.kv_used(), Ordering::Relaxed);
    }

    fn token_usage(&self) -> f64 {
        self.batch.kv_used() as f64 / self.plan.pool_tokens().max(1) as f64
    }

    fn finish_due(&mut self) {
        for (len, owed) in self.batch.finished() {
            if owed.log_metrics {
                let streamed = matches!(owed.reply, Reply::Stream(_));
                self.metrics.finished(len.prompt, len.output, streamed);
            }
            if owed.counts {
                self.completed += 1;
            }
            match owed.reply {
                // The client may have gone; nothing is owed to it then.
                Reply::Once(tx) => {
                    let _ = tx.send(Ok(len.output));
                }
                Reply::Stream(tx) => {
                    let _ = tx.send(Progress {
                        generated: len.output,
                        done: true,
                        aborted: None,
                    });
                }
            }
        }
    }

    /// srt/managers/scheduler_components/output_streamer.py `accept`: the first token at
    /// once, then whenever `stream_interval` tokens are unsent (one per decode step here); the
    /// rest go out at finish.
    fn stream(&self, owed: &Owed, generated: u64) {
        if let Reply::Stream(tx) = &owed.reply {
            let interval = self.plan.settings.stream_interval;
            if interval == 1 || generated % interval == 1 {
                let _ = tx.send(Progress {
                    generated,
                    done: false,
                    aborted: None,
                });
            }
        }
    }

    pub async fn run(mut self, mut rx: mpsc::Receiver<Job>, cancel: CancellationToken) -> End {
        let mut clock = Instant::now();
        let mut last_decode_log = Instant::now();
        let mut last_prefill_log: Option<Instant> = None;
        let mut decode_tokens_since_log = 0u64;
        let mut decode_steps_since_log = 0u64;
        let mut back_to_back = 0u32;
        loop {
            loop {
                match rx.try_recv() {
                    Ok(job) => self.enqueue(job),
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => return End::Cancelled,
                }
            }
            let step = if self.batch.is_idle() {
                self.batch.idle();
                None
            } else {
                self.batch.next()
            };
            let Some(step) = step else {
                // Idle, or nothing the pool can take until a request arrives or leaves.
                self.publish();
                tokio::select! {
                    _ = cancel.cancelled() => return End::Cancelled,
                    job = rx.recv() => match job {
                        Some(job) => self.enqueue(job),
                        None => return End::Cancelled,
                    },
                }
                clock = clock.max(Instant::now());
                continue;
            };
            let secs = match &step {
                Step::Prefill { tokens, .. } => self.plan.prefill_secs(*tokens),
                Step::Decode { batch, .. } => self.plan.decode_step_secs(*batch),
            };
            // 0.5.23 refreshes the running/queue/usage gauges at a prefill, when idle and every
            // decode_log_interval decode steps, not per step
            // (srt/managers/scheduler_components/metrics_reporter.py): between refreshes a
            // scrape reads the same numbers again.
            if matches!(step, Step::Prefill { .. }) || self.steps.is_multiple_of(DECODE_LOG_STEPS) {
                self.publish();
            }
            if matches!(step, Step::Prefill { .. }) {
                self.metrics
                    .new_token_ratio_bits
                    .store(self.batch.new_token_ratio().to_bits(), Ordering::Relaxed);
            }
            if let Step::Decode {
                retracted,
                gained,
                ratio_before,
                ..
            } = step
                && retracted > 0
            {
                // srt/managers/scheduler.py `update_running_batch`. A hybrid model's line adds
                // `#mamba_num_gained`, which the sim leaves out: it counts mamba slots only
                // for the cap, not per request.
                log::tp0(&format!(
                    "KV cache pool is full. Retract requests. #retracted_reqs: {retracted}, \
                     #new_tokens_gained: {gained}, #new_token_ratio: {ratio_before:.4} -> {:.4}",
                    self.batch.new_token_ratio()
                ));
            }
            clock += Duration::from_secs_f64(secs / self.time_scale);
            let now = Instant::now();
            if clock > now {
                back_to_back = 0;
                tokio::select! {
                    _ = cancel.cancelled() => return End::Cancelled,
                    _ = tokio::time::sleep_until(clock) => {}
                }
            } else {
                clock = clock.max(now - MAX_DEBT);
                back_to_back += 1;
                if back_to_back.is_multiple_of(64) {
                    tokio::task::yield_now().await;
                }
            }
            self.metrics.steps_out.fetch_add(1, Ordering::Release);
            match step {
                Step::Prefill {
                    ids,
                    tokens,
                    cached,
                    chunks,
                } => {
                    for id in &ids {
                        if let Some((owed, generated)) = self.batch.get(*id) {
                            self.stream(owed, generated);
                        }
                    }
                    self.finish_due();
                    // SGLang logs every prefill batch, each chunk too; sped up, that would
                    // flood the log.
                    let gap = if self.time_scale > 1.0 {
                        MIN_LOG_GAP
                    } else {
                        Duration::ZERO
                    };
                    if last_prefill_log.is_none_or(|t| t.elapsed() >= gap) {
                        last_prefill_log = Some(Instant::now());
                        log::tp0(&format!(
                            "Prefill batch, #new-seq: {}, #new-token: {tokens}, #cached-token: {cached}, \
                             token usage: {:.2}, #running-req: {}, #queue-req: {}",
                            ids.len() as u64 + chunks,
                            self.token_usage(),
                            self.batch.running(),
                            self.batch.queued()
                        ));
                    }
                }
                Step::Decode { batch, .. } => {
                    decode_tokens_since_log += batch;
                    decode_steps_since_log += 1;
                    self.steps += 1;
                    self.batch.decoded();
                    for (_, owed, generated) in self.batch.each_running() {
                        self.stream(owed, generated);
                    }
                    let (kv, usage) = (self.batch.kv_used(), self.token_usage());
                    self.finish_due();
                    if self.steps.is_multiple_of(ABORT_CHECK_STEPS) {
                        self.batch.drop_gone(|owed| owed.reply.is_closed());
                    }
                    if decode_steps_since_log >= DECODE_LOG_STEPS
                        && last_decode_log.elapsed() >= MIN_LOG_GAP
                    {
                        let rate = decode_tokens_since_log as f64
                            / last_decode_log.elapsed().as_secs_f64();
                        self.metrics.set_gen_throughput(rate);
                        log::tp0(&format!(
                            "Decode batch, #running-req: {batch}, #token: {kv}, token usage: \
                             {usage:.2}, gen throughput (token/s): {rate:.2}, #queue-req: {}",
                            self.batch.queued()
                        ));
                        last_decode_log = Instant::now();
                        decode_tokens_since_log = 0;
                        decode_steps_since_log = 0;
                    }
                }
            }
            if self.die_after.is_some_and(|n| self.completed >= n) {
                return End::Crashed;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::model::tests::settings;
    use crate::sim::model::{Params, Settings, Strategy, plan};

    fn test_plan(max_running: Option<u64>) -> Arc<Plan> {
        let settings = Settings {
            max_running_requests: max_running,
            ..settings(Strategy::NoBuffer)
        };
        Arc::new(plan(&Params::default(), &settings).unwrap())
    }

    fn job(output: u64) -> (Job, oneshot::Receiver<Result<u64, Abort>>) {
        let (tx, rx) = oneshot::channel();
        (
            Job {
                prompt_tokens: 100,
                cached_tokens: 0,
                output_tokens: output,
                max_new_tokens: output,
                counts: true,
                log_metrics: true,
                reply: Reply::Once(tx),
            },
            rx,
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_takes_prefill_plus_decode_steps_on_the_virtual_clock() {
        let plan = test_plan(None);
        let metrics = Arc::new(Metrics::default());
        let (tx, rx) = mpsc::channel(16);
        let cancel = CancellationToken::new();
        let sched = Scheduler::new(plan.clone(), 1.0, metrics.clone(), None);
        let handle = tokio::spawn(sched.run(rx, cancel.clone()));
        let start = Instant::now();
        let (j, done) = job(11);
        tx.send(j).await.unwrap();
        assert_eq!(done.await.unwrap(), Ok(11));
        let expected = plan.prefill_secs(100) + 10.0 * plan.decode_step_secs(1);
        let took = start.elapsed().as_secs_f64();
        assert!((took - expected).abs() < 0.002, "{took} vs {expected}");
        assert_eq!(metrics.generation_tokens_total.load(Ordering::Relaxed), 11);
        cancel.cancel();
        assert_eq!(handle.await.unwrap(), End::Cancelled);
    }

    /// `--stream-interval 10`: the first token at once, then one update per 10 tokens, then
    /// the rest at finish; every token is delivered.
    #[tokio::test(start_paused = true)]
    async fn a_stream_hears_the_first_token_then_every_interval() {
        let settings = Settings {
            stream_interval: 10,
            cuda_graph_max_bs: Some(crate::sim::model::DEFAULT_CUDA_GRAPH_MAX_BS),
            page_size: None,
            ..settings(Strategy::NoBuffer)
        };
        let plan = Arc::new(plan(&Params::default(), &settings).unwrap());
        let (tx, rx) = mpsc::channel(16);
        let cancel = CancellationToken::new();
        let sched = Scheduler::new(plan, 1.0, Arc::new(Metrics::default()), None);
        let handle = tokio::spawn(sched.run(rx, cancel.clone()));
        let (ptx, mut progress) = watch::channel(Progress::default());
        tx.send(Job {
            prompt_tokens: 100,
            cached_tokens: 0,
            output_tokens: 41,
            max_new_tokens: 41,
            counts: true,
            log_metrics: true,
            reply: Reply::Stream(ptx),
        })
        .await
        .unwrap();
        let mut seen = Vec::new();
        while progress.changed().await.is_ok() {
            let p = *progress.borrow_and_update();
            seen.push((p.generated, p.done));
            if p.done {
                break;
            }
        }
        assert_eq!(
            seen,
            [
                (1, false),
                (11, false),
                (21, false),
                (31, false),
                (41, true)
            ]
        );
        cancel.cancel();
        handle.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn requests_beyond_the_cap_queue_and_die_after_crashes() {
        let plan = test_plan(Some(2));
        let metrics = Arc::new(Metrics::default());
        let (tx, rx) = mpsc::channel(16);
        let cancel = CancellationToken::new();
        let sched = Scheduler::new(plan, 1.0, metrics.clone(), Some(3));
        let handle = tokio::spawn(sched.run(rx, cancel.clone()));
        let mut waits = Vec::new();
        for _ in 0..3 {
            let (j, done) = job(50);
            tx.send(j).await.unwrap();
            waits.push(done);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(metrics.running.load(Ordering::Relaxed), 2);
        assert_eq!(metrics.queued.load(Ordering::Relaxed), 1);
        for w in waits {
            assert_eq!(w.await.unwrap(), Ok(50));
        }
        assert_eq!(handle.await.unwrap(), End::Crashed);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_arriving_to_a_full_queue_is_aborted_with_a_503() {
        let plan = test_plan(Some(1));
        let metrics = Arc::new(Metrics::default());
        let (tx, rx) = mpsc::channel(16);
        let cancel = CancellationToken::new();
        let sched = Scheduler::new(plan, 1.0, metrics.clone(), None).with_max_queued(Some(1));
        let handle = tokio::spawn(sched.run(rx, cancel.clone()));
        // All three reach the scheduler before its next step, as one batch of input does:
        // the first waits in the queue, so the other two find it full.
        let mut waits = Vec::new();
        for _ in 0..3 {
            let (j, done) = job(20);
            tx.send(j).await.unwrap();
            waits.push(done);
        }
        let mut results = Vec::new();
        for w in waits {
            results.push(w.await.unwrap());
        }
        assert_eq!(
            results,
            [Ok(20), Err(Abort::QueueFull), Err(Abort::QueueFull)]
        );
        assert_eq!(metrics.requests_total.load(Ordering::Relaxed), 1);
        cancel.cancel();
        handle.await.unwrap();
    }
}
