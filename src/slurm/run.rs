//! [`Slurm`]: Slurm's commands run through a [`Transport`] (this machine, or a login node over
//! SSH), their failures typed with the host and the command, their output parsed; and the
//! wait for an allocation to run, decided by the pure [`judge`].

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::SlurmError;
use super::argv::{self, AllocationRequest, HOLD_SCRIPT, StepRequest};
use super::parse::{self, BadLine, JobRecord, JobStatus, NodeInfo, StepStatus};
use super::state::{JobId, StepId};
use crate::backoff::Backoff;
use crate::remote::{Detached, Transport, mask, quote_argv};

/// What squeue and scontrol say of a job id they do not know (any more).
const GONE: &str = "Invalid job id specified";

/// Slurm's client commands on one host, with the environment they need there (`SLURM_CONF`
/// for a cluster whose configuration is not in `/etc/slurm`).
#[derive(Debug, Clone)]
pub struct Slurm {
    transport: Arc<dyn Transport>,
    env: BTreeMap<String, String>,
}

impl Slurm {
    pub fn new(transport: Arc<dyn Transport>) -> Self {
        Slurm {
            transport,
            env: BTreeMap::new(),
        }
    }

    /// Sets `name=value` for every command (through `env`, one argv word each) and for every
    /// step, which inherits srun's environment.
    pub fn with_env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(name.into(), value.into());
        self
    }

    pub fn host(&self) -> &str {
        self.transport.host()
    }

    pub fn transport(&self) -> &Arc<dyn Transport> {
        &self.transport
    }

    /// Submits the allocation with [`HOLD_SCRIPT`] as its batch script.
    pub async fn submit(&self, req: &AllocationRequest) -> Result<JobId, SlurmError> {
        let argv = argv::sbatch(req);
        let out = self.output(&argv, HOLD_SCRIPT.as_bytes()).await?;
        parse::submitted(&out).map_err(|e| self.unreadable(&argv, e))
    }

    /// The job as squeue sees it; `None` once Slurm has purged its record (`MinJobAge` after
    /// it ended).
    pub async fn job(&self, job: JobId) -> Result<Option<JobStatus>, SlurmError> {
        let argv = argv::squeue_job(job);
        let out = match self.output(&argv, &[]).await {
            Err(SlurmError::Failed { stderr, .. }) if stderr.contains(GONE) => {
                return Ok(None);
            }
            other => other?,
        };
        let jobs = parse::jobs(&out).map_err(|e| self.unreadable(&argv, e))?;
        Ok(jobs.into_iter().find(|j| j.id == job))
    }

    /// The caller's jobs named `name` that are not over: how fleet finds its allocations.
    pub async fn jobs_named(&self, name: &str) -> Result<Vec<JobStatus>, SlurmError> {
        let argv = argv::squeue_named(name);
        let out = self.output(&argv, &[]).await?;
        parse::jobs(&out).map_err(|e| self.unreadable(&argv, e))
    }

    /// The job's full record: owner, batch host, tasks, the GPUs of each set of nodes.
    pub async fn job_record(&self, job: JobId) -> Result<JobRecord, SlurmError> {
        let argv = argv::scontrol_job(job);
        let out = match self.output(&argv, &[]).await {
            Err(SlurmError::Failed { stderr, .. }) if stderr.contains(GONE) => {
                return Err(SlurmError::UnknownJob {
                    host: self.host().to_string(),
                    job,
                });
            }
            other => other?,
        };
        parse::job_record(&out).map_err(|e| self.unreadable(&argv, e))
    }

    /// The nodes of a hostlist, with the address each is reached at.
    pub async fn nodes(&self, hostlist: &str) -> Result<Vec<NodeInfo>, SlurmError> {
        let argv = argv::scontrol_nodes(hostlist);
        let out = self.output(&argv, &[]).await?;
        parse::nodes(&out).map_err(|e| self.unreadable(&argv, e))
    }

    /// A hostlist (`gpu[01-04,07]`) as node names, expanded by Slurm itself.
    pub async fn hostnames(&self, hostlist: &str) -> Result<Vec<String>, SlurmError> {
        let out = self
            .output(&argv::scontrol_hostnames(hostlist), &[])
            .await?;
        Ok(parse::hostnames(&out))
    }

    /// The job's steps (the batch step included); empty once the job is over.
    pub async fn steps(&self, job: JobId) -> Result<Vec<StepStatus>, SlurmError> {
        let argv = argv::squeue_steps(job);
        let out = match self.output(&argv, &[]).await {
            Err(SlurmError::Failed { stderr, .. }) if stderr.contains(GONE) => {
                return Ok(Vec::new());
            }
            other => other?,
        };
        parse::steps(&out).map_err(|e| self.unreadable(&argv, e))
    }

    /// Starts `step`'s `srun`, detached, on this host: the srun process lives as long as the
    /// step (when it dies, Slurm ends the step), its own messages go to `srun_log`, and its pid
    /// to `pidfile`. `env` is the server's environment on top of this runner's. Returns
    /// srun's pid; the step id appears in [`Slurm::steps`] under the step's name once Slurm
    /// has created it.
    pub async fn start_step(
        &self,
        step: &StepRequest,
        env: &BTreeMap<String, String>,
        srun_log: &str,
        pidfile: &str,
    ) -> Result<u32, SlurmError> {
        let mut all = self.env.clone();
        all.extend(env.iter().map(|(k, v)| (k.clone(), v.clone())));
        let detached = Detached {
            argv: argv::srun(step),
            env: all,
            log: srun_log.to_string(),
            pidfile: pidfile.to_string(),
        };
        Ok(self.transport.spawn_detached(&detached).await?)
    }

    /// Cancels the job and every step in it.
    pub async fn cancel_job(&self, job: JobId) -> Result<(), SlurmError> {
        self.output(&argv::scancel_job(job), &[]).await.map(drop)
    }

    /// Ends one step (one server); the allocation and the other steps go on.
    pub async fn cancel_step(&self, step: StepId) -> Result<(), SlurmError> {
        self.output(&argv::scancel_step(step), &[]).await.map(drop)
    }

    /// Sends `signal` to the tasks of one step, as Ctrl-C would reach a process.
    pub async fn signal_step(&self, step: StepId, signal: &str) -> Result<(), SlurmError> {
        self.output(&argv::scancel_signal(step, signal), &[])
            .await
            .map(drop)
    }

    /// Waits until `job` runs (steps can start only then), telling `seen` each state read
    /// while it waits (the pending reason, live). Polls squeue on `poll`'s schedule; fails
    /// when the job ends first, waits for a reason that waiting cannot cure, or `cancel` fires.
    pub async fn wait_running(
        &self,
        job: JobId,
        poll: Backoff,
        cancel: &CancellationToken,
        mut seen: impl FnMut(&JobStatus) + Send,
    ) -> Result<JobStatus, SlurmError> {
        let host = || self.host().to_string();
        let interrupted = || SlurmError::Interrupted { host: host(), job };
        let mut attempt: u32 = 0;
        loop {
            attempt = attempt.saturating_add(1);
            let status = tokio::select! {
                _ = cancel.cancelled() => return Err(interrupted()),
                s = self.job(job) => s?,
            };
            match judge(status) {
                Waiting::Running(s) => return Ok(s),
                Waiting::Pending(s) => seen(&s),
                Waiting::Blocked(s) => {
                    return Err(SlurmError::Blocked {
                        host: host(),
                        job,
                        reason: s.reason,
                    });
                }
                Waiting::Ended(s) => {
                    return Err(SlurmError::Ended {
                        host: host(),
                        job,
                        state: s.state,
                        reason: s.reason,
                    });
                }
                Waiting::Gone => return Err(SlurmError::UnknownJob { host: host(), job }),
            }
            tokio::select! {
                _ = cancel.cancelled() => return Err(interrupted()),
                _ = tokio::time::sleep(poll.random_delay(attempt)) => {}
            }
        }
    }

    /// Runs `argv` (after `env NAME=VALUE...` when this runner sets any) with `input` on its
    /// stdin; a non-zero exit is [`SlurmError::Failed`], with a hint when the cause is known.
    async fn output(&self, argv: &[String], input: &[u8]) -> Result<String, SlurmError> {
        let mut full = Vec::with_capacity(argv.len() + self.env.len() + 1);
        if !self.env.is_empty() {
            full.push("env".to_string());
            full.extend(self.env.iter().map(|(k, v)| format!("{k}={v}")));
        }
        full.extend(argv.iter().cloned());
        let out = self.transport.run_input(&full, input).await?;
        if out.success() {
            return Ok(out.stdout_lossy());
        }
        let stderr = out.stderr_lossy().trim().to_string();
        Err(SlurmError::Failed {
            host: self.host().to_string(),
            command: self.shown(argv),
            status: out.status,
            hint: hint(out.status, &stderr),
            stderr,
        })
    }

    fn unreadable(&self, argv: &[String], source: BadLine) -> SlurmError {
        SlurmError::Output {
            host: self.host().to_string(),
            command: self.shown(argv),
            source,
        }
    }

    /// The command as a user would type it, secrets masked.
    fn shown(&self, argv: &[String]) -> String {
        mask(&quote_argv(self.host(), argv).unwrap_or_else(|_| argv.join(" ")))
    }
}

/// Where a job that fleet waits for stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waiting {
    /// Steps can start.
    Running(JobStatus),
    /// Still to run; the status says why it waits.
    Pending(JobStatus),
    /// Pending for a reason that waiting cannot cure.
    Blocked(JobStatus),
    /// Ended (cancelled, failed, out of time, ...) before it ran.
    Ended(JobStatus),
    /// Slurm no longer knows it.
    Gone,
}

/// What a job's status means for a wait on it to run.
pub fn judge(status: Option<JobStatus>) -> Waiting {
    match status {
        None => Waiting::Gone,
        Some(s) if s.state.is_running() => Waiting::Running(s),
        Some(s) if s.state.is_over() => Waiting::Ended(s),
        Some(s) if s.reason.needs_change() => Waiting::Blocked(s),
        Some(s) => Waiting::Pending(s),
    }
}

/// What to do about a failure whose cause Slurm's message names.
fn hint(status: Option<i32>, stderr: &str) -> Option<&'static str> {
    const HINTS: &[(&str, &str)] = &[
        (
            "Invalid partition",
            "check the Slurm host's `partition:` in fleet.yaml; `sinfo --summarize` lists the \
             partitions",
        ),
        (
            "Invalid account",
            "check --account in the Slurm host's `sbatch_args`; `sacctmgr show assoc \
             user=$USER` lists yours",
        ),
        (
            "Invalid qos",
            "check --qos in the Slurm host's `sbatch_args`; `sacctmgr show assoc user=$USER` \
             lists yours",
        ),
        (
            "Requested node configuration is not available",
            "no node of the partition has that many GPUs or CPUs: ask for fewer per node, or \
             see what the nodes have with `sinfo -o '%P %D %c %G'`",
        ),
        (
            "Requested time limit is invalid",
            "the `time:` is longer than the partition allows; `sinfo -o '%P %l'` shows its limit",
        ),
        (
            "Job is pending execution",
            "the allocation is not running yet: wait until squeue shows it RUNNING before \
             starting steps",
        ),
        (
            "Unable to contact slurm controller",
            "slurmctld does not answer: check SLURM_CONF and `scontrol ping` on that host",
        ),
    ];
    if let Some((_, h)) = HINTS.iter().find(|(needle, _)| stderr.contains(needle)) {
        return Some(h);
    }
    (status == Some(127) || stderr.contains("command not found")).then_some(
        "Slurm's commands (sbatch, srun, squeue, scontrol, scancel) must be on the PATH of \
         the host that runs them: this machine, or the login node in the Slurm host's `ssh:`",
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use async_trait::async_trait;

    use super::*;
    use crate::remote::{CommandOutput, RemoteError, Tunnel};
    use crate::slurm::state::{JobState, Reason};

    /// A login node whose squeue prints `rows` in turn (the last one from then on), and which
    /// records every argv it is given.
    #[derive(Debug)]
    struct Canned {
        rows: Mutex<Vec<&'static str>>,
        ran: Mutex<Vec<Vec<String>>>,
    }

    impl Canned {
        fn new(rows: &[&'static str]) -> Arc<Canned> {
            let mut rows = rows.to_vec();
            rows.reverse();
            Arc::new(Canned {
                rows: Mutex::new(rows),
                ran: Mutex::new(Vec::new()),
            })
        }
    }

    #[async_trait]
    impl Transport for Canned {
        fn host(&self) -> &str {
            "login"
        }

        async fn run_input(&self, argv: &[String], _: &[u8]) -> Result<CommandOutput, RemoteError> {
            self.ran.lock().unwrap().push(argv.to_vec());
            let mut rows = self.rows.lock().unwrap();
            let row = if rows.len() > 1 {
                rows.pop()
            } else {
                rows.last().copied()
            };
            Ok(CommandOutput {
                status: Some(0),
                stdout: row.unwrap_or_default().as_bytes().to_vec(),
                stderr: Vec::new(),
            })
        }

        async fn forward(&self, addr: &str, port: u16) -> Result<Tunnel, RemoteError> {
            Err(RemoteError::Forward {
                host: self.host().into(),
                addr: addr.into(),
                port,
                message: "not in this test".into(),
            })
        }
    }

    const POLL: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(10));

    #[tokio::test(start_paused = true)]
    async fn waiting_reports_each_pending_reason_until_the_job_runs() {
        let login = Canned::new(&[
            "7|PENDING|None|10:00|2||fleet-hpc\n",
            "7|PENDING|Priority|10:00|2||fleet-hpc\n",
            "7|PENDING|Resources|10:00|2||fleet-hpc\n",
            "7|RUNNING|None|9:59|2|gpu[1-2]|fleet-hpc\n",
        ]);
        let slurm = Slurm::new(login.clone()).with_env("SLURM_CONF", "/opt/slurm/etc/slurm.conf");
        let mut reasons = Vec::new();
        let running = slurm
            .wait_running(JobId(7), POLL, &CancellationToken::new(), |s| {
                reasons.push(s.reason.to_string())
            })
            .await
            .unwrap();
        assert_eq!(running.nodes, "gpu[1-2]");
        assert_eq!(reasons, ["None", "Priority", "Resources"]);
        let ran = login.ran.lock().unwrap();
        assert_eq!(ran.len(), 4);
        assert_eq!(
            ran[0][..4],
            [
                "env",
                "SLURM_CONF=/opt/slurm/etc/slurm.conf",
                "squeue",
                "--noheader"
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_ends_when_cancelled() {
        let login = Canned::new(&["7|PENDING|Priority|10:00|2||fleet-hpc\n"]);
        let slurm = Slurm::new(login.clone());
        let cancel = CancellationToken::new();
        let stop = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(60)).await;
            stop.cancel();
        });
        let err = slurm
            .wait_running(JobId(7), POLL, &cancel, |_| {})
            .await
            .unwrap_err();
        assert!(matches!(err, SlurmError::Interrupted { .. }), "{err}");
        // 60 s of polls that back off towards 10 s: a handful, not one a second.
        let polls = login.ran.lock().unwrap().len();
        assert!((5..=15).contains(&polls), "{polls}");
        assert_eq!(login.ran.lock().unwrap()[0][0], "squeue");
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_fails_at_once_for_a_job_that_cannot_run_or_ended() {
        let blocked = Canned::new(&["7|PENDING|PartitionTimeLimit|10:00|2||fleet-hpc\n"]);
        let err = Slurm::new(blocked)
            .wait_running(JobId(7), POLL, &CancellationToken::new(), |_| {})
            .await
            .unwrap_err();
        let shown = err.to_string();
        assert!(
            shown.starts_with(
                "login: job 7 cannot start as asked: Slurm holds it for PartitionTimeLimit"
            ),
            "{shown}"
        );
        assert!(shown.contains("scancel 7"), "{shown}");
        let ended = Canned::new(&["7|CANCELLED|None|10:00|2||fleet-hpc\n"]);
        let err = Slurm::new(ended)
            .wait_running(JobId(7), POLL, &CancellationToken::new(), |_| {})
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                SlurmError::Ended {
                    state: JobState::Cancelled,
                    ..
                }
            ),
            "{err}"
        );
        let gone = Canned::new(&[""]);
        let err = Slurm::new(gone)
            .wait_running(JobId(7), POLL, &CancellationToken::new(), |_| {})
            .await
            .unwrap_err();
        assert!(matches!(err, SlurmError::UnknownJob { .. }), "{err}");
    }

    fn status(state: JobState, reason: &str) -> JobStatus {
        JobStatus {
            id: JobId(1),
            state,
            reason: Reason::parse(reason),
            time_left: None,
            node_count: 1,
            nodes: String::new(),
            name: "fleet-x".into(),
        }
    }

    #[test]
    fn judging_a_job_that_fleet_waits_for() {
        assert_eq!(judge(None), Waiting::Gone);
        let run = status(JobState::Running, "None");
        assert_eq!(judge(Some(run.clone())), Waiting::Running(run));
        for reason in ["Resources", "Priority", "None", "QOSGrpGRES"] {
            let s = status(JobState::Pending, reason);
            assert_eq!(judge(Some(s.clone())), Waiting::Pending(s), "{reason}");
        }
        let s = status(JobState::Configuring, "None");
        assert_eq!(judge(Some(s.clone())), Waiting::Pending(s));
        let s = status(JobState::Pending, "PartitionTimeLimit");
        assert_eq!(judge(Some(s.clone())), Waiting::Blocked(s));
        let s = status(JobState::Cancelled, "None");
        assert_eq!(judge(Some(s.clone())), Waiting::Ended(s));
        let s = status(JobState::Failed, "NonZeroExitCode");
        assert_eq!(judge(Some(s.clone())), Waiting::Ended(s));
    }

    #[test]
    fn hints_for_what_slurm_says() {
        let fixture = |name: &str| {
            let path = format!("{}/tests/fixtures/slurm/{name}", env!("CARGO_MANIFEST_DIR"));
            std::fs::read_to_string(path).unwrap()
        };
        let partition = fixture("sbatch_invalid_partition.stderr");
        assert!(hint(Some(1), &partition).unwrap().contains("`partition:`"));
        let pending = fixture("srun_pending.stderr");
        assert!(hint(Some(1), &pending).unwrap().contains("RUNNING"));
        assert!(fixture("squeue_invalid_job.stderr").contains(GONE));
        let missing = hint(Some(127), "bash: line 1: sbatch: command not found").unwrap();
        assert!(missing.contains("PATH"));
        assert_eq!(hint(Some(1), "something new"), None);
    }
}
