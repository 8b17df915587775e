//! `fleet generate --detach` on a Slurm host, through the real binary on the test cluster
//! (tests/common/slurm.rs) with `sglang-sim` as server: the job runs as one more step of the
//! servers' allocation, `jobs` and `progress` follow it, `stop` ends it as Ctrl-C would (SIGINT
//! to the step's task through scancel), and a detached `--resume` then `fetch` give every
//! prompt once.

mod common;

use std::time::Duration;

use common::local_fleet::completion_ids;
use common::reserve_ports;
use common::slurm::{Options, SlurmCluster};
use common::slurm_fleet::{SlurmFleet, allocation, wait_until, write_prompts};
use serde_json::Value;

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// The names of the allocation's steps that run.
fn steps(f: &SlurmFleet, job: &str) -> Vec<String> {
    f.cluster
        .run(&[
            "squeue",
            "--steps",
            "--noheader",
            &format!("--jobs={job}"),
            "--format=%j",
        ])
        .lines()
        .map(|l| l.trim().to_string())
        .collect()
}

fn progress(f: &SlurmFleet, id: &str) -> Value {
    json(&f.ok(&["--json", "progress", id]))
}

#[test]
fn a_detached_job_is_a_step_of_the_allocation_stops_through_srun_and_resumes_exactly_once() {
    let cluster = SlurmCluster::start(Options::default());
    let ports = reserve_ports(2);
    let f = SlurmFleet::new(cluster, &allocation(2, 30), ports.base);
    f.ok(&["-q", "up", "--profile", "sim"]);
    let jobs = f.fleet_jobs();
    let (job, _) = jobs.split_once(' ').expect("fleet's job in squeue");

    let prompts = f.path().join("prompts.jsonl");
    write_prompts(&prompts, 4000);
    let out = f.path().join("job-out").display().to_string();
    let detach = |extra: &[&str]| -> String {
        let mut args = vec![
            "--json",
            "generate",
            "--detach",
            "--prompts",
            prompts.to_str().unwrap(),
            "--out",
            &out,
            // Long answers: the job runs for some 20 s, long enough to be stopped midway.
            "--max-tokens",
            "1000",
            "--warmup",
            "0s",
        ];
        args.extend_from_slice(extra);
        let started = json(&f.ok(&args));
        assert_eq!(started["host"], "hpc", "{started}");
        started["job"].as_str().unwrap().to_string()
    };
    let id = detach(&[]);

    // One more step of fleet's allocation, named for the job, with the generate inside it.
    let name = format!("fleet-job-{id}");
    wait_until("the job's step", || steps(&f, job).contains(&name));
    let generate: Vec<_> = f
        .cluster
        .job_processes()
        .into_iter()
        .filter(|p| p.program() == "fleet" && p.cmdline.iter().any(|a| a == "generate"))
        .collect();
    assert_eq!(generate.len(), 1, "{generate:?}");
    assert_eq!(generate[0].env["SLURM_JOB_ID"], job);
    assert!(
        generate[0].env.contains_key("SLURM_STEP_ID"),
        "{generate:?}"
    );

    let listed = json(&f.ok(&["--json", "jobs"]));
    let row = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["record"]["id"] == id.as_str())
        .unwrap_or_else(|| panic!("no {id} in {listed}"));
    assert_eq!(row["alive"], true, "{row}");
    wait_until("200 completed", || {
        progress(&f, &id)["completed"].as_u64().unwrap_or(0) >= 200
    });

    // stop: SIGINT reaches the step's task, and the job winds down as on Ctrl-C; its step ends.
    let stopped = json(&f.ok(&["--json", "stop", &id, "--wait", "60s"]));
    assert_eq!(stopped["state"], "interrupted", "{stopped}");
    let done = stopped["progress"]["completed"].as_u64().unwrap();
    assert!(
        done < 4000,
        "the job ended before it was stopped: {stopped}"
    );
    wait_until("the job's step gone", || !steps(&f, job).contains(&name));

    // A detached resume, a step again, finishes the rest; fetch gives every prompt once.
    assert_eq!(detach(&["--resume"]), id, "a resumed job keeps its id");
    let t0 = std::time::Instant::now();
    while progress(&f, &id)["status"] != "done" {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "{}",
            progress(&f, &id)
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let here = f.path().join("fetched");
    f.ok(&["fetch", &id, here.to_str().unwrap()]);
    assert_eq!(completion_ids(&here).len(), 4000);

    f.ok(&["-q", "down", "--grace", "5s"]);
    assert_eq!(f.fleet_jobs(), "");
}
