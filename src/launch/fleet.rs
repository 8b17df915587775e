//! The fleet as one value: the inventory, a connected backend for every host that answered
//! and why the others did not, the run directory root, and what was learned of each host. It
//! is the one connect prologue every command shares, and where the servers are looked up
//! ([`Fleet::servers`]) and reached ([`Fleet::reach`]).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use crate::config::{self, ConfigError, HostSpec, Inventory};
use crate::generate::Targets;
use crate::launch::backend::{self, Backend};
use crate::launch::owner::Owner;
use crate::launch::plan::HostFacts;
use crate::launch::preflight::{FactsError, Learn};
use crate::launch::registry::Registry;
use crate::remote::{ConnectOptions, RemoteError, Transport};

/// The inventory's hosts, connected.
#[derive(Debug)]
pub struct Fleet {
    pub inventory: Inventory,
    /// Who the servers this fleet starts are recorded as started by; its `fleet` is the id
    /// that down, status, generate and the sweep keep to.
    pub owner: Owner,
    /// The hosts that answered, in inventory order.
    backends: Vec<Arc<dyn Backend>>,
    /// The hosts that did not, in inventory order.
    pub unreachable: Vec<(String, RemoteError)>,
    run_root: String,
    /// What [`Fleet::learn`] found of each host, by name.
    facts: BTreeMap<String, HostFacts>,
}

impl Fleet {
    /// Loads the inventory at `config` and connects to every host in parallel, under the run
    /// directory root of this environment (`FLEET_RUN_DIR`).
    pub async fn open(config: &Path, opts: &ConnectOptions) -> Result<Fleet, ConfigError> {
        let inventory = config::load_inventory(config)?;
        Ok(Fleet::connect(inventory, opts).await)
    }

    /// Connects to every host of `inventory` in parallel, under the run directory root of this
    /// environment; a host that cannot be reached is kept with its error so the others go on.
    pub async fn connect(inventory: Inventory, opts: &ConnectOptions) -> Fleet {
        let run_root = crate::launch::env::run_root();
        let attempts = inventory
            .hosts
            .iter()
            .map(|h| backend::connect(h, opts, &run_root));
        let mut backends = Vec::new();
        let mut unreachable = Vec::new();
        let results = futures::future::join_all(attempts).await;
        for (host, result) in inventory.hosts.iter().zip(results) {
            match result {
                Ok(b) => backends.push(b),
                Err(e) => unreachable.push((host.name().to_string(), e)),
            }
        }
        Fleet::of(inventory, backends, unreachable, run_root)
    }

    /// A fleet of backends already at hand (tests, a caller with its own connections).
    pub fn of(
        inventory: Inventory,
        backends: Vec<Arc<dyn Backend>>,
        unreachable: Vec<(String, RemoteError)>,
        run_root: String,
    ) -> Fleet {
        Fleet {
            owner: Owner::here(&inventory),
            inventory,
            backends,
            unreachable,
            run_root,
            facts: BTreeMap::new(),
        }
    }

    /// Logs why each unreachable host is; `true` when there is one.
    pub fn log_unreachable(&self) -> bool {
        for (_, e) in &self.unreachable {
            tracing::error!("{e}");
        }
        !self.unreachable.is_empty()
    }

    /// The first unreachable host's error, for a command that needs every host.
    pub fn every_host(self) -> Result<Fleet, RemoteError> {
        let mut fleet = self;
        match fleet.unreachable.is_empty() {
            true => Ok(fleet),
            false => Err(fleet.unreachable.remove(0).1),
        }
    }

    /// The error of the last host when none answered, for a command that reports on those
    /// that did; the others are logged.
    pub fn some_host(self) -> Result<Fleet, RemoteError> {
        let mut fleet = self;
        if fleet.backends.is_empty()
            && let Some((_, last)) = fleet.unreachable.pop()
        {
            fleet.log_unreachable();
            return Err(last);
        }
        fleet.log_unreachable();
        Ok(fleet)
    }

    /// Why `host` could not be reached, when it could not.
    pub fn why_unreachable(&self, host: &str) -> Option<&RemoteError> {
        self.unreachable
            .iter()
            .find(|(name, _)| name == host)
            .map(|(_, e)| e)
    }

    pub fn run_root(&self) -> &str {
        &self.run_root
    }

    /// The connected hosts' backends, in inventory order.
    pub fn backends(&self) -> impl Iterator<Item = &Arc<dyn Backend>> {
        self.backends.iter()
    }

    pub fn backend(&self, host: &str) -> Option<&Arc<dyn Backend>> {
        self.backends.iter().find(|b| b.host() == host)
    }

    /// Each connected host's shell, by name (what detached jobs run on).
    pub fn shells(&self) -> BTreeMap<String, Arc<dyn Transport>> {
        self.backends
            .iter()
            .map(|b| (b.host().to_string(), b.shell().clone()))
            .collect()
    }

    /// Learns what planning needs of every connected host, in parallel, as `launcher` would
    /// run there with `env` (and its `--help` when `preflight`). The hosts that could not be
    /// looked at come back with their errors; the others' facts are kept in the fleet.
    pub async fn learn(&mut self, learn: &Learn<'_>) -> Vec<FactsError> {
        let looks = self.backends.iter().map(|b| async move {
            let facts = b.facts(learn).await;
            (b.host().to_string(), facts)
        });
        let mut failed = Vec::new();
        for (host, facts) in futures::future::join_all(looks).await {
            match facts {
                Ok(f) => {
                    self.facts.insert(host, f);
                }
                Err(e) => failed.push(e),
            }
        }
        failed
    }

    /// The hosts [`Fleet::learn`] could look at, with what it found, in inventory order: what
    /// a plan is made from.
    pub fn hosts(&self) -> Vec<(HostSpec, HostFacts)> {
        self.inventory
            .hosts
            .iter()
            .filter_map(|h| Some((h.clone(), self.facts.get(h.name())?.clone())))
            .collect()
    }

    /// What [`Fleet::learn`] found, by host.
    pub fn facts(&self) -> &BTreeMap<String, HostFacts> {
        &self.facts
    }

    /// Every server recorded on the connected hosts, with what became of each: every fleet's.
    pub async fn servers(&self) -> Registry {
        Registry::survey(&self.backends).await
    }

    /// The servers of fleet `name` (this fleet's when `None`) on the connected hosts.
    pub async fn servers_of(&self, name: Option<&str>) -> Registry {
        let all = self.servers().await;
        all.only(name.unwrap_or(&self.owner.fleet))
    }

    /// A local port forwarded to every running server of `registry`, as the targets of a
    /// generation run, with the links of their hosts to watch. A server that cannot be
    /// reached is logged and left out.
    pub async fn reach(&self, registry: &Registry) -> Targets {
        let forwards = registry.running().filter_map(|s| {
            let b = self.backend(s.record.host())?;
            Some(async move { (s, b.endpoint(&s.record.address, s.record.port).await) })
        });
        let mut targets = Targets::default();
        for (seen, tunnel) in futures::future::join_all(forwards).await {
            match tunnel {
                Ok(tunnel) => {
                    targets
                        .endpoints
                        .push(seen.record.endpoint(tunnel.local_addr()));
                    targets.tunnels.push(tunnel);
                }
                Err(e) => tracing::warn!("{e}"),
            }
        }
        targets.links = self
            .backends
            .iter()
            .map(|b| (b.host().to_string(), b.link()))
            .collect();
        targets
    }
}
