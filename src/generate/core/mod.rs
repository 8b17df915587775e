//! The generation job's decisions as a pure state machine: every input (a line read, a request
//! finished, a probe answered, the clock, cancellation, an upload) goes to [`Core::on`], which
//! answers with the [`Action`]s the shell must take. It does no I/O, reads no clock and draws
//! its retry jitter from a seeded generator, so its tests drive it on fake time.
//!
//! It owns dispatch (which request goes to which instance is a [`placement`] policy's) and
//! per-instance in-flight limits, retries with backoff and redispatch, taking instances out and
//! back in, pausing when nothing is healthy and the stall timeout, the watchdog, the grace
//! period after a stop, and how the run ends. `sweep` drives the same core with a closed-loop
//! supply of requests.

mod fleet;
mod jobs;
pub mod placement;
mod reason;
mod signals;
mod watch;

#[cfg(test)]
mod tests;

use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::SmallRng;
use rustc_hash::FxHashMap;

use super::concurrency::{ConcurrencyMode, FileBudget};
use super::input::{Id, Line};
use super::journal::{Entry, OutputFormat};
pub use super::progress::Baseline;
use super::progress::{Progress, RateWindow, Status};
use super::upload::UploadEvent;
use super::watchdog::{Cause, Finding};
use super::{Event, GenerateConfig, InstanceInfo, Timing};
use crate::config::Expected;
use crate::eta::LengthModel;
use crate::server::ServerId;
use crate::sglang::client::{Api, ClientError, Completion, CompletionRequest, ServerInfo};
use crate::sglang::metrics::Metrics;

pub use reason::{DownReason, HostLoss, ReviveError, StopReason};

use fleet::Inst;
use jobs::{Delayed, Job};
use placement::{LeastLoaded, Placement, ServerState, Ticket};

/// Time since the run started, as the shell's clock measures it.
pub type Time = Duration;

/// A request sent to a server, named so its answer finds its way back.
pub type ReqId = u64;

/// The rules of a run: what `fleet generate`'s flags decide.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    pub api: Option<Api>,
    pub max_tokens: u32,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub concurrency: ConcurrencyMode,
    pub max_retries: u32,
    pub stall_timeout: Duration,
    pub warmup: Duration,
    pub abort_below: Option<f64>,
    pub grace: Duration,
    pub expected: Option<Expected>,
    pub timing: Timing,
    /// The requests the open-file limit leaves room for; `None`: unbounded.
    pub files: Option<FileBudget>,
    /// Seeds the retry jitter: the same seed and inputs give the same decisions.
    pub seed: u64,
    /// The shape of the lines it writes.
    pub format: OutputFormat,
}

impl CoreConfig {
    pub fn from_generate(c: &GenerateConfig, seed: u64) -> Self {
        CoreConfig {
            api: c.api,
            max_tokens: c.max_tokens,
            temperature: c.temperature,
            top_p: c.top_p,
            concurrency: c.concurrency,
            max_retries: c.max_retries,
            stall_timeout: c.stall_timeout,
            warmup: c.warmup,
            abort_below: c.abort_below,
            grace: c.grace,
            expected: c.expected.clone(),
            timing: c.timing,
            files: c.files,
            seed,
            // The shell sets what `prepare` settled (the flag, the input, or the job's own).
            format: c.output_format.unwrap_or_default(),
        }
    }
}

/// What the input's prefix plan expects of the servers' radix caches under prefix placement,
/// for the watchdog to hold the answers' cached tokens to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CacheExpectation {
    /// The expected share of the job's prompt tokens served from the cache.
    pub cached_fraction: f64,
    /// Estimated tokens of every group's shared prefix, each once.
    pub prefix_tokens: u64,
}

/// A server as the shell found it before the run: its `/server_info`, or why it did not answer.
/// Its id names its inventory host, which a lost connection takes out as a whole.
#[derive(Debug)]
pub struct Server {
    pub id: ServerId,
    pub url: String,
    pub info: Result<ServerInfo, ClientError>,
}

/// What happened, for the core to decide about.
#[derive(Debug)]
pub enum Input {
    /// The next input line (the shell reads only while [`Core::wants_input`]).
    Line(Line),
    /// A request made by the caller, sent as it is (the sweep's workload).
    Request {
        id: Id,
        req: CompletionRequest,
    },
    /// Every input line was read.
    InputEnd,
    /// A request sent with [`Action::Send`] came back.
    Done {
        id: ReqId,
        attempt: Attempt,
    },
    /// A probe started with [`Action::Probe`] answered.
    Probe {
        inst: usize,
        result: ProbeResult,
    },
    /// The time [`Core::next_wake`] asked for has come (or any later time).
    Tick,
    /// As [`Input::Tick`], with the output tokens each request in flight has streamed so far
    /// (those that streamed none may be left out).
    Streamed(Vec<(ReqId, u64)>),
    /// Ctrl-C, SIGTERM or SIGHUP: stop dispatching and wind down within the grace period.
    Cancel,
    Upload(UploadEvent),
    /// A host's connection dropped (or its keepalives went unanswered).
    HostLost {
        host: String,
        reason: HostLoss,
    },
    /// A host's connection is back.
    HostBack {
        host: String,
    },
}

/// How one request went.
#[derive(Debug)]
pub enum Attempt {
    Finished {
        completion: Completion,
        /// From sending to the whole answer.
        latency: Duration,
    },
    Failed(ClientError),
}

/// What a probe asks a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeKind {
    /// `/metrics`: load for the in-flight limit and the watchdog, and liveness while it answers.
    Metrics,
    /// `/server_info`, for liveness where metrics are off. Never `/health`: on SGLang it runs a
    /// generation that a busy server may answer late.
    Alive,
    /// `/health` then `/server_info` of an instance that is out: is it back, with what cap?
    Revive,
}

#[derive(Debug)]
pub enum ProbeResult {
    Metrics(Result<Metrics, ClientError>),
    Alive(Result<(), ClientError>),
    Revive(Result<ServerInfo, ReviveError>),
}

/// What the shell must do.
#[derive(Debug)]
pub enum Action {
    /// Send `req` to instance `inst`, and answer with [`Input::Done`] under `id`.
    Send {
        id: ReqId,
        inst: usize,
        req: Arc<CompletionRequest>,
    },
    /// Drop the requests in flight on `inst`: the core has already taken their jobs back, and
    /// ignores their answers.
    Abort(usize),
    /// Ask instance `inst`, and answer with [`Input::Probe`].
    Probe {
        inst: usize,
        kind: ProbeKind,
    },
    /// Append to the journal.
    Write(Entry),
    Event(Event),
    /// A snapshot to write as progress.json.
    Progress(Progress),
    /// The run is over: drop whatever is still in flight (it is not written) and stop.
    Finish(End),
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
pub enum End {
    /// Every prompt is in the output or in `failed.jsonl`.
    Done,
    /// Cancelled: what was in flight after the grace period is sent again by `--resume`.
    Interrupted,
    /// No instance came back within the stall timeout.
    Stalled,
    /// `--abort-below` stopped the run.
    BelowExpected(Finding),
}

impl End {
    /// The status progress.json ends with; a run whose shards did not all upload has failed.
    /// A stall is an interruption: nothing failed, and `--resume` goes on.
    pub fn status(&self, uploads_complete: bool) -> Status {
        match self {
            End::Done if uploads_complete => Status::Done,
            End::Interrupted | End::Stalled => Status::Interrupted,
            End::Done | End::BelowExpected(_) => Status::Failed,
        }
    }
}

/// A request on its way, with the job it carries.
struct InFlight {
    inst: usize,
    job: Job,
    /// Output tokens it has streamed so far.
    streamed: u64,
}

/// The wind-down after a stop: requests in flight may finish until `deadline`.
struct Stopping {
    end: End,
    deadline: Time,
}

/// When the periodic work is due next.
struct Timers {
    metrics: Time,
    liveness: Time,
    progress: Time,
}

/// Totals of this run, on top of the [`Baseline`].
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    completed: u64,
    failed: u64,
    /// Written to `retry.jsonl`: failed by the fleet, sent again by `--resume`.
    waiting_retry: u64,
    in_tokens: u64,
    out_tokens: u64,
    /// Output tokens as they streamed: finished requests' and those still going (and those
    /// of requests that failed after streaming, work the GPUs did all the same).
    live_tokens: u64,
    /// Prompt tokens the servers' radix caches served: prefill saved.
    cached_tokens: u64,
    s3_uploaded: u64,
    s3_bytes: u64,
}

pub struct Core {
    cfg: CoreConfig,
    base: Baseline,
    model: Option<String>,
    insts: Vec<Inst>,
    /// Decides which ready job goes to which instance; it holds their tickets.
    placement: Box<dyn Placement>,
    /// The jobs ready to go, by the ticket the placement holds.
    ready: FxHashMap<Ticket, Job>,
    next_ticket: u64,
    /// The instances as the placement sees them: brought up to date as each input is decided,
    /// before dispatch, and read by [`Core::wants_input`] until the next.
    view: Vec<ServerState>,
    delayed: BinaryHeap<Delayed>,
    in_flight: FxHashMap<ReqId, InFlight>,
    next_id: ReqId,
    seq: u64,
    rng: SmallRng,
    counts: Counts,
    window: RateWindow,
    /// The output lengths seen, and the sweep's prior: the ETA's expected work per prompt.
    lengths: LengthModel,
    input_open: bool,
    paused_since: Option<Time>,
    stop: Option<Stopping>,
    timers: Timers,
    /// The last watchdog finding's cause, so one cause is announced once.
    warned: Option<Cause>,
    /// What the prefix plan expects of the servers' caches, under prefix placement.
    cache: Option<CacheExpectation>,
    /// Whether the cache's finding was announced (once a run).
    cache_warned: bool,
    /// Every finding announced, for progress.json.
    warnings: Vec<String>,
    /// Whether the open-file budget's hold on the in-flight limit was announced.
    files_said: bool,
    /// Whether running out of open files was announced.
    out_of_files_said: bool,
    finished: bool,
}

impl Core {
    /// A core over `servers` at time zero that sends each request to the least-loaded one;
    /// servers that did not answer start out of service and are probed until they do.
    pub fn new(cfg: CoreConfig, base: Baseline, servers: Vec<Server>) -> Core {
        Core::with_placement(cfg, base, servers, Box::new(LeastLoaded::new()))
    }

    /// A core whose requests go where `placement` says.
    pub fn with_placement(
        cfg: CoreConfig,
        base: Baseline,
        servers: Vec<Server>,
        placement: Box<dyn Placement>,
    ) -> Core {
        let model = servers.iter().find_map(|s| {
            let i = s.info.as_ref().ok()?;
            i.served_model_name.clone().or_else(|| i.model_path.clone())
        });
        let ceiling = cfg.files.map_or(u32::MAX, |f| f.per_server(servers.len()));
        let request_tokens = f64::from(cfg.max_tokens);
        let mut hosts: Vec<String> = Vec::new();
        let insts = servers
            .into_iter()
            .map(|s| {
                let host = s.id.host().map(|h| {
                    hosts.iter().position(|k| k == h).unwrap_or_else(|| {
                        hosts.push(h.to_string());
                        hosts.len() - 1
                    })
                });
                Inst::new(s, host, &cfg, ceiling, request_tokens)
            })
            .collect();
        let mut window = RateWindow::new(cfg.timing.rate_window);
        window.record(Time::ZERO, 0, 0);
        let lengths = LengthModel::new(
            cfg.expected.as_ref().and_then(|e| e.output_tokens.as_ref()),
            None,
        );
        let mut core = Core {
            rng: SmallRng::seed_from_u64(cfg.seed),
            timers: Timers {
                metrics: Time::ZERO,
                liveness: cfg.timing.health_every,
                progress: Time::ZERO,
            },
            cfg,
            base,
            model,
            insts,
            placement,
            ready: FxHashMap::default(),
            next_ticket: 0,
            view: Vec::new(),
            delayed: BinaryHeap::new(),
            in_flight: FxHashMap::default(),
            next_id: 0,
            seq: 0,
            counts: Counts::default(),
            lengths,
            window,
            input_open: true,
            paused_since: None,
            stop: None,
            warned: None,
            cache: None,
            cache_warned: false,
            warnings: Vec::new(),
            files_said: false,
            out_of_files_said: false,
            finished: false,
        };
        core.refresh_view();
        core
    }

    /// Holds the servers' caches to what the prefix plan expects: the watchdog warns when they
    /// serve far less.
    pub fn expect_cache(&mut self, e: CacheExpectation) {
        self.cache = Some(e);
    }

    /// Every instance as the run starts, for the caller to show.
    pub fn instances(&self) -> Vec<InstanceInfo> {
        self.insts.iter().map(Inst::info).collect()
    }

    /// Decides about one input at `now`; returns what the shell must do, in order.
    pub fn on(&mut self, now: Time, input: Input) -> Vec<Action> {
        let mut out = Vec::new();
        if self.finished {
            return out;
        }
        match input {
            Input::Line(line) => self.intake(line, &mut out),
            Input::Request { id, req } => {
                let job = self.job(0, id, 0, req);
                self.queue(job);
            }
            Input::InputEnd => {
                self.input_open = false;
                self.placement.input_end();
            }
            Input::Done { id, attempt } => self.done(now, id, attempt, &mut out),
            Input::Probe { inst, result } => self.probed(now, inst, result, &mut out),
            Input::Tick => {}
            Input::Streamed(counts) => self.streamed(counts),
            Input::Cancel => self.cancel(now, &mut out),
            Input::Upload(e) => {
                self.count_upload(&e);
                out.push(Action::Event(Event::Upload(e)));
            }
            Input::HostLost { host, reason } => self.host_lost(now, &host, reason, &mut out),
            Input::HostBack { host } => self.host_back(&host, &mut out),
        }
        self.advance(now, &mut out);
        out
    }

    /// Counts a shard in the upload destination; the uploader's last events come after the run
    /// itself has finished.
    pub fn count_upload(&mut self, e: &UploadEvent) {
        if let UploadEvent::Uploaded { bytes, .. } | UploadEvent::AlreadyThere { bytes, .. } = e {
            self.counts.s3_uploaded += 1;
            self.counts.s3_bytes += bytes;
        }
    }

    /// Whether the shell should read the next input line: there is room for it now.
    pub fn wants_input(&self) -> bool {
        !self.finished
            && self.input_open
            && self.stop.is_none()
            && self.placement.wants_input(&self.view)
    }

    /// When the core next needs an [`Input::Tick`] (it may get one earlier).
    pub fn next_wake(&self) -> Option<Time> {
        if self.finished {
            return None;
        }
        let stall = self.paused_since.map(|p| p + self.cfg.stall_timeout);
        [
            Some(self.timers.metrics),
            Some(self.timers.progress),
            self.delayed.peek().map(|d| d.due),
            self.stop.as_ref().map(|s| s.deadline),
            stall,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The run as progress.json shows it at `now`; a running job with nothing healthy shows
    /// `paused`.
    pub fn snapshot(&self, now: Time, status: Status) -> Progress {
        let status = match status {
            Status::Running if self.paused_since.is_some() => Status::Paused,
            s => s,
        };
        watch::snapshot(self, now, status)
    }

    /// The periodic work that is due, the wind-down, dispatch, and whether the run is over.
    fn advance(&mut self, now: Time, out: &mut Vec<Action>) {
        while self.delayed.peek().is_some_and(|d| d.due <= now) {
            let d = self.delayed.pop().expect("peeked");
            self.queue(d.job);
        }
        if now >= self.timers.metrics {
            let liveness = now >= self.timers.liveness;
            if liveness {
                self.timers.liveness = now + self.cfg.timing.health_every;
            }
            self.timers.metrics = now + self.cfg.timing.metrics_every;
            if self.counts.completed > 0 {
                self.learn_request_tokens();
            }
            self.schedule_probes(liveness, out);
            self.record_rates(now);
            self.watch_cache(out);
            if self.stop.is_none()
                && let Some(finding) = self.watch(now, out)
            {
                self.begin_stop(now, StopReason::BelowExpected(finding), out);
            }
        }
        if let Some(since) = self.paused_since
            && self.stop.is_none()
            && now >= since + self.cfg.stall_timeout
        {
            self.begin_stop(now, StopReason::Stalled, out);
        }
        if now >= self.timers.progress {
            self.timers.progress = now + self.cfg.timing.progress_every;
            out.push(Action::Progress(self.snapshot(now, Status::Running)));
        }
        if let Some(stop) = &self.stop {
            if self.in_flight.is_empty() || now >= stop.deadline {
                // Requests still out are dropped unwritten: a resume sends them again.
                let end = stop.end.clone();
                self.finish(end, out);
            }
            return;
        }
        self.say_file_budget(out);
        self.dispatch(out);
        if !self.input_open
            && self.ready.is_empty()
            && self.delayed.is_empty()
            && self.in_flight.is_empty()
        {
            self.finish(End::Done, out);
        }
    }

    /// Gives every controller the job's observed mean request size in place of its guess.
    pub(super) fn learn_request_tokens(&mut self) {
        let request_tokens = self.request_tokens();
        for inst in &mut self.insts {
            inst.ctl.set_tokens_per_request(request_tokens);
        }
    }

    /// The KV tokens a request holds: the observed mean prompt + output once requests have
    /// finished, else `max_tokens` (the prompt unknown yet).
    pub(super) fn request_tokens(&self) -> f64 {
        let c = &self.counts;
        if c.completed == 0 {
            return f64::from(self.cfg.max_tokens);
        }
        (c.in_tokens + c.out_tokens) as f64 / c.completed as f64
    }

    /// Says once that the open-file limit holds the in-flight limit below what the mode wants.
    fn say_file_budget(&mut self, out: &mut Vec<Action>) {
        let Some(files) = self.cfg.files else { return };
        if self.files_said {
            return;
        }
        let held: Vec<&Inst> = self
            .insts
            .iter()
            .filter(|i| i.up && i.ctl.held_by_budget())
            .collect();
        if held.is_empty() {
            return;
        }
        self.files_said = true;
        out.push(Action::Event(Event::FileBudget {
            open_files_limit: files.open_files_limit,
            max_in_flight: files.max_in_flight,
            wanted: held.iter().map(|i| i.ctl.wanted()).max().unwrap_or(0),
            per_server: held[0].ctl.limit(),
        }));
    }

    fn finish(&mut self, end: End, out: &mut Vec<Action>) {
        for (i, inst) in self.insts.iter_mut().enumerate() {
            if inst.in_flight > 0 {
                inst.in_flight = 0;
                out.push(Action::Abort(i));
            }
        }
        self.in_flight.clear();
        self.finished = true;
        out.push(Action::Finish(end));
    }

    /// The first cancel starts the wind-down; one during a wind-down ends its grace at once.
    fn cancel(&mut self, now: Time, out: &mut Vec<Action>) {
        match &mut self.stop {
            Some(stop) => stop.deadline = now,
            None => self.begin_stop(now, StopReason::Interrupted, out),
        }
    }

    fn begin_stop(&mut self, now: Time, reason: StopReason, out: &mut Vec<Action>) {
        let grace = match reason {
            StopReason::Interrupted | StopReason::BelowExpected(_) => self.cfg.grace,
            StopReason::Stalled => Duration::ZERO,
        };
        // What was not sent yet is not written: a resume sends it.
        self.ready.clear();
        self.placement.clear();
        self.delayed.clear();
        self.input_open = false;
        out.push(Action::Event(Event::Stopping {
            reason: reason.clone(),
            in_flight: self.in_flight.len() as u64,
        }));
        self.stop = Some(Stopping {
            end: reason.into(),
            deadline: now + grace,
        });
    }

    /// Sends ready jobs where the placement says, while it finds them room.
    fn dispatch(&mut self, out: &mut Vec<Action>) {
        self.refresh_view();
        if self.ready.is_empty() {
            return;
        }
        while let Some((ticket, i)) = self.placement.next(&self.view) {
            debug_assert!(self.view[i].free() > 0, "placed on a server without room");
            let mut job = self
                .ready
                .remove(&ticket)
                .expect("the placement returns only tickets it holds");
            // More output tokens than the context holds never fit, and chat refuses them before
            // reading the prompt (srt/entrypoints/openai/serving_chat.py): ask for at most the
            // context at once.
            if let Some(c) = self.insts[i].context_len
                && u64::from(job.req.max_tokens) > c
            {
                Arc::make_mut(&mut job.req).max_tokens = c.min(u64::from(u32::MAX)) as u32;
            }
            let id = self.next_id;
            self.next_id += 1;
            self.insts[i].in_flight += 1;
            self.view[i].in_flight += 1;
            out.push(Action::Send {
                id,
                inst: i,
                req: job.req.clone(),
            });
            self.in_flight.insert(
                id,
                InFlight {
                    inst: i,
                    job,
                    streamed: 0,
                },
            );
        }
    }

    /// Brings the placement's view of the instances up to date.
    fn refresh_view(&mut self) {
        let insts = &self.insts;
        let any_down = insts.iter().any(|i| !i.up);
        let failing =
            |host: usize| any_down && insts.iter().any(|i| i.host_key == Some(host) && !i.up);
        self.view.clear();
        self.view.extend(insts.iter().map(|i| ServerState {
            up: i.up,
            in_flight: i.in_flight,
            limit: i.ctl.limit(),
            host: i.host_key,
            host_failing: i.host_key.is_some_and(failing),
            completed: i.completed,
        }));
    }

    /// A new job, with the next ticket.
    fn job(&mut self, line: u64, id: Id, hash: u64, req: CompletionRequest) -> Job {
        let ticket = Ticket(self.next_ticket);
        self.next_ticket += 1;
        Job::new(ticket, line, id, hash, req)
    }

    /// Hands a job to the placement, at the back of its queue.
    fn queue(&mut self, job: Job) {
        self.placement.queue(job.request());
        self.ready.insert(job.ticket, job);
    }

    /// Hands a job back to the placement, to go again at once.
    fn requeue(&mut self, job: Job) {
        self.placement.requeue(job.request());
        self.ready.insert(job.ticket, job);
    }
}
