//! Server profiles: name-or-path resolution and loading. [`schema`] is the one description of a
//! profile's keys (validation, defaults, YAML output, `--set` keys, the flags fleet renders);
//! [`resolve`] reads a file with what it `extends:` and applies `--set`; [`yaml_out`] writes
//! profiles back as YAML.

mod resolve;
mod schema;
mod values;
mod yaml_out;

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use super::check::suggest;
use super::{ConfigError, GpuSelection, HostSpec, Inventory, Problem, Profile};
use resolve::Loader;

pub use yaml_out::derived_profile_yaml;

/// `--set KEY=VALUE`: one field changed after `extends:` merging and before validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Override {
    /// Dotted, e.g. `server.mem_fraction_static`, `env.NCCL_DEBUG`.
    pub key: String,
    /// YAML scalar text, e.g. `0.85`, `null`, `no_buffer`.
    pub value: String,
}

impl fmt::Display for Override {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "--set {}={}", self.key, self.value)
    }
}

/// A NAME resolves to `<profiles_dir>/NAME.yaml`; anything with a `/` or ending in
/// `.yaml`/`.yml` is a path.
pub fn resolve_profile_path(
    name_or_path: &str,
    profiles_dir: &Path,
) -> Result<PathBuf, ConfigError> {
    let path = if is_path(name_or_path) {
        PathBuf::from(name_or_path)
    } else {
        profiles_dir.join(format!("{name_or_path}.yaml"))
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(ConfigError::ProfileNotFound {
            wanted: name_or_path.to_string(),
            looked: path,
            available: available_profiles(profiles_dir),
        })
    }
}

pub(super) fn is_path(s: &str) -> bool {
    s.contains('/') || s.ends_with(".yaml") || s.ends_with(".yml")
}

/// The profile files of a directory (`*.yaml`), sorted; empty when it cannot be read.
pub fn profile_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "yaml") && p.is_file())
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

pub(super) fn available_profiles(dir: &Path) -> Vec<String> {
    profile_files(dir).iter().map(|p| stem(p)).collect()
}

pub(super) fn stem(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

pub(super) fn not_found_message(wanted: &str, looked: &Path, available: &[String]) -> String {
    let mut msg = format!(
        "profile `{wanted}` not found: no file at {}",
        looked.display()
    );
    let names: Vec<&str> = available.iter().map(String::as_str).collect();
    if let Some(s) = suggest(wanted, &names) {
        msg.push_str(&format!(" (did you mean `{s}`?)"));
    }
    if available.is_empty() {
        let dir = looked.parent().unwrap_or(Path::new("."));
        msg.push_str(&format!(
            "; {} holds no profiles (pass --profiles-dir DIR or a path to a .yaml file)",
            dir.display()
        ));
    } else {
        msg.push_str(&format!("; available: {}", available.join(", ")));
    }
    msg
}

pub fn load_profile(name_or_path: &str, profiles_dir: &Path) -> Result<Profile, ConfigError> {
    load_profile_with(name_or_path, profiles_dir, &[])
}

/// Loads a profile, merges what it `extends:`, applies `overrides`, then validates.
pub fn load_profile_with(
    name_or_path: &str,
    profiles_dir: &Path,
    overrides: &[Override],
) -> Result<Profile, ConfigError> {
    let path = resolve_profile_path(name_or_path, profiles_dir)?;
    load_profile_file(&path, profiles_dir, overrides)
}

/// [`load_profile_with`] for a file already found (e.g. listed by [`profile_files`]).
pub fn load_profile_file(
    path: &Path,
    profiles_dir: &Path,
    overrides: &[Override],
) -> Result<Profile, ConfigError> {
    let mut loader = Loader::new(profiles_dir, path);
    let root = loader.file(path);
    loader.finish(root, path, overrides)
}

/// A profile from text that is not on disk (e.g. embedded in the binary); `origin` names it in
/// messages, gives its name (file stem) and anchors relative `extends:` paths.
pub fn profile_from_str(
    text: &str,
    origin: &Path,
    profiles_dir: &Path,
) -> Result<Profile, ConfigError> {
    let mut loader = Loader::new(profiles_dir, origin);
    let id = loader.c.add_file(origin.to_path_buf());
    let root = loader
        .c
        .parse(text, id)
        .map(|node| loader.extends(node, origin));
    loader.finish(root, origin, &[])
}

impl Profile {
    /// Checks `port_base + i ≤ 65535` for every GPU index the inventory lists (hosts with
    /// `gpus: all` are checked with [`Profile::port_for_gpu`] once their GPUs are known).
    pub fn check_ports(&self, inventory: &Inventory) -> Result<(), ConfigError> {
        let problems: Vec<Problem> = inventory
            .hosts
            .iter()
            .filter_map(|h| match h {
                HostSpec::Machine(m) => match &m.gpus {
                    GpuSelection::List(gpus) => gpus.iter().max().map(|g| (&m.name, *g)),
                    GpuSelection::All => None,
                },
                // A Slurm host's servers are numbered 0.. in the allocation.
                HostSpec::Slurm(s) => s.slurm.servers().map(|n| (&s.login.name, n - 1)),
            })
            .filter_map(|(name, gpu)| self.port_problem(name, gpu))
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(problems))
        }
    }

    /// The port GPU `gpu` of `host` listens on.
    pub fn port_for_gpu(&self, host: &str, gpu: u32) -> Result<u16, ConfigError> {
        match self.port_problem(host, gpu) {
            Some(p) => Err(ConfigError::Invalid(vec![p])),
            None => Ok((u32::from(self.port_base) + gpu) as u16),
        }
    }

    fn port_problem(&self, host: &str, gpu: u32) -> Option<Problem> {
        let port = u32::from(self.port_base) + gpu;
        (port > 65535).then(|| Problem {
            file: self.path.clone(),
            line: 0,
            column: 0,
            field: "port_base".into(),
            message: format!(
                "GPU {gpu} of host `{host}` would listen on port {port} ({} + {gpu}), above 65535",
                self.port_base
            ),
            hint: Some(format!("use a port_base of at most {}", 65535 - gpu)),
        })
    }
}

#[cfg(test)]
mod tests;
