//! The instances as the core sees them: capacity, in-flight limit and load, which probe each
//! needs, and taking an instance out (its requests go elsewhere) and back in when it answers.

use std::sync::Arc;

use super::placement::Outcome;
use super::signals::SignalAcc;
use super::{Action, Core, CoreConfig, DownReason, HostLoss, ProbeKind, ProbeResult, Server, Time};
use crate::generate::concurrency::{Capacity, Controller, Gauges};
use crate::generate::progress::RateWindow;
use crate::generate::{Event, InstanceInfo};
use crate::server::ServerId;
use crate::sglang::client::{ClientError, ServerInfo};
use crate::sglang::metrics::Metrics;

pub(super) struct Inst {
    pub id: ServerId,
    pub url: String,
    /// Its host's number among the run's hosts, as the placement sees it.
    pub host_key: Option<usize>,
    pub version: Option<String>,
    pub up: bool,
    pub ctl: Controller,
    pub in_flight: u32,
    pub cap: Option<u64>,
    pub kv_tokens: Option<u64>,
    /// A hybrid (mamba) model: its `/server_info` names a mamba strategy.
    pub hybrid: bool,
    /// The context length in effect (`/v1/models` `max_model_len`).
    pub context_len: Option<u64>,
    /// Consecutive failed liveness probes.
    pub failures: u32,
    pub probing: bool,
    pub metrics_available: bool,
    pub completed: u64,
    pub out_tokens: u64,
    /// Output tokens as they streamed (see the core's counts).
    pub live_tokens: u64,
    /// Prompt tokens of its answers that said how many the cache served, and those served.
    pub reported_prompt_tokens: u64,
    pub cached_tokens: u64,
    pub window: RateWindow,
    pub last: Option<Metrics>,
    pub acc: SignalAcc,
    /// Its share of the open-file budget.
    ceiling: u32,
    /// Why it was out of service at start, for the caller to show.
    unavailable: Option<String>,
}

impl Inst {
    pub fn new(
        s: Server,
        host_key: Option<usize>,
        cfg: &CoreConfig,
        ceiling: u32,
        request_tokens: f64,
    ) -> Inst {
        let mut window = RateWindow::new(cfg.timing.rate_window);
        window.record(Time::ZERO, 0, 0);
        let mut inst = Inst {
            id: s.id,
            url: s.url,
            host_key,
            version: None,
            up: false,
            ctl: Controller::new(
                cfg.concurrency,
                Capacity::default(),
                request_tokens,
                ceiling,
            ),
            in_flight: 0,
            cap: None,
            kv_tokens: None,
            hybrid: false,
            context_len: None,
            failures: 0,
            probing: false,
            metrics_available: true,
            completed: 0,
            out_tokens: 0,
            live_tokens: 0,
            reported_prompt_tokens: 0,
            cached_tokens: 0,
            window,
            last: None,
            acc: SignalAcc::default(),
            ceiling,
            unavailable: None,
        };
        match s.info {
            Ok(info) => inst.revive(&info, cfg, request_tokens),
            Err(why) => inst.unavailable = Some(why.to_string()),
        }
        inst
    }

    /// Puts it in service with what `/server_info` says.
    fn revive(&mut self, info: &ServerInfo, cfg: &CoreConfig, request_tokens: f64) {
        self.up = true;
        self.failures = 0;
        self.cap = info.effective_max_running_requests;
        self.kv_tokens = info.max_total_num_tokens;
        self.hybrid = info.mamba_strategy.is_some();
        self.context_len = info.context_length;
        self.version = info.version.clone();
        let capacity = Capacity {
            cap: self.cap,
            kv_tokens: self.kv_tokens,
        };
        self.ctl = Controller::new(cfg.concurrency, capacity, request_tokens, self.ceiling);
        self.metrics_available = true;
    }

    pub fn info(&self) -> InstanceInfo {
        InstanceInfo {
            name: self.id.clone(),
            url: self.url.clone(),
            version: self.version.clone(),
            server_cap: self.cap,
            kv_tokens: self.kv_tokens,
            context_length: self.context_len,
            concurrency: self.ctl.limit(),
            unavailable: self.unavailable.clone(),
        }
    }
}

impl Core {
    /// Starts the probes due: revival of instances that are out, `/metrics` of those in service,
    /// and (when `liveness` is due) `/server_info` of those without metrics.
    pub(super) fn schedule_probes(&mut self, liveness: bool, out: &mut Vec<Action>) {
        for (i, inst) in self.insts.iter_mut().enumerate() {
            let kind = match (inst.up, inst.metrics_available) {
                _ if inst.probing => continue,
                (false, _) => ProbeKind::Revive,
                (true, true) => ProbeKind::Metrics,
                (true, false) if liveness => ProbeKind::Alive,
                (true, false) => continue,
            };
            inst.probing = true;
            out.push(Action::Probe { inst: i, kind });
        }
    }

    pub(super) fn probed(
        &mut self,
        now: Time,
        i: usize,
        result: ProbeResult,
        out: &mut Vec<Action>,
    ) {
        let warm = now >= self.cfg.warmup;
        let request_tokens = self.request_tokens();
        let to_down = self.cfg.timing.health_failures_to_down;
        let inst = &mut self.insts[i];
        inst.probing = false;
        let failure = match result {
            ProbeResult::Metrics(Ok(m)) if inst.up => {
                inst.failures = 0;
                if let (Some(running), Some(queued)) = (m.num_running_reqs, m.num_queue_reqs) {
                    let gauges = Gauges {
                        running,
                        queued,
                        gen_throughput: m.gen_throughput,
                        token_usage: m.token_usage,
                    };
                    inst.ctl.observe(gauges, inst.in_flight);
                    if warm {
                        inst.acc.add(running, queued, m.gen_throughput);
                    }
                }
                inst.last = Some(m);
                None
            }
            ProbeResult::Metrics(Err(ClientError::Status { status: 404, .. })) => {
                // Started without --enable-metrics: liveness comes from /server_info instead.
                inst.metrics_available = false;
                None
            }
            ProbeResult::Alive(Ok(())) if inst.up => {
                inst.failures = 0;
                None
            }
            // fleet's own open-file limit, not the server: never a reason to take it out.
            ProbeResult::Metrics(Err(e)) | ProbeResult::Alive(Err(e)) if e.is_local() => None,
            ProbeResult::Metrics(Err(e)) | ProbeResult::Alive(Err(e)) if inst.up => Some(e),
            ProbeResult::Revive(Ok(info)) if !inst.up => {
                let cfg = &self.cfg;
                inst.revive(&info, cfg, request_tokens);
                out.push(Action::Event(Event::InstanceUp {
                    name: inst.id.clone(),
                    server_cap: inst.cap,
                }));
                if self.paused_since.take().is_some() {
                    out.push(Action::Event(Event::Resumed));
                }
                self.placement.observe(Outcome::ServerIn(i));
                None
            }
            // Answers that no longer matter: the instance changed state meanwhile, or it is
            // still out.
            _ => None,
        };
        if let Some(e) = failure {
            let inst = &mut self.insts[i];
            inst.failures += 1;
            if inst.failures >= to_down {
                let reason = DownReason::HealthChecks {
                    failures: inst.failures,
                    last: Arc::new(e),
                };
                self.mark_down(now, i, reason, out);
            }
        }
    }

    /// Takes instance `i` out of service: its requests go elsewhere, and it is probed until it
    /// answers again. With nothing left in service the run pauses.
    pub(super) fn mark_down(
        &mut self,
        now: Time,
        i: usize,
        reason: DownReason,
        out: &mut Vec<Action>,
    ) {
        if !self.insts[i].up {
            return;
        }
        let inst = &mut self.insts[i];
        inst.up = false;
        inst.failures = 0;
        out.push(Action::Event(Event::InstanceDown {
            name: inst.id.clone(),
            reason: reason.clone(),
        }));
        self.placement.observe(Outcome::ServerOut(i));
        self.take_back(i, out);
        if self.paused_since.is_none() && self.insts.iter().all(|i| !i.up) {
            self.paused_since = Some(now);
            out.push(Action::Event(Event::Paused {
                stall_timeout: self.cfg.stall_timeout,
                instance: self.insts[i].id.clone(),
                reason,
            }));
        }
    }

    /// A host's connection dropped: all its instances go out at once, and their requests, in
    /// flight and queued, move to the other hosts.
    pub(super) fn host_lost(
        &mut self,
        now: Time,
        host: &str,
        loss: HostLoss,
        out: &mut Vec<Action>,
    ) {
        out.push(Action::Event(Event::HostLost {
            host: host.to_string(),
            reason: loss.clone(),
        }));
        for i in 0..self.insts.len() {
            if self.insts[i].id.host() == Some(host) {
                let reason = DownReason::HostLost {
                    host: host.to_string(),
                    loss: loss.clone(),
                };
                self.mark_down(now, i, reason, out);
            }
        }
    }

    /// A host's connection is back: its instances are probed now rather than at the next tick.
    pub(super) fn host_back(&mut self, host: &str, out: &mut Vec<Action>) {
        out.push(Action::Event(Event::HostBack {
            host: host.to_string(),
        }));
        for (i, inst) in self.insts.iter_mut().enumerate() {
            if inst.id.host() == Some(host) && !inst.up && !inst.probing {
                inst.probing = true;
                out.push(Action::Probe {
                    inst: i,
                    kind: ProbeKind::Revive,
                });
            }
        }
    }
}
