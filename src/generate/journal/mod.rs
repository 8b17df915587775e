//! The output directory as a crash-safe journal: completion shards and `failed.jsonl` written
//! as whole lines in fsynced batches by one writer thread, and recovery for `--resume` (the
//! done-set, totals so far, torn tails truncated).
//!
//! The run hands the writer its lines through a queue, and wakes it only when it has work to
//! do: a batch's worth of lines, a progress snapshot or a timeline rewrite, the end; otherwise
//! the writer wakes by itself when the sync interval is up. Waking it for every line (as a
//! channel does) cost a thread switch per completion, more than the write itself.

pub mod batch;
mod recover;

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::files::when_a_descriptor_frees;
use super::input::Id;
use crate::server::ServerId;

pub use batch::OutputFormat;
pub use recover::{
    RecordError, Recovered, drop_failures, has_output, recover, reset_retries, shards,
};

/// Prompts that failed for their own reasons: final.
pub const FAILED_FILE: &str = "failed.jsonl";
/// Prompts the fleet failed (retries exhausted on 5xx, 429, timeouts): `--resume` sends them
/// again, so they are not counted as done.
pub const RETRY_FILE: &str = "retry.jsonl";
const SHARD_PREFIX: &str = "completions-";
const SHARD_SUFFIX: &str = ".jsonl";

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}:{line}: not a journal line ({reason}); was this file written by fleet generate?", path.display())]
    Corrupt {
        path: PathBuf,
        line: u64,
        reason: RecordError,
    },
    #[error(
        "{} already holds output of a generate run; pass --resume to continue it, or choose another --out",
        dir.display()
    )]
    NotEmpty { dir: PathBuf },
    #[error("the journal writer stopped unexpectedly")]
    WriterGone,
    #[error(transparent)]
    Progress(#[from] super::progress::ProgressError),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> JournalError + '_ {
    move |source| JournalError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Opens a journal file for appending, waiting out a descriptor table that sockets have filled.
fn append(path: &Path) -> std::io::Result<File> {
    when_a_descriptor_frees(|| OpenOptions::new().create(true).append(true).open(path))
}

pub fn shard_name(index: u32) -> String {
    format!("{SHARD_PREFIX}{index:05}{SHARD_SUFFIX}")
}

fn shard_index(name: &str) -> Option<u32> {
    name.strip_prefix(SHARD_PREFIX)?
        .strip_suffix(SHARD_SUFFIX)?
        .parse()
        .ok()
}

/// One line of a completion shard.
#[derive(Debug, Serialize)]
pub struct CompletionRecord<'a> {
    pub id: &'a Id,
    pub output: &'a str,
    /// A reasoning model's thought, apart from its answer (`output`); absent when the server
    /// returned none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<&'a str>,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub finish_reason: Option<&'a str>,
    pub instance: &'a ServerId,
    pub latency_s: f64,
}

/// Why a prompt is in `failed.jsonl`: its own fault, or (`retries_exhausted`) servers that kept
/// failing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureReason {
    /// The input line is not a prompt (bad JSON, no prompt, wrong types).
    MalformedLine,
    /// The prompt alone does not fit the server's context or input limit.
    PromptTooLong,
    /// Still over the context after clamping max_tokens to what should fit.
    ContextOverflow,
    /// A prompt kind the chosen endpoint cannot take (`messages` to /generate).
    UnsupportedPrompt,
    /// Retryable failures (5xx, 429, timeouts) on every try.
    RetriesExhausted,
    /// A 4xx answer other than an overflow.
    Rejected,
    /// A 200 whose body is not a completion.
    BadResponse,
}

impl FailureReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureReason::MalformedLine => "malformed_line",
            FailureReason::PromptTooLong => "prompt_too_long",
            FailureReason::ContextOverflow => "context_overflow",
            FailureReason::UnsupportedPrompt => "unsupported_prompt",
            FailureReason::RetriesExhausted => "retries_exhausted",
            FailureReason::Rejected => "rejected",
            FailureReason::BadResponse => "bad_response",
        }
    }
}

/// One line of `failed.jsonl` or `retry.jsonl`.
#[derive(Debug, Serialize)]
pub struct FailureRecord<'a> {
    pub id: &'a Id,
    /// 1-based line number in the prompt file.
    pub line: u64,
    pub reason: FailureReason,
    pub error: &'a str,
    /// Hex of the first 64 bits of the line's SHA-256, so `--retry-failed` can tell whether
    /// the line was edited since.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line_hash: Option<String>,
}

/// The job's timeline in its output directory; `generate::timeline` says what its lines hold.
pub const TIMELINE_FILE: &str = "timeline.jsonl";

/// What to do to the timeline file.
#[derive(Debug, Clone, PartialEq)]
pub enum TimelineWrite {
    /// Append these whole lines.
    Append(Vec<u8>),
    /// Replace the file with these lines (atomically).
    Rewrite(Vec<u8>),
}

/// What the writer thread writes: a serialized line (ending in `\n`), or a progress snapshot.
#[derive(Debug)]
pub enum Entry {
    Completion(Vec<u8>),
    /// A prompt that failed for good (`failed.jsonl`).
    Failure(Vec<u8>),
    /// A prompt the fleet failed, to send again on `--resume` (`retry.jsonl`).
    Retry(Vec<u8>),
    /// Written (atomically) after the lines before it are synced, so progress.json never counts
    /// a line that is not on disk, and no file I/O runs on the async threads.
    Progress(Box<super::progress::Progress>),
    /// Lines for `timeline.jsonl`, appended or replacing it.
    Timeline(TimelineWrite),
}

pub fn encode<T: Serialize>(record: &T) -> Vec<u8> {
    // Room for a typical line at once: grown from empty, the buffer was reallocated some six
    // times per line.
    let mut v = Vec::with_capacity(256);
    serde_json::to_writer(&mut v, record).expect("journal records always serialize");
    v.push(b'\n');
    v
}

/// When the writer syncs: after this many lines or this much time, whichever comes first.
#[derive(Debug, Clone, Copy)]
pub struct SyncPolicy {
    pub lines: usize,
    pub interval: Duration,
    /// Completions per shard before starting the next one.
    pub shard_lines: u64,
}

impl Default for SyncPolicy {
    fn default() -> Self {
        SyncPolicy {
            lines: 64,
            interval: Duration::from_millis(200),
            shard_lines: 100_000,
        }
    }
}

/// Totals the writer reports when it is closed.
#[derive(Debug, Default, Clone, Copy)]
pub struct WriterStats {
    pub shards_written: u32,
    pub syncs: u64,
}

/// Where the writer announces each shard it has finished (synced, never appended to again).
pub type FinishedShards = tokio::sync::mpsc::UnboundedSender<PathBuf>;

/// The sending side of the writer thread. Dropping it (or [`Journal::close`]) flushes
/// everything and syncs.
pub struct Journal {
    queue: Arc<Queue>,
    handle: Option<tokio::task::JoinHandle<Result<WriterStats, JournalError>>>,
}

/// What the run has handed the writer and it has not taken yet.
struct Queue {
    state: Mutex<Queued>,
    wake: Condvar,
}

#[derive(Default)]
struct Queued {
    entries: Vec<Entry>,
    /// Lines among `entries` (everything but progress snapshots and timeline rewrites).
    lines: usize,
    /// A progress snapshot or a timeline rewrite is among `entries`: written at once.
    urgent: bool,
    /// No more entries come: flush, sync and stop.
    closed: bool,
    /// The writer is waiting, and wants waking once this many lines are queued.
    waiting_for: Option<usize>,
    /// The writer has stopped (done, or failed: its join handle says why).
    gone: bool,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, Queued> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Marks the writer gone however its thread ends, so that appends fail instead of queueing
/// for nobody.
struct Gone(Arc<Queue>);

impl Drop for Gone {
    fn drop(&mut self) {
        self.0.lock().gone = true;
    }
}

impl Journal {
    /// Starts the writer on a blocking thread; new shards are numbered from `next_shard`. Each
    /// shard is sent to `finished` once it is complete: when the next one starts, or at close.
    pub fn start(
        dir: &Path,
        next_shard: u32,
        policy: SyncPolicy,
        finished: Option<FinishedShards>,
    ) -> Result<Self, JournalError> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let queue = Arc::new(Queue {
            state: Mutex::new(Queued::default()),
            wake: Condvar::new(),
        });
        let mut writer = Writer::new(dir.to_path_buf(), next_shard, policy, finished);
        let gone = Gone(queue.clone());
        let handle = tokio::task::spawn_blocking(move || {
            let _gone = gone;
            writer.run(&_gone.0)
        });
        Ok(Journal {
            queue,
            handle: Some(handle),
        })
    }

    pub fn append(&self, entry: Entry) -> Result<(), JournalError> {
        let mut q = self.queue.lock();
        if q.gone || q.closed {
            return Err(JournalError::WriterGone);
        }
        match entry {
            Entry::Progress(_) | Entry::Timeline(TimelineWrite::Rewrite(_)) => q.urgent = true,
            _ => q.lines += 1,
        }
        q.entries.push(entry);
        if q.waiting_for.is_some_and(|n| q.urgent || q.lines >= n) {
            q.waiting_for = None;
            self.queue.wake.notify_one();
        }
        Ok(())
    }

    /// Tells the writer no more entries come.
    fn end(&self) {
        let mut q = self.queue.lock();
        q.closed = true;
        self.queue.wake.notify_one();
    }

    /// Flushes, syncs and joins the writer, returning its first error.
    pub async fn close(&mut self) -> Result<WriterStats, JournalError> {
        self.end();
        match self.handle.take() {
            Some(h) => h.await.map_err(|_| JournalError::WriterGone)?,
            None => Ok(WriterStats::default()),
        }
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        self.end();
    }
}

struct Writer {
    dir: PathBuf,
    policy: SyncPolicy,
    shard: Option<(File, PathBuf, u64)>,
    next_shard: u32,
    shard_buf: Vec<u8>,
    failed: Appended,
    retry: Appended,
    timeline: Appended,
    pending_lines: usize,
    stats: WriterStats,
    finished: Option<FinishedShards>,
}

impl Writer {
    fn new(
        dir: PathBuf,
        next_shard: u32,
        policy: SyncPolicy,
        finished: Option<FinishedShards>,
    ) -> Self {
        Writer {
            dir,
            policy,
            shard: None,
            next_shard,
            shard_buf: Vec::new(),
            failed: Appended::new(FAILED_FILE),
            retry: Appended::new(RETRY_FILE),
            timeline: Appended::new(TIMELINE_FILE),
            pending_lines: 0,
            stats: WriterStats::default(),
            finished,
        }
    }

    /// Announces the current shard as finished; called only after its lines are synced.
    fn finish_shard(&mut self) {
        if let (Some((_, path, _)), Some(tx)) = (self.shard.take(), &self.finished) {
            // The receiver stops listening when the run is interrupted; the shard stays local.
            let _ = tx.send(path);
        }
    }

    /// Takes what is queued whenever there is a batch's worth (or something urgent), and syncs
    /// after `policy.lines` lines or `policy.interval`, whichever comes first.
    fn run(&mut self, queue: &Queue) -> Result<WriterStats, JournalError> {
        let mut last_sync = Instant::now();
        let mut taken = Vec::new();
        loop {
            let closed = {
                let mut q = queue.lock();
                loop {
                    let wanted = self.policy.lines.saturating_sub(self.pending_lines).max(1);
                    let left = self.policy.interval.saturating_sub(last_sync.elapsed());
                    if q.closed || q.urgent || q.lines >= wanted || left.is_zero() {
                        break;
                    }
                    q.waiting_for = Some(wanted);
                    q = queue
                        .wake
                        .wait_timeout(q, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                    q.waiting_for = None;
                }
                (q.lines, q.urgent) = (0, false);
                std::mem::swap(&mut taken, &mut q.entries);
                q.closed
            };
            for entry in taken.drain(..) {
                self.take(entry)?;
            }
            if closed {
                self.flush()?;
                self.finish_shard();
                return Ok(self.stats);
            }
            if self.pending_lines >= self.policy.lines
                || last_sync.elapsed() >= self.policy.interval
            {
                self.flush()?;
                last_sync = Instant::now();
            }
        }
    }

    fn take(&mut self, entry: Entry) -> Result<(), JournalError> {
        match entry {
            Entry::Completion(line) => {
                let full = self
                    .shard
                    .as_ref()
                    .is_some_and(|(_, _, n)| *n >= self.policy.shard_lines);
                if full {
                    self.flush()?;
                    self.finish_shard();
                }
                if self.shard.is_none() {
                    let path = self.dir.join(shard_name(self.next_shard));
                    self.next_shard += 1;
                    let file = append(&path).map_err(io(&path))?;
                    self.stats.shards_written += 1;
                    self.shard = Some((file, path, 0));
                }
                if let Some((_, _, n)) = &mut self.shard {
                    *n += 1;
                }
                self.shard_buf.extend_from_slice(&line);
            }
            Entry::Failure(line) => self.failed.buf.extend_from_slice(&line),
            Entry::Retry(line) => self.retry.buf.extend_from_slice(&line),
            Entry::Progress(p) => {
                self.flush()?;
                super::progress::write_atomic(&self.dir, &p)?;
                return Ok(());
            }
            Entry::Timeline(TimelineWrite::Append(lines)) => {
                self.timeline.buf.extend_from_slice(&lines)
            }
            Entry::Timeline(TimelineWrite::Rewrite(all)) => {
                // What is buffered is in `all` too: the recorder holds every kept line.
                self.timeline.buf.clear();
                self.timeline.replace(&self.dir, &all)?;
                return Ok(());
            }
        }
        self.pending_lines += 1;
        Ok(())
    }

    /// One `write` per file of whole lines, then fsync: a kill leaves at most a torn tail that
    /// recovery cuts, and a completed write survives the process.
    fn flush(&mut self) -> Result<(), JournalError> {
        if self.pending_lines == 0 {
            return Ok(());
        }
        if !self.shard_buf.is_empty()
            && let Some((file, path, _)) = &mut self.shard
        {
            file.write_all(&self.shard_buf).map_err(io(path))?;
            file.sync_data().map_err(io(path))?;
            self.shard_buf.clear();
        }
        self.failed.flush(&self.dir)?;
        self.retry.flush(&self.dir)?;
        self.timeline.flush(&self.dir)?;
        self.pending_lines = 0;
        self.stats.syncs += 1;
        Ok(())
    }
}

/// A file of whole lines opened on first use, appended to in batches.
struct Appended {
    name: &'static str,
    file: Option<(File, PathBuf)>,
    buf: Vec<u8>,
}

impl Appended {
    fn new(name: &'static str) -> Self {
        Appended {
            name,
            file: None,
            buf: Vec::new(),
        }
    }

    fn flush(&mut self, dir: &Path) -> Result<(), JournalError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        if self.file.is_none() {
            let path = dir.join(self.name);
            let file = append(&path).map_err(io(&path))?;
            self.file = Some((file, path));
        }
        let (file, path) = self.file.as_mut().expect("opened above");
        file.write_all(&self.buf).map_err(io(path))?;
        file.sync_data().map_err(io(path))?;
        self.buf.clear();
        Ok(())
    }

    /// Replaces the file with `all` via a temp file and rename; later appends go to the new one.
    fn replace(&mut self, dir: &Path, all: &[u8]) -> Result<(), JournalError> {
        let path = dir.join(self.name);
        let tmp = dir.join(format!(".{}.tmp", self.name));
        when_a_descriptor_frees(|| std::fs::write(&tmp, all)).map_err(io(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(io(&path))?;
        self.file = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::recover::parse_done;
    use super::*;
    use crate::generate::input::key_of;

    fn id(s: &str) -> Id {
        Id {
            text: s.into(),
            numeric: false,
        }
    }

    fn completion(i: &Id, out_tokens: u64) -> Entry {
        Entry::Completion(encode(&CompletionRecord {
            id: i,
            output: "text",
            reasoning: None,
            prompt_tokens: 10,
            completion_tokens: out_tokens,
            finish_reason: Some("stop"),
            instance: &ServerId::named("a"),
            latency_s: 0.5,
        }))
    }

    fn failure(i: &Id, reason: FailureReason, line_hash: Option<&str>) -> Vec<u8> {
        encode(&FailureRecord {
            id: i,
            line: 9,
            reason,
            error: "x",
            line_hash: line_hash.map(str::to_string),
        })
    }

    #[tokio::test]
    async fn writes_rotates_and_recovers() {
        let dir = tempfile::tempdir().unwrap();
        let policy = SyncPolicy {
            lines: 2,
            interval: Duration::from_millis(10),
            shard_lines: 3,
        };
        let (tx, mut finished) = tokio::sync::mpsc::unbounded_channel();
        let mut j = Journal::start(dir.path(), 0, policy, Some(tx)).unwrap();
        for i in 0..7 {
            j.append(completion(&id(&format!("c{i}")), 5)).unwrap();
        }
        let bad = id("bad");
        j.append(Entry::Failure(failure(
            &bad,
            FailureReason::MalformedLine,
            Some("00000000000000ff"),
        )))
        .unwrap();
        let flaky = id("flaky");
        j.append(Entry::Retry(failure(
            &flaky,
            FailureReason::RetriesExhausted,
            None,
        )))
        .unwrap();
        let stats = j.close().await.unwrap();
        assert_eq!(stats.shards_written, 3);
        assert!(dir.path().join("completions-00002.jsonl").exists());
        // Each shard is announced once, complete: two at rotation, the last at close.
        let mut announced = Vec::new();
        while let Some(p) = finished.recv().await {
            let lines = std::fs::read_to_string(&p).unwrap().lines().count();
            announced.push((p.file_name().unwrap().to_str().unwrap().to_string(), lines));
        }
        let want = [(shard_name(0), 3), (shard_name(1), 3), (shard_name(2), 1)];
        assert_eq!(announced, want);

        let r = recover(dir.path()).unwrap();
        assert_eq!((r.completed.len(), r.failed.len(), r.next_shard), (7, 1, 3));
        assert_eq!((r.input_tokens, r.output_tokens), (70, 35));
        assert!(r.completed.contains(&key_of("c6")) && !r.completed.contains(&key_of("c7")));
        assert_eq!(r.failed[&key_of("bad")], Some(0xff));
        assert!(
            !r.failed.contains_key(&key_of("flaky")),
            "retry.jsonl is sent again, not done"
        );
        assert!(dir.path().join(RETRY_FILE).exists());
        reset_retries(dir.path()).unwrap();
        assert!(!dir.path().join(RETRY_FILE).exists());
    }

    #[test]
    fn torn_tail_is_cut_and_not_counted() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(shard_name(0));
        std::fs::write(
            &p,
            "{\"id\":\"a\",\"prompt_tokens\":1,\"completion_tokens\":2}\n{\"id\":\"b\",\"outp",
        )
        .unwrap();
        let r = recover(dir.path()).unwrap();
        assert_eq!(r.completed.len(), 1);
        assert_eq!(r.truncated_bytes, "{\"id\":\"b\",\"outp".len() as u64);
        assert!(std::fs::read_to_string(&p).unwrap().ends_with("}\n"));
        let again = recover(dir.path()).unwrap();
        assert_eq!((again.completed.len(), again.truncated_bytes), (1, 0));
    }

    #[test]
    fn the_fast_path_reads_what_the_full_parse_reads() {
        let i = id("x\"1");
        let tricky = "he said \"prompt_tokens\":999, fine";
        let line = encode(&CompletionRecord {
            id: &i,
            output: tricky,
            reasoning: Some(tricky),
            prompt_tokens: 12,
            completion_tokens: 34,
            finish_reason: None,
            instance: &ServerId::named("a"),
            latency_s: 1.0,
        });
        assert_eq!(parse_done(&line).unwrap(), (i, 12, 34));
        let big = Id {
            text: "12345678901234567890123".into(),
            numeric: true,
        };
        let line = encode(&CompletionRecord {
            id: &big,
            output: "",
            reasoning: None,
            prompt_tokens: 1,
            completion_tokens: 2,
            finish_reason: None,
            instance: &ServerId::named("a"),
            latency_s: 1.0,
        });
        assert!(line.starts_with(b"{\"id\":12345678901234567890123,"));
        assert!(
            !String::from_utf8_lossy(&line).contains("reasoning"),
            "no thought, no field"
        );
        assert_eq!(parse_done(&line).unwrap().0, big, "no float round-trip");
        assert!(parse_done(b"{\"id\":\"a\",\"output\":\"torn").is_err());
    }

    #[test]
    fn batch_lines_read_back_by_custom_id_with_the_bodys_usage() {
        let body = br#"{"id":"r","object":"text_completion","choices":[{"index":0,"text":"say \"prompt_tokens\":999","finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46,"prompt_tokens_details":null}}"#;
        let answer = |custom_id: &Id| {
            batch::encode_answer(&batch::Answer {
                custom_id,
                body,
                request_id: Some("r"),
                instance: &ServerId::named("a"),
                latency_s: 0.1,
                max_tokens: (64, 64),
            })
        };
        let user = id("batch_req_but_mine");
        let line = answer(&user);
        assert_eq!(parse_done(&line).unwrap(), (user.clone(), 12, 34));
        // The full parse, as for a line another tool rewrote: the same answer.
        let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
        let mut reordered = serde_json::to_vec(&serde_json::json!({
            "error": null, "response": v["response"], "custom_id": v["custom_id"], "id": v["id"],
        }))
        .unwrap();
        reordered.push(b'\n');
        assert_eq!(parse_done(&reordered).unwrap(), (user, 12, 34));
        let n = Id::line(7);
        assert_eq!(parse_done(&answer(&n)).unwrap().0, n, "a numeric custom_id");
        // fleet's own record of an id that happens to look like a batch id still reads as such.
        let own = id("batch_req_x");
        let record = encode(&CompletionRecord {
            id: &own,
            output: "",
            reasoning: None,
            prompt_tokens: 1,
            completion_tokens: 2,
            finish_reason: None,
            instance: &ServerId::named("a"),
            latency_s: 1.0,
        });
        assert_eq!(parse_done(&record).unwrap(), (own, 1, 2));

        let dir = tempfile::tempdir().unwrap();
        let failed = batch::encode_failure(
            &id("long"),
            4,
            FailureReason::PromptTooLong,
            "too long",
            Some("00000000000000ab".into()),
        );
        std::fs::write(dir.path().join(FAILED_FILE), failed).unwrap();
        std::fs::write(dir.path().join(shard_name(0)), answer(&id("ok"))).unwrap();
        let r = recover(dir.path()).unwrap();
        assert_eq!(r.failed[&key_of("long")], Some(0xab));
        assert!(r.completed.contains(&key_of("ok")));
        assert_eq!((r.input_tokens, r.output_tokens), (12, 34));
        assert_eq!(
            drop_failures(dir.path(), |k| k == key_of("long")).unwrap(),
            1
        );
    }

    #[test]
    fn a_corrupt_middle_line_names_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FAILED_FILE), "{\"id\":\"a\"}\nnot json\n").unwrap();
        let e = recover(dir.path()).unwrap_err().to_string();
        assert!(e.contains("failed.jsonl:2"), "{e}");
    }

    #[test]
    fn failures_sent_again_leave_failed_jsonl() {
        let dir = tempfile::tempdir().unwrap();
        let mut text = Vec::new();
        for name in ["a", "b", "c"] {
            text.extend(failure(&id(name), FailureReason::Rejected, None));
        }
        std::fs::write(dir.path().join(FAILED_FILE), text).unwrap();
        let gone = drop_failures(dir.path(), |k| k == key_of("b")).unwrap();
        assert_eq!(gone, 1);
        let r = recover(dir.path()).unwrap();
        assert_eq!(r.failed.len(), 2);
        assert!(!r.failed.contains_key(&key_of("b")));
    }
}
