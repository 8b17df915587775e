//! The profile each candidate starts with (the base with the candidate's settings applied and
//! validated), and the winner written back as a profile that `extends:` the base.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::range;
use super::rank::{Outcome, Trial};
use super::space::Candidate;
use crate::config::{self, ConfigError, Expected, Override, Profile};

/// The base profile as `--profile` named it, and the candidates' profiles loaded so far.
#[derive(Debug, Clone)]
pub struct Profiles {
    /// A name in `dir`, or a path.
    pub base: String,
    pub dir: PathBuf,
    loaded: BTreeMap<String, Profile>,
}

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("candidate {label}: {source}")]
    Candidate { label: String, source: ConfigError },
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} does not load back: {source}", path.display())]
    LoadBack { path: PathBuf, source: ConfigError },
    #[error("{} loads back with other server settings than the winner's", path.display())]
    Differs { path: PathBuf },
}

/// A candidate's settings as `--set` overrides, but for its `flag.NAME` settings, which are
/// server arguments ([`flags`]).
pub fn overrides(c: &Candidate) -> Vec<Override> {
    c.settings
        .iter()
        .filter(|(key, _)| !key.starts_with(range::FLAG_PREFIX))
        .map(|(key, value)| Override {
            key: key.clone(),
            value: value.clone(),
        })
        .collect()
}

/// A candidate's `flag.NAME` settings.
fn flags(c: &Candidate) -> Vec<(String, String)> {
    c.settings
        .iter()
        .filter(|(key, _)| key.starts_with(range::FLAG_PREFIX))
        .cloned()
        .collect()
}

/// The overrides that write `c`'s profile, loaded as `p`: its settings, with its flags as the
/// `extra_args` they became.
fn written_overrides(c: &Candidate, p: &Profile) -> Vec<Override> {
    let mut o = overrides(c);
    if !flags(c).is_empty() {
        o.push(Override {
            key: "server.extra_args".into(),
            value: serde_json::to_string(&p.server.extra_args).unwrap_or_default(),
        });
    }
    o
}

fn load(base: &str, dir: &Path, c: &Candidate) -> Result<Profile, ProfileError> {
    let mut p = config::load_profile_with(base, dir, &overrides(c)).map_err(|source| {
        ProfileError::Candidate {
            label: c.label(),
            source,
        }
    })?;
    let flags = flags(c);
    if !flags.is_empty() {
        p.server.extra_args = range::flag_args(&p.server.extra_args, &flags);
    }
    // `fleet status`/`down` show which candidate a server runs, not just the base.
    if !c.settings.is_empty() {
        p.name = format!("{}[{}]", p.name, c.label());
    }
    Ok(p)
}

/// Whether a profile name is a candidate's (`base[label]`) rather than a profile file's.
pub fn is_candidate_name(name: &str) -> bool {
    name.ends_with(']') && name.contains('[')
}

impl Profiles {
    /// Loads and validates the profile of each of `known` (the candidates a search knows
    /// before it starts), so that a bad value stops the sweep before anything starts.
    pub fn load(base: &str, dir: &Path, known: &[Candidate]) -> Result<Profiles, ProfileError> {
        let loaded = known
            .iter()
            .map(|c| Ok((c.id.clone(), load(base, dir, c)?)))
            .collect::<Result<_, ProfileError>>()?;
        Ok(Profiles {
            base: base.to_string(),
            dir: dir.to_path_buf(),
            loaded,
        })
    }

    /// The profile of `c`: as loaded before the sweep started, or (a candidate the search
    /// proposed later) loaded now.
    pub fn of(&self, c: &Candidate) -> Result<Profile, ProfileError> {
        match self.loaded.get(&c.id) {
            Some(p) => Ok(p.clone()),
            None => load(&self.base, &self.dir, c),
        }
    }
}

/// `extends:` names the base the way `fleet profile show` will find it from the new file: by
/// name when the new file sits in the profiles directory, else by absolute path.
fn base_reference(profile_arg: &str, base: &Profile, path: &Path, dir: &Path) -> String {
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
    let same_dir = match (
        parent.map(std::fs::canonicalize),
        std::fs::canonicalize(dir),
    ) {
        (Some(Ok(a)), Ok(b)) => a == b,
        _ => false,
    };
    let by_name = !profile_arg.contains('/') && !profile_arg.ends_with(".yaml");
    if same_dir && by_name {
        profile_arg.to_string()
    } else {
        std::fs::canonicalize(&base.path)
            .unwrap_or_else(|_| PathBuf::from(&base.path))
            .display()
            .to_string()
    }
}

/// Writes the winner `trial` (whose profile is `profile`) to `path` as a profile that extends
/// `base` and records what it measured as `expected:`; checks that it loads back to the
/// winner's server settings.
pub fn write_winner(
    path: &Path,
    profiles: &Profiles,
    base: &Profile,
    trial: &Trial,
    profile: &Profile,
    lengths: Option<crate::eta::LengthPrior>,
) -> Result<(), ProfileError> {
    let Outcome::Ok(m) = &trial.outcome else {
        unreachable!("a winner is always measured")
    };
    let expected = Expected {
        output_tok_s_per_gpu: (m.output_tok_s_per_gpu * 10.0).round() / 10.0,
        max_running_requests: m.cap,
        output_tokens: lengths,
    };
    let comment = format!(
        "Written by `fleet sweep` from {}: the winner {} ({:.1} output tok/s per GPU, cap {}).",
        profiles.base,
        trial.candidate.label(),
        m.output_tok_s_per_gpu,
        m.cap
    );
    let text = config::derived_profile_yaml(
        &base_reference(&profiles.base, base, path, &profiles.dir),
        &written_overrides(&trial.candidate, profile),
        Some(&expected),
        &comment,
    );
    std::fs::write(path, text).map_err(|source| ProfileError::Write {
        path: path.to_path_buf(),
        source,
    })?;
    let back = config::load_profile_file(path, &profiles.dir, &[]).map_err(|source| {
        ProfileError::LoadBack {
            path: path.to_path_buf(),
            source,
        }
    })?;
    if back.server != profile.server {
        return Err(ProfileError::Differs {
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::space::{axes, candidates};

    #[test]
    fn each_candidate_s_profile_is_the_base_with_its_settings_and_a_bad_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("base.yaml"),
            "model: /models/m\nlauncher: [python3]\nserver:\n  mem_fraction_static: 0.85\n",
        )
        .unwrap();
        let space = candidates(&axes(&[], &["server.mem_fraction_static=0.8,0.9".into()]).unwrap());
        let p = Profiles::load("base", dir.path(), &space).unwrap();
        let first = p.of(&space[0]).unwrap();
        assert_eq!(first.name, "base[mem_fraction_static=0.8]");
        assert!(is_candidate_name(&first.name));
        assert!(!is_candidate_name("base"));
        // One the search proposes later is loaded when asked.
        let later = candidates(&axes(&[], &["server.mem_fraction_static=0.7".into()]).unwrap());
        assert_eq!(
            p.of(&later[0]).unwrap().name,
            "base[mem_fraction_static=0.7]"
        );
        let bad = candidates(&axes(&[], &["server.mem_fraction_static=lots".into()]).unwrap());
        let err = Profiles::load("base", dir.path(), &bad).unwrap_err();
        assert!(
            matches!(&err, ProfileError::Candidate { label, .. } if label == "mem_fraction_static=lots")
        );
        assert!(
            err.to_string()
                .starts_with("candidate mem_fraction_static=lots"),
            "{err}"
        );
    }
}
