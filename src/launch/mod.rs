//! Launching a fleet: the pure plan, and up/down/status/logs execution over transports.

pub mod down;
pub mod hosts;
pub mod logs;
pub mod plan;
pub mod preflight;
pub mod report;
pub mod state;
pub mod status;
pub mod up;
