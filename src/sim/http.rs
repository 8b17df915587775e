//! The HTTP API with SGLang's routes, field names, status codes and error bodies: health,
//! server/model info, OpenAI model list, Prometheus metrics, cache flush, Bearer auth, and the
//! readiness gate. Generation routes live in `generate` and `openai`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value as Json, json};

use crate::sim::app::{Shared, json_response};
use crate::sim::config::Config;
use crate::sim::log;
use crate::sim::model::Plan;
use crate::sim::scheduler::{Job, Metrics, Reply};
use crate::sim::{generate, openai};

fn not_found() -> Response {
    json_response(StatusCode::NOT_FOUND, &json!({"detail": "Not Found"}))
}

pub fn router(app: Shared) -> Router {
    let mut r = Router::new()
        .route("/health", get(health))
        .route("/health_generate", get(health))
        .route("/server_info", get(server_info))
        .route("/get_server_info", get(server_info))
        .route("/model_info", get(model_info))
        .route("/get_model_info", get(model_info))
        .route("/v1/models", get(models))
        .route("/flush_cache", get(flush_cache).post(flush_cache))
        .route("/generate", post(generate::native))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/chat/completions", post(openai::chat));
    if app.cfg.enable_metrics {
        r = r.route("/metrics", get(metrics));
    }
    r.fallback(|| async { not_found() })
        .layer(middleware::from_fn_with_state(app.clone(), gate))
        .with_state(app)
}

fn is_generation(path: &str) -> bool {
    path == "/generate" || path.starts_with("/v1/")
}

/// Bearer auth (SGLang exempts OPTIONS, `/health*` and `/metrics`), then the readiness gate,
/// then uvicorn-style access lines for everything but the hot generation routes.
async fn gate(State(app): State<Shared>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    // The access line, written for everything but the hot generation routes: what it names is
    // taken only for those.
    let access = (!is_generation(path)).then(|| {
        let peer = req
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0.to_string())
            .unwrap_or_else(|| "-".into());
        (peer, req.method().clone(), path.to_string())
    });
    // srt/entrypoints/http_server.py: `/health*`, `/ready*` and `/metrics*` need no key, and
    // the scheme is matched case-insensitively.
    let exempt = req.method() == Method::OPTIONS
        || path.starts_with("/health")
        || path.starts_with("/ready")
        || path.starts_with("/metrics");
    let response = if let Some(key) = app.cfg.api_key.as_deref()
        && !exempt
        && req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .is_none_or(|v| {
                v.split_once(' ').is_none_or(|(scheme, given)| {
                    !scheme.eq_ignore_ascii_case("bearer") || given != key
                })
            }) {
        json_response(StatusCode::UNAUTHORIZED, &json!({"error": "Unauthorized"}))
    } else if !app.ready.load(Ordering::Acquire) && !path.starts_with("/health") {
        json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"detail": "The server is still starting (model loading)."}),
        )
    } else {
        next.run(req).await
    };
    if let Some((peer, method, path)) = access {
        let status = response.status();
        log::server(&format!(
            "INFO:     {peer} - \"{method} {path} HTTP/1.1\" {} {}",
            status.as_u16(),
            status.canonical_reason().unwrap_or("")
        ));
    }
    response
}

/// srt/entrypoints/http_server.py `health_generate` (both /health and /health_generate, with
/// SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION on by default): 503 while starting; otherwise it
/// injects a 1-token generation, then checks once a second whether the scheduler sent anything
/// since, and gives up after 20 s. So a healthy server answers after at least a second, and a
/// stuck one after 20. Those seconds are server time, scaled like the rest of the sim.
async fn health(State(app): State<Shared>) -> StatusCode {
    if !app.ready.load(Ordering::Acquire) {
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    let before = app.metrics.steps_out.load(Ordering::Acquire);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let probe = Job {
        prompt_tokens: 1,
        cached_tokens: 0,
        output_tokens: 1,
        max_new_tokens: 1,
        counts: false,
        log_metrics: false,
        reply: Reply::Once(tx),
    };
    if app.jobs.send(probe).await.is_err() {
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    // Dropping the receiver when done is SGLang's `task.cancel()` of the probe.
    let _probe = rx;
    let second = std::time::Duration::from_secs_f64(1.0 / app.cfg.time_scale);
    for _ in 0..HEALTH_CHECK_TIMEOUT_SECS {
        tokio::time::sleep(second).await;
        if app.metrics.steps_out.load(Ordering::Acquire) > before {
            return StatusCode::OK;
        }
    }
    log::server(
        "ERROR Health check failed. Server couldn't get a response from detokenizer for last 20 seconds.",
    );
    StatusCode::SERVICE_UNAVAILABLE
}

/// A node of rank >= 1: `launch_dummy_health_check_server` (srt/utils/common.py) answers
/// `/health`, `/health_generate` and `/ping` with an empty 200 and nothing else, on this node's
/// `--host:--port`, until the process ends. uvicorn runs at log level warning: no access lines.
/// It runs in a daemon thread, so a port it cannot bind leaves the rank running without it.
pub async fn dummy_health(host: &str, port: u16, cancel: &tokio_util::sync::CancellationToken) {
    log::server(&format!(
        "Dummy health check server started in background thread at {host}:{port}"
    ));
    let listener = match tokio::net::TcpListener::bind((host, port)).await {
        Ok(l) => Some(l),
        Err(e) => {
            log::server(&format!(
                "ERROR:    [Errno {}] error while attempting to bind on address ('{host}', {port}): {e}",
                e.raw_os_error().unwrap_or(0)
            ));
            log::server(&format!(
                "Dummy health check server stopped at {host}:{port}"
            ));
            None
        }
    };
    let Some(listener) = listener else {
        cancel.cancelled().await;
        return;
    };
    let ok = || async { StatusCode::OK };
    let router = Router::new()
        .route("/health", get(ok))
        .route("/health_generate", get(ok))
        .route("/ping", get(ok))
        .fallback(|| async { not_found() });
    if let Err(e) = axum::serve(listener, router)
        .with_graceful_shutdown(cancel.clone().cancelled_owned())
        .await
    {
        log::server(&format!("ERROR: dummy health server failed: {e}"));
    }
}

/// `HEALTH_CHECK_TIMEOUT` in srt/entrypoints/http_server.py.
const HEALTH_CHECK_TIMEOUT_SECS: u32 = 20;

/// The `sim` block: what the simulated configuration can do, in wall-clock terms.
pub fn sim_block(cfg: &Config, plan: &Plan) -> Json {
    json!({
        "ideal_output_tok_s": plan.ideal_output_tok_s() * cfg.time_scale,
        "decode_step_ms_at_cap": plan.decode_step_secs(plan.running_cap()) * 1000.0 / cfg.time_scale,
        "slots_per_request": plan.slots_per_request,
        "max_mamba_cache_size": plan.max_mamba_cache_size,
        "mamba_cache_mib": plan.mamba_mib,
        "effective_max_running_requests": plan.running_cap(),
        "gpus": cfg.local_gpus.as_deref().unwrap_or_default(),
        "allreduce_link": plan.settings.parallel.hop.to_string(),
        "dp_ranks": plan.settings.parallel.dp_ranks,
        "mamba_strategy": plan.settings.strategy.name(),
        "overlap": plan.overlap,
        "time_scale": cfg.time_scale,
        "mean_output_tokens": plan.params.mean_output_tokens,
        "mean_prompt_tokens": plan.params.mean_prompt_tokens,
        "instant": cfg.instant,
    })
}

/// MiB as SGLang reports memory: GB rounded to 3 places.
fn gb(mib: f64) -> f64 {
    (mib / 1024.0 * 1000.0).round() / 1000.0
}

async fn server_info(State(app): State<Shared>) -> Response {
    let (cfg, plan) = (&app.cfg, app.plan());
    let mut info = cfg.server_args.clone();
    info.insert("version".into(), json!(cfg.version));
    // srt/utils/common.py `build_server_info`: the command line as merged, API key and all.
    info.insert("launch_command".into(), json!(cfg.launch_command));
    info.insert(
        "max_total_num_tokens".into(),
        json!(plan.max_total_num_tokens),
    );
    // srt/managers/scheduler_components/internal_state.py and memory_usage.py
    // `build_memory_usage` (GB of one GPU, rounded to 3 places; the mamba pool is not
    // reported); one entry per DP rank (`get_internal_state` gathers every DP rank's,
    // srt/entrypoints/http_server.py), each with its own cap. The sim's one scheduler reports
    // the throughput as shared equally.
    let ranks = plan.settings.parallel.dp_ranks.max(1);
    let state = json!({
        "effective_max_running_requests_per_dp": plan.cap,
        "max_mamba_cache_size": plan.max_mamba_cache_size,
        "last_gen_throughput": app.metrics.gen_throughput() / ranks as f64,
        "memory_usage": {
            "weight": gb(crate::sim::model::weights_per_gpu_mib(&plan.params, &plan.settings)),
            "kvcache": gb(plan.kv_mib),
            "token_capacity": plan.max_total_num_tokens,
            "token_capacity_swa": null,
            "graph": {"prefill": 0.0, "decode": gb(crate::sim::model::graph_mib(&plan.params, &plan.settings))},
        },
    });
    info.insert(
        "internal_states".into(),
        Json::Array(vec![state; ranks as usize]),
    );
    info.insert("sim".into(), sim_block(cfg, plan));
    json_response(StatusCode::OK, &Json::Object(info))
}

async fn model_info(State(app): State<Shared>) -> Response {
    json_response(
        StatusCode::OK,
        &json!({
            "model_path": app.cfg.model_path,
            "tokenizer_path": app.cfg.model_path,
            "is_generation": true,
            "preferred_sampling_params": null,
            "weight_version": "default",
            "has_image_understanding": false,
            "has_audio_understanding": false,
            "model_type": "qwen3_next",
            "architectures": ["Qwen3NextForCausalLM"],
        }),
    )
}

async fn models(State(app): State<Shared>) -> Response {
    let name = &app.cfg.served_model_name;
    json_response(
        StatusCode::OK,
        &json!({
            "object": "list",
            "data": [{
                "id": name,
                "object": "model",
                "created": app.started_unix,
                "owned_by": "sglang",
                "root": name,
                "parent": null,
                "max_model_len": app.plan().context_len,
            }],
        }),
    )
}

async fn flush_cache(State(app): State<Shared>) -> Response {
    let busy = app.metrics.running.load(Ordering::Relaxed)
        + app.metrics.queued.load(Ordering::Relaxed)
        > 0;
    let status = if busy {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::OK
    };
    (
        status,
        "Cache flushed.\nPlease check backend logs for more details. (When there are running or \
         waiting requests, the operation will not be performed.)\n",
    )
        .into_response()
}

fn prom_label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// SGLang's `token_usage`: the fuller of the KV pool and the mamba state pool, rounded to 2
/// decimals (srt/managers/scheduler_components/pool_stats_observer.py, `get_max_pool_usage`).
/// Each running request holds its slots of mamba state.
pub fn token_usage(plan: &Plan, kv_used: u64, running: u64) -> f64 {
    // Over all DP ranks: the sim's one scheduler spreads the requests evenly.
    let ranks = plan.settings.parallel.dp_ranks.max(1);
    let kv = kv_used as f64 / plan.pool_tokens().max(1) as f64;
    let mamba = (running * plan.slots_per_request) as f64
        / (plan.max_mamba_cache_size * ranks).max(1) as f64;
    (kv.max(mamba) * 100.0).round() / 100.0
}

/// Prometheus text exposition of SGLang's scheduler gauges and tokenizer counters, with the
/// labels 0.5.23 gives them (srt/observability/metrics_collector.py) in the sorted order its
/// multiprocess registry writes them: the scheduler's engine type, model and ranks; the
/// tokenizer's engine type, model, and whether the request streamed. With priority scheduling
/// both also carry `priority=""`: the gauges' totals, the counters' requests without one.
pub fn render_metrics(model_name: &str, m: &Metrics, plan: &Plan, priority: bool) -> String {
    let name = prom_label(model_name);
    let priority = if priority { ",priority=\"\"" } else { "" };
    let gauge_labels = format!(
        "{{engine_type=\"unified\",model_name=\"{name}\",moe_ep_rank=\"0\",pp_rank=\"0\"\
         {priority},tp_rank=\"0\"}}"
    );
    let counter_labels = |streaming: bool| {
        format!(
            "{{engine_type=\"unified\",is_streaming=\"{streaming}\",model_name=\"{name}\"{priority}}}"
        )
    };
    let kv = m.kv_used.load(Ordering::Relaxed);
    let running = m.running.load(Ordering::Relaxed);
    let gauges: [(&str, &str, f64); 6] = [
        (
            "sglang:num_running_reqs",
            "The number of running requests.",
            running as f64,
        ),
        (
            "sglang:num_queue_reqs",
            "The number of requests in the waiting queue.",
            m.queued.load(Ordering::Relaxed) as f64,
        ),
        (
            "sglang:gen_throughput",
            "The generation throughput (token/s).",
            m.gen_throughput(),
        ),
        (
            "sglang:token_usage",
            "The token usage.",
            token_usage(plan, kv, running),
        ),
        (
            "sglang:num_used_tokens",
            "The number of used tokens.",
            kv as f64,
        ),
        (
            "sglang:new_token_ratio",
            "The new token ratio.",
            m.new_token_ratio(),
        ),
    ];
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let counters: [(&str, &str, u64, u64); 3] = [
        (
            "sglang:prompt_tokens_total",
            "Number of prefill tokens processed.",
            load(&m.prompt_tokens_total),
            load(&m.streamed_prompt_tokens),
        ),
        (
            "sglang:generation_tokens_total",
            "Number of generation tokens processed.",
            load(&m.generation_tokens_total),
            load(&m.streamed_generation_tokens),
        ),
        (
            "sglang:num_requests_total",
            "Number of requests processed.",
            load(&m.requests_total),
            load(&m.streamed_requests),
        ),
    ];
    let requests = load(&m.requests_total);
    let streamed_requests = load(&m.streamed_requests);
    let mut out = String::new();
    for (metric, help, v) in gauges {
        out.push_str(&format!(
            "# HELP {metric} {help}\n# TYPE {metric} gauge\n{metric}{gauge_labels} {v:?}\n"
        ));
    }
    // A labelled series exists once a request of its kind finished (prometheus_client).
    for (metric, help, total, streamed) in counters {
        out.push_str(&format!(
            "# HELP {metric} {help}\n# TYPE {metric} counter\n"
        ));
        for (is_streaming, v, seen) in [
            (false, total - streamed, requests > streamed_requests),
            (true, streamed, streamed_requests > 0),
        ] {
            if seen {
                out.push_str(&format!(
                    "{metric}{} {:?}\n",
                    counter_labels(is_streaming),
                    v as f64
                ));
            }
        }
    }
    // Cached prompt tokens by where they were found; the sim's radix cache is all on the device.
    let cached = load(&m.cached_tokens_total);
    if cached > 0 {
        out.push_str(&format!(
            "# HELP sglang:cached_tokens_total Number of cached prompt tokens by source \
             (device/host/storage).\n# TYPE sglang:cached_tokens_total counter\n\
             sglang:cached_tokens_total{{cache_source=\"device\",engine_type=\"unified\",\
             model_name=\"{name}\"{priority}}} {:?}\n",
            cached as f64
        ));
    }
    out
}

async fn metrics(State(app): State<Shared>) -> Response {
    let priority = app
        .cfg
        .server_args
        .get("enable_priority_scheduling")
        .and_then(Json::as_bool)
        .unwrap_or(false);
    let body = render_metrics(
        &app.cfg.served_model_name,
        &app.metrics,
        app.plan(),
        priority,
    );
    let mut r = Response::new(Body::from(body));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}
