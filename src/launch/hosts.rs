//! Opening every inventory host's transport in parallel; a host that cannot be reached is
//! returned with its error so the others go on.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::config::HostSpec;
use crate::remote::{self, ConnectOptions, RemoteError, Transport};

/// The reachable hosts by inventory name, and the errors of the others (in inventory order).
pub struct Connected {
    pub transports: BTreeMap<String, Arc<dyn Transport>>,
    pub failed: Vec<RemoteError>,
}

pub async fn connect_all(hosts: &[HostSpec], opts: &ConnectOptions) -> Connected {
    let attempts = hosts
        .iter()
        .map(|h| async move { (h.name.clone(), remote::connect(h, opts).await) });
    let mut connected = Connected {
        transports: BTreeMap::new(),
        failed: Vec::new(),
    };
    for (name, result) in futures::future::join_all(attempts).await {
        match result {
            Ok(t) => {
                connected.transports.insert(name, t);
            }
            Err(e) => connected.failed.push(e),
        }
    }
    connected
}
