//! Detached jobs through the real binary, real sshd and the fake `pct`, whose container has a
//! `/tmp` of its own and no `fleet` on its PATH (so the running executable is uploaded): the job
//! outlives every SSH connection, `fetch` gives every prompt once, `stop` then a detached
//! `--resume` finishes it, one job per output directory, and dead or unknown jobs are reported.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use common::generate::{assert_exactly_once, write_prompts};
use common::world::World;
use serde_json::Value;

struct Fleet {
    world: World,
    dir: tempfile::TempDir,
}

impl Fleet {
    fn up() -> Fleet {
        let world = World::new(1);
        world.up_sims(2, &["max_running_requests: 16"], 10);
        Fleet {
            world,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn fleet(&self, args: &[&str]) -> Output {
        self.world.fleet(args).output().unwrap()
    }

    fn json(&self, args: &[&str]) -> (Option<i32>, Value, String) {
        let mut all = args.to_vec();
        all.push("--json");
        let o = self.fleet(&all);
        let v = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
        (o.status.code(), v, text(&o.stderr))
    }

    fn prompts(&self, name: &str, n: usize) -> PathBuf {
        let p = self.dir.path().join(name);
        write_prompts(&p, n);
        p
    }

    /// `generate --detach`; returns the job's id.
    fn detach(&self, prompts: &Path, out: &str, extra: &[&str]) -> String {
        let p = prompts.display().to_string();
        let mut args = vec![
            "generate",
            "--detach",
            "--prompts",
            &p,
            "--out",
            out,
            "--max-tokens",
            "48",
            "--warmup",
            "0s",
        ];
        args.extend_from_slice(extra);
        let (code, v, stderr) = self.json(&args);
        assert_eq!(code, Some(0), "{stderr}");
        assert_eq!(v["host"], "ct200");
        assert_eq!(v["out"], out);
        v["job"].as_str().unwrap().to_string()
    }

    /// Polls `fleet progress JOB --json` until its status is `want`.
    fn wait_status(&self, job: &str, want: &str) -> Value {
        let t0 = Instant::now();
        loop {
            let (_, p, _) = self.json(&["progress", job]);
            if p["status"] == want {
                return p;
            }
            assert!(t0.elapsed() < Duration::from_secs(120), "{job}: {p}");
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    fn wait_completed(&self, job: &str, n: u64) {
        let t0 = Instant::now();
        loop {
            let (_, p, _) = self.json(&["progress", job]);
            if p["completed"].as_u64().unwrap_or(0) >= n {
                return;
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "{job}: {p}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn job(&self, id: &str) -> Value {
        let (_, jobs, stderr) = self.json(&["jobs"]);
        jobs.as_array()
            .unwrap_or_else(|| panic!("{stderr}"))
            .iter()
            .find(|j| j["record"]["id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("no {id} in {jobs}"))
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if !self.world.hosts[0].sshd.is_running() {
            self.world.hosts[0].sshd.restart();
        }
        let _ = self.fleet(&["down", "--grace", "2s"]);
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn kill(pid: u64) {
    // SAFETY: kill(2) with a pid this test read from the job's record.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
}

#[test]
fn a_detached_job_outlives_every_connection_and_fetch_gives_every_prompt_once() {
    let f = Fleet::up();
    let prompts = f.prompts("prompts.jsonl", 3000);
    let job = f.detach(&prompts, "/tmp/job1", &[]);
    // No fleet on the container's PATH: the running executable went into the job directory.
    let record = f.job(&job)["record"].clone();
    assert_eq!(
        record["binary"],
        format!("{}/fleet", record["dir"].as_str().unwrap())
    );
    assert!(
        record["dir"]
            .as_str()
            .unwrap()
            .starts_with("/tmp/fleet/jobs/")
    );
    // Every SSH connection cut, with one surely open (a command still running on the host):
    // the job runs on, beside its servers.
    f.wait_completed(&job, 100);
    let mut holder = f
        .world
        .fleet(&["exec", "--", "sleep", "60"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while f.world.hosts[0].sshd.kill_sessions() == 0 {
        if let Some(status) = holder.try_wait().unwrap() {
            let mut why = String::new();
            let _ = std::io::Read::read_to_string(holder.stderr.as_mut().unwrap(), &mut why);
            panic!("fleet exec ended before its connection was cut ({status}): {why}");
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "fleet exec never connected"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = holder.kill();
    let _ = holder.wait();
    let done = f.wait_status(&job, "done");
    assert_eq!(
        (done["completed"].as_u64(), done["failed"].as_u64()),
        (Some(3000), Some(0))
    );
    let here = f.dir.path().join("fetched");
    let o = f.fleet(&["fetch", &job, here.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_exactly_once(&here, 3000);
    // Again: nothing new to copy.
    let o = f.fleet(&["fetch", &job, here.to_str().unwrap()]);
    assert!(
        text(&o.stderr).contains("0 files copied"),
        "{}",
        text(&o.stderr)
    );
    assert_exactly_once(&here, 3000);
    // The output is in the container's own /tmp, not this machine's.
    assert!(
        f.world
            .container_path(0, "/tmp/job1/progress.json")
            .exists()
    );
    assert!(!Path::new("/tmp/job1/progress.json").exists());
    let o = f.fleet(&["logs", &job, "-n", "5"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
}

#[test]
fn stop_then_a_detached_resume_finishes_exactly_once_and_one_job_per_out() {
    let f = Fleet::up();
    let prompts = f.prompts("prompts.jsonl", 4000);
    let job = f.detach(&prompts, "/tmp/job2", &[]);
    f.wait_completed(&job, 200);
    // A second job on the same directory is refused while the first runs.
    let p = prompts.display().to_string();
    let o = f.fleet(&[
        "generate",
        "--detach",
        "--prompts",
        &p,
        "--out",
        "/tmp/job2",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains(&format!("job {job}"))
            && text(&o.stderr).contains("is running on /tmp/job2"),
        "{}",
        text(&o.stderr)
    );
    let (code, stopped, stderr) = f.json(&["stop", &job]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stopped["state"], "interrupted", "{stopped}");
    let again = f.detach(&prompts, "/tmp/job2", &["--resume"]);
    assert_eq!(again, job, "a resumed job keeps its id");
    f.wait_status(&job, "done");
    let here = f.dir.path().join("fetched");
    let o = f.fleet(&["fetch", &job, here.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_exactly_once(&here, 4000);
}

#[test]
fn dead_unknown_and_unreachable_jobs_are_reported_not_hidden() {
    let mut f = Fleet::up();
    let prompts = f.prompts("prompts.jsonl", 20_000);
    let job = f.detach(&prompts, "/tmp/job3", &[]);
    f.wait_completed(&job, 50);
    let pid = f.job(&job)["record"]["pid"].as_u64().unwrap();
    // Its only host unreachable: jobs fails, naming it, and the job runs on.
    f.world.hosts[0].sshd.stop();
    let o = f.fleet(&["jobs"]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("ct200"), "{}", text(&o.stderr));
    assert!(
        Path::new(&format!("/proc/{pid}")).exists(),
        "the job runs on"
    );
    f.world.hosts[0].sshd.restart();
    // Killed without finishing: dead, with its log's tail.
    kill(pid);
    let t0 = Instant::now();
    let dead = loop {
        let j = f.job(&job);
        if j["state"] == "dead" {
            break j;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "{j}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(dead["log_tail"].is_string(), "{dead}");
    let o = f.fleet(&["jobs"]);
    assert!(
        text(&o.stderr).contains("dead; its log ends"),
        "{}",
        text(&o.stderr)
    );
    // An id nobody has.
    let o = f.fleet(&["progress", "20990101-000000-beef"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("no job 20990101-000000-beef"),
        "{}",
        text(&o.stderr)
    );
}
