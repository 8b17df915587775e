//! `fleet generate`'s shell around the core: it prepares the output directory (resume, id
//! scan), asks every server for its capacity, starts the journal, the uploader and the input
//! reader, drives the core over HTTP, and closes everything on every path, writing the final
//! progress.json last.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant as StdInstant;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::core::{
    Attempt, Baseline, Core, CoreConfig, End, Input, ProbeKind, ProbeResult, Server,
};
use super::drive::{self, Clock, Driver, Output};
use super::input::{self, Line};
use super::journal::{self, Entry, Journal};
use super::progress::{self, Progress, Status};
use super::upload::Uploader;
use super::{Endpoint, Event, GenerateConfig, GenerateError, Summary};
use crate::sglang::client::{CompletionRequest, SglangClient, http_client};

/// Runs the job over `endpoints` until every prompt is written, the token is cancelled, or the
/// run cannot go on. Reports through `on_event`; never prints.
pub async fn run(
    config: GenerateConfig,
    endpoints: Vec<Endpoint>,
    mut on_event: impl FnMut(Event) + Send,
    cancel: CancellationToken,
) -> Result<Summary, GenerateError> {
    if endpoints.is_empty() {
        return Err(GenerateError::NoEndpoints);
    }
    let (recovered, scan, earlier) = {
        let (out, prompts) = (config.out.clone(), config.prompts.clone());
        let (resume, limit, upload) = (config.resume, config.limit, config.upload.is_some());
        blocking(move || -> Result<_, GenerateError> {
            if !resume && journal::has_output(&out)? {
                return Err(journal::JournalError::NotEmpty { dir: out }.into());
            }
            std::fs::create_dir_all(&out).map_err(|source| journal::JournalError::Io {
                path: out.clone(),
                source,
            })?;
            let recovered = if resume {
                journal::recover(&out)?
            } else {
                journal::Recovered::default()
            };
            let scan = input::check_ids(&prompts, limit, &recovered.done)?;
            // Shards of earlier runs are finished: they are uploaded first.
            let earlier = if upload {
                journal::shards(&out)?
            } else {
                Vec::new()
            };
            Ok((recovered, scan, earlier))
        })
        .await??
    };
    let base = Baseline {
        total: scan.total,
        completed: recovered.completed,
        failed: recovered.failed,
        input_tokens: recovered.input_tokens,
        output_tokens: recovered.output_tokens,
    };

    let http = http_client(config.http)?;
    let clients: Vec<SglangClient> = endpoints
        .into_iter()
        .map(|e| SglangClient::new(http.clone(), e))
        .collect();
    let infos = tokio::select! {
        r = futures::future::join_all(clients.iter().map(|c| c.server_info())) => r,
        _ = cancel.cancelled() => {
            let progress = Progress::before_start(scan.total, &recovered, Status::Interrupted);
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
    let servers = clients
        .iter()
        .zip(infos)
        .map(|(c, info)| Server {
            name: c.endpoint().name.clone(),
            url: c.endpoint().base_url.clone(),
            info: info.map_err(|e| e.to_string()),
        })
        .collect();
    let seed = rand::random();
    let mut core = Core::new(CoreConfig::from_generate(&config, seed), base, servers);
    on_event(Event::Started {
        total: scan.total,
        already_done: recovered.done.len() as u64,
        truncated_bytes: recovered.truncated_bytes,
        instances: core.instances(),
    });

    let mut uploader = config
        .upload
        .as_ref()
        .map(|dest| Uploader::start(dest.clone(), config.upload_retry, earlier, &cancel));
    let queue = uploader.as_ref().and_then(Uploader::queue);
    let mut journal = match Journal::start(&config.out, recovered.next_shard, config.sync, queue) {
        Ok(j) => j,
        Err(e) => {
            if let Some(u) = uploader {
                u.abandon().await;
            }
            return Err(e.into());
        }
    };
    let (line_tx, line_rx) = mpsc::channel::<Line>(4096);
    let reader = {
        let (path, limit) = (config.prompts.clone(), config.limit);
        let (done, start) = (recovered.done, scan.first_pending);
        tokio::task::spawn_blocking(move || read_input(path, limit, start, done, line_tx))
    };

    let clock = Clock {
        start: Instant::now(),
    };
    let feed = tokio_stream_of(line_rx).map(Input::Line);
    let uploads = match &mut uploader {
        Some(u) => futures::stream::unfold(u, |u| async move {
            let e = u.event().await;
            Some((Input::Upload(e), u))
        })
        .left_stream(),
        None => futures::stream::pending().right_stream(),
    };
    let driver = HttpDriver { clients };
    let loop_result = drive::drive(
        &mut core,
        clock,
        &driver,
        Box::pin(feed),
        Box::pin(uploads),
        &cancel,
        |o| match o {
            Output::Write(entry) => journal.append(entry).map_err(GenerateError::from),
            Output::Event(e) => {
                on_event(e);
                Ok(())
            }
            Output::Progress(p) => {
                on_event(Event::Progress(p.clone()));
                journal
                    .append(Entry::Progress(Box::new(p)))
                    .map_err(GenerateError::from)
            }
        },
    )
    .await;

    // The reader stops at its next line now that its receiver is gone.
    let reader_result = reader
        .await
        .map_err(|e| GenerateError::Task(e.to_string()))
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
    let written = {
        let (dir, p) = (config.out.clone(), final_progress.clone());
        blocking(move || progress::write_atomic(&dir, &p)).await
    };
    on_event(Event::Progress(final_progress.clone()));
    let ended = outcome?;
    written??;
    Ok(Summary {
        ended,
        progress: final_progress,
        not_uploaded,
    })
}

/// Sends plain (non-streamed) completions and probes over HTTP.
struct HttpDriver {
    clients: Vec<SglangClient>,
}

impl Driver for HttpDriver {
    fn send(&self, inst: usize, req: Arc<CompletionRequest>) -> BoxFuture<'static, Attempt> {
        let client = self.clients[inst].clone();
        async move {
            let t0 = StdInstant::now();
            match client.complete(&req).await {
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
        drive::probe(self.clients[inst].clone(), kind)
    }
}

/// Streams lines not yet done into the run; stops early when the run stops listening.
fn read_input(
    path: PathBuf,
    limit: Option<u64>,
    start: Option<input::Position>,
    done: HashSet<u128>,
    tx: mpsc::Sender<Line>,
) -> Result<(), input::InputError> {
    let Some(start) = start else { return Ok(()) };
    let mut reader = input::Reader::open_at(&path, limit, start)?;
    while let Some((number, text)) = reader.next_raw()? {
        let line = input::parse_line(number, text);
        if done.contains(&line.id.key()) {
            continue;
        }
        if tx.blocking_send(line).is_err() {
            break;
        }
    }
    Ok(())
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, GenerateError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| GenerateError::Task(e.to_string()))
}

fn tokio_stream_of<T: Send + 'static>(
    mut rx: mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> + Send {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
