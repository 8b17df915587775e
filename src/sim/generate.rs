//! Generation routes (`/generate`, `/v1/completions`, `/v1/chat/completions`): request
//! parsing, SGLang's context-overflow checks, fault injection, and the JSON and SSE bodies.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{Value as Json, json};
use tokio::sync::{oneshot, watch};

use crate::sim::http::{Shared, json_response, openai_error};
use crate::sim::scheduler::{Job, Progress, Reply};
use crate::sim::text;

/// A request ready to run: its lengths and how it will end.
struct Prepared {
    prompt_tokens: u64,
    prompt_hash: u64,
    /// Served from the radix cache (src/sim/radix.rs).
    cached_tokens: u64,
    output_tokens: u64,
    /// Ends at EOS (`stop`) rather than at the max-tokens / context limit (`length`).
    stops: bool,
}

impl Prepared {
    fn finish_reason(&self) -> &'static str {
        if self.stops { "stop" } else { "length" }
    }

    fn matched_stop(&self) -> Json {
        if self.stops {
            json!(text::EOS_TOKEN_ID)
        } else {
            Json::Null
        }
    }

    fn usage(&self, completion: u64) -> Json {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
            "prompt_tokens_details": null,
        })
    }
}

/// Why a request is answered 400 before it runs, and which part of SGLang says so.
enum Rejection {
    /// TokenizerManager's `_validate_one_request` raises before any output: a plain HTTP 400
    /// even for a streamed OpenAI request (serving_base primes the first chunk).
    Tokenizer(String),
    /// The scheduler aborts the request on arrival: a 400 when not streamed
    /// (tokenizer_manager.py raises ValueError), an error event when streamed.
    Scheduler(String),
}

/// SGLang's TokenizerManager checks (srt/managers/tokenizer_manager.py,
/// `_validate_one_request`) and the scheduler's input limit (srt/managers/scheduler.py with
/// srt/managers/utils.py `validate_input_length`), in their order and words, then the output
/// length: the prompt's natural length capped by max tokens and by the room left in the context.
fn prepare(
    app: &Shared,
    prompt_tokens: u64,
    prompt_hash: u64,
    max_new: Option<u64>,
) -> Result<Prepared, Rejection> {
    let plan = app.plan();
    let ctx = plan.context_len;
    if prompt_tokens >= ctx {
        return Err(Rejection::Tokenizer(format!(
            "The input ({prompt_tokens} tokens) is longer than the model's context length ({ctx} tokens)."
        )));
    }
    if let Some(m) = max_new
        && m + prompt_tokens > ctx
    {
        return Err(Rejection::Tokenizer(format!(
            "Requested token count exceeds the model's maximum context length of {ctx} tokens. \
             You requested a total of {} tokens: {prompt_tokens} tokens from the input messages \
             and {m} tokens for the completion. Please reduce the number of tokens in the input \
             messages or the completion to fit within the limit.",
            m + prompt_tokens
        )));
    }
    // srt/managers/tp_worker.py: max_req_input_len = min(context_len - 1, kv_capacity - 1) - 5.
    let max_input = ctx
        .saturating_sub(1)
        .min(plan.max_total_num_tokens.saturating_sub(1))
        .saturating_sub(5);
    if prompt_tokens >= max_input {
        return Err(Rejection::Scheduler(format!(
            "Input length ({prompt_tokens} tokens) exceeds the maximum allowed length \
             ({max_input} tokens). Use a shorter input or enable --allow-auto-truncate."
        )));
    }
    let natural = text::natural_output_len(prompt_hash, plan.params.mean_output_tokens);
    let limit = max_new.unwrap_or(u64::MAX).min(ctx - prompt_tokens);
    let cached_tokens = app.radix.lookup(prompt_hash, prompt_tokens);
    app.metrics
        .cached_tokens_total
        .fetch_add(cached_tokens, Ordering::Relaxed);
    Ok(Prepared {
        prompt_tokens,
        prompt_hash,
        cached_tokens,
        output_tokens: natural.min(limit),
        stops: natural <= limit,
    })
}

/// Numbers the request and draws whether `--sim-fail-rate` fails it.
fn number_request(app: &Shared) -> (u64, bool) {
    let n = app.requests.fetch_add(1, Ordering::Relaxed);
    let draw = text::mix(app.cfg.seed ^ text::mix(n.wrapping_add(1)));
    let fail = ((draw >> 11) as f64 / (1u64 << 53) as f64) < app.cfg.fail_rate;
    (n, fail)
}

fn request_id(app: &Shared, n: u64) -> String {
    let a = text::mix(app.cfg.seed ^ n ^ 0x5151);
    let b = text::mix(a ^ app.started_unix);
    format!("{a:016x}{b:016x}")
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The scheduler is gone: the server is shutting down (or crashing).
struct ShuttingDown;

/// Runs a non-streamed request to completion; returns its completion tokens.
async fn run_once(app: &Shared, p: &Prepared) -> Result<u64, ShuttingDown> {
    if app.cfg.instant || p.output_tokens == 0 {
        app.metrics.finished(p.prompt_tokens, p.output_tokens);
        return Ok(p.output_tokens);
    }
    let (tx, rx) = oneshot::channel();
    let job = Job {
        prompt_tokens: p.prompt_tokens,
        output_tokens: p.output_tokens,
        counts: true,
        log_metrics: true,
        reply: Reply::Once(tx),
    };
    app.jobs.send(job).await.map_err(|_| ShuttingDown)?;
    rx.await.map_err(|_| ShuttingDown)
}

/// Starts a streamed request; the receiver follows its progress.
async fn run_streamed(
    app: &Shared,
    p: &Prepared,
) -> Result<watch::Receiver<Progress>, ShuttingDown> {
    if app.cfg.instant || p.output_tokens == 0 {
        app.metrics.finished(p.prompt_tokens, p.output_tokens);
        let (_tx, rx) = watch::channel(Progress {
            generated: p.output_tokens,
            done: true,
        });
        return Ok(rx);
    }
    let (tx, rx) = watch::channel(Progress::default());
    let job = Job {
        prompt_tokens: p.prompt_tokens,
        output_tokens: p.output_tokens,
        counts: true,
        log_metrics: true,
        reply: Reply::Stream(tx),
    };
    app.jobs.send(job).await.map_err(|_| ShuttingDown)?;
    Ok(rx)
}

/// An SSE body: `head` chunks, then `render(from, to, done)` chunks as tokens arrive, then
/// `data: [DONE]`. A stream whose server goes away mid-way ends without `[DONE]`.
fn sse<R>(rx: watch::Receiver<Progress>, head: Vec<String>, render: R) -> Response
where
    R: FnMut(u64, u64, bool) -> Vec<String> + Send + 'static,
{
    let state = Some((rx, 0u64, render, head));
    let chunks = futures::stream::unfold(state, |state| async move {
        let (mut rx, sent, mut render, head) = state?;
        if !head.is_empty() {
            return Some((head, Some((rx, sent, render, Vec::new()))));
        }
        loop {
            let p = *rx.borrow_and_update();
            if p.generated > sent || p.done {
                let mut out = render(sent, p.generated, p.done);
                if p.done {
                    out.push("[DONE]".to_string());
                    return Some((out, None));
                }
                return Some((out, Some((rx, p.generated, render, Vec::new()))));
            }
            rx.changed().await.ok()?;
        }
    });
    let events = chunks.flat_map(|v| {
        futures::stream::iter(
            v.into_iter()
                .map(|s| Ok::<_, Infallible>(Event::default().data(s))),
        )
    });
    Sse::new(events).into_response()
}

/// A stream that reports one error chunk then `[DONE]` (how SGLang reports a request rejected
/// after streaming has begun, e.g. the scheduler's input limit).
fn sse_error(chunk: Json) -> Response {
    let events = futures::stream::iter([
        Ok::<_, Infallible>(Event::default().data(chunk.to_string())),
        Ok(Event::default().data("[DONE]")),
    ]);
    Sse::new(events).into_response()
}

fn text_of(p: &Prepared, from: u64, to: u64) -> String {
    let mut s = String::new();
    text::push_tokens(&mut s, p.prompt_hash, from, to);
    s
}

// ---------------------------------------------------------------- /generate

#[derive(Deserialize, Default)]
struct SamplingParams {
    max_new_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct GenerateReq {
    text: Option<Json>,
    input_ids: Option<Vec<u64>>,
    #[serde(default)]
    sampling_params: Option<SamplingParams>,
    #[serde(default)]
    stream: bool,
    rid: Option<String>,
}

fn native_error(status: StatusCode, message: &str) -> Response {
    json_response(status, &json!({"error": {"message": message}}))
}

/// SGLang's `SamplingParams.max_new_tokens` default.
const NATIVE_DEFAULT_MAX_NEW_TOKENS: u64 = 128;

pub async fn native(State(app): State<Shared>, body: Bytes) -> Response {
    let started = Instant::now();
    let req: GenerateReq = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return native_error(StatusCode::BAD_REQUEST, &format!("Invalid request: {e}")),
    };
    let (prompt_tokens, prompt_hash) = match (&req.text, &req.input_ids) {
        (Some(Json::String(t)), _) => (text::count_tokens(t), text::hash(t.as_bytes())),
        (None, Some(ids)) => (ids.len() as u64, text::hash(format!("{ids:?}").as_bytes())),
        (Some(Json::Array(_)), _) => {
            return native_error(
                StatusCode::BAD_REQUEST,
                "sglang-sim does not simulate batched /generate requests; send one text per request.",
            );
        }
        _ => {
            return native_error(
                StatusCode::BAD_REQUEST,
                "Either text or input_ids should be provided.",
            );
        }
    };
    let max_new = Some(
        req.sampling_params
            .as_ref()
            .and_then(|s| s.max_new_tokens)
            .unwrap_or(NATIVE_DEFAULT_MAX_NEW_TOKENS),
    );
    let (n, fail) = number_request(&app);
    let rid = req.rid.clone().unwrap_or_else(|| request_id(&app, n));
    // srt/entrypoints/http_server.py: a streamed /generate already answered 200 when the
    // tokenizer raises, so both kinds of rejection arrive as an error event there.
    let p = match prepare(&app, prompt_tokens, prompt_hash, max_new) {
        Ok(p) => p,
        Err(Rejection::Tokenizer(msg) | Rejection::Scheduler(msg)) if req.stream => {
            return sse_error(json!({"error": {
                "message": msg, "type": "invalid_request_error", "code": 400, "retryable": false,
            }}));
        }
        Err(Rejection::Tokenizer(msg) | Rejection::Scheduler(msg)) => {
            return native_error(StatusCode::BAD_REQUEST, &msg);
        }
    };
    if fail {
        return native_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Internal server error: simulated failure (--sim-fail-rate)",
        );
    }
    let meta = move |p: &Prepared, completion: u64, done: bool, started: Instant| {
        let finish = if !done {
            Json::Null
        } else if p.stops {
            json!({"type": "stop", "matched": text::EOS_TOKEN_ID})
        } else {
            json!({"type": "length", "length": completion})
        };
        json!({
            "id": rid,
            "finish_reason": finish,
            "prompt_tokens": p.prompt_tokens,
            "completion_tokens": completion,
            "cached_tokens": p.cached_tokens,
            "weight_version": "default",
            "total_retractions": 0,
            "e2e_latency": started.elapsed().as_secs_f64(),
        })
    };
    if req.stream {
        let rx = match run_streamed(&app, &p).await {
            Ok(rx) => rx,
            Err(ShuttingDown) => return shutting_down_native(),
        };
        let mut text_so_far = String::new();
        return sse(rx, Vec::new(), move |from, to, done| {
            text::push_tokens(&mut text_so_far, p.prompt_hash, from, to);
            vec![json!({"text": text_so_far, "meta_info": meta(&p, to, done, started)}).to_string()]
        });
    }
    match run_once(&app, &p).await {
        Ok(completion) => json_response(
            StatusCode::OK,
            &json!({
                "text": text::output_text(p.prompt_hash, completion),
                "meta_info": meta(&p, completion, true, started),
            }),
        ),
        Err(ShuttingDown) => shutting_down_native(),
    }
}

fn shutting_down_native() -> Response {
    native_error(
        StatusCode::SERVICE_UNAVAILABLE,
        "The server is shutting down.",
    )
}

fn shutting_down_openai() -> Response {
    openai_error(
        StatusCode::SERVICE_UNAVAILABLE,
        "ServiceUnavailableError",
        "The server is shutting down.",
    )
}

// ---------------------------------------------------------------- OpenAI routes

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

#[derive(Deserialize)]
struct ChatMessage {
    #[serde(default)]
    content: Option<Json>,
}

#[derive(Deserialize)]
struct ChatReq {
    model: Option<String>,
    messages: Vec<ChatMessage>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
}

#[derive(Deserialize)]
struct CompletionReq {
    model: Option<String>,
    prompt: Json,
    max_tokens: Option<u64>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
}

/// The OpenAI `CompletionRequest.max_tokens` default.
const COMPLETIONS_DEFAULT_MAX_TOKENS: u64 = 16;

fn message_text(content: &Option<Json>) -> String {
    match content {
        Some(Json::String(s)) => s.clone(),
        Some(Json::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Json::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

fn bad_request(msg: &str) -> Response {
    openai_error(StatusCode::BAD_REQUEST, "BadRequestError", msg)
}

/// The two OpenAI generation routes differ only in their object names and choice shapes.
#[derive(Clone, Copy)]
enum OpenAi {
    Chat,
    Completion,
}

impl OpenAi {
    fn object(self, streamed: bool) -> &'static str {
        match (self, streamed) {
            (OpenAi::Chat, false) => "chat.completion",
            (OpenAi::Chat, true) => "chat.completion.chunk",
            (OpenAi::Completion, _) => "text_completion",
        }
    }

    /// A streamed choice carrying `text` (`None`: the final, empty one with the finish reason).
    fn chunk_choice(self, p: &Prepared, text: Option<String>) -> Json {
        let (finish, matched) = match text {
            Some(_) => (Json::Null, Json::Null),
            None => (json!(p.finish_reason()), p.matched_stop()),
        };
        let mut choice = json!({
            "index": 0, "logprobs": null, "finish_reason": finish, "matched_stop": matched,
        });
        match self {
            OpenAi::Chat => {
                choice["delta"] = match text {
                    Some(t) => json!({"content": t}),
                    None => json!({}),
                }
            }
            OpenAi::Completion => choice["text"] = json!(text.unwrap_or_default()),
        }
        choice
    }

    fn full_choice(self, p: &Prepared, text: String) -> Json {
        let mut choice = json!({
            "index": 0, "logprobs": null,
            "finish_reason": p.finish_reason(), "matched_stop": p.matched_stop(),
        });
        match self {
            OpenAi::Chat => {
                choice["message"] = json!({
                    "role": "assistant", "content": text,
                    "reasoning_content": null, "tool_calls": null,
                })
            }
            OpenAi::Completion => choice["text"] = json!(text),
        }
        choice
    }
}

/// What both OpenAI routes extract from their request before generating.
struct OpenAiReq {
    kind: OpenAi,
    model: Option<String>,
    prompt_tokens: u64,
    prompt_hash: u64,
    max_new: Option<u64>,
    stream: bool,
    include_usage: bool,
}

async fn openai_generate(app: Shared, req: OpenAiReq) -> Response {
    let (n, fail) = number_request(&app);
    let p = match prepare(&app, req.prompt_tokens, req.prompt_hash, req.max_new) {
        Ok(p) => p,
        Err(Rejection::Scheduler(msg)) if req.stream => {
            return sse_error(json!({"error": {
                "object": "error", "message": msg, "type": "BadRequestError",
                "param": null, "code": 400,
            }}));
        }
        Err(Rejection::Tokenizer(msg) | Rejection::Scheduler(msg)) => return bad_request(&msg),
    };
    if fail {
        return openai_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalServerError",
            "Internal server error: simulated failure (--sim-fail-rate)",
        );
    }
    let kind = req.kind;
    let id = request_id(&app, n);
    let created = unix_now();
    let model = req
        .model
        .unwrap_or_else(|| app.cfg.served_model_name.clone());
    if req.stream {
        let rx = match run_streamed(&app, &p).await {
            Ok(rx) => rx,
            Err(ShuttingDown) => return shutting_down_openai(),
        };
        let chunk = move |choices: Json, usage: Json| {
            json!({
                "id": id, "object": kind.object(true), "created": created, "model": model,
                "choices": choices, "usage": usage,
            })
            .to_string()
        };
        let head = match kind {
            OpenAi::Chat => vec![chunk(
                json!([{"index": 0, "delta": {"role": "assistant", "content": ""},
                        "logprobs": null, "finish_reason": null, "matched_stop": null}]),
                Json::Null,
            )],
            OpenAi::Completion => Vec::new(),
        };
        let include_usage = req.include_usage;
        return sse(rx, head, move |from, to, done| {
            let mut out = Vec::new();
            if to > from {
                let text = text_of(&p, from, to);
                out.push(chunk(
                    json!([kind.chunk_choice(&p, Some(text))]),
                    Json::Null,
                ));
            }
            if done {
                out.push(chunk(json!([kind.chunk_choice(&p, None)]), Json::Null));
                if include_usage {
                    out.push(chunk(json!([]), p.usage(to)));
                }
            }
            out
        });
    }
    match run_once(&app, &p).await {
        Ok(completion) => {
            let text = text::output_text(p.prompt_hash, completion);
            let mut body = json!({
                "id": id,
                "object": kind.object(false),
                "created": created,
                "model": model,
                "choices": [kind.full_choice(&p, text)],
                "usage": p.usage(completion),
            });
            if let OpenAi::Chat = kind {
                body["metadata"] = json!({"weight_version": "default"});
            }
            json_response(StatusCode::OK, &body)
        }
        Err(ShuttingDown) => shutting_down_openai(),
    }
}

pub async fn chat(State(app): State<Shared>, body: Bytes) -> Response {
    let req: ChatReq = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return bad_request(&format!("Invalid request: {e}")),
    };
    let texts: Vec<String> = req
        .messages
        .iter()
        .map(|m| message_text(&m.content))
        .collect();
    let prompt_tokens = text::chat_tokens(texts.iter().map(String::as_str));
    let prompt_hash = text::hash(texts.join("\u{1f}").as_bytes());
    // srt/entrypoints/openai/protocol.py: `max_completion_tokens or max_tokens`.
    let max_new = req.max_completion_tokens.or(req.max_tokens);
    // srt/entrypoints/openai/serving_chat.py, `_validate_request`: before any tokenizing.
    let ctx = app.plan().context_len;
    if let Some(m) = max_new
        && m > ctx
    {
        return bad_request(&format!(
            "max_completion_tokens is too large: {m}.This model supports at most {ctx} completion tokens."
        ));
    }
    let req = OpenAiReq {
        kind: OpenAi::Chat,
        model: req.model,
        prompt_tokens,
        prompt_hash,
        max_new,
        stream: req.stream,
        include_usage: req.stream_options.is_some_and(|o| o.include_usage),
    };
    openai_generate(app, req).await
}

pub async fn completions(State(app): State<Shared>, body: Bytes) -> Response {
    let req: CompletionReq = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return bad_request(&format!("Invalid request: {e}")),
    };
    let (prompt_tokens, prompt_hash) = match &req.prompt {
        Json::String(t) => (text::count_tokens(t), text::hash(t.as_bytes())),
        Json::Array(ids) if !ids.is_empty() && ids.iter().all(Json::is_u64) => (
            ids.len() as u64,
            text::hash(req.prompt.to_string().as_bytes()),
        ),
        _ => {
            return bad_request(
                "sglang-sim supports a single prompt (a string or a list of token ids) per request.",
            );
        }
    };
    let req = OpenAiReq {
        kind: OpenAi::Completion,
        model: req.model,
        prompt_tokens,
        prompt_hash,
        max_new: Some(req.max_tokens.unwrap_or(COMPLETIONS_DEFAULT_MAX_TOKENS)),
        stream: req.stream,
        include_usage: req.stream_options.is_some_and(|o| o.include_usage),
    };
    openai_generate(app, req).await
}
