//! `fleet status`: liveness, health and load of every instance fleet started.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::cli::StatusArgs;
use crate::config;
use crate::launch::hosts::connect_all;
use crate::launch::probe::Probe;
use crate::launch::report;
use crate::launch::state::Liveness;
use crate::launch::status::{InstanceStatus, host_status};

use super::up::run_root;
use super::{Ctx, Outcome};

pub async fn run(ctx: &Ctx, _args: &StatusArgs) -> anyhow::Result<Outcome> {
    let inventory = config::load_inventory(&ctx.global.config)?;
    let connected = connect_all(&inventory.hosts, &ctx.connect_options()).await;
    let mut partial = !connected.failed.is_empty();
    for e in &connected.failed {
        tracing::error!("{e}");
    }
    let run_root = run_root();
    // Servers started with an API key answer /health only with it; the key's variable is
    // the one the profiles name, so it is read here when set.
    let probe = Probe::new(std::env::var("FLEET_API_KEY").ok().filter(|k| !k.is_empty()));
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let verbose = ctx.global.verbose > 0;
    let looks = connected.transports.values().map(|t| host_status(t.as_ref(), &run_root, &probe, verbose, now));
    let results = tokio::select! {
        r = futures::future::join_all(looks) => r,
        _ = ctx.cancel.cancelled() => return Ok(Outcome::Interrupted),
    };
    let mut statuses: Vec<InstanceStatus> = Vec::new();
    for r in results {
        match r {
            Ok(s) => statuses.extend(s),
            Err(e) => {
                tracing::error!("{e}");
                partial = true;
            }
        }
    }
    if ctx.global.json {
        println!("{}", serde_json::to_string_pretty(&statuses)?);
    } else if statuses.is_empty() {
        eprintln!("no instances: `fleet up --profile P` starts some");
    } else {
        print!("{}", report::status_table(&statuses));
        eprint!("{}", report::dead_tails(&statuses));
    }
    partial |= statuses.iter().any(|s| s.liveness != Liveness::Running || s.health != Some(200));
    Ok(if partial { Outcome::Partial } else { Outcome::Ok })
}
