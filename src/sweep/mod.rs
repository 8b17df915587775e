//! The tuner: candidate configs from axes, GPU assignment, trials, ranking and the winner.

pub mod assign;
pub mod rank;
pub mod space;
