//! fleet: launch, tune and drive fleets of SGLang inference servers on GPU hosts.
//!
//! Data flows one way: arguments → validated [`config`] → pure plan → async execution through
//! [`remote`] transports and HTTP → typed results → [`report`] (tables, JSON, progress).
//! [`sim`] is the `sglang-sim` stand-in server, a separate program that shares only the crate.
//!
//! Nothing in the library prints: commands write through [`commands::output`], the one writer
//! that knows a closed pipe, and the sim (a program of its own) prints as SGLang does.
#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod backoff;
pub mod cli;
pub mod commands;
pub mod config;
pub mod demo;
pub mod eta;
pub mod generate;
pub mod gpu;
pub mod jobs;
pub mod launch;
pub mod layout;
pub mod remote;
pub mod render;
pub mod report;
pub mod router;
pub mod server;
pub mod sglang;
#[allow(clippy::print_stdout, clippy::print_stderr)]
pub mod sim;
pub mod slurm;
pub mod sweep;
