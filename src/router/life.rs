//! The gateway's part in each command: checked before `up` starts anything, started (or kept)
//! after the servers, stopped first by `down`, looked at by `status`. Execution only: what it
//! finds goes back as values for the commands to report.

use std::collections::BTreeSet;
use std::time::Duration;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::RouterError;
use super::gateway::GatewayWorker;
use super::plan::{self, RouterPlan};
use super::run::{self, RouterRecord, RouterState, RouterUp};
use crate::config::Profile;
use crate::launch::Fleet;
use crate::launch::backend::{Backend, StopState};

/// Grace for a gateway fleet replaces on its own (its config changed).
const REPLACE_GRACE: Duration = Duration::from_secs(10);

/// Before any server starts: the host can run the gateway, and (with `check_help`) the
/// gateway's own `--help` accepts what fleet would pass it. `Ok(())` without a `router:`.
pub async fn preflight(
    fleet: &Fleet,
    profile: &Profile,
    check_help: bool,
) -> Result<(), RouterError> {
    let Some(settings) = &profile.router else {
        return Ok(());
    };
    let host = plan::pick_host(settings, &fleet.inventory.hosts)?;
    let b = fleet
        .backend(host.name())
        .ok_or_else(|| RouterError::HostDown {
            host: host.name().to_string(),
        })?;
    if !check_help {
        return Ok(());
    }
    let help = run::help(b.shell().as_ref(), &settings.launcher, &profile.env).await?;
    let problems = plan::check_flags(settings, &help, profile.api_key_env.is_some());
    if problems.is_empty() {
        Ok(())
    } else {
        Err(RouterError::Flags {
            host: host.name().to_string(),
            launcher: settings.launcher.clone(),
            problems: problems.join("; "),
        })
    }
}

/// The gateway `up` would start over the planned `instances` (`up --dry-run`); `None` without
/// a `router:`, or when its host could not be looked at.
pub fn dry_run(
    fleet: &Fleet,
    profile: &Profile,
    instances: &[crate::launch::plan::Instance],
) -> Result<Option<RouterPlan>, RouterError> {
    let Some(settings) = &profile.router else {
        return Ok(None);
    };
    let host = plan::pick_host(settings, &fleet.inventory.hosts)?.name();
    let (Some(b), Some(facts)) = (fleet.backend(host), fleet.facts().get(host)) else {
        return Ok(None);
    };
    let mut workers: Vec<plan::Worker> = instances
        .iter()
        .map(|i| plan::Worker {
            host: i.id.host().unwrap_or_default().to_string(),
            url: plan::worker_url(&i.address, i.port),
        })
        .collect();
    workers.sort();
    Ok(Some(plan::plan(
        profile,
        settings,
        host,
        facts,
        &workers,
        b.run_root(),
    )))
}

/// After the servers: the gateway running this profile's config with every running server as
/// a worker, started, kept or replaced. `Ok(None)` without a `router:`.
pub async fn up(
    fleet: &Fleet,
    profile: &Profile,
    key: Option<&str>,
    http: &reqwest::Client,
    cancel: &CancellationToken,
) -> Result<Option<RouterUp>, RouterError> {
    let Some(settings) = &profile.router else {
        return Ok(None);
    };
    let host = plan::pick_host(settings, &fleet.inventory.hosts)?
        .name()
        .to_string();
    let down = || RouterError::HostDown { host: host.clone() };
    let b = fleet.backend(&host).ok_or_else(down)?;
    let facts = fleet.facts().get(&host).ok_or_else(down)?;
    let registry = fleet.servers().await;
    let workers = run::workers_of(&registry, &host);
    let planned = plan::plan(profile, settings, &host, facts, &workers, b.run_root());
    let (record, state) = start_or_keep(b.as_ref(), &planned, key).await?;
    let (tunnel, gw) = run::reach(b.as_ref(), &record, http).await?;
    let want: BTreeSet<String> = workers.into_iter().map(|w| w.url).collect();
    let ready = run::wait_ready(b.as_ref(), &record, &gw, &want, cancel).await;
    tunnel.close().await;
    match ready {
        Ok(workers) => Ok(Some(RouterUp {
            record,
            state,
            workers,
        })),
        Err(e) => {
            if state != RouterState::AlreadyRunning {
                // Half up is worse than down: nothing would route through it as asked.
                let _ = run::stop(b.shell().as_ref(), &record, REPLACE_GRACE).await;
            }
            Err(e)
        }
    }
}

async fn start_or_keep(
    b: &dyn Backend,
    planned: &RouterPlan,
    key: Option<&str>,
) -> Result<(RouterRecord, RouterState), RouterError> {
    let t = b.shell().as_ref();
    let state = match run::find(t, b.run_root()).await? {
        Some(r) if run::alive(t, &r).await? => {
            if r.fingerprint == planned.fingerprint {
                return Ok((r, RouterState::AlreadyRunning));
            }
            run::stop(t, &r, REPLACE_GRACE).await?;
            RouterState::Replaced
        }
        _ => RouterState::Started,
    };
    Ok((run::start(t, planned, key).await?, state))
}

/// `down`: stops the fleet's gateway, before its servers. `Ok(None)` when there is none.
pub async fn down(
    fleet: &Fleet,
    grace: Duration,
) -> Result<Option<(RouterRecord, StopState)>, RouterError> {
    let Some((b, r)) = run::locate(fleet).await? else {
        return Ok(None);
    };
    let state = run::stop(b.shell().as_ref(), &r, grace).await?;
    Ok(Some((r, state)))
}

/// The gateway as `fleet status` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct RouterStatus {
    pub host: String,
    /// As its host sees it.
    pub url: String,
    pub policy: String,
    pub pid: u32,
    pub running: bool,
    /// As the gateway lists them (`GET /workers`); `None` when it could not be asked.
    pub workers: Option<Vec<GatewayWorker>>,
    pub error: Option<String>,
}

/// `status`: the fleet's gateway, if it has one.
pub async fn status(
    fleet: &Fleet,
    http: &reqwest::Client,
) -> Result<Option<RouterStatus>, RouterError> {
    let Some((b, r)) = run::locate(fleet).await? else {
        return Ok(None);
    };
    let running = run::alive(b.shell().as_ref(), &r).await?;
    let mut s = RouterStatus {
        host: r.host.clone(),
        url: r.url(),
        policy: r.policy.clone(),
        pid: r.pid,
        running,
        workers: None,
        error: None,
    };
    if running {
        let asked = async {
            let (tunnel, gw) = run::reach(b.as_ref(), &r, http).await?;
            let listed = gw.workers().await;
            tunnel.close().await;
            listed
        };
        match asked.await {
            Ok(w) => s.workers = Some(w),
            Err(e) => s.error = Some(e.to_string()),
        }
    }
    Ok(Some(s))
}

/// Keeps the gateway's workers true until `cancel` (`fleet up --watch`, `fleet generate
/// --via-router`), looking every `every`. `Ok(())` at once when the fleet has no gateway.
pub async fn watch(
    fleet: &Fleet,
    http: &reqwest::Client,
    every: Duration,
    cancel: &CancellationToken,
) -> Result<(), RouterError> {
    let Some((b, r)) = run::locate(fleet).await? else {
        return Ok(());
    };
    let (tunnel, gw) = run::reach(b.as_ref(), &r, http).await?;
    let kept = run::keep(fleet, b.as_ref(), &r, &gw, every, cancel).await;
    tunnel.close().await;
    kept
}
