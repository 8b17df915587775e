//! `fleet gpus`: the GPU table of every host, read in parallel.

use serde::Serialize;

use crate::launch::Fleet;
use crate::render::Model;
use crate::report::{self, HostGpus};

use super::{Ctx, Outcome};

/// `fleet gpus`'s result: every host's GPUs, or why they could not be read.
#[derive(Serialize)]
#[serde(transparent)]
pub struct Gpus(pub Vec<HostGpus>);

impl Model for Gpus {
    fn title(&self) -> String {
        "fleet gpus".into()
    }

    fn text(&self) -> String {
        report::gpus_text(&self.0)
    }
}

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
    let hosts = Gpus(hosts);
    super::emit(ctx, &hosts)?;
    Ok(if hosts.0.iter().any(|h| h.error.is_some()) {
        Outcome::Partial
    } else {
        Outcome::Ok
    })
}
