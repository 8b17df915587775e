//! Why the run changes course, typed: an instance taken out, a host lost, the run stopping,
//! a server that is not back. Their text is only for the messages that show them.

use std::sync::Arc;

use super::End;
use crate::generate::watchdog::Finding;
use crate::remote::{LinkLoss, RemoteError};
use crate::sglang::client::ClientError;

/// Why an instance was taken out of service.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DownReason {
    /// Its liveness probes failed this many times in a row.
    #[error("{failures} failed health checks; last: {last}")]
    HealthChecks {
        failures: u32,
        last: Arc<ClientError>,
    },
    /// A request found nothing listening there any more.
    #[error("{0}")]
    Refused(Arc<ClientError>),
    /// The connection to its host dropped.
    #[error("host {host} lost: {loss}")]
    HostLost { host: String, loss: HostLoss },
}

/// Why a host's connection is gone.
#[derive(Debug, Clone, thiserror::Error)]
pub enum HostLoss {
    /// An established connection ended; the transport is reconnecting.
    #[error("{0}")]
    Dropped(LinkLoss),
    /// Reconnecting was refused in a way retrying cannot fix (a changed host key, refused
    /// authentication).
    #[error("{0}")]
    Refused(Arc<RemoteError>),
}

/// Why a run winds down before its input is done.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StopReason {
    /// Ctrl-C, SIGTERM or SIGHUP.
    #[error("interrupted")]
    Interrupted,
    /// `--abort-below` and the watchdog's finding.
    #[error("throughput below --abort-below")]
    BelowExpected(Finding),
    /// Nothing was healthy for the stall timeout.
    #[error("no instance came back within --stall-timeout")]
    Stalled,
}

impl From<StopReason> for End {
    fn from(r: StopReason) -> End {
        match r {
            StopReason::Interrupted => End::Interrupted,
            StopReason::BelowExpected(f) => End::BelowExpected(f),
            StopReason::Stalled => End::Stalled,
        }
    }
}

/// Why an instance that is out is not back yet.
#[derive(Debug, thiserror::Error)]
pub enum ReviveError {
    /// Up, but not ready (SGLang answers 503 while it loads).
    #[error("/health answered {status}")]
    NotReady { status: u16 },
    #[error(transparent)]
    Client(#[from] ClientError),
}
