//! The core's decisions on fake time: a harness that feeds it inputs and keeps what it asked
//! for, then one test per decision. `faults` covers instances going out, pausing, the wind-down,
//! the watchdog and how a run ends; `placement` the seam to the placement policy.

mod batch;
mod capacity;
mod faults;
mod placement;
mod streamed;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::*;
use crate::generate::input::{Ids, parse_line};
use crate::sglang::client::Prompt;
use crate::sglang::overflow::Overflow;

const SEC: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

fn cfg() -> CoreConfig {
    CoreConfig {
        api: None,
        max_tokens: 4096,
        temperature: None,
        top_p: None,
        concurrency: ConcurrencyMode::Auto,
        max_retries: 3,
        stall_timeout: Duration::from_secs(600),
        warmup: Duration::from_secs(60),
        abort_below: None,
        grace: Duration::from_secs(30),
        expected: None,
        timing: Timing::default(),
        files: None,
        seed: 7,
        format: OutputFormat::Fleet,
    }
}

/// `/server_info` of a server with `cap` and an 8192-token context, whose KV pool holds more
/// than `cap` requests of `max_tokens` (a dense server's pool binds in `capacity`).
fn info(cap: u64) -> ServerInfo {
    ServerInfo::from_json(json!({
        "version": "0.5.23", "max_total_num_tokens": 4_000_000, "context_length": 8192,
        "served_model_name": "qwen", "mamba_radix_cache_strategy": "no_buffer",
        "internal_states": [{"effective_max_running_requests_per_dp": cap}],
    }))
}

fn server(name: &str, cap: u64) -> Server {
    Server {
        id: ServerId::named(name),
        url: format!("http://{name}"),
        info: Ok(info(cap)),
    }
}

/// The server on `gpu` of inventory host `host`.
fn on_host(host: &str, gpu: u32, cap: u64) -> Server {
    let id = ServerId::gpu(host, gpu);
    Server {
        url: format!("http://{id}"),
        id,
        info: Ok(info(cap)),
    }
}

fn completion(tokens: u64) -> Completion {
    Completion {
        text: "out".into(),
        reasoning: None,
        prompt_tokens: 10,
        completion_tokens: tokens,
        finish_reason: Some("stop".into()),
        body: None,
        response_id: None,
        cached_tokens: None,
    }
}

fn status(code: u16) -> ClientError {
    ClientError::Status {
        url: "u".into(),
        status: code,
        body: String::new(),
    }
}

fn refused() -> ClientError {
    ClientError::Connect {
        url: "u".into(),
        reason: "Connection refused".into(),
    }
}

fn reset() -> ClientError {
    ClientError::Transport {
        url: "u".into(),
        reason: "connection closed before message completed".into(),
    }
}

fn overflow(o: Overflow) -> ClientError {
    ClientError::ContextOverflow {
        url: "u".into(),
        overflow: o,
        message: format!("the server: {o}"),
    }
}

/// A core on fake time, with everything it asked for kept for the test to read.
struct Harness {
    core: Core,
    now: Time,
    /// Requests sent and not answered yet: id → (instance, request).
    out: HashMap<ReqId, (usize, Arc<CompletionRequest>)>,
    /// Every send, in order.
    sends: Vec<(ReqId, usize)>,
    completions: Vec<Value>,
    failures: Vec<Value>,
    /// `retry.jsonl`: failed by the fleet, to send again.
    retries: Vec<Value>,
    events: Vec<Event>,
    probes: Vec<(usize, ProbeKind)>,
    aborts: Vec<usize>,
    progress: Vec<Progress>,
    end: Option<End>,
}

impl Harness {
    fn new(servers: Vec<Server>) -> Harness {
        Harness::with(cfg(), Baseline::default(), servers)
    }

    fn with(cfg: CoreConfig, base: Baseline, servers: Vec<Server>) -> Harness {
        Harness {
            core: Core::new(cfg, base, servers),
            now: Time::ZERO,
            out: HashMap::new(),
            sends: Vec::new(),
            completions: Vec::new(),
            failures: Vec::new(),
            retries: Vec::new(),
            events: Vec::new(),
            probes: Vec::new(),
            aborts: Vec::new(),
            progress: Vec::new(),
            end: None,
        }
    }

    fn on(&mut self, input: Input) {
        for action in self.core.on(self.now, input) {
            match action {
                Action::Send { id, inst, req } => {
                    self.out.insert(id, (inst, req));
                    self.sends.push((id, inst));
                }
                Action::Abort(i) => {
                    self.aborts.push(i);
                    self.out.retain(|_, (inst, _)| *inst != i);
                }
                Action::Probe { inst, kind } => self.probes.push((inst, kind)),
                Action::Write(Entry::Completion(b)) => {
                    self.completions.push(serde_json::from_slice(&b).unwrap())
                }
                Action::Write(Entry::Failure(b)) => {
                    self.failures.push(serde_json::from_slice(&b).unwrap())
                }
                Action::Write(Entry::Retry(b)) => {
                    self.retries.push(serde_json::from_slice(&b).unwrap())
                }
                Action::Write(Entry::Progress(p)) => self.progress.push(*p),
                Action::Write(Entry::Timeline(_)) => panic!("the timeline is the shell's"),
                Action::Event(e) => self.events.push(e),
                Action::Progress(p) => self.progress.push(p),
                Action::Finish(end) => {
                    assert!(self.end.is_none(), "finished twice");
                    self.end = Some(end);
                    self.out.clear();
                }
            }
        }
    }

    /// Prompt lines `from..to` with ids `p<n>`.
    fn lines(&mut self, from: u64, to: u64) {
        for n in from..to {
            self.line(
                n,
                &json!({"id": format!("p{n}"), "prompt": format!("prompt {n}")}).to_string(),
            );
        }
    }

    fn line(&mut self, number: u64, text: &str) {
        let line = parse_line(number, text.as_bytes(), &mut Ids::default());
        self.on(Input::Line(line));
    }

    /// Feeds lines as the shell does: only while the core wants them, until `to`.
    fn fill(&mut self, next: &mut u64, to: u64) {
        while *next < to && self.core.wants_input() {
            self.lines(*next, *next + 1);
            *next += 1;
        }
    }

    fn ok(&mut self, id: ReqId) {
        self.answer(
            id,
            Attempt::Finished {
                completion: completion(100),
                latency: SEC,
            },
        );
    }

    fn err(&mut self, id: ReqId, e: ClientError) {
        self.answer(id, Attempt::Failed(e));
    }

    fn answer(&mut self, id: ReqId, attempt: Attempt) {
        self.out.remove(&id);
        self.on(Input::Done { id, attempt });
    }

    /// The oldest request still out on `inst`.
    fn oldest_on(&self, inst: usize) -> ReqId {
        *self
            .out
            .iter()
            .filter(|(_, (i, _))| *i == inst)
            .map(|(id, _)| id)
            .min()
            .expect("a request out on that instance")
    }

    fn oldest(&self) -> ReqId {
        *self.out.keys().min().expect("a request out")
    }

    fn out_on(&self, inst: usize) -> usize {
        self.out.values().filter(|(i, _)| *i == inst).count()
    }

    /// Advances to each wake-up the core asks for until it sends something; returns how long
    /// that took.
    fn until_sent(&mut self) -> Duration {
        let (t0, sends) = (self.now, self.sends.len());
        while self.sends.len() == sends {
            let wake = self.core.next_wake().expect("something to wait for");
            self.at(wake);
        }
        self.now - t0
    }

    fn at(&mut self, t: Time) {
        self.now = t;
        self.on(Input::Tick);
    }

    fn later(&mut self, dt: Duration) {
        self.at(self.now + dt);
    }

    fn probe(&mut self, inst: usize, result: ProbeResult) {
        self.on(Input::Probe { inst, result });
    }

    fn metrics(running: f64, queued: f64, decode: f64) -> ProbeResult {
        ProbeResult::Metrics(Ok(Metrics {
            num_running_reqs: Some(running),
            num_queue_reqs: Some(queued),
            gen_throughput: Some(decode),
            ..Metrics::default()
        }))
    }

    fn events_matching(&self, f: impl Fn(&Event) -> bool) -> usize {
        self.events.iter().filter(|e| f(e)).count()
    }

    fn failed_ids(&self) -> Vec<(String, String)> {
        self.failures
            .iter()
            .map(|f| {
                let id = match &f["id"] {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                (id, f["reason"].as_str().unwrap().to_string())
            })
            .collect()
    }
}

#[test]
fn each_instance_starts_at_its_cap_plus_a_small_margin() {
    let mut h = Harness::new(vec![server("a", 8), server("b", 72)]);
    let mut next = 0;
    h.fill(&mut next, 1000);
    assert_eq!(h.out_on(0), 10, "cap 8 + margin 2");
    assert_eq!(h.out_on(1), 81, "cap 72 + margin 9");
    assert!(!h.core.wants_input(), "no room, no reading");
    let infos = h.core.instances();
    assert_eq!((infos[0].concurrency, infos[1].concurrency), (10, 81));
}

#[test]
fn a_fixed_concurrency_ignores_the_cap_and_an_unknown_cap_starts_at_64() {
    let mut c = cfg();
    c.concurrency = ConcurrencyMode::Fixed(32);
    let mut h = Harness::with(c, Baseline::default(), vec![server("a", 72)]);
    let mut next = 0;
    h.fill(&mut next, 1000);
    assert_eq!(h.out_on(0), 32);
    let unknown = Server {
        info: Ok(ServerInfo::from_json(json!({}))),
        ..server("u", 0)
    };
    let mut h = Harness::new(vec![unknown]);
    let mut next = 0;
    h.fill(&mut next, 1000);
    assert_eq!(h.out_on(0), 64);
}

#[test]
fn work_goes_to_the_instance_with_the_most_free_share() {
    let mut h = Harness::new(vec![server("a", 8), server("b", 8)]);
    let mut next = 0;
    h.fill(&mut next, 20);
    // Free two on a: the next two lines go there.
    let (x, y) = (h.oldest_on(0), {
        let mut ids: Vec<_> = h
            .out
            .iter()
            .filter(|(_, (i, _))| *i == 0)
            .map(|(id, _)| *id)
            .collect();
        ids.sort();
        ids[1]
    });
    h.ok(x);
    h.ok(y);
    h.fill(&mut next, 22);
    assert_eq!((h.out_on(0), h.out_on(1)), (10, 10));
    assert_eq!(h.sends.last().unwrap().1, 0);
}

#[test]
fn a_finished_request_is_written_once_with_its_id_and_instance() {
    let mut h = Harness::new(vec![server("a", 8)]);
    h.lines(1, 2);
    let id = h.oldest();
    h.ok(id);
    assert_eq!(h.completions.len(), 1);
    let c = &h.completions[0];
    assert_eq!(
        (c["id"].as_str(), c["instance"].as_str()),
        (Some("p1"), Some("a"))
    );
    assert_eq!(
        (c["completion_tokens"].as_u64(), c["latency_s"].as_f64()),
        (Some(100), Some(1.0))
    );
    // A second answer for the same request (it cannot happen, but must not double-write).
    h.ok(id);
    assert_eq!(h.completions.len(), 1);
}

#[test]
fn requests_carry_the_served_model_and_the_flags() {
    let mut c = cfg();
    c.temperature = Some(0.7);
    c.max_tokens = 512;
    let mut h = Harness::with(c, Baseline::default(), vec![server("a", 8)]);
    h.lines(1, 2);
    let (_, req) = &h.out[&h.oldest()];
    assert_eq!(req.model.as_deref(), Some("qwen"));
    assert_eq!((req.max_tokens, req.temperature), (512, Some(0.7)));
    assert_eq!(req.api, Api::Generate);
}

#[test]
fn the_endpoint_follows_the_prompt_kind_unless_told() {
    let mut h = Harness::new(vec![server("a", 8)]);
    h.line(
        1,
        r#"{"id":"m","messages":[{"role":"user","content":"hi"}]}"#,
    );
    h.line(
        2,
        r#"{"custom_id":"b","url":"/v1/completions","body":{"prompt":"hi","max_tokens":7}}"#,
    );
    let mut reqs: Vec<_> = h.out.iter().map(|(id, (_, r))| (*id, r.clone())).collect();
    reqs.sort_by_key(|(id, _)| *id);
    assert_eq!(reqs[0].1.api, Api::Chat);
    assert_eq!((reqs[1].1.api, reqs[1].1.max_tokens), (Api::Completions, 7));

    let mut c = cfg();
    c.api = Some(Api::Chat);
    let mut h = Harness::with(c, Baseline::default(), vec![server("a", 8)]);
    h.lines(1, 2);
    let (_, req) = &h.out[&h.oldest()];
    assert_eq!(req.api, Api::Chat);
    assert!(matches!(req.prompt, Prompt::Text(_)));
}

#[test]
fn messages_for_generate_and_malformed_lines_fail_for_their_own_reasons() {
    let mut c = cfg();
    c.api = Some(Api::Generate);
    let mut h = Harness::with(c, Baseline::default(), vec![server("a", 8)]);
    h.line(
        1,
        r#"{"id":"m","messages":[{"role":"user","content":"hi"}]}"#,
    );
    h.line(2, r#"{"id":"x","prompt":"#);
    assert!(h.out.is_empty());
    let ids = h.failed_ids();
    assert_eq!(ids[0], ("m".to_string(), "unsupported_prompt".to_string()));
    assert_eq!(ids[1].1, "malformed_line");
    assert!(
        ids[1].0.starts_with("sha256:"),
        "a line without a readable id: {ids:?}"
    );
    assert_eq!(h.failures[1]["line"], 2);
    assert_eq!(
        h.failures[1]["line_hash"].as_str().map(str::len),
        Some(16),
        "so --retry-failed can tell an edited line"
    );
    assert_eq!(
        h.events_matching(|e| matches!(e, Event::MalformedLine { line: 2, .. })),
        1
    );
}

#[test]
fn max_tokens_over_the_context_is_lowered_to_it_before_sending() {
    let mut h = Harness::new(vec![server("a", 8)]);
    h.line(
        1,
        r#"{"id":"c","messages":[{"role":"user","content":"hi"}]}"#,
    );
    let mut c = cfg();
    c.max_tokens = 9000;
    let mut h2 = Harness::with(c, Baseline::default(), vec![server("a", 8)]);
    h2.lines(1, 2);
    assert_eq!(h2.out[&h2.oldest()].1.max_tokens, 8192);
    assert_eq!(
        h.out[&h.oldest()].1.max_tokens,
        4096,
        "within the context: as asked"
    );
}

#[test]
fn a_request_the_caller_made_is_sent_as_it_is() {
    let mut h = Harness::new(vec![server("a", 8)]);
    let req = CompletionRequest {
        api: Api::Chat,
        prompt: Prompt::Text("synthetic".into()),
        max_tokens: 64,
        temperature: None,
        top_p: None,
        model: None,
        extra: None,
    };
    h.on(Input::Request {
        id: Id::line(0),
        req: req.clone(),
    });
    assert_eq!(*h.out[&h.oldest()].1, req);
}

#[test]
fn metrics_grow_the_limit_when_the_server_idles_and_shrink_it_when_it_queues() {
    let mut h = Harness::new(vec![server("a", 72)]);
    let mut next = 0;
    h.fill(&mut next, 10_000);
    assert_eq!(h.out_on(0), 81);
    h.probe(0, Harness::metrics(60.0, 0.0, 1000.0));
    h.fill(&mut next, 10_000);
    assert_eq!(
        h.out_on(0),
        101,
        "idle batch slots, nothing queued: more in flight"
    );
    h.probe(0, Harness::metrics(72.0, 40.0, 1000.0));
    assert_eq!(
        h.core.instances()[0].concurrency,
        101,
        "a queue while the batch grows is prefill catching up"
    );
    h.probe(0, Harness::metrics(72.0, 40.0, 1000.0));
    assert_eq!(h.core.instances()[0].concurrency, 101, "the same reading");
    h.probe(0, Harness::metrics(72.0, 40.0, 990.0));
    assert_eq!(
        h.core.instances()[0].concurrency,
        86,
        "a long queue with the batch full: fewer"
    );
}

#[test]
fn probes_are_one_at_a_time_per_instance_and_metrics_go_every_second() {
    let mut h = Harness::new(vec![server("a", 8), server("b", 8)]);
    h.at(Time::ZERO);
    assert_eq!(h.probes, [(0, ProbeKind::Metrics), (1, ProbeKind::Metrics)]);
    h.later(SEC);
    assert_eq!(h.probes.len(), 2, "the first ones have not answered");
    h.probe(0, Harness::metrics(1.0, 0.0, 10.0));
    h.later(SEC);
    assert_eq!(h.probes.len(), 3);
    assert_eq!(h.probes[2], (0, ProbeKind::Metrics));
}

#[test]
fn next_wake_is_the_nearest_of_probes_progress_and_retries() {
    let mut h = Harness::new(vec![server("a", 8)]);
    h.at(Time::ZERO);
    assert_eq!(h.core.next_wake(), Some(SEC), "metrics every second");
    h.probe(0, Harness::metrics(1.0, 0.0, 10.0));
    h.lines(1, 2);
    h.later(300 * MS);
    h.err(h.oldest(), status(503));
    let wake = h.core.next_wake().unwrap();
    assert!(
        wake > 300 * MS && wake <= 800 * MS,
        "the retry's backoff: {wake:?}"
    );
}

#[test]
fn a_5xx_is_retried_after_a_backoff_on_another_instance() {
    let mut h = Harness::new(vec![server("a", 8), server("b", 8)]);
    h.lines(1, 2);
    let (id, first) = h.sends[0];
    h.err(id, status(503));
    assert!(h.out.is_empty(), "not before its backoff");
    h.later(250 * MS - MS);
    assert!(
        h.out.is_empty(),
        "the first wait is at least 250 ms (500 ms, jittered down to half)"
    );
    h.later(251 * MS);
    let (_, second) = *h.sends.last().unwrap();
    assert_eq!(h.sends.len(), 2);
    assert_ne!(first, second, "retried elsewhere");
    assert!(h.failures.is_empty());
}

#[test]
fn retries_back_off_exponentially_and_exhausted_ones_are_recorded() {
    let mut h = Harness::new(vec![server("a", 8)]);
    h.lines(1, 2);
    let mut waits = Vec::new();
    for _ in 0..4 {
        h.err(h.oldest(), status(500));
        if h.retries.is_empty() {
            waits.push(h.until_sent());
        }
    }
    // Three retries (--max-retries 3): 500 ms, 1 s, 2 s ceilings, each jittered into its upper half.
    assert_eq!(waits.len(), 3);
    for (w, ceiling) in waits.iter().zip([500 * MS, 1000 * MS, 2000 * MS]) {
        assert!(*w >= ceiling / 2 && *w <= ceiling, "{w:?} for {ceiling:?}");
    }
    // Not the prompt's fault: not failed for good, but kept for --resume to send again.
    assert!(h.failures.is_empty());
    assert_eq!(h.retries.len(), 1);
    assert_eq!(
        (h.retries[0]["id"].as_str(), h.retries[0]["reason"].as_str()),
        (Some("p1"), Some("retries_exhausted"))
    );
    let p = h.core.snapshot(h.now, Status::Running);
    assert_eq!((p.failed, p.waiting_retry), (0, 1));
    assert!(h.retries[0]["error"].as_str().unwrap().contains("HTTP 500"));
}

#[test]
fn rate_limits_and_timeouts_are_retried_other_4xx_are_rejected() {
    let mut h = Harness::new(vec![server("a", 8)]);
    h.lines(1, 4);
    let mut ids: Vec<ReqId> = h.out.keys().copied().collect();
    ids.sort();
    h.err(ids[0], status(429));
    h.err(ids[1], ClientError::Timeout { url: "u".into() });
    h.err(ids[2], status(400));
    assert_eq!(h.failed_ids(), [("p3".to_string(), "rejected".to_string())]);
    h.later(2 * SEC);
    assert_eq!(h.out.len(), 2, "both retried");
}

#[test]
fn an_answer_that_is_not_a_completion_is_a_bad_response() {
    let mut h = Harness::new(vec![server("a", 8)]);
    h.lines(1, 2);
    h.err(
        h.oldest(),
        ClientError::Decode {
            url: "u".into(),
            reason: "missing field `text`".into(),
        },
    );
    assert_eq!(
        h.failed_ids(),
        [("p1".to_string(), "bad_response".to_string())]
    );
}

#[test]
fn the_same_seed_makes_the_same_decisions() {
    let run = |seed| {
        let mut c = cfg();
        c.seed = seed;
        let mut h = Harness::with(c, Baseline::default(), vec![server("a", 8)]);
        h.lines(1, 6);
        let ids: Vec<ReqId> = {
            let mut v: Vec<_> = h.out.keys().copied().collect();
            v.sort();
            v
        };
        for id in ids {
            h.err(id, status(503));
        }
        h.core.next_wake()
    };
    assert_eq!(run(1), run(1));
    assert_ne!(run(1), run(2), "jitter spreads retries");
}

#[test]
fn an_overflow_is_clamped_once_to_the_room_beside_the_prompt() {
    let mut c = cfg();
    c.max_tokens = 8000;
    let mut h = Harness::with(c, Baseline::default(), vec![server("a", 8)]);
    h.lines(1, 2);
    h.err(
        h.oldest(),
        overflow(Overflow::Total {
            prompt_tokens: 1000,
            context_len: 8192,
        }),
    );
    let (_, req) = &h.out[&h.oldest()];
    assert_eq!(req.max_tokens, 7191, "C - P - 1, sent again at once");
    h.err(
        h.oldest(),
        overflow(Overflow::Total {
            prompt_tokens: 1100,
            context_len: 8192,
        }),
    );
    assert_eq!(
        h.failed_ids(),
        [("p1".to_string(), "context_overflow".to_string())]
    );
}

#[test]
fn a_prompt_that_cannot_fit_is_prompt_too_long_even_after_a_clamp() {
    let mut h = Harness::new(vec![server("a", 8)]);
    h.lines(1, 3);
    let mut ids: Vec<ReqId> = h.out.keys().copied().collect();
    ids.sort();
    h.err(
        ids[0],
        overflow(Overflow::InputLonger {
            prompt_tokens: 9000,
            context_len: 8192,
        }),
    );
    h.err(
        ids[1],
        overflow(Overflow::Total {
            prompt_tokens: 8186,
            context_len: 8192,
        }),
    );
    assert_eq!(h.out[&h.oldest()].1.max_tokens, 5);
    h.err(
        h.oldest(),
        overflow(Overflow::InputLimit {
            prompt_tokens: 8186,
            max_input: 8186,
        }),
    );
    assert_eq!(
        h.failed_ids(),
        [
            ("p1".to_string(), "prompt_too_long".to_string()),
            ("p2".to_string(), "prompt_too_long".to_string())
        ]
    );
}

#[test]
fn chat_refusing_max_tokens_over_the_context_is_lowered_then_clamped() {
    let mut s = server("a", 8);
    // A server whose context the run does not know: the chat check's 400 tells it.
    s.info = Ok(ServerInfo::from_json(json!({
        "internal_states": [{"effective_max_running_requests_per_dp": 8}]
    })));
    let mut c = cfg();
    c.max_tokens = 9000;
    let mut h = Harness::with(c, Baseline::default(), vec![s]);
    h.line(
        1,
        r#"{"id":"c","messages":[{"role":"user","content":"hi"}]}"#,
    );
    h.err(
        h.oldest(),
        overflow(Overflow::CompletionTooLarge {
            requested: 9000,
            context_len: 8192,
        }),
    );
    assert_eq!(h.out[&h.oldest()].1.max_tokens, 8192);
    h.err(
        h.oldest(),
        overflow(Overflow::Total {
            prompt_tokens: 12,
            context_len: 8192,
        }),
    );
    assert_eq!(h.out[&h.oldest()].1.max_tokens, 8179);
    h.ok(h.oldest());
    assert!(h.failures.is_empty());
    assert_eq!(h.completions.len(), 1);
}

#[test]
fn progress_is_snapshotted_every_two_seconds_with_the_resumed_totals() {
    let base = Baseline {
        total: 100,
        completed: 40,
        failed: 2,
        input_tokens: 400,
        output_tokens: 4000,
    };
    let mut h = Harness::with(cfg(), base, vec![server("a", 8)]);
    h.at(Time::ZERO);
    assert_eq!(h.progress.len(), 1);
    h.lines(1, 2);
    h.ok(h.oldest());
    h.later(SEC);
    assert_eq!(h.progress.len(), 1);
    h.later(SEC);
    assert_eq!(h.progress.len(), 2);
    let p = h.progress.last().unwrap();
    assert_eq!((p.total, p.completed, p.failed), (100, 41, 2));
    assert_eq!(p.total_output_tokens, 4100);
    assert_eq!(p.status, Status::Running);
    assert_eq!(p.instances[0].completed, 1);
}

#[test]
fn upload_events_are_counted_and_passed_on() {
    let mut h = Harness::new(vec![server("a", 8)]);
    h.on(Input::Upload(UploadEvent::Uploaded {
        shard: "completions-00000.jsonl".into(),
        bytes: 1234,
        elapsed: SEC,
    }));
    h.core.count_upload(&UploadEvent::AlreadyThere {
        shard: "completions-00001.jsonl".into(),
        bytes: 10,
    });
    let p = h.core.snapshot(h.now, Status::Running);
    assert_eq!((p.s3_uploaded, p.s3_bytes), (2, 1244));
    assert_eq!(h.events_matching(|e| matches!(e, Event::Upload(_))), 1);
}
