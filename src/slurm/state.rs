//! Slurm's identifiers and states as typed values: job and step ids, job states, node states
//! (with their `+FLAG` suffixes), and what a pending reason means for a job that waits.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A job id, as `sbatch --parsable` prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JobId(pub u32);

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl FromStr for JobId {
    type Err = std::num::ParseIntError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.trim().parse().map(JobId)
    }
}

/// Which step of a job: one fleet started with `srun` (numbered), or one Slurm makes itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    Numbered(u32),
    /// The batch script's own step.
    Batch,
    /// The step that holds a node for `PrologFlags=Contain`.
    Extern,
    /// `salloc`'s shell with `LaunchParameters=use_interactive_step`.
    Interactive,
}

/// `JOB.STEP`, as `squeue --steps` prints it and `scancel` takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct StepId {
    pub job: JobId,
    pub step: Step,
}

impl fmt::Display for StepId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.step {
            Step::Numbered(n) => write!(f, "{}.{n}", self.job),
            Step::Batch => write!(f, "{}.batch", self.job),
            Step::Extern => write!(f, "{}.extern", self.job),
            Step::Interactive => write!(f, "{}.interactive", self.job),
        }
    }
}

impl FromStr for StepId {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        let (job, step) = s.trim().split_once('.').ok_or(())?;
        let job = job.parse().map_err(|_| ())?;
        let step = match step {
            "batch" => Step::Batch,
            "extern" => Step::Extern,
            "interactive" => Step::Interactive,
            n => Step::Numbered(n.parse().map_err(|_| ())?),
        };
        Ok(StepId { job, step })
    }
}

/// A job's state (squeue `%T`, scontrol `JobState=`). States this version does not know are
/// kept by name so that a newer Slurm is reported, not refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum JobState {
    Pending,
    Configuring,
    Running,
    Suspended,
    Completing,
    Completed,
    Cancelled,
    Failed,
    Timeout,
    NodeFail,
    Preempted,
    BootFail,
    Deadline,
    OutOfMemory,
    Requeued,
    RequeueHold,
    Resizing,
    Stopped,
    Signaling,
    StageOut,
    SpecialExit,
    Other(String),
}

const JOB_STATES: &[(&str, JobState)] = &[
    ("PENDING", JobState::Pending),
    ("CONFIGURING", JobState::Configuring),
    ("RUNNING", JobState::Running),
    ("SUSPENDED", JobState::Suspended),
    ("COMPLETING", JobState::Completing),
    ("COMPLETED", JobState::Completed),
    ("CANCELLED", JobState::Cancelled),
    ("FAILED", JobState::Failed),
    ("TIMEOUT", JobState::Timeout),
    ("NODE_FAIL", JobState::NodeFail),
    ("PREEMPTED", JobState::Preempted),
    ("BOOT_FAIL", JobState::BootFail),
    ("DEADLINE", JobState::Deadline),
    ("OUT_OF_MEMORY", JobState::OutOfMemory),
    ("REQUEUED", JobState::Requeued),
    ("REQUEUE_HOLD", JobState::RequeueHold),
    ("RESIZING", JobState::Resizing),
    ("STOPPED", JobState::Stopped),
    ("SIGNALING", JobState::Signaling),
    ("STAGE_OUT", JobState::StageOut),
    ("SPECIAL_EXIT", JobState::SpecialExit),
];

impl JobState {
    pub fn parse(text: &str) -> JobState {
        // scontrol may print `CANCELLED by 0`; the state is the first word.
        let word = text.split_whitespace().next().unwrap_or("");
        JOB_STATES
            .iter()
            .find(|(name, _)| *name == word)
            .map_or_else(|| JobState::Other(word.to_string()), |(_, s)| s.clone())
    }

    /// Steps can start (`srun --jobid` before this fails with "Job is pending execution").
    pub fn is_running(&self) -> bool {
        matches!(self, JobState::Running)
    }

    /// Not yet running, and may still run. A state this version does not know counts as
    /// waiting: a job that ended in one leaves squeue after `MinJobAge`, which a wait notices,
    /// whereas calling it over would give up on a job that is about to run.
    pub fn is_waiting(&self) -> bool {
        matches!(
            self,
            JobState::Pending
                | JobState::Configuring
                | JobState::Requeued
                | JobState::RequeueHold
                | JobState::Resizing
                | JobState::Other(_)
        )
    }

    /// The allocation is over or ending: its GPUs are gone.
    pub fn is_over(&self) -> bool {
        !self.is_running() && !self.is_waiting() && !matches!(self, JobState::Suspended)
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JobState::Other(s) => f.write_str(s),
            known => {
                let name = JOB_STATES
                    .iter()
                    .find(|(_, s)| s == known)
                    .map_or("?", |(n, _)| n);
                f.write_str(name)
            }
        }
    }
}

/// Why a pending job waits (squeue `%r`, scontrol `Reason=`). `None` means Slurm gave none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Reason(pub Option<String>);

impl Reason {
    pub fn parse(text: &str) -> Reason {
        let t = text.trim();
        Reason(match t {
            "" | "None" | "(null)" => None,
            _ => Some(t.to_string()),
        })
    }

    /// A reason that waiting cannot cure: the request exceeds a limit or names something
    /// that does not exist, so the job must change (Slurm's job_reason_codes: the QOS and
    /// association per-job and per-node maximums, `BadConstraints`, the `Partition*` limits,
    /// invalid accounts and QOS).
    pub fn needs_change(&self) -> bool {
        let Some(r) = &self.0 else {
            return false;
        };
        const FOR_GOOD: &[&str] = &[
            "BadConstraints",
            "PartitionConfig",
            "PartitionNodeLimit",
            "PartitionTimeLimit",
            "InvalidAccount",
            "InvalidQOS",
            "AccountNotAllowed",
            "QOSNotAllowed",
            "DependencyNeverSatisfied",
        ];
        // A per-user or per-account maximum clears as the user's other jobs end; a per-job
        // or per-node one never does.
        FOR_GOOD.contains(&r.as_str())
            || ((r.starts_with("QOSMax") || r.starts_with("AssocMax"))
                && (r.contains("PerJob") || r.contains("PerNode")))
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.as_deref().unwrap_or("None"))
    }
}

/// A node's state (scontrol `State=`): a base state and flags, e.g. `DOWN+NOT_RESPONDING`,
/// `IDLE+DRAIN`; sinfo's one-character suffixes (`down*`, `idle~`) are read as well.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeState {
    /// `IDLE`, `MIXED`, `ALLOCATED`, `DOWN`, `UNKNOWN`, `FUTURE`, ... in capitals.
    pub base: String,
    /// `DRAIN`, `NOT_RESPONDING`, `COMPLETING`, `POWERED_DOWN`, ... in capitals.
    pub flags: Vec<String>,
}

impl NodeState {
    pub fn parse(text: &str) -> NodeState {
        let upper = text.trim().to_ascii_uppercase();
        let mut words = upper.split('+');
        let mut base = words.next().unwrap_or("").to_string();
        let mut flags: Vec<String> = words.map(String::from).collect();
        let suffix = match base.chars().last() {
            Some('*') => Some("NOT_RESPONDING"),
            Some('~') => Some("POWERED_DOWN"),
            Some('#') => Some("POWERING_UP"),
            Some('%') => Some("POWERING_DOWN"),
            Some('$') => Some("MAINTENANCE"),
            Some('@') => Some("REBOOT_REQUESTED"),
            Some('!') => Some("POWER_DOWN"),
            _ => None,
        };
        if let Some(flag) = suffix {
            base.pop();
            flags.push(flag.to_string());
        }
        NodeState { base, flags }
    }

    pub fn has(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    /// Down, or failed: what runs there is lost and nothing new is placed there.
    pub fn is_down(&self) -> bool {
        matches!(self.base.as_str(), "DOWN" | "FAIL" | "FAILING") || self.has("FAIL")
    }

    /// Draining: what runs there may finish, but Slurm places nothing new there.
    pub fn is_draining(&self) -> bool {
        self.has("DRAIN") || matches!(self.base.as_str(), "DRAIN" | "DRAINING" | "DRAINED")
    }
}

impl fmt::Display for NodeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.base)?;
        for flag in &self.flags {
            write!(f, "+{flag}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_ids_round_trip() {
        for s in ["12.0", "12.17", "12.batch", "12.extern", "12.interactive"] {
            let id: StepId = s.parse().unwrap();
            assert_eq!(id.to_string(), s);
        }
        assert_eq!(
            "7.3".parse::<StepId>(),
            Ok(StepId {
                job: JobId(7),
                step: Step::Numbered(3)
            })
        );
        for bad in ["12", "x.0", "12.x", "12.-1", ""] {
            assert!(bad.parse::<StepId>().is_err(), "{bad}");
        }
    }

    #[test]
    fn job_states() {
        assert_eq!(JobState::parse("RUNNING"), JobState::Running);
        assert_eq!(JobState::parse("CANCELLED by 0"), JobState::Cancelled);
        assert_eq!(
            JobState::parse("LAUNCH_FAILED"),
            JobState::Other("LAUNCH_FAILED".into())
        );
        assert!(JobState::Pending.is_waiting() && !JobState::Pending.is_over());
        assert!(JobState::Running.is_running() && !JobState::Running.is_over());
        assert!(JobState::Completing.is_over());
        assert!(JobState::Timeout.is_over());
        assert!(!JobState::Suspended.is_over());
        assert!(JobState::parse("POWER_UP_NODE").is_waiting());
        assert_eq!(JobState::NodeFail.to_string(), "NODE_FAIL");
    }

    #[test]
    fn reasons_that_waiting_cannot_cure() {
        assert_eq!(Reason::parse("None"), Reason(None));
        assert!(!Reason::parse("Resources").needs_change());
        assert!(!Reason::parse("Priority").needs_change());
        assert!(!Reason::parse("QOSGrpGRES").needs_change());
        assert!(!Reason::parse("AssocGrpCpuLimit").needs_change());
        assert!(!Reason::parse("QOSMaxGRESPerUser").needs_change());
        assert!(Reason::parse("PartitionTimeLimit").needs_change());
        assert!(Reason::parse("QOSMaxGRESPerJob").needs_change());
        assert!(Reason::parse("AssocMaxNodesPerJob").needs_change());
        assert!(Reason::parse("BadConstraints").needs_change());
    }

    #[test]
    fn node_states_with_flags_and_suffixes() {
        let down = NodeState::parse("DOWN+NOT_RESPONDING");
        assert!(down.is_down() && down.has("NOT_RESPONDING"));
        assert_eq!(down.to_string(), "DOWN+NOT_RESPONDING");
        assert_eq!(NodeState::parse("down*"), down);
        let drain = NodeState::parse("IDLE+DRAIN");
        assert!(drain.is_draining() && !drain.is_down());
        assert!(!NodeState::parse("MIXED").is_down());
        assert!(NodeState::parse("ALLOCATED*").has("NOT_RESPONDING"));
    }
}
