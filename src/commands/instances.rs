//! The instances `fleet up` started, as HTTP endpoints reachable from here: every host's live
//! records, each behind a port forward that stays open until the caller closes it.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::config;
use crate::generate::Targets;
use crate::launch::hosts::connect_all;
use crate::launch::state::{self, InstanceRecord};
use crate::remote::{Transport, Tunnel};
use crate::sglang::client::Endpoint;

use super::{Ctx, UsageError};

/// Endpoints with the tunnels and connections they ride on.
pub struct Reachable {
    pub endpoints: Vec<Endpoint>,
    /// The inventory host of each endpoint.
    pub hosts: Vec<String>,
    tunnels: Vec<Tunnel>,
    transports: BTreeMap<String, Arc<dyn Transport>>,
}

impl Reachable {
    /// The endpoints with their hosts and the hosts' links, for a run to follow outages.
    pub fn targets(&self) -> Targets {
        Targets {
            endpoints: self.endpoints.clone(),
            hosts: self.hosts.iter().cloned().map(Some).collect(),
            links: self
                .transports
                .iter()
                .map(|(name, t)| (name.clone(), t.link()))
                .collect(),
        }
    }

    pub async fn close(self) {
        futures::future::join_all(self.tunnels.into_iter().map(Tunnel::close)).await;
    }
}

/// Connects to every inventory host and forwards a local port to each running instance. Hosts
/// or instances that cannot be reached are logged and skipped; none at all is a usage error.
pub async fn reachable(ctx: &Ctx) -> anyhow::Result<Reachable> {
    let inventory = config::load_inventory(&ctx.global.config)?;
    let connected = connect_all(&inventory.hosts, &ctx.connect_options()).await;
    for e in &connected.failed {
        tracing::error!("{e}");
    }
    let run_root = crate::launch::env::run_root();
    let per_host = connected.transports.iter().map(|(name, t)| {
        let run_root = run_root.clone();
        async move { (name.clone(), running_on(t.as_ref(), &run_root).await) }
    });
    let mut endpoints = Vec::new();
    let mut hosts = Vec::new();
    let mut tunnels = Vec::new();
    for (host, found) in futures::future::join_all(per_host).await {
        for (record, tunnel) in found {
            endpoints.push(record.endpoint(tunnel.local_addr()));
            hosts.push(host.clone());
            tunnels.push(tunnel);
        }
    }
    if endpoints.is_empty() {
        return Err(UsageError::new(format!(
            "no running instances found on the hosts of {} (run directory {run_root}): start them \
             with `fleet up --profile P`, or pass --url http://HOST:PORT once per server",
            ctx.global.config.display()
        ))
        .into());
    }
    Ok(Reachable {
        endpoints,
        hosts,
        tunnels,
        transports: connected.transports,
    })
}

async fn running_on(t: &dyn Transport, run_root: &str) -> Vec<(InstanceRecord, Tunnel)> {
    let live = match state::live_records(t, run_root).await {
        Ok(live) => live,
        Err(e) => {
            tracing::error!("{e}");
            return vec![];
        }
    };
    let forwards = live.into_iter().map(|r| async move {
        match t.forward(&r.address, r.port).await {
            Ok(tunnel) => Some((r, tunnel)),
            Err(e) => {
                tracing::warn!("{e}");
                None
            }
        }
    });
    futures::future::join_all(forwards)
        .await
        .into_iter()
        .flatten()
        .collect()
}
