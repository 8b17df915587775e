//! What an output directory already holds, for `--resume`: the shards and `failed.jsonl` read
//! back (torn tails cut), which ids are done and how, and rewriting `failed.jsonl` without the
//! prompts that are sent again.

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::value::RawValue;

use super::{FAILED_FILE, JournalError, RETRY_FILE, batch, io, shard_index};
use crate::generate::input::{Id, IdError};

/// Why a journal line does not read back.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Id(#[from] IdError),
    #[error("line_hash {value:?}: {source}")]
    LineHash {
        value: String,
        source: std::num::ParseIntError,
    },
}

/// What an output directory already holds.
#[derive(Debug, Default)]
pub struct Recovered {
    /// Keys ([`Id::key`]) of every id in the shards.
    pub completed: HashSet<u128>,
    /// Keys of the ids in `failed.jsonl` (failed for good), with the hash of the line each was
    /// read from when it failed.
    pub failed: HashMap<u128, Option<u64>>,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// The shard index new completions start at.
    pub next_shard: u32,
    /// Bytes of torn final lines cut off.
    pub truncated_bytes: u64,
}

/// Reads a journal line's id and token counts, in either output format. Lines fleet wrote
/// start with `{"id":` and keep the counts after the output text, which is most of the line:
/// the text is skipped, not parsed. JSON escapes quotes inside strings, so the last
/// `"prompt_tokens":` is the field (in a batch line, the body's `usage`: fleet's own fields
/// after it have no counts). Anything else takes the full parse.
pub(super) fn parse_done(line: &[u8]) -> Result<(Id, u64, u64), RecordError> {
    #[derive(Deserialize)]
    struct Full<'a> {
        #[serde(borrow)]
        id: &'a RawValue,
        #[serde(borrow, default)]
        custom_id: Option<&'a RawValue>,
        #[serde(default)]
        prompt_tokens: u64,
        #[serde(default)]
        completion_tokens: u64,
        #[serde(default)]
        response: Option<BatchResponse>,
    }
    #[derive(Deserialize)]
    struct BatchResponse {
        #[serde(default)]
        body: Option<BatchBody>,
    }
    #[derive(Deserialize)]
    struct BatchBody {
        #[serde(default)]
        usage: Option<Usage>,
    }
    #[derive(Deserialize, Default)]
    struct Usage {
        #[serde(default)]
        prompt_tokens: u64,
        #[serde(default)]
        completion_tokens: u64,
    }
    let counts = || {
        Some((
            number_after(line, br#""prompt_tokens":"#)?,
            number_after(line, br#""completion_tokens":"#)?,
        ))
    };
    if line.starts_with(batch::LINE_PREFIX)
        && let Some(custom_id) = batch_custom_id(line)
        && let Some((p, c)) = counts()
    {
        return Ok((Id::from_json(custom_id)?, p, c));
    }
    if !line.starts_with(batch::LINE_PREFIX)
        && let Some(rest) = line.strip_prefix(br#"{"id":"#)
    {
        let mut de = serde_json::Deserializer::from_slice(rest);
        if let Ok(raw) = <&RawValue>::deserialize(&mut de)
            && let (Some(p), Some(c)) = (
                number_after(line, br#""prompt_tokens":"#),
                number_after(line, br#""completion_tokens":"#),
            )
        {
            return Ok((Id::from_json(raw)?, p, c));
        }
    }
    let f: Full = serde_json::from_slice(line)?;
    match f.custom_id {
        Some(custom_id) => {
            let usage = f
                .response
                .and_then(|r| r.body)
                .and_then(|b| b.usage)
                .unwrap_or_default();
            let (p, c) = (usage.prompt_tokens, usage.completion_tokens);
            Ok((Id::from_json(custom_id)?, p, c))
        }
        None => Ok((Id::from_json(f.id)?, f.prompt_tokens, f.completion_tokens)),
    }
}

/// A batch line's `custom_id`, which fleet writes right after its `id`.
fn batch_custom_id(line: &[u8]) -> Option<&RawValue> {
    let rest = line.strip_prefix(br#"{"id":"#)?;
    let mut de = serde_json::Deserializer::from_slice(rest);
    let id = <&RawValue>::deserialize(&mut de).ok()?;
    let after = rest
        .get(id.get().len()..)?
        .strip_prefix(br#","custom_id":"#)?;
    let mut de = serde_json::Deserializer::from_slice(after);
    <&RawValue>::deserialize(&mut de).ok()
}

/// A `failed.jsonl` line's id and the hash of the line it failed on.
fn parse_failed(line: &[u8]) -> Result<(Id, Option<u64>), RecordError> {
    #[derive(Deserialize)]
    struct Failed<'a> {
        #[serde(borrow)]
        id: &'a RawValue,
        #[serde(borrow, default)]
        custom_id: Option<&'a RawValue>,
        line_hash: Option<String>,
        #[serde(default)]
        fleet: Option<Fleet>,
    }
    /// A batch line keeps fleet's fields under `fleet`.
    #[derive(Deserialize)]
    struct Fleet {
        line_hash: Option<String>,
    }
    let f: Failed = serde_json::from_slice(line)?;
    let hash = f
        .line_hash
        .or(f.fleet.and_then(|x| x.line_hash))
        .map(|h| {
            u64::from_str_radix(&h, 16).map_err(|source| RecordError::LineHash { value: h, source })
        })
        .transpose()?;
    Ok((Id::from_json(f.custom_id.unwrap_or(f.id))?, hash))
}

fn number_after(hay: &[u8], key: &[u8]) -> Option<u64> {
    let at = hay.windows(key.len()).rposition(|w| w == key)? + key.len();
    let digits = &hay[at..];
    let end = digits
        .iter()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(digits.len());
    std::str::from_utf8(&digits[..end]).ok()?.parse().ok()
}

/// Whether `dir` holds any journal file.
pub fn has_output(dir: &Path) -> Result<bool, JournalError> {
    Ok(!list_shards(dir)?.is_empty()
        || dir.join(FAILED_FILE).exists()
        || dir.join(RETRY_FILE).exists())
}

/// The completion shards in `dir`, in order.
pub fn shards(dir: &Path) -> Result<Vec<PathBuf>, JournalError> {
    Ok(list_shards(dir)?.into_iter().map(|(_, p)| p).collect())
}

fn list_shards(dir: &Path) -> Result<Vec<(u32, PathBuf)>, JournalError> {
    let mut shards = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(shards),
        Err(e) => return Err(io(dir)(e)),
    };
    for entry in entries {
        let entry = entry.map_err(io(dir))?;
        if let Some(i) = entry.file_name().to_str().and_then(shard_index) {
            shards.push((i, entry.path()));
        }
    }
    shards.sort();
    Ok(shards)
}

/// Cuts a final line that has no newline: the writer was killed in the middle of a write.
fn truncate_torn_tail(path: &Path) -> Result<u64, JournalError> {
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(io(path))?;
    let len = f.metadata().map_err(io(path))?.len();
    if len == 0 {
        return Ok(0);
    }
    // Scan backwards in chunks for the last newline; lines can be long.
    let mut end = len;
    let mut buf = vec![0u8; 64 * 1024];
    let keep = loop {
        let start = end.saturating_sub(buf.len() as u64);
        let chunk = &mut buf[..(end - start) as usize];
        f.seek(SeekFrom::Start(start)).map_err(io(path))?;
        f.read_exact(chunk).map_err(io(path))?;
        if let Some(pos) = chunk.iter().rposition(|&b| b == b'\n') {
            break start + pos as u64 + 1;
        }
        if start == 0 {
            break 0;
        }
        end = start;
    };
    if keep < len {
        f.set_len(keep).map_err(io(path))?;
        f.sync_all().map_err(io(path))?;
    }
    Ok(len - keep)
}

/// Calls `each` with every non-blank line of `path` and its number.
fn lines(
    path: &Path,
    mut each: impl FnMut(u64, &[u8]) -> Result<(), RecordError>,
) -> Result<(), JournalError> {
    let mut reader = BufReader::with_capacity(256 * 1024, File::open(path).map_err(io(path))?);
    let mut line = Vec::new();
    let mut number = 0u64;
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line).map_err(io(path))? == 0 {
            return Ok(());
        }
        number += 1;
        if line.trim_ascii().is_empty() {
            continue;
        }
        each(number, &line).map_err(|reason| JournalError::Corrupt {
            path: path.to_path_buf(),
            line: number,
            reason,
        })?;
    }
}

/// Reads what earlier runs wrote, truncating torn tails so appends start on a line boundary.
/// `retry.jsonl` is not read: its prompts failed for the fleet's reasons and are sent again.
pub fn recover(dir: &Path) -> Result<Recovered, JournalError> {
    let mut r = Recovered::default();
    let shards = list_shards(dir)?;
    r.next_shard = shards.last().map_or(0, |(i, _)| i + 1);
    for (_, path) in shards {
        r.truncated_bytes += truncate_torn_tail(&path)?;
        lines(&path, |_, line| {
            let (id, prompt_tokens, completion_tokens) = parse_done(line)?;
            // Counted once even if a file was copied in twice.
            if r.completed.insert(id.key()) {
                r.input_tokens += prompt_tokens;
                r.output_tokens += completion_tokens;
            }
            Ok(())
        })?;
    }
    let failed = dir.join(FAILED_FILE);
    if failed.exists() {
        r.truncated_bytes += truncate_torn_tail(&failed)?;
        lines(&failed, |_, line| {
            let (id, hash) = parse_failed(line)?;
            r.failed.insert(id.key(), hash);
            Ok(())
        })?;
    }
    Ok(r)
}

/// Rewrites `failed.jsonl` without the ids `drop` says are being sent again, atomically (a
/// temp file and a rename), so each id stays in exactly one place. Returns how many went.
pub fn drop_failures(dir: &Path, drop: impl Fn(u128) -> bool) -> Result<u64, JournalError> {
    let path = dir.join(FAILED_FILE);
    if !path.exists() {
        return Ok(0);
    }
    let tmp = dir.join(".failed.jsonl.tmp");
    let mut out = File::create(&tmp).map_err(io(&tmp))?;
    let mut dropped = 0;
    let mut write_err = None;
    lines(&path, |_, line| {
        let (id, _) = parse_failed(line)?;
        if drop(id.key()) {
            dropped += 1;
        } else if let Err(e) = out.write_all(line) {
            write_err.get_or_insert(e);
        }
        Ok(())
    })?;
    if let Some(e) = write_err {
        return Err(io(&tmp)(e));
    }
    out.sync_all().map_err(io(&tmp))?;
    std::fs::rename(&tmp, &path).map_err(io(&path))?;
    Ok(dropped)
}

/// Empties `retry.jsonl` at the start of a run: its prompts are sent again, and what fails
/// for the fleet's reasons this time is written anew.
pub fn reset_retries(dir: &Path) -> Result<(), JournalError> {
    let path = dir.join(RETRY_FILE);
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io(&path)(e)),
    }
}
