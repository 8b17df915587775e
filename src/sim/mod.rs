//! sglang-sim: a stand-in for `python -m sglang.launch_server` that accepts SGLang's command
//! line, serves its HTTP API and simulates continuous batching of a hybrid model on one GPU or a
//! group of them, over one node or several. This module is a self-contained program (of fleet
//! it uses only the pure `nvidia-smi topo -m` parser, `crate::layout::topology`); this file owns
//! the process: argument handling, the start over the ranks, signals and shutdown. Both the `sglang-sim`
//! binary and `fleet` (when invoked under that name, as `fleet demo` does) run it.

mod app;
mod argparse;
mod batch;
pub mod best;
mod config;
mod config_file;
mod generate;
mod gpu_state;
mod http;
mod knobs;
mod lengths;
mod load;
mod log;
mod model;
mod model_files;
mod modeled;
mod openai;
mod parallel;
mod radix;
mod rendezvous;
mod sampling;
mod scheduler;
mod server_args;
mod text;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use serde_json::Value as Json;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use crate::sim::model::{Params, Settings, Strategy};

use crate::sim::argparse::{Outcome, PROG};
use crate::sim::config::{Config, Refused};
use crate::sim::gpu_state::{GpuState, StateFiles};
use crate::sim::load::{LoadEnd, Loader};
use crate::sim::model::Plan;
use crate::sim::rendezvous::{Group, RendezvousError};
use crate::sim::scheduler::{End, Job, Metrics, Reply, Scheduler};

/// How long shutdown waits for the HTTP server to drain before exiting anyway.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(900);

/// The `sglang-sim` process: parses SGLang's command line, then serves until SIGTERM/SIGINT.
pub fn main() -> ExitCode {
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let cfg = match config::parse(&args) {
        Ok(c) => c,
        Err(Refused::Argparse(_, Outcome::Help(text))) => {
            print!("{text}");
            return ExitCode::SUCCESS;
        }
        Err(Refused::Argparse(parser, Outcome::Error(msg))) => {
            match parser {
                Some(p) => eprint!("{}", p.error_text(&msg)),
                None => eprintln!("usage: {PROG} [-h] ...\n{PROG}: error: {msg}"),
            }
            return ExitCode::from(2);
        }
        // SGLang validates the arguments in `run_server` before loading anything: a traceback
        // within seconds of start, exit 1 (srt/arg_groups/mamba_hook.py).
        Err(Refused::Startup(refusal)) => {
            eprint!("{}", refusal.traceback());
            return ExitCode::from(1);
        }
    };
    // `--sim-instant` answers each request as it arrives: no decode steps run beside the HTTP
    // handlers, so one thread serves it, without the hand-offs between threads (wake-ups, a
    // fifth of its CPU per request) that a multi-threaded runtime adds.
    let mut runtime = if cfg.instant {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    let runtime = match runtime.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sglang-sim: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let code = match runtime.block_on(serve(cfg)) {
        Ok(code) => code,
        Err(e) => {
            log::server(&format!("ERROR: {e:#}"));
            1
        }
    };
    runtime.shutdown_timeout(Duration::from_millis(100));
    ExitCode::from(code)
}

fn py_repr(v: &Json) -> String {
    match v {
        Json::Null => "None".into(),
        Json::Bool(true) => "True".into(),
        Json::Bool(false) => "False".into(),
        Json::String(s) => format!("'{s}'"),
        Json::Array(a) => format!("[{}]", a.iter().map(py_repr).collect::<Vec<_>>().join(", ")),
        other => other.to_string(),
    }
}

/// SIGTERM/SIGINT cancel the server; SIGTERM only logs `ignored` where that is given
/// (`--sim-ignore-sigterm`, a node of rank >= 1).
async fn watch_signals(cancel: CancellationToken, ignored: Option<String>) -> anyhow::Result<()> {
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            _ = int.recv() => {
                log::server("Received SIGINT. Shutting down.");
                cancel.cancel();
            }
            _ = term.recv() => {
                if let Some(why) = &ignored {
                    log::server(why);
                } else {
                    log::server("Received SIGTERM. Shutting down.");
                    cancel.cancel();
                }
            }
        }
    }
}

/// Keeps the fake GPU state's utilization current (batch occupancy), about once a second.
async fn track_utilization(
    cancel: CancellationToken,
    state: Arc<StateFiles>,
    base: GpuState,
    metrics: Arc<Metrics>,
    cap: u64,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {
                let running = metrics.running.load(Ordering::Relaxed);
                let utilization = (running * 100).div_ceil(cap.max(1)).min(100) as u32;
                // A failed refresh only leaves the previous utilization visible.
                let _ = state.write(&GpuState { utilization_gpu: utilization, ..base });
            }
        }
    }
}

async fn join_quietly(handle: JoinHandle<()>) {
    if let Err(e) = handle.await
        && e.is_panic()
    {
        log::server(&format!("ERROR sglang-sim: a task panicked: {e}"));
    }
}

async fn serve(cfg: Config) -> anyhow::Result<u8> {
    let cfg = Arc::new(cfg);
    let pid = std::process::id();
    let layout = &cfg.layout;
    log::set_tp_rank(layout.node_rank * (layout.tp / layout.nnodes));
    for w in &cfg.startup_warnings {
        log::server(&format!("WARNING server_args.py: {w}"));
    }
    // srt/entrypoints/engine.py: `server_args={resolved_dict()}`, a Python dict, the API key
    // in plain text.
    log::server(&format!(
        "server_args={{{}}}",
        cfg.server_args
            .iter()
            .map(|(k, v)| format!("'{k}': {}", py_repr(v)))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let cancel = CancellationToken::new();
    let follower = layout.nnodes > 1 && layout.node_rank >= 1;
    let sigterm = if cfg.ignore_sigterm {
        Some("Received SIGTERM; ignoring it (--sim-ignore-sigterm).".to_string())
    } else if follower {
        // srt/entrypoints/engine.py: a node of rank >= 1 cannot drain on its own; rank 0's
        // ShutdownReq broadcast stops it.
        Some(format!(
            "SIGTERM received on node_rank {}; waiting for the rank-0 ShutdownReq broadcast to \
             stop the schedulers.",
            layout.node_rank
        ))
    } else {
        None
    };
    let signals = tokio::spawn(watch_signals(cancel.clone(), sigterm));
    let state = Arc::new(StateFiles::new(
        &cfg.gpu_state_dir,
        cfg.local_gpus.as_deref().unwrap_or_default(),
        pid,
    ));
    let loader = Loader {
        cfg: &cfg,
        cancel: &cancel,
        state: &state,
        pid,
    };
    let mut group = Group::Alone;
    let mut server = None;
    let code = 'run: {
        if loader.init_device().is_err() {
            break 'run 1;
        }
        let timeout = layout
            .dist_timeout_secs
            .unwrap_or(rendezvous::DEFAULT_TIMEOUT_SECS)
            / cfg.time_scale;
        group = match rendezvous::join(
            layout.nnodes,
            layout.node_rank,
            &cfg.host,
            layout.dist_init_addr.as_deref(),
            Duration::from_secs_f64(timeout),
            &cancel,
        )
        .await
        {
            Ok(g) => g,
            Err(RendezvousError::Interrupted) => break 'run 0,
            Err(RendezvousError::Failed(e)) => {
                loader.crash_log(&[
                    "  File \"/sgl-workspace/sglang/python/sglang/srt/distributed/parallel_state.py\", line 2517, in init_distributed_environment",
                    "    torch.distributed.init_process_group(",
                    "  [...]",
                    &e,
                ]);
                break 'run 1;
            }
        };
        let plan = match loader.load().await {
            Ok(plan) => Arc::new(plan),
            Err(LoadEnd::Interrupted) => break 'run 0,
            Err(LoadEnd::Failed) => break 'run 1,
        };
        if follower {
            group.loaded().await;
            http::dummy_health(&cfg.host, cfg.port, &cancel).await;
            break 'run 0;
        }
        // Rank 0's scheduler is ready only when every rank's is.
        group.all_loaded(&cancel).await;
        if cancel.is_cancelled() {
            break 'run 0;
        }
        let (code, handle) = serve_api(cfg.clone(), plan, &loader, &cancel, &state).await;
        server = handle;
        code
    };
    cancel.cancel();
    let code = match group.end().await {
        rendezvous::End::Stopped => code,
        rendezvous::End::Lost(e) => {
            loader.crash_log(&[
                "  File \"/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py\", line 1094, in event_loop_overlap",
                "    batch_result = self.run_batch(batch)",
                "  [...]",
                &e,
            ]);
            1
        }
    };
    finish(server, signals, &state).await;
    Ok(code)
}

/// Rank 0 (or a single node): the API, the scheduler and the fake GPU's utilization, until
/// cancelled or crashed. Returns the exit code and the HTTP server to stop.
async fn serve_api(
    cfg: Arc<Config>,
    plan: Arc<Plan>,
    loader: &Loader<'_>,
    cancel: &CancellationToken,
    state: &Arc<StateFiles>,
) -> (u8, Option<JoinHandle<()>>) {
    let pid = loader.pid;
    let metrics = Arc::new(Metrics::default());
    let (jobs_tx, jobs_rx) = mpsc::channel::<Job>(65_536);
    let started_unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let app = Arc::new(app::App {
        cfg: cfg.clone(),
        plan: OnceLock::new(),
        metrics: metrics.clone(),
        jobs: jobs_tx.clone(),
        ready: AtomicBool::new(false),
        requests: AtomicU64::new(0),
        started_unix,
        radix: radix::RadixCache::new(cfg.settings.radix_cache_disabled, cfg.settings.page_size),
    });

    // The HTTP port opens only once the model is loaded: srt/entrypoints/engine.py starts
    // uvicorn (http_server.py) after the scheduler processes report ready, so a client sees
    // connection refused for the whole load, then 503 until the warm-up generation is done.
    // Set before the server starts, since the routes read it.
    app.plan.get_or_init(|| plan.clone());
    let listener = match tokio::net::TcpListener::bind((cfg.host.as_str(), cfg.port)).await {
        Ok(l) => l,
        Err(e) => {
            log::server(&format!(
                "ERROR:    [Errno {}] error while attempting to bind on address ('{}', {}): {e}",
                e.raw_os_error().unwrap_or(0),
                cfg.host,
                cfg.port
            ));
            return (1, None);
        }
    };
    let server = {
        let cancel = cancel.clone();
        let router = http::router(app.clone());
        tokio::spawn(async move {
            let service = router.into_make_service_with_connect_info::<SocketAddr>();
            if let Err(e) = axum::serve(listener, service)
                .with_graceful_shutdown(cancel.cancelled_owned())
                .await
            {
                log::server(&format!("ERROR: HTTP server failed: {e}"));
            }
        })
    };
    // srt/managers/scheduler.py `_abort_on_queued_limit`: `--max-queued-requests`.
    let max_queued = cfg
        .server_args
        .get("max_queued_requests")
        .and_then(|v| v.as_u64().or_else(|| v.as_str()?.parse().ok()));
    let sched = Scheduler::new(plan.clone(), cfg.time_scale, metrics.clone(), cfg.die_after)
        .with_max_queued(max_queued);
    let mut scheduler = tokio::spawn(sched.run(jobs_rx, cancel.clone()));
    let base = GpuState {
        gpu: 0,
        pid,
        port: cfg.port,
        memory_used_mib: (plan.static_mib + model::graph_mib(&cfg.params, &plan.settings)).round()
            as u64,
        memory_total_mib: cfg.params.gpu_total_mib.round() as u64,
        utilization_gpu: 0,
    };
    let tracker = tokio::spawn(track_utilization(
        cancel.clone(),
        state.clone(),
        base,
        metrics.clone(),
        plan.running_cap(),
    ));

    log::server(&format!("INFO:     Started server process [{pid}]"));
    log::server("INFO:     Waiting for application startup.");
    log::server("INFO:     Application startup complete.");
    log::server(&format!(
        "INFO:     Uvicorn running on http://{}:{} (Press CTRL+C to quit)",
        cfg.host, cfg.port
    ));

    // SGLang turns healthy only after a warm-up generation went through the scheduler.
    let (warm_tx, warm_rx) = oneshot::channel();
    let warmup = Job {
        prompt_tokens: text::count_tokens("The capital city of France is"),
        cached_tokens: 0,
        output_tokens: 1,
        max_new_tokens: 1,
        counts: false,
        log_metrics: true,
        reply: Reply::Once(warm_tx),
    };
    let warmed = jobs_tx.send(warmup).await.is_ok()
        && tokio::select! {
            r = warm_rx => r.is_ok(),
            _ = cancel.cancelled() => false,
        };
    drop(jobs_tx);
    let end = if warmed {
        app.ready.store(true, Ordering::Release);
        log::server("The server is fired up and ready to roll!");
        tokio::select! {
            _ = cancel.cancelled() => End::Cancelled,
            r = &mut scheduler => r.unwrap_or(End::Cancelled),
        }
    } else {
        End::Cancelled
    };
    let code = match end {
        End::Cancelled => 0,
        End::Crashed => {
            loader.crash_log(&[
                "  File \"/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py\", line 1094, in event_loop_overlap",
                "    batch_result = self.run_batch(batch)",
                "torch.AcceleratorError: CUDA error: an illegal memory access was encountered",
            ]);
            1
        }
    };
    cancel.cancel();
    if !scheduler.is_finished() {
        let _ = scheduler.await;
    }
    join_quietly(tracker).await;
    (code, Some(server))
}

/// Stops the HTTP server (when it was started), the signal watcher and the fake GPU state.
async fn finish(
    server: Option<JoinHandle<()>>,
    signals: JoinHandle<anyhow::Result<()>>,
    state: &StateFiles,
) {
    if let Some(mut server) = server
        && tokio::time::timeout(SHUTDOWN_GRACE, &mut server)
            .await
            .is_err()
    {
        log::server("WARNING sglang-sim: HTTP connections still open at shutdown; closing them.");
        server.abort();
        join_quietly(server).await;
    }
    if let Ok(Err(e)) = signals.await {
        log::server(&format!("WARNING sglang-sim: {e:#}"));
    }
    state.remove();
}
