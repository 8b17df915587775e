//! A host's jobs through its transport: starting one detached, reading their records, progress
//! and liveness, finding one by id across hosts, and stopping one as Ctrl-C would.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{JobError, JobRecord, JobView};
use crate::generate::progress::{PROGRESS_FILE, Progress, Status};
use crate::launch::backend::JobStop;
use crate::launch::backend::machine::proc;
use crate::launch::state::{self, run_ok};
use crate::remote::{Detached, Transport, argv};

/// Jobs live under the run root, beside the servers' records.
pub const JOBS_DIR: &str = "jobs";
const RECORD: &str = "job.json";
const LOG: &str = "job.log";
const PIDFILE: &str = "job.pid";
/// Lines of a dead job's log shown with it.
const LOG_TAIL: usize = 20;

pub fn job_dir(run_root: &str, id: &str) -> String {
    format!("{run_root}/{JOBS_DIR}/{id}")
}

pub fn log_path(record: &JobRecord) -> String {
    format!("{}/{LOG}", record.dir)
}

/// What to start as a job.
#[derive(Debug, Clone)]
pub struct JobSpec {
    pub id: String,
    /// Its output directory on the target.
    pub out: String,
    /// Its prompt file on the target.
    pub prompts: String,
    /// The `fleet` it runs.
    pub binary: String,
    /// Its command line: `fleet generate ...`, or that behind what runs it where the servers
    /// run (`srun ... --`).
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// How `fleet stop` reaches it.
    pub stop: JobStop,
}

/// Starts `spec` detached in its job directory under `run_root`, and records it.
pub async fn start(
    t: &dyn Transport,
    run_root: &str,
    spec: JobSpec,
) -> Result<JobRecord, JobError> {
    let dir = job_dir(run_root, &spec.id);
    let pid = t
        .spawn_detached(&Detached {
            argv: spec.argv.clone(),
            env: spec.env,
            log: format!("{dir}/{LOG}"),
            pidfile: format!("{dir}/{PIDFILE}"),
        })
        .await?;
    let start_ticks = proc::proc_stat(t, pid).await?.map_or(0, |p| p.start_ticks);
    let record = JobRecord {
        id: spec.id,
        host: t.host().to_string(),
        out: spec.out,
        prompts: spec.prompts,
        dir: dir.clone(),
        pid,
        start_ticks,
        started_unix: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        binary: spec.binary,
        argv: crate::sglang::flags::masked(&spec.argv),
        stop: spec.stop,
    };
    let json = serde_json::to_string(&record).expect("a job record serializes");
    let script = r#"printf '%s\n' "$1" > "$2.tmp" && mv -f "$2.tmp" "$2""#;
    let path = format!("{dir}/{RECORD}");
    run_ok(t, &argv(&["sh", "-c", script, "sh", &json, &path])).await?;
    Ok(record)
}

/// How long a new job is watched for an immediate failure, and how often.
const SETTLE: Duration = Duration::from_secs(3);
const SETTLE_POLL: Duration = Duration::from_millis(200);

/// Watches the job `id` just started until it writes progress, or [`SETTLE`] passes. A job that
/// cannot start (its `--out` locked, a bad flag) dies at once: that is an error with its log.
pub async fn settle(t: &dyn Transport, run_root: &str, id: &str) -> Result<(), JobError> {
    let deadline = tokio::time::Instant::now() + SETTLE;
    loop {
        let view = list(t, run_root)
            .await?
            .into_iter()
            .find(|v| v.record.id == id);
        match view {
            Some(v) if !v.alive && v.state == "dead" => {
                return Err(JobError::Died {
                    host: t.host().to_string(),
                    log_tail: v.log_tail.unwrap_or_default(),
                });
            }
            Some(v) if v.progress.is_some() || tokio::time::Instant::now() >= deadline => {
                return Ok(());
            }
            _ => tokio::time::sleep(SETTLE_POLL).await,
        }
    }
}

/// Every job recorded on the host, newest first, with its progress and whether it still runs.
pub async fn list(t: &dyn Transport, run_root: &str) -> Result<Vec<JobView>, JobError> {
    let script =
        r#"for f in "$1"/jobs/*/job.json; do [ -f "$f" ] && cat "$f" && printf '\000'; done; true"#;
    let root = run_root.to_string();
    let text = run_ok(t, &argv(&["sh", "-c", script, "sh", &root])).await?;
    let records: Vec<JobRecord> = text
        .split('\0')
        .filter(|s| !s.trim().is_empty())
        .filter_map(|item| match serde_json::from_str(item) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!("{}: skipping an unreadable job record: {e}", t.host());
                None
            }
        })
        .collect();
    let views = records.into_iter().map(|r| view(t, r));
    let mut views: Vec<JobView> = futures::future::try_join_all(views).await?;
    views.sort_by_key(|v| std::cmp::Reverse(v.record.started_unix));
    Ok(views)
}

/// A job's progress (from its output directory) and liveness.
async fn view(t: &dyn Transport, record: JobRecord) -> Result<JobView, JobError> {
    let path = format!("{}/{PROGRESS_FILE}", record.out);
    let out = t.run(&argv(&["cat", "--", &path])).await?;
    let progress: Option<Progress> = out
        .success()
        .then(|| serde_json::from_slice(&out.stdout).ok())
        .flatten();
    let alive = proc::proc_stat(t, record.pid)
        .await?
        .is_some_and(|p| p.running() && p.start_ticks == record.start_ticks);
    let finished = progress.as_ref().is_some_and(|p| {
        matches!(
            p.status,
            Status::Done | Status::Failed | Status::Interrupted
        )
    });
    let state = match (&progress, alive) {
        (Some(p), _) if finished || alive => p.status.as_str().to_string(),
        (None, true) => "starting".to_string(),
        _ => "dead".to_string(),
    };
    let log_tail = if state == "dead" {
        Some(state::tail(t, &log_path(&record), LOG_TAIL).await?)
    } else {
        None
    };
    Ok(JobView {
        record,
        state,
        alive,
        progress,
        log_tail,
    })
}

/// The job `id` on whichever host has it. Hosts that cannot be asked are skipped (and said so
/// by the caller's connection errors).
pub async fn find(
    transports: &BTreeMap<String, Arc<dyn Transport>>,
    run_root: &str,
    id: &str,
) -> Result<(Arc<dyn Transport>, JobView), JobError> {
    for t in transports.values() {
        match list(t.as_ref(), run_root).await {
            Ok(views) => {
                if let Some(v) = views.into_iter().find(|v| v.record.id == id) {
                    return Ok((t.clone(), v));
                }
            }
            Err(e) => tracing::error!("{e}"),
        }
    }
    Err(JobError::NotFound {
        id: id.to_string(),
        hosts: transports.keys().cloned().collect(),
    })
}

/// Stops a job as Ctrl-C would (it finishes what is in flight within its grace period, writes
/// everything and ends `interrupted`), waiting up to `wait` for it to exit.
pub async fn stop(
    t: &Arc<dyn Transport>,
    view: &JobView,
    wait: Duration,
) -> Result<JobView, JobError> {
    if view.alive {
        view.record.stop.interrupt(t, view.record.pid).await?;
        let deadline = tokio::time::Instant::now() + wait;
        while tokio::time::Instant::now() < deadline {
            let alive = proc::proc_stat(t.as_ref(), view.record.pid)
                .await?
                .is_some_and(|p| p.running() && p.start_ticks == view.record.start_ticks);
            if !alive {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    self::view(t.as_ref(), view.record.clone()).await
}
