//! A long job rides out the network, through the real binary, real sshd and the fake `pct`
//! (each container with its own `/tmp`), with sims bound to each host's own loopback address: a
//! connection cut mid-run, sshd away and back, a host lost for good, everything down past
//! `--stall-timeout` then `--resume`, and `down`/`status` with a host unreachable. Each job ends
//! with every prompt exactly once and nothing failed for the fleet's reasons.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::generate::{assert_exactly_once, failures, progress, retries, write_prompts};
use common::watch::Watch;
use common::world::World;
use serde_json::Value;

/// `n` hosts with two simulated GPUs each, their servers up.
struct Fleet {
    world: World,
    dir: tempfile::TempDir,
}

impl Fleet {
    fn up(n: usize) -> Fleet {
        let world = World::new(n);
        world.up_sims(2, &["max_running_requests: 16"], 20);
        Fleet {
            world,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        self.world.fleet(args)
    }

    fn fleet(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    fn prompts(&self, n: usize) -> PathBuf {
        let p = self.dir.path().join("prompts.jsonl");
        write_prompts(&p, n);
        p
    }

    fn out(&self) -> PathBuf {
        self.dir.path().join("out")
    }

    /// `fleet generate` over every instance, in the background.
    fn generate(&self, prompts: &Path, extra: &[&str]) -> Child {
        self.generate_command(prompts, extra).spawn().unwrap()
    }

    /// The `fleet generate` that [`Fleet::generate`] starts.
    fn generate_command(&self, prompts: &Path, extra: &[&str]) -> Command {
        let mut args = vec![
            "generate".to_string(),
            "--prompts".into(),
            prompts.display().to_string(),
            "--out".into(),
            self.out().display().to_string(),
            "--max-tokens".into(),
            "48".into(),
            "--warmup".into(),
            "0s".into(),
            "-q".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut command = self.command(&argv);
        command.stdout(Stdio::null()).stderr(Stdio::piped());
        command
    }

    /// Waits until the job has written `fraction` of its `total` prompts.
    fn wait_for(&self, total: u64, fraction: f64) {
        let t0 = Instant::now();
        loop {
            let done = std::fs::read_to_string(self.out().join("progress.json"))
                .ok()
                .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                .and_then(|p| p["completed"].as_u64())
                .unwrap_or(0);
            if done as f64 >= fraction * total as f64 {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "the job made no progress"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The pids of host `i`'s servers, from `fleet status`.
    fn server_pids(&self, host: &str) -> Vec<u32> {
        let o = self.fleet(&["status", "--json"]);
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .filter(|s| s["host"] == host)
            .map(|s| s["pid"].as_u64().unwrap() as u32)
            .collect()
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        // A host a failed test left stopped comes back, so that no server outlives the test.
        for h in &mut self.world.hosts {
            if !h.sshd.is_running() {
                h.sshd.restart();
            }
        }
        let _ = self.fleet(&["down", "--grace", "2s"]);
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn finished(child: Child) -> (Option<i32>, String) {
    let o = child.wait_with_output().unwrap();
    (o.status.code(), stderr(&o))
}

/// Nothing was written as failed, or left for a retry, because of the outage.
fn nothing_failed(out: &Path) {
    assert!(failures(out).is_empty(), "{:?}", failures(out));
    assert!(retries(out).is_empty(), "{:?}", retries(out));
}

#[test]
fn a_connection_cut_mid_run_is_rebuilt_and_loses_nothing() {
    let f = Fleet::up(2);
    let prompts = f.prompts(3000);
    let job = f.generate(&prompts, &[]);
    f.wait_for(3000, 0.2);
    let killed = f.world.hosts[0].sshd.kill_sessions();
    assert!(
        killed > 0,
        "fleet's connection to the first host was served"
    );
    let (code, stderr) = finished(job);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("host ct200 lost"), "{stderr}");
    assert!(stderr.contains("host ct200 is back"), "{stderr}");
    assert_exactly_once(&f.out(), 3000);
    nothing_failed(&f.out());
    assert_eq!(progress(&f.out())["status"], "done");
}

#[test]
fn sshd_away_pauses_the_job_through_failed_redials_and_it_goes_on_by_itself() {
    let mut f = Fleet::up(1);
    let prompts = f.prompts(2000);
    // The redials are debug lines: they say when the job has been through some.
    let mut job = f
        .generate_command(&prompts, &[])
        .env("FLEET_LOG", "warn,fleet::remote=debug")
        .spawn()
        .unwrap();
    let watch = Watch::stderr(&mut job);
    f.wait_for(2000, 0.1);
    f.world.hosts[0].sshd.stop();
    // While it is away the job says it is paused, and why.
    let t0 = Instant::now();
    loop {
        if progress(&f.out())["status"] == "paused" {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "never paused");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Redialing fails again and again while it is away, and the job stays paused through it,
    // neither failing nor ending. How long a pause may last is the core's (its stall timeout,
    // on fake time in its unit tests).
    for redials in 1..=3 {
        watch.wait_for("reconnect attempt", redials, Duration::from_secs(60));
        assert_eq!(
            progress(&f.out())["status"],
            "paused",
            "the job left its pause while the host was away"
        );
        assert!(
            job.try_wait().unwrap().is_none(),
            "the job ended while paused"
        );
    }
    f.world.hosts[0].sshd.restart();
    let code = job.wait().unwrap().code();
    let stderr = watch.finish();
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("paused: no instance is healthy"),
        "{stderr}"
    );
    assert_exactly_once(&f.out(), 2000);
    nothing_failed(&f.out());
}

#[test]
fn a_host_lost_for_good_leaves_its_work_to_the_other() {
    let mut f = Fleet::up(2);
    let lost = f.server_pids("ct201");
    assert_eq!(lost.len(), 2);
    let prompts = f.prompts(3000);
    let job = f.generate(&prompts, &[]);
    f.wait_for(3000, 0.2);
    // The host goes away: its sshd, and its servers with it.
    f.world.hosts[1].sshd.stop();
    for pid in lost {
        // SAFETY: kill(2) on a pid this test read from fleet's records.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    let (code, stderr) = finished(job);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("host ct201 lost"), "{stderr}");
    assert_exactly_once(&f.out(), 3000);
    nothing_failed(&f.out());
}

#[test]
fn everything_down_past_the_stall_timeout_interrupts_and_resume_finishes() {
    let mut f = Fleet::up(1);
    let prompts = f.prompts(2000);
    let job = f.generate(&prompts, &["--stall-timeout", "3s"]);
    f.wait_for(2000, 0.1);
    f.world.hosts[0].sshd.stop();
    let (code, stderr) = finished(job);
    assert_eq!(code, Some(130), "{stderr}");
    assert!(stderr.contains("--stall-timeout (3s)"), "{stderr}");
    assert_eq!(progress(&f.out())["status"], "interrupted");
    nothing_failed(&f.out());
    f.world.hosts[0].sshd.restart();
    let job = f.generate(&prompts, &["--resume"]);
    let (code, stderr) = finished(job);
    assert_eq!(code, Some(0), "{stderr}");
    assert_exactly_once(&f.out(), 2000);
    nothing_failed(&f.out());
}

#[test]
fn down_and_status_with_a_host_unreachable_do_what_they_can_and_say_so() {
    let mut f = Fleet::up(2);
    f.world.hosts[1].sshd.stop();
    let o = f.fleet(&["status", "--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("ct201"), "{}", stderr(&o));
    let rows: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        rows.as_array()
            .unwrap()
            .iter()
            .all(|r| r["host"] == "ct200"),
        "the reachable host is reported: {rows}"
    );
    let o = f.fleet(&["down", "--grace", "2s", "--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("ct201"), "{}", stderr(&o));
    let stopped: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(stopped.as_array().unwrap().len(), 2, "{stopped}");
    // Back: a second down stops the rest.
    f.world.hosts[1].sshd.restart();
    let o = f.fleet(&["down", "--grace", "2s", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let stopped: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        stopped
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["host"] == "ct201" && r["state"] == "stopped"),
        "{stopped}"
    );
    assert_eq!(stopped.as_array().unwrap().len(), 2);
}
