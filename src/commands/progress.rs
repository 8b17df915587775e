//! `fleet progress JOB|DIR`: a summary of a running or finished generate job from its
//! progress.json, a detached job's (by id) or a local output directory's.

use std::fmt::Write;
use std::time::SystemTime;

use serde::Serialize;

use crate::cli::ProgressArgs;
use crate::generate::progress::{self, PROGRESS_FILE, Progress, Status};
use crate::render::Model;

use super::{Ctx, Outcome, UsageError};

/// A running job rewrites progress.json every few seconds; older than this, it has likely stopped.
const STALE_AFTER_SECS: u64 = 30;

/// What `fleet progress` finds beyond the file's own figures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Finding {
    /// A running job whose progress.json was last rewritten this long ago.
    #[error("last update {age_s}s ago: the job may have stopped (resume it with --resume)")]
    Stale { age_s: u64 },
}

/// `fleet progress`'s result: the job's progress.json and what it shows.
#[derive(Serialize)]
pub struct Summary {
    #[serde(flatten)]
    pub progress: Progress,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<Finding>,
}

impl Summary {
    /// `progress`, with `age` how long ago its file was written, when known.
    pub fn of(progress: Progress, age: Option<u64>) -> Self {
        let findings = age
            .filter(|age| progress.status == Status::Running && *age > STALE_AFTER_SECS)
            .map(|age_s| Finding::Stale { age_s })
            .into_iter()
            .collect();
        Summary { progress, findings }
    }
}

impl Model for Summary {
    fn title(&self) -> String {
        "fleet progress".into()
    }

    fn text(&self) -> String {
        summary(&self.progress, &self.findings)
    }
}

pub async fn run(ctx: &Ctx, args: &ProgressArgs) -> anyhow::Result<Outcome> {
    if !super::jobs::is_local(&args.job) {
        // Not a local path: a detached job's id.
        let Some(p) = super::jobs::progress(ctx, &args.job).await? else {
            return Ok(Outcome::Partial);
        };
        super::emit(ctx, &Summary::of(p, None))?;
        return Ok(Outcome::Ok);
    }
    let dir = std::path::PathBuf::from(&args.job);
    let file = if dir.is_dir() {
        dir.join(PROGRESS_FILE)
    } else {
        dir.clone()
    };
    if !file.exists() {
        return Err(UsageError::new(format!(
            "{}: no progress.json (is this a `fleet generate --out` directory?)",
            file.display()
        ))
        .into());
    }
    let p = progress::read(&file)?;
    let age = std::fs::metadata(&file)?
        .modified()
        .ok()
        .and_then(|m| SystemTime::now().duration_since(m).ok())
        .map(|d| d.as_secs());
    super::emit(ctx, &Summary::of(p, age))?;
    Ok(Outcome::Ok)
}

/// The summary a user reads.
fn summary(p: &progress::Progress, findings: &[Finding]) -> String {
    let mut text = String::new();
    let out = &mut text;
    let pct = if p.total > 0 {
        100.0 * (p.completed + p.failed) as f64 / p.total as f64
    } else {
        100.0
    };
    let eta = p.eta_text().unwrap_or_else(|| "unknown".into());
    let _ = writeln!(out, "status      {}", p.status.as_str());
    let _ = writeln!(
        out,
        "done        {}/{} ({pct:.1}%), {} failed, {} waiting for a retry",
        p.completed + p.failed,
        p.total,
        p.failed,
        p.waiting_retry
    );
    let _ = writeln!(
        out,
        "rate        {:.2} req/s (recent window)",
        p.rate_per_sec
    );
    let _ = writeln!(out, "eta         {eta}");
    if let (Some(tokens), Some(e)) = (p.expected_output_tokens, &p.length_estimate) {
        let _ = writeln!(
            out,
            "length      {tokens:.0} output tokens per prompt expected ({:.0}–{:.0}, from the {}; \
             {} finished, {} streaming)",
            e.low,
            e.high,
            e.source.as_str(),
            e.finished,
            e.running
        );
    }
    let _ = writeln!(
        out,
        "speed       {:.0} output tok/s as they stream",
        p.output_tok_s
    );
    let _ = writeln!(
        out,
        "tokens      {} in, {} out (avg {} out per completion)",
        p.total_input_tokens, p.total_output_tokens, p.avg_output_tokens
    );
    if p.cached_tokens > 0 {
        let _ = writeln!(
            out,
            "cache       {} prompt tokens served by the radix cache ({:.0}% of the input)",
            p.cached_tokens,
            100.0 * p.cached_tokens as f64 / p.total_input_tokens.max(1) as f64
        );
    }
    let _ = writeln!(out, "elapsed     {:.2} h", p.elapsed_hours);
    if p.s3_uploaded > 0 {
        let _ = writeln!(
            out,
            "uploaded    {} shards, {} bytes",
            p.s3_uploaded, p.s3_bytes
        );
    }
    for f in findings {
        let _ = writeln!(out, "warning     {f}");
    }
    if !p.instances.is_empty() {
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "{:<24} {:>7} {:>9} {:>6} {:>8} {:>8} {:>10} {:>10} {:>7}",
            "instance",
            "healthy",
            "in-flight",
            "limit",
            "cap",
            "req/s",
            "out tok/s",
            "completed",
            "cached"
        );
        for i in &p.instances {
            let _ = writeln!(
                out,
                "{:<24} {:>7} {:>9} {:>6} {:>8} {:>8.2} {:>10.1} {:>10} {:>7}",
                i.name,
                if i.healthy { "yes" } else { "no" },
                i.in_flight,
                i.concurrency,
                i.server_cap.map_or("?".into(), |c| c.to_string()),
                i.rate_per_sec,
                i.output_tok_s,
                i.completed,
                i.cached_fraction
                    .map_or("?".into(), |f| format!("{:.0}%", f * 100.0))
            );
        }
    }
    for w in &p.warnings {
        let _ = writeln!(out, "warning     {w}");
    }
    text
}
