//! The continuous-batching scheduler on a virtual clock: admits queued requests up to the
//! effective cap and the KV budget, runs prefill and decode steps whose simulated durations
//! come from the model, and delivers tokens when each step ends.
//!
//! Steps at high time scales are shorter than the timer resolution, so the loop keeps a virtual
//! clock: each step advances it by its scaled duration and the loop sleeps only while the
//! virtual clock is ahead of the wall clock. Oversleeping is then repaid by running the next
//! steps back to back, which keeps throughput exact on average. When idle it awaits new work.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

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
    /// Tokens it will generate (≥ 1): its natural length capped by max tokens and context.
    pub output_tokens: u64,
    /// Whether it counts toward `--sim-die-after` (the warm-up request does not).
    pub counts: bool,
    /// Whether its tokens reach the metrics counters: not for `/health`'s probe, which SGLang
    /// sends with `log_metrics=False` (srt/entrypoints/http_server.py).
    pub log_metrics: bool,
    pub reply: Reply,
}

struct Running {
    job: Job,
    /// Decode steps completed when it was admitted.
    admit_step: u64,
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
    queue: VecDeque<Job>,
    running: HashMap<u64, Running>,
    finish_at: BinaryHeap<Reverse<(u64, u64)>>,
    streaming: Vec<u64>,
    next_id: u64,
    steps: u64,
    /// Σ(prompt + 1 − admit_step) over running requests: KV in use is this + n × steps.
    kv_base: i64,
    /// Σ(prompt + output) over running requests, reserved at admission.
    kv_reserved: u64,
    completed: u64,
}

enum Work {
    Prefill { ids: Vec<u64>, tokens: u64 },
    Decode,
}

impl Scheduler {
    pub fn new(
        plan: Arc<Plan>,
        time_scale: f64,
        metrics: Arc<Metrics>,
        die_after: Option<u64>,
    ) -> Self {
        Scheduler {
            plan,
            time_scale,
            metrics,
            die_after,
            max_queued: None,
            queue: VecDeque::new(),
            running: HashMap::new(),
            finish_at: BinaryHeap::new(),
            streaming: Vec::new(),
            next_id: 0,
            steps: 0,
            kv_base: 0,
            kv_reserved: 0,
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
            .is_some_and(|max| self.queue.len() as u64 + 1 > max)
        {
            job.reply.abort(Abort::QueueFull);
        } else {
            self.queue.push_back(job);
        }
    }

    fn kv_used(&self) -> u64 {
        (self.kv_base + self.running.len() as i64 * self.steps as i64).max(0) as u64
    }

    fn publish(&self) {
        let m = &self.metrics;
        m.running
            .store(self.running.len() as u64, Ordering::Relaxed);
        m.queued.store(self.queue.len() as u64, Ordering::Relaxed);
        m.kv_used.store(self.kv_used(), Ordering::Relaxed);
    }

    fn token_usage(&self) -> f64 {
        self.kv_used() as f64 / self.plan.max_total_num_tokens.max(1) as f64
    }

    /// FCFS admission: up to the cap, the KV budget and max_prefill_tokens per batch.
    fn admit(&mut self) -> Option<Work> {
        let mut ids = Vec::new();
        let mut tokens = 0;
        while let Some(job) = self.queue.front() {
            if job.reply.is_closed() {
                self.queue.pop_front();
                continue;
            }
            let need = job.prompt_tokens + job.output_tokens;
            let fits_kv = self.kv_reserved + need <= self.plan.max_total_num_tokens;
            let fits_batch = ids.is_empty()
                || tokens + job.prompt_tokens <= self.plan.settings.max_prefill_tokens;
            if self.running.len() as u64 >= self.plan.cap
                || !fits_batch
                || !(fits_kv || self.running.is_empty())
            {
                break;
            }
            let job = self.queue.pop_front()?;
            tokens += job.prompt_tokens;
            let id = self.next_id;
            self.next_id += 1;
            self.kv_base += job.prompt_tokens as i64 + 1 - self.steps as i64;
            self.kv_reserved += need;
            self.finish_at
                .push(Reverse((self.steps + job.output_tokens - 1, id)));
            if matches!(job.reply, Reply::Stream(_)) {
                self.streaming.push(id);
            }
            self.running.insert(
                id,
                Running {
                    job,
                    admit_step: self.steps,
                },
            );
            ids.push(id);
        }
        (!ids.is_empty()).then_some(Work::Prefill { ids, tokens })
    }

    fn remove(&mut self, id: u64) -> Option<Running> {
        let r = self.running.remove(&id)?;
        self.kv_base -= r.job.prompt_tokens as i64 + 1 - r.admit_step as i64;
        self.kv_reserved -= r.job.prompt_tokens + r.job.output_tokens;
        if matches!(r.job.reply, Reply::Stream(_)) {
            self.streaming.retain(|s| *s != id);
        }
        Some(r)
    }

    fn finish_due(&mut self) {
        while let Some(Reverse((step, id))) = self.finish_at.peek().copied() {
            if step > self.steps {
                break;
            }
            self.finish_at.pop();
            let Some(r) = self.remove(id) else { continue };
            let out = r.job.output_tokens;
            if r.job.log_metrics {
                let streamed = matches!(r.job.reply, Reply::Stream(_));
                self.metrics.finished(r.job.prompt_tokens, out, streamed);
            }
            if r.job.counts {
                self.completed += 1;
            }
            match r.job.reply {
                // The client may have gone; nothing is owed to it then.
                Reply::Once(tx) => {
                    let _ = tx.send(Ok(out));
                }
                Reply::Stream(tx) => {
                    let _ = tx.send(Progress {
                        generated: out,
                        done: true,
                        aborted: None,
                    });
                }
            }
        }
    }

    fn stream_progress(&self, ids: &[u64]) {
        for id in ids {
            if let Some(r) = self.running.get(id)
                && let Reply::Stream(tx) = &r.job.reply
            {
                let generated = 1 + self.steps - r.admit_step;
                // srt/managers/scheduler_components/output_streamer.py `accept`: the first token
                // at once, then whenever `stream_interval` tokens are unsent (one per decode
                // step here); the rest go out at finish.
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
    }

    fn abort_disconnected(&mut self) {
        let gone: Vec<u64> = self
            .running
            .iter()
            .filter(|(_, r)| r.job.reply.is_closed())
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.remove(id);
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
            if self.running.is_empty() && self.queue.is_empty() {
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
            }
            let work = match self.admit() {
                Some(w) => w,
                None if self.running.is_empty() => continue,
                None => Work::Decode,
            };
            let secs = match &work {
                Work::Prefill { tokens, .. } => self.plan.prefill_secs(*tokens),
                Work::Decode => self.plan.decode_step_secs(self.running.len() as u64),
            };
            // 0.5.23 refreshes the running/queue/usage gauges at a prefill, when idle and every
            // decode_log_interval decode steps, not per step
            // (srt/managers/scheduler_components/metrics_reporter.py): between refreshes a
            // scrape reads the same numbers again.
            if matches!(work, Work::Prefill { .. }) || self.steps.is_multiple_of(DECODE_LOG_STEPS) {
                self.publish();
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
            match work {
                Work::Prefill { ids, tokens } => {
                    self.stream_progress(&ids);
                    self.finish_due();
                    if last_prefill_log.is_none_or(|t| t.elapsed() >= MIN_LOG_GAP) {
                        last_prefill_log = Some(Instant::now());
                        log::tp0(&format!(
                            "Prefill batch, #new-seq: {}, #new-token: {tokens}, #cached-token: 0, \
                             token usage: {:.2}, #running-req: {}, #queue-req: {}",
                            ids.len(),
                            self.token_usage(),
                            self.running.len(),
                            self.queue.len()
                        ));
                    }
                }
                Work::Decode => {
                    decode_tokens_since_log += self.running.len() as u64;
                    decode_steps_since_log += 1;
                    self.steps += 1;
                    let streaming = std::mem::take(&mut self.streaming);
                    self.stream_progress(&streaming);
                    self.streaming = streaming;
                    let (running, kv, usage) =
                        (self.running.len(), self.kv_used(), self.token_usage());
                    self.finish_due();
                    if self.steps.is_multiple_of(ABORT_CHECK_STEPS) {
                        self.abort_disconnected();
                    }
                    if decode_steps_since_log >= DECODE_LOG_STEPS
                        && last_decode_log.elapsed() >= MIN_LOG_GAP
                    {
                        let rate = decode_tokens_since_log as f64
                            / last_decode_log.elapsed().as_secs_f64();
                        self.metrics.set_gen_throughput(rate);
                        log::tp0(&format!(
                            "Decode batch, #running-req: {running}, #token: {kv}, token usage: \
                             {usage:.2}, gen throughput (token/s): {rate:.2}, #queue-req: {}",
                            self.queue.len()
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
                output_tokens: output,
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
            output_tokens: 41,
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
