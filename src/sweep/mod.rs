//! The tuner: a sweep is a search. Its rooms: `search` (the seam, the candidate space and the
//! search methods: the grid with successive halving, the adaptive search), `measure` (the
//! candidates' servers, the workload, trials and what they measured), `rank` (the ranking, its
//! ETA projection and the SLO) and `report`; at the top, planning (`plan`), GPU assignment,
//! the schedule, the run loop, the candidates' profiles, the memory prediction that skips a
//! layout before it starts (`predict`) and `sweep.json` (`file`).

pub mod assign;
pub mod event;
pub mod file;
pub mod measure;
pub mod plan;
pub mod predict;
pub mod profiles;
pub mod rank;
pub mod report;
pub mod run;
pub mod schedule;
pub mod search;

// The rooms' modules by their old names: callers name what they use, not where it lives.
pub use measure::{batch, load, measured, servers, summary, trial};
pub use rank::slo;
pub use search::{adaptive, grid, prune, range, space, stats};
