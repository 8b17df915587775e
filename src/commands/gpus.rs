//! `fleet gpus`: the GPU table of every host, read in parallel.

use crate::launch::Fleet;
use crate::report::{self, HostGpus};

use super::output::{out, outln};
use super::{Ctx, Outcome};

pub async fn run(ctx: &Ctx) -> anyhow::Result<Outcome> {
    let opts = ctx.connect_options();
    let opened = Fleet::open(&ctx.global.config, &opts);
    let fleet = tokio::select! {
        fleet = opened => fleet?,
        _ = ctx.cancel.cancelled() => return Ok(Outcome::Interrupted),
    };
    let reads = fleet.inventory.hosts.iter().map(|h| {
        let fleet = &fleet;
        async move {
            let result = match fleet.backend(h.name()) {
                Some(b) => b.gpus().await.map_err(|e| e.to_string()),
                None => Err(fleet
                    .why_unreachable(h.name())
                    .map_or_else(String::new, ToString::to_string)),
            };
            let (gpus, error) = match result {
                Ok(gpus) => (gpus, None),
                Err(e) => (vec![], Some(e)),
            };
            HostGpus {
                host: h.name().to_string(),
                gpus,
                error,
            }
        }
    });
    let hosts = tokio::select! {
        hosts = futures::future::join_all(reads) => hosts,
        _ = ctx.cancel.cancelled() => return Ok(Outcome::Interrupted),
    };
    if ctx.global.json {
        outln!("{}", serde_json::to_string_pretty(&hosts)?);
    } else {
        out!("{}", report::gpus_text(&hosts));
    }
    Ok(if hosts.iter().any(|h| h.error.is_some()) {
        Outcome::Partial
    } else {
        Outcome::Ok
    })
}
