//! `fleet down`: stop what fleet started, from its records on each host.

use crate::cli::DownArgs;
use crate::config;
use crate::launch::Fleet;
use crate::launch::backend::StopState;
use crate::launch::down::{RELEASED_MIB, confirm_gpus_released, down_host};
use crate::launch::report;

use super::output::{eoutln, out, outln};
use super::{Ctx, Outcome};

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
        if ctx.global.json {
            outln!("{}", serde_json::to_string_pretty(&rows)?);
        } else {
            for r in &rows {
                outln!(
                    "would stop {} ({}, profile {})",
                    r.label(),
                    r.handle,
                    r.profile
                );
            }
        }
        return Ok(if partial {
            Outcome::Partial
        } else {
            Outcome::Ok
        });
    }
    let profile = profile.as_deref();
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
    if ctx.global.json {
        outln!("{}", serde_json::to_string_pretty(&outcomes)?);
    } else if outcomes.is_empty() {
        eoutln!("nothing to stop");
    } else {
        out!("{}", report::down_table(&outcomes));
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
