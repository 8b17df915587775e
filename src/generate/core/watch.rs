//! What the core learns from the servers' load over time: sliding-window rates, the watchdog's
//! signals and verdict after the warm-up, and the progress.json snapshot.

use super::fleet::Inst;
use super::{Action, Core, ReqId, Time};
use crate::eta::{Eta, Interval, Rate, Work};
use crate::generate::Event;
use crate::generate::concurrency::ConcurrencyMode;
use crate::generate::journal::OutputFormat;
use crate::generate::progress::{self, InstanceProgress, LengthEstimate, Progress, Status};
use crate::generate::watchdog::{self, CacheSignals, Finding, Signals};

/// `/metrics` readings after warm-up before the watchdog judges an instance.
const MIN_READINGS: u64 = 3;

impl Core {
    /// Output tokens counted as they stream: the rates see the GPUs' work as it happens, not
    /// when long requests end.
    pub(super) fn record_rates(&mut self, now: Time) {
        self.window
            .record(now, self.counts.completed, self.counts.live_tokens);
        for inst in &mut self.insts {
            inst.window.record(now, inst.completed, inst.live_tokens);
        }
    }

    /// Takes what each request in flight has streamed so far.
    pub(super) fn streamed(&mut self, counts: Vec<(ReqId, u64)>) {
        for (id, n) in counts {
            let Some(f) = self.in_flight.get_mut(&id) else {
                continue;
            };
            let delta = n.saturating_sub(f.streamed);
            f.streamed = f.streamed.max(n);
            self.insts[f.inst].live_tokens += delta;
            self.counts.live_tokens += delta;
        }
    }

    /// Tokens streamed so far by each request in flight.
    pub(super) fn running_lengths(&self) -> Vec<u32> {
        self.in_flight
            .values()
            .map(|f| u32::try_from(f.streamed).unwrap_or(u32::MAX))
            .collect()
    }

    /// Runs the watchdog after warm-up: announces a new finding, and returns it when
    /// `--abort-below` says it must stop the run.
    pub(super) fn watch(&mut self, now: Time, out: &mut Vec<Action>) -> Option<Finding> {
        // With every prompt sent, the last requests drain in batches that shrink: a falling
        // rate is the job ending, not the servers falling short.
        let draining = !self.input_open && self.ready.is_empty() && self.delayed.is_empty();
        if now < self.cfg.warmup || draining {
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
        let mean = |f: &dyn Fn(&Inst) -> f64| up.iter().map(|i| f(i)).sum::<f64>() / n;
        let caps: Vec<f64> = up.iter().filter_map(|i| i.cap).map(|c| c as f64).collect();
        let kv: Vec<f64> = up
            .iter()
            .filter_map(|i| i.kv_tokens)
            .map(|k| k as f64)
            .collect();
        // A request holds its prompt and its whole answer: the answer's expected length, not
        // the mean of the short ones that finished first.
        // On a hybrid model the mamba state pool, not the KV pool, bounds the running
        // requests: room in the KV pool is no room to gain.
        let hybrid = up.iter().any(|i| i.hybrid);
        let c = &self.counts;
        let avg_seq = (c.completed > 0 && !kv.is_empty() && !hybrid)
            .then(|| {
                let running = self.running_lengths();
                let survival = self.lengths.survival(&running);
                let out = self
                    .lengths
                    .expect(&survival, &running, self.cfg.max_tokens, 1)?;
                Some(c.in_tokens as f64 / c.completed as f64 + out.tokens.point)
            })
            .flatten();
        let signals = Signals {
            running: mean(&|i| i.acc.running / i.acc.readings as f64),
            queue_empty_share: mean(&|i| i.acc.queue_empty as f64 / i.acc.readings as f64),
            cap: (!caps.is_empty()).then(|| caps.iter().sum::<f64>() / caps.len() as f64),
            client_limit: mean(&|i| f64::from(i.ctl.limit())),
            kv_fit: avg_seq
                .filter(|s| *s > 0.0)
                .map(|s| kv.iter().sum::<f64>() / kv.len() as f64 / s),
            auto: self.cfg.concurrency == ConcurrencyMode::Auto,
            held_by_files: up.iter().any(|i| i.ctl.held_by_budget()),
        };
        // Tokens as they stream; a job whose answers are not streamed (the Batch API's output
        // keeps the server's bytes) reads the servers' own decode rate instead.
        let live = if self.cfg.format != OutputFormat::OpenaiBatch && self.window.is_measured() {
            self.window.rates().1 / n
        } else if up.iter().all(|i| i.acc.gen_readings > 0) {
            mean(&|i| i.acc.gen_tok_s / i.acc.gen_readings as f64)
        } else {
            self.window.rates().1 / n
        };
        let finding = watchdog::assess(live, self.cfg.expected.as_ref(), &signals)?;
        // Said once; again only when what it says changes, not its numbers.
        if !self
            .warned
            .as_ref()
            .is_some_and(|w| w.same_finding(&finding.cause))
        {
            self.warned = Some(finding.cause.clone());
            self.warnings
                .push(format!("WATCHDOG: {}", finding.message()));
            out.push(Action::Event(Event::Watchdog(finding.clone())));
        }
        self.cfg
            .abort_below
            .filter(|f| finding.fraction < *f)
            .map(|_| finding)
    }

    /// Under prefix placement, holds the answers' cached tokens to what the plan expected,
    /// from the first answers on (no warm-up: it counts tokens, not rates); said once a run,
    /// and never a reason to stop (`--abort-below` is about throughput).
    pub(super) fn watch_cache(&mut self, out: &mut Vec<Action>) {
        let Some(e) = self.cache else { return };
        if self.cache_warned {
            return;
        }
        let reported: Vec<&Inst> = self
            .insts
            .iter()
            .filter(|i| i.reported_prompt_tokens > 0)
            .collect();
        let share = |i: &Inst| i.cached_tokens as f64 / i.reported_prompt_tokens as f64;
        let signals = CacheSignals {
            expected: e.cached_fraction,
            prefix_tokens: e.prefix_tokens,
            prompt_tokens: reported.iter().map(|i| i.reported_prompt_tokens).sum(),
            cached_tokens: reported.iter().map(|i| i.cached_tokens).sum(),
            worst: reported
                .iter()
                .min_by(|a, b| share(a).total_cmp(&share(b)))
                .map(|i| (i.id.to_string(), share(i))),
        };
        let live = self.window.rates().1 / self.insts.len().max(1) as f64;
        if let Some(finding) = watchdog::assess_cache(live, &signals) {
            self.cache_warned = true;
            self.warnings
                .push(format!("WATCHDOG: {}", finding.message()));
            out.push(Action::Event(Event::Watchdog(finding)));
        }
    }
}

pub(super) fn snapshot(core: &Core, now: Time, status: Status) -> Progress {
    // The window samples at metrics ticks: a run over before its second sample, or the
    // completions after its last one, would read as no rate at all. A run that has ended
    // shows its own whole rate instead: this run's completions over its real elapsed time.
    let ended = !matches!(status, Status::Running | Status::Paused);
    let whole = |completed: u64, tokens: u64| {
        let secs = now.as_secs_f64();
        if secs > 0.0 {
            (completed as f64 / secs, tokens as f64 / secs)
        } else {
            (0.0, 0.0)
        }
    };
    let (rate, tok_s) = if ended {
        whole(core.counts.completed, core.counts.live_tokens)
    } else {
        core.window.rates()
    };
    let (b, c) = (&core.base, &core.counts);
    let completed = b.completed + c.completed;
    let failed = b.failed + c.failed;
    let out = b.output_tokens + c.out_tokens;
    let remaining = b.total.saturating_sub(completed + failed + c.waiting_retry);
    let running = core.running_lengths();
    let estimate = core.eta(remaining, &running, tok_s);
    let hours = |secs: f64| progress::round(secs / 3600.0, 5);
    let eta = if remaining == 0 {
        Some(Interval::exact(0.0))
    } else if ended {
        None
    } else {
        estimate.as_ref().and_then(|e| e.secs)
    };
    Progress {
        total: b.total,
        completed,
        failed,
        waiting_retry: c.waiting_retry,
        rate_per_sec: progress::round(rate, 2),
        eta_hours: eta.map(|e| hours(e.point)),
        eta_low_hours: eta.map(|e| hours(e.low)),
        eta_high_hours: eta.map(|e| hours(e.high)),
        expected_output_tokens: estimate
            .as_ref()
            .map(|e| progress::round(e.length.tokens.point, 1)),
        length_estimate: estimate.as_ref().map(|e| LengthEstimate {
            source: e.length.source,
            low: progress::round(e.length.tokens.low, 1),
            high: progress::round(e.length.tokens.high, 1),
            finished: c.completed,
            running: running.len() as u64,
            tail_unseen: e.length.tail_unseen,
        }),
        output_tok_s: progress::round(tok_s, 1),
        total_input_tokens: b.input_tokens + c.in_tokens,
        total_output_tokens: out,
        cached_tokens: c.cached_tokens,
        avg_output_tokens: out.checked_div(completed).unwrap_or(0),
        elapsed_hours: progress::round(now.as_secs_f64() / 3600.0, 5),
        s3_uploaded: c.s3_uploaded,
        s3_bytes: c.s3_bytes,
        status,
        instances: core
            .insts
            .iter()
            .map(|i| {
                let (rate, tok) = if ended {
                    whole(i.completed, i.live_tokens)
                } else {
                    i.window.rates()
                };
                InstanceProgress {
                    name: i.id.clone(),
                    url: i.url.clone(),
                    healthy: i.up,
                    in_flight: i.in_flight,
                    concurrency: i.ctl.limit(),
                    server_cap: i.cap,
                    completed: i.completed,
                    rate_per_sec: progress::round(rate, 2),
                    output_tok_s: progress::round(tok, 1),
                    output_tokens: i.live_tokens,
                    server_tok_s: i.last.as_ref().and_then(|m| m.gen_throughput),
                    cached_fraction: (i.reported_prompt_tokens > 0).then(|| {
                        progress::round(i.cached_tokens as f64 / i.reported_prompt_tokens as f64, 3)
                    }),
                    running: i.last.as_ref().and_then(|m| m.num_running_reqs),
                    queued: i.last.as_ref().and_then(|m| m.num_queue_reqs),
                    token_usage: i.last.as_ref().and_then(|m| m.token_usage),
                }
            })
            .collect(),
        warnings: core.warnings.clone(),
    }
}

impl Core {
    /// Remaining work ÷ live rate (`crate::eta`), for `remaining` prompts of which `running`
    /// are streaming.
    fn eta(&self, remaining: u64, running: &[u32], tok_s: f64) -> Option<Eta> {
        let (a, b) = self.window.token_halves();
        let servers_running: f64 = self
            .insts
            .iter()
            .filter(|i| i.up)
            .filter_map(|i| i.last.as_ref().and_then(|m| m.num_running_reqs))
            .sum();
        let rate = Rate {
            tok_s,
            low: a.min(b),
            high: a.max(b),
            running: if servers_running > 0.0 {
                servers_running
            } else {
                running.len() as f64
            },
        };
        let work = Work {
            waiting: remaining.saturating_sub(running.len() as u64),
            running,
            cap: self.cfg.max_tokens,
        };
        crate::eta::eta(&self.lengths, work, rate)
    }
}
