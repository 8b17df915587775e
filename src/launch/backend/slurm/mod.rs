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
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

mod steps;

use steps::StepOf;

use super::machine::AFTER_KILL;
use super::{Backend, Ending, Home, JobCommand, JobStop, Seen, StopState, Stopped};
use crate::backoff::Backoff;
use crate::config::SlurmHost;
use crate::gpu::{GpuError, GpuReading};
use crate::launch::plan::{HostFacts, Instance, Topology};
use crate::launch::preflight::{self, FactsError, Learn};
use crate::launch::state::{self, Handle, InstanceRecord, Liveness, RankRecord, StateError};
use crate::layout::Parallel;
use crate::remote::{RemoteError, Transport, Tunnel, argv};
use crate::slurm::{
    AllocationRequest, JobId, JobRecord, JobState, JobStatus, Shape, Slurm, SlurmSpec, SlurmTime,
    Step, StepId,
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
    async fn job(&self, parallel: &Parallel) -> Result<JobId, StateError> {
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
            shape: shape(new.gpus, parallel),
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
    async fn allocate(&self, parallel: &Parallel) -> Result<Allocation, FactsError> {
        let job = self.job(parallel).await?;
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
/// How the GPUs of an allocation fleet makes are asked for: anywhere Slurm finds them, or,
/// for servers over several nodes, each rank's share on a node of its own, so that no two
/// ranks of a server meet on one node. A count the layout does not divide is asked for as it
/// is, and the plan says what does not fit.
fn shape(gpus: u32, parallel: &Parallel) -> Shape {
    let per_node = parallel.gpus_per_node().max(1);
    let nodes = parallel.nnodes.max(1);
    if nodes > 1 && gpus.is_multiple_of(per_node * nodes) {
        Shape::PerNode {
            nodes: gpus / per_node,
            servers_per_node: per_node,
        }
    } else {
        Shape::Spread { servers: gpus }
    }
}

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
            parallel,
            ..
        } = *learn;
        let allocation = self.allocate(&parallel).await?;
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
            .flat_map(InstanceRecord::handles)
            .filter_map(|h| match h {
                Handle::Step {
                    job, step, node, ..
                } if running.get(job).is_some_and(|s| s.contains(step)) => Some(node.as_str()),
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
                let runs = |h: &Handle| match h {
                    Handle::Step {
                        job, step, node, ..
                    } => running.get(job).is_some_and(|s| s.contains(step)) && !down.contains(node),
                    Handle::Process { .. } => false,
                };
                let ranks_running = record.handles().filter(|h| runs(h)).count();
                let (liveness, lingering) = match &record.handle {
                    // Not a step: never fleet's to touch here.
                    Handle::Process { .. } => (Liveness::Reused, false),
                    // A rank lost is the server lost; the ranks left run on until stopped.
                    _ if ranks_running == record.handles().count() => (Liveness::Running, false),
                    _ => (Liveness::Dead, ranks_running > 0),
                };
                Seen {
                    record,
                    liveness,
                    lingering,
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
        let handle = self
            .run_step(
                &allocation,
                &StepOf {
                    label: planned.label(),
                    group: &planned.group,
                    files: &planned.files,
                    secrets: planned.secrets.as_ref(),
                    argv: &planned.argv,
                    env: &planned.env,
                    port: planned.port,
                },
            )
            .await?;
        // The other nodes' ranks, each a step on its node; one that does not start takes the
        // whole server down with it, since rank 0 waits for every rank at its rendezvous.
        let mut ranks: Vec<RankRecord> = Vec::new();
        for (i, rank) in planned.ranks.iter().enumerate() {
            let started = self
                .run_step(
                    &allocation,
                    &StepOf {
                        label: format!("{} rank {}", planned.label(), i + 1),
                        group: &rank.group,
                        files: &rank.files,
                        secrets: None,
                        argv: &rank.argv,
                        env: &planned.env,
                        port: planned.port,
                    },
                )
                .await;
            match started {
                Ok(handle) => ranks.push(RankRecord {
                    handle,
                    log: rank.files.log.clone(),
                    pidfile: rank.files.pidfile.clone(),
                }),
                Err(e) => {
                    self.cancel_steps(
                        std::iter::once(&handle).chain(ranks.iter().map(|r| &r.handle)),
                    )
                    .await;
                    return Err(e);
                }
            }
        }
        let record = InstanceRecord::started(planned, handle, ranks, owner);
        if let Err(e) = state::write_record(self.t(), &record).await {
            self.cancel_steps(record.handles()).await;
            return Err(e);
        }
        Ok(record)
    }

    /// Every rank's step runs: a server over several nodes with a rank lost is lost.
    async fn alive(&self, record: &InstanceRecord) -> Result<bool, StateError> {
        for handle in record.handles() {
            match handle {
                Handle::Step { job, step, .. } if self.steps(*job).await?.contains(step) => {}
                _ => return Ok(false),
            }
        }
        Ok(true)
    }

    /// Rank 0 first (SGLang's rank 0 tells the others to stop), then every other rank.
    async fn stop(&self, record: &InstanceRecord, grace: Duration) -> Result<Stopped, StateError> {
        if !matches!(record.handle, Handle::Step { .. }) {
            return Ok(Stopped {
                state: StopState::PidReused,
                port_closed: false,
            });
        }
        let state = self
            .stop_step(&record.handle, &record.pidfile, grace)
            .await?;
        for rank in &record.ranks {
            self.stop_step(&rank.handle, &rank.pidfile, grace).await?;
        }
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

impl SlurmBackend {
    /// Cancels steps started for a server that could not be completed (best effort: what
    /// fails to cancel ends with the allocation).
    async fn cancel_steps(&self, handles: impl Iterator<Item = &Handle>) {
        for h in handles {
            if let Handle::Step { job, step, .. } = h {
                let _ = self.slurm.cancel_step(step_id(*job, *step)).await;
            }
        }
    }
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
    fn servers_over_nodes_get_each_ranks_share_on_a_node_of_its_own() {
        let over = |tp, nnodes| Parallel {
            tp,
            nnodes,
            ..Parallel::default()
        };
        // Two GPUs Slurm could give from one node: a tp2 server over 2 nodes needs one on each.
        assert_eq!(
            shape(2, &over(2, 2)),
            Shape::PerNode {
                nodes: 2,
                servers_per_node: 1
            }
        );
        assert_eq!(
            shape(32, &over(16, 2)),
            Shape::PerNode {
                nodes: 4,
                servers_per_node: 8
            }
        );
        assert_eq!(shape(8, &over(4, 1)), Shape::Spread { servers: 8 });
        // Not divisible: asked for as it is, and the plan names what does not fit.
        assert_eq!(shape(3, &over(2, 2)), Shape::Spread { servers: 3 });
    }

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
