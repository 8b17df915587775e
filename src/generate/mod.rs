//! The batch generation job: input reader, the decision core and its async shell, journal and
//! resume, progress, watchdog, upload.
//!
//! [`run`] is a library function: it gets its endpoints from the caller (given URLs, or the
//! instances `fleet up` started), never prints, and reports through [`Event`]s. Its decisions
//! are [`core`]'s, a pure state machine; [`drive`] is the loop that runs it, which the sweep's
//! trials share.

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use crate::backoff::Backoff;
use crate::config::Expected;
use crate::server::ServerId;
use crate::sglang::client::{Api, ClientError, HttpOptions};

pub mod concurrency;
pub mod core;
pub mod drive;
mod files;
pub mod identity;
pub mod input;
pub mod journal;
pub mod lock;
mod prepare;
pub mod progress;
mod shell;
pub mod timeline;
pub mod upload;
pub mod watchdog;

pub use self::core::{DownReason, End, HostLoss, StopReason};
pub use crate::sglang::client::Endpoint;
pub use concurrency::ConcurrencyMode;
pub use input::RetryFailed;
pub use shell::run;

/// The servers a run sends to (each endpoint's id names its host), the links to watch of the
/// hosts behind a connection that can drop, and the port forwards the endpoints ride on, held
/// for the run and closed when it ends.
#[derive(Debug, Default)]
pub struct Targets {
    pub endpoints: Vec<Endpoint>,
    pub links: Vec<(String, tokio::sync::watch::Receiver<crate::remote::Link>)>,
    pub tunnels: Vec<crate::remote::Tunnel>,
}

impl From<Vec<Endpoint>> for Targets {
    fn from(endpoints: Vec<Endpoint>) -> Self {
        Targets {
            endpoints,
            ..Targets::default()
        }
    }
}

/// Everything a run needs besides its endpoints.
#[derive(Debug, Clone)]
pub struct GenerateConfig {
    pub prompts: PathBuf,
    pub out: PathBuf,
    /// `None`: chat for `messages`, generate for `prompt`, or what a Batch API line names.
    pub api: Option<Api>,
    pub max_tokens: u32,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub limit: Option<u64>,
    pub concurrency: ConcurrencyMode,
    pub max_retries: u32,
    pub stall_timeout: Duration,
    pub resume: bool,
    /// `--allow-changed-input`: resume even though the input is not the one the job began
    /// with, keyed strictly by id.
    pub allow_changed_input: bool,
    /// `--retry-failed`: send failed prompts again.
    pub retry_failed: RetryFailed,
    pub warmup: Duration,
    pub abort_below: Option<f64>,
    pub grace: Duration,
    /// The profile's sweep numbers, for the watchdog.
    pub expected: Option<Expected>,
    pub http: HttpOptions,
    pub sync: journal::SyncPolicy,
    pub timing: Timing,
    /// The requests the open-file limit leaves room for (`None`: not bounded).
    pub files: Option<concurrency::FileBudget>,
    /// Where finished shards are uploaded (`--upload`).
    pub upload: Option<upload::Destination>,
    pub upload_retry: upload::RetryPolicy,
    /// `--output-format`; `None`: the Batch API's when every input line is a Batch API line,
    /// fleet's otherwise, and on `--resume` what the job began with.
    pub output_format: Option<journal::OutputFormat>,
    /// `--placement`.
    pub placement: PlacementMode,
}

/// `--placement`: which policy places the requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PlacementMode {
    /// Prefix placement when the input scan finds shared prefixes worth it.
    #[default]
    Auto,
    Prefix,
    LeastLoaded,
}

/// A `--placement` that names no placement.
#[derive(Debug, thiserror::Error)]
#[error("--placement {0:?}: expected auto, prefix or least-loaded")]
pub struct UnknownPlacement(String);

impl std::str::FromStr for PlacementMode {
    type Err = UnknownPlacement;
    fn from_str(s: &str) -> Result<Self, UnknownPlacement> {
        match s {
            "auto" => Ok(PlacementMode::Auto),
            "prefix" => Ok(PlacementMode::Prefix),
            "least-loaded" => Ok(PlacementMode::LeastLoaded),
            other => Err(UnknownPlacement(other.to_string())),
        }
    }
}

/// The placement a run uses, and what the input scan found that decided it.
#[derive(Debug, Clone, PartialEq)]
pub struct PlacementChoice {
    /// True for prefix placement, false for least-loaded.
    pub prefix: bool,
    pub mode: PlacementMode,
    pub groups: u64,
    pub grouped_prompts: u64,
    pub prompts: u64,
    pub expected_cached_fraction: f64,
}

impl GenerateConfig {
    pub fn new(prompts: PathBuf, out: PathBuf) -> Self {
        GenerateConfig {
            prompts,
            out,
            api: None,
            max_tokens: 4096,
            temperature: None,
            top_p: None,
            limit: None,
            concurrency: ConcurrencyMode::Auto,
            max_retries: 3,
            stall_timeout: Duration::from_secs(600),
            resume: false,
            allow_changed_input: false,
            retry_failed: RetryFailed::No,
            warmup: Duration::from_secs(60),
            abort_below: None,
            grace: Duration::from_secs(30),
            expected: None,
            http: HttpOptions::default(),
            sync: journal::SyncPolicy::default(),
            timing: Timing::default(),
            files: None,
            upload: None,
            upload_retry: upload::RetryPolicy::default(),
            output_format: None,
            placement: PlacementMode::Auto,
        }
    }
}

/// Cadences of the run's background work.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub progress_every: Duration,
    /// `/metrics` polling for adaptive concurrency and the watchdog.
    pub metrics_every: Duration,
    /// Liveness (`/server_info`) of instances in use whose `/metrics` is off; metrics readings
    /// and the revival of instances that are out go at `metrics_every`.
    pub health_every: Duration,
    /// Sliding window for rates and the ETA.
    pub rate_window: Duration,
    /// Before retry n of a request that failed retryably.
    pub backoff: Backoff,
    /// Consecutive failed health checks that take an instance out.
    pub health_failures_to_down: u32,
}

impl Timing {
    /// The cadences `k` times shorter: for a sim run `k` times faster than real time, so that
    /// its first minute is watched as a user watches a real one (`FLEET_TIME_SCALE`).
    pub fn scaled(self, k: f64) -> Timing {
        let s = |d: Duration| d.div_f64(k);
        Timing {
            progress_every: s(self.progress_every),
            metrics_every: s(self.metrics_every),
            health_every: s(self.health_every),
            rate_window: s(self.rate_window),
            ..self
        }
    }
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            progress_every: Duration::from_secs(2),
            metrics_every: Duration::from_secs(1),
            health_every: Duration::from_secs(5),
            rate_window: Duration::from_secs(60),
            backoff: Backoff::new(Duration::from_millis(500), Duration::from_secs(30)),
            health_failures_to_down: 3,
        }
    }
}

/// An instance as the run found it at start.
#[derive(Debug, Clone, Serialize)]
pub struct InstanceInfo {
    pub name: ServerId,
    pub url: String,
    pub version: Option<String>,
    pub server_cap: Option<u64>,
    pub kv_tokens: Option<u64>,
    pub context_length: Option<u64>,
    pub concurrency: u32,
    /// Why it is not used (it stays probed and joins when healthy).
    pub unavailable: Option<String>,
}

/// What happens during a run, for the caller to render.
#[derive(Debug, Clone)]
pub enum Event {
    /// Before [`Event::Started`]: which placement the run uses and why.
    Placement(PlacementChoice),
    Started {
        total: u64,
        already_done: u64,
        truncated_bytes: u64,
        instances: Vec<InstanceInfo>,
    },
    MalformedLine {
        line: u64,
        error: input::LineError,
    },
    /// Lines appended to the input after the job began are left out of it.
    InputGrew {
        bytes: u64,
    },
    InstanceDown {
        name: ServerId,
        reason: DownReason,
    },
    InstanceUp {
        name: ServerId,
        server_cap: Option<u64>,
    },
    /// No instance is healthy: dispatching waits up to the stall timeout, probing meanwhile.
    Paused {
        stall_timeout: Duration,
        /// The last instance that went out, and why.
        instance: ServerId,
        reason: DownReason,
    },
    /// A host's connection dropped: its instances are out until it is back.
    HostLost {
        host: String,
        reason: HostLoss,
    },
    HostBack {
        host: String,
    },
    Resumed,
    Progress(progress::Progress),
    Watchdog(watchdog::Finding),
    Upload(upload::UploadEvent),
    Stopping {
        reason: StopReason,
        in_flight: u64,
    },
    /// The open-file limit holds the in-flight limit below what the concurrency mode wants.
    FileBudget {
        open_files_limit: u64,
        /// Over all servers.
        max_in_flight: u32,
        /// Per server: what the mode wants, and what it gets.
        wanted: u32,
        per_server: u32,
    },
    /// fleet ran out of open files opening a connection: the request waits and goes again.
    OutOfFiles {
        error: String,
    },
}

#[derive(Debug, Clone)]
pub struct Summary {
    pub ended: End,
    pub progress: progress::Progress,
    /// With `--upload`: the shards that are not in the destination, with why.
    pub not_uploaded: upload::NotUploaded,
}

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error(transparent)]
    Input(#[from] input::InputError),
    #[error(transparent)]
    Journal(#[from] journal::JournalError),
    #[error(transparent)]
    Progress(#[from] progress::ProgressError),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(transparent)]
    Upload(#[from] upload::UploadError),
    #[error(transparent)]
    Lock(#[from] lock::LockError),
    #[error(transparent)]
    Identity(#[from] identity::IdentityError),
    #[error(
        "--resume: {} holds a job over another input: {}\n  hint: start a new job with another --out, \
         or continue this one keyed strictly by id with --resume --allow-changed-input",
        dir.display(),
        changes.join("; ")
    )]
    InputChanged { dir: PathBuf, changes: Vec<String> },
    #[error(
        "--output-format {asked}: {} holds a job that writes {job}\n  hint: resume it without \
         --output-format (or with --output-format {job}), or start a new job with another --out",
        dir.display(),
        asked = asked.as_str(),
        job = job.as_str()
    )]
    FormatChanged {
        dir: PathBuf,
        asked: journal::OutputFormat,
        job: journal::OutputFormat,
    },
    #[error("--out {}: not a directory", dir.display())]
    OutNotADirectory { dir: PathBuf },
    #[error("--out {}: cannot create it: {source}", dir.display())]
    OutUnusable {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no endpoints to send requests to")]
    NoEndpoints,
    #[error("no instance answered /server_info:\n{0}")]
    NoInstances(String),
    #[error("a run task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}
