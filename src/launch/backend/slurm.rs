//! The Slurm backend: a host's servers as job steps of one allocation. `facts` finds or
//! submits the allocation (named `fleet-<host>`, its output in the run directory), waits for it
//! to run while logging its pending reason, and learns the place of every server (a node and
//! its NodeAddr, one place per GPU); `start` runs one `srun --exact -N1 -n1 --gres=gpu:1 -w
//! NODE` step per server, which records the step and the GPU Slurm gave it; `stop` cancels
//! the step; `job_command` runs a detached job as one more step beside them; `release` cancels
//! the allocation when fleet made it and no server of it is left.
//! The run directory must be on a filesystem the nodes share: steps write their logs there.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::machine::AFTER_KILL;
use super::{Backend, Ending, Home, JobCommand, JobStop, Seen, StopState, Stopped};
use crate::backoff::Backoff;
use crate::config::SlurmHost;
use crate::gpu::{GpuError, GpuReading};
use crate::launch::plan::{HostFacts, Instance, Topology};
use crate::launch::preflight::{self, FactsError, Learn};
use crate::launch::state::{self, Handle, InstanceRecord, Liveness, StateError};
use crate::remote::{RemoteError, Transport, Tunnel, argv};
use crate::slurm::{
    AllocationRequest, JobId, JobRecord, JobState, JobStatus, Shape, Slurm, SlurmSpec, SlurmTime,
    Step, StepId, StepRequest,
};

/// How often squeue is asked while an allocation pends, a step starts or a step ends.
const POLL: Backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
/// How long a step may take to start once its srun runs (Slurm answers in well under a
/// second; a node that does not answer makes srun give up on its own sooner).
const STEP_START: Duration = Duration::from_secs(120);

/// Writes what Slurm gave the step (`JOB STEP GPUS`) to `$0`, then becomes the server: the
/// server stays the step's own process, which Slurm tracks and ends with the step.
const STEP_WRAPPER: &str = r#"printf '%s %s %s\n' "$SLURM_JOB_ID" "$SLURM_STEP_ID" "${CUDA_VISIBLE_DEVICES:-}" >"$0.tmp" && mv -f "$0.tmp" "$0" && exec "$@""#;

/// Where a server of the allocation runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    pub node: String,
    /// The node's NodeAddr: what the server binds and is reached at.
    pub addr: String,
}

/// The allocation the servers run in, once it runs.
#[derive(Debug, Clone)]
struct Allocation {
    job: JobId,
    /// One per server, in order: the servers' GPUs (ids) on this host are these indices.
    places: Vec<Place>,
}

/// A Slurm host of the inventory, through the shell where its Slurm commands run.
#[derive(Debug)]
pub struct SlurmBackend {
    spec: SlurmHost,
    home: Home,
    slurm: Slurm,
    allocation: Mutex<Option<Allocation>>,
}

impl SlurmBackend {
    pub fn new(spec: SlurmHost, home: Home) -> SlurmBackend {
        let slurm = Slurm::new(home.shell.clone());
        SlurmBackend {
            spec,
            home,
            slurm,
            allocation: Mutex::new(None),
        }
    }

    fn t(&self) -> &dyn Transport {
        self.home.shell.as_ref()
    }

    /// The allocation's name in squeue: how the user recognises fleet's job.
    pub fn job_name(&self) -> String {
        format!("fleet-{}", self.home.host)
    }

    /// Where fleet keeps the allocation's id and its batch output.
    fn state_dir(&self) -> String {
        format!(
            "{}/slurm-{}",
            self.home.run_root.trim_end_matches('/'),
            self.home.host
        )
    }

    fn job_file(&self) -> String {
        format!("{}/job", self.state_dir())
    }

    /// The allocation the host's servers run in: the user's, or the one fleet submitted and
    /// has not cancelled, if any.
    async fn servers_job(&self) -> Result<Option<JobId>, StateError> {
        match &self.spec.slurm {
            SlurmSpec::Existing { job, .. } => Ok(Some(*job)),
            SlurmSpec::New(_) => self.own_job().await,
        }
    }

    /// The allocation fleet submitted for this host and has not cancelled, if any.
    async fn own_job(&self) -> Result<Option<JobId>, StateError> {
        let script = r#"[ -f "$1" ] && cat "$1"; true"#;
        let text = state::run_ok(
            self.t(),
            &argv(&["sh", "-c", script, "sh", &self.job_file()]),
        )
        .await?;
        Ok(text.trim().parse().ok())
    }

    /// The allocation's job: the one the user holds, the one fleet submitted earlier while it
    /// is still queued or running, or a new one.
    async fn job(&self) -> Result<JobId, StateError> {
        let new = match &self.spec.slurm {
            SlurmSpec::Existing { job, .. } => return Ok(*job),
            SlurmSpec::New(new) => new,
        };
        if let Some(job) = self.own_job().await?
            && let Some(s) = self.slurm.job(job).await?
            && !s.state.is_over()
        {
            return Ok(job);
        }
        let dir = self.state_dir();
        state::run_ok(self.t(), &argv(&["mkdir", "-p", "--", &dir])).await?;
        let req = AllocationRequest {
            name: self.job_name(),
            partition: new.partition.clone(),
            shape: Shape::Spread { servers: new.gpus },
            cpus_per_task: new.cpus_per_task,
            time: new.time,
            output: format!("{dir}/allocation-%j.out"),
            extra: new.sbatch_args.clone(),
        };
        let job = self.slurm.submit(&req).await?;
        let script = r#"printf '%s\n' "$1" >"$2""#;
        let id = job.to_string();
        state::run_ok(
            self.t(),
            &argv(&["sh", "-c", script, "sh", &id, &self.job_file()]),
        )
        .await?;
        tracing::info!("{}: submitted job {job} ({})", self.home.host, req.name);
        Ok(job)
    }

    /// Waits for the allocation to run, logging each pending reason once, and learns the
    /// place of every server in it.
    async fn allocate(&self) -> Result<Allocation, FactsError> {
        let job = self.job().await?;
        let host = self.home.host.clone();
        let mut last = None;
        self.slurm
            .wait_running(job, POLL, &CancellationToken::new(), |s: &JobStatus| {
                if last.as_ref() != Some(&s.reason) {
                    tracing::info!("{host}: job {job} pending ({})", s.reason);
                    last = Some(s.reason.clone());
                }
            })
            .await?;
        let record = self.slurm.job_record(job).await?;
        let mut expanded = Vec::new();
        for (hostlist, gres) in &record.allocated {
            expanded.push((self.slurm.hostnames(hostlist).await?, gres.clone()));
        }
        let nodes = match &record.nodes {
            Some(list) => self.slurm.nodes(list).await?,
            None => Vec::new(),
        };
        let addrs: BTreeMap<String, String> = nodes.into_iter().map(|n| (n.name, n.addr)).collect();
        let mut places = places(&expanded, &addrs);
        let have = places.len() as u32;
        if have == 0 {
            return Err(FactsError::NoGpus {
                host: self.home.host.clone(),
                job,
            });
        }
        if let Some(want) = self.spec.slurm.servers() {
            if want > have {
                return Err(FactsError::FewerGpus {
                    host: self.home.host.clone(),
                    job,
                    have,
                    want,
                });
            }
            places.truncate(want as usize);
        }
        warn_few_tasks(&host, &record, places.len());
        Ok(Allocation { job, places })
    }

    async fn allocation(&self) -> Result<Allocation, StateError> {
        self.allocation
            .lock()
            .await
            .clone()
            .ok_or_else(|| StateError::Command {
                host: self.home.host.clone(),
                command: "srun".to_string(),
                stderr: "the allocation was not looked at before starting servers in it".into(),
            })
    }

    /// The numbered steps of `job` that run.
    async fn steps(&self, job: JobId) -> Result<BTreeSet<u32>, StateError> {
        Ok(self
            .slurm
            .steps(job)
            .await?
            .into_iter()
            .filter_map(|s| match s.id.step {
                Step::Numbered(n) if s.id.job == job => Some(n),
                _ => None,
            })
            .collect())
    }

    /// What the step wrapper wrote once the step ran (`JOB STEP GPUS`), while `srun` runs.
    async fn started_step(
        &self,
        planned: &Instance,
        srun: u32,
        srun_log: &str,
    ) -> Result<(JobId, u32, String), StateError> {
        let file = step_file(&planned.files.dir);
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
                    command: format!("srun for {}", planned.label()),
                    stderr: match gone {
                        Some(tail) => format!("srun ended before the step ran: {}", tail.trim()),
                        None => format!("no step after {}s", STEP_START.as_secs()),
                    },
                });
            }
            tokio::time::sleep(POLL.random_delay(attempt)).await;
        }
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

    /// Cancels the allocation when fleet made it and no server of fleet's is left in it; an
    /// allocation the user holds (`job:`) is never touched. Waits until Slurm has ended it.
    pub async fn release_allocation(&self) -> Result<Option<JobId>, StateError> {
        if let SlurmSpec::Existing { .. } = self.spec.slurm {
            return Ok(None);
        }
        let Some(job) = self.own_job().await? else {
            return Ok(None);
        };
        if !state::read_records(self.t(), &self.home.run_root)
            .await?
            .is_empty()
        {
            return Ok(None);
        }
        self.slurm.cancel_job(job).await?;
        let deadline = Instant::now() + AFTER_KILL * 4;
        let mut attempt = 0;
        loop {
            // COMPLETING: cancelled, and ending; on a DOWN node it stays so until the node
            // is back, with nothing of the job running.
            // squeue without `--states=all` lists the job until it has ended on every node
            // (`--states=all` says CANCELLED at once).
            let listed = self.slurm.jobs_named(&self.job_name()).await?;
            let over = match listed.into_iter().find(|s| s.id == job) {
                None => true,
                Some(s) if s.state == JobState::Completing && !s.nodes.is_empty() => self
                    .slurm
                    .nodes(&s.nodes)
                    .await?
                    .iter()
                    .any(|n| n.state.is_down()),
                Some(_) => false,
            };
            if over || Instant::now() >= deadline {
                break;
            }
            attempt += 1;
            tokio::time::sleep(POLL.random_delay(attempt)).await;
        }
        state::run_ok(self.t(), &argv(&["rm", "-f", "--", &self.job_file()])).await?;
        *self.allocation.lock().await = None;
        Ok(Some(job))
    }
}

/// The step wrapper's file in a server's run directory.
fn step_file(dir: &str) -> String {
    format!("{}/slurm-step", dir.trim_end_matches('/'))
}

/// `JOB STEP GPUS` as the step wrapper writes it.
fn read_step_file(text: &str) -> Option<(JobId, u32, String)> {
    let mut words = text.split_whitespace();
    let job = words.next()?.parse().ok()?;
    let step = words.next()?.parse().ok()?;
    Some((job, step, words.next().unwrap_or_default().to_string()))
}

/// One place per GPU of the allocation, node by node in Slurm's order: `allocated` is each set
/// of nodes (expanded) with its generic resources (`gpu:8(IDX:0-7)`, `gpu:a100:4(IDX:0-3)`).
fn places(allocated: &[(Vec<String>, String)], addrs: &BTreeMap<String, String>) -> Vec<Place> {
    let mut out = Vec::new();
    for (nodes, gres) in allocated {
        let count = gpu_count(gres);
        for node in nodes {
            let addr = addrs.get(node).cloned().unwrap_or_else(|| node.clone());
            out.extend((0..count).map(|_| Place {
                node: node.clone(),
                addr: addr.clone(),
            }));
        }
    }
    out
}

/// The GPUs in a GRES allocation string: the count after the last `:` of its `gpu` item.
fn gpu_count(gres: &str) -> u32 {
    let Some(at) = gres.find("gpu") else {
        return 0;
    };
    let item = gres[at..].split('(').next().unwrap_or_default();
    item.rsplit(':')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A held allocation with fewer tasks than servers makes the extra steps wait for a task.
fn warn_few_tasks(host: &str, record: &JobRecord, servers: usize) {
    if (record.tasks as usize) < servers {
        tracing::warn!(
            "{host}: job {} has {} task(s) for {servers} servers: each server's step needs a \
             task of its own (--ntasks-per-node), so some will wait",
            record.id,
            record.tasks
        );
    }
}

#[async_trait]
impl Backend for SlurmBackend {
    fn home(&self) -> &Home {
        &self.home
    }

    async fn facts(&self, learn: &Learn<'_>) -> Result<HostFacts, FactsError> {
        let Learn {
            launcher,
            env,
            preflight,
            ..
        } = *learn;
        let allocation = self.allocate().await?;
        let first = &allocation.places[0];
        // Read on a node, inside the allocation, beside whatever already runs there.
        let via = crate::slurm::srun_beside(allocation.job, Some(&first.node), None);
        let (help, version) =
            preflight::launcher_facts(self.t(), &via, launcher, env, preflight).await?;
        let facts = HostFacts {
            help,
            version,
            address: first.addr.clone(),
            gpus_present: (0..allocation.places.len() as u32).collect(),
            places: allocation.places.iter().map(|p| p.addr.clone()).collect(),
            // Slurm gives each step its GPUs; which ones is the scheduler's choice.
            topology: Topology::NotRead,
        };
        *self.allocation.lock().await = Some(allocation);
        Ok(facts)
    }

    async fn survey(&self) -> Result<Vec<Seen>, StateError> {
        let records = state::read_records(self.t(), &self.home.run_root).await?;
        let mut running: BTreeMap<JobId, BTreeSet<u32>> = BTreeMap::new();
        for r in &records {
            if let Handle::Step { job, .. } = r.handle
                && !running.contains_key(&job)
            {
                running.insert(job, self.steps(job).await?);
            }
        }
        // A dead node's steps stay listed in squeue: the node's state tells a lost server.
        let listed: BTreeSet<&str> = records
            .iter()
            .filter_map(|r| match &r.handle {
                Handle::Step {
                    job, step, node, ..
                } if running[job].contains(step) => Some(node.as_str()),
                _ => None,
            })
            .collect();
        let mut down = BTreeSet::new();
        if !listed.is_empty() {
            let list = listed.into_iter().collect::<Vec<_>>().join(",");
            for n in self.slurm.nodes(&list).await? {
                if n.state.is_down() {
                    down.insert(n.name);
                }
            }
        }
        Ok(records
            .into_iter()
            .map(|record| {
                let liveness = match &record.handle {
                    Handle::Step {
                        job, step, node, ..
                    } if running[job].contains(step) && !down.contains(node) => Liveness::Running,
                    Handle::Step { .. } => Liveness::Dead,
                    // Not a step: never fleet's to touch here.
                    Handle::Process { .. } => Liveness::Reused,
                };
                Seen {
                    record,
                    liveness,
                    lingering: false,
                }
            })
            .collect())
    }

    /// The nodes' ports cannot be read from the login node; Slurm gives each step its own
    /// node resources, and fleet's own servers are known from the records.
    async fn ports_in_use(&self) -> Result<BTreeSet<u16>, StateError> {
        Ok(BTreeSet::new())
    }

    async fn start(
        &self,
        planned: &Instance,
        owner: &crate::launch::owner::Owner,
    ) -> Result<InstanceRecord, StateError> {
        let allocation = self.allocation().await?;
        let place = planned
            .id
            .gpu_index()
            .and_then(|g| allocation.places.get(g as usize))
            .ok_or_else(|| StateError::Command {
                host: self.home.host.clone(),
                command: format!("srun for {}", planned.label()),
                stderr: format!(
                    "job {} has {} place(s) for servers",
                    allocation.job,
                    allocation.places.len()
                ),
            })?;
        state::prepare_run_dir(self.t(), &planned.files, planned.secrets.as_ref()).await?;
        let file = step_file(&planned.files.dir);
        state::run_ok(self.t(), &argv(&["rm", "-f", "--", &file])).await?;
        let mut server = argv(&["sh", "-c", STEP_WRAPPER, &file]);
        server.extend(planned.argv.iter().cloned());
        let cpus = match &self.spec.slurm {
            SlurmSpec::New(n) => n.cpus_per_task,
            SlurmSpec::Existing { .. } => None,
        };
        let step = StepRequest {
            job: allocation.job,
            node: place.node.clone(),
            name: format!("fleet-{}-{}", self.home.host, planned.port),
            gpus: 1,
            cpus,
            output: planned.files.log.clone(),
            argv: server,
        };
        let srun_log = format!("{}/srun.log", planned.files.dir);
        let srun = self
            .slurm
            .start_step(&step, &planned.env, &srun_log, &planned.files.pidfile)
            .await?;
        let (job, number, gpus) = match self.started_step(planned, srun, &srun_log).await {
            Ok(s) => s,
            Err(e) => {
                // Unrecorded, nothing would stop it: srun goes, and its step with it.
                let _ = self.t().run(&argv(&["kill", &srun.to_string()])).await;
                return Err(e);
            }
        };
        let record = InstanceRecord {
            id: planned.id.clone(),
            port: planned.port,
            profile: planned.profile.clone(),
            fingerprint: planned.fingerprint.clone(),
            argv: planned.display_argv(),
            address: planned.address.clone(),
            handle: Handle::Step {
                job,
                step: number,
                node: place.node.clone(),
                gpus,
            },
            started_at: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            api_key_env: planned.api_key_env.clone(),
            dir: planned.files.dir.clone(),
            log: planned.files.log.clone(),
            pidfile: planned.files.pidfile.clone(),
            record: planned.files.record.clone(),
            group: planned.group.if_multi(),
            owner: Some(owner.clone()),
        };
        if let Err(e) = state::write_record(self.t(), &record).await {
            let _ = self.slurm.cancel_step(step_id(job, number)).await;
            return Err(e);
        }
        Ok(record)
    }

    async fn alive(&self, record: &InstanceRecord) -> Result<bool, StateError> {
        match &record.handle {
            Handle::Step { job, step, .. } => Ok(self.steps(*job).await?.contains(step)),
            Handle::Process { .. } => Ok(false),
        }
    }

    async fn stop(&self, record: &InstanceRecord, grace: Duration) -> Result<Stopped, StateError> {
        let Handle::Step {
            job, step, node, ..
        } = &record.handle
        else {
            return Ok(Stopped {
                state: StopState::PidReused,
                port_closed: false,
            });
        };
        // A DOWN node's step stays listed, even after scancel: nothing of it runs any more.
        let lost = self
            .slurm
            .nodes(node)
            .await?
            .iter()
            .any(|n| n.state.is_down());
        let state = if !lost && self.steps(*job).await?.contains(step) {
            // scancel sends SIGTERM, and SIGKILL after the cluster's KillWait.
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
        self.wait_srun_gone(&record.pidfile).await?;
        if let Err(e) = state::remove_record(self.t(), record).await {
            tracing::warn!("{e}");
        }
        // Slurm ends every process of a step with it, so nothing of it listens any more.
        Ok(Stopped {
            state,
            port_closed: true,
        })
    }

    async fn log_tail(&self, log: &str, lines: usize) -> Result<String, StateError> {
        state::tail(self.t(), log, lines).await
    }

    async fn endpoint(&self, address: &str, port: u16) -> Result<Tunnel, RemoteError> {
        self.t().forward(address, port).await
    }

    async fn gpus(&self) -> Result<Vec<GpuReading>, GpuError> {
        Err(GpuError::Slurm {
            host: self.home.host.clone(),
        })
    }

    /// `squeue -j J -o %L` of the allocation the servers run in.
    async fn time_left(&self) -> Result<Option<Ending>, StateError> {
        let Some(job) = self.servers_job().await? else {
            return Ok(None);
        };
        let Some(status) = self.slurm.job(job).await? else {
            return Ok(None);
        };
        Ok(match status.time_left {
            Some(SlurmTime::Limited(left)) if !status.state.is_over() => Some(Ending {
                host: self.home.host.clone(),
                what: format!("job {job} ({})", status.name),
                left,
                stop_before: self.spec.stop_before_end,
            }),
            _ => None,
        })
    }

    /// One more step of the allocation, beside the servers' (`fleet-job-ID` in `squeue
    /// --steps`): Slurm accounts for the job, and ends it with the allocation. srun on the login
    /// shell is the job's process there; `fleet stop` signals the step itself.
    async fn job_command(&self, id: &str, argv: Vec<String>) -> Result<JobCommand, StateError> {
        let job = match self.servers_job().await? {
            Some(job) => self
                .slurm
                .job(job)
                .await?
                .filter(|s| s.state == JobState::Running),
            None => None,
        };
        let Some(job) = job else {
            return Err(StateError::NoAllocation {
                host: self.home.host.clone(),
            });
        };
        let name = format!("fleet-job-{id}");
        let mut wrapped = crate::slurm::srun_beside(job.id, None, Some(&name));
        wrapped.extend(argv);
        Ok(JobCommand {
            argv: wrapped,
            stop: JobStop::Step { job: job.id, name },
        })
    }

    async fn release(&self) -> Result<Option<String>, StateError> {
        Ok(self
            .release_allocation()
            .await?
            .map(|job| format!("cancelled job {job} ({})", self.job_name())))
    }
}

/// Sends SIGINT to the tasks of `job`'s step named `name`, if it still runs.
pub(super) async fn interrupt_step(
    shell: &Arc<dyn Transport>,
    job: JobId,
    name: &str,
) -> Result<(), StateError> {
    let slurm = Slurm::new(shell.clone());
    if let Some(step) = slurm.steps(job).await?.into_iter().find(|s| s.name == name) {
        slurm.signal_step(step.id, "INT").await?;
    }
    Ok(())
}

fn step_id(job: JobId, step: u32) -> StepId {
    StepId {
        job,
        step: Step::Numbered(step),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_place_per_gpu_node_by_node_at_its_address() {
        let addrs = BTreeMap::from([
            ("n1".to_string(), "127.0.0.2".to_string()),
            ("n2".to_string(), "127.0.0.3".to_string()),
        ]);
        let allocated = vec![
            (vec!["n1".to_string()], "gpu:2(IDX:0-1)".to_string()),
            (vec!["n2".to_string()], "gpu:a100:1(IDX:3)".to_string()),
        ];
        let p = places(&allocated, &addrs);
        let shown: Vec<(&str, &str)> = p
            .iter()
            .map(|p| (p.node.as_str(), p.addr.as_str()))
            .collect();
        assert_eq!(
            shown,
            [
                ("n1", "127.0.0.2"),
                ("n1", "127.0.0.2"),
                ("n2", "127.0.0.3")
            ]
        );
        assert_eq!(gpu_count("(null)"), 0);
        assert_eq!(gpu_count("gpu:8(IDX:0-7),mps:100"), 8);
    }

    #[test]
    fn the_step_file_names_job_step_and_gpus() {
        assert_eq!(
            read_step_file("12 3 5\n"),
            Some((JobId(12), 3, "5".to_string()))
        );
        assert_eq!(read_step_file("12 3"), Some((JobId(12), 3, String::new())));
        assert_eq!(read_step_file("waiting"), None);
    }
}
