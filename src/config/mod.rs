//! Profiles (what runs) and the inventory (where it runs): YAML schema, validation into typed
//! values with every problem reported at once, and `extends:` resolution.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

/// `fleet.yaml`: the hosts fleet manages.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Inventory {
    pub path: PathBuf,
    pub hosts: Vec<HostSpec>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostSpec {
    pub name: String,
    /// `None`: this machine.
    pub ssh: Option<SshTarget>,
    /// Proxmox CT id: commands run via `pct exec <id> -- ...`.
    pub container: Option<u32>,
    pub gpus: GpuSelection,
    /// Where the container's servers are reached from the SSH host (default: discovered).
    pub address: Option<String>,
    /// OpenSSH-style overrides (e.g. `IdentityFile`, `Port`, `User`, `UserKnownHostsFile`).
    pub ssh_options: BTreeMap<String, String>,
}

/// `user@host[:port]` as written in the inventory; `~/.ssh/config` may fill in the rest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SshTarget {
    pub user: Option<String>,
    pub host: String,
    pub port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuSelection {
    All,
    List(Vec<u32>),
}

/// A validated server profile.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Profile {
    pub name: String,
    pub path: PathBuf,
    pub model: String,
    pub served_model_name: Option<String>,
    /// argv prefix, e.g. `[/venv/bin/python, -m, sglang.launch_server]`.
    pub launcher: Vec<String>,
    /// GPU i listens on `port_base + i`.
    pub port_base: u16,
    pub server: ServerSettings,
    pub env: BTreeMap<String, String>,
    pub health: HealthSettings,
    /// Name of the environment variable holding the API key (never the key itself).
    pub api_key_env: Option<String>,
    /// Throughput measured by a sweep; the generate watchdog compares against it.
    pub expected: Option<Expected>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerSettings {
    pub mem_fraction_static: Option<f64>,
    pub context_length: Option<u32>,
    pub attention_backend: Option<String>,
    pub mamba_strategy: Option<MambaStrategy>,
    pub max_running_requests: Option<u32>,
    /// `--enable-metrics`; on unless the profile turns it off.
    pub enable_metrics: bool,
    /// Bind address; default: 127.0.0.1 on a bare host, the container address in a container.
    pub host: Option<String>,
    pub extra_args: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MambaStrategy {
    Auto,
    NoBuffer,
    ExtraBuffer,
    ExtraBufferLazy,
}

impl MambaStrategy {
    pub fn as_str(self) -> &'static str {
        match self {
            MambaStrategy::Auto => "auto",
            MambaStrategy::NoBuffer => "no_buffer",
            MambaStrategy::ExtraBuffer => "extra_buffer",
            MambaStrategy::ExtraBufferLazy => "extra_buffer_lazy",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HealthSettings {
    #[serde(with = "humantime_serde_compat")]
    pub startup_timeout: Duration,
    #[serde(with = "humantime_serde_compat")]
    pub poll: Duration,
}

/// Numbers a sweep measured for this profile's config.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Expected {
    pub output_tok_s_per_gpu: f64,
    pub max_running_requests: u32,
}

/// A problem in a profile or inventory, with its place in the file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    pub line: usize,
    pub column: usize,
    /// Dotted path of the field, e.g. `server.mem_fraction_static`.
    pub field: String,
    pub message: String,
    pub hint: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("placeholder")]
    Placeholder,
}

mod humantime_serde_compat {
    use std::time::Duration;

    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }
}

/// Loads and validates `fleet.yaml`.
pub fn load_inventory(path: &std::path::Path) -> Result<Inventory, ConfigError> {
    let _ = path;
    Err(ConfigError::Placeholder)
}
