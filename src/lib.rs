//! fleet: launch, tune and drive fleets of SGLang inference servers on GPU hosts.
//!
//! Data flows one way: arguments → validated [`config`] → pure plan → async execution through
//! [`remote`] transports and HTTP → typed results → [`report`] (tables, JSON, progress).
//! [`sim`] is the `sglang-sim` stand-in server, a separate program that shares only the crate.

pub mod backoff;
pub mod cli;
pub mod commands;
pub mod config;
pub mod demo;
pub mod generate;
pub mod gpu;
pub mod jobs;
pub mod launch;
pub mod remote;
pub mod report;
pub mod sglang;
pub mod sim;
pub mod sweep;
