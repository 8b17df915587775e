//! The gateway's execution: started detached through its host's transport (ssh + pct like the
//! servers), recorded in the run directory, found again by pid and start time, stopped by
//! signalling its process group; and the worker list kept in step through its API. Nothing
//! here prints.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::RouterError;
use super::gateway::{Gateway, GatewayWorker};
use super::plan::{self, RouterFiles, RouterPlan, Worker};
use super::sync::{self, Changes};
use crate::launch::Fleet;
use crate::launch::backend::machine::proc;
use crate::launch::backend::{Backend, StopState};
use crate::launch::registry::Registry;
use crate::launch::state::{Liveness, StateError};
use crate::remote::{Detached, Transport, Tunnel, argv, mask};

/// How long a started gateway has to answer with its workers ready.
pub const READY_WITHIN: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(200);
/// After SIGKILL, how long before the gateway's group counts as stuck.
const AFTER_KILL: Duration = Duration::from_secs(5);

/// `router.json`: a started gateway.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouterRecord {
    pub host: String,
    pub address: String,
    pub port: u16,
    pub policy: String,
    pub pid: u32,
    pub start_ticks: u64,
    /// Never holds the key (it is not in the argv).
    pub argv: Vec<String>,
    pub fingerprint: String,
    pub api_key_env: Option<String>,
    pub files: RouterFiles,
    pub started_at: u64,
}

impl RouterRecord {
    pub fn url(&self) -> String {
        plan::worker_url(&self.address, self.port)
    }

    /// The key the gateway was started with, from the variable the profile named.
    pub fn api_key(&self) -> Option<String> {
        self.api_key_env
            .as_ref()
            .and_then(|v| std::env::var(v).ok())
            .filter(|k| !k.is_empty())
    }
}

/// How `fleet up` left the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RouterState {
    Started,
    AlreadyRunning,
    /// Its config changed: the old one was stopped and this one started.
    Replaced,
}

/// The gateway after `up`, with its workers as it lists them.
#[derive(Debug, Clone, Serialize)]
pub struct RouterUp {
    pub record: RouterRecord,
    pub state: RouterState,
    pub workers: Vec<GatewayWorker>,
}

/// The gateway's record on `t`, if one was written.
pub async fn find(t: &dyn Transport, run_root: &str) -> Result<Option<RouterRecord>, RouterError> {
    let path = RouterFiles::new(run_root).record;
    let out = t
        .run(&argv(&[
            "sh",
            "-c",
            r#"[ -f "$1" ] && cat -- "$1"; true"#,
            "sh",
            &path,
        ]))
        .await?;
    let text = out.stdout_lossy();
    if text.trim().is_empty() {
        return Ok(None);
    }
    match serde_json::from_str(&text) {
        Ok(r) => Ok(Some(r)),
        Err(e) => {
            tracing::warn!("{}: skipping an unreadable {path}: {e}", t.host());
            Ok(None)
        }
    }
}

/// The first host of the fleet (in inventory order) whose run directory holds a gateway, with
/// its record. The hosts are asked at once; one that cannot be read is logged and passed over,
/// as its servers are.
pub async fn locate(
    fleet: &Fleet,
) -> Result<Option<(Arc<dyn Backend>, RouterRecord)>, RouterError> {
    let looks = fleet
        .backends()
        .map(|b| async move { (b, find(b.shell().as_ref(), b.run_root()).await) });
    for (b, found) in futures::future::join_all(looks).await {
        match found {
            Ok(Some(r)) => return Ok(Some((b.clone(), r))),
            Ok(None) => {}
            Err(e) => tracing::warn!("{}: cannot look for a gateway: {e}", b.host()),
        }
    }
    Ok(None)
}

/// Whether the recorded gateway's leader still runs.
pub async fn alive(t: &dyn Transport, r: &RouterRecord) -> Result<bool, RouterError> {
    Ok(proc::proc_stat(t, r.pid)
        .await?
        .is_some_and(|p| p.running() && p.start_ticks == r.start_ticks))
}

/// The gateway's `--help` on its host, run as it would run (the profile's environment).
pub async fn help(
    t: &dyn Transport,
    launcher: &[String],
    env: &std::collections::BTreeMap<String, String>,
) -> Result<crate::sglang::help::HelpSpec, RouterError> {
    let mut cmd = vec!["env".to_string()];
    cmd.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
    cmd.extend(launcher.iter().cloned());
    cmd.push("--help".into());
    let out = t.run(&cmd).await?;
    let text = out.stdout_lossy();
    if !out.success() || text.trim().is_empty() {
        return Err(RouterError::Help {
            host: t.host().to_string(),
            launcher: launcher.join(" "),
            stderr: mask(out.stderr_lossy().trim()),
        });
    }
    Ok(crate::sglang::help::HelpSpec::parse(&text))
}

/// Starts the planned gateway and records it. The directory is the owner's alone; the key,
/// when there is one, travels on stdin into a 0600 file, beside the shim that hands it over.
pub async fn start(
    t: &dyn Transport,
    p: &RouterPlan,
    key: Option<&str>,
) -> Result<RouterRecord, RouterError> {
    let script = r#"umask 077 && mkdir -p -- "$1" "$4" && chmod 700 -- "$1" && : >>"$2" && chmod 600 -- "$2" || exit 1
printf '%s' "$5" >"$4/sitecustomize.py" || exit 1
if [ "$6" = write ]; then
  rm -f -- "$3.tmp" && cat >"$3.tmp" && chmod 600 -- "$3.tmp" && mv -f -- "$3.tmp" "$3"
else
  cat >/dev/null && rm -f -- "$3"
fi"#;
    let f = &p.files;
    let (what, bytes) = match key {
        Some(k) => ("write", k.as_bytes()),
        None => ("remove", &b""[..]),
    };
    let prepare = argv(&[
        "sh",
        "-c",
        script,
        "sh",
        &f.dir,
        &f.log,
        &f.key,
        &f.shim,
        plan::SHIM,
        what,
    ]);
    let out = t.run_input(&prepare, bytes).await?;
    if !out.success() {
        return Err(StateError::Command {
            host: t.host().to_string(),
            command: format!("prepare {}", f.dir),
            stderr: out.stderr_lossy().trim().to_string(),
        }
        .into());
    }
    let pid = t
        .spawn_detached(&Detached {
            argv: p.argv.clone(),
            env: p.env.clone(),
            log: f.log.clone(),
            pidfile: f.pidfile.clone(),
        })
        .await?;
    let start_ticks = proc::proc_stat(t, pid).await?.map_or(0, |s| s.start_ticks);
    let record = RouterRecord {
        host: p.host.clone(),
        address: p.address.clone(),
        port: p.port,
        policy: p.policy.clone(),
        pid,
        start_ticks,
        argv: p.argv.clone(),
        fingerprint: p.fingerprint.clone(),
        api_key_env: p.api_key_env.clone(),
        files: p.files.clone(),
        started_at: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    let json = serde_json::to_string(&record).expect("a record always serializes");
    let write = r#"printf '%s\n' "$1" >"$2.tmp" && mv -f -- "$2.tmp" "$2""#;
    let out = t
        .run(&argv(&["sh", "-c", write, "sh", &json, &f.record]))
        .await?;
    if !out.success() {
        // Unrecorded, nothing would ever stop it.
        let _ = proc::signal_group(t, pid, "KILL").await;
        return Err(StateError::Command {
            host: t.host().to_string(),
            command: format!("write {}", f.record),
            stderr: out.stderr_lossy().trim().to_string(),
        }
        .into());
    }
    Ok(record)
}

/// Stops the recorded gateway (SIGTERM to its group, SIGKILL after `grace`) and forgets it;
/// its log stays for `fleet logs router`.
pub async fn stop(
    t: &dyn Transport,
    r: &RouterRecord,
    grace: Duration,
) -> Result<StopState, RouterError> {
    let table = proc::proc_table(t).await?;
    let state = match table.liveness(r.pid, r.start_ticks) {
        Liveness::Reused => StopState::PidReused,
        Liveness::Dead if table.group(r.pid).is_empty() => StopState::AlreadyDead,
        _ => {
            proc::signal_group(t, r.pid, "TERM").await?;
            if group_gone(t, r.pid, grace).await? {
                StopState::Stopped
            } else {
                proc::signal_group(t, r.pid, "KILL").await?;
                if !group_gone(t, r.pid, AFTER_KILL).await? {
                    return Err(StateError::Command {
                        host: t.host().to_string(),
                        command: format!("kill -KILL -- -{}", r.pid),
                        stderr: "the gateway's process group is still there".into(),
                    }
                    .into());
                }
                StopState::Killed
            }
        }
    };
    let forget = r#"rm -f -- "$1" "$2" "$3""#;
    let f = &r.files;
    crate::launch::state::run_ok(
        t,
        &argv(&["sh", "-c", forget, "sh", &f.record, &f.key, &f.pidfile]),
    )
    .await?;
    Ok(state)
}

async fn group_gone(t: &dyn Transport, pgid: u32, within: Duration) -> Result<bool, RouterError> {
    let deadline = Instant::now() + within;
    loop {
        if proc::proc_table(t).await?.group(pgid).is_empty() {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The running servers of `registry` as the gateway's workers. A server on another host that
/// is reached only on that host's loopback cannot be one, and is left out with a warning.
pub fn workers_of(registry: &Registry, gateway_host: &str) -> Vec<Worker> {
    let mut out: Vec<Worker> = registry
        .running()
        .filter(|s| {
            let r = &s.record;
            let local_only = r.address.starts_with("127.") || r.address == "::1";
            if local_only && r.host() != gateway_host {
                tracing::warn!(
                    "{}: bound to its host's loopback ({}), so the gateway on {gateway_host} \
                     cannot reach it; left out",
                    r.label(),
                    r.address
                );
                return false;
            }
            true
        })
        .map(|s| Worker {
            host: s.record.host().to_string(),
            url: plan::worker_url(&s.record.address, s.record.port),
        })
        .collect();
    out.sort();
    out
}

/// A local port forwarded to the recorded gateway, and its client.
pub async fn reach(
    b: &dyn Backend,
    r: &RouterRecord,
    http: &reqwest::Client,
) -> Result<(Tunnel, Gateway), RouterError> {
    let tunnel = b.endpoint(&r.address, r.port).await?;
    let gw = Gateway::new(
        http.clone(),
        format!("http://{}", tunnel.local_addr()),
        r.api_key(),
    );
    Ok((tunnel, gw))
}

/// Tells the gateway what [`sync::reconcile`] finds; returns what it asked for.
pub async fn sync_once(gw: &Gateway, want: &BTreeSet<String>) -> Result<Changes, RouterError> {
    let listed = gw.workers().await?;
    let changes = sync::reconcile(want, &listed);
    for (id, url) in &changes.remove {
        gw.remove(id).await?;
        tracing::info!("gateway: removed worker {url} (its server is gone)");
    }
    for url in &changes.add {
        gw.add(url).await?;
        tracing::info!("gateway: added worker {url}");
    }
    Ok(changes)
}

/// Waits until the gateway answers and lists every URL of `want` as ready, adding what it
/// lacks on the way; fails when its process ends, on Ctrl-C, or after [`READY_WITHIN`].
pub async fn wait_ready(
    b: &dyn Backend,
    r: &RouterRecord,
    gw: &Gateway,
    want: &BTreeSet<String>,
    cancel: &CancellationToken,
) -> Result<Vec<GatewayWorker>, RouterError> {
    let began = Instant::now();
    let mut last_alive = Instant::now();
    let mut why = "no answer yet".to_string();
    loop {
        if let Ok(listed) = gw.workers().await {
            let ready: BTreeSet<&str> = listed
                .iter()
                .filter(|w| w.status == "ready")
                .map(|w| w.url.as_str())
                .collect();
            if want.iter().all(|u| ready.contains(u.as_str())) {
                sync_once(gw, want).await?;
                return gw.workers().await;
            }
            sync_once(gw, want).await?;
            why = format!("{} of {} workers ready", ready.len(), want.len());
        }
        let t = b.shell();
        if last_alive.elapsed() >= Duration::from_secs(1) {
            last_alive = Instant::now();
            if !alive(t.as_ref(), r).await? {
                why = "its process ended".into();
                break;
            }
        }
        if began.elapsed() >= READY_WITHIN {
            break;
        }
        tokio::select! {
            _ = cancel.cancelled() => { why = "interrupted".into(); break; }
            _ = tokio::time::sleep(POLL) => {}
        }
    }
    let tail = crate::launch::state::tail(b.shell().as_ref(), &r.files.log, 20)
        .await
        .unwrap_or_default();
    Err(RouterError::NotReady {
        host: r.host.clone(),
        secs: began.elapsed().as_secs(),
        why,
        tail,
    })
}

/// Keeps the gateway's workers true until `cancel`: every `every`, the servers that run (from
/// their records and the hosts' process tables) against what the gateway lists. A failed look
/// is logged and tried again next time; the gateway itself gone ends the watch.
pub async fn keep(
    fleet: &Fleet,
    b: &dyn Backend,
    r: &RouterRecord,
    gw: &Gateway,
    every: Duration,
    cancel: &CancellationToken,
) -> Result<(), RouterError> {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            _ = tokio::time::sleep(every) => {}
        }
        let registry = fleet.servers().await;
        if !registry.unread.is_empty() {
            // A host that could not be looked at says nothing about its servers: wait.
            for (host, e) in &registry.unread {
                tracing::warn!("{host}: {e}");
            }
            continue;
        }
        let want: BTreeSet<String> = workers_of(&registry, &r.host)
            .into_iter()
            .map(|w| w.url)
            .collect();
        if let Err(e) = sync_once(gw, &want).await {
            if !alive(b.shell().as_ref(), r).await? {
                return Err(e);
            }
            tracing::warn!("{e}");
        }
    }
}
