//! `fleet progress DIR`: a summary of a running or finished generate job from its progress.json.

use std::time::SystemTime;

use crate::cli::ProgressArgs;
use crate::generate::progress::{self, PROGRESS_FILE, Status};

use super::output::outln;
use super::{Ctx, Outcome, UsageError};

/// A running job rewrites progress.json every few seconds; older than this, it has likely stopped.
const STALE_AFTER_SECS: u64 = 30;

pub fn run(ctx: &Ctx, args: &ProgressArgs) -> anyhow::Result<Outcome> {
    let file = if args.dir.is_dir() {
        args.dir.join(PROGRESS_FILE)
    } else {
        args.dir.clone()
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
        outln!("{}", serde_json::to_string_pretty(&p)?);
        return Ok(Outcome::Ok);
    }
    let age = std::fs::metadata(&file)?
        .modified()
        .ok()
        .and_then(|m| SystemTime::now().duration_since(m).ok())
        .map(|d| d.as_secs());
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
        "done        {}/{} ({pct:.1}%), {} failed",
        p.completed + p.failed,
        p.total,
        p.failed
    );
    outln!("rate        {:.2} req/s (recent window)", p.rate_per_sec);
    outln!("eta         {eta}");
    outln!(
        "tokens      {} in, {} out (avg {} out per completion)",
        p.total_input_tokens,
        p.total_output_tokens,
        p.avg_output_tokens
    );
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
            "{:<24} {:>7} {:>9} {:>6} {:>8} {:>8} {:>10} {:>10}",
            "instance",
            "healthy",
            "in-flight",
            "limit",
            "cap",
            "req/s",
            "out tok/s",
            "completed"
        );
        for i in &p.instances {
            outln!(
                "{:<24} {:>7} {:>9} {:>6} {:>8} {:>8.2} {:>10.1} {:>10}",
                i.name,
                if i.healthy { "yes" } else { "no" },
                i.in_flight,
                i.concurrency,
                i.server_cap.map_or("?".into(), |c| c.to_string()),
                i.rate_per_sec,
                i.output_tok_s,
                i.completed
            );
        }
    }
    Ok(Outcome::Ok)
}
