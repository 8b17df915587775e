//! `fleet generate`'s shell around the core: it prepares the output directory (resume, id
//! scan), asks every server for its capacity, starts the journal, the uploader and the input
//! reader, drives the core over HTTP, and closes everything on every path, writing the final
//! progress.json last.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant as StdInstant;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::core::placement::{LeastLoaded, Placement, Prefix};
use super::core::{
    Attempt, CacheExpectation, Core, CoreConfig, End, HostLoss, Input, ProbeKind, ProbeResult,
    Server,
};
use super::drive::{self, Clock, Driver, Output};
use super::input::{self, Ids, Line, Scan};
use super::journal::{self, Entry, Journal};
use super::prepare::{self, Prepared};
use super::progress::{self, Progress, Status};
use super::timeline::{Recorder, TIMELINE_FILE, Timeline};
use super::upload::Uploader;
use super::{
    Event, GenerateConfig, GenerateError, PlacementChoice, PlacementMode, Summary, Targets,
};
use crate::remote::{Link, Tunnel};
use crate::sglang::client::{CompletionRequest, Endpoint, SglangClient, http_client};

/// Runs the job over `targets` until every prompt is written, the token is cancelled, or the
/// run cannot go on, then closes the targets' port forwards. Reports through `on_event`; never
/// prints.
pub async fn run(
    config: GenerateConfig,
    targets: Targets,
    on_event: impl FnMut(Event) + Send,
    cancel: CancellationToken,
) -> Result<Summary, GenerateError> {
    let Targets {
        endpoints,
        links,
        tunnels,
    } = targets;
    let result = run_on(config, endpoints, links, on_event, cancel).await;
    futures::future::join_all(tunnels.into_iter().map(Tunnel::close)).await;
    result
}

async fn run_on(
    config: GenerateConfig,
    endpoints: Vec<Endpoint>,
    links: Vec<(String, watch::Receiver<Link>)>,
    mut on_event: impl FnMut(Event) + Send,
    cancel: CancellationToken,
) -> Result<Summary, GenerateError> {
    if endpoints.is_empty() {
        return Err(GenerateError::NoEndpoints);
    }
    let ready = {
        let c = config.clone();
        blocking(move || prepare::prepare(&c)).await??
    };
    let Prepared {
        lock: _lock,
        scan,
        done,
        base,
        next_shard,
        truncated_bytes,
        earlier_shards,
        format,
        prefix,
    } = ready;

    let http = http_client(config.http)?;
    let clients: Vec<SglangClient> = endpoints
        .into_iter()
        .map(|e| SglangClient::new(http.clone(), e).with_own_connections(config.http))
        .collect();
    let infos = tokio::select! {
        r = futures::future::join_all(clients.iter().map(|c| c.server_info())) => r,
        _ = cancel.cancelled() => {
            let progress = Progress::before_start(&base, Status::Interrupted);
            return Ok(Summary { ended: End::Interrupted, progress, not_uploaded: Default::default() });
        }
    };
    if infos.iter().all(Result::is_err) {
        let lines: Vec<String> = infos
            .iter()
            .filter_map(|r| r.as_ref().err())
            .map(|e| format!("  {e}"))
            .collect();
        return Err(GenerateError::NoInstances(lines.join("\n")));
    }
    // A server that streams only the new text of each chunk says so in its args.
    let incremental: Vec<bool> = infos
        .iter()
        .map(|i| {
            i.as_ref().is_ok_and(|i| {
                i.raw.get("incremental_streaming_output") == Some(&serde_json::Value::Bool(true))
            })
        })
        .collect();
    let servers = clients
        .iter()
        .zip(infos)
        .map(|(c, info)| Server {
            id: c.endpoint().id.clone(),
            url: c.endpoint().base_url.clone(),
            info,
        })
        .collect();
    let seed = rand::random();
    let choice = prefix.as_ref().map(|p| PlacementChoice {
        prefix: config.placement == PlacementMode::Prefix
            || (config.placement == PlacementMode::Auto && p.worth_it()),
        mode: config.placement,
        groups: p.groups.len() as u64,
        grouped_prompts: p.prompts() - p.ungrouped.prompts,
        prompts: p.prompts(),
        expected_cached_fraction: p.expected_cached_fraction(),
    });
    let (placement, cache): (Box<dyn Placement>, _) = match (&prefix, &choice) {
        (Some(p), Some(c)) if c.prefix => (
            Box::new(Prefix::by_name(
                p,
                &clients
                    .iter()
                    .map(|c| c.endpoint().id.to_string())
                    .collect::<Vec<_>>(),
            )),
            Some(CacheExpectation {
                cached_fraction: p.expected_cached_fraction(),
                prefix_tokens: p.groups.values().map(|g| g.shared_tokens).sum(),
            }),
        ),
        _ => (Box::new(LeastLoaded::new()), None),
    };
    drop(prefix);
    if let Some(c) = choice {
        on_event(Event::Placement(c));
    }
    let mut core_config = CoreConfig::from_generate(&config, seed);
    core_config.format = format;
    let mut core = Core::with_placement(core_config, base, servers, placement);
    if let Some(e) = cache {
        core.expect_cache(e);
    }
    let mut timeline = {
        let (dir, resume) = (config.out.clone(), config.resume);
        let earlier = blocking(move || read_timeline(&dir, resume)).await?;
        Recorder::new(earlier, config.timing.progress_every.as_secs_f64())
    };
    let started = Event::Started {
        total: scan.total,
        already_done: base.completed + base.failed,
        truncated_bytes,
        instances: core.instances(),
    };
    let started_mark = timeline.mark(unix_now(), &started);
    on_event(started);

    let mut uploader = config
        .upload
        .as_ref()
        .map(|dest| Uploader::start(dest.clone(), config.upload_retry, earlier_shards, &cancel));
    let queue = uploader.as_ref().and_then(Uploader::queue);
    let mut journal = match Journal::start(&config.out, next_shard, config.sync, queue) {
        Ok(j) => j,
        Err(e) => {
            if let Some(u) = uploader {
                u.abandon().await;
            }
            return Err(e.into());
        }
    };
    if let Some(w) = started_mark {
        journal.append(Entry::Timeline(w))?;
    }
    let (line_tx, line_rx) = mpsc::channel::<Vec<Line>>(INPUT_BATCHES);
    let scan_end = scan.end;
    let reader = {
        let (path, limit) = (config.prompts.clone(), config.limit);
        tokio::task::spawn_blocking(move || read_input(path, limit, scan, done, line_tx))
    };

    let clock = Clock {
        start: Instant::now(),
    };
    let feed = tokio_stream_of(line_rx)
        .flat_map(futures::stream::iter)
        .map(Input::Line);
    let uploads = match &mut uploader {
        Some(u) => futures::stream::unfold(u, |u| async move {
            let e = u.event().await;
            Some((Input::Upload(e), u))
        })
        .left_stream(),
        None => futures::stream::pending().right_stream(),
    };
    let events = futures::stream::select(uploads, link_events(links));
    let driver = HttpDriver {
        clients: clients.into_iter().map(Arc::new).collect(),
        incremental,
        // The Batch API's output keeps the server's own answer, byte for byte, which only an
        // unstreamed request gives.
        stream: format != journal::OutputFormat::OpenaiBatch,
    };
    let loop_result = drive::drive(
        &mut core,
        clock,
        &driver,
        Box::pin(feed),
        Box::pin(events),
        &cancel,
        |o| match o {
            Output::Write(entry) => journal.append(entry).map_err(GenerateError::from),
            Output::Event(e) => {
                if let Some(w) = timeline.mark(unix_now(), &e) {
                    journal.append(Entry::Timeline(w))?;
                }
                on_event(e);
                Ok(())
            }
            Output::Progress(p) => {
                on_event(Event::Progress(p.clone()));
                if let Some(w) = timeline.point(unix_now(), &p, false) {
                    journal.append(Entry::Timeline(w))?;
                }
                journal
                    .append(Entry::Progress(Box::new(p)))
                    .map_err(GenerateError::from)
            }
        },
    )
    .await;
    // The job's last figures close its timeline, however it ended.
    if let Some(w) = timeline.point(
        unix_now(),
        &core.snapshot(clock.now(), Status::Running),
        true,
    ) {
        let _ = journal.append(Entry::Timeline(w));
    }

    // The reader stops at its next line now that its receiver is gone.
    let reader_result = reader
        .await
        .map_err(GenerateError::Task)
        .and_then(|r| r.map_err(GenerateError::from));
    let journal_result = journal.close().await;
    // The journal's last shard is queued now; the job is done when it is uploaded too.
    let upload_result = match uploader {
        Some(u) => {
            u.finish(&config.out, |e| {
                core.count_upload(&e);
                on_event(Event::Upload(e));
            })
            .await
        }
        None => Ok(Default::default()),
    };
    let outcome = match (loop_result, journal_result) {
        // The loop only sees that the writer is gone; the writer knows why.
        (Err(GenerateError::Journal(journal::JournalError::WriterGone)), Err(e)) => Err(e.into()),
        (Err(e), _) => Err(e),
        (Ok(_), Err(e)) => Err(e.into()),
        (Ok(end), Ok(_)) => reader_result.map(|()| end),
    };
    let (outcome, not_uploaded) = match (outcome, upload_result) {
        (Ok(end), Ok(missing)) => (Ok(end), missing),
        (Err(e), _) => (Err(e), Default::default()),
        (Ok(_), Err(e)) => (Err(e.into()), Default::default()),
    };
    let status = match &outcome {
        Ok(end) => end.status(not_uploaded.is_empty()),
        Err(_) => Status::Failed,
    };
    let final_progress = core.snapshot(clock.now(), status);
    let (written, appended) = {
        let (dir, p, prompts) = (
            config.out.clone(),
            final_progress.clone(),
            config.prompts.clone(),
        );
        blocking(move || {
            // Lines added while the job ran are not part of it: say so once, at the end.
            let len = std::fs::metadata(&prompts).map_or(0, |m| m.len());
            (
                progress::write_atomic(&dir, &p),
                len.saturating_sub(scan_end),
            )
        })
        .await?
    };
    if appended > 0 && config.limit.is_none() {
        on_event(Event::InputGrew { bytes: appended });
    }
    on_event(Event::Progress(final_progress.clone()));
    let ended = outcome?;
    written?;
    Ok(Summary {
        ended,
        progress: final_progress,
        not_uploaded,
    })
}

/// Sends completions, streamed so that their tokens count as they arrive (for the live rate and
/// the ETA), and probes, over HTTP.
struct HttpDriver {
    clients: Vec<Arc<SglangClient>>,
    /// Per server: it runs `--incremental-streaming-output`.
    incremental: Vec<bool>,
    stream: bool,
}

impl Driver for HttpDriver {
    fn send(
        &self,
        inst: usize,
        req: Arc<CompletionRequest>,
        streamed: Arc<AtomicU64>,
    ) -> BoxFuture<'static, Attempt> {
        let client = self.clients[inst].clone();
        let (stream, incremental) = (self.stream, self.incremental[inst]);
        async move {
            let t0 = StdInstant::now();
            let answer = if stream {
                let on_tokens = |n: u64| streamed.store(n, Ordering::Relaxed);
                client
                    .complete_streaming(&req, incremental, on_tokens)
                    .await
            } else {
                client.complete(&req).await
            };
            match answer {
                Ok(completion) => Attempt::Finished {
                    completion,
                    latency: t0.elapsed(),
                },
                Err(e) => Attempt::Failed(e),
            }
        }
        .boxed()
    }

    fn probe(&self, inst: usize, kind: ProbeKind) -> BoxFuture<'static, ProbeResult> {
        drive::probe(SglangClient::clone(&self.clients[inst]), kind)
    }
}

/// Lines go to the run in batches of this many: a thread switch per batch rather than one per
/// line (the reader sleeps while the queue is full, and each line taken woke it).
const INPUT_BATCH: usize = 256;
/// Batches queued ahead of the run: the 4,096 lines it always had ready.
const INPUT_BATCHES: usize = 4096 / INPUT_BATCH;

/// Streams the lines still to do into the run, from where the pre-pass said work begins to
/// the end it saw, skipping those in `done`; stops early when the run stops listening.
fn read_input(
    path: PathBuf,
    limit: Option<u64>,
    scan: Scan,
    done: HashSet<u128>,
    tx: mpsc::Sender<Vec<Line>>,
) -> Result<(), input::InputError> {
    let Some(start) = scan.first_pending else {
        return Ok(());
    };
    let mut reader = input::Reader::open_at(&path, limit, start)?.until(scan.end);
    let mut ids = Ids::new(scan.repeats);
    let mut batch = Vec::with_capacity(INPUT_BATCH);
    while let Some(line) = reader.next_line(&mut ids)? {
        if done.contains(&line.id.key()) {
            continue;
        }
        batch.push(line);
        if batch.len() == INPUT_BATCH {
            let full = std::mem::replace(&mut batch, Vec::with_capacity(INPUT_BATCH));
            if tx.blocking_send(full).is_err() {
                return Ok(());
            }
        }
    }
    if !batch.is_empty() {
        // The run may have stopped listening meanwhile: nothing is lost, it sends no more.
        let _ = tx.blocking_send(batch);
    }
    Ok(())
}

/// What the hosts' connections do, as the core's inputs: a host lost when its link goes down,
/// back when a new connection is up.
fn link_events(
    links: Vec<(String, watch::Receiver<Link>)>,
) -> impl futures::Stream<Item = Input> + Send {
    let per_host = links.into_iter().map(|(host, rx)| {
        futures::stream::unfold((host, rx, true), |(host, mut rx, was_up)| async move {
            loop {
                rx.changed().await.ok()?;
                let link = rx.borrow_and_update().clone();
                let input = match (&link, was_up) {
                    (Link::Up { .. }, false) => Input::HostBack { host: host.clone() },
                    (Link::Down { reason, .. }, true) => Input::HostLost {
                        host: host.clone(),
                        reason: HostLoss::Dropped(reason.clone()),
                    },
                    (Link::Failed { error, .. }, true) => Input::HostLost {
                        host: host.clone(),
                        reason: HostLoss::Refused(error.clone()),
                    },
                    _ => continue,
                };
                let up = link.is_up();
                return Some((input, (host, rx, up)));
            }
        })
        .boxed()
    });
    futures::stream::select_all(per_host)
}

/// What earlier runs of a resumed job recorded; a new job starts its own timeline, and a file
/// that cannot be read starts a new one too (the timeline is for looking at, never for
/// resuming).
fn read_timeline(dir: &std::path::Path, resume: bool) -> Timeline {
    let path = dir.join(TIMELINE_FILE);
    if !resume {
        // A new job in a directory an earlier job's timeline was left in starts its own.
        let _ = std::fs::remove_file(&path);
        return Timeline::default();
    }
    std::fs::read_to_string(&path)
        .map(|text| Timeline::parse(&text))
        .unwrap_or_default()
}

/// The timeline's clock: wall time, so that the runs of a resumed job share one axis.
fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, GenerateError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(GenerateError::Task)
}

fn tokio_stream_of<T: Send + 'static>(
    mut rx: mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> + Send {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
