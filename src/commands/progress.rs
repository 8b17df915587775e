//! `fleet progress JOB|DIR`: a summary of a running or finished generate job from its
//! progress.json, a detached job's (by id) or a local output directory's.

use std::time::SystemTime;

use crate::cli::ProgressArgs;
use crate::generate::progress::{self, PROGRESS_FILE, Status};

use super::output::outln;
use super::{Ctx, Outcome, UsageError};

/// A running job rewrites progress.json every few seconds; older than this, it has likely stopped.
const STALE_AFTER_SECS: u64 = 30;

pub async fn run(ctx: &Ctx, args: &ProgressArgs) -> anyhow::Result<Outcome> {
    if !super::jobs::is_local(&args.job) {
        // Not a local path: a detached job's id.
        let Some(p) = super::jobs::progress(ctx, &args.job).await? else {
            return Ok(Outcome::Partial);
        };
        if ctx.global.json {
            super::print_json(&p)?;
        } else {
            summary(&p, None);
        }
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
    if ctx.global.json {
        super::print_json(&p)?;
        return Ok(Outcome::Ok);
    }
    let age = std::fs::metadata(&file)?
        .modified()
        .ok()
        .and_then(|m| SystemTime::now().duration_since(m).ok())
        .map(|d| d.as_secs());
    summary(&p, age);
    Ok(Outcome::Ok)
}

/// The summary a user reads; `age` is how long ago the file was written, when known.
fn summary(p: &progress::Progress, age: Option<u64>) {
    let pct = if p.total > 0 {
        100.0 * (p.completed + p.failed) as f64 / p.total as f64
    } else {
        100.0
    };
    let eta = p
        .eta_hours
        .map_or("unknown".to_string(), |h| format!("{h:.2} h"));
    outln!("status      {}", p.status.as_str());
    outln!(
        "done        {}/{} ({pct:.1}%), {} failed, {} waiting for a retry",
        p.completed + p.failed,
        p.total,
        p.failed,
        p.waiting_retry
    );
    outln!("rate        {:.2} req/s (recent window)", p.rate_per_sec);
    outln!("eta         {eta}");
    outln!(
        "tokens      {} in, {} out (avg {} out per completion)",
        p.total_input_tokens,
        p.total_output_tokens,
        p.avg_output_tokens
    );
    if p.cached_tokens > 0 {
        outln!(
            "cache       {} prompt tokens served by the radix cache ({:.0}% of the input)",
            p.cached_tokens,
            100.0 * p.cached_tokens as f64 / p.total_input_tokens.max(1) as f64
        );
    }
    outln!("elapsed     {:.2} h", p.elapsed_hours);
    if p.s3_uploaded > 0 {
        outln!("uploaded    {} shards, {} bytes", p.s3_uploaded, p.s3_bytes);
    }
    if let Some(age) = age
        && p.status == Status::Running
        && age > STALE_AFTER_SECS
    {
        outln!(
            "warning     last update {age}s ago: the job may have stopped (resume it with --resume)"
        );
    }
    if !p.instances.is_empty() {
        outln!();
        outln!(
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
            outln!(
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
        outln!("warning     {w}");
    }
}
