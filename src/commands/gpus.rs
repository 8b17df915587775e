//! `fleet gpus`: the GPU table of every host, read in parallel.

use crate::report::{self, HostGpus};

use super::output::{out, outln};
use super::{Ctx, Outcome};

pub async fn run(ctx: &Ctx) -> anyhow::Result<Outcome> {
    let inventory = crate::config::load_inventory(&ctx.global.config)?;
    let opts = ctx.connect_options();
    let reads = inventory.hosts.iter().map(|host| {
        let opts = opts.clone();
        async move {
            let result = match crate::remote::connect(host, &opts).await {
                Ok(t) => crate::gpu::read_host(t, host.is_local())
                    .await
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            match result {
                Ok(gpus) => HostGpus {
                    host: host.name.clone(),
                    gpus,
                    error: None,
                },
                Err(e) => HostGpus {
                    host: host.name.clone(),
                    gpus: vec![],
                    error: Some(e),
                },
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
