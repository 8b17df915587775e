//! The tuner: a sweep is a search. The search seam (`search`) with its first strategy, the grid
//! with successive halving (`grid`); planning (`plan`); candidate configs from axes, GPU
//! assignment, the schedule, the workload, trials, ranking, `sweep.json` and the report.

pub mod adaptive;
pub mod assign;
pub mod batch;
pub mod event;
pub mod file;
pub mod grid;
pub mod load;
pub mod measured;
pub mod plan;
pub mod profiles;
pub mod prune;
pub mod range;
pub mod rank;
pub mod report;
pub mod run;
pub mod schedule;
pub mod search;
pub mod servers;
pub mod slo;
pub mod space;
pub mod stats;
pub mod summary;
pub mod trial;
