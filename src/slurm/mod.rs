//! Slurm as fleet drives it: one allocation that holds the GPUs (`sbatch`), one server per
//! job step inside it (`srun --jobid J --exact ...`), and the queries and cancels around them
//! (`squeue`, `scontrol`, `scancel`). [`argv`] builds the commands and [`parse`] reads their
//! output, both pure; [`Slurm`] runs them through a [`crate::remote::Transport`], so they run
//! on this machine or on a login node over SSH alike. [`spec`] is the inventory's `slurm:`
//! block.

pub mod argv;
pub mod parse;
mod run;
pub mod spec;
pub mod state;
pub mod time;

pub use argv::{AllocationRequest, HOLD_SCRIPT, Shape, StepRequest, srun_beside};
pub use parse::{BadLine, JobRecord, JobStatus, NodeInfo, Problem, StepStatus};
pub use run::{Slurm, Waiting, judge};
pub use spec::{NewAllocation, SlurmSpec, SpecProblem};
pub use state::{JobId, JobState, NodeState, Reason, Step, StepId};
pub use time::{SlurmTime, TimeError, parse_limit, parse_time};

use crate::remote::RemoteError;

/// What went wrong running a Slurm command, naming the host that ran it and the command.
#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    #[error(transparent)]
    Remote(#[from] RemoteError),

    #[error("{host}: `{command}` failed ({}): {stderr}{}", exit(.status), hint_line(.hint))]
    Failed {
        host: String,
        command: String,
        status: Option<i32>,
        stderr: String,
        hint: Option<&'static str>,
    },

    #[error("{host}: cannot read what `{command}` printed: {source}")]
    Output {
        host: String,
        command: String,
        source: BadLine,
    },

    #[error("{host}: Slurm no longer knows job {job}: it ended, and its record was purged")]
    UnknownJob { host: String, job: JobId },

    #[error("{host}: job {job} ended ({state}, reason {reason}) before it ran")]
    Ended {
        host: String,
        job: JobId,
        state: JobState,
        reason: Reason,
    },

    #[error(
        "{host}: job {job} cannot start as asked: Slurm holds it for {reason}\n  hint: the \
         request exceeds a limit of the partition, account or QOS, or names one that does not \
         exist; cancel it (`scancel {job}`) and change the Slurm host's partition, gpus, time \
         or sbatch_args in fleet.yaml"
    )]
    Blocked {
        host: String,
        job: JobId,
        reason: Reason,
    },

    #[error("{host}: interrupted while waiting for job {job} to run")]
    Interrupted { host: String, job: JobId },
}

fn exit(status: &Option<i32>) -> String {
    match status {
        Some(code) => format!("exit {code}"),
        None => "killed by a signal".to_string(),
    }
}

fn hint_line(hint: &Option<&'static str>) -> String {
    hint.map(|h| format!("\n  hint: {h}")).unwrap_or_default()
}
