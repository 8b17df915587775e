//! Making an output directory ready for a run, before any request: it must be a directory we
//! can write, locked for this job alone, empty unless resuming; a resumed job must be over the
//! same input (or told otherwise); the pre-pass says what is left; `--retry-failed` takes its
//! prompts out of `failed.jsonl`. Blocking file I/O: run it off the async threads.

use std::collections::HashSet;
use std::path::PathBuf;
use std::thread::ScopedJoinHandle;

use super::core::Baseline;
use super::input::prefix::PrefixPlan;
use super::input::{self, InputError, Known, RetryFailed, Scan};
use super::journal::OutputFormat;
use super::lock::OutputLock;
use super::{GenerateConfig, GenerateError, PlacementMode, identity, journal};

/// A directory ready for a run.
#[derive(Debug)]
pub struct Prepared {
    /// Held until the run ends.
    pub lock: OutputLock,
    pub scan: Scan,
    /// Keys of the ids the reader skips: completed, or failed for good and not sent again.
    pub done: HashSet<u128>,
    pub base: Baseline,
    /// The shard index new completions start at.
    pub next_shard: u32,
    /// Bytes of torn final lines a crash left, cut off.
    pub truncated_bytes: u64,
    /// Shards of earlier runs, finished: with `--upload`, they go first.
    pub earlier_shards: Vec<PathBuf>,
    /// What the job writes.
    pub format: OutputFormat,
    /// The input's prefix groups, unless `--placement least-loaded`.
    pub prefix: Option<PrefixPlan>,
}

pub fn prepare(c: &GenerateConfig) -> Result<Prepared, GenerateError> {
    let out = &c.out;
    if out.exists() && !out.is_dir() {
        return Err(GenerateError::OutNotADirectory { dir: out.clone() });
    }
    std::fs::create_dir_all(out).map_err(|source| GenerateError::OutUnusable {
        dir: out.clone(),
        source,
    })?;
    let lock = OutputLock::acquire(out)?;
    // The prefix scan reads the whole input, done lines too, so a resumed job deals the same
    // homes: on a thread of its own beside the recovery and the id scan, not after them.
    std::thread::scope(|s| {
        let prefix = match c.placement {
            PlacementMode::LeastLoaded => None,
            PlacementMode::Auto | PlacementMode::Prefix => {
                Some(s.spawn(|| input::prefix::scan(&c.prompts, c.limit, c.max_tokens)))
            }
        };
        locked(c, lock, prefix)
    })
}

type PrefixScan<'s> = ScopedJoinHandle<'s, Result<PrefixPlan, InputError>>;

/// The rest of [`prepare`], with the directory locked and the prefix scan under way.
fn locked(
    c: &GenerateConfig,
    lock: OutputLock,
    prefix: Option<PrefixScan<'_>>,
) -> Result<Prepared, GenerateError> {
    let out = &c.out;
    let had_output = journal::has_output(out)?;
    if !c.resume && had_output {
        return Err(journal::JournalError::NotEmpty { dir: out.clone() }.into());
    }
    let job = if c.resume { identity::read(out)? } else { None };
    let recovered = if c.resume {
        journal::recover(out)?
    } else {
        journal::Recovered::default()
    };
    let known = Known {
        completed: &recovered.completed,
        failed: &recovered.failed,
        retry: c.retry_failed,
    };
    let scan = input::scan(&c.prompts, c.limit, &known)?;
    let format = output_format(c, &scan, job.as_ref(), had_output)?;
    let mut now = identity::of(&c.prompts, &scan);
    now.output_format = Some(format);
    // Editing failed lines is what --retry-failed is for, so it accepts a changed input too.
    let may_change = c.allow_changed_input || c.retry_failed != RetryFailed::No;
    if c.resume
        && !may_change
        && let Some(job) = &job
    {
        let changes = identity::changes(job, &now);
        if !changes.is_empty() {
            return Err(GenerateError::InputChanged {
                dir: out.clone(),
                changes,
            });
        }
    }
    identity::write(out, &now)?;
    if !scan.retry.is_empty() {
        journal::drop_failures(out, |k| scan.retry.contains(&k))?;
    }
    journal::reset_retries(out)?;
    let mut done = recovered.completed;
    done.extend(
        recovered
            .failed
            .into_keys()
            .filter(|k| !scan.retry.contains(k)),
    );
    let earlier_shards = if c.upload.is_some() {
        journal::shards(out)?
    } else {
        Vec::new()
    };
    let prefix = match prefix {
        Some(scan) => Some(
            scan.join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p))?,
        ),
        None => None,
    };
    Ok(Prepared {
        lock,
        prefix,
        base: Baseline {
            total: scan.total,
            completed: scan.completed,
            failed: scan.failed,
            input_tokens: recovered.input_tokens,
            output_tokens: recovered.output_tokens,
        },
        scan,
        done,
        next_shard: recovered.next_shard,
        truncated_bytes: recovered.truncated_bytes,
        earlier_shards,
        format,
    })
}

/// What the job writes: what it began with when it has output already (a job is one format
/// throughout), else `--output-format`, else the Batch API's when every line is a Batch API line
/// and the answers are OpenAI bodies (not `--endpoint generate`).
fn output_format(
    c: &GenerateConfig,
    scan: &Scan,
    job: Option<&identity::Fingerprint>,
    had_output: bool,
) -> Result<OutputFormat, GenerateError> {
    let began = job
        .and_then(|j| j.output_format)
        .or(had_output.then_some(OutputFormat::Fleet));
    if let Some(job) = began {
        return match c.output_format {
            Some(asked) if asked != job => Err(GenerateError::FormatChanged {
                dir: c.out.clone(),
                asked,
                job,
            }),
            _ => Ok(job),
        };
    }
    let all_batch = scan.total > 0 && scan.batch_lines == scan.total;
    Ok(c.output_format.unwrap_or(
        if all_batch && c.api != Some(crate::sglang::client::Api::Generate) {
            OutputFormat::OpenaiBatch
        } else {
            OutputFormat::Fleet
        },
    ))
}
