//! The argv of every Slurm command fleet runs, built from typed requests. Pure: nothing here
//! runs anything, and every value is one argv word (no shell parses it on the way).

use super::parse::{JOB_FORMAT, STEP_FORMAT};
use super::state::{JobId, StepId};
use super::time::SlurmTime;

/// The batch script of an allocation fleet makes: it holds the GPUs until cancelled or out of
/// time, while the servers run as steps beside it. It is sent on sbatch's stdin.
pub const HOLD_SCRIPT: &str = "#!/bin/sh\n\
# Made by fleet: this job holds the GPUs of fleet's SGLang servers, which run as its steps.\n\
# `fleet down` cancels it.\n\
exec sleep infinity\n";

/// How the allocation's GPUs are laid out: always one task (one server) per GPU, since a
/// step started with `--exact --gres=gpu:1` needs a task of its own to get a GPU of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `--ntasks=N --gpus-per-task=1`: Slurm places the servers where it finds GPUs.
    Spread { servers: u32 },
    /// `--nodes=N --ntasks-per-node=T --gres=gpu:T`: T servers on each of N whole nodes.
    PerNode { nodes: u32, servers_per_node: u32 },
}

/// One allocation that holds the GPUs of a fleet of servers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocationRequest {
    /// `--job-name`, what fleet and the user recognise it by in `squeue`.
    pub name: String,
    pub partition: Option<String>,
    pub shape: Shape,
    /// CPUs for each server (`--cpus-per-task`); Slurm's default (1) when `None`.
    pub cpus_per_task: Option<u32>,
    pub time: SlurmTime,
    /// `--output` of the batch script, a path on the batch node.
    pub output: String,
    /// The user's `sbatch_args` (validated by [`super::spec`] not to contradict fleet's).
    pub extra: Vec<String>,
}

/// `sbatch` for `req`, with [`HOLD_SCRIPT`] to send on its stdin.
///
/// `--no-kill`: a node that fails takes only its own servers, not the whole allocation.
/// `--no-requeue`: a failed allocation ends where fleet sees it, instead of silently pending
/// again with its servers gone.
pub fn sbatch(req: &AllocationRequest) -> Vec<String> {
    let mut argv = vec!["sbatch".to_string(), "--parsable".to_string()];
    argv.extend(req.extra.iter().cloned());
    argv.push(format!("--job-name={}", req.name));
    if let Some(p) = &req.partition {
        argv.push(format!("--partition={p}"));
    }
    match req.shape {
        Shape::Spread { servers } => {
            argv.push(format!("--ntasks={servers}"));
            argv.push("--gpus-per-task=1".into());
        }
        Shape::PerNode {
            nodes,
            servers_per_node,
        } => {
            argv.push(format!("--nodes={nodes}"));
            argv.push(format!("--ntasks-per-node={servers_per_node}"));
            argv.push(format!("--gres=gpu:{servers_per_node}"));
        }
    }
    if let Some(c) = req.cpus_per_task {
        argv.push(format!("--cpus-per-task={c}"));
    }
    argv.push(format!("--time={}", req.time));
    argv.push(format!("--output={}", req.output));
    argv.push("--no-kill".into());
    argv.push("--no-requeue".into());
    argv
}

/// One server as a step of an allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepRequest {
    pub job: JobId,
    /// The node it runs on (`--nodelist`), a name from the allocation's node list.
    pub node: String,
    /// `--job-name` of the step, what `squeue --steps` shows.
    pub name: String,
    pub gpus: u32,
    /// `--cpus-per-task`, as the allocation asked; Slurm's default when `None`.
    pub cpus: Option<u32>,
    /// `--output` (stderr too), a path on the node.
    pub output: String,
    /// The server's command line: the step's own process, so that Slurm tracks it (under
    /// proctrack/cgroup a process that leaves its step dies when the step ends).
    pub argv: Vec<String>,
}

/// `srun` for `step`.
///
/// `--exact` with a task and `--gres=gpu:N` of its own gives each step its own GPUs; steps
/// with `--overlap` would share the allocation's first GPU, and a step without `--exact`
/// would take the whole allocation and block every other step.
pub fn srun(step: &StepRequest) -> Vec<String> {
    let mut argv: Vec<String> = vec![
        "srun".into(),
        format!("--jobid={}", step.job),
        "--exact".into(),
        "--nodes=1".into(),
        "--ntasks=1".into(),
        format!("--gres=gpu:{}", step.gpus),
        format!("--nodelist={}", step.node),
        format!("--job-name={}", step.name),
        format!("--output={}", step.output),
    ];
    if let Some(c) = step.cpus {
        argv.push(format!("--cpus-per-task={c}"));
    }
    argv.push("--".into());
    argv.extend(step.argv.iter().cloned());
    argv
}

/// The `srun` prefix (up to its `--`) of a step that runs beside the servers' steps, sharing
/// their CPUs (`--overlap`) and taking no GPU of theirs: the preflight's `--help`, a detached
/// job. On `node` when given, else where Slurm puts it; named `name` in `squeue --steps`.
pub fn srun_beside(job: JobId, node: Option<&str>, name: Option<&str>) -> Vec<String> {
    let mut argv: Vec<String> = vec![
        "srun".into(),
        format!("--jobid={job}"),
        "--overlap".into(),
        "--nodes=1".into(),
        "--ntasks=1".into(),
    ];
    argv.extend(node.map(|n| format!("--nodelist={n}")));
    argv.extend(name.map(|n| format!("--job-name={n}")));
    argv.push("--".into());
    argv
}

/// `squeue` for one job in any state (it lists ended jobs for `MinJobAge`, 300 s by default).
pub fn squeue_job(job: JobId) -> Vec<String> {
    vec![
        "squeue".into(),
        "--noheader".into(),
        "--states=all".into(),
        format!("--jobs={job}"),
        format!("--format={JOB_FORMAT}"),
    ]
}

/// `squeue` for the caller's jobs named `name` that are not over.
pub fn squeue_named(name: &str) -> Vec<String> {
    vec![
        "squeue".into(),
        "--noheader".into(),
        "--me".into(),
        format!("--name={name}"),
        format!("--format={JOB_FORMAT}"),
    ]
}

/// `squeue --steps` for one job.
pub fn squeue_steps(job: JobId) -> Vec<String> {
    vec![
        "squeue".into(),
        "--noheader".into(),
        "--steps".into(),
        format!("--jobs={job}"),
        format!("--format={STEP_FORMAT}"),
    ]
}

pub fn scontrol_job(job: JobId) -> Vec<String> {
    vec![
        "scontrol".into(),
        "--oneliner".into(),
        "--details".into(),
        "show".into(),
        "job".into(),
        job.to_string(),
    ]
}

/// `scontrol show node` for a hostlist (`n[1-2]`, or one name).
pub fn scontrol_nodes(hostlist: &str) -> Vec<String> {
    vec![
        "scontrol".into(),
        "--oneliner".into(),
        "show".into(),
        "node".into(),
        hostlist.into(),
    ]
}

pub fn scontrol_hostnames(hostlist: &str) -> Vec<String> {
    vec![
        "scontrol".into(),
        "show".into(),
        "hostnames".into(),
        hostlist.into(),
    ]
}

pub fn scancel_job(job: JobId) -> Vec<String> {
    vec!["scancel".into(), job.to_string()]
}

pub fn scancel_step(step: StepId) -> Vec<String> {
    vec!["scancel".into(), step.to_string()]
}

/// Sends `signal` (`INT`, ...) to the step's tasks; the step goes on unless they end.
pub fn scancel_signal(step: StepId, signal: &str) -> Vec<String> {
    vec![
        "scancel".into(),
        format!("--signal={signal}"),
        step.to_string(),
    ]
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::slurm::state::Step;

    fn words(argv: &[String]) -> Vec<&str> {
        argv.iter().map(String::as_str).collect()
    }

    #[test]
    fn an_allocation_of_one_task_per_server_on_whole_nodes() {
        let req = AllocationRequest {
            name: "fleet-hpc".into(),
            partition: Some("gpu".into()),
            shape: Shape::PerNode {
                nodes: 2,
                servers_per_node: 8,
            },
            cpus_per_task: Some(4),
            time: SlurmTime::Limited(Duration::from_secs(2 * 86_400)),
            output: "/home/me/.fleet/slurm/%j.out".into(),
            extra: vec!["--account=ml".into(), "--qos".into(), "normal".into()],
        };
        assert_eq!(
            words(&sbatch(&req)),
            [
                "sbatch",
                "--parsable",
                "--account=ml",
                "--qos",
                "normal",
                "--job-name=fleet-hpc",
                "--partition=gpu",
                "--nodes=2",
                "--ntasks-per-node=8",
                "--gres=gpu:8",
                "--cpus-per-task=4",
                "--time=2-00:00:00",
                "--output=/home/me/.fleet/slurm/%j.out",
                "--no-kill",
                "--no-requeue",
            ]
        );
    }

    #[test]
    fn a_spread_allocation_lets_slurm_place_the_gpus() {
        let req = AllocationRequest {
            name: "fleet-x".into(),
            partition: None,
            shape: Shape::Spread { servers: 12 },
            cpus_per_task: None,
            time: SlurmTime::Unlimited,
            output: "/tmp/o".into(),
            extra: vec![],
        };
        let argv = sbatch(&req);
        assert!(argv.contains(&"--ntasks=12".to_string()), "{argv:?}");
        assert!(argv.contains(&"--gpus-per-task=1".to_string()), "{argv:?}");
        assert!(argv.contains(&"--time=UNLIMITED".to_string()), "{argv:?}");
        assert!(
            !argv.iter().any(|a| a.starts_with("--partition")),
            "{argv:?}"
        );
        assert!(HOLD_SCRIPT.starts_with("#!/bin/sh\n"));
    }

    #[test]
    fn a_step_is_the_server_itself_with_its_own_gpu() {
        let step = StepRequest {
            job: JobId(42),
            node: "gpu-07".into(),
            name: "fleet-hpc-3".into(),
            gpus: 1,
            cpus: None,
            output: "/scratch/fleet/3.log".into(),
            argv: ["python", "-m", "sglang.launch_server", "--host", "10.0.0.7"]
                .map(String::from)
                .into(),
        };
        assert_eq!(
            words(&srun(&step)),
            [
                "srun",
                "--jobid=42",
                "--exact",
                "--nodes=1",
                "--ntasks=1",
                "--gres=gpu:1",
                "--nodelist=gpu-07",
                "--job-name=fleet-hpc-3",
                "--output=/scratch/fleet/3.log",
                "--",
                "python",
                "-m",
                "sglang.launch_server",
                "--host",
                "10.0.0.7",
            ]
        );
        assert!(!srun(&step).iter().any(|a| a == "--overlap"));
    }

    #[test]
    fn a_step_beside_the_servers_overlaps_and_takes_no_gpu() {
        let prefix = ["srun", "--jobid=42", "--overlap", "--nodes=1", "--ntasks=1"];
        assert_eq!(
            words(&srun_beside(JobId(42), Some("gpu-07"), None)),
            [&prefix[..], &["--nodelist=gpu-07", "--"]].concat()
        );
        let job = srun_beside(JobId(42), None, Some("fleet-job-x"));
        assert_eq!(
            words(&job),
            [&prefix[..], &["--job-name=fleet-job-x", "--"]].concat()
        );
        assert!(!job.iter().any(|a| a.starts_with("--gres")));
    }

    #[test]
    fn queries_and_cancels() {
        assert_eq!(
            words(&squeue_job(JobId(7))),
            [
                "squeue",
                "--noheader",
                "--states=all",
                "--jobs=7",
                "--format=%i|%T|%r|%L|%D|%N|%j"
            ]
        );
        assert_eq!(
            words(&squeue_steps(JobId(7))),
            [
                "squeue",
                "--noheader",
                "--steps",
                "--jobs=7",
                "--format=%i|%N|%j"
            ]
        );
        assert_eq!(
            words(&scontrol_nodes("n[1-2]")),
            ["scontrol", "--oneliner", "show", "node", "n[1-2]"]
        );
        let step = StepId {
            job: JobId(7),
            step: Step::Numbered(3),
        };
        assert_eq!(words(&scancel_step(step)), ["scancel", "7.3"]);
        assert_eq!(
            words(&scancel_signal(step, "INT")),
            ["scancel", "--signal=INT", "7.3"]
        );
        assert_eq!(words(&scancel_job(JobId(7))), ["scancel", "7"]);
    }
}
