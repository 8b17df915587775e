//! The tuner: candidate configs from axes, GPU assignment, the workload, trials, ranking,
//! `sweep.json` and the report.

pub mod assign;
pub mod file;
pub mod load;
pub mod prune;
pub mod rank;
pub mod report;
pub mod run;
pub mod space;
pub mod stats;
pub mod trial;
