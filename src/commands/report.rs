//! `fleet report SOURCE... [-o FILE]`: reads sweep files and generate output directories, builds
//! the report's page and writes it as text, JSON or one self-contained HTML file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::cli::ReportArgs;
use crate::generate::journal::FAILED_FILE;
use crate::generate::progress::{self, PROGRESS_FILE};
use crate::generate::timeline::{TIMELINE_FILE, Timeline};
use crate::render::Format;
use crate::report::page::{self, JobSource, Sources};
use crate::sweep::file;

use super::output::{eoutln, out};
use super::{Ctx, Outcome, UsageError};

/// What a source could not give, each named by its path.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("{}: no such file or directory (give a sweep.json or a `fleet generate --out` directory)", .0.display())]
    Missing(PathBuf),
    #[error("{}: no {PROGRESS_FILE} (is this a `fleet generate --out` directory? `fleet fetch` copies a detached job's)", .0.display())]
    NotAJob(PathBuf),
    #[error(transparent)]
    Progress(#[from] progress::ProgressError),
    #[error(transparent)]
    Sweep(#[from] file::FileError),
    #[error("{}: cannot read: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: a second {what}; a report shows one sweep and one job (run `fleet report` once per pair)", path.display())]
    Second { path: PathBuf, what: &'static str },
}

/// The `reason` of every line of failed.jsonl (a Batch API line's `error.code`); a torn last
/// line is skipped.
fn failure_reasons(dir: &Path) -> Result<BTreeMap<String, u64>, SourceError> {
    let path = dir.join(FAILED_FILE);
    let mut out = BTreeMap::new();
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(source) => return Err(SourceError::Io { path, source }),
    };
    for line in text.lines() {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(line) {
            let reason = v["reason"]
                .as_str()
                .or(v["error"]["code"].as_str())
                .unwrap_or("unknown")
                .to_string();
            *out.entry(reason).or_insert(0) += 1;
        }
    }
    Ok(out)
}

/// The job in `dir`: its progress.json, failed.jsonl's reasons and its timeline.
pub fn job(dir: &Path) -> Result<JobSource, SourceError> {
    if !dir.join(PROGRESS_FILE).exists() {
        return Err(SourceError::NotAJob(dir.to_path_buf()));
    }
    let progress = progress::read(dir)?;
    let failures = failure_reasons(dir)?;
    let path = dir.join(TIMELINE_FILE);
    let timeline = match std::fs::read_to_string(&path) {
        Ok(t) => Timeline::parse(&t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Timeline::default(),
        Err(source) => return Err(SourceError::Io { path, source }),
    };
    Ok(JobSource {
        dir: dir.display().to_string(),
        progress,
        failures,
        timeline,
    })
}

/// Reads every source, collecting every problem rather than stopping at the first.
fn read(args: &ReportArgs) -> Result<Sources, Vec<SourceError>> {
    let mut s = Sources {
        total: args.total,
        gpu_hour_cost: args.gpu_hour_cost,
        ..Sources::default()
    };
    let mut errors = Vec::new();
    for path in &args.sources {
        if path.is_dir() {
            match job(path) {
                Ok(_) if s.job.is_some() => errors.push(SourceError::Second {
                    path: path.clone(),
                    what: "job directory",
                }),
                Ok(j) => s.job = Some(j),
                Err(e) => errors.push(e),
            }
        } else if path.exists() {
            match file::read(path) {
                Ok(_) if s.sweep.is_some() => errors.push(SourceError::Second {
                    path: path.clone(),
                    what: "sweep file",
                }),
                Ok(f) => s.sweep = Some((path.display().to_string(), f)),
                Err(e) => errors.push(e.into()),
            }
        } else {
            errors.push(SourceError::Missing(path.clone()));
        }
    }
    if errors.is_empty() {
        Ok(s)
    } else {
        Err(errors)
    }
}

/// How to get the report of `sources`: the line `fleet sweep` and `fleet generate` end with.
pub fn hint(sources: &[&Path]) -> String {
    let args: Vec<String> = sources
        .iter()
        .map(|p| {
            let p = p.display().to_string();
            shlex::try_quote(&p).map_or(p.clone(), |q| q.into_owned())
        })
        .collect();
    format!("report: fleet report {} -o report.html", args.join(" "))
}

/// The global `--format` (or `--json`), else HTML for `-o` (a page wants a file), else text.
fn format(ctx: &Ctx, args: &ReportArgs) -> Format {
    match (ctx.global.asked_format(), &args.out) {
        (Some(f), _) => f,
        (None, Some(_)) => Format::Html,
        (None, None) => Format::Text,
    }
}

pub fn run(ctx: &Ctx, args: &ReportArgs) -> anyhow::Result<Outcome> {
    let sources = read(args).map_err(|errors| {
        let lines: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
        UsageError::new(lines.join("\n"))
    })?;
    let page = page::build(sources);
    let body = crate::render::render(&page, format(ctx, args))?;
    match &args.out {
        Some(path) => {
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, &body)
                .and_then(|()| std::fs::rename(&tmp, path))
                .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
            eoutln!(
                "wrote {} ({} KB)",
                path.display(),
                body.len().div_ceil(1024)
            );
        }
        None => out!("{body}"),
    }
    Ok(Outcome::Ok)
}
