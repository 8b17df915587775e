//! One batch: the candidates that start together on their GPUs are planned and preflighted,
//! started through the launcher, measured together (with successive halving's first window
//! when the sweep prunes), and each trial is handed to the sweep as it ends. A candidate that
//! no longer needs its GPUs (failed, pruned) hands them back at once, while the others go on.

use std::time::Duration;

use futures::FutureExt;
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::launch::plan::Instance;
use crate::launch::preflight;
use crate::launch::up::{UpOutcome, UpState};
use crate::remote::Tunnel;
use crate::sglang::client::{Endpoint, HttpOptions, SglangClient, http_client};
use crate::sweep::assign::Slot;
use crate::sweep::event::Event;
use crate::sweep::predict::Verdict as Foreseen;
use crate::sweep::rank::{CacheUse, Failure, FirstWindow, Measured, Outcome, Pruned, Trial};
use crate::sweep::search::{Screen, Verdict};
use crate::sweep::servers::{Running, Setup, SweepError, facts_by_host, plan_candidate};
use crate::sweep::space::Candidate;
use crate::sweep::trial::{self, Checkpoint, Ended, Group, Server, TrialFailure};

/// What a batch tells the sweep while it runs.
#[derive(Debug)]
pub enum Msg {
    /// A finished trial: measured, pruned or failed.
    Trial(Box<Trial>),
    /// GPUs a candidate no longer needs, with its servers still to stop (possibly none).
    Release {
        running: Vec<Running>,
        slots: Vec<Slot>,
    },
    /// The first window is over: the verdict on each, in order, goes back on `reply`.
    Screened {
        screens: Vec<Screen>,
        reply: oneshot::Sender<Vec<Verdict>>,
    },
}

/// A candidate of a batch: its place among the search's proposals, and the GPUs it runs on.
#[derive(Debug, Clone)]
pub struct Member {
    pub index: usize,
    pub candidate: Candidate,
    pub slots: Vec<Slot>,
}

/// What a batch leaves: the servers of its measured candidates, still running, and their GPUs.
#[derive(Debug, Default)]
pub struct BatchEnd {
    pub running: Vec<Running>,
    pub slots: Vec<Slot>,
    pub error: Option<SweepError>,
}

/// The candidates of a batch that still hold their GPUs, with their servers.
struct Held {
    members: Vec<Member>,
    running: Vec<Running>,
}

impl Held {
    fn slots_of(&self, c: usize) -> Vec<Slot> {
        self.members
            .iter()
            .find(|m| m.index == c)
            .map(|m| m.slots.clone())
            .unwrap_or_default()
    }

    /// Hands candidate `c`'s GPUs and servers back to the sweep.
    fn release(&mut self, c: usize, tx: &UnboundedSender<Msg>) {
        let slots = self
            .members
            .iter()
            .position(|m| m.index == c)
            .map(|i| self.members.remove(i).slots)
            .unwrap_or_default();
        let (running, rest) = std::mem::take(&mut self.running)
            .into_iter()
            .partition(|r| r.candidate == c);
        self.running = rest;
        let _ = tx.send(Msg::Release { running, slots });
    }

    fn end(self, error: Option<SweepError>) -> BatchEnd {
        BatchEnd {
            running: self.running,
            slots: self.members.into_iter().flat_map(|m| m.slots).collect(),
            error,
        }
    }
}

/// A failed trial, of kind `default` unless its reason or log says it ran out of memory.
fn failed(m: &Member, default: Failure, reason: String, log: Vec<String>) -> Trial {
    Trial {
        candidate: m.candidate.clone(),
        gpus: m.slots.clone(),
        outcome: Outcome::Failed {
            kind: Failure::read(default, &reason, &log),
            reason,
            log_tail: log,
        },
        first_window: None,
        cache: None,
        prediction: None,
    }
}

fn send_trial(tx: &UnboundedSender<Msg>, t: Trial) {
    let _ = tx.send(Msg::Trial(Box::new(t)));
}

/// Runs one batch to its end. Whatever happens, the servers it leaves running and the GPUs
/// they hold are in the returned [`BatchEnd`] or were handed back with [`Msg::Release`].
pub async fn run(
    setup: &Setup<'_>,
    members: Vec<Member>,
    tx: UnboundedSender<Msg>,
    events: &UnboundedSender<Event>,
    cancel: &CancellationToken,
) -> BatchEnd {
    let mut held = Held {
        members: members.clone(),
        running: Vec::new(),
    };
    let facts = facts_by_host(setup.hosts);
    let mut planned: Vec<(Member, Vec<Instance>)> = Vec::new();
    for m in members {
        let checked = plan_candidate(
            &setup.profiles,
            &m.candidate,
            setup.hosts,
            &m.slots,
            setup.api_key.as_deref(),
            setup.fleet.run_root(),
        )
        .map_err(|e| e.to_string())
        .and_then(|i| {
            preflight::preflight(&i, &facts)
                .map(|()| i)
                .map_err(|e| e.to_string())
        });
        // A layout predicted not to fit is skipped before anything starts.
        let checked = checked
            .map_err(|reason| (Failure::Refused, reason))
            .and_then(|i| match setup.verdict(&m.candidate, &m.slots) {
                Foreseen::Unfit(reason) => Err((Failure::Predicted, reason)),
                Foreseen::Fits(_) | Foreseen::Unknown => Ok(i),
            });
        match checked {
            Ok(instances) => planned.push((m, instances)),
            Err((kind, reason)) => {
                send_trial(&tx, failed(&m, kind, reason, Vec::new()));
                held.release(m.index, &tx);
            }
        }
    }
    if planned.is_empty() {
        return held.end(None);
    }
    match started(setup, &planned, &mut held, &tx, events, cancel).await {
        Ok(Some(measured)) => measure(setup, measured, held, &tx, events, cancel).await,
        Ok(None) => held.end(None),
        Err(e) => held.end(Some(e)),
    }
}

/// A started candidate: its instances with how each came up.
type Started = Vec<(Member, Vec<(Instance, UpOutcome)>)>;

/// Starts the planned candidates; those with a server that did not come up become failed rows
/// and hand their GPUs back. `None` when nothing is left to measure (or on Ctrl-C).
async fn started(
    setup: &Setup<'_>,
    planned: &[(Member, Vec<Instance>)],
    held: &mut Held,
    tx: &UnboundedSender<Msg>,
    events: &UnboundedSender<Event>,
    cancel: &CancellationToken,
) -> Result<Option<Started>, SweepError> {
    let all: Vec<Instance> = planned
        .iter()
        .flat_map(|(_, i)| i.iter().cloned())
        .collect();
    let owner: Vec<usize> = planned
        .iter()
        .flat_map(|(m, i)| std::iter::repeat_n(m.index, i.len()))
        .collect();
    let _ = events.send(Event::Starting {
        labels: planned.iter().map(|(m, _)| m.candidate.label()).collect(),
        servers: all.len(),
    });
    let outcomes = setup.start(&all, cancel).await?;
    let up: Vec<(usize, &Instance)> = owner
        .iter()
        .copied()
        .zip(all.iter())
        .zip(&outcomes)
        // On Ctrl-C `up` stopped what it started; what was already running is ours to stop.
        .filter(|(_, o)| cancel.is_cancelled() || o.recorded)
        .map(|(ci, _)| ci)
        .collect();
    held.running = setup.records(&up).await?;
    if cancel.is_cancelled() {
        return Ok(None);
    }
    let mut measured: Started = Vec::new();
    for (m, _) in planned {
        let mine: Vec<(Instance, UpOutcome)> = all
            .iter()
            .zip(&outcomes)
            .zip(&owner)
            .filter(|(_, o)| **o == m.index)
            .map(|((i, o), _)| (i.clone(), o.clone()))
            .collect();
        let bad = mine.iter().find(|(_, o)| {
            !matches!(o.state, UpState::Ready | UpState::AlreadyRunning)
                || o.info.effective_max_running_requests.is_none()
        });
        let Some((inst, o)) = bad else {
            measured.push((m.clone(), mine));
            continue;
        };
        let reason = match (&o.error, o.state) {
            (Some(e), _) => format!("{}: {e}", inst.label()),
            (None, UpState::Ready | UpState::AlreadyRunning) => format!(
                "{}: /server_info gave no effective max running requests",
                inst.label()
            ),
            (None, s) => format!("{}: {}", inst.label(), s.as_str()),
        };
        let tail = match &o.log_tail {
            Some(t) => t.lines().map(str::to_string).collect(),
            None => setup.log_tail(inst).await,
        };
        send_trial(tx, failed(m, Failure::Other, reason, tail));
        held.release(m.index, tx);
    }
    Ok((!measured.is_empty()).then_some(measured))
}

/// Opens a port forward to every server and describes each candidate's servers for the load.
async fn groups(
    setup: &Setup<'_>,
    measured: &Started,
    tunnels: &mut Vec<Tunnel>,
) -> Result<Vec<Group>, SweepError> {
    let mut groups = Vec::new();
    for (_, mine) in measured {
        let mut servers = Vec::new();
        for (inst, o) in mine {
            let tunnel = setup
                .backend(inst.host())
                .endpoint(&inst.address, inst.port)
                .await?;
            servers.push(Server {
                gpus: inst.group.gpus.len() as u32,
                label: inst.label(),
                endpoint: Endpoint {
                    id: inst.id.clone(),
                    base_url: format!("http://{}", tunnel.local_addr()),
                    api_key: setup.api_key.clone(),
                },
                cap: o.info.effective_max_running_requests.unwrap_or(0) as u32,
                kv_tokens: o.info.max_total_num_tokens.unwrap_or(0),
                strategy: o.info.mamba_strategy.clone(),
            });
            tunnels.push(tunnel);
        }
        let startup = mine
            .iter()
            .map(|(_, o)| o.ready_after)
            .collect::<Option<Vec<f64>>>()
            .map(|v| v.into_iter().fold(0.0, f64::max));
        groups.push(Group {
            servers,
            startup_s: startup,
        });
    }
    Ok(groups)
}

/// Measures the started candidates and hands over their trials.
async fn measure(
    setup: &Setup<'_>,
    measured: Started,
    mut held: Held,
    tx: &UnboundedSender<Msg>,
    events: &UnboundedSender<Event>,
    cancel: &CancellationToken,
) -> BatchEnd {
    let mut tunnels = Vec::new();
    let prepared = match (
        groups(setup, &measured, &mut tunnels).await,
        http_client(HttpOptions::default()),
    ) {
        (Ok(g), Ok(http)) => Ok((g, http)),
        (Err(e), _) => Err(e),
        (_, Err(e)) => Err(e.into()),
    };
    let (groups, http) = match prepared {
        Ok(p) => p,
        Err(e) => {
            for t in tunnels {
                t.close().await;
            }
            return held.end(Some(e));
        }
    };
    let _ = events.send(Event::Measuring {
        labels: measured.iter().map(|(m, _)| m.candidate.label()).collect(),
    });
    let mut first: Vec<Option<FirstWindow>> = vec![None; measured.len()];
    let checkpoint = match setup.first_window {
        Some(length) => {
            let (measured, held, first) = (&measured, &mut held, &mut first);
            Some(Checkpoint {
                length,
                decide: Box::new(move |screens| {
                    first_window(setup, measured, length, screens, held, first, tx).boxed()
                }),
            })
        }
        None => None,
    };
    let before = cache_counters(&groups, &http).await;
    let results = trial::measure(
        &groups,
        setup.workload.clone(),
        http.clone(),
        setup.timing,
        checkpoint,
        cancel,
    )
    .await;
    let after = match cancel.is_cancelled() {
        true => vec![None; groups.len()],
        false => cache_counters(&groups, &http).await,
    };
    for t in tunnels {
        t.close().await;
    }
    let Some(results) = results else {
        return held.end(None);
    };
    let caches = before.iter().zip(&after).map(|(b, a)| cache_use(*b, *a));
    for ((((m, mine), result), first_window), cache) in
        measured.iter().zip(results).zip(first).zip(caches)
    {
        let Ended::Measured(result) = result else {
            continue;
        };
        let outcome = match *result {
            Ok(m) => Outcome::Ok(m),
            Err(f) => {
                let log_tail = failure_log(setup, mine, &f).await;
                Outcome::Failed {
                    kind: Failure::read(Failure::Other, &f.reason, &log_tail),
                    log_tail,
                    reason: f.reason,
                }
            }
        };
        let t = Trial {
            candidate: m.candidate.clone(),
            gpus: held.slots_of(m.index),
            outcome,
            first_window,
            cache,
            prediction: None,
        };
        send_trial(tx, t);
    }
    held.end(None)
}

/// Each group's `(sglang:cached_tokens_total, sglang:prompt_tokens_total)` summed over its
/// servers; `None` where a server's `/metrics` cannot be read (started without metrics). A
/// counter SGLang has not written yet (no request finished, no cache hit) is 0.
async fn cache_counters(groups: &[Group], http: &reqwest::Client) -> Vec<Option<(f64, f64)>> {
    let reads = groups.iter().map(|g| async move {
        let reads = g.servers.iter().map(|s| async move {
            let m = SglangClient::new(http.clone(), s.endpoint.clone())
                .metrics()
                .await
                .ok()?;
            Some((
                m.cached_tokens_total.unwrap_or(0.0),
                m.prompt_tokens_total.unwrap_or(0.0),
            ))
        });
        futures::future::join_all(reads)
            .await
            .into_iter()
            .try_fold((0.0, 0.0), |(c, p), r| r.map(|(rc, rp)| (c + rc, p + rp)))
    });
    futures::future::join_all(reads).await
}

/// What the radix cache served between two readings of a group's counters.
fn cache_use(before: Option<(f64, f64)>, after: Option<(f64, f64)>) -> Option<CacheUse> {
    let ((c0, p0), (c1, p1)) = (before?, after?);
    let delta = |a: f64, b: f64| (b - a).max(0.0).round() as u64;
    let prompt_tokens = delta(p0, p1);
    (prompt_tokens > 0).then(|| CacheUse {
        cached_tokens: delta(c0, c1),
        prompt_tokens,
    })
}

async fn failure_log(
    setup: &Setup<'_>,
    mine: &[(Instance, UpOutcome)],
    f: &TrialFailure,
) -> Vec<String> {
    match f.server {
        Some(i) => setup.log_tail(&mine[i].0).await,
        None => Vec::new(),
    }
}

/// The first window is over: asks the sweep for its verdicts, records the pruned and the failed
/// and hands their GPUs back; says for each candidate whether it goes on.
async fn first_window(
    setup: &Setup<'_>,
    measured: &Started,
    length: Duration,
    screens: Vec<Result<Measured, TrialFailure>>,
    held: &mut Held,
    first: &mut [Option<FirstWindow>],
    tx: &UnboundedSender<Msg>,
) -> Vec<bool> {
    let asked: Vec<Screen> = measured
        .iter()
        .zip(&screens)
        .map(|((m, _), s)| Screen {
            candidate: m.candidate.clone(),
            gpus: held.slots_of(m.index),
            estimate: s.as_ref().ok().and_then(|m| m.estimate),
        })
        .collect();
    let (reply, verdicts) = oneshot::channel();
    let _ = tx.send(Msg::Screened {
        screens: asked.clone(),
        reply,
    });
    // Without an answer (the sweep is ending) every candidate goes on until the load stops.
    let verdicts = verdicts
        .await
        .unwrap_or_else(|_| vec![Verdict::Continue; asked.len()]);
    let after_s = length.as_secs_f64();
    let mut going = Vec::with_capacity(screens.len());
    for (i, ((screen, verdict), ask)) in screens.into_iter().zip(verdicts).zip(asked).enumerate() {
        first[i] = ask
            .estimate
            .map(|estimate| FirstWindow { after_s, estimate });
        let outcome = match (screen, verdict) {
            (Ok(_), Verdict::Continue) => {
                going.push(true);
                continue;
            }
            (Ok(measured), Verdict::Prune { leader, estimate }) => Outcome::Pruned(Pruned {
                measured,
                leader_label: leader.label(),
                leader: leader.id,
                leader_estimate: estimate,
            }),
            (Err(f), _) => {
                let log_tail = failure_log(setup, &measured[i].1, &f).await;
                Outcome::Failed {
                    kind: Failure::read(Failure::Other, &f.reason, &log_tail),
                    log_tail,
                    reason: f.reason,
                }
            }
        };
        going.push(false);
        send_trial(
            tx,
            Trial {
                candidate: ask.candidate,
                gpus: ask.gpus,
                outcome,
                first_window: first[i],
                cache: None,
                prediction: None,
            },
        );
        held.release(measured[i].0.index, tx);
    }
    going
}
