//! The grid search: every point of the product of the axes, proposed at once in the order of
//! the space, each with the GPUs the assignment gives it; in rounds, successive halving stops
//! a candidate after its first window when it is clearly behind the leader on the same hosts.
//! Pure.

use crate::sweep::assign::Need;
use crate::sweep::prune::{self, Contender};
use crate::sweep::rank::{Outcome, Trial};
use crate::sweep::search::{Model, Next, Proposal, Screen, Stop, Strategy, Verdict, View};
use crate::sweep::space::Candidate;

/// The grid, with the first windows seen so far.
#[derive(Debug, Clone)]
pub struct Grid {
    space: Vec<Candidate>,
    /// What each candidate of `space` needs, in the same order.
    needs: Vec<Need>,
    /// First-window figures to judge the next ones against: a candidate's index in `space`.
    board: Vec<Contender>,
}

impl Grid {
    /// The grid over `space` (`needs` in the same order), continuing from the `trials` already
    /// on file: their first windows judge the rest, except those of candidates that failed
    /// later, which lead nobody.
    pub fn new(space: Vec<Candidate>, needs: Vec<Need>, trials: &[Trial]) -> Grid {
        let mut grid = Grid {
            space,
            needs,
            board: Vec::new(),
        };
        grid.board = trials
            .iter()
            .filter(|t| !matches!(t.outcome, Outcome::Failed { .. }))
            .filter_map(|t| {
                Some(Contender {
                    candidate: grid.index(&t.candidate)?,
                    hosts: prune::hosts(&t.gpus),
                    estimate: t.first_window?.estimate,
                })
            })
            .collect();
        grid
    }

    fn index(&self, c: &Candidate) -> Option<usize> {
        self.space.iter().position(|s| s.id == c.id)
    }
}

impl Strategy for Grid {
    /// Every candidate without a trial, at once, the largest servers first so that smaller
    /// ones fill the GPUs they leave: the scheduler's queue keeps their order.
    fn propose(&mut self, view: &View<'_>) -> Next {
        let mut run: Vec<Proposal> = self
            .space
            .iter()
            .zip(&self.needs)
            .filter(|(c, _)| !view.trials.iter().any(|t| t.candidate.id == c.id))
            .map(|(c, need)| Proposal {
                candidate: c.clone(),
                need: need.clone(),
            })
            .collect();
        run.sort_by_key(|p| std::cmp::Reverse(p.need.size()));
        Next {
            run,
            stop: Some(Stop::Exhausted),
        }
    }

    /// Successive halving: screens with an estimate are judged together against the board
    /// and then join it; one without goes on.
    fn judge(&mut self, screens: &[Screen]) -> Vec<Verdict> {
        let numbers: Vec<Option<usize>> =
            screens.iter().map(|s| self.index(&s.candidate)).collect();
        prune::judge(&mut self.board, screens, &numbers, |i| {
            self.space[i].clone()
        })
    }

    /// A leader that failed later (out of memory in its full window) prunes no more.
    fn observe(&mut self, trial: &Trial) {
        if matches!(trial.outcome, Outcome::Failed { .. }) {
            let failed = self.index(&trial.candidate);
            self.board.retain(|c| Some(c.candidate) != failed);
        }
    }

    fn model(&self) -> Model {
        Model::Grid
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::sweep::assign::Slot;
    use crate::sweep::rank::{FirstWindow, Measured, Pruned};
    use crate::sweep::search::SearchState;
    use crate::sweep::space::{axes, candidates};
    use crate::sweep::stats::Estimate;

    fn slot(host: &str, gpu: u32) -> Slot {
        Slot {
            host: host.into(),
            gpu,
        }
    }

    fn e(mean: f64) -> Estimate {
        Estimate::around(mean, 10.0)
    }

    /// Four strategies, each on any GPU (rounds).
    fn grid(trials: &[Trial]) -> Grid {
        let names = ["a", "b", "c", "d"].map(String::from);
        let space = candidates(&axes(&names, &[]).unwrap());
        let needs = vec![Need::Any(1); space.len()];
        Grid::new(space, needs, trials)
    }

    fn cand(g: &Grid, i: usize) -> Candidate {
        g.space[i].clone()
    }

    fn screen(g: &Grid, i: usize, host: &str, estimate: Option<f64>) -> Screen {
        Screen {
            candidate: cand(g, i),
            gpus: vec![slot(host, i as u32)],
            estimate: estimate.map(e),
        }
    }

    fn measured(mean: f64) -> Measured {
        Measured {
            gpus: 1,
            server_gpus: 1,
            output_tok_s: mean,
            output_tok_s_per_gpu: mean,
            req_s: 1.0,
            completed: 10,
            errors: 0,
            mean_output_tokens: 20.0,
            ttft_s: None,
            itl_s: None,
            cap: 8,
            in_flight: 10,
            kv_tokens: 1000,
            strategy: None,
            startup_s: None,
            completed_output_tok_s: mean,
            metrics_output_tok_s: None,
            estimate: Some(e(mean)),
            lengths: Default::default(),
        }
    }

    /// A trial as the scheduler would write it for `s` after `verdict`, measuring `full`.
    fn trial(s: &Screen, verdict: &Verdict, full: Option<f64>) -> Trial {
        let first_window = s.estimate.map(|estimate| FirstWindow {
            after_s: 1.0,
            estimate,
        });
        let outcome = match (verdict, full) {
            (Verdict::Prune { leader, estimate }, _) => Outcome::Pruned(Pruned {
                measured: measured(s.estimate.unwrap().mean),
                leader: leader.id.clone(),
                leader_label: leader.label(),
                leader_estimate: *estimate,
            }),
            (Verdict::Continue, Some(mean)) => Outcome::Ok(measured(mean)),
            (Verdict::Continue, None) => Outcome::Failed {
                kind: crate::sweep::rank::Failure::OutOfMemory,
                reason: "out of memory".into(),
                log_tail: vec![],
            },
        };
        Trial {
            candidate: s.candidate.clone(),
            gpus: s.gpus.clone(),
            outcome,
            first_window,
            cache: None,
            prediction: None,
        }
    }

    fn view<'a>(trials: &'a [Trial], free: &'a [Slot]) -> View<'a> {
        View {
            trials,
            proposed: &[],
            free,
            elapsed: Duration::ZERO,
        }
    }

    #[test]
    fn a_fresh_grid_proposes_its_whole_space_in_order_with_its_needs_and_stops() {
        let names = ["x", "y"].map(String::from);
        let space = candidates(&axes(&names, &["server.m=1,2".into()]).unwrap());
        let needs: Vec<Need> = (0..4).map(|g| Need::Gpus(vec![slot("h", g)])).collect();
        let mut g = Grid::new(space.clone(), needs.clone(), &[]);
        let next = g.propose(&view(&[], &[slot("h", 0)]));
        assert_eq!(next.stop, Some(Stop::Exhausted));
        let run: Vec<(Candidate, Need)> = next
            .run
            .into_iter()
            .map(|p| (p.candidate, p.need))
            .collect();
        assert_eq!(run, space.into_iter().zip(needs).collect::<Vec<_>>());
        assert_eq!(g.model(), Model::Grid);
    }

    #[test]
    fn screens_without_an_estimate_go_on_and_the_rest_join_the_board() {
        let mut g = grid(&[]);
        let v = g.judge(&[screen(&g, 0, "a", Some(1000.0))]);
        assert_eq!(
            v,
            vec![Verdict::Continue],
            "a lone candidate loses to nobody"
        );
        let screens = [
            screen(&g, 1, "a", None),
            screen(&g, 2, "a", Some(100.0)),
            screen(&g, 3, "b", Some(100.0)),
        ];
        let v = g.judge(&screens);
        assert_eq!(v[0], Verdict::Continue);
        assert_eq!(
            v[1],
            Verdict::Prune {
                leader: cand(&g, 0),
                estimate: e(1000.0)
            }
        );
        assert_eq!(v[2], Verdict::Continue, "nobody to compare with on host b");
        let on_board: Vec<usize> = g.board.iter().map(|c| c.candidate).collect();
        assert_eq!(on_board, vec![0, 2, 3]);
        assert_eq!(
            prune::hosts(&[slot("b", 1), slot("a", 0), slot("b", 2)]),
            vec!["a", "b"]
        );
    }

    #[test]
    fn a_leader_that_fails_later_prunes_no_more() {
        let mut g = grid(&[]);
        let lead = screen(&g, 0, "a", Some(1000.0));
        assert_eq!(
            g.judge(std::slice::from_ref(&lead)),
            vec![Verdict::Continue]
        );
        g.observe(&trial(&lead, &Verdict::Continue, None));
        let v = g.judge(&[screen(&g, 1, "a", Some(100.0))]);
        assert_eq!(v, vec![Verdict::Continue]);
        // A measured leader stays on the board.
        g.observe(&trial(&screen(&g, 1, "a", Some(100.0)), &v[0], Some(100.0)));
        let v = g.judge(&[screen(&g, 2, "a", Some(10.0))]);
        assert!(matches!(&v[0], Verdict::Prune { leader, .. } if leader.id == g.space[1].id));
    }

    /// The first-window figures (`None`: the window could not tell) and full figures (`None`:
    /// failed in its full window) of the four candidates, in space order.
    const FIRST: [Option<f64>; 4] = [Some(1000.0), Some(990.0), Some(100.0), None];
    const FULL: [Option<f64>; 4] = [Some(1010.0), None, Some(100.0), Some(50.0)];

    /// A scheduler on one GPU, in made-up time: each candidate in turn is screened, judged,
    /// and ends; `stop_after` trials, it is interrupted. The trials it wrote.
    fn run_on_one_gpu(g: &mut Grid, mut trials: Vec<Trial>, stop_after: usize) -> Vec<Trial> {
        let free = [slot("a", 0)];
        let next = g.propose(&view(&trials, &free));
        assert_eq!(next.stop, Some(Stop::Exhausted));
        for p in next.run {
            if trials.len() == stop_after {
                break;
            }
            let i = g.index(&p.candidate).unwrap();
            let s = screen(g, i, "a", FIRST[i]);
            let v = g.judge(std::slice::from_ref(&s)).remove(0);
            let t = trial(&s, &v, FULL[i]);
            g.observe(&t);
            trials.push(t);
        }
        trials
    }

    #[test]
    fn a_resumed_grid_runs_only_what_is_missing_and_judges_it_as_an_uninterrupted_one() {
        let whole = run_on_one_gpu(&mut grid(&[]), Vec::new(), usize::MAX);
        let states: Vec<&str> = whole
            .iter()
            .map(|t| match t.outcome {
                Outcome::Ok(_) => "ok",
                Outcome::Pruned(_) => "pruned",
                Outcome::Failed { .. } => "failed",
            })
            .collect();
        // b (990) is a close race with a (1000), then fails; c is behind a; d cannot be told.
        assert_eq!(states, ["ok", "failed", "pruned", "ok"]);
        for cut in 0..=4 {
            let before = run_on_one_gpu(&mut grid(&[]), Vec::new(), cut);
            // What sweep.json holds goes through JSON, as a resumed sweep reads it.
            let on_file: Vec<Trial> =
                serde_json::from_str(&serde_json::to_string(&before).unwrap()).unwrap();
            let mut resumed = grid(&on_file);
            let proposed = resumed.propose(&view(&on_file, &[slot("a", 0)]));
            assert_eq!(proposed.run.len(), 4 - cut, "cut after {cut}");
            let after = run_on_one_gpu(&mut grid(&on_file), on_file, usize::MAX);
            assert_eq!(after, whole, "cut after {cut}");
        }
        // The state a resumed search starts from reads back as written.
        let mut state = SearchState::new(Model::Grid);
        state.propose(whole.iter().map(|t| t.candidate.clone()));
        assert_eq!(state.proposed, grid(&[]).space);
    }
}
