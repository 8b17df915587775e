//! Profiles (what runs) and the inventory (where it runs): YAML schema, validation into typed
//! values with every problem reported at once, and `extends:` resolution.

mod check;
mod inventory;
mod profile;
mod slurm;
mod yaml;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

pub use inventory::{
    SSH_OPTIONS, SshTargetError, inventory_from_str, load_inventory, parse_ssh_target,
};
pub use profile::{
    Override, derived_profile_yaml, load_profile, load_profile_file, load_profile_with,
    profile_files, profile_from_str, resolve_profile_path,
};
pub use yaml::same_value;

use serde::Serialize;

/// `fleet.yaml`: the hosts fleet manages.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Inventory {
    pub path: PathBuf,
    /// `fleet: NAME`: the fleet's id when set; otherwise one is derived from the file and the
    /// user (`launch::owner`).
    pub fleet: Option<String>,
    pub hosts: Vec<HostSpec>,
}

/// An inventory host. Its kind says what runs its servers, and each kind has a backend
/// (`launch::backend`) that starts, watches and stops them there.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum HostSpec {
    /// A machine fleet starts server processes on: this one, one over SSH, or a Proxmox
    /// container on one of those.
    Machine(MachineSpec),
    /// A Slurm allocation whose servers are job steps (a host with a `slurm:` block).
    Slurm(SlurmHost),
}

impl HostSpec {
    pub fn name(&self) -> &str {
        match self {
            HostSpec::Machine(m) => &m.name,
            HostSpec::Slurm(s) => &s.login.name,
        }
    }

    /// The machine, when the host is one.
    pub fn machine(&self) -> Option<&MachineSpec> {
        match self {
            HostSpec::Machine(m) => Some(m),
            HostSpec::Slurm(_) => None,
        }
    }
}

impl From<MachineSpec> for HostSpec {
    fn from(m: MachineSpec) -> HostSpec {
        HostSpec::Machine(m)
    }
}

/// A Slurm host of the inventory: the shell where its Slurm commands run (this machine, or a
/// login node over SSH, as `login`; its `gpus` unused) and the allocation its servers run in.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SlurmHost {
    pub login: MachineSpec,
    pub slurm: crate::slurm::spec::SlurmSpec,
    /// How long before the allocation's end a `generate` run on its servers stops cleanly
    /// (`stop_before_end`, default [`crate::slurm::spec::STOP_BEFORE_END`]).
    pub stop_before_end: std::time::Duration,
}

/// A machine of the inventory: how to reach it, and its GPUs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MachineSpec {
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
    /// The gateway `fleet up` puts in front of the servers (`router:`), when asked for.
    pub router: Option<RouterSettings>,
}

/// `router:`: how the gateway (SGLang's `smg`) in front of the fleet is started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RouterSettings {
    /// argv prefix, e.g. `[smg, launch]` or `[python, -m, smg.launch_router]`.
    pub launcher: Vec<String>,
    pub port: u16,
    /// The gateway's `--policy`.
    pub policy: String,
    /// The inventory host that runs it; `None`: the first.
    pub host: Option<String>,
    /// `--dp-aware`: route to a server's DP ranks apart.
    pub dp_aware: bool,
    pub extra_args: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerSettings {
    pub mem_fraction_static: Option<f64>,
    pub context_length: Option<u32>,
    pub attention_backend: Option<String>,
    pub mamba_strategy: Option<MambaStrategy>,
    pub max_running_requests: Option<u32>,
    /// How many GPUs and nodes one server spans, and how it splits over them.
    pub parallel: crate::layout::Parallel,
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
    pub const ALL: [MambaStrategy; 4] = [
        MambaStrategy::Auto,
        MambaStrategy::NoBuffer,
        MambaStrategy::ExtraBuffer,
        MambaStrategy::ExtraBufferLazy,
    ];

    /// The strategy named as in SGLang's `{auto,no_buffer,extra_buffer,extra_buffer_lazy}`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }

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
    /// The output-length distribution the sweep measured: a job's prior for its ETA.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<crate::eta::LengthPrior>,
}

/// A problem in a profile or inventory, with its place in the file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// The file the problem is in (for a `--set` override: the override as written).
    pub file: PathBuf,
    /// 1-based; 0 when the problem has no place in a file (e.g. the file is missing).
    pub line: usize,
    pub column: usize,
    /// Dotted path of the field, e.g. `server.mem_fraction_static`; empty for the whole file.
    pub field: String,
    pub message: String,
    pub hint: Option<String>,
}

impl fmt::Display for Problem {
    /// `path:line:col: field: message (hint)`, the shape editors and terminals link to.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if self.line > 0 {
            write!(f, ":{}:{}", self.line, self.column)?;
        }
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.message)?;
        if let Some(hint) = &self.hint {
            write!(f, " ({hint})")?;
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Everything wrong with a profile or inventory, found in one pass.
    #[error("{}", render_problems(.0))]
    Invalid(Vec<Problem>),
    #[error(
        "no inventory at {} (create it or pass --config PATH); a minimal fleet.yaml:\n{}",
        .path.display(),
        inventory::MINIMAL_EXAMPLE
    )]
    MissingInventory { path: PathBuf },
    #[error("{}", profile::not_found_message(.wanted, .looked, .available))]
    ProfileNotFound {
        wanted: String,
        looked: PathBuf,
        available: Vec<String>,
    },
    #[error("cannot read {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl ConfigError {
    /// The same error as data, for `--json`.
    pub fn problems(&self) -> Vec<Problem> {
        let whole_file = |file: &PathBuf, message: String, hint: Option<String>| Problem {
            file: file.clone(),
            line: 0,
            column: 0,
            field: String::new(),
            message,
            hint,
        };
        match self {
            ConfigError::Invalid(problems) => problems.clone(),
            ConfigError::MissingInventory { path } => vec![whole_file(
                path,
                "no inventory file here".into(),
                Some(format!(
                    "a minimal fleet.yaml:\n{}",
                    inventory::MINIMAL_EXAMPLE
                )),
            )],
            ConfigError::ProfileNotFound { looked, .. } => {
                vec![whole_file(looked, self.to_string(), None)]
            }
            ConfigError::Read { path, source } => {
                vec![whole_file(path, format!("cannot read: {source}"), None)]
            }
        }
    }
}

fn render_problems(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(Problem::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

mod humantime_serde_compat {
    use std::time::Duration;

    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }
}
