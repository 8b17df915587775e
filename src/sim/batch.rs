//! The scheduler's pure core: SGLang's waiting queue, running batch and chunked request on
//! step counts, with no clock and no I/O. It decides what each step runs, admits under the
//! chunk, input and KV budgets with the new-token ratio that `--schedule-conservativeness`
//! sets, and retracts requests when a decode step would overflow the KV pool.
//!
//! Each rule follows 0.5.23's source:
//! - admission is `PrefillAdder` (srt/managers/schedule_policy.py) over the single-pool
//!   `PrefillBudget` (srt/mem_cache/prefill_budget.py): a new request needs its extend plus
//!   `min(max_new_tokens, CLIP_MAX_NEW_TOKENS)` below what the pool has left once every running
//!   request's remaining tokens, times the new-token ratio, are set aside;
//! - a prompt longer than what is left of `--chunked-prefill-size` is cut there and finished
//!   by later prefill steps, before anything else is admitted (`add_chunked_req`), so its
//!   first token waits for its last chunk;
//! - the ratio starts at 0.7 × conservativeness, decays to 0.14 of that over 600 decode
//!   steps, and is reset when the server idles (scheduler_components/new_token_ratio_tracker.py);
//! - a decode step that would not fit retracts the requests with the fewest output tokens
//!   (the longest prompts first among equals) and raises the ratio to what the survivors have
//!   shown (`ScheduleBatch.retract_decode`, srt/managers/schedule_batch.py). A retracted
//!   request joins the back of the queue (`_add_request_to_queue`, which FCFS does not
//!   reorder) and re-prefills its prompt and its output so far.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

/// `SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION`: admission never counts on more than this many
/// tokens still to come from one request.
pub const CLIP_MAX_NEW_TOKENS: u64 = 4096;
/// srt/environ.py's defaults for the tracker.
const INIT_NEW_TOKEN_RATIO: f64 = 0.7;
const MIN_NEW_TOKEN_RATIO_FACTOR: f64 = 0.14;
const NEW_TOKEN_RATIO_DECAY_STEPS: f64 = 600.0;
const RETRACT_DECODE_STEPS: u64 = 20;
/// `PrefillBudget.reserve` charges one page beyond the extend (page size 1 here).
const PAGE: u64 = 1;

/// A request's token counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lengths {
    pub prompt: u64,
    /// Of the prompt, served from the radix cache: neither prefilled nor held again.
    pub cached: u64,
    /// What it will generate (≥ 1).
    pub output: u64,
    /// `max_new_tokens` as the request asked (or the room left in the context).
    pub max_new: u64,
}

/// The server's limits that admission works within.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// max_total_num_tokens.
    pub pool: u64,
    /// The effective running-request cap.
    pub cap: u64,
    /// `--chunked-prefill-size`; `None` when chunking is off (-1).
    pub chunk: Option<u64>,
    /// `--max-prefill-tokens`.
    pub max_prefill: u64,
    /// `--schedule-conservativeness`.
    pub conservativeness: f64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Ratio {
    init: f64,
    min: f64,
    decay: f64,
    current: f64,
}

impl Ratio {
    fn new(conservativeness: f64) -> Self {
        let init = (INIT_NEW_TOKEN_RATIO * conservativeness).min(1.0);
        let min = (init * MIN_NEW_TOKEN_RATIO_FACTOR).min(1.0);
        Ratio {
            init,
            min,
            decay: (init - min) / NEW_TOKEN_RATIO_DECAY_STEPS,
            current: init,
        }
    }
}

struct Waiting<T> {
    len: Lengths,
    /// Output tokens it had when it was retracted.
    generated: u64,
    item: T,
}

impl<T> Waiting<T> {
    /// What its prefill must compute: the uncached prompt, plus the output it had before a
    /// retraction freed its KV.
    fn extend(&self) -> u64 {
        self.len.prompt - self.len.cached.min(self.len.prompt) + self.generated
    }

    fn max_new(&self) -> u64 {
        self.len
            .max_new
            .saturating_sub(self.generated)
            .min(CLIP_MAX_NEW_TOKENS)
    }
}

struct Running<T> {
    waiting: Waiting<T>,
    /// Decode steps completed when its prefill ended.
    admit_step: u64,
}

/// What one step runs.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// A prefill over `tokens` new tokens: `ids` join the batch with their first token when it
    /// ends, `chunks` more requests were only partly prefilled.
    Prefill {
        ids: Vec<u64>,
        tokens: u64,
        cached: u64,
        chunks: u64,
    },
    /// One decode step of the whole batch; `retracted` requests were sent back to the queue
    /// first, freeing `gained` KV tokens, and the ratio went from `ratio_before` to what
    /// [`Batch::new_token_ratio`] says now.
    Decode {
        batch: u64,
        retracted: u64,
        gained: u64,
        ratio_before: f64,
    },
}

/// The queue, the batch and the one request whose prompt is being prefilled in chunks.
pub struct Batch<T> {
    limits: Limits,
    ratio: Ratio,
    queue: VecDeque<Waiting<T>>,
    /// A request cut by the chunk budget and the extend tokens it has prefilled so far.
    chunked: Option<(Waiting<T>, u64)>,
    running: HashMap<u64, Running<T>>,
    finish_at: BinaryHeap<Reverse<(u64, u64)>>,
    next_id: u64,
    steps: u64,
    /// Σ(extend + 1 − admit_step) over running requests: their KV is this + n × steps.
    kv_base: i64,
}

impl<T> Batch<T> {
    pub fn new(limits: Limits) -> Self {
        Batch {
            limits,
            ratio: Ratio::new(limits.conservativeness),
            queue: VecDeque::new(),
            chunked: None,
            running: HashMap::new(),
            finish_at: BinaryHeap::new(),
            next_id: 0,
            steps: 0,
            kv_base: 0,
        }
    }

    pub fn push(&mut self, len: Lengths, item: T) {
        self.queue.push_back(Waiting {
            len,
            generated: 0,
            item,
        });
    }

    /// Requests in the waiting queue: SGLang takes the chunked one out of it
    /// (`#queue-req` and `--max-queued-requests` count the queue alone).
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    pub fn running(&self) -> usize {
        self.running.len()
    }

    pub fn is_idle(&self) -> bool {
        self.queue.is_empty() && self.chunked.is_none() && self.running.is_empty()
    }

    /// KV tokens held: the running requests' and the chunked prefill's so far.
    pub fn kv_used(&self) -> u64 {
        let running = self.kv_base + self.running.len() as i64 * self.steps as i64;
        running.max(0) as u64 + self.chunked.as_ref().map_or(0, |(_, done)| *done)
    }

    pub fn new_token_ratio(&self) -> f64 {
        self.ratio.current
    }

    /// Output tokens a running request has.
    fn generated(&self, r: &Running<T>) -> u64 {
        r.waiting.generated + 1 + self.steps - r.admit_step
    }

    /// Every running request with the output tokens it has.
    pub fn each_running(&self) -> impl Iterator<Item = (u64, &T, u64)> {
        self.running
            .iter()
            .map(|(id, r)| (*id, &r.waiting.item, self.generated(r)))
    }

    pub fn get(&self, id: u64) -> Option<(&T, u64)> {
        self.running
            .get(&id)
            .map(|r| (&r.waiting.item, self.generated(r)))
    }

    /// Drops every request, waiting or running, whose client `gone` says went away.
    pub fn drop_gone(&mut self, gone: impl Fn(&T) -> bool) {
        self.queue.retain(|w| !gone(&w.item));
        if self.chunked.as_ref().is_some_and(|(w, _)| gone(&w.item)) {
            self.chunked = None;
        }
        let ids: Vec<u64> = self
            .running
            .iter()
            .filter(|(_, r)| gone(&r.waiting.item))
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            self.remove(id);
        }
    }

    /// The scheduler's idle point (`self_check_during_idle` in srt/managers/scheduler.py)
    /// resets the ratio.
    pub fn idle(&mut self) {
        self.ratio.current = self.ratio.init;
    }

    /// Decides the next step: a prefill when anything can be admitted, else a decode step of
    /// the batch, retracting first if it would not fit; `None` when there is nothing to run.
    pub fn next(&mut self) -> Option<Step> {
        if let Some(step) = self.admit() {
            return Some(step);
        }
        if self.running.is_empty() {
            return None;
        }
        let (ratio_before, kv_before) = (self.ratio.current, self.kv_used());
        let retracted = self.retract_if_full();
        if retracted == 0 {
            self.ratio.current = (self.ratio.current - self.ratio.decay).max(self.ratio.min);
        }
        Some(Step::Decode {
            batch: self.running.len() as u64,
            retracted,
            gained: kv_before - self.kv_used(),
            ratio_before,
        })
    }

    /// Marks a decode step done.
    pub fn decoded(&mut self) {
        self.steps += 1;
    }

    /// Takes the requests whose last token the steps so far produced.
    pub fn finished(&mut self) -> Vec<(Lengths, T)> {
        let mut done = Vec::new();
        while let Some(Reverse((step, id))) = self.finish_at.peek().copied() {
            if step > self.steps {
                break;
            }
            self.finish_at.pop();
            if let Some(r) = self.remove(id) {
                done.push((r.waiting.len, r.waiting.item));
            }
        }
        done
    }

    fn remove(&mut self, id: u64) -> Option<Running<T>> {
        let r = self.running.remove(&id)?;
        self.kv_base -= r.waiting.extend() as i64 + 1 - r.admit_step as i64;
        Some(r)
    }

    fn run(&mut self, waiting: Waiting<T>) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.kv_base += waiting.extend() as i64 + 1 - self.steps as i64;
        // The prefill gives token generated + 1; each decode step one more.
        let left = waiting.len.output.max(waiting.generated + 1) - waiting.generated - 1;
        self.finish_at.push(Reverse((self.steps + left, id)));
        self.running.insert(
            id,
            Running {
                waiting,
                admit_step: self.steps,
            },
        );
        id
    }

    /// `PrefillAdder`: what the pool has left once the running requests' expected remaining
    /// tokens are set aside.
    fn remaining_total(&self) -> f64 {
        let expected: f64 = self
            .running
            .values()
            .map(|r| {
                let left = r.waiting.len.max_new.saturating_sub(self.generated(r));
                left.min(CLIP_MAX_NEW_TOKENS) as f64 * self.ratio.current
            })
            .sum();
        self.limits.pool as f64 - self.kv_used() as f64 - expected
    }

    fn admit(&mut self) -> Option<Step> {
        if self.queue.is_empty() && self.chunked.is_none() {
            return None;
        }
        let mut remaining = self.remaining_total();
        let mut rem_input = self.limits.max_prefill as i64;
        let mut rem_chunk = self.limits.chunk.map(|c| c as i64);
        let mut ids = Vec::new();
        let (mut tokens, mut cached, mut chunks) = (0, 0, 0);
        let mut slots = self.limits.cap.saturating_sub(self.running.len() as u64);

        if let Some((waiting, done)) = self.chunked.take() {
            // A continuing chunk always makes progress, so that its KV is freed in the end.
            let chunk = rem_chunk.unwrap_or(i64::MAX);
            let room = (remaining as i64).min(chunk);
            let room = if room > 0 { room } else { chunk } as u64;
            let left = waiting.extend() - done;
            let take = left.min(room);
            tokens += take;
            rem_input -= take as i64;
            rem_chunk = rem_chunk.map(|c| c - take as i64);
            slots = slots.saturating_sub(1);
            if take == left {
                remaining -= (take + PAGE + waiting.max_new()) as f64;
                ids.push(self.run(waiting));
            } else {
                remaining -= (take + PAGE) as f64;
                chunks += 1;
                self.chunked = Some((waiting, done + take));
            }
        }

        while self.chunked.is_none() && slots > 0 {
            let Some(next) = self.queue.front() else {
                break;
            };
            if remaining <= 0.0 || rem_input <= 0 || rem_chunk.is_some_and(|c| c <= 0) {
                break;
            }
            let extend = next.extend();
            let total = (extend + next.max_new() + PAGE) as f64;
            // The sim admits a request too big for the whole pool when nothing else runs,
            // rather than wait for ever.
            let alone = self.running.is_empty() && ids.is_empty();
            if total >= remaining && !alone {
                break;
            }
            match rem_chunk {
                Some(c) if extend > c as u64 => {
                    let waiting = self.queue.pop_front()?;
                    cached += waiting.len.cached.min(waiting.len.prompt);
                    tokens += c as u64;
                    chunks += 1;
                    self.chunked = Some((waiting, c as u64));
                    break;
                }
                None if !ids.is_empty() && extend as i64 >= rem_input => break,
                _ => {}
            }
            let waiting = self.queue.pop_front()?;
            cached += waiting.len.cached.min(waiting.len.prompt);
            tokens += extend;
            remaining -= total;
            rem_input -= extend as i64;
            rem_chunk = rem_chunk.map(|c| c - extend as i64);
            slots -= 1;
            ids.push(self.run(waiting));
        }
        (tokens > 0 || !ids.is_empty()).then_some(Step::Prefill {
            ids,
            tokens,
            cached,
            chunks,
        })
    }

    /// `retract_decode`: frees requests until the next decode step's tokens fit, keeping at
    /// least one; returns how many went back to the queue.
    fn retract_if_full(&mut self) -> u64 {
        let fits = |b: &Self| b.kv_used() + b.running.len() as u64 <= b.limits.pool;
        if fits(self) || self.running.len() <= 1 {
            return 0;
        }
        // Kept first: most output, then the shortest prompt; retracted from the end.
        let mut order: Vec<(u64, u64, u64)> = self
            .running
            .iter()
            .map(|(id, r)| (self.generated(r), r.waiting.len.prompt, *id))
            .collect();
        order.sort_by_key(|&(generated, prompt, id)| (Reverse(generated), prompt, id));
        let mut retracted = 0;
        while self.running.len() > 1 && !fits(self) {
            let Some((generated, _, id)) = order.pop() else {
                break;
            };
            if let Some(mut r) = self.remove(id) {
                r.waiting.generated = generated;
                self.queue.push_back(r.waiting);
                retracted += 1;
            }
        }
        // `estimate_new_token_ratio_after_retract` over the survivors.
        let (decoded, max_new) = self.running.values().fold((0, 0), |(d, m), r| {
            (d + self.generated(r), m + r.waiting.len.max_new)
        });
        let n = self.running.len() as u64;
        self.ratio.current =
            ((decoded + RETRACT_DECODE_STEPS * n) as f64 / (max_new + 1) as f64).min(1.0);
        retracted
    }
}

#[cfg(test)]
#[path = "batch_tests.rs"]
mod tests;
