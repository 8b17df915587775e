//! Detached generation jobs: a `fleet generate` started on a GPU host beside its servers, under
//! `setsid`, with a job directory (`<run root>/jobs/<id>/`: its record, pidfile, log, and what
//! it was given) on that host, so that it outlives the laptop; and what the laptop does with it
//! from anywhere: list, look, stop, fetch.

mod binary;
mod ops;
pub mod place;
pub mod transfer;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::generate::progress::Progress;
use crate::launch::backend::JobStop;
use crate::launch::state::StateError;
use crate::remote::RemoteError;

pub use binary::{BinaryChoice, choose, fleet_on};
pub use ops::{JOBS_DIR, JobSpec, find, job_dir, list, log_path, settle, start, stop};

/// What a job directory records about its job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRecord {
    pub id: String,
    /// The inventory host it runs on.
    pub host: String,
    /// Its output directory, a path on that host.
    pub out: String,
    /// The prompt file it reads, on that host.
    pub prompts: String,
    /// Its job directory on that host.
    pub dir: String,
    pub pid: u32,
    /// The process's start time (clock ticks since boot), so a reused pid is not mistaken for it.
    pub start_ticks: u64,
    pub started_unix: u64,
    /// The `fleet` it runs: the host's own, or the one uploaded into its job directory.
    pub binary: String,
    /// Its command line, secrets masked.
    pub argv: Vec<String>,
    /// How `fleet stop` reaches it.
    #[serde(default)]
    pub stop: JobStop,
}

/// A job as found on its host.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobView {
    pub record: JobRecord,
    /// `running`, `paused`, `done`, `failed`, `interrupted`, or `dead` (the process is gone
    /// without finishing), or `starting` (no progress written yet).
    pub state: String,
    pub alive: bool,
    pub progress: Option<Progress>,
    /// The log's last lines, for a dead job.
    pub log_tail: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error(transparent)]
    Remote(#[from] RemoteError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error("{}: {source}", path.display())]
    Local {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "no job {id} on the hosts that answered ({})\n  hint: `fleet jobs` lists the jobs of every host",
        if hosts.is_empty() { "none".to_string() } else { hosts.join(", ") }
    )]
    NotFound { id: String, hosts: Vec<String> },
    #[error(
        "{host}: fleet {ours} cannot run there: the host is {found}\n  hint: install fleet {ours} \
         on {host} (cargo install --path . on that machine, or copy a build for it onto its PATH)"
    )]
    Binary {
        host: String,
        found: String,
        ours: String,
    },
    #[error("{host}: the uploaded fleet does not run there: {detail}")]
    BinaryBroken { host: String, detail: String },
    #[error(
        "{host}: job {id} (pid {pid}) is running on {out}; one job per output directory\n  hint: \
         `fleet stop {id}`, or choose another --out"
    )]
    AlreadyRunning {
        host: String,
        id: String,
        pid: u32,
        out: String,
    },
    #[error("{host}: the job stopped at once:\n{log_tail}")]
    Died { host: String, log_tail: String },
    #[error("{host}: {path} differs from what was sent after two tries")]
    Corrupt { host: String, path: String },
    #[error("a transfer task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}
