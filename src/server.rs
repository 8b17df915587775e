//! One server's identity across launch, status, generate and sweep: [`ServerId`], the name a
//! server goes by from its plan to its last line in the journal.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Which server. A server fleet starts is the one on a GPU of an inventory host (`ct200:gpu5`);
/// a server given by URL goes by its name. Shown, serialized and parsed as that text, so that
/// tables, events, `progress.json` and the journal all name a server the same way.
///
/// Two servers on one GPU (two profiles with other port bases) share an id: launch tells them
/// apart by their port, which is what the run directory is keyed by.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ServerId {
    /// A server on an inventory host: the GPU it is pinned to (on a backend that places servers
    /// itself, its place among the host's servers).
    Gpu { host: String, gpu: u32 },
    /// A server fleet did not start (`--url`): `NAME=URL`'s name, else the URL's `host:port`.
    Named(String),
}

impl ServerId {
    pub fn gpu(host: impl Into<String>, gpu: u32) -> ServerId {
        ServerId::Gpu {
            host: host.into(),
            gpu,
        }
    }

    pub fn named(name: impl Into<String>) -> ServerId {
        ServerId::Named(name.into())
    }

    /// The inventory host it runs on; `None` for a server given by URL.
    pub fn host(&self) -> Option<&str> {
        match self {
            ServerId::Gpu { host, .. } => Some(host),
            ServerId::Named(_) => None,
        }
    }

    /// `ct200 gpu5 :30005`: the id with the port it serves on, which tells two servers of one
    /// GPU apart; how launch and the sweep name a server in messages.
    pub fn label(&self, port: u16) -> String {
        match self {
            ServerId::Gpu { host, gpu } => format!("{host} gpu{gpu} :{port}"),
            ServerId::Named(name) => format!("{name} :{port}"),
        }
    }

    /// Its GPU on that host; `None` for a server given by URL.
    pub fn gpu_index(&self) -> Option<u32> {
        match self {
            ServerId::Gpu { gpu, .. } => Some(*gpu),
            ServerId::Named(_) => None,
        }
    }
}

impl fmt::Display for ServerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServerId::Gpu { host, gpu } => write!(f, "{host}:gpu{gpu}"),
            ServerId::Named(name) => f.write_str(name),
        }
    }
}

impl FromStr for ServerId {
    type Err = std::convert::Infallible;

    /// `host:gpuN` is a GPU of a host (as fleet writes it); anything else is a name.
    fn from_str(s: &str) -> Result<ServerId, Self::Err> {
        let gpu = s.rsplit_once(":gpu").and_then(|(host, n)| {
            let digits = !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit());
            let plain = !host.is_empty() && !host.contains(':');
            (digits && plain).then(|| n.parse().ok().map(|g| ServerId::gpu(host, g)))?
        });
        Ok(gpu.unwrap_or_else(|| ServerId::named(s)))
    }
}

impl Serialize for ServerId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ServerId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ServerId, D::Error> {
        let text = String::deserialize(d)?;
        Ok(text.parse().unwrap_or_else(|never| match never {}))
    }
}

/// A server's id as the two fields `host` and `gpu`, for what shows them apart (the records on
/// a host, `--json` of up, status and down): `#[serde(flatten, with = "host_gpu")]`.
pub mod host_gpu {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::ServerId;

    #[derive(Serialize, Deserialize)]
    struct Fields {
        host: String,
        gpu: u32,
    }

    #[derive(Serialize)]
    struct Name<'a> {
        name: &'a str,
    }

    pub fn serialize<S: Serializer>(id: &ServerId, s: S) -> Result<S::Ok, S::Error> {
        match id {
            ServerId::Gpu { host, gpu } => Fields {
                host: host.clone(),
                gpu: *gpu,
            }
            .serialize(s),
            ServerId::Named(name) => Name { name }.serialize(s),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<ServerId, D::Error> {
        let Fields { host, gpu } = Fields::deserialize(d)?;
        Ok(ServerId::Gpu { host, gpu })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_read_back_as_they_are_shown() {
        let gpu = ServerId::gpu("ct200", 5);
        assert_eq!(gpu.to_string(), "ct200:gpu5");
        assert_eq!("ct200:gpu5".parse::<ServerId>().unwrap(), gpu);
        assert_eq!((gpu.host(), gpu.gpu_index()), (Some("ct200"), Some(5)));
        assert_eq!(gpu.label(30005), "ct200 gpu5 :30005");
        for name in [
            "127.0.0.1:30005",
            "gpu5",
            ":gpu1",
            "h:gpu",
            "h:gpux",
            "[::1]:gpu2",
        ] {
            let id: ServerId = name.parse().unwrap();
            assert_eq!(id, ServerId::named(name), "{name}");
            assert_eq!((id.to_string().as_str(), id.host()), (name, None));
        }
        let json = serde_json::to_string(&vec![gpu.clone(), ServerId::named("u:1")]).unwrap();
        assert_eq!(json, r#"["ct200:gpu5","u:1"]"#);
        let back: Vec<ServerId> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, vec![gpu, ServerId::named("u:1")]);
    }

    #[test]
    fn flattened_the_id_is_a_host_and_a_gpu() {
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        struct Row {
            #[serde(flatten, with = "host_gpu")]
            id: ServerId,
            port: u16,
        }
        let row = Row {
            id: ServerId::gpu("h", 3),
            port: 30003,
        };
        let json = serde_json::to_string(&row).unwrap();
        assert_eq!(json, r#"{"host":"h","gpu":3,"port":30003}"#);
        assert_eq!(serde_json::from_str::<Row>(&json).unwrap(), row);
    }
}
