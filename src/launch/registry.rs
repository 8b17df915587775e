//! The one registry of servers: every server recorded on the hosts fleet reached, by
//! [`ServerId`], with what became of each. `up` decides from it what to start, `status` probes
//! it, `down` stops it, `logs` finds a log in it, generate and detached jobs reach its running
//! servers, and the sweep finds what it started and which profile the fleet runs.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use crate::launch::backend::{Backend, Seen};
use crate::launch::state::{InstanceRecord, Liveness, StateError};
use crate::server::ServerId;

/// The servers of some hosts, in host then GPU then port order.
#[derive(Debug, Default)]
pub struct Registry {
    servers: Vec<Seen>,
    /// The hosts whose servers could not be looked at, with why.
    pub unread: Vec<(String, StateError)>,
}

impl Registry {
    /// Looks at every host's servers in parallel; a host that cannot be looked at is kept in
    /// [`Registry::unread`] with its error.
    pub async fn survey(backends: &[Arc<dyn Backend>]) -> Registry {
        let looks = backends
            .iter()
            .map(|b| async move { (b.host().to_string(), b.survey().await) });
        let mut registry = Registry::default();
        for (host, seen) in futures::future::join_all(looks).await {
            match seen {
                Ok(seen) => registry.servers.extend(seen),
                Err(e) => registry.unread.push((host, e)),
            }
        }
        registry
    }

    /// This registry, or the first error when some host could not be looked at.
    pub fn whole(mut self) -> Result<Registry, StateError> {
        match self.unread.is_empty() {
            true => Ok(self),
            false => Err(self.unread.remove(0).1),
        }
    }

    /// Logs why each unread host is; `true` when there is one.
    pub fn log_unread(&self) -> bool {
        for (_, e) in &self.unread {
            tracing::error!("{e}");
        }
        !self.unread.is_empty()
    }

    /// A registry of servers already looked at.
    pub fn of(servers: Vec<Seen>) -> Registry {
        Registry {
            servers,
            unread: Vec::new(),
        }
    }

    /// The servers of fleet `fleet` only; the hosts that could not be read stay unread.
    pub fn only(self, fleet: &str) -> Registry {
        Registry {
            servers: self
                .servers
                .into_iter()
                .filter(|s| crate::launch::owner::is_of(&s.record, fleet))
                .collect(),
            unread: self.unread,
        }
    }

    /// Every recorded server, live or not.
    pub fn all(&self) -> &[Seen] {
        &self.servers
    }

    /// The servers whose process (or job) still runs: what `fleet up` left running.
    pub fn running(&self) -> impl Iterator<Item = &Seen> {
        self.servers
            .iter()
            .filter(|s| s.liveness == Liveness::Running)
    }

    /// The server `id` serving on `port`.
    pub fn get(&self, id: &ServerId, port: u16) -> Option<&InstanceRecord> {
        self.servers
            .iter()
            .map(|s| &s.record)
            .find(|r| &r.id == id && r.port == port)
    }

    /// The one profile the running servers were started with, the sweep's base when it is given
    /// none: exactly one, and a profile file's rather than a sweep candidate's.
    pub fn running_profile(
        &self,
        inventory: PathBuf,
        run_root: &str,
    ) -> Result<String, FleetProfileError> {
        let mut running: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for s in self.running() {
            let at = format!(
                "{}:{}",
                s.record.host(),
                s.record.id.gpu_index().unwrap_or(0)
            );
            running.entry(&s.record.profile).or_default().push(at);
        }
        let mut profiles: Vec<(String, Vec<String>)> = running
            .into_iter()
            .map(|(p, at)| (p.to_string(), at))
            .collect();
        match profiles.len() {
            0 => Err(FleetProfileError::NoneUp {
                inventory,
                run_root: run_root.to_string(),
            }),
            1 => {
                let (name, _) = profiles.remove(0);
                // Sweep candidates are named `base[label]`.
                if name.ends_with(']') && name.contains('[') {
                    Err(FleetProfileError::Candidate(name))
                } else {
                    Ok(name)
                }
            }
            _ => Err(FleetProfileError::Several(profiles)),
        }
    }
}

/// Why the running fleet does not say which profile to measure from.
#[derive(Debug, thiserror::Error)]
pub enum FleetProfileError {
    #[error(
        "no --profile given, and no fleet is up on the hosts of {} (run directory {run_root}) to \
         measure from: pass --profile P, the profile every candidate starts from",
        .inventory.display()
    )]
    NoneUp {
        inventory: PathBuf,
        run_root: String,
    },
    #[error(
        "no --profile given, and the running fleet runs {} profiles: {}; pass --profile with the \
         one to measure from",
        .0.len(),
        .0.iter().map(|(p, at)| format!("{p} (on {})", at.join(", "))).collect::<Vec<_>>().join(", ")
    )]
    Several(Vec<(String, Vec<String>)>),
    #[error(
        "no --profile given, and the running fleet runs `{0}`, a candidate `fleet sweep --apply` \
         left up rather than a profile file: pass --profile (e.g. the profile --write-profile wrote)"
    )]
    Candidate(String),
}
