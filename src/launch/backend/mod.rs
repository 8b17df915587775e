//! The seam below launch: a [`Backend`] starts, finds, watches and stops the servers of one
//! inventory host, whatever runs them there. Up, down, status, logs, generate and sweep reach
//! a host's servers only through it.
//!
//! Two kinds exist: [`machine::Machine`], servers as process groups on a POSIX host (this
//! machine, one over SSH, a Proxmox container), and [`slurm::SlurmBackend`], servers as job
//! steps of a Slurm allocation. A kind is one more [`HostSpec`] variant, one more
//! implementation of the trait, and one more arm in [`connect`].

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::config::HostSpec;
use crate::gpu::{GpuError, GpuProcess, GpuReading};
use crate::launch::owner::Owner;
use crate::launch::plan::{HostFacts, Instance};
use crate::launch::preflight::{FactsError, Learn};
use crate::launch::state::{InstanceRecord, Liveness, StateError};
use crate::remote::{ConnectOptions, Link, RemoteError, Transport, Tunnel};

#[cfg(test)]
pub(crate) mod fake;
pub mod machine;
pub mod slurm;

/// When one host's servers end, as read at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ending {
    pub host: String,
    /// What ends, as the user knows it: `job 12 (fleet-hpc)`.
    pub what: String,
    /// The time left when it was read.
    pub left: Duration,
    /// How long before the end work on the host's servers stops (the Slurm host's
    /// `stop_before_end`).
    pub stop_before: Duration,
}

/// The servers of one inventory host, as one kind of place runs them.
///
/// Every method that looks at the host goes through [`Backend::shell`] or what the backend
/// keeps beside it; none prints. Errors name the host.
#[async_trait]
pub trait Backend: Send + Sync + fmt::Debug {
    /// Where fleet keeps this host's state.
    fn home(&self) -> &Home;

    /// The inventory host's name.
    fn host(&self) -> &str {
        &self.home().host
    }

    /// The shell where fleet keeps this host's state and runs its commands.
    fn shell(&self) -> &Arc<dyn Transport> {
        &self.home().shell
    }

    /// The run directory root on [`Backend::shell`].
    fn run_root(&self) -> &str {
        &self.home().run_root
    }

    /// What planning needs to know of the host, read as the profile's servers would run
    /// (`launcher` and its `env`): its `--help` when `preflight`, the SGLang version, where its
    /// servers are reached, and its GPUs when the inventory says `all`.
    async fn facts(&self, learn: &Learn<'_>) -> Result<HostFacts, FactsError>;

    /// The same host with its commands run through `shell` (a [`Gate`](crate::launch::gate)
    /// on the run directory lock), where the backend looks at the host through its shell
    /// alone; `None` where it reads more than that, and its look waits for the lock instead.
    fn through(&self, _shell: Arc<dyn Transport>) -> Option<Arc<dyn Backend>> {
        None
    }

    /// Every server recorded on the host, in GPU then port order, and what became of each.
    async fn survey(&self) -> Result<Vec<Seen>, StateError>;

    /// The ports something listens on where this host's servers bind: a planned port in use
    /// with no record of fleet's is someone else's.
    async fn ports_in_use(&self) -> Result<BTreeSet<u16>, StateError>;

    /// Starts a planned server and records it as `owner`'s. The record, with the backend's
    /// [`Handle`](crate::launch::state::Handle) in it, is how the server is found, watched and
    /// stopped from then on; nothing is left running when this fails.
    async fn start(&self, planned: &Instance, owner: &Owner) -> Result<InstanceRecord, StateError>;

    /// The processes using each GPU's memory (nvidia-smi's compute apps), to tell a GPU that
    /// something fleet did not start holds; none where the backend's scheduler gives GPUs out.
    async fn gpu_processes(&self) -> Result<Vec<GpuProcess>, GpuError> {
        Ok(Vec::new())
    }

    /// Whether a started server still runs (followed while it loads).
    async fn alive(&self, record: &InstanceRecord) -> Result<bool, StateError>;

    /// Stops a recorded server (asking first, forcing after `grace`), waits until its port is
    /// closed, and forgets it: its record becomes the stopped record kept beside its log. An
    /// error means it may still run, and its record stays.
    async fn stop(&self, record: &InstanceRecord, grace: Duration) -> Result<Stopped, StateError>;

    /// The last `lines` lines of the server log at `log` (a planned server's
    /// [`RunFiles::log`](crate::launch::plan::RunFiles), as its record keeps it), with the
    /// secrets SGLang logs masked; empty when there is no log.
    async fn log_tail(&self, log: &str, lines: usize) -> Result<String, StateError>;

    /// A local address that reaches a server of this host serving at `address:port` (as the
    /// plan and the record say): a port forwarded to it, held until closed.
    async fn endpoint(&self, address: &str, port: u16) -> Result<Tunnel, RemoteError>;

    /// The host's GPUs with the memory in use on each.
    async fn gpus(&self) -> Result<Vec<GpuReading>, GpuError>;

    /// Gives back what holds the host's servers once none is left (a Slurm allocation fleet
    /// made), saying what it gave back; a machine holds nothing.
    async fn release(&self) -> Result<Option<String>, StateError> {
        Ok(None)
    }

    /// When what holds the host's servers ends (a Slurm allocation's time limit), with how
    /// long before it work on them should stop; `None` when nothing ends them.
    async fn time_left(&self) -> Result<Option<Ending>, StateError> {
        Ok(None)
    }

    /// How a detached job (`argv`, a `fleet generate` whose id is `id`) runs beside this host's
    /// servers, started from [`Backend::shell`]: on a machine, as it is.
    async fn job_command(&self, _id: &str, argv: Vec<String>) -> Result<JobCommand, StateError> {
        Ok(JobCommand {
            argv,
            stop: JobStop::Process,
        })
    }

    /// The state of the connection to the host, which generate watches to move work off a
    /// lost host.
    fn link(&self) -> watch::Receiver<Link> {
        self.shell().link()
    }
}

/// The command line that runs a detached job, and how `fleet stop` asks it to wind down.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobCommand {
    pub argv: Vec<String>,
    pub stop: JobStop,
}

/// How `fleet stop` sends a detached job Ctrl-C's SIGINT, on which it finishes its requests in
/// flight, writes everything and ends `interrupted`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "via", rename_all = "snake_case")]
pub enum JobStop {
    /// To its process (what records from before this field mean).
    #[default]
    Process,
    /// To the task of the allocation's step named `name` (`scancel --signal=INT J.S`). Not to
    /// srun: srun answers one SIGINT with a status line, and on SIGTERM cancels the step,
    /// which gives the job only Slurm's KillWait before SIGKILL (seen on the test cluster).
    Step {
        job: crate::slurm::JobId,
        name: String,
    },
}

impl JobStop {
    /// Sends the job Ctrl-C's SIGINT through `shell` (the host's [`Backend::shell`]), where
    /// `pid` is its process; a job, or a step, already gone needs nothing.
    pub async fn interrupt(&self, shell: &Arc<dyn Transport>, pid: u32) -> Result<(), StateError> {
        match self {
            // setsid made the job its own group's leader: the group is what Ctrl-C reaches.
            JobStop::Process => machine::proc::signal_group(shell.as_ref(), pid, "INT").await,
            JobStop::Step { job, name } => slurm::interrupt_step(shell, *job, name).await,
        }
    }
}

/// Where fleet keeps a host's state, whatever its kind: the shell (the machine itself, or a
/// cluster's login node) that holds its run directory (records, logs, the `up` lock, detached
/// jobs) and runs its commands (`fleet exec`).
#[derive(Debug, Clone)]
pub struct Home {
    /// The inventory host's name.
    pub host: String,
    pub shell: Arc<dyn Transport>,
    /// The run directory root on `shell`.
    pub run_root: String,
}

/// A recorded server and what became of it: the observed stage a survey gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub record: InstanceRecord,
    pub liveness: Liveness,
    /// Its leader is gone but what it started still runs (SGLang tearing itself down, workers
    /// holding the GPU): it is still fleet's to stop, and not free to start on.
    pub lingering: bool,
}

impl Seen {
    /// Whether the server (or what is left of it) still holds its GPU and port.
    pub fn holds_gpu(&self) -> bool {
        match self.liveness {
            Liveness::Running => true,
            Liveness::Dead => self.lingering,
            Liveness::Reused => false,
        }
    }
}

/// How a stop went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopState {
    /// Exited when asked.
    Stopped,
    /// Had to be forced after the grace period.
    Killed,
    /// Was gone before fleet looked.
    AlreadyDead,
    /// Its handle names another process now; nothing was signalled.
    PidReused,
    /// Still there after being forced, or the host could not be asked.
    Failed,
    /// Not `down`'s to stop (another fleet's, or outside what it was asked to stop): never
    /// signalled, listed so the user sees what still runs.
    LeftRunning,
}

impl StopState {
    pub fn as_str(self) -> &'static str {
        match self {
            StopState::Stopped => "stopped",
            StopState::Killed => "killed",
            StopState::AlreadyDead => "already dead",
            StopState::PidReused => "pid reused",
            StopState::Failed => "failed",
            StopState::LeftRunning => "left running",
        }
    }
}

/// What [`Backend::stop`] did: how the server went, and whether its port is free again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stopped {
    pub state: StopState,
    pub port_closed: bool,
}

/// The backend for an inventory host, connected: the one place that knows the kinds of host.
pub async fn connect(
    host: &HostSpec,
    opts: &ConnectOptions,
    run_root: &str,
) -> Result<Arc<dyn Backend>, RemoteError> {
    match host {
        HostSpec::Machine(m) => {
            let home = Home {
                host: m.name.clone(),
                shell: crate::remote::connect(m, opts).await?,
                run_root: run_root.to_string(),
            };
            Ok(Arc::new(machine::Machine::new(m.clone(), home)))
        }
        HostSpec::Slurm(s) => {
            let home = Home {
                host: s.login.name.clone(),
                shell: crate::remote::connect(&s.login, opts).await?,
                run_root: run_root.to_string(),
            };
            Ok(Arc::new(slurm::SlurmBackend::new(s.clone(), home)))
        }
    }
}
