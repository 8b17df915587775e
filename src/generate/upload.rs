//! `--upload`: the destination (`s3://BUCKET/PREFIX` or `file:///DIR`, through object_store)
//! and the background task that uploads each finished completion shard once, with retries.
//!
//! "Once" is checked against the destination itself: a shard whose object already exists with
//! the same size is not sent again. Finished shards never change (a resumed run starts a new
//! shard), so the size identifies the upload, and no local manifest can disagree with the
//! bucket.

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::journal::{self, FinishedShards};

/// Shards up to this size go in one PUT; larger ones as a multipart upload of such parts (the
/// smallest part S3 accepts, which keeps the memory an upload needs small).
const PART_BYTES: usize = 5 * 1024 * 1024;
/// Parts in flight at once: bounds memory to a few parts whatever the shard size.
const PARTS_IN_FLIGHT: usize = 2;
/// How long an interrupted multipart upload may take to be cleaned up.
const ABORT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    #[error(
        "--upload {spec:?}: {reason}; expected s3://BUCKET/PREFIX (credentials, region and \
         endpoint from the AWS_* environment) or file:///ABSOLUTE/DIR"
    )]
    BadDestination {
        spec: String,
        reason: BadDestination,
    },
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{object}: {source}")]
    Store {
        object: String,
        #[source]
        source: object_store::Error,
    },
    #[error(transparent)]
    Journal(#[from] journal::JournalError),
    #[error("interrupted before it was uploaded")]
    Interrupted,
    #[error("the upload task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// What is wrong with an `--upload` destination.
#[derive(Debug, thiserror::Error)]
pub enum BadDestination {
    #[error("no bucket name")]
    NoBucket,
    #[error("{0}")]
    Prefix(object_store::path::Error),
    #[error("{}", with_cause(.0))]
    S3(object_store::Error),
    #[error("a file:// destination needs an absolute path")]
    NotAbsolute,
    #[error("{0}")]
    CreateDir(std::io::Error),
    #[error("{0}")]
    Local(object_store::Error),
    #[error("unknown scheme")]
    UnknownScheme,
}

impl UploadError {
    /// Whether trying again later can help: object_store already retried each request, so
    /// what is left is an outage, not a missing bucket or a refused credential.
    fn is_transient(&self) -> bool {
        use object_store::Error as E;
        match self {
            UploadError::Store { source, .. } => !matches!(
                source,
                E::NotFound { .. }
                    | E::PermissionDenied { .. }
                    | E::Unauthenticated { .. }
                    | E::InvalidPath { .. }
                    | E::NotSupported { .. }
                    | E::NotImplemented { .. }
                    | E::UnknownConfigurationKey { .. }
            ),
            _ => false,
        }
    }
}

/// Where finished shards go.
#[derive(Debug, Clone)]
pub struct Destination {
    store: Arc<dyn ObjectStore>,
    prefix: Option<ObjectPath>,
    /// `s3://BUCKET` or `file:///DIR`: what object paths are relative to.
    root: String,
}

impl Destination {
    /// Opens `s3://BUCKET/PREFIX` (AWS settings from the environment, as the AWS CLI reads
    /// them, e.g. `AWS_ENDPOINT_URL` and `AWS_ALLOW_HTTP=true` for a local S3-compatible
    /// server) or `file:///DIR` (created if missing). Nothing is sent over the network yet.
    pub fn open(spec: &str) -> Result<Destination, UploadError> {
        let bad = |reason| UploadError::BadDestination {
            spec: spec.to_string(),
            reason,
        };
        if let Some(rest) = spec.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(bad(BadDestination::NoBucket));
            }
            let prefix = prefix.trim_end_matches('/');
            let prefix = if prefix.is_empty() {
                None
            } else {
                Some(ObjectPath::parse(prefix).map_err(|e| bad(BadDestination::Prefix(e)))?)
            };
            crate::sglang::client::install_tls_provider();
            let store = AmazonS3Builder::from_env()
                .with_bucket_name(bucket)
                .build()
                .map_err(|e| bad(BadDestination::S3(e)))?;
            Ok(Destination {
                store: Arc::new(store),
                prefix,
                root: format!("s3://{bucket}"),
            })
        } else if let Some(dir) = spec.strip_prefix("file://") {
            if !dir.starts_with('/') {
                return Err(bad(BadDestination::NotAbsolute));
            }
            std::fs::create_dir_all(dir).map_err(|e| bad(BadDestination::CreateDir(e)))?;
            let store =
                LocalFileSystem::new_with_prefix(dir).map_err(|e| bad(BadDestination::Local(e)))?;
            Ok(Destination {
                store: Arc::new(store),
                prefix: None,
                root: spec.trim_end_matches('/').to_string(),
            })
        } else {
            Err(bad(BadDestination::UnknownScheme))
        }
    }

    fn object(&self, name: &str) -> ObjectPath {
        match &self.prefix {
            Some(p) => p.clone().join(name),
            None => ObjectPath::from(name),
        }
    }

    /// An error about `object`, named as the user would look for it.
    fn error(&self, object: &ObjectPath, source: object_store::Error) -> UploadError {
        UploadError::Store {
            object: format!("{}/{}", self.root, object),
            source,
        }
    }
}

/// `e`'s message and its innermost cause, which is what says what went wrong (such as "No CA
/// certificates were loaded from the system" under "builder error").
fn with_cause(e: &dyn std::error::Error) -> String {
    let mut inner = e.source();
    let mut cause = None;
    while let Some(s) = inner {
        cause = Some(s.to_string());
        inner = s.source();
    }
    match cause {
        Some(c) => format!("{e}: {c}"),
        None => e.to_string(),
    }
}

/// Retries of a whole shard after object_store's own per-request retries gave up.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Tries per shard, the first included.
    pub attempts: u32,
    pub base: Duration,
    pub cap: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 5,
            base: Duration::from_secs(2),
            cap: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// The wait after failed try `n` (1-based): doubling from `base`, at most `cap`.
    fn backoff(&self, n: u32) -> Duration {
        self.base
            .saturating_mul(1u32 << n.saturating_sub(1).min(16))
            .min(self.cap)
    }
}

/// What the uploader did, for the run to count and show.
#[derive(Debug, Clone)]
pub enum UploadEvent {
    Uploaded {
        shard: String,
        bytes: u64,
        elapsed: Duration,
    },
    /// Uploaded by an earlier run: the object is there with the same size.
    AlreadyThere {
        shard: String,
        bytes: u64,
    },
    Retrying {
        shard: String,
        attempt: u32,
        wait: Duration,
        error: String,
    },
    Failed {
        shard: String,
        error: String,
    },
}

/// Shards of the output directory that are not in the destination, by name, with why.
pub type NotUploaded = BTreeMap<String, String>;

/// The background uploader: takes finished shard paths, uploads them in order, and reports
/// [`UploadEvent`]s. Stops at cancellation; whatever it did not upload stays local.
pub struct Uploader {
    tx: Option<FinishedShards>,
    events: mpsc::UnboundedReceiver<UploadEvent>,
    task: tokio::task::JoinHandle<HashSet<String>>,
    failures: NotUploaded,
    /// Cancelled with the run, or alone by [`Uploader::abandon`].
    stop: CancellationToken,
}

impl Uploader {
    /// Starts the task with `earlier` (finished shards of earlier runs) queued first.
    pub fn start(
        dest: Destination,
        policy: RetryPolicy,
        earlier: Vec<PathBuf>,
        cancel: &CancellationToken,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        for shard in earlier {
            tx.send(shard).expect("the receiver is held above");
        }
        let (events_tx, events) = mpsc::unbounded_channel();
        let stop = cancel.child_token();
        let task = tokio::spawn(work(dest, policy, stop.clone(), rx, events_tx));
        Uploader {
            tx: Some(tx),
            events,
            task,
            failures: NotUploaded::new(),
            stop,
        }
    }

    /// Stops at once and joins the task, for a run that ends before it began.
    pub async fn abandon(mut self) {
        self.stop.cancel();
        self.tx.take();
        let _ = self.task.await;
    }

    /// Where finished shards are sent (the journal's writer holds one).
    pub fn queue(&self) -> Option<FinishedShards> {
        self.tx.clone()
    }

    /// The next event; pending forever once the uploader has stopped, so it can sit in a
    /// `select!` beside other work.
    pub async fn event(&mut self) -> UploadEvent {
        match self.events.recv().await {
            Some(e) => {
                self.note(&e);
                e
            }
            None => std::future::pending().await,
        }
    }

    fn note(&mut self, e: &UploadEvent) {
        if let UploadEvent::Failed { shard, error } = e {
            self.failures.insert(shard.clone(), error.clone());
        }
    }

    /// Waits until every shard sent so far is uploaded (or the run is cancelled), passing on
    /// the remaining events, and returns the shards of `out` that are not in the destination.
    /// Call it after the journal is closed, so its last shard is queued.
    pub async fn finish(
        mut self,
        out: &Path,
        mut on_event: impl FnMut(UploadEvent),
    ) -> Result<NotUploaded, UploadError> {
        self.tx.take();
        while let Some(e) = self.events.recv().await {
            self.note(&e);
            on_event(e);
        }
        let uploaded = self.task.await.map_err(UploadError::Task)?;
        let mut missing = self.failures;
        for path in journal::shards(out)? {
            let name = shard_name(&path);
            if !uploaded.contains(&name) && !missing.contains_key(&name) {
                missing.insert(name, UploadError::Interrupted.to_string());
            }
        }
        Ok(missing)
    }
}

fn shard_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Returns the names of the shards that are in the destination.
async fn work(
    dest: Destination,
    policy: RetryPolicy,
    cancel: CancellationToken,
    mut rx: mpsc::UnboundedReceiver<PathBuf>,
    events: mpsc::UnboundedSender<UploadEvent>,
) -> HashSet<String> {
    let mut uploaded = HashSet::new();
    loop {
        let path = tokio::select! {
            biased;
            _ = cancel.cancelled() => break,
            p = rx.recv() => match p {
                Some(p) => p,
                None => break,
            },
        };
        let shard = shard_name(&path);
        let t0 = Instant::now();
        let result = with_retries(
            &policy,
            &cancel,
            || send(&dest, &path, &cancel),
            |n, wait, e| {
                let _ = events.send(UploadEvent::Retrying {
                    shard: shard.clone(),
                    attempt: n,
                    wait,
                    error: e.to_string(),
                });
            },
        )
        .await;
        let event = match result {
            Ok(Sent::Uploaded(bytes)) => UploadEvent::Uploaded {
                shard: shard.clone(),
                bytes,
                elapsed: t0.elapsed(),
            },
            Ok(Sent::AlreadyThere(bytes)) => UploadEvent::AlreadyThere {
                shard: shard.clone(),
                bytes,
            },
            Err(UploadError::Interrupted) => break,
            Err(e) => UploadEvent::Failed {
                shard: shard.clone(),
                error: e.to_string(),
            },
        };
        if !matches!(event, UploadEvent::Failed { .. }) {
            uploaded.insert(shard);
        }
        let _ = events.send(event);
    }
    uploaded
}

/// Runs `attempt` until it succeeds, fails for good, or `policy.attempts` tries are spent,
/// waiting [`RetryPolicy::backoff`] between tries (cut short by cancellation).
async fn with_retries<T, F, Fut>(
    policy: &RetryPolicy,
    cancel: &CancellationToken,
    mut attempt: F,
    mut on_retry: impl FnMut(u32, Duration, &UploadError),
) -> Result<T, UploadError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, UploadError>>,
{
    let mut n = 1;
    loop {
        match attempt().await {
            Ok(v) => return Ok(v),
            Err(e) if !e.is_transient() || n >= policy.attempts => return Err(e),
            Err(e) => {
                let wait = policy.backoff(n);
                on_retry(n, wait, &e);
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = cancel.cancelled() => return Err(UploadError::Interrupted),
                }
                n += 1;
            }
        }
    }
}

enum Sent {
    Uploaded(u64),
    AlreadyThere(u64),
}

/// Uploads one shard unless the destination already holds an object of its size.
async fn send(
    dest: &Destination,
    path: &Path,
    cancel: &CancellationToken,
) -> Result<Sent, UploadError> {
    let read_err = |source| UploadError::Read {
        path: path.to_path_buf(),
        source,
    };
    let object = dest.object(&shard_name(path));
    let store_err = |e| dest.error(&object, e);
    let size = tokio::fs::metadata(path).await.map_err(read_err)?.len();
    match dest.store.head(&object).await {
        Ok(meta) if meta.size == size => return Ok(Sent::AlreadyThere(size)),
        Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
        Err(e) => return Err(store_err(e)),
    }
    if size <= PART_BYTES as u64 {
        let data = tokio::fs::read(path).await.map_err(read_err)?;
        if data.len() as u64 != size {
            return Err(read_err(std::io::Error::other(
                "the shard changed while uploading",
            )));
        }
        tokio::select! {
            r = dest.store.put(&object, PutPayload::from(data)) => r.map_err(store_err)?,
            _ = cancel.cancelled() => return Err(UploadError::Interrupted),
        };
        return Ok(Sent::Uploaded(size));
    }
    let upload = dest.store.put_multipart(&object).await.map_err(store_err)?;
    let mut parts = WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
    match feed(&mut parts, path, cancel, store_err).await {
        Ok(()) => {
            parts.finish().await.map_err(store_err)?;
            Ok(Sent::Uploaded(size))
        }
        Err(e) => {
            // An abandoned multipart upload keeps its parts (and their cost) in the bucket.
            let _ = tokio::time::timeout(ABORT_TIMEOUT, parts.abort()).await;
            Err(e)
        }
    }
}

/// Streams the file into `parts`, a part at a time.
async fn feed(
    parts: &mut WriteMultipart,
    path: &Path,
    cancel: &CancellationToken,
    store_err: impl Fn(object_store::Error) -> UploadError,
) -> Result<(), UploadError> {
    let read_err = |source| UploadError::Read {
        path: path.to_path_buf(),
        source,
    };
    let mut file = tokio::fs::File::open(path).await.map_err(read_err)?;
    loop {
        tokio::select! {
            r = parts.wait_for_capacity(PARTS_IN_FLIGHT) => r.map_err(&store_err)?,
            _ = cancel.cancelled() => return Err(UploadError::Interrupted),
        }
        let mut buf = Vec::with_capacity(PART_BYTES);
        (&mut file)
            .take(PART_BYTES as u64)
            .read_to_end(&mut buf)
            .await
            .map_err(read_err)?;
        if buf.is_empty() {
            return Ok(());
        }
        parts.put(Bytes::from(buf));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn outage() -> UploadError {
        UploadError::Store {
            object: "s3://b/x".into(),
            source: object_store::Error::Generic {
                store: "S3",
                source: "503 Slow Down".into(),
            },
        }
    }

    #[test]
    fn destinations_are_parsed_and_bad_ones_named() {
        let d = Destination::open("s3://bucket/runs/today/").unwrap();
        assert_eq!(
            d.object("completions-00000.jsonl").as_ref(),
            "runs/today/completions-00000.jsonl"
        );
        assert_eq!(d.root, "s3://bucket");
        let bare = Destination::open("s3://bucket").unwrap();
        assert_eq!(bare.object("a.jsonl").as_ref(), "a.jsonl");
        for (spec, why) in [
            ("s3:///x", "no bucket name"),
            ("file://rel/dir", "absolute path"),
            ("gs://b/x", "unknown scheme"),
            ("s3://b/a//c", "s3://BUCKET/PREFIX"),
        ] {
            let e = Destination::open(spec).unwrap_err().to_string();
            assert!(e.contains(spec) && e.contains(why), "{spec}: {e}");
        }
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let p = RetryPolicy::default();
        let waits: Vec<u64> = (1..=7).map(|n| p.backoff(n).as_secs()).collect();
        assert_eq!(waits, [2, 4, 8, 16, 32, 60, 60]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_outage_is_retried_with_backoff_then_given_up() {
        let policy = RetryPolicy::default();
        let cancel = CancellationToken::new();
        let tries = Cell::new(0);
        let mut waits = Vec::new();
        let t0 = Instant::now();
        let r: Result<(), _> = with_retries(
            &policy,
            &cancel,
            || {
                tries.set(tries.get() + 1);
                async { Err(outage()) }
            },
            |n, wait, _| waits.push((n, wait.as_secs())),
        )
        .await;
        assert!(matches!(r, Err(UploadError::Store { .. })));
        assert_eq!(tries.get(), 5);
        assert_eq!(waits, [(1, 2), (2, 4), (3, 8), (4, 16)]);
        assert_eq!(t0.elapsed(), Duration::from_secs(30));
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_is_not_retried_and_a_recovery_succeeds() {
        let policy = RetryPolicy::default();
        let cancel = CancellationToken::new();
        let tries = Cell::new(0);
        let denied = with_retries(
            &policy,
            &cancel,
            || {
                tries.set(tries.get() + 1);
                async {
                    Err::<(), _>(UploadError::Store {
                        object: "s3://b/x".into(),
                        source: object_store::Error::PermissionDenied {
                            path: "x".into(),
                            source: "403".into(),
                        },
                    })
                }
            },
            |_, _, _| {},
        )
        .await;
        assert!(denied.is_err());
        assert_eq!(tries.get(), 1);

        let tries = Cell::new(0);
        let ok = with_retries(
            &policy,
            &cancel,
            || {
                tries.set(tries.get() + 1);
                let n = tries.get();
                async move { if n < 3 { Err(outage()) } else { Ok(n) } }
            },
            |_, _, _| {},
        )
        .await;
        assert_eq!(ok.unwrap(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn cancellation_cuts_the_backoff_short() {
        let policy = RetryPolicy::default();
        let cancel = CancellationToken::new();
        let c = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            c.cancel();
        });
        let t0 = Instant::now();
        let r: Result<(), _> =
            with_retries(&policy, &cancel, || async { Err(outage()) }, |_, _, _| {}).await;
        assert!(matches!(r, Err(UploadError::Interrupted)));
        assert_eq!(t0.elapsed(), Duration::from_secs(1));
    }
}
