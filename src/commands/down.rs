//! `fleet down`: stop what fleet started, from its records on each host.

use crate::cli::DownArgs;
use crate::config;
use crate::gpu;
use crate::launch::down::{RELEASED_MIB, StopState, confirm_gpus_released, down_host};
use crate::launch::hosts::connect_all;
use crate::launch::report;
use crate::launch::state::{self, StateError};

use super::output::{eoutln, out, outln};
use super::{Ctx, Outcome};
use crate::launch::env::run_root;

pub async fn run(ctx: &Ctx, args: &DownArgs) -> anyhow::Result<Outcome> {
    let inventory = config::load_inventory(&ctx.global.config)?;
    // Records carry the profile's name; a path given to --profile means the same profile.
    let profile = match &args.profile {
        Some(p) => Some(config::load_profile(p, &ctx.global.profiles_dir)?.name),
        None => None,
    };
    let connected = connect_all(&inventory.hosts, &ctx.connect_options()).await;
    let mut partial = !connected.failed.is_empty();
    for e in &connected.failed {
        tracing::error!("{e}");
    }
    let run_root = run_root();
    if args.dry_run {
        let mut rows = Vec::new();
        for t in connected.transports.values() {
            match state::read_records(t.as_ref(), &run_root).await {
                Ok(records) => rows.extend(
                    records
                        .into_iter()
                        .filter(|r| profile.as_ref().is_none_or(|p| &r.profile == p)),
                ),
                Err(e) => {
                    tracing::error!("{e}");
                    partial = true;
                }
            }
        }
        if ctx.global.json {
            outln!("{}", serde_json::to_string_pretty(&rows)?);
        } else {
            for r in &rows {
                outln!(
                    "would stop {} gpu{} :{} (pid {}, profile {})",
                    r.host,
                    r.gpu,
                    r.port,
                    r.pid,
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
    let (run_root, profile) = (&run_root, profile.as_deref());
    let stops = inventory.hosts.iter().filter_map(|h| {
        let t = connected.transports.get(&h.name)?;
        Some(async move {
            let mut outcomes = down_host(t.as_ref(), run_root, profile, args.grace).await?;
            confirm_gpus_released(&mut outcomes, || gpu::read_host(t.clone(), h.is_local())).await;
            Ok::<_, StateError>(outcomes)
        })
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
        if let Some(e) = &o.error {
            tracing::error!("{} gpu{} :{}: {e}", o.host, o.gpu, o.port);
        }
        if let Some(used) = o.gpu_memory_used_mib.filter(|m| *m > RELEASED_MIB) {
            tracing::warn!(
                "{} gpu{}: still {used} MiB in use after stopping :{}",
                o.host,
                o.gpu,
                o.port
            );
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
