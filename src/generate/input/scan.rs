//! The pre-pass over the prompt file, before any request: every id once (a duplicate stops the
//! job with both line numbers), how much of the input earlier runs already wrote, which failed
//! prompts `--retry-failed` sends again, where the work begins, and a hash of the id column for
//! the job's fingerprint, with the file facts the fingerprint records ([`FileFacts`]), all from one
//! open of the file. Only 64-bit hashes of ids are kept in memory.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use sha2::{Digest, Sha256};

use super::{FileFacts, Id, InputError, Position, Reader, content_hash, hex, name};

/// Which failed prompts a resumed job sends again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RetryFailed {
    /// None: a prompt that failed for its own reasons stays failed.
    #[default]
    No,
    /// Those whose line was edited since it failed.
    Changed,
    All,
}

/// What earlier runs of the job wrote.
#[derive(Debug, Clone, Copy)]
pub struct Known<'a> {
    pub completed: &'a HashSet<u128>,
    /// Failed for good: the id's key → the hash of its line when it failed (`None` in records
    /// that predate it).
    pub failed: &'a HashMap<u128, Option<u64>>,
    pub retry: RetryFailed,
}

/// What the pre-pass found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scan {
    /// Prompt lines (non-blank, up to `--limit`).
    pub total: u64,
    /// Where the first line still to do starts; `None` when every line is done.
    pub first_pending: Option<Position>,
    /// Contents that occur more than once without an id → how many copies come before
    /// `first_pending`, for the reader to name the later ones.
    pub repeats: HashMap<u64, u32>,
    /// The byte offset after the last line the job covers: the reader stops there.
    pub end: u64,
    /// Hex SHA-256 of the id column, in order: part of the job's identity.
    pub ids_hash: String,
    /// Lines of this input already completed, and already failed for good.
    pub completed: u64,
    pub failed: u64,
    /// Failed prompts of this input to send again.
    pub retry: HashSet<u128>,
    /// Lines that are OpenAI Batch API lines (`custom_id` and `body`).
    pub batch_lines: u64,
    /// The file's size, mtime and head hash, as this pass opened it.
    pub file: FileFacts,
}

/// Reads every line's id once. Hash collisions are confirmed by a second pass over just the
/// colliding hashes, so distinct ids never report a false duplicate; the same pass numbers the
/// copies of repeated id-less lines.
pub fn scan(path: &Path, limit: Option<u64>, known: &Known<'_>) -> Result<Scan, InputError> {
    let hash64 = |key: u128| (key >> 64) as u64;
    let mut seen: HashSet<u64> = HashSet::new();
    let mut suspects: HashSet<u64> = HashSet::new();
    let mut tally = Tally::new(known);
    let mut reader = Reader::open(path, limit)?.with_head();
    loop {
        let before = reader.position();
        let Some((_, bytes)) = reader.next_raw()? else {
            break;
        };
        let hash = content_hash(bytes);
        let named = name(bytes);
        tally.scan.batch_lines += u64::from(named.batch);
        let key = named.id.unwrap_or_else(|| Id::content(hash, 1)).key();
        if !seen.insert(hash64(key)) {
            suspects.insert(hash64(key));
        }
        tally.line(before, key, hash);
    }
    let end = reader.position().offset;
    let file = reader.facts()?;
    drop(seen);
    if suspects.is_empty() {
        return Ok(tally.finish(end, HashMap::new(), file));
    }

    // Again, with the final ids: named duplicates are errors, repeated contents get numbered.
    let batch_lines = tally.scan.batch_lines;
    let mut tally = Tally::new(known);
    tally.scan.batch_lines = batch_lines;
    let mut first_line: HashMap<String, u64> = HashMap::new();
    let mut copies: HashMap<u64, u32> = HashMap::new();
    let mut before_pending: Option<HashMap<u64, u32>> = None;
    reader.rewind()?;
    loop {
        let before = reader.position();
        let Some((n, bytes)) = reader.next_raw()? else {
            break;
        };
        let hash = content_hash(bytes);
        let (id, repeat) = match name(bytes).id {
            Some(id) => {
                if suspects.contains(&hash64(id.key())) {
                    if let Some(&first) = first_line.get(&id.text) {
                        return Err(InputError::Duplicate {
                            path: path.into(),
                            id: id.text,
                            first_line: first,
                            line: n,
                        });
                    }
                    first_line.insert(id.text.clone(), n);
                }
                (id, false)
            }
            None => {
                let base = Id::content(hash, 1);
                if suspects.contains(&hash64(base.key())) {
                    let n = copies.get(&hash).copied().unwrap_or(0);
                    (Id::content(hash, n + 1), true)
                } else {
                    (base, false)
                }
            }
        };
        if tally.line(before, id.key(), hash) {
            before_pending = Some(copies.clone());
        }
        if repeat {
            *copies.entry(hash).or_insert(0) += 1;
        }
    }
    let mut repeats = before_pending.unwrap_or_default();
    for h in copies.into_keys() {
        repeats.entry(h).or_insert(0);
    }
    Ok(tally.finish(reader.position().offset, repeats, file))
}

/// What one pass counts line by line.
struct Tally<'a> {
    known: &'a Known<'a>,
    scan: Scan,
    ids: Sha256,
}

impl<'a> Tally<'a> {
    fn new(known: &'a Known<'a>) -> Self {
        Tally {
            known,
            scan: Scan::default(),
            ids: Sha256::new(),
        }
    }

    /// Counts the line that starts at `at`; true when it is the first one still to do.
    fn line(&mut self, at: Position, key: u128, content: u64) -> bool {
        let s = &mut self.scan;
        s.total += 1;
        self.ids.update(key.to_le_bytes());
        let done = if self.known.completed.contains(&key) {
            s.completed += 1;
            true
        } else if let Some(recorded) = self.known.failed.get(&key) {
            let again = match self.known.retry {
                RetryFailed::No => false,
                RetryFailed::All => true,
                RetryFailed::Changed => recorded.is_some_and(|h| h != content),
            };
            if again {
                s.retry.insert(key);
            } else {
                s.failed += 1;
            }
            !again
        } else {
            false
        };
        let first = !done && s.first_pending.is_none();
        if first {
            s.first_pending = Some(at);
        }
        first
    }

    fn finish(mut self, end: u64, repeats: HashMap<u64, u32>, file: FileFacts) -> Scan {
        self.scan.ids_hash = hex(&self.ids.finalize());
        self.scan.file = file;
        self.scan.end = end;
        self.scan.repeats = repeats;
        self.scan
    }
}
