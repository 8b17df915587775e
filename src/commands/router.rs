//! The gateway's hooks in `up`, `status`, `down`, `logs` and `generate`: each command calls one
//! function here, which runs [`crate::router::life`] and reports what it found.

use std::time::Duration;

use crate::config::Profile;
use crate::launch::Fleet;
use crate::render::Format;
use crate::router::{RouterError, life, report, run};
use crate::sglang::client::Endpoint;

use super::Ctx;
use super::output::{eoutln, out};

/// How often `up --watch` and `generate --via-router` compare servers with the gateway's list.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// `up`, before anything starts: the gateway's host and flags.
pub async fn preflight(
    fleet: &Fleet,
    profile: &Profile,
    check_help: bool,
) -> Result<(), RouterError> {
    life::preflight(fleet, profile, check_help).await
}

/// `up --dry-run`: the gateway's command line after the servers' (text only).
pub fn dry_run(
    ctx: &Ctx,
    fleet: &Fleet,
    profile: &Profile,
    instances: &[crate::launch::plan::Instance],
) -> Result<(), RouterError> {
    if let Some(p) = life::dry_run(fleet, profile, instances)?
        && ctx.format() == Format::Text
    {
        out!(
            "\ngateway on {} at {}: {}\n",
            p.host,
            p.url(),
            p.argv.join(" ")
        );
    }
    Ok(())
}

/// `up`, after the servers: starts or keeps the gateway, then with `--watch` keeps its workers
/// true until Ctrl-C. `false` when it failed (logged).
pub async fn up(
    ctx: &Ctx,
    fleet: &Fleet,
    profile: &Profile,
    key: Option<&str>,
    watch: bool,
) -> anyhow::Result<bool> {
    if profile.router.is_none() {
        return Ok(true);
    }
    let http = crate::sglang::client::http_client(crate::launch::PROBE_HTTP)?;
    match life::up(fleet, profile, key, &http, &ctx.cancel).await {
        Ok(Some(u)) => {
            if ctx.format() == Format::Text {
                out!("\n{}", report::up_line(&u));
            } else {
                tracing::info!("{}", report::up_line(&u).trim_end());
            }
        }
        Ok(None) => {}
        Err(e) => {
            tracing::error!("{e}");
            return Ok(false);
        }
    }
    if watch && !ctx.cancel.is_cancelled() {
        tracing::info!("keeping the gateway's workers in step with the servers until Ctrl-C");
        if let Err(e) = life::watch(fleet, &http, WATCH_EVERY, &ctx.cancel).await {
            tracing::error!("{e}");
            return Ok(false);
        }
    }
    Ok(true)
}

/// `status`: the gateway's block after the servers' table. `false` when it is dead or could
/// not be asked.
pub async fn status(ctx: &Ctx, fleet: &Fleet) -> anyhow::Result<bool> {
    let http = crate::sglang::client::http_client(crate::launch::PROBE_HTTP)?;
    match life::status(fleet, &http).await {
        Ok(Some(s)) => {
            if ctx.format() == Format::Text {
                out!("\n{}", report::status_text(&s));
            }
            Ok(s.running && s.error.is_none())
        }
        Ok(None) => Ok(true),
        Err(e) => {
            tracing::error!("{e}");
            Ok(false)
        }
    }
}

/// `down`, before the servers: stops the gateway. `false` when that failed.
pub async fn down(ctx: &Ctx, fleet: &Fleet, grace: Duration) -> bool {
    match life::down(fleet, grace).await {
        Ok(Some((r, state))) => {
            if ctx.format() == Format::Text && !ctx.global.quiet {
                eoutln!("{}", report::down_line(&r.url(), &r.host, state).trim_end());
            }
            true
        }
        Ok(None) => true,
        Err(e) => {
            tracing::error!("{e}");
            false
        }
    }
}

/// `logs router`: the host's shell and the gateway log's path.
pub async fn log(
    fleet: &Fleet,
) -> anyhow::Result<(std::sync::Arc<dyn crate::remote::Transport>, String)> {
    match run::locate(fleet).await? {
        Some((b, r)) => Ok((b.shell().clone(), r.files.log)),
        None => Err(super::UsageError::new(
            "no gateway on the hosts of this inventory: add a `router:` block to the profile and \
             run `fleet up`",
        )
        .into()),
    }
}

/// `generate --via-router`: the gateway as the job's one endpoint, through a port forward held
/// for the run, and the task that keeps its workers true meanwhile (joined by the caller
/// after cancelling `stop`).
pub async fn target(
    fleet: std::sync::Arc<Fleet>,
    stop: tokio_util::sync::CancellationToken,
) -> anyhow::Result<(Endpoint, crate::remote::Tunnel, tokio::task::JoinHandle<()>)> {
    let Some((b, r)) = run::locate(&fleet).await? else {
        return Err(super::UsageError::new(
            "--via-router: no gateway on the hosts of this inventory: add a `router:` block to \
             the profile and run `fleet up`",
        )
        .into());
    };
    if !run::alive(b.shell().as_ref(), &r).await? {
        return Err(super::UsageError::new(format!(
            "--via-router: the gateway on {} is not running (see `fleet logs router`); \
             `fleet up` starts it again",
            r.host
        ))
        .into());
    }
    let tunnel = b.endpoint(&r.address, r.port).await?;
    let mut endpoint = Endpoint::from_url(&format!("http://{}", tunnel.local_addr()));
    endpoint.id = crate::server::ServerId::named("router");
    endpoint.api_key = r.api_key();
    let http = crate::sglang::client::http_client(crate::launch::PROBE_HTTP)?;
    let keeper = tokio::spawn(async move {
        if let Err(e) = life::watch(&fleet, &http, WATCH_EVERY, &stop).await {
            tracing::warn!("{e}");
        }
    });
    Ok((endpoint, tunnel, keeper))
}
