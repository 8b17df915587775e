//! The run loop: one task owns all state and selects on request completions, input, retry
//! timers, probes, the clock and cancellation; requests run as joined tasks, the journal on its
//! own thread and the input reader on a blocking thread.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet, VecDeque};
use std::path::PathBuf;
use std::time::Duration;

use rand::Rng;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use super::concurrency::Controller;
use super::input::{self, Id, Line};
use super::journal::{self, CompletionRecord, Entry, FailureRecord, Journal};
use super::progress::{self, InstanceProgress, Progress, RateWindow, Status};
use super::upload::{UploadEvent, Uploader};
use super::watchdog::{self, Signals};
use super::{Ended, Endpoint, Event, GenerateConfig, GenerateError, InstanceInfo, Summary};
use crate::sglang::client::{
    Api, ClientError, CompletionRequest, Health, Prompt, Remedy, ServerInfo, SglangClient,
    http_client,
};
use crate::sglang::metrics::Metrics;

/// `/metrics` readings after warm-up before the watchdog judges an instance.
const MIN_READINGS: u64 = 3;

/// A prompt whose connection drops this often is failed: it may be what crashes servers.
const MAX_REDISPATCHES: u32 = 8;

/// A prompt on its way through the fleet.
struct Job {
    line: u64,
    id: Id,
    req: CompletionRequest,
    attempts: u32,
    /// Times it was moved off a server that went away (not counted against --max-retries).
    redispatches: u32,
    clamped: bool,
    /// The instance that last failed it: retries go elsewhere when possible.
    avoid: Option<usize>,
}

enum Attempt {
    Finished {
        record: Vec<u8>,
        prompt_tokens: u64,
        completion_tokens: u64,
    },
    Failed(ClientError),
    /// The instance was taken out (or the grace period ended) while the request was out.
    Aborted,
}

struct TaskDone {
    inst: usize,
    job: Job,
    attempt: Attempt,
}

enum ProbeKind {
    Metrics(Result<Metrics, ClientError>),
    Health(Result<Health, ClientError>),
    Revive(Result<ServerInfo, String>),
}

struct Probe {
    inst: usize,
    kind: ProbeKind,
}

#[derive(Default)]
struct SignalAcc {
    readings: u64,
    running: f64,
    queue_empty: u64,
    /// Sum and count of `sglang:gen_throughput` readings: the decode rate as the batch runs.
    gen_tok_s: f64,
    gen_readings: u64,
}

struct Inst {
    client: SglangClient,
    up: bool,
    ctl: Controller,
    in_flight: u32,
    cap: Option<u64>,
    kv_tokens: Option<u64>,
    /// The context length in effect (`/v1/models` `max_model_len`).
    context_len: Option<u64>,
    /// Cancelled when the instance is taken out; replaced when it comes back.
    abort: CancellationToken,
    health_failures: u32,
    probing: bool,
    metrics_available: bool,
    completed: u64,
    out_tokens: u64,
    window: RateWindow,
    /// The server's own `generation_tokens_total`: output tok/s as it happens, not only when
    /// long requests complete.
    server_tokens: RateWindow,
    last: Option<Metrics>,
    acc: SignalAcc,
}

impl Inst {
    fn free(&self) -> u32 {
        self.ctl.limit().saturating_sub(self.in_flight)
    }
}

/// A retry waiting for its backoff; ordered by due time, then arrival.
struct Delayed {
    due: Instant,
    seq: u64,
    job: Job,
}

impl PartialEq for Delayed {
    fn eq(&self, o: &Self) -> bool {
        (self.due, self.seq) == (o.due, o.seq)
    }
}
impl Eq for Delayed {}
impl PartialOrd for Delayed {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Delayed {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.due, self.seq).cmp(&(o.due, o.seq))
    }
}

/// Runs the job over `endpoints` until every prompt is written, the token is cancelled, or
/// the run cannot go on. Reports through `on_event`; never prints.
pub async fn run(
    config: GenerateConfig,
    endpoints: Vec<Endpoint>,
    mut on_event: impl FnMut(Event) + Send,
    cancel: CancellationToken,
) -> Result<Summary, GenerateError> {
    if endpoints.is_empty() {
        return Err(GenerateError::NoEndpoints);
    }
    if !config.resume && journal::has_output(&config.out)? {
        return Err(journal::JournalError::NotEmpty {
            dir: config.out.clone(),
        }
        .into());
    }
    std::fs::create_dir_all(&config.out).map_err(|source| journal::JournalError::Io {
        path: config.out.clone(),
        source,
    })?;

    let (recovered, scan) = {
        let out = config.out.clone();
        let prompts = config.prompts.clone();
        let (resume, limit) = (config.resume, config.limit);
        blocking(move || -> Result<_, GenerateError> {
            let recovered = if resume {
                journal::recover(&out)?
            } else {
                journal::Recovered::default()
            };
            let scan = input::check_ids(&prompts, limit, &recovered.done)?;
            Ok((recovered, scan))
        })
        .await??
    };

    let http = http_client(config.http)?;
    let clients: Vec<SglangClient> = endpoints
        .into_iter()
        .map(|e| SglangClient::new(http.clone(), e))
        .collect();
    let infos = {
        let probes = clients.iter().map(|c| c.server_info());
        tokio::select! {
            r = futures::future::join_all(probes) => r,
            _ = cancel.cancelled() => {
                let progress = Progress::before_start(scan.total, &recovered, Status::Interrupted);
                return Ok(Summary { ended: Ended::Interrupted, progress, not_uploaded: Default::default() });
            }
        }
    };
    if infos.iter().all(Result::is_err) {
        let lines: Vec<String> = infos
            .iter()
            .filter_map(|r| r.as_ref().err())
            .map(|e| format!("  {e}"))
            .collect();
        return Err(GenerateError::NoInstances(lines.join("\n")));
    }

    let now = Instant::now();
    let mut model = None;
    let mut insts = Vec::with_capacity(clients.len());
    let mut started = Vec::with_capacity(clients.len());
    for (client, info) in clients.into_iter().zip(infos) {
        let (cap, kv, ctx_len, version, unavailable) = match &info {
            Ok(i) => {
                if model.is_none() {
                    model = i.served_model_name.clone().or_else(|| i.model_path.clone());
                }
                (
                    i.effective_max_running_requests,
                    i.max_total_num_tokens,
                    i.context_length,
                    i.version.clone(),
                    None,
                )
            }
            Err(e) => (None, None, None, None, Some(e.to_string())),
        };
        let ctl = Controller::new(config.concurrency, cap);
        started.push(InstanceInfo {
            name: client.endpoint().name.clone(),
            url: client.endpoint().base_url.clone(),
            version,
            server_cap: cap,
            kv_tokens: kv,
            context_length: ctx_len,
            concurrency: ctl.limit(),
            unavailable,
        });
        let mut window = RateWindow::new(config.timing.rate_window);
        window.record(now, 0, 0);
        insts.push(Inst {
            client,
            up: info.is_ok(),
            ctl,
            in_flight: 0,
            cap,
            kv_tokens: kv,
            context_len: ctx_len,
            abort: CancellationToken::new(),
            health_failures: 0,
            probing: false,
            metrics_available: true,
            completed: 0,
            out_tokens: 0,
            window,
            server_tokens: RateWindow::new(config.timing.rate_window),
            last: None,
            acc: SignalAcc::default(),
        });
    }
    on_event(Event::Started {
        total: scan.total,
        already_done: recovered.done.len() as u64,
        truncated_bytes: recovered.truncated_bytes,
        instances: started,
    });

    // Shards of earlier runs are finished: they go first, then each one this run finishes.
    let uploader = match &config.upload {
        Some(dest) => {
            let earlier = journal::shards(&config.out)?;
            Some(Uploader::start(
                dest.clone(),
                config.upload_retry,
                earlier,
                &cancel,
            ))
        }
        None => None,
    };
    let queue = uploader.as_ref().and_then(Uploader::queue);
    let journal = match Journal::start(&config.out, recovered.next_shard, config.sync, queue) {
        Ok(j) => j,
        Err(e) => {
            if let Some(u) = uploader {
                u.abandon().await;
            }
            return Err(e.into());
        }
    };
    let (line_tx, line_rx) = mpsc::channel::<Line>(4096);
    let reader = {
        let path = config.prompts.clone();
        let limit = config.limit;
        let done = recovered.done;
        let start = scan.first_pending;
        tokio::task::spawn_blocking(move || read_input(path, limit, start, done, line_tx))
    };

    let mut run = Run {
        config: &config,
        insts,
        model,
        journal,
        total: scan.total,
        base_completed: recovered.completed,
        base_failed: recovered.failed,
        base_in_tokens: recovered.input_tokens,
        base_out_tokens: recovered.output_tokens,
        completed: 0,
        failed: 0,
        in_tokens: 0,
        out_tokens: 0,
        window: RateWindow::new(config.timing.rate_window),
        started_at: now,
        ready: VecDeque::new(),
        delayed: BinaryHeap::new(),
        seq: 0,
        paused_since: None,
        warned: None,
        uploader,
        s3_uploaded: 0,
        s3_bytes: 0,
    };
    run.window.record(now, 0, 0);
    let loop_result = run.drive(line_rx, &mut on_event, &cancel).await;

    // Everything below runs however the loop ended, so the journal is flushed and joined.
    let reader_result = reader
        .await
        .map_err(|e| GenerateError::Task(e.to_string()))?;
    let journal_result = run.journal.close().await;
    // The journal's last shard is queued now; the job is done when it is uploaded too.
    let upload_result = match run.uploader.take() {
        Some(u) => {
            u.finish(&config.out, |e| {
                run.count_upload(&e);
                on_event(Event::Upload(e));
            })
            .await
        }
        None => Ok(Default::default()),
    };
    let outcome = match (loop_result, journal_result) {
        // The loop only sees that the writer is gone; the writer knows why.
        (Err(GenerateError::Journal(journal::JournalError::WriterGone)), Err(e)) => Err(e.into()),
        (Err(e), _) => Err(e),
        (Ok(_), Err(e)) => Err(e.into()),
        (Ok(ended), Ok(_)) => reader_result.map(|()| ended).map_err(GenerateError::from),
    };
    let (outcome, not_uploaded) = match (outcome, upload_result) {
        (Ok(ended), Ok(missing)) => (Ok(ended), missing),
        (Err(e), _) => (Err(e), Default::default()),
        (Ok(_), Err(e)) => (Err(e.into()), Default::default()),
    };
    let status = match &outcome {
        Ok(Ended::Done) if !not_uploaded.is_empty() => Status::Failed,
        Ok(Ended::Done) => Status::Done,
        Ok(Ended::Interrupted) => Status::Interrupted,
        Ok(Ended::Stalled | Ended::BelowExpected(_)) | Err(_) => Status::Failed,
    };
    let final_progress = run.progress(status, Instant::now());
    let written = progress::write_atomic(&config.out, &final_progress);
    on_event(Event::Progress(final_progress.clone()));
    let ended = outcome?;
    written?;
    Ok(Summary {
        ended,
        progress: final_progress,
        not_uploaded,
    })
}

/// The uploader's next event, for the run loop's `select!`.
async fn next_upload(uploader: &mut Option<Uploader>) -> UploadEvent {
    match uploader {
        Some(u) => u.event().await,
        None => std::future::pending().await,
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, GenerateError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| GenerateError::Task(e.to_string()))
}

/// Capped exponential backoff before retry `attempt` (1-based), scaled by `jitter` in
/// [0.5, 1] so retries of a burst of failures do not arrive in waves.
fn backoff(t: &super::Timing, attempt: u32, jitter: f64) -> Duration {
    let exp = t
        .backoff_base
        .saturating_mul(1u32 << attempt.saturating_sub(1).min(16));
    exp.min(t.backoff_cap).mul_f64(jitter)
}

/// Streams lines not yet done into the run loop; stops early when the loop stops listening.
fn read_input(
    path: PathBuf,
    limit: Option<u64>,
    start: Option<input::Position>,
    done: HashSet<u128>,
    tx: mpsc::Sender<Line>,
) -> Result<(), input::InputError> {
    let Some(start) = start else { return Ok(()) };
    let mut reader = input::Reader::open_at(&path, limit, start)?;
    while let Some((number, text)) = reader.next_raw()? {
        let line = input::parse_line(number, text);
        if done.contains(&line.id.key()) {
            continue;
        }
        if tx.blocking_send(line).is_err() {
            break;
        }
    }
    Ok(())
}

struct Run<'a> {
    config: &'a GenerateConfig,
    insts: Vec<Inst>,
    model: Option<String>,
    journal: Journal,
    total: u64,
    base_completed: u64,
    base_failed: u64,
    base_in_tokens: u64,
    base_out_tokens: u64,
    completed: u64,
    failed: u64,
    in_tokens: u64,
    out_tokens: u64,
    window: RateWindow,
    started_at: Instant,
    ready: VecDeque<Job>,
    delayed: BinaryHeap<Reverse<Delayed>>,
    seq: u64,
    paused_since: Option<Instant>,
    /// The last watchdog finding's cause, so one cause is announced once.
    warned: Option<watchdog::Cause>,
    uploader: Option<Uploader>,
    /// Shards in the upload destination (this run's and earlier runs') and their bytes.
    s3_uploaded: u64,
    s3_bytes: u64,
}

/// Why the loop is winding down.
enum Stop {
    Interrupted,
    BelowExpected(watchdog::Finding),
    Stalled,
}

impl Run<'_> {
    async fn drive(
        &mut self,
        mut lines: mpsc::Receiver<Line>,
        on_event: &mut (impl FnMut(Event) + Send),
        cancel: &CancellationToken,
    ) -> Result<Ended, GenerateError> {
        let mut tasks: JoinSet<TaskDone> = JoinSet::new();
        let mut probes: JoinSet<Probe> = JoinSet::new();
        let mut input_open = true;
        let mut stop: Option<(Stop, Instant)> = None;
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut next_probe = Instant::now();
        let mut next_health = Instant::now() + self.config.timing.health_every;
        let mut next_progress = Instant::now();
        let mut grace_over = false;

        loop {
            let now = Instant::now();
            while self.delayed.peek().is_some_and(|d| d.0.due <= now) {
                let Reverse(d) = self.delayed.pop().expect("peeked");
                self.ready.push_back(d.job);
            }
            if stop.is_none() && self.paused_since.is_none() {
                loop {
                    let avoid = self.ready.front().and_then(|j| j.avoid);
                    let Some(i) = self.pick(avoid) else { break };
                    let job = if let Some(j) = self.ready.pop_front() {
                        j
                    } else if input_open {
                        match lines.try_recv() {
                            Ok(line) => match self.intake(line, on_event)? {
                                Some(job) => job,
                                None => continue,
                            },
                            Err(mpsc::error::TryRecvError::Empty) => break,
                            Err(mpsc::error::TryRecvError::Disconnected) => {
                                input_open = false;
                                break;
                            }
                        }
                    } else {
                        break;
                    };
                    self.spawn(&mut tasks, i, job);
                }
            }

            if tasks.is_empty() {
                if let Some((why, _)) = stop.take() {
                    return Ok(match why {
                        Stop::Interrupted => Ended::Interrupted,
                        Stop::BelowExpected(f) => Ended::BelowExpected(f),
                        Stop::Stalled => Ended::Stalled,
                    });
                }
                if !input_open && self.ready.is_empty() && self.delayed.is_empty() {
                    return Ok(Ended::Done);
                }
            }

            let want_input = input_open
                && stop.is_none()
                && self.paused_since.is_none()
                && self.ready.is_empty()
                && self.insts.iter().any(|i| i.up && i.free() > 0);
            let next_due = self.delayed.peek().map(|d| d.0.due);
            let grace_deadline = stop.as_ref().map(|(_, at)| *at).filter(|_| !grace_over);

            tokio::select! {
                biased;
                _ = cancel.cancelled(), if stop.is_none() => {
                    self.begin_stop(Stop::Interrupted, &mut stop, &mut lines, on_event, "interrupted");
                }
                _ = sleep_until(grace_deadline.unwrap_or(now)), if grace_deadline.is_some() => {
                    // Requests still out are dropped unwritten: a resume sends them again.
                    grace_over = true;
                    for inst in &self.insts {
                        inst.abort.cancel();
                    }
                }
                Some(done) = tasks.join_next() => {
                    let done = done.map_err(|e| GenerateError::Task(e.to_string()))?;
                    self.finish(done, stop.is_some(), on_event)?;
                }
                line = lines.recv(), if want_input => match line {
                    Some(line) => if let Some(job) = self.intake(line, on_event)? {
                        self.ready.push_back(job);
                    },
                    None => input_open = false,
                },
                _ = sleep_until(next_due.unwrap_or(now)), if next_due.is_some() => {}
                e = next_upload(&mut self.uploader), if self.uploader.is_some() => {
                    self.count_upload(&e);
                    on_event(Event::Upload(e));
                }
                Some(p) = probes.join_next() => {
                    let p = p.map_err(|e| GenerateError::Task(e.to_string()))?;
                    self.on_probe(p, on_event);
                }
                _ = tick.tick() => {
                    let now = Instant::now();
                    if now >= next_probe {
                        next_probe = now + self.config.timing.metrics_every;
                        let health = now >= next_health;
                        if health {
                            next_health = now + self.config.timing.health_every;
                        }
                        self.launch_probes(&mut probes, health);
                        self.record_rates(now);
                        if stop.is_none()
                            && let Some(f) = self.watch(now, on_event)
                        {
                            let why = "throughput below --abort-below";
                            self.begin_stop(Stop::BelowExpected(f), &mut stop, &mut lines, on_event, why);
                        }
                    }
                    if let Some(since) = self.paused_since
                        && stop.is_none()
                        && now.duration_since(since) >= self.config.stall_timeout
                    {
                        self.begin_stop(Stop::Stalled, &mut stop, &mut lines, on_event, "no instance came back within --stall-timeout");
                    }
                    if now >= next_progress {
                        next_progress = now + self.config.timing.progress_every;
                        let p = self.progress(Status::Running, now);
                        progress::write_atomic(&self.config.out, &p)?;
                        on_event(Event::Progress(p));
                    }
                }
            }
        }
    }

    fn begin_stop(
        &mut self,
        why: Stop,
        stop: &mut Option<(Stop, Instant)>,
        lines: &mut mpsc::Receiver<Line>,
        on_event: &mut (impl FnMut(Event) + Send),
        reason: &str,
    ) {
        lines.close();
        self.ready.clear();
        self.delayed.clear();
        let grace = match why {
            Stop::Interrupted | Stop::BelowExpected(_) => self.config.grace,
            Stop::Stalled => Duration::ZERO,
        };
        let in_flight = self.insts.iter().map(|i| i.in_flight as u64).sum();
        on_event(Event::Stopping {
            reason: reason.to_string(),
            in_flight,
        });
        *stop = Some((why, Instant::now() + grace));
    }

    /// The up instance with the most free share of its limit, avoiding `avoid` unless it is
    /// the only one up. Work goes where slots free up, so faster instances get more of it.
    fn pick(&self, avoid: Option<usize>) -> Option<usize> {
        let up = self.insts.iter().filter(|i| i.up).count();
        let mut best: Option<(usize, f64)> = None;
        for (i, inst) in self.insts.iter().enumerate() {
            if !inst.up || inst.free() == 0 || (Some(i) == avoid && up > 1) {
                continue;
            }
            let share = inst.free() as f64 / inst.ctl.limit() as f64;
            if best.is_none_or(|(_, s)| share > s) {
                best = Some((i, share));
            }
        }
        best.map(|(i, _)| i)
    }

    /// Turns an input line into a job, or records it as failed.
    fn intake(
        &mut self,
        line: Line,
        on_event: &mut impl FnMut(Event),
    ) -> Result<Option<Job>, GenerateError> {
        let parsed = match line.parsed {
            Ok(p) => p,
            Err(error) => {
                on_event(Event::MalformedLine {
                    line: line.number,
                    error: error.clone(),
                });
                self.fail(&line.id, line.number, "malformed_line", &error)?;
                return Ok(None);
            }
        };
        let api = self
            .config
            .api
            .or(parsed.api)
            .unwrap_or(match parsed.prompt {
                Prompt::Messages(_) => Api::Chat,
                Prompt::Text(_) => Api::Generate,
            });
        if matches!(
            (&parsed.prompt, api),
            (Prompt::Messages(_), Api::Generate | Api::Completions)
        ) {
            let error = format!(
                "`messages` cannot be sent to {}; use --endpoint chat",
                api.path()
            );
            self.fail(&line.id, line.number, "unsupported_prompt", &error)?;
            return Ok(None);
        }
        let req = CompletionRequest {
            api,
            prompt: parsed.prompt,
            max_tokens: parsed.max_tokens.unwrap_or(self.config.max_tokens),
            temperature: self.config.temperature,
            top_p: self.config.top_p,
            model: self.model.clone(),
            extra: parsed.extra,
        };
        Ok(Some(Job {
            line: line.number,
            id: line.id,
            req,
            attempts: 0,
            redispatches: 0,
            clamped: false,
            avoid: None,
        }))
    }

    fn spawn(&mut self, tasks: &mut JoinSet<TaskDone>, i: usize, mut job: Job) {
        let inst = &mut self.insts[i];
        // More output tokens than the context holds never fit, and chat refuses them before
        // reading the prompt (serving_chat.py): ask for at most the context at once.
        if let Some(c) = inst.context_len
            && u64::from(job.req.max_tokens) > c
        {
            job.req.max_tokens = c.min(u64::from(u32::MAX)) as u32;
        }
        inst.in_flight += 1;
        let client = inst.client.clone();
        let abort = inst.abort.clone();
        tasks.spawn(async move {
            let t0 = Instant::now();
            let result = tokio::select! {
                r = client.complete(&job.req) => r,
                _ = abort.cancelled() => return TaskDone { inst: i, job, attempt: Attempt::Aborted },
            };
            let attempt = match result {
                Ok(c) => Attempt::Finished {
                    record: journal::encode(&CompletionRecord {
                        id: &job.id,
                        output: &c.text,
                        prompt_tokens: c.prompt_tokens,
                        completion_tokens: c.completion_tokens,
                        finish_reason: c.finish_reason.as_deref(),
                        instance: &client.endpoint().name,
                        latency_s: progress::round(t0.elapsed().as_secs_f64(), 3),
                    }),
                    prompt_tokens: c.prompt_tokens,
                    completion_tokens: c.completion_tokens,
                },
                Err(e) => Attempt::Failed(e),
            };
            TaskDone { inst: i, job, attempt }
        });
    }

    fn fail(&mut self, id: &Id, line: u64, reason: &str, error: &str) -> Result<(), GenerateError> {
        self.journal
            .append(Entry::Failure(journal::encode(&FailureRecord {
                id,
                line,
                reason,
                error,
            })))?;
        self.failed += 1;
        Ok(())
    }

    fn finish(
        &mut self,
        done: TaskDone,
        stopping: bool,
        on_event: &mut impl FnMut(Event),
    ) -> Result<(), GenerateError> {
        let TaskDone {
            inst: i,
            mut job,
            attempt,
        } = done;
        self.insts[i].in_flight -= 1;
        match attempt {
            Attempt::Finished {
                record,
                prompt_tokens,
                completion_tokens,
            } => {
                self.journal.append(Entry::Completion(record))?;
                self.completed += 1;
                self.in_tokens += prompt_tokens;
                self.out_tokens += completion_tokens;
                let inst = &mut self.insts[i];
                inst.completed += 1;
                inst.out_tokens += completion_tokens;
            }
            Attempt::Aborted => {
                job.avoid = Some(i);
                if !stopping {
                    self.ready.push_front(job);
                }
            }
            Attempt::Failed(ClientError::ContextOverflow { overflow, .. }) => {
                match overflow.remedy() {
                    Remedy::PromptTooLong => {
                        self.fail(&job.id, job.line, "prompt_too_long", &overflow.to_string())?;
                    }
                    // One clamp to C − P − 1; the chat check's clamp to C comes before it, since
                    // it is made before the server knows the prompt's length.
                    Remedy::MaxTokens(fit)
                        if fit < job.req.max_tokens
                            && !(job.clamped && overflow.knows_prompt()) =>
                    {
                        job.req.max_tokens = fit;
                        job.clamped |= overflow.knows_prompt();
                        if !stopping {
                            self.ready.push_front(job);
                        }
                    }
                    Remedy::MaxTokens(fit) => {
                        let error = format!("{overflow}; still too long with max_tokens {fit}");
                        self.fail(&job.id, job.line, "context_overflow", &error)?;
                    }
                }
            }
            Attempt::Failed(e) if e.is_unreachable() && job.redispatches < MAX_REDISPATCHES => {
                // The server is gone or dropped the connection, not the request's fault: send
                // it elsewhere without spending one of its retries. A refused connection means
                // nothing listens there any more, so the instance is taken out; a dropped one
                // may be a single closed keep-alive connection, so health checks decide.
                if matches!(e, ClientError::Connect { .. }) {
                    self.mark_down(i, &e.to_string(), on_event);
                }
                job.avoid = Some(i);
                job.redispatches += 1;
                if !stopping {
                    self.ready.push_front(job);
                }
            }
            Attempt::Failed(e) if e.is_retryable() => {
                job.attempts += 1;
                if job.attempts > self.config.max_retries {
                    let reason = "retries_exhausted";
                    self.fail(&job.id, job.line, reason, &e.to_string())?;
                } else if !stopping {
                    job.avoid = Some(i);
                    let jitter = rand::rng().random_range(0.5..=1.0);
                    let due = Instant::now() + backoff(&self.config.timing, job.attempts, jitter);
                    self.seq += 1;
                    self.delayed.push(Reverse(Delayed {
                        due,
                        seq: self.seq,
                        job,
                    }));
                }
            }
            Attempt::Failed(e) => {
                let reason = match e {
                    ClientError::Decode { .. } => "bad_response",
                    _ => "rejected",
                };
                self.fail(&job.id, job.line, reason, &e.to_string())?;
            }
        }
        Ok(())
    }

    fn count_upload(&mut self, e: &UploadEvent) {
        if let UploadEvent::Uploaded { bytes, .. } | UploadEvent::AlreadyThere { bytes, .. } = e {
            self.s3_uploaded += 1;
            self.s3_bytes += bytes;
        }
    }

    fn mark_down(&mut self, i: usize, reason: &str, on_event: &mut impl FnMut(Event)) {
        let inst = &mut self.insts[i];
        if !inst.up {
            return;
        }
        inst.up = false;
        inst.abort.cancel();
        inst.abort = CancellationToken::new();
        inst.health_failures = 0;
        on_event(Event::InstanceDown {
            name: inst.client.endpoint().name.clone(),
            reason: reason.to_string(),
        });
        if self.paused_since.is_none() && self.insts.iter().all(|i| !i.up) {
            self.paused_since = Some(Instant::now());
            on_event(Event::Paused {
                stall_timeout: self.config.stall_timeout,
            });
        }
    }

    fn launch_probes(&mut self, probes: &mut JoinSet<Probe>, health: bool) {
        for (i, inst) in self.insts.iter_mut().enumerate() {
            if inst.probing {
                continue;
            }
            let client = inst.client.clone();
            if !inst.up {
                inst.probing = true;
                probes.spawn(async move {
                    let kind = match client.health().await {
                        Ok(Health::Ready) => {
                            ProbeKind::Revive(client.server_info().await.map_err(|e| e.to_string()))
                        }
                        Ok(Health::NotReady { status }) => {
                            ProbeKind::Revive(Err(format!("/health answered {status}")))
                        }
                        Err(e) => ProbeKind::Revive(Err(e.to_string())),
                    };
                    Probe { inst: i, kind }
                });
            } else if health && !inst.metrics_available {
                // SGLang's /health runs a generation that a busy server may answer late
                // (RUNTIME.md, readiness): a running job reads liveness from /metrics, or from
                // /server_info where metrics are off.
                inst.probing = true;
                probes.spawn(async move {
                    let kind = ProbeKind::Health(client.server_info().await.map(|_| Health::Ready));
                    Probe { inst: i, kind }
                });
            } else if inst.metrics_available {
                inst.probing = true;
                probes.spawn(async move {
                    Probe {
                        inst: i,
                        kind: ProbeKind::Metrics(client.metrics().await),
                    }
                });
            }
        }
    }

    fn on_probe(&mut self, p: Probe, on_event: &mut impl FnMut(Event)) {
        let warm = Instant::now().duration_since(self.started_at) >= self.config.warmup;
        let health_failures_to_down = self.config.timing.health_failures_to_down;
        let inst = &mut self.insts[p.inst];
        inst.probing = false;
        match p.kind {
            ProbeKind::Metrics(Ok(m)) => {
                if !inst.up {
                    return;
                }
                if let Some(total) = m.generation_tokens_total {
                    inst.server_tokens.record(Instant::now(), 0, total as u64);
                }
                if let (Some(running), Some(queued)) = (m.num_running_reqs, m.num_queue_reqs) {
                    inst.ctl.observe(running, queued, inst.in_flight);
                    if warm {
                        inst.acc.readings += 1;
                        inst.acc.running += running;
                        inst.acc.queue_empty += u64::from(queued < 1.0);
                        if let Some(g) = m.gen_throughput {
                            inst.acc.gen_tok_s += g;
                            inst.acc.gen_readings += 1;
                        }
                    }
                }
                inst.last = Some(m);
            }
            ProbeKind::Metrics(Err(ClientError::Status { status: 404, .. })) => {
                inst.metrics_available = false
            }
            ProbeKind::Metrics(Err(e)) | ProbeKind::Health(Err(e)) => {
                if inst.up {
                    inst.health_failures += 1;
                    if inst.health_failures >= health_failures_to_down {
                        let reason =
                            format!("{} failed health checks; last: {e}", inst.health_failures);
                        self.mark_down(p.inst, &reason, on_event);
                    }
                }
            }
            ProbeKind::Health(Ok(Health::NotReady { status })) => {
                if inst.up {
                    inst.health_failures += 1;
                    if inst.health_failures >= health_failures_to_down {
                        let reason =
                            format!("/health answered {status} {} times", inst.health_failures);
                        self.mark_down(p.inst, &reason, on_event);
                    }
                }
            }
            ProbeKind::Health(Ok(Health::Ready)) => inst.health_failures = 0,
            ProbeKind::Revive(Ok(info)) => {
                if inst.up {
                    return;
                }
                inst.up = true;
                inst.cap = info.effective_max_running_requests;
                inst.kv_tokens = info.max_total_num_tokens;
                inst.context_len = info.context_length;
                inst.ctl = Controller::new(self.config.concurrency, inst.cap);
                inst.metrics_available = true;
                // A restarted server counts from zero again.
                inst.server_tokens = RateWindow::new(self.config.timing.rate_window);
                on_event(Event::InstanceUp {
                    name: inst.client.endpoint().name.clone(),
                    server_cap: inst.cap,
                });
                if self.paused_since.take().is_some() {
                    on_event(Event::Resumed);
                }
            }
            ProbeKind::Revive(Err(_)) => {}
        }
    }

    fn record_rates(&mut self, now: Instant) {
        self.window.record(now, self.completed, self.out_tokens);
        for inst in &mut self.insts {
            inst.window.record(now, inst.completed, inst.out_tokens);
        }
    }

    /// Runs the watchdog after warm-up; returns a finding that must stop the run.
    fn watch(
        &mut self,
        now: Instant,
        on_event: &mut impl FnMut(Event),
    ) -> Option<watchdog::Finding> {
        if now.duration_since(self.started_at) < self.config.warmup {
            return None;
        }
        let up: Vec<&Inst> = self
            .insts
            .iter()
            .filter(|i| i.up && i.acc.readings >= MIN_READINGS)
            .collect();
        if up.is_empty() {
            return None;
        }
        let n = up.len() as f64;
        let caps: Vec<f64> = up.iter().filter_map(|i| i.cap).map(|c| c as f64).collect();
        let avg_seq = (self.completed > 0)
            .then(|| (self.in_tokens + self.out_tokens) as f64 / self.completed as f64);
        let kv: Vec<f64> = up
            .iter()
            .filter_map(|i| i.kv_tokens)
            .map(|k| k as f64)
            .collect();
        let signals = Signals {
            running: up
                .iter()
                .map(|i| i.acc.running / i.acc.readings as f64)
                .sum::<f64>()
                / n,
            queue_empty_share: up
                .iter()
                .map(|i| i.acc.queue_empty as f64 / i.acc.readings as f64)
                .sum::<f64>()
                / n,
            cap: (!caps.is_empty()).then(|| caps.iter().sum::<f64>() / caps.len() as f64),
            client_limit: up.iter().map(|i| i.ctl.limit() as f64).sum::<f64>() / n,
            kv_fit: avg_seq
                .filter(|s| *s > 0.0 && !kv.is_empty())
                .map(|s| kv.iter().sum::<f64>() / kv.len() as f64 / s),
        };
        // Output is counted when requests finish, so in the first minutes of long completions
        // counters lag far behind the GPUs; the servers' decode rate does not.
        let live = if up.iter().all(|i| i.acc.gen_readings > 0) {
            up.iter()
                .map(|i| i.acc.gen_tok_s / i.acc.gen_readings as f64)
                .sum::<f64>()
                / n
        } else if up.iter().all(|i| i.server_tokens.is_measured()) {
            up.iter().map(|i| i.server_tokens.rates().1).sum::<f64>() / n
        } else {
            self.window.rates().1 / n
        };
        let finding = watchdog::assess(live, self.config.expected.as_ref(), &signals)?;
        if self.warned.as_ref() != Some(&finding.cause) {
            self.warned = Some(finding.cause.clone());
            on_event(Event::Watchdog(finding.clone()));
        }
        self.config
            .abort_below
            .filter(|f| finding.fraction < *f)
            .map(|_| finding)
    }

    fn progress(&self, status: Status, now: Instant) -> Progress {
        let (rate, _) = self.window.rates();
        let completed = self.base_completed + self.completed;
        let failed = self.base_failed + self.failed;
        let out = self.base_out_tokens + self.out_tokens;
        let remaining = self.total.saturating_sub(completed + failed);
        Progress {
            total: self.total,
            completed,
            failed,
            rate_per_sec: progress::round(rate, 2),
            eta_hours: progress::eta_hours(remaining, rate),
            total_input_tokens: self.base_in_tokens + self.in_tokens,
            total_output_tokens: out,
            avg_output_tokens: out.checked_div(completed).unwrap_or(0),
            elapsed_hours: progress::round(
                now.duration_since(self.started_at).as_secs_f64() / 3600.0,
                4,
            ),
            s3_uploaded: self.s3_uploaded,
            s3_bytes: self.s3_bytes,
            status,
            instances: self
                .insts
                .iter()
                .map(|i| {
                    let (rate, tok) = i.window.rates();
                    InstanceProgress {
                        name: i.client.endpoint().name.clone(),
                        url: i.client.endpoint().base_url.clone(),
                        healthy: i.up,
                        in_flight: i.in_flight,
                        concurrency: i.ctl.limit(),
                        server_cap: i.cap,
                        completed: i.completed,
                        rate_per_sec: progress::round(rate, 2),
                        output_tok_s: progress::round(tok, 1),
                        running: i.last.as_ref().and_then(|m| m.num_running_reqs),
                        queued: i.last.as_ref().and_then(|m| m.num_queue_reqs),
                    }
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::Timing;

    #[test]
    fn backoff_doubles_up_to_the_cap_and_jitter_only_shortens_it() {
        let t = Timing::default();
        assert_eq!(backoff(&t, 1, 1.0), Duration::from_millis(500));
        assert_eq!(backoff(&t, 2, 1.0), Duration::from_secs(1));
        assert_eq!(backoff(&t, 4, 0.5), Duration::from_secs(2));
        assert_eq!(backoff(&t, 7, 1.0), Duration::from_secs(30));
        assert_eq!(backoff(&t, 60, 1.0), Duration::from_secs(30));
    }
}
