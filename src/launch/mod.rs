//! Launching a fleet: the [`fleet::Fleet`] every command starts from, the pure plan, and
//! up/down/status/logs execution through each host's [`backend::Backend`], over the servers of
//! the one [`registry::Registry`].

use std::time::Duration;

use crate::sglang::client::HttpOptions;

pub mod backend;
pub mod claim;
pub mod deadline;
pub mod down;
pub mod env;
pub mod fleet;
pub mod gate;
pub mod help_cache;
pub mod lock;
pub mod logs;
pub mod model_facts;
pub mod owner;
pub mod plan;
pub mod preflight;
pub mod registry;
pub mod report;
pub mod state;
pub mod status;
pub mod up;

#[cfg(test)]
mod tests;

pub use fleet::Fleet;

/// HTTP to a server being looked at (health, `/server_info`, `/metrics`): it answers fast or
/// not at all.
pub const PROBE_HTTP: HttpOptions = HttpOptions {
    connect_timeout: Duration::from_secs(2),
    request_timeout: Duration::from_secs(10),
};
