//! What a launch takes from fleet's own environment rather than from a file: the run directory
//! root on every target (`FLEET_RUN_DIR`) and the API key a profile names by its variable.

use crate::config::Profile;
use crate::launch::plan::DEFAULT_RUN_ROOT;

/// The run directory root on every target: `FLEET_RUN_DIR`, else `/tmp/fleet`.
pub fn run_root() -> String {
    std::env::var("FLEET_RUN_DIR")
        .ok()
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| DEFAULT_RUN_ROOT.to_string())
}

/// The profile names an API key variable that this environment does not set.
#[derive(Debug, thiserror::Error)]
#[error(
    "{}: api_key_env is {var}, but {var} is not set (or empty) in this environment",
    .profile.display()
)]
pub struct MissingApiKey {
    pub profile: std::path::PathBuf,
    pub var: String,
}

/// The API key's value from the environment variable the profile names; registered as a
/// secret so no log line shows it.
pub fn api_key(profile: &Profile) -> Result<Option<String>, MissingApiKey> {
    let Some(var) = &profile.api_key_env else {
        return Ok(None);
    };
    match std::env::var(var) {
        Ok(key) if !key.is_empty() => {
            crate::remote::add_secret(&key);
            Ok(Some(key))
        }
        _ => Err(MissingApiKey {
            profile: profile.path.clone(),
            var: var.clone(),
        }),
    }
}
