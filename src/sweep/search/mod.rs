//! The search seam: a sweep is a search. A [`Strategy`] proposes candidates from the results so
//! far and judges each first window; the scheduler (`run`) starts whatever it proposes on free
//! GPUs and tells it every trial that ends. What defines a search ([`SearchSpec`]) and what it
//! has done ([`SearchState`]) are written to `sweep.json`, so that `--resume` continues it.

pub mod adaptive;
pub mod grid;
pub mod prune;
pub mod range;
pub mod space;
pub mod stats;

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::assign::{Need, Slot};
use super::range::Dim;
use super::rank::Trial;
use super::stats::Estimate;
use space::{Axis, Candidate};

/// How far the search may go, from the command line.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// Trials at most (`--trials`).
    pub trials: usize,
    /// Seconds of search at most (`--budget`), over every run of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_s: Option<f64>,
}

/// What the search is, as the command line gave it: a resumed sweep must give the same.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "strategy", rename_all = "snake_case")]
pub enum SearchSpec {
    /// Every point of the product of the axes, with successive halving in rounds.
    Grid { axes: Vec<Axis> },
    /// Ranges searched adaptively (`adaptive`), from the profile's own values (`seed`, one per
    /// dimension).
    Adaptive {
        dims: Vec<Dim>,
        seed: Vec<Option<String>>,
        limits: Limits,
    },
}

impl SearchSpec {
    /// The candidates known before the search starts, in order: the grid's whole space; for
    /// the adaptive search, the ends of every dimension (what a bad value would show first).
    pub fn space(&self) -> Vec<Candidate> {
        match self {
            SearchSpec::Grid { axes } => space::candidates(axes),
            SearchSpec::Adaptive { dims, .. } => {
                let mut out: Vec<Candidate> = Vec::new();
                for u in [0.0, 1.0] {
                    let ends: Vec<Axis> = dims
                        .iter()
                        .map(|d| Axis {
                            key: d.key.clone(),
                            values: vec![d.value(u)],
                        })
                        .collect();
                    for c in space::candidates(&ends) {
                        if !out.contains(&c) {
                            out.push(c);
                        }
                    }
                }
                out
            }
        }
    }

    /// The state of this search before it has proposed anything.
    pub fn start(&self) -> SearchState {
        SearchState::new(match self {
            SearchSpec::Grid { .. } => Model::Grid,
            SearchSpec::Adaptive { .. } => Model::Adaptive { step: 0.25 },
        })
    }
}

/// Why a search ended on its own (an interrupt is no end: `--resume` continues).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stop {
    /// Every candidate of the space was proposed and has run.
    Exhausted,
    /// `--trials` candidates were proposed.
    Trials,
    /// `--budget` ran out.
    Budget,
    /// The best stopped improving, or refinement reached its finest step.
    Converged,
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stop::Exhausted => "every candidate of the space has run",
            Stop::Trials => "it reached --trials",
            Stop::Budget => "it reached --budget",
            Stop::Converged => "the best stopped improving",
        })
    }
}

/// What a strategy keeps beyond its trials, restored on `--resume`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "strategy", rename_all = "snake_case")]
pub enum Model {
    /// The grid keeps nothing more: its space is in the spec, its first windows in the trials.
    Grid,
    /// The adaptive search's refinement step (a fraction of each range) when it last proposed;
    /// the rest of what it knows is its trials.
    Adaptive { step: f64 },
}

/// The search's own state in `sweep.json`, rewritten with every trial and every proposal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchState {
    /// Every candidate proposed, in the order proposed (over every run of a resumed sweep).
    pub proposed: Vec<Candidate>,
    /// Seconds the search has run, over every run of it: a budget spans resumes.
    pub elapsed_s: f64,
    /// Why it ended; `None` while it goes on, and after an interrupt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<Stop>,
    pub model: Model,
}

impl SearchState {
    /// A search that has proposed nothing yet.
    pub fn new(model: Model) -> SearchState {
        SearchState {
            proposed: Vec::new(),
            elapsed_s: 0.0,
            stopped: None,
            model,
        }
    }

    /// Adds the candidates not proposed before (a resumed search proposes an unfinished one
    /// again), in order.
    pub fn propose(&mut self, candidates: impl IntoIterator<Item = Candidate>) {
        for c in candidates {
            if !self.proposed.iter().any(|p| p.id == c.id) {
                self.proposed.push(c);
            }
        }
    }
}

/// What a strategy sees when it proposes.
#[derive(Debug, Clone, Copy)]
pub struct View<'a> {
    /// Every finished trial (measured, pruned or failed), those of earlier runs first.
    pub trials: &'a [Trial],
    /// Every candidate proposed so far, over every run.
    pub proposed: &'a [Candidate],
    /// The GPUs free now, in inventory order (never empty when asked).
    pub free: &'a [Slot],
    /// How long the search has run, over every run of it.
    pub elapsed: Duration,
}

/// A candidate to run and the GPUs it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proposal {
    pub candidate: Candidate,
    pub need: Need,
}

/// A strategy's answer: candidates to run, in order, and whether any more will follow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Next {
    /// Queued in order; a candidate waiting for its GPUs holds back the ones after it.
    pub run: Vec<Proposal>,
    /// `Some`: these are the last; the search ends when they have run. `None`: ask again when
    /// a GPU is free and nothing waits. An empty `run` then means "not yet", which with
    /// nothing running ends the search without a stop: propose or stop instead.
    pub stop: Option<Stop>,
}

/// A candidate just through its first window, as the strategy judges it.
#[derive(Debug, Clone, PartialEq)]
pub struct Screen {
    pub candidate: Candidate,
    pub gpus: Vec<Slot>,
    /// `None` when the window could not tell (too few tokens) or the candidate failed.
    pub estimate: Option<Estimate>,
}

/// What becomes of a candidate after its first window.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Promoted to the full window.
    Continue,
    /// Stops now: `leader` is clearly ahead, with this figure.
    Prune {
        leader: Candidate,
        estimate: Estimate,
    },
}

/// A way of searching the space. The scheduler asks [`Strategy::propose`] whenever nothing
/// waits for a GPU and at least one is free, until it answers with a stop; calls
/// [`Strategy::judge`] as first windows end; and [`Strategy::observe`] as each trial ends,
/// before it is written. Everything a strategy decides on comes through these calls (time
/// too, as [`View::elapsed`]), so it is pure and tested on made-up trials.
pub trait Strategy: Send {
    fn propose(&mut self, view: &View<'_>) -> Next;
    /// One verdict per screen, in order; screens of one batch come together.
    fn judge(&mut self, screens: &[Screen]) -> Vec<Verdict>;
    fn observe(&mut self, trial: &Trial);
    /// What it keeps beyond its trials, written to `sweep.json` with every change.
    fn model(&self) -> Model;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_candidate_is_proposed_once_and_the_state_reads_back() {
        let space = SearchSpec::Grid {
            axes: vec![Axis {
                key: space::STRATEGY_KEY.into(),
                values: vec!["a".into(), "b".into()],
            }],
        }
        .space();
        let mut s = SearchState::new(Model::Grid);
        s.propose(space.clone());
        s.propose(space.iter().rev().cloned());
        assert_eq!(s.proposed, space);
        s.stopped = Some(Stop::Exhausted);
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["model"]["strategy"], "grid");
        assert_eq!(json["stopped"], "exhausted");
        assert_eq!(serde_json::from_value::<SearchState>(json).unwrap(), s);
    }
}
