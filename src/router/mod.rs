//! The gateway in front of the fleet: SGLang's Shepherd Model Gateway (`smg`), started by
//! `fleet up` on one inventory host with every ready server as a worker, shown by `fleet status`,
//! stopped first by `fleet down`, and kept true at run time (a lost server removed, a new one
//! added) through the gateway's own worker API.
//!
//! [`plan`] and [`sync`] are pure; [`gateway`] is the HTTP client of the gateway's worker API;
//! [`run`] starts, finds and stops it through the host's transport, like a server.

pub mod gateway;
pub mod life;
pub mod plan;
pub mod report;
pub mod run;
pub mod sync;

use crate::launch::state::StateError;
use crate::remote::RemoteError;

/// Why the gateway could not be planned, started, reached or kept in step.
#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    #[error("router.host: no host `{host}` in the inventory (hosts: {have})")]
    UnknownHost { host: String, have: String },
    #[error(
        "router.host: {host} could not be reached or prepared, so the gateway cannot start there"
    )]
    HostDown { host: String },
    #[error(
        "router.host: {host} is a Slurm cluster; the gateway runs on a machine or a container \
         (name one with router.host)"
    )]
    Slurm { host: String },
    #[error("{host}: the gateway's launcher {launcher:?}: {problems}")]
    Flags {
        host: String,
        launcher: Vec<String>,
        problems: String,
    },
    #[error("{host}: `{launcher} --help` failed: {stderr}")]
    Help {
        host: String,
        launcher: String,
        stderr: String,
    },
    #[error(transparent)]
    Remote(#[from] RemoteError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error("the gateway at {url}: {message}")]
    Http { url: String, message: String },
    #[error("{host}: the gateway did not come up within {secs}s ({why}); its log:\n{tail}")]
    NotReady {
        host: String,
        secs: u64,
        why: String,
        tail: String,
    },
}
