//! The tuner: candidate configs from axes, GPU assignment, the schedule of rounds, the
//! workload, trials, successive halving, ranking, `sweep.json` and the report.

pub mod assign;
pub mod batch;
pub mod file;
pub mod load;
pub mod prune;
pub mod rank;
pub mod report;
pub mod run;
pub mod schedule;
pub mod servers;
pub mod space;
pub mod stats;
pub mod summary;
pub mod trial;
