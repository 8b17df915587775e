//! `fleet profile show|check`: print a resolved profile, validate profiles.

use std::path::PathBuf;

use serde::Serialize;

use crate::cli::ProfileCommand;
use crate::config::{self, ConfigError, Problem, Profile};
use crate::render::Model;

use super::{Ctx, Outcome, UsageError};

pub fn run(ctx: &Ctx, cmd: &ProfileCommand) -> anyhow::Result<Outcome> {
    match cmd {
        ProfileCommand::Show { name } => show(ctx, name),
        ProfileCommand::Check { names } => check(ctx, names),
    }
}

/// `fleet profile show`'s result: the profile after `extends:`.
#[derive(Serialize)]
#[serde(transparent)]
pub struct Shown(pub Profile);

impl Model for Shown {
    fn title(&self) -> String {
        format!("fleet profile show {}", self.0.name)
    }

    fn text(&self) -> String {
        self.0.to_yaml()
    }
}

fn show(ctx: &Ctx, name: &str) -> anyhow::Result<Outcome> {
    let profile = config::load_profile(name, &ctx.global.profiles_dir)?;
    super::emit(ctx, &Shown(profile))?;
    Ok(Outcome::Ok)
}

/// One line of `fleet profile check`.
#[derive(Serialize)]
struct Checked {
    /// As given on the command line, or the file found in --profiles-dir.
    profile: String,
    path: Option<PathBuf>,
    ok: bool,
    problems: Vec<Problem>,
}

/// `fleet profile check`'s result: every file checked, with its problems.
#[derive(Serialize)]
#[serde(transparent)]
pub struct Checks(Vec<Checked>);

impl Model for Checks {
    fn title(&self) -> String {
        "fleet profile check".into()
    }

    fn text(&self) -> String {
        let mut text = String::new();
        for r in &self.0 {
            let shown = r
                .path
                .as_ref()
                .map_or(r.profile.clone(), |p| p.display().to_string());
            text.push_str(&match r.problems.len() {
                0 => format!("{shown}: ok\n"),
                1 => format!("{shown}: 1 problem\n"),
                n => format!("{shown}: {n} problems\n"),
            });
            for p in &r.problems {
                text.push_str(&format!("  {p}\n"));
            }
        }
        text
    }
}

fn check(ctx: &Ctx, names: &[String]) -> anyhow::Result<Outcome> {
    let dir = &ctx.global.profiles_dir;
    let targets: Vec<(String, Result<PathBuf, ConfigError>)> = if names.is_empty() {
        let files = config::profile_files(dir);
        if files.is_empty() {
            return Err(UsageError::new(format!(
                "no profiles (*.yaml) in {}; pass --profiles-dir DIR or name the profiles to check",
                dir.display()
            ))
            .into());
        }
        // An inventory kept next to the profiles is not one of them.
        let inventory = std::fs::canonicalize(&ctx.global.config).ok();
        files
            .into_iter()
            .filter(|p| inventory.is_none() || std::fs::canonicalize(p).ok() != inventory)
            .map(|p| (p.display().to_string(), Ok(p)))
            .collect()
    } else {
        names
            .iter()
            .map(|n| (n.clone(), config::resolve_profile_path(n, dir)))
            .collect()
    };

    // Ports depend on the GPUs too: with an inventory at hand, its listed GPUs are checked.
    let mut results = Vec::new();
    let inventory = if ctx.global.config.is_file() {
        match config::load_inventory(&ctx.global.config) {
            Ok(inv) => Some(inv),
            Err(e) => {
                let shown = ctx.global.config.display().to_string();
                results.push(checked(shown, Some(ctx.global.config.clone()), Err(e)));
                None
            }
        }
    } else {
        None
    };
    for (label, path) in targets {
        let shown = path.as_ref().ok().cloned();
        let loaded = path.and_then(|p| config::load_profile_file(&p, dir, &[]));
        let loaded = match (loaded, &inventory) {
            (Ok(profile), Some(inv)) => profile.check_ports(inv),
            (other, _) => other.map(|_| ()),
        };
        results.push(checked(label, shown, loaded));
    }

    let checks = Checks(results);
    super::emit(ctx, &checks)?;
    let results = checks.0;
    let invalid = results.iter().filter(|r| !r.ok).count();
    if invalid > 0 {
        let of = results.len();
        return Err(UsageError::new(format!("{invalid} of {of} checked files invalid")).into());
    }
    Ok(Outcome::Ok)
}

fn checked(profile: String, path: Option<PathBuf>, result: Result<(), ConfigError>) -> Checked {
    let problems = result.err().map(|e| e.problems()).unwrap_or_default();
    Checked {
        profile,
        path,
        ok: problems.is_empty(),
        problems,
    }
}
