//! Launching a fleet: the pure plan, and up/down/status/logs execution over transports.

use std::time::Duration;

use crate::sglang::client::HttpOptions;

pub mod down;
pub mod env;
pub mod hosts;
pub mod lock;
pub mod logs;
pub mod plan;
pub mod preflight;
pub mod report;
pub mod state;
pub mod status;
pub mod up;

/// HTTP to a server being looked at (health, `/server_info`, `/metrics`): it answers fast or
/// not at all.
pub const PROBE_HTTP: HttpOptions = HttpOptions {
    connect_timeout: Duration::from_secs(2),
    request_timeout: Duration::from_secs(10),
};
