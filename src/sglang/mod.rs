//! Talking to SGLang: flag rendering by version, `--help` preflight, and the HTTP client
//! (health, server_info, metrics, generation).

pub mod client;
pub mod flags;
pub mod help;
pub mod metrics;
pub mod overflow;
pub mod response;
pub mod stream;
mod wire;
