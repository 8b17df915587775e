//! sglang-sim: a stand-in for `python -m sglang.launch_server` that accepts SGLang's command
//! line, serves its HTTP API and simulates continuous batching of a hybrid model on one GPU.
//! This module is a self-contained program (it uses nothing else of fleet); this file owns the
//! process: argument handling, the simulated load, signals and shutdown. Both the `sglang-sim`
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
mod lengths;
mod log;
mod model;
mod openai;
mod radix;
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
use crate::sim::gpu_state::{GpuState, StateFile};
use crate::sim::model::{LoadError, Plan};
use crate::sim::scheduler::{End, Job, Metrics, Reply, Scheduler};

/// Memory a CUDA context takes before any weights are loaded.
const CUDA_CONTEXT_MIB: f64 = 512.0;
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
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
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

fn gib(mib: f64) -> f64 {
    mib / 1024.0
}

/// Why the simulated load stopped early.
enum LoadEnd {
    Interrupted,
    Failed,
}

struct Loader<'a> {
    cfg: &'a Config,
    cancel: &'a CancellationToken,
    state: &'a StateFile,
    pid: u32,
}

impl Loader<'_> {
    /// Sleeps `fraction` of the (scaled) startup time, or stops on shutdown.
    async fn phase(&self, fraction: f64) -> Result<(), LoadEnd> {
        let secs = self.cfg.startup_secs * fraction / self.cfg.time_scale;
        tokio::select! {
            _ = self.cancel.cancelled() => Err(LoadEnd::Interrupted),
            _ = tokio::time::sleep(Duration::from_secs_f64(secs)) => Ok(()),
        }
    }

    fn gpu(&self, used_mib: f64, utilization: u32) {
        let s = GpuState {
            gpu: self.cfg.gpu_index,
            pid: self.pid,
            port: self.cfg.port,
            memory_used_mib: used_mib.round() as u64,
            memory_total_mib: self.cfg.params.gpu_total_mib.round() as u64,
            utilization_gpu: utilization,
        };
        if let Err(e) = self.state.write(&s) {
            log::server(&format!(
                "WARNING sglang-sim: cannot write the fake GPU state {}: {e}",
                self.state.path().display()
            ));
        }
    }

    fn crash_log(&self, lines: &[&str]) {
        log::tp0("Scheduler hit an exception: Traceback (most recent call last):");
        for l in lines {
            eprintln!("{l}");
        }
        log::server("Received sigquit from a child process. It usually means the child failed.");
    }

    /// The model load: weights, memory pools, CUDA graphs, each logged like SGLang.
    async fn load(&self) -> Result<Plan, LoadEnd> {
        let p = &self.cfg.params;
        let total = p.gpu_total_mib;
        log::tp0("Init torch distributed begin.");
        self.gpu(CUDA_CONTEXT_MIB, 0);
        self.phase(0.05).await?;
        log::tp0("Init torch distributed ends. mem usage=0.50 GB");
        log::tp0(&format!(
            "Load weight begin. avail mem={:.2} GB",
            gib(total - CUDA_CONTEXT_MIB)
        ));
        if self.cfg.die_after == Some(0) {
            self.phase(0.2).await?;
            self.crash_log(&[
                "  File \"/sgl-workspace/sglang/python/sglang/srt/model_loader/loader.py\", line 412, in load_weights_and_postprocess",
                "    model.load_weights(weights)",
                "torch.AcceleratorError: CUDA error: an illegal memory access was encountered",
                "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
            ]);
            return Err(LoadEnd::Failed);
        }
        self.phase(0.55).await?;
        let after_weights = CUDA_CONTEXT_MIB + p.weights_mib;
        self.gpu(after_weights, 0);
        log::tp0(&format!(
            "Load weight end. type=Qwen3NextForCausalLM, dtype=torch.bfloat16, avail mem={:.2} GB, mem usage={:.2} GB.",
            gib(total - after_weights),
            gib(p.weights_mib)
        ));
        let plan = match model::plan(p, &self.cfg.settings) {
            Err(LoadError::NotEnoughMemory) => {
                self.crash_log(&[
                    "  File \"/sgl-workspace/sglang/python/sglang/srt/model_executor/model_runner.py\", line 1822, in init_memory_pool",
                    "    raise RuntimeError(",
                    &format!("RuntimeError: {}", LoadError::NotEnoughMemory),
                ]);
                return Err(LoadEnd::Failed);
            }
            Err(oom @ LoadError::CudaGraphOom { .. }) => {
                self.phase(0.1).await?;
                log::tp0(&format!(
                    "Capture cuda graph begin. This can take up to several minutes. avail mem={:.2} GB",
                    gib(total * (1.0 - self.cfg.settings.mem_fraction_static))
                ));
                self.phase(0.1).await?;
                self.crash_log(&[
                    "  File \"/sgl-workspace/sglang/python/sglang/srt/model_executor/cuda_graph_runner.py\", line 471, in __init__",
                    "    self.capture()",
                    &format!(
                        "Exception: Capture cuda graph failed: {oom}\nPossible solutions:\n\
                         1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n\
                         2. set --cuda-graph-max-bs to a smaller value (e.g., 16)\n\
                         3. disable torch compile by not using --enable-torch-compile\n\
                         4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)"
                    ),
                ]);
                return Err(LoadEnd::Failed);
            }
            Ok(plan) => plan,
        };
        self.phase(0.1).await?;
        log::tp0(&format!(
            "Mamba Cache is allocated. max_mamba_cache_size: {}, conv_state size: {:.2} GB, ssm_state size: {:.2} GB",
            plan.max_mamba_cache_size,
            gib(plan.mamba_mib) * 0.02,
            gib(plan.mamba_mib) * 0.98
        ));
        log::tp0(&format!(
            "KV Cache is allocated. #tokens: {}, K size: {:.2} GB, V size: {:.2} GB",
            plan.max_total_num_tokens,
            gib(plan.kv_mib) / 2.0,
            gib(plan.kv_mib) / 2.0
        ));
        self.gpu(plan.static_mib, 0);
        let free = total - plan.static_mib;
        log::tp0(&format!("Memory pool end. avail mem={:.2} GB", gib(free)));
        log::tp0(&format!(
            "Capture cuda graph begin. This can take up to several minutes. avail mem={:.2} GB",
            gib(free)
        ));
        self.phase(0.3).await?;
        let used = plan.static_mib + model::graph_mib(p, &plan.settings);
        self.gpu(used, 0);
        log::tp0(&format!(
            "Capture cuda graph end. Time elapsed: {:.2} s. mem usage={:.2} GB. avail mem={:.2} GB.",
            self.cfg.startup_secs * 0.3,
            gib(model::graph_mib(p, &plan.settings)),
            gib(total - used)
        ));
        log::tp0(&format!(
            "max_total_num_tokens={}, chunked_prefill_size={}, max_prefill_tokens={}, \
             max_running_requests={}, context_len={}, available_gpu_mem={:.2} GB, \
             ideal_output_tok_s={:.2}",
            plan.max_total_num_tokens,
            plan.settings.chunked_prefill_size.map_or(-1, |n| n as i64),
            plan.settings.max_prefill_tokens,
            plan.cap,
            plan.context_len,
            gib(total - used),
            plan.ideal_output_tok_s() * self.cfg.time_scale
        ));
        Ok(plan)
    }
}

/// SIGTERM/SIGINT cancel the server (SIGTERM is ignored with `--sim-ignore-sigterm`).
async fn watch_signals(cancel: CancellationToken, ignore_sigterm: bool) -> anyhow::Result<()> {
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
                if ignore_sigterm {
                    log::server("Received SIGTERM; ignoring it (--sim-ignore-sigterm).");
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
    state: Arc<StateFile>,
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
    let signals = tokio::spawn(watch_signals(cancel.clone(), cfg.ignore_sigterm));
    let state = Arc::new(StateFile::new(&cfg.gpu_state_dir, cfg.gpu_index, pid));

    let loader = Loader {
        cfg: &cfg,
        cancel: &cancel,
        state: &state,
        pid,
    };
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
    let plan = match loader.load().await {
        Ok(plan) => Arc::new(plan),
        Err(end) => {
            cancel.cancel();
            finish(None, signals, &state).await;
            return Ok(match end {
                LoadEnd::Interrupted => 0,
                LoadEnd::Failed => 1,
            });
        }
    };

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
            cancel.cancel();
            finish(None, signals, &state).await;
            return Ok(1);
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
        gpu: cfg.gpu_index,
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
        plan.cap,
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
    finish(Some(server), signals, &state).await;
    Ok(code)
}

/// Stops the HTTP server (when it was started), the signal watcher and the fake GPU state.
async fn finish(
    server: Option<JoinHandle<()>>,
    signals: JoinHandle<anyhow::Result<()>>,
    state: &StateFile,
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
