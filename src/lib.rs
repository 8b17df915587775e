//! fleet: launch, tune and drive fleets of SGLang inference servers on GPU hosts.
//!
//! Data flows one way: arguments → validated [`config`] → pure plan → async execution through
//! [`remote`] transports and HTTP → typed results → [`report`] (tables, JSON, progress).

pub mod cli;
pub mod commands;
pub mod config;
pub mod generate;
pub mod gpu;
pub mod launch;
pub mod remote;
pub mod report;
pub mod sglang;
pub mod sweep;
