//! The parsers on output captured from the test cluster (Slurm 22.05, tests/fixtures/slurm).

use std::time::Duration;

use super::*;
use crate::slurm::state::Step;

macro_rules! fixture {
    ($name:literal) => {
        include_str!(concat!("../../tests/fixtures/slurm/", $name))
    };
}

#[test]
fn sbatch_prints_the_job_id() {
    assert_eq!(submitted(fixture!("sbatch_parsable.txt")), Ok(JobId(1)));
    assert_eq!(submitted("123;cluster2\n"), Ok(JobId(123)));
    assert_eq!(submitted("\n").unwrap_err().problem, Problem::Empty);
    assert!(matches!(
        submitted("Submitted batch job 5\n").unwrap_err().problem,
        Problem::Value { what: "job id", .. }
    ));
}

#[test]
fn a_pending_job_and_its_reason() {
    let jobs = jobs(fixture!("squeue_job_pending.txt")).unwrap();
    assert_eq!(
        jobs,
        [JobStatus {
            id: JobId(3),
            state: JobState::Pending,
            reason: Reason(Some("Resources".into())),
            time_left: Some(SlurmTime::Limited(Duration::from_secs(600))),
            node_count: 1,
            nodes: String::new(),
            name: "fleet-wait".into(),
        }]
    );
}

#[test]
fn ended_and_running_jobs() {
    let jobs = jobs(fixture!("squeue_jobs_cancelled_and_running.txt")).unwrap();
    assert_eq!(jobs.len(), 2);
    assert_eq!(jobs[0].state, JobState::Cancelled);
    assert_eq!(jobs[0].name, "blocker");
    assert_eq!(jobs[1].state, JobState::Running);
    assert_eq!(jobs[1].reason, Reason(None));
    assert_eq!(jobs[1].nodes, "s24001n[1-2]");
    assert_eq!(
        jobs[1].time_left,
        Some(SlurmTime::Limited(Duration::from_secs(2 * 86_400)))
    );
    // After a node died the job (--no-kill) runs on, on the node that is left.
    let after = super::jobs(fixture!("squeue_job_after_node_down.txt")).unwrap();
    assert_eq!(
        (after[0].node_count, after[0].nodes.as_str()),
        (1, "s24001n1")
    );
    assert_eq!(after[0].state, JobState::Running);
}

#[test]
fn time_left_past_the_limit_and_unset() {
    let jobs =
        jobs("4|COMPLETING|TimeLimit|INVALID|1|n1|x\n5|PENDING|None|NOT_SET|1||y|z\n").unwrap();
    assert_eq!(jobs[0].time_left, Some(SlurmTime::Limited(Duration::ZERO)));
    assert_eq!(jobs[1].time_left, None);
    assert_eq!(jobs[1].name, "y|z");
    let bad = super::jobs("4|RUNNING|None\n").unwrap_err();
    assert_eq!(
        bad.problem,
        Problem::Fields {
            expected: 7,
            found: 3
        }
    );
    let bad = super::jobs("4|RUNNING|None|soon|1|n1|x\n").unwrap_err();
    assert!(
        bad.to_string().contains("`soon` is not a time left"),
        "{bad}"
    );
}

#[test]
fn the_steps_of_a_job() {
    let steps = steps(fixture!("squeue_steps.txt")).unwrap();
    assert_eq!(steps.len(), 5);
    assert_eq!(
        steps[0],
        StepStatus {
            id: StepId {
                job: JobId(2),
                step: Step::Numbered(0)
            },
            nodes: "s24001n2".into(),
            name: "fleet-hpc-s24001n2-0".into(),
        }
    );
    assert_eq!(steps[4].id.step, Step::Batch);
    assert_eq!(steps[4].name, "batch");
}

#[test]
fn nodes_and_their_addresses() {
    let nodes = nodes(fixture!("scontrol_show_node_idle.txt")).unwrap();
    assert_eq!(nodes.len(), 2);
    assert_eq!(nodes[0].name, "s24001n1");
    assert_eq!(nodes[0].addr, "127.0.0.2");
    assert_eq!(nodes[1].addr, "127.0.0.3");
    assert_eq!(nodes[0].hostname, "vm");
    assert_eq!(nodes[0].gres.as_deref(), Some("gpu:8"));
    assert_eq!(nodes[0].state.base, "IDLE");
    assert_eq!(nodes[0].reason, None);
    let mixed = super::nodes(fixture!("scontrol_show_node_mixed.txt")).unwrap();
    assert!(mixed.iter().all(|n| n.state.base == "MIXED"));
}

#[test]
fn a_node_that_went_down() {
    let nodes = nodes(fixture!("scontrol_show_node_down.txt")).unwrap();
    let down = &nodes[1];
    assert!(down.state.is_down(), "{:?}", down.state);
    assert!(down.state.has("NOT_RESPONDING"));
    let reason = down.reason.as_deref().unwrap();
    assert!(reason.starts_with("Not responding ["), "{reason}");
    assert!(!nodes[0].state.is_down());
}

#[test]
fn job_records_pending_and_running() {
    let pending = job_record(fixture!("scontrol_show_job_pending.txt")).unwrap();
    assert_eq!(pending.id, JobId(3));
    assert_eq!(pending.state, JobState::Pending);
    assert_eq!(pending.reason, Reason(Some("Resources".into())));
    assert_eq!(pending.nodes, None);
    assert_eq!(pending.user, "root");
    assert!(pending.allocated.is_empty());

    let running = job_record(fixture!("scontrol_show_job_running.txt")).unwrap();
    assert_eq!(running.name, "fleet-hpc");
    assert_eq!(running.partition.as_deref(), Some("gpu"));
    assert_eq!(running.nodes.as_deref(), Some("s24001n[1-2]"));
    assert_eq!(running.batch_host.as_deref(), Some("s24001n1"));
    assert_eq!(running.tasks, 16);
    assert_eq!(
        running.time_limit,
        Some(SlurmTime::Limited(Duration::from_secs(2 * 86_400)))
    );
    assert_eq!(
        running.allocated,
        [("s24001n[1-2]".to_string(), "gpu:8(IDX:0-7)".to_string())]
    );
    assert_eq!(job_record("").unwrap_err().problem, Problem::Empty);
    assert_eq!(
        job_record("JobName=x\n").unwrap_err().problem,
        Problem::MissingKey { key: "JobId" }
    );
}

#[test]
fn records_keep_values_with_spaces_and_equals() {
    let r = Record::parse(
        "A=1 OS=Linux 6.1 #1 SMP TRES=cpu=16,node=2 Reason=Not responding [root@2026-01-01T00:00:00]",
    );
    assert_eq!(r.get("OS"), Some("Linux 6.1 #1 SMP"));
    assert_eq!(r.get("TRES"), Some("cpu=16,node=2"));
    assert_eq!(
        r.get("Reason"),
        Some("Not responding [root@2026-01-01T00:00:00]")
    );
}

#[test]
fn hostnames_one_a_line() {
    assert_eq!(
        hostnames(fixture!("scontrol_show_hostnames.txt")),
        ["s24001n1", "s24001n2"]
    );
}
