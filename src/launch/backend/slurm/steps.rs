//! One server process as one job step: started on its node with its GPUs (and seen to run),
//! and stopped; a server over several nodes is one such step per rank.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::{AFTER_KILL, step_id};
use super::{Allocation, POLL, STEP_START, STEP_WRAPPER, SlurmBackend, read_step_file, step_file};
use crate::launch::backend::StopState;
use crate::launch::plan::{RunFiles, Secret};
use crate::launch::state::{self, Handle, StateError};
use crate::layout::Group;
use crate::remote::argv;
use crate::slurm::{JobId, SlurmSpec, StepRequest};

/// What one step of a server is: its GPUs, files and command line.
pub(super) struct StepOf<'a> {
    /// How messages name it: `hpc gpu0+1 :30000`, `… rank 1`.
    pub label: String,
    pub group: &'a Group,
    pub files: &'a RunFiles,
    pub secrets: Option<&'a Secret>,
    pub argv: &'a [String],
    pub env: &'a BTreeMap<String, String>,
    pub port: u16,
}

impl SlurmBackend {
    /// Starts `s` as a step on the node of its first place, holding all of its GPUs there, and
    /// waits until Slurm runs it: the step's handle.
    pub(super) async fn run_step(
        &self,
        allocation: &Allocation,
        s: &StepOf<'_>,
    ) -> Result<Handle, StateError> {
        let refuse = |stderr: String| StateError::Command {
            host: self.home.host.clone(),
            command: format!("srun for {}", s.label),
            stderr,
        };
        let places: Vec<_> = s
            .group
            .gpus
            .iter()
            .map(|g| allocation.places.get(*g as usize))
            .collect::<Option<_>>()
            .ok_or_else(|| {
                refuse(format!(
                    "job {} has {} place(s) for servers",
                    allocation.job,
                    allocation.places.len()
                ))
            })?;
        let place = places[0];
        // A step's GPUs are one node's: the plan's groups are contiguous places, node by node.
        if places.iter().any(|p| p.node != place.node) {
            return Err(refuse(format!(
                "its {} GPUs span nodes of job {}: ask the allocation for a multiple of {} GPUs \
                 on each node",
                places.len(),
                allocation.job,
                places.len()
            )));
        }
        state::prepare_run_dir(self.t(), s.files, s.secrets).await?;
        let file = step_file(&s.files.dir);
        state::run_ok(self.t(), &argv(&["rm", "-f", "--", &file])).await?;
        let mut server = argv(&["sh", "-c", STEP_WRAPPER, &file]);
        server.extend(s.argv.iter().cloned());
        let cpus = match &self.spec.slurm {
            SlurmSpec::New(n) => n.cpus_per_task,
            SlurmSpec::Existing { .. } => None,
        };
        let step = StepRequest {
            job: allocation.job,
            node: place.node.clone(),
            name: format!("fleet-{}-{}", self.home.host, s.port),
            gpus: places.len() as u32,
            cpus,
            output: s.files.log.clone(),
            argv: server,
        };
        let srun_log = format!("{}/srun.log", s.files.dir);
        let srun = self
            .slurm
            .start_step(&step, s.env, &srun_log, &s.files.pidfile)
            .await?;
        match self
            .started_step(&s.label, &s.files.dir, srun, &srun_log)
            .await
        {
            Ok((job, step, gpus)) => Ok(Handle::Step {
                job,
                step,
                node: place.node.clone(),
                gpus,
            }),
            Err(e) => {
                // Unrecorded, nothing would stop it: srun goes, and its step with it.
                let _ = self.t().run(&argv(&["kill", &srun.to_string()])).await;
                Err(e)
            }
        }
    }

    /// What the step wrapper wrote once the step ran (`JOB STEP GPUS`), while `srun` runs.
    async fn started_step(
        &self,
        label: &str,
        dir: &str,
        srun: u32,
        srun_log: &str,
    ) -> Result<(JobId, u32, String), StateError> {
        let file = step_file(dir);
        let script = r#"if [ -f "$1" ]; then cat "$1"; elif kill -0 "$2" 2>/dev/null; then echo waiting; else echo gone; tail -n 5 "$3"; fi"#;
        let pid = srun.to_string();
        let deadline = Instant::now() + STEP_START;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let out = state::run_ok(
                self.t(),
                &argv(&["sh", "-c", script, "sh", &file, &pid, srun_log]),
            )
            .await?;
            let text = out.trim();
            if let Some(started) = read_step_file(text) {
                return Ok(started);
            }
            let gone = text.strip_prefix("gone");
            if gone.is_some() || Instant::now() >= deadline {
                return Err(StateError::Command {
                    host: self.home.host.clone(),
                    command: format!("srun for {label}"),
                    stderr: match gone {
                        Some(tail) => format!("srun ended before the step ran: {}", tail.trim()),
                        None => format!("no step after {}s", STEP_START.as_secs()),
                    },
                });
            }
            tokio::time::sleep(POLL.random_delay(attempt)).await;
        }
    }

    /// Cancels a step (SIGTERM, then SIGKILL after the cluster's KillWait) and waits until it
    /// and its `srun` are gone; a step already gone, or on a DOWN node, is already dead.
    pub(super) async fn stop_step(
        &self,
        handle: &Handle,
        pidfile: &str,
        grace: Duration,
    ) -> Result<StopState, StateError> {
        let Handle::Step {
            job, step, node, ..
        } = handle
        else {
            return Ok(StopState::PidReused);
        };
        // A DOWN node's step stays listed, even after scancel: nothing of it runs any more.
        let lost = self
            .slurm
            .nodes(node)
            .await?
            .iter()
            .any(|n| n.state.is_down());
        let state = if !lost && self.steps(*job).await?.contains(step) {
            self.slurm.cancel_step(step_id(*job, *step)).await?;
            if !self.wait_step_gone(*job, *step, grace + AFTER_KILL).await? {
                return Err(StateError::Command {
                    host: self.home.host.clone(),
                    command: format!("scancel {job}.{step}"),
                    stderr: "the step is still there".to_string(),
                });
            }
            StopState::Stopped
        } else {
            StopState::AlreadyDead
        };
        self.wait_srun_gone(pidfile).await?;
        Ok(state)
    }

    /// Waits until the step is gone from squeue (or `within` passes); `true` when it is.
    async fn wait_step_gone(
        &self,
        job: JobId,
        step: u32,
        within: Duration,
    ) -> Result<bool, StateError> {
        let deadline = Instant::now() + within;
        let mut attempt = 0;
        loop {
            if !self.steps(job).await?.contains(&step) {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            attempt += 1;
            tokio::time::sleep(POLL.random_delay(attempt)).await;
        }
    }

    /// Waits (up to [`AFTER_KILL`]) for the step's `srun` to exit once its step ended.
    async fn wait_srun_gone(&self, pidfile: &str) -> Result<(), StateError> {
        let script = r#"p=$(cat "$1" 2>/dev/null) || exit 0; [ -n "$p" ] || exit 0; i=0; while kill -0 "$p" 2>/dev/null; do i=$((i+1)); [ "$i" -gt "$2" ] && exit 1; sleep 0.05; done"#;
        let rounds = (AFTER_KILL.as_millis() / 50).to_string();
        let out = self
            .t()
            .run(&argv(&["sh", "-c", script, "sh", pidfile, &rounds]))
            .await?;
        if !out.success() {
            tracing::warn!("{}: srun of {pidfile} still runs", self.home.host);
        }
        Ok(())
    }
}
