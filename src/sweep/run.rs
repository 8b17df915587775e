//! Running a search: whenever nothing waits for a GPU and one is free, the strategy proposes
//! candidates, which start as their GPUs allow (all at once in parallel mode, one after another
//! in sequential mode, each on the first free GPU in rounds), in batches measured together;
//! each trial is told to the strategy and recorded as it ends, the strategy's verdicts are
//! given as first windows end, and freed GPUs go to the next candidates. Then the winner runs
//! on every GPU (`--apply`) or everything the sweep started is stopped.

use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use tokio::sync::mpsc::{self, UnboundedSender};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::assign::Slot;
use super::batch::{self, BatchEnd, Member, Msg};
use super::event::Event;
use super::file::Store;
use super::predict::Verdict as Foreseen;
use super::rank::Trial;
use super::schedule::Pool;
use super::search::{Next, SearchState, Stop, Strategy, View};
use super::servers::{Running, Setup, SweepError};
use crate::launch::plan;
use crate::launch::up::UpOutcome;

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

/// How long the search has run: the time on file from its earlier runs, and this run's.
#[derive(Debug, Clone, Copy)]
struct Clock {
    before: Duration,
    started: Instant,
}

impl Clock {
    fn resume(search: &SearchState) -> Clock {
        Clock {
            before: Duration::try_from_secs_f64(search.elapsed_s).unwrap_or_default(),
            started: Instant::now(),
        }
    }

    fn elapsed(&self) -> Duration {
        self.before + self.started.elapsed()
    }
}

/// Records `next`'s candidates as proposed and queues them, each by its place among the
/// proposals; returns its stop.
fn enqueue(search: &mut SearchState, pool: &mut Pool<usize>, next: Next) -> Option<Stop> {
    search.propose(next.run.iter().map(|p| p.candidate.clone()));
    let proposed = &search.proposed;
    pool.push(next.run.into_iter().filter_map(|p| {
        let at = proposed.iter().position(|c| c.id == p.candidate.id)?;
        Some((at, p.need))
    }));
    next.stop
}

/// The sweep's state between wake-ups.
struct Sweep<'a, 's> {
    setup: &'a Setup<'a>,
    store: &'s mut Store,
    strategy: &'s mut dyn Strategy,
    events: &'a UnboundedSender<Event>,
    /// Stops the batches on Ctrl-C, or when one of them failed.
    abort: &'a CancellationToken,
    pool: Pool<usize>,
    /// Set once the strategy has said it proposes no more.
    done: Option<Stop>,
    clock: Clock,
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

    /// Writes `sweep.json` with the strategy's model and the search's time so far.
    fn save(&mut self, trial: Option<Trial>) {
        let search = self.store.search_mut();
        search.model = self.strategy.model();
        search.elapsed_s = self.clock.elapsed().as_secs_f64();
        let saved = match trial {
            Some(t) => self.store.record(t),
            None => self.store.save(),
        };
        if let Err(e) = saved {
            self.fail(e.into());
        }
    }

    /// Asks the strategy for candidates when nothing waits and a GPU is free.
    fn ask(&mut self) {
        if self.done.is_some() || self.pool.waiting() > 0 || self.pool.free_slots().is_empty() {
            return;
        }
        let view = View {
            trials: self.store.trials(),
            proposed: &self.store.search().proposed,
            free: self.pool.free_slots(),
            elapsed: self.clock.elapsed(),
        };
        let next = self.strategy.propose(&view);
        let grew = !next.run.is_empty();
        self.done = enqueue(self.store.search_mut(), &mut self.pool, next);
        if grew {
            self.save(None);
        }
    }

    fn next_batch(&mut self) -> Vec<Member> {
        let proposed = &self.store.search().proposed;
        self.pool
            .next_batch()
            .into_iter()
            .map(|(index, slots)| Member {
                index,
                candidate: proposed[index].clone(),
                slots,
            })
            .collect()
    }

    fn on_msg(&mut self, m: Msg) {
        match m {
            // Writing sweep.json (an fsync) holds up the loads that share this task for a few
            // milliseconds; their servers stay busy meanwhile on the quarter of a batch queued
            // there beyond the cap.
            Msg::Trial(mut t) => {
                // What a measured candidate was predicted to have, beside what it reported.
                if t.outcome.measured().is_some() {
                    t.prediction = match self.setup.verdict(&t.candidate, &t.gpus) {
                        Foreseen::Fits(p) => Some(p),
                        Foreseen::Unfit(_) | Foreseen::Unknown => None,
                    };
                }
                self.strategy.observe(&t);
                self.save(Some((*t).clone()));
                let _ = self.events.send(Event::TrialDone(t));
            }
            Msg::Release { running, slots } if running.is_empty() => self.pool.free(slots),
            Msg::Release { running, slots } => self.jobs.push(stop_job(self.setup, running, slots)),
            Msg::Screened { screens, reply } => {
                let _ = reply.send(self.strategy.judge(&screens));
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
                // A search that may propose more needs the GPUs back.
                let wanted = self.pool.waiting() > 0 || self.done.is_none();
                if self.abort.is_cancelled() || wanted {
                    self.jobs.push(stop_job(self.setup, end.running, end.slots));
                } else {
                    self.kept.extend(end.running);
                }
            }
        }
    }
}

/// Runs the search in `store` with `strategy` (restored from it), then applies the winner
/// (`apply`) or stops what the sweep started. `winner` picks the winner's id from the finished
/// trials.
pub async fn run(
    setup: &Setup<'_>,
    store: &mut Store,
    strategy: &mut dyn Strategy,
    apply: bool,
    winner: impl Fn(&[Trial]) -> Option<String>,
    events: &UnboundedSender<Event>,
    cancel: &CancellationToken,
) -> Result<Ended, SweepError> {
    let abort = cancel.child_token();
    let (tx, mut rx) = mpsc::unbounded_channel::<Msg>();
    // A resumed search goes on: it says anew when it stops.
    store.search_mut().stopped = None;
    let mut sweep = Sweep {
        setup,
        events,
        abort: &abort,
        pool: Pool::new(Vec::new(), setup.slots.clone())
            .with_boards(super::servers::boards(setup.hosts)),
        done: None,
        clock: Clock::resume(store.search()),
        store,
        strategy,
        jobs: FuturesUnordered::new(),
        kept: Vec::new(),
        error: None,
    };
    let mut aborting = false;
    loop {
        if !abort.is_cancelled() {
            sweep.ask();
            let members = sweep.next_batch();
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
    if !abort.is_cancelled() {
        sweep.store.search_mut().stopped = sweep.done;
        sweep.save(None);
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
    let proposed = &store.search().proposed;
    let chosen = best
        .as_deref()
        .filter(|_| apply)
        .and_then(|id| proposed.iter().position(|c| c.id == id));
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
    let profile = setup.profiles.of(&proposed[w])?;
    let servers = plan::plan(&profile, setup.hosts, None, None, setup.fleet.run_root())
        .map_or(0, |i| i.len());
    let _ = events.send(Event::Applying {
        label: proposed[w].label(),
        servers,
    });
    let applied = setup.apply(&profile, cancel).await?;
    Ok(Ended {
        interrupted: cancel.is_cancelled(),
        applied: Some(applied),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::assign::Need;
    use crate::sweep::search::{Model, Proposal};
    use crate::sweep::space::{axes, candidates};

    #[test]
    fn proposals_queue_by_their_place_among_all_proposals_and_a_repeat_keeps_its_place() {
        let names = ["a", "b", "c"].map(String::from);
        let space = candidates(&axes(&names, &[]).unwrap());
        let slot = Slot {
            host: "h".into(),
            gpu: 0,
        };
        let propose = |cs: &[usize], stop| Next {
            run: cs
                .iter()
                .map(|&i| Proposal {
                    candidate: space[i].clone(),
                    need: Need::Any(1),
                })
                .collect(),
            stop,
        };
        let mut search = SearchState::new(Model::Grid);
        let mut pool = Pool::new(Vec::new(), vec![slot.clone()]);
        assert_eq!(enqueue(&mut search, &mut pool, propose(&[1], None)), None);
        // A resumed search proposes an unfinished candidate again: it keeps its place.
        let stop = enqueue(
            &mut search,
            &mut pool,
            propose(&[2, 1], Some(Stop::Exhausted)),
        );
        assert_eq!(stop, Some(Stop::Exhausted));
        assert_eq!(search.proposed, vec![space[1].clone(), space[2].clone()]);
        assert_eq!(pool.next_batch(), vec![(0, vec![slot.clone()])]);
        pool.free([slot.clone()]);
        assert_eq!(pool.next_batch(), vec![(1, vec![slot.clone()])]);
        pool.free([slot.clone()]);
        assert_eq!(pool.next_batch(), vec![(0, vec![slot])]);
        assert_eq!(pool.waiting(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_search_s_time_spans_its_runs() {
        let mut search = SearchState::new(Model::Grid);
        let first = Clock::resume(&search);
        tokio::time::advance(Duration::from_secs(90)).await;
        search.elapsed_s = first.elapsed().as_secs_f64();
        // Interrupted, and resumed later: the time in between is not the search's.
        tokio::time::advance(Duration::from_secs(3600)).await;
        let second = Clock::resume(&search);
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(second.elapsed(), Duration::from_secs(120));
        search.elapsed_s = f64::NAN;
        assert_eq!(Clock::resume(&search).elapsed(), Duration::ZERO);
    }
}
