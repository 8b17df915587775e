//! `fleet down`: stop what fleet started, from its records on each host.

use crate::cli::DownArgs;
use crate::config;
use crate::launch::Fleet;
use serde::Serialize;

use crate::launch::backend::StopState;
use crate::launch::down::{RELEASED_MIB, StopOutcome, confirm_gpus_released, down_host};
use crate::launch::report;
use crate::launch::state::InstanceRecord;
use crate::render::Model;

use super::output::eoutln;
use super::{Ctx, Outcome};

/// `fleet down --dry-run`'s result: the records of what would be stopped.
#[derive(Serialize)]
#[serde(transparent)]
pub struct WouldStop<'a>(pub Vec<&'a InstanceRecord>);

impl Model for WouldStop<'_> {
    fn title(&self) -> String {
        "fleet down --dry-run".into()
    }

    fn text(&self) -> String {
        self.0
            .iter()
            .map(|r| {
                format!(
                    "would stop {} ({}, profile {})\n",
                    r.label(),
                    r.handle,
                    r.profile
                )
            })
            .collect()
    }
}

/// `fleet down`'s result: how each instance stopped.
#[derive(Serialize)]
#[serde(transparent)]
pub struct Stopped(pub Vec<StopOutcome>);

impl Model for Stopped {
    fn title(&self) -> String {
        "fleet down".into()
    }

    /// The table; nothing when nothing was stopped (stderr says so).
    fn text(&self) -> String {
        if self.0.is_empty() {
            String::new()
        } else {
            report::down_table(&self.0)
        }
    }
}

pub async fn run(ctx: &Ctx, args: &DownArgs) -> anyhow::Result<Outcome> {
    // Records carry the profile's name; a path given to --profile means the same profile.
    let profile = match &args.profile {
        Some(p) => Some(config::load_profile(p, &ctx.global.profiles_dir)?.name),
        None => None,
    };
    let fleet = Fleet::open(&ctx.global.config, &ctx.connect_options()).await?;
    let mut partial = fleet.log_unreachable();
    if args.dry_run {
        let registry = fleet.servers().await;
        partial |= registry.log_unread();
        let rows: Vec<_> = registry
            .all()
            .iter()
            .map(|s| &s.record)
            .filter(|r| profile.as_ref().is_none_or(|p| &r.profile == p))
            .collect();
        super::emit(ctx, &WouldStop(rows))?;
        return Ok(if partial {
            Outcome::Partial
        } else {
            Outcome::Ok
        });
    }
    let profile = profile.as_deref();
    // First, so nothing is routed to a server that is going.
    partial |= !super::router::down(ctx, &fleet, args.grace).await;
    let stops = fleet.backends().map(|b| async move {
        let mut outcomes = down_host(b.as_ref(), profile, args.grace).await?;
        confirm_gpus_released(b.as_ref(), &mut outcomes).await;
        if outcomes.iter().all(|o| o.state != StopState::Failed)
            && let Some(what) = b.release().await?
        {
            tracing::info!("{}: {what}", b.host());
        }
        Ok::<_, crate::launch::state::StateError>(outcomes)
    });
    let mut outcomes = Vec::new();
    for result in futures::future::join_all(stops).await {
        match result {
            Ok(o) => outcomes.extend(o),
            Err(e) => {
                tracing::error!("{e}");
                partial = true;
            }
        }
    }
    for o in &outcomes {
        let label = o.id.label(o.port);
        if let Some(e) = &o.error {
            tracing::error!("{label}: {e}");
        }
        if let Some(used) = o.gpu_memory_used_mib.filter(|m| *m > RELEASED_MIB) {
            tracing::warn!("{label}: still {used} MiB in use on its GPU after stopping");
        }
    }
    let stopped = Stopped(outcomes);
    super::emit(ctx, &stopped)?;
    let outcomes = stopped.0;
    if outcomes.is_empty() && ctx.format() == crate::render::Format::Text {
        eoutln!("nothing to stop");
    }
    partial |= outcomes
        .iter()
        .any(|o| o.state == StopState::Failed || !o.port_closed);
    Ok(if partial {
        Outcome::Partial
    } else {
        Outcome::Ok
    })
}
