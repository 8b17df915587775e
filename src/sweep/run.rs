//! Running a sweep: the candidates start as their GPUs allow (all at once in parallel mode,
//! one after another in sequential mode, each on the first free GPU in rounds), in batches
//! measured together; each trial is recorded as it ends, successive halving's verdicts are
//! given as first windows end, and freed GPUs go to the next candidates. Then the winner runs
//! on every GPU (`--apply`) or everything the sweep started is stopped.

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use tokio::sync::mpsc::{self, UnboundedSender};
use tokio_util::sync::CancellationToken;

use super::assign::Slot;
use super::batch::{self, BatchEnd, Msg, Screened};
use super::file::Store;
use super::prune::{self, Contender, Verdict};
use super::rank::{Outcome, Trial};
use super::schedule::Pool;
use super::servers::{Running, Setup, SweepError};
use crate::launch::plan;
use crate::launch::up::UpOutcome;

/// Progress, for the command to show.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Starting { labels: Vec<String>, servers: usize },
    Measuring { labels: Vec<String> },
    TrialDone(Box<Trial>),
    Applying { label: String, servers: usize },
}

#[derive(Debug)]
pub struct Ended {
    pub interrupted: bool,
    /// The winner's servers on every GPU, with `--apply`.
    pub applied: Option<Vec<UpOutcome>>,
}

/// What the sweep's loop waits on.
enum Job {
    Batch(BatchEnd),
    /// Servers stopped: their GPUs are free.
    Stopped(Vec<Slot>),
}

/// The like-for-like key of a candidate's GPUs: the hosts they are on.
fn hosts(slots: &[Slot]) -> Vec<String> {
    let mut h: Vec<String> = slots.iter().map(|s| s.host.clone()).collect();
    h.sort();
    h.dedup();
    h
}

/// The first-window figures already on file (a resumed sweep), to judge the rest against: a
/// candidate that failed after its first window leads nobody.
fn board(setup: &Setup<'_>, trials: &[Trial]) -> Vec<Contender> {
    trials
        .iter()
        .filter(|t| !matches!(t.outcome, Outcome::Failed { .. }))
        .filter_map(|t| {
            let candidate = setup
                .candidates
                .iter()
                .position(|(c, _)| c.id == t.candidate.id)?;
            Some(Contender {
                candidate,
                hosts: hosts(&t.gpus),
                estimate: t.first_window?.estimate,
            })
        })
        .collect()
}

/// Successive halving's verdicts on `screens`; the ones with an estimate join the board.
fn judge(board: &mut Vec<Contender>, screens: &[Screened]) -> Vec<Verdict> {
    let contenders: Vec<Contender> = screens
        .iter()
        .filter_map(|s| {
            Some(Contender {
                candidate: s.candidate,
                hosts: hosts(&s.slots),
                estimate: s.estimate?,
            })
        })
        .collect();
    let mut decided = prune::decide(board, &contenders).into_iter();
    let verdicts = screens
        .iter()
        .map(|s| match s.estimate {
            Some(_) => decided.next().unwrap_or(Verdict::Continue),
            None => Verdict::Continue,
        })
        .collect();
    board.extend(contenders);
    verdicts
}

fn stop_job<'a>(
    setup: &'a Setup<'a>,
    running: Vec<Running>,
    slots: Vec<Slot>,
) -> BoxFuture<'a, Job> {
    async move {
        setup.stop(running).await;
        Job::Stopped(slots)
    }
    .boxed()
}

/// The sweep's state between wake-ups.
struct Sweep<'a, 's> {
    setup: &'a Setup<'a>,
    store: &'s mut Store,
    events: &'a UnboundedSender<Event>,
    /// Stops the batches on Ctrl-C, or when one of them failed.
    abort: &'a CancellationToken,
    pool: Pool,
    board: Vec<Contender>,
    jobs: FuturesUnordered<BoxFuture<'a, Job>>,
    /// The last servers measured, kept while no candidate waits for their GPUs: `--apply`
    /// keeps the winner's.
    kept: Vec<Running>,
    error: Option<SweepError>,
}

impl Sweep<'_, '_> {
    fn fail(&mut self, e: SweepError) {
        self.error.get_or_insert(e);
        self.abort.cancel();
    }

    fn on_msg(&mut self, m: Msg) {
        match m {
            // Writing sweep.json (an fsync) holds up the loads that share this task for a few
            // milliseconds; their servers stay busy meanwhile on the quarter of a batch queued
            // there beyond the cap.
            Msg::Trial(t) => {
                // A leader that failed later (out of memory in its full window) prunes no more.
                if matches!(t.outcome, Outcome::Failed { .. }) {
                    let id = &t.candidate.id;
                    let failed = self.setup.candidates.iter().position(|(c, _)| &c.id == id);
                    self.board.retain(|c| Some(c.candidate) != failed);
                }
                if let Err(e) = self.store.record((*t).clone()) {
                    self.fail(e.into());
                }
                let _ = self.events.send(Event::TrialDone(t));
            }
            Msg::Release { running, slots } if running.is_empty() => self.pool.free(slots),
            Msg::Release { running, slots } => self.jobs.push(stop_job(self.setup, running, slots)),
            Msg::Screened { screens, reply } => {
                let _ = reply.send(judge(&mut self.board, &screens));
            }
        }
    }

    fn on_job(&mut self, j: Job) {
        match j {
            Job::Stopped(slots) => self.pool.free(slots),
            Job::Batch(end) => {
                if let Some(e) = end.error {
                    self.fail(e);
                }
                if self.abort.is_cancelled() || self.pool.waiting() > 0 {
                    self.jobs.push(stop_job(self.setup, end.running, end.slots));
                } else {
                    self.kept.extend(end.running);
                }
            }
        }
    }
}

/// Runs every candidate not yet in `store`, then applies the winner (`apply`) or stops what the
/// sweep started. `winner` picks the winner from the finished trials.
pub async fn run(
    setup: &Setup<'_>,
    store: &mut Store,
    apply: bool,
    winner: impl Fn(&[Trial]) -> Option<String>,
    events: &UnboundedSender<Event>,
    cancel: &CancellationToken,
) -> Result<Ended, SweepError> {
    let queue = (0..setup.candidates.len())
        .filter(|&c| !store.is_done(&setup.candidates[c].0.id))
        .map(|c| (c, setup.assignment.needs[c].clone()))
        .collect();
    let abort = cancel.child_token();
    let (tx, mut rx) = mpsc::unbounded_channel::<Msg>();
    let mut sweep = Sweep {
        setup,
        events,
        abort: &abort,
        pool: Pool::new(queue, setup.assignment.slots.clone()),
        board: board(setup, store.trials()),
        store,
        jobs: FuturesUnordered::new(),
        kept: Vec::new(),
        error: None,
    };
    let mut aborting = false;
    loop {
        if !abort.is_cancelled() {
            let members = sweep.pool.next_batch();
            if !members.is_empty() {
                let b = batch::run(setup, members, tx.clone(), events, &abort);
                sweep.jobs.push(b.map(Job::Batch).boxed());
            }
        }
        if sweep.jobs.is_empty() {
            // What a batch said as it ended (its GPUs, its last trials) still counts.
            match rx.try_recv() {
                Ok(m) => {
                    sweep.on_msg(m);
                    continue;
                }
                Err(_) => break,
            }
        }
        enum Wake {
            Abort,
            Msg(Msg),
            Job(Job),
        }
        let wake = tokio::select! {
            biased;
            _ = abort.cancelled(), if !aborting => Wake::Abort,
            Some(m) = rx.recv() => Wake::Msg(m),
            Some(j) = sweep.jobs.next() => Wake::Job(j),
        };
        match wake {
            // The batches hear it themselves and end; nothing new starts.
            Wake::Abort => aborting = true,
            Wake::Msg(m) => sweep.on_msg(m),
            Wake::Job(j) => sweep.on_job(j),
        }
    }
    let Sweep {
        kept, error, store, ..
    } = sweep;
    if let Some(e) = error {
        setup.stop(kept).await;
        return Err(e);
    }
    if cancel.is_cancelled() {
        setup.stop(kept).await;
        return Ok(Ended {
            interrupted: true,
            applied: None,
        });
    }
    let best = winner(store.trials());
    let chosen = best
        .as_deref()
        .filter(|_| apply)
        .and_then(|id| setup.candidates.iter().position(|(c, _)| c.id == id));
    let Some(w) = chosen else {
        setup.stop(kept).await;
        return Ok(Ended {
            interrupted: false,
            applied: None,
        });
    };
    // The winner's servers stay up; `up` keeps them (same config) and fills the other GPUs.
    let losers = kept.into_iter().filter(|r| r.candidate != w).collect();
    setup.stop(losers).await;
    let profile = &setup.candidates[w].1;
    let servers =
        plan::plan(profile, setup.hosts, None, None, setup.fleet.run_root()).map_or(0, |i| i.len());
    let _ = events.send(Event::Applying {
        label: setup.candidates[w].0.label(),
        servers,
    });
    let applied = setup.apply(profile, cancel).await?;
    Ok(Ended {
        interrupted: cancel.is_cancelled(),
        applied: Some(applied),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::stats::Estimate;

    fn slot(host: &str, gpu: u32) -> Slot {
        Slot {
            host: host.into(),
            gpu,
        }
    }

    fn e(mean: f64) -> Estimate {
        Estimate {
            mean,
            low: mean - 10.0,
            high: mean + 10.0,
            samples: 8,
            sample_s: 1.0,
        }
    }

    #[test]
    fn screens_without_an_estimate_go_on_and_the_rest_join_the_board() {
        let mut board = vec![Contender {
            candidate: 0,
            hosts: vec!["a".into()],
            estimate: e(1000.0),
        }];
        let screens = [
            Screened {
                candidate: 1,
                slots: vec![slot("a", 1)],
                estimate: None,
            },
            Screened {
                candidate: 2,
                slots: vec![slot("a", 2)],
                estimate: Some(e(100.0)),
            },
            Screened {
                candidate: 3,
                slots: vec![slot("b", 0)],
                estimate: Some(e(100.0)),
            },
        ];
        let v = judge(&mut board, &screens);
        assert_eq!(v[0], Verdict::Continue);
        assert!(matches!(v[1], Verdict::Prune { leader: 0, .. }));
        assert_eq!(v[2], Verdict::Continue, "nobody to compare with on host b");
        let on_board: Vec<usize> = board.iter().map(|c| c.candidate).collect();
        assert_eq!(on_board, vec![0, 2, 3]);
        assert_eq!(
            hosts(&[slot("b", 1), slot("a", 0), slot("b", 2)]),
            vec!["a", "b"]
        );
    }
}
