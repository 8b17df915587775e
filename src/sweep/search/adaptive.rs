//! The adaptive search over ranges: a space-filling sample led by the profile's own values,
//! screened by successive halving, then coordinate refinement around the best measured point
//! on a shrinking step, never near a failed point nor past a memory edge it taught; it stops at
//! `--trials`, `--budget`, or when the best has stopped improving, and then measures its close
//! leaders once more, side by side in one round, so that one lucky window (or one taken under a
//! lighter load) is not crowned. Pure: everything it decides on comes through the [`Strategy`]
//! calls.

use crate::sweep::assign::Need;
use crate::sweep::prune::{self, Contender};
use crate::sweep::range::Dim;
use crate::sweep::rank::crown::MEMORY_KEYS;
use crate::sweep::rank::{Failure, Outcome, Trial};
use crate::sweep::search::{Limits, Model, Next, Proposal, Screen, Stop, Strategy, Verdict, View};
use crate::sweep::slo::Slo;
use crate::sweep::space::Candidate;

/// The first step of refinement, as a fraction of each range; each level halves it.
const FIRST_STEP: f64 = 0.25;
/// Refinement ends below this step: a 1/128 of a range is under what a window can tell apart.
const LAST_STEP: f64 = 1.0 / 128.0;
/// Leaders within this share of the best figure are a close race: a window's noise (about 1%
/// on the sim, more on a loaded host) and the load beside it may have ordered them, so each is
/// measured again.
const CLOSE: f64 = 0.05;
/// Keys of the static pool's share: below a point that could not fit the weights and a cache
/// in it ([`Failure::NotEnoughMemory`]) lies the same failure.
const STATIC_KEYS: [&str; 2] = ["server.mem_fraction_static", "flag.mem-fraction-static"];

/// The adaptive search with what it has seen.
#[derive(Debug, Clone)]
pub struct Adaptive {
    dims: Vec<Dim>,
    /// The profile's value for each dimension, where it has one inside the dimension.
    seed: Vec<Option<String>>,
    limits: Limits,
    /// Under limits, the search maximises throughput among the candidates that keep them.
    slo: Slo,
    need: Need,
    /// The sweep's GPUs: a round's size. The scheduler asks whenever one GPU frees, so the
    /// GPUs free at a call say nothing about the round.
    gpus: usize,
    /// Every candidate proposed, in order: the board's indices point here.
    known: Vec<Candidate>,
    board: Vec<Contender>,
    /// The step the last proposal used, for `sweep.json`.
    step: f64,
    /// Candidates an earlier run proposed and did not finish (it was interrupted): proposed
    /// again first, in their order.
    unfinished: Vec<Candidate>,
}

/// The `i`th element of the van der Corput sequence in `base`: Halton's coordinates.
fn halton(mut i: usize, base: usize) -> f64 {
    let (mut f, mut r) = (1.0, 0.0);
    while i > 0 {
        f /= base as f64;
        r += f * (i % base) as f64;
        i /= base;
    }
    r
}

const PRIMES: [usize; 12] = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37];

/// What a search is asked: its space and where to start in it, when to stop, the latency
/// limits a winner keeps, and what each candidate needs of the sweep's GPUs.
pub struct Setup {
    pub dims: Vec<Dim>,
    /// The profile's own value on each axis, where it has one.
    pub seed: Vec<Option<String>>,
    pub limits: Limits,
    pub slo: Slo,
    pub need: Need,
    /// The sweep's GPUs.
    pub gpus: usize,
}

impl Adaptive {
    /// The search `setup` asks for, continuing from what is on file: the candidates
    /// `proposed` and the finished `trials`.
    pub fn new(setup: Setup, proposed: &[Candidate], trials: &[Trial]) -> Adaptive {
        let Setup {
            dims,
            seed,
            limits,
            slo,
            need,
            gpus,
        } = setup;
        let mut a = Adaptive {
            dims,
            seed,
            limits,
            slo,
            need,
            gpus: gpus.max(1),
            known: proposed.to_vec(),
            board: Vec::new(),
            step: FIRST_STEP,
            unfinished: proposed
                .iter()
                .filter(|c| !trials.iter().any(|t| t.candidate.id == c.id))
                .cloned()
                .collect(),
        };
        for t in trials {
            if matches!(t.outcome, Outcome::Failed { .. }) || t.candidate.repeat > 0 {
                continue;
            }
            if let Some(w) = t.first_window {
                let candidate = a.index(&t.candidate);
                a.board.push(Contender {
                    candidate,
                    hosts: prune::hosts(&t.gpus),
                    estimate: w.estimate,
                });
            }
        }
        a
    }

    fn index(&mut self, c: &Candidate) -> usize {
        match self.known.iter().position(|k| k.id == c.id) {
            Some(i) => i,
            None => {
                self.known.push(c.clone());
                self.known.len() - 1
            }
        }
    }

    /// The candidate at `u` (one coordinate per dimension, in [0, 1]).
    pub fn candidate(&self, u: &[f64]) -> Candidate {
        let settings: Vec<(String, String)> = self
            .dims
            .iter()
            .zip(u)
            .map(|(d, &x)| (d.key.clone(), d.value(x)))
            .collect();
        let id = settings
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(";");
        Candidate::new(id, settings)
    }

    /// Where a candidate sits, one coordinate per dimension.
    fn point(&self, c: &Candidate) -> Option<Vec<f64>> {
        self.dims
            .iter()
            .map(|d| {
                let (_, v) = c.settings.iter().find(|(k, _)| *k == d.key)?;
                d.unit(v)
            })
            .collect()
    }

    /// How many candidates the first sample has: enough to see each dimension from both
    /// sides, and at least a round.
    fn sample_size(&self) -> usize {
        (2 * self.dims.len() + 2)
            .max(self.gpus)
            .min(self.limits.trials)
    }

    /// The `i`th point of the sample: the profile's own values first (the middle of a range
    /// it does not set), then Halton points, which cover the space evenly at any count.
    fn sample(&self, i: usize) -> Vec<f64> {
        if i == 0 {
            return self
                .dims
                .iter()
                .zip(&self.seed)
                .map(|(d, s)| s.as_deref().and_then(|v| d.unit(v)).unwrap_or(0.5))
                .collect();
        }
        (0..self.dims.len())
            .map(|d| halton(i, PRIMES[d % PRIMES.len()]))
            .collect()
    }

    /// A trial's figure to maximise: output tok/s per GPU over the full window, penalised for
    /// each `--slo` limit it breaks.
    fn score(&self, t: &Trial) -> Option<f64> {
        match &t.outcome {
            Outcome::Ok(m) => Some(self.slo.penalised(m, m.output_tok_s_per_gpu)),
            _ => None,
        }
    }

    /// Whether `t` counts for the best: measured, and keeping the SLO.
    fn keeps(&self, t: &Trial) -> bool {
        matches!(&t.outcome, Outcome::Ok(m) if self.slo.keeps(m))
    }

    /// Whether `c` is too close to a failed point at this `step`, or past a memory edge one
    /// taught with the rest the same: at or above an out-of-memory point on every memory
    /// dimension, at or below a not-enough-memory point on the static fraction.
    fn infeasible(&self, c: &[f64], failed: &[(Vec<f64>, Failure)], step: f64) -> bool {
        failed.iter().any(|(f, kind)| {
            let mut near = true;
            let mut beyond = matches!(
                kind,
                Failure::OutOfMemory | Failure::NotEnoughMemory | Failure::Predicted
            );
            for (d, dim) in self.dims.iter().enumerate() {
                let gap = c[d] - f[d];
                if dim.is_list() {
                    if gap.abs() > 1e-9 {
                        near = false;
                        beyond = false;
                    }
                    continue;
                }
                if gap.abs() >= step / 2.0 {
                    near = false;
                }
                let key = dim.key.as_str();
                let past = match kind {
                    Failure::OutOfMemory => MEMORY_KEYS.contains(&key) && gap >= -1e-9,
                    // The graphs and request cap do not change what the static pool holds.
                    _ if MEMORY_KEYS.contains(&key) && !STATIC_KEYS.contains(&key) => true,
                    _ => STATIC_KEYS.contains(&key) && gap <= 1e-9,
                };
                if !(past || gap.abs() < 1e-9) {
                    beyond = false;
                }
            }
            near || beyond
        })
    }

    /// The neighbours of `best` at `step`: one step down and up each range, every other
    /// value of each list.
    fn neighbours(&self, best: &[f64], step: f64, behind: &[(usize, f64)]) -> Vec<Vec<f64>> {
        let mut out = Vec::new();
        let mut lists = Vec::new();
        for (d, dim) in self.dims.iter().enumerate() {
            let moves: Vec<f64> = match &dim.domain {
                crate::sweep::range::Domain::List { values } => {
                    let n = values.len() as f64;
                    (0..values.len())
                        .map(|i| (i as f64 + 0.5) / n)
                        .filter(|&u| !behind.iter().any(|&(e, b)| e == d && (b - u).abs() < 1e-9))
                        .collect()
                }
                crate::sweep::range::Domain::Range { .. } => vec![best[d] - step, best[d] + step],
            };
            for m in moves {
                let mut p = best.to_vec();
                p[d] = m.clamp(0.0, 1.0);
                if dim.is_list() {
                    lists.push(p);
                } else {
                    out.push(p);
                }
            }
        }
        // Then the diagonals of each pair of ranges: where two knobs trade memory against
        // each other, the best lies along a ridge that single steps cannot climb.
        let ranges: Vec<usize> = (0..self.dims.len())
            .filter(|&d| !self.dims[d].is_list())
            .collect();
        for (i, &a) in ranges.iter().enumerate() {
            for &b in &ranges[i + 1..] {
                for (sa, sb) in [(1.0, -1.0), (-1.0, 1.0), (1.0, 1.0), (-1.0, -1.0)] {
                    let mut p = best.to_vec();
                    p[a] = (p[a] + sa * step).clamp(0.0, 1.0);
                    p[b] = (p[b] + sb * step).clamp(0.0, 1.0);
                    out.push(p);
                }
            }
        }
        // Another list value last: it moves the most at once.
        out.extend(lists);
        out
    }

    /// How many moves one poll around a point makes: a step down and up each range, the four
    /// diagonals of each pair of ranges, and every other value of each list.
    fn moves(&self) -> usize {
        let ranges = self.dims.iter().filter(|d| !d.is_list()).count();
        let lists: usize = self
            .dims
            .iter()
            .map(|d| match &d.domain {
                crate::sweep::range::Domain::List { values } => values.len().saturating_sub(1),
                crate::sweep::range::Domain::Range { .. } => 0,
            })
            .sum();
        2 * ranges + 2 * ranges * ranges.saturating_sub(1) + lists
    }

    /// The list values clearly behind: (dimension, coordinate) of each value that ran at
    /// least twice and never came within 70% of the best figure.
    fn behind(&self, trials: &[Trial]) -> Vec<(usize, f64)> {
        let top = trials
            .iter()
            .filter_map(|t| self.score(t))
            .fold(0.0, f64::max);
        let mut out = Vec::new();
        for (d, dim) in self.dims.iter().enumerate() {
            let crate::sweep::range::Domain::List { values } = &dim.domain else {
                continue;
            };
            for v in values {
                let ran: Vec<f64> = trials
                    .iter()
                    .filter(|t| {
                        t.candidate
                            .settings
                            .iter()
                            .any(|(k, x)| *k == dim.key && x == v)
                    })
                    .filter_map(|t| self.score(t))
                    .collect();
                if ran.len() >= 2 && ran.iter().all(|&s| s < 0.7 * top) {
                    out.extend(dim.unit(v).map(|u| (d, u)));
                }
            }
        }
        out
    }

    /// How much memory a point asks for, to break ties: the sum of its memory coordinates.
    fn memory(&self, c: &Candidate) -> f64 {
        let Some(u) = self.point(c) else { return 0.0 };
        self.dims
            .iter()
            .zip(u)
            .filter(|(d, _)| MEMORY_KEYS.contains(&d.key.as_str()))
            .map(|(_, x)| x)
            .sum()
    }

    /// The search ends for `why`: once every proposed candidate has run, the leaders that a
    /// window's noise may have ordered (within [`CLOSE`] of the best figure) run a second
    /// window, all in one last round, as many as the GPUs hold at once: measured side by side,
    /// under the same load on the hosts' shared CPUs, PCIe and network. The ranking pools each
    /// config's windows and crowns only a confirmed one, judging ties by how much the leaders'
    /// two windows disagree (`rank::crown`). Not at `--budget`, which is a promise about time.
    fn finish(&self, view: &View<'_>, pending: bool, why: Stop) -> Next {
        let done = Next {
            run: Vec::new(),
            stop: Some(why),
        };
        if why == Stop::Budget || view.proposed.iter().any(|c| c.repeat > 0) {
            return done;
        }
        if pending {
            // Asked again as each trial ends; the leaders are known once the last has.
            return Next {
                run: Vec::new(),
                stop: None,
            };
        }
        let any = view.trials.iter().any(|t| self.keeps(t));
        let mut leaders: Vec<(f64, &Trial)> = view
            .trials
            .iter()
            .filter(|t| !any || self.keeps(t))
            .filter_map(|t| Some((self.score(t)?, t)))
            .collect();
        leaders.sort_by(|a, b| b.0.total_cmp(&a.0));
        let top = leaders.first().map_or(0.0, |l| l.0);
        let round = self.gpus / self.need.size().max(1);
        let close: Vec<Proposal> = leaders
            .iter()
            .take_while(|(s, _)| *s >= top * (1.0 - CLOSE))
            .take(round)
            .map(|(_, t)| Proposal {
                candidate: t.candidate.again(),
                need: self.need.clone(),
            })
            .collect();
        if close.len() < 2 {
            return done;
        }
        // Not before they can all start at once: one started on the last GPU to come free
        // would run its window beside fewer servers, on a lighter load, than the others.
        if view.free.len() < close.len() * self.need.size() {
            return Next {
                run: Vec::new(),
                stop: None,
            };
        }
        Next {
            run: close,
            stop: Some(why),
        }
    }

    /// The best measured trial and its place: the trials in order, each taking the lead when
    /// its figure is higher, or within half a percent (the same, to a window's precision) and
    /// asking less memory, which leaves the most room to grow into. Only those keeping the SLO
    /// count while any does (until then, the penalised figures). Replayed in order, a lucky
    /// window cannot hand the lead back and forth between near-equal points.
    fn best<'t>(&self, trials: &'t [Trial]) -> Option<(usize, &'t Trial)> {
        let any = trials.iter().any(|t| self.keeps(t));
        let mut lead: Option<(usize, &'t Trial, f64)> = None;
        for (i, t) in trials.iter().enumerate() {
            let Some(s) = self.score(t).filter(|_| !any || self.keeps(t)) else {
                continue;
            };
            let takes = lead.is_none_or(|(_, l, ls)| {
                s > ls || (s >= ls * 0.995 && self.memory(&t.candidate) < self.memory(&l.candidate))
            });
            if takes {
                lead = Some((i, t, s));
            }
        }
        lead.map(|(i, t, _)| (i, t))
    }
}

impl Strategy for Adaptive {
    fn propose(&mut self, view: &View<'_>) -> Next {
        for c in view.proposed {
            self.index(c);
        }
        if !self.unfinished.is_empty() {
            let need = self.need.clone();
            return Next {
                run: std::mem::take(&mut self.unfinished)
                    .into_iter()
                    .map(|candidate| Proposal {
                        candidate,
                        need: need.clone(),
                    })
                    .collect(),
                stop: None,
            };
        }
        // Confirmation windows are not explored points: --trials counts the others.
        let proposed = view.proposed.iter().filter(|c| c.repeat == 0).count();
        let pending = view
            .proposed
            .iter()
            .any(|c| !view.trials.iter().any(|t| t.candidate.id == c.id));
        if let Some(b) = self.limits.budget_s
            && view.elapsed.as_secs_f64() >= b
        {
            return Next {
                run: Vec::new(),
                stop: Some(Stop::Budget),
            };
        }
        if proposed >= self.limits.trials {
            return self.finish(view, pending, Stop::Trials);
        }
        let room = view.free.len().min(self.limits.trials - proposed);
        let taken = |id: &str, run: &[Candidate]| {
            view.proposed.iter().any(|p| p.id == id) || run.iter().any(|p| p.id == id)
        };
        let failed: Vec<(Vec<f64>, Failure)> = view
            .trials
            .iter()
            .filter_map(|t| match t.outcome {
                Outcome::Failed { kind, .. } => Some((self.point(&t.candidate)?, kind)),
                _ => None,
            })
            .collect();
        let best = self.best(view.trials);
        let mut run: Vec<Candidate> = Vec::new();
        let n0 = self.sample_size();
        // The sample first; it goes on past its size while nothing has been measured.
        let sampling = proposed < n0 || best.is_none();
        if sampling {
            let want = if best.is_none() {
                room
            } else {
                room.min(n0 - proposed)
            };
            let mut i = 0;
            // The sample runs out only where the space is smaller than what is asked.
            while run.len() < want && i < 64 * n0.max(1) {
                let u = self.sample(i);
                i += 1;
                let c = self.candidate(&u);
                if taken(&c.id, &run) || self.infeasible(&u, &failed, FIRST_STEP) {
                    continue;
                }
                run.push(c);
            }
        } else if let Some((at, t)) = best {
            // The best has not moved for this many finished trials: the last rounds stopped
            // improving.
            let patience = 3 * (2 * self.dims.len()).max(self.gpus);
            if view.trials.len() - at > patience {
                return self.finish(view, pending, Stop::Converged);
            }
            let Some(centre) = self.point(&t.candidate) else {
                return self.finish(view, pending, Stop::Exhausted);
            };
            let behind = self.behind(view.trials);
            // Each full poll of the moves around the best (or round of the GPUs, if larger)
            // starts a step finer: the later polls look closer around a best the earlier ones
            // placed. Counted in polls, not rounds, so that a sweep on fewer GPUs than moves
            // still tries every move at a step before it narrows.
            let polls = (proposed - n0) / self.moves().max(self.gpus);
            let mut step = FIRST_STEP / 2f64.powi(polls.min(16) as i32);
            while run.len() < room && step >= LAST_STEP {
                for u in self.neighbours(&centre, step, &behind) {
                    if run.len() == room {
                        break;
                    }
                    let c = self.candidate(&u);
                    if !taken(&c.id, &run) && !self.infeasible(&u, &failed, step) {
                        run.push(c);
                    }
                }
                self.step = step;
                if run.len() < room {
                    step /= 2.0;
                }
            }
        }
        if run.is_empty() && !pending {
            let end = if sampling {
                Stop::Exhausted
            } else {
                Stop::Converged
            };
            return self.finish(view, pending, end);
        }
        for c in &run {
            self.index(c);
        }
        Next {
            run: run
                .into_iter()
                .map(|candidate| Proposal {
                    candidate,
                    need: self.need.clone(),
                })
                .collect(),
            stop: None,
        }
    }

    /// Successive halving, as the grid does it: a candidate clearly behind the leader on the
    /// same hosts after its first window stops there. A confirmation window is never pruned:
    /// it is there to be measured in full.
    fn judge(&mut self, screens: &[Screen]) -> Vec<Verdict> {
        let numbers: Vec<Option<usize>> = screens
            .iter()
            .map(|s| (s.candidate.repeat == 0).then(|| self.index(&s.candidate)))
            .collect();
        prune::judge(&mut self.board, screens, &numbers, |i| {
            self.known[i].clone()
        })
    }

    /// A failed candidate leads nobody; where it failed is read from the trials.
    fn observe(&mut self, trial: &Trial) {
        if matches!(trial.outcome, Outcome::Failed { .. }) {
            let failed = self.index(&trial.candidate);
            self.board.retain(|c| c.candidate != failed);
        }
    }

    fn model(&self) -> Model {
        Model::Adaptive { step: self.step }
    }
}

#[cfg(test)]
#[path = "adaptive_tests.rs"]
mod tests;
