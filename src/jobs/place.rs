//! Where a detached job runs and which servers it sends to, decided from the fleet's registry:
//! pure, so each choice is tested as a value.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::launch::registry::Registry;
use crate::launch::state::InstanceRecord;

/// The host a job runs on, with what it is given there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub host: String,
    /// `--url` for the job: the URLs given, else `ID=http://ADDRESS:PORT` of each running
    /// server of the host as the job reaches it there, named as a local run names them.
    pub urls: Vec<String>,
    /// How many servers run on the host.
    pub servers: usize,
    /// The variable the host's servers take their API key from.
    pub api_key_env: Option<String>,
    /// The other hosts with running servers, which the job does not use.
    pub unused: Vec<String>,
}

/// Why a job has no host.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlaceError {
    #[error("--host {host}: not a host of {} that answered", .inventory.display())]
    NotAnswered { host: String, inventory: PathBuf },
    #[error(
        "no running instances on the hosts of {}: start them with `fleet up --profile P`, or \
         give --url and --host",
        .inventory.display()
    )]
    NoServers { inventory: PathBuf },
    #[error("no host of the inventory answered")]
    NoHost,
}

/// Places a job: on `--host` when given (one of `answered`), else on the first host (by name)
/// with running servers, else (with `--url`) on the first host that answered.
pub fn place(
    registry: &Registry,
    answered: &[&str],
    host: Option<&str>,
    urls: &[String],
    inventory: &Path,
) -> Result<Placement, PlaceError> {
    let mut servers: BTreeMap<&str, Vec<&InstanceRecord>> = BTreeMap::new();
    for s in registry.running() {
        servers.entry(s.record.host()).or_default().push(&s.record);
    }
    let host = match host {
        Some(h) if answered.contains(&h) => h.to_string(),
        Some(h) => {
            return Err(PlaceError::NotAnswered {
                host: h.to_string(),
                inventory: inventory.to_path_buf(),
            });
        }
        None => match servers.keys().next() {
            Some(h) => h.to_string(),
            None if urls.is_empty() => {
                return Err(PlaceError::NoServers {
                    inventory: inventory.to_path_buf(),
                });
            }
            None => answered.iter().min().ok_or(PlaceError::NoHost)?.to_string(),
        },
    };
    let mine = servers.get(host.as_str()).map(Vec::as_slice).unwrap_or(&[]);
    let urls = match urls.is_empty() {
        true => mine
            .iter()
            .map(|r| format!("{}=http://{}:{}", r.id, r.address, r.port))
            .collect(),
        false => urls.to_vec(),
    };
    Ok(Placement {
        servers: mine.len(),
        api_key_env: mine.iter().find_map(|r| r.api_key_env.clone()),
        unused: servers
            .keys()
            .filter(|h| **h != host)
            .map(|h| h.to_string())
            .collect(),
        urls,
        host,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch::backend::Seen;
    use crate::launch::backend::fake::record;
    use crate::launch::state::Liveness;

    fn registry(servers: &[(&str, u32, Liveness)]) -> Registry {
        Registry::of(
            servers
                .iter()
                .map(|(host, gpu, liveness)| Seen {
                    record: record(host, *gpu, 30000 + *gpu as u16, "x"),
                    liveness: *liveness,
                    lingering: false,
                })
                .collect(),
        )
    }

    #[test]
    fn a_job_goes_beside_the_first_hosts_running_servers_and_names_them_as_a_local_run_does() {
        let r = registry(&[
            ("b", 0, Liveness::Running),
            ("a", 0, Liveness::Dead),
            ("c", 1, Liveness::Running),
        ]);
        let inv = Path::new("fleet.yaml");
        let p = place(&r, &["a", "b", "c"], None, &[], inv).unwrap();
        assert_eq!(p.host, "b");
        assert_eq!(p.urls, ["b:gpu0=http://127.0.0.1:30000"]);
        assert_eq!(
            (p.servers, p.unused.as_slice()),
            (1, &["c".to_string()][..])
        );
        let there = place(&r, &["a", "b", "c"], Some("c"), &[], inv).unwrap();
        assert_eq!(there.urls, ["c:gpu1=http://127.0.0.1:30001"]);
        let given = ["http://10.0.0.9:30000".to_string()];
        let on_a = place(&r, &["a", "b", "c"], Some("a"), &given, inv).unwrap();
        assert_eq!(
            (on_a.host.as_str(), on_a.urls.as_slice()),
            ("a", &given[..])
        );
    }

    #[test]
    fn without_servers_or_an_answering_host_there_is_no_place() {
        let inv = Path::new("fleet.yaml");
        let empty = registry(&[("a", 0, Liveness::Dead)]);
        assert!(matches!(
            place(&empty, &["a"], None, &[], inv),
            Err(PlaceError::NoServers { .. })
        ));
        let urls = ["http://u:1".to_string()];
        assert_eq!(
            place(&empty, &["b", "a"], None, &urls, inv).unwrap().host,
            "a"
        );
        assert_eq!(
            place(&empty, &["a"], Some("z"), &urls, inv)
                .unwrap_err()
                .to_string(),
            "--host z: not a host of fleet.yaml that answered"
        );
        assert_eq!(
            place(&empty, &[], None, &urls, inv),
            Err(PlaceError::NoHost)
        );
    }
}
