//! Prompts as jobs: turning an input line into a request (or a failure of its own), and what
//! each answer means for it: written, clamped and sent again, moved to another server, retried
//! after a backoff, or failed for good with its [`FailureReason`].

use std::cmp::Ordering;
use std::sync::Arc;

use super::placement::{Outcome, Request, Ticket};
use super::{Action, Attempt, Core, DownReason, InFlight, ReqId, Time};
use crate::eta::Seen;
use crate::generate::Event;
use crate::generate::input::{Id, Line};
use crate::generate::journal::batch::{self, Answer};
use crate::generate::journal::{
    self, CompletionRecord, Entry, FailureReason, FailureRecord, OutputFormat,
};
use crate::generate::progress;
use crate::sglang::client::{Api, ClientError, CompletionRequest, Prompt};
use crate::sglang::overflow::Remedy;

/// A prompt whose connection drops this often is failed: it may be what crashes servers.
pub(super) const MAX_REDISPATCHES: u32 = 8;

/// A prompt on its way through the fleet.
#[derive(Debug)]
pub(super) struct Job {
    pub ticket: Ticket,
    pub line: u64,
    pub id: Id,
    /// The line's content hash, recorded with a failure.
    pub hash: u64,
    pub req: Arc<CompletionRequest>,
    /// Retryable failures so far (counted against `--max-retries`).
    pub attempts: u32,
    /// Times it was moved off a server that went away (not counted against `--max-retries`).
    pub redispatches: u32,
    /// Whether max_tokens was clamped to the room beside the prompt (C − P − 1) already.
    pub clamped: bool,
    /// max_tokens as the line asked, before any clamp.
    pub asked: u32,
    /// The instance that last failed it: the next try goes elsewhere when possible.
    pub avoid: Option<usize>,
}

impl Job {
    pub fn new(ticket: Ticket, line: u64, id: Id, hash: u64, req: CompletionRequest) -> Job {
        Job {
            ticket,
            line,
            id,
            hash,
            asked: req.max_tokens,
            req: Arc::new(req),
            attempts: 0,
            redispatches: 0,
            clamped: false,
            avoid: None,
        }
    }

    /// What the placement sees of it.
    pub fn request(&self) -> Request<'_> {
        Request {
            ticket: self.ticket,
            id: &self.id,
            line: self.line,
            req: &self.req,
            avoid: self.avoid,
        }
    }
}

/// Where a failure comes from: the prompt's id, line and content hash.
#[derive(Debug, Clone, Copy)]
pub(super) struct Origin<'a> {
    id: &'a Id,
    line: u64,
    hash: u64,
}

impl<'a> Origin<'a> {
    fn job(job: &'a Job) -> Self {
        Origin {
            id: &job.id,
            line: job.line,
            hash: job.hash,
        }
    }
}

/// A retry waiting for its backoff. The heap pops the earliest due, then the earliest queued.
#[derive(Debug)]
pub(super) struct Delayed {
    pub due: Time,
    pub seq: u64,
    pub job: Job,
}

impl PartialEq for Delayed {
    fn eq(&self, o: &Self) -> bool {
        (self.due, self.seq) == (o.due, o.seq)
    }
}
impl Eq for Delayed {}
impl PartialOrd for Delayed {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Delayed {
    fn cmp(&self, o: &Self) -> Ordering {
        (o.due, o.seq).cmp(&(self.due, self.seq))
    }
}

impl Core {
    /// Turns an input line into a queued job, or records it as failed for its own reasons.
    pub(super) fn intake(&mut self, line: Line, out: &mut Vec<Action>) {
        let Line {
            number,
            id,
            hash,
            parsed,
        } = line;
        let at = Origin {
            id: &id,
            line: number,
            hash,
        };
        let parsed = match parsed {
            Ok(p) => p,
            Err(error) => {
                let why = error.to_string();
                out.push(Action::Event(Event::MalformedLine {
                    line: number,
                    error,
                }));
                self.fail(at, FailureReason::MalformedLine, &why, out);
                return;
            }
        };
        // A Batch API output line holds an OpenAI body, so a bare prompt goes to completions.
        let api = self.cfg.api.or(parsed.api).unwrap_or(match parsed.prompt {
            Prompt::Messages(_) => Api::Chat,
            Prompt::Text(_) if self.cfg.format == OutputFormat::OpenaiBatch => Api::Completions,
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
            self.fail(at, FailureReason::UnsupportedPrompt, &error, out);
            return;
        }
        let req = CompletionRequest {
            api,
            prompt: parsed.prompt,
            max_tokens: parsed.max_tokens.unwrap_or(self.cfg.max_tokens),
            temperature: self.cfg.temperature,
            top_p: self.cfg.top_p,
            model: self.model.clone(),
            extra: parsed.extra,
        };
        let job = self.job(number, id, hash, req);
        self.queue(job);
    }

    /// Records a prompt that failed for its own reasons: final.
    pub(super) fn fail(
        &mut self,
        at: Origin<'_>,
        reason: FailureReason,
        error: &str,
        out: &mut Vec<Action>,
    ) {
        self.fail_with(at, reason, error, None, out);
    }

    /// [`Self::fail`], with the server's own words when it gave some: a Batch API line's
    /// `error.message` is the server's text, fleet's record keeps fleet's account.
    fn fail_with(
        &mut self,
        at: Origin<'_>,
        reason: FailureReason,
        error: &str,
        server: Option<&str>,
        out: &mut Vec<Action>,
    ) {
        let line_hash = Some(format!("{:016x}", at.hash));
        let record = match self.cfg.format {
            OutputFormat::Fleet => journal::encode(&FailureRecord {
                id: at.id,
                line: at.line,
                reason,
                error,
                line_hash,
            }),
            OutputFormat::OpenaiBatch => {
                let message = server.unwrap_or(error);
                batch::encode_failure(at.id, at.line, reason, message, line_hash)
            }
        };
        out.push(Action::Write(Entry::Failure(record)));
        self.counts.failed += 1;
    }

    /// Records a prompt the fleet kept failing (retries exhausted on 5xx, 429 or timeouts): it
    /// goes to `retry.jsonl`, and `--resume` sends it again.
    fn give_up(&mut self, job: &Job, error: &str, out: &mut Vec<Action>) {
        let reason = FailureReason::RetriesExhausted;
        let record = match self.cfg.format {
            OutputFormat::Fleet => journal::encode(&FailureRecord {
                id: &job.id,
                line: job.line,
                reason,
                error,
                line_hash: None,
            }),
            OutputFormat::OpenaiBatch => {
                batch::encode_failure(&job.id, job.line, reason, error, None)
            }
        };
        out.push(Action::Write(Entry::Retry(record)));
        self.counts.waiting_retry += 1;
    }

    /// A request came back: write it, or decide what its failure means.
    pub(super) fn done(&mut self, now: Time, id: ReqId, attempt: Attempt, out: &mut Vec<Action>) {
        // An answer to a request taken back (its instance went out) is dropped: the job is
        // already queued again, so it is written once.
        let Some(InFlight {
            inst: i,
            mut job,
            streamed,
        }) = self.in_flight.remove(&id)
        else {
            return;
        };
        self.insts[i].in_flight -= 1;
        let stopping = self.stop.is_some();
        let error = match attempt {
            Attempt::Finished {
                completion: c,
                latency,
            } => {
                let inst = &mut self.insts[i];
                let latency_s = progress::round(latency.as_secs_f64(), 3);
                let record = match self.cfg.format {
                    OutputFormat::Fleet => journal::encode(&CompletionRecord {
                        id: &job.id,
                        output: &c.text,
                        reasoning: c.reasoning.as_deref(),
                        prompt_tokens: c.prompt_tokens,
                        completion_tokens: c.completion_tokens,
                        finish_reason: c.finish_reason.as_deref(),
                        instance: &inst.id,
                        latency_s,
                    }),
                    OutputFormat::OpenaiBatch => batch::encode_answer(&Answer {
                        custom_id: &job.id,
                        body: c.body.as_deref().unwrap_or_default(),
                        request_id: c.response_id.as_deref(),
                        instance: &inst.id,
                        latency_s,
                        max_tokens: (job.asked, job.req.max_tokens),
                    }),
                };
                out.push(Action::Write(Entry::Completion(record)));
                inst.completed += 1;
                inst.out_tokens += c.completion_tokens;
                // What had not streamed yet arrives with the answer.
                let rest = c.completion_tokens.saturating_sub(streamed);
                inst.live_tokens += rest;
                self.counts.live_tokens += rest;
                self.lengths.observe(Seen::of_answer(
                    c.completion_tokens,
                    c.finish_reason.as_deref(),
                    job.req.max_tokens,
                ));
                if let Some(cached) = c.cached_tokens {
                    inst.reported_prompt_tokens += c.prompt_tokens;
                    inst.cached_tokens += cached.min(c.prompt_tokens);
                    self.counts.cached_tokens += cached.min(c.prompt_tokens);
                }
                self.counts.completed += 1;
                self.counts.in_tokens += c.prompt_tokens;
                self.counts.out_tokens += c.completion_tokens;
                if self.counts.completed == 1 {
                    // The start's limit came from max_tokens alone; a short job may end before
                    // the next tick would correct it.
                    self.learn_request_tokens();
                }
                self.placement.observe(Outcome::Finished {
                    ticket: job.ticket,
                    server: i,
                    completion: &c,
                });
                return;
            }
            Attempt::Failed(e) => e,
        };
        self.placement.observe(Outcome::Failed {
            ticket: job.ticket,
            server: i,
            error: &error,
        });
        match error {
            ClientError::ContextOverflow { overflow, .. } => match overflow.remedy() {
                Remedy::PromptTooLong => {
                    let why = overflow.to_string();
                    let server = error.server_message();
                    let reason = FailureReason::PromptTooLong;
                    self.fail_with(Origin::job(&job), reason, &why, server.as_deref(), out);
                }
                // One clamp to C − P − 1; chat's clamp to C comes before it, being made before
                // the server has read the prompt.
                Remedy::MaxTokens(fit)
                    if fit < job.req.max_tokens && !(job.clamped && overflow.knows_prompt()) =>
                {
                    Arc::make_mut(&mut job.req).max_tokens = fit;
                    job.clamped |= overflow.knows_prompt();
                    if !stopping {
                        self.requeue(job);
                    }
                }
                Remedy::MaxTokens(fit) => {
                    let why = format!("{overflow}; still too long with max_tokens {fit}");
                    let server = error.server_message();
                    let reason = FailureReason::ContextOverflow;
                    self.fail_with(Origin::job(&job), reason, &why, server.as_deref(), out);
                }
            },
            e if e.is_local() => {
                // fleet ran out of open files: its own failure, neither the server's (it is not
                // taken out) nor the prompt's (no retry is spent). Wait, and send it again.
                if !self.out_of_files_said {
                    self.out_of_files_said = true;
                    out.push(Action::Event(Event::OutOfFiles {
                        error: e.to_string(),
                    }));
                }
                if !stopping {
                    let wait = self.cfg.timing.backoff.delay_with(1, &mut self.rng);
                    self.seq += 1;
                    self.delayed.push(Delayed {
                        due: now + wait,
                        seq: self.seq,
                        job,
                    });
                }
            }
            e if e.is_unreachable() && job.redispatches < MAX_REDISPATCHES => {
                // The server is gone or dropped the connection, not the request's fault: send
                // it elsewhere without spending one of its retries. A refused connection means
                // nothing listens there any more, so the instance is taken out; a dropped one
                // may be a single closed keep-alive connection, so the probes decide.
                if matches!(e, ClientError::Connect { .. }) {
                    self.mark_down(now, i, DownReason::Refused(Arc::new(e)), out);
                }
                job.avoid = Some(i);
                job.redispatches += 1;
                if !stopping {
                    self.requeue(job);
                }
            }
            e if e.is_retryable() => {
                job.attempts += 1;
                if job.attempts > self.cfg.max_retries {
                    self.give_up(&job, &e.to_string(), out);
                } else if !stopping {
                    job.avoid = Some(i);
                    let wait = self
                        .cfg
                        .timing
                        .backoff
                        .delay_with(job.attempts, &mut self.rng);
                    self.seq += 1;
                    self.delayed.push(Delayed {
                        due: now + wait,
                        seq: self.seq,
                        job,
                    });
                }
            }
            e => {
                let reason = match e {
                    ClientError::Decode { .. } => FailureReason::BadResponse,
                    _ => FailureReason::Rejected,
                };
                let server = e.server_message();
                self.fail_with(
                    Origin::job(&job),
                    reason,
                    &e.to_string(),
                    server.as_deref(),
                    out,
                );
            }
        }
    }

    /// Takes back every job in flight on instance `i` (the instance went out), to be sent
    /// elsewhere first; the shell drops the requests themselves.
    pub(super) fn take_back(&mut self, i: usize, out: &mut Vec<Action>) {
        let ids: Vec<ReqId> = self
            .in_flight
            .iter()
            .filter(|(_, f)| f.inst == i)
            .map(|(id, _)| *id)
            .collect();
        if ids.is_empty() {
            return;
        }
        out.push(Action::Abort(i));
        let mut back: Vec<(ReqId, Job)> = ids
            .into_iter()
            .filter_map(|id| self.in_flight.remove(&id).map(|f| (id, f.job)))
            .collect();
        // Oldest first, so they keep their order at the front of the queue.
        back.sort_by_key(|(id, _)| std::cmp::Reverse(*id));
        for (_, mut job) in back {
            job.avoid = Some(i);
            if self.stop.is_none() {
                self.requeue(job);
            }
        }
        self.insts[i].in_flight = 0;
    }
}
