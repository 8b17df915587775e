//! Measuring candidates: their servers (planned on exactly their GPUs, started, stopped), the
//! workload they are measured under, one batch's trials, and what a trial measured.

pub mod batch;
pub mod load;
pub mod measured;
pub mod servers;
pub mod summary;
pub mod trial;
