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
use crate::sim::scheduler::{Abort, Job, Progress, Reply};
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
    /// Output tokens of the leading `<think>…</think>` block, both tags included; 0 when the
    /// model does not think (see [`thought_tokens`]).
    think: u64,
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

    /// srt/entrypoints/openai/usage_processor.py `calculate_token_usage` (a `UsageInfo` of
    /// protocol.py, dumped whole).
    fn usage(&self, completion: u64) -> Json {
        let mut u = self.final_usage(completion);
        u["prompt_tokens_details"] = Json::Null;
        u["completion_tokens_details"] = Json::Null;
        u
    }

    /// Usage without the empty details.
    fn final_usage(&self, completion: u64) -> Json {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + completion,
            "completion_tokens": completion,
            "reasoning_tokens": 0,
        })
    }

    /// The raw text of output tokens `from..to`, the thought's tags included.
    fn raw_text(&self, from: u64, to: u64) -> String {
        let mut s = String::new();
        for i in from..to {
            if self.think > 0 && i == 0 {
                s.push_str(THINK_START);
            } else if self.think > 0 && i == self.think - 1 {
                s.push(' ');
                s.push_str(THINK_END);
            } else {
                text::push_tokens(&mut s, self.prompt_hash, i, i + 1);
            }
        }
        s
    }

    /// Output tokens `from..to` as a reasoning parser splits them
    /// (srt/parser/reasoning_parser.py `Qwen3Detector`): the thought without its tags, then
    /// the answer; `None` for a part with no text. A thought cut off before its end tag is all
    /// thought.
    fn split_text(&self, from: u64, to: u64) -> (Option<String>, Option<String>) {
        let part = |start: u64, end: u64| {
            let (a, b) = (from.max(start), to.min(end));
            (a < b).then(|| {
                let mut s = String::new();
                text::push_tokens(&mut s, self.prompt_hash, a, b);
                if a == start {
                    s.remove(0);
                }
                s
            })
        };
        if self.think == 0 {
            return (None, (from < to).then(|| self.raw_text(from, to)));
        }
        (part(1, self.think - 1), part(self.think, u64::MAX))
    }
}

const THINK_START: &str = "<think>";
const THINK_END: &str = "</think>";

/// With `--reasoning-parser` the sim serves a thinking model (a server is given a parser only
/// for one): each answer opens with a `<think>…</think>` block of 2 + ¼ of its natural length.
/// Without the flag the model does not think, so the text is what it always was.
fn thought_tokens(app: &Shared, natural: u64) -> u64 {
    if parses_reasoning(app) {
        2 + natural / 4
    } else {
        0
    }
}

/// Whether the server splits thoughts from answers in chat (`--reasoning-parser` given).
fn parses_reasoning(app: &Shared) -> bool {
    app.cfg
        .server_args
        .get("reasoning_parser")
        .is_some_and(|v| !v.is_null())
}

/// Why a request is answered 400 before it runs, and which part of SGLang says so.
enum Rejection {
    /// TokenizerManager's `_validate_one_request` raises before any output: a plain HTTP 400
    /// even for a streamed OpenAI request (serving_base primes the first chunk).
    Tokenizer(String),
    /// The scheduler aborts the request on arrival: a 400 when not streamed
    /// (tokenizer_manager.py raises ValueError), inside the 200 when streamed.
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
    let think = thought_tokens(app, natural);
    let natural = natural + think;
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
        think,
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

/// Why a non-streamed request did not complete.
enum Stop {
    ShuttingDown,
    Aborted(Abort),
}

/// Runs a non-streamed request to completion; returns its completion tokens.
async fn run_once(app: &Shared, p: &Prepared) -> Result<u64, Stop> {
    if app.cfg.instant || p.output_tokens == 0 {
        app.metrics
            .finished(p.prompt_tokens, p.output_tokens, false);
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
    app.jobs.send(job).await.map_err(|_| Stop::ShuttingDown)?;
    rx.await
        .map_err(|_| Stop::ShuttingDown)?
        .map_err(Stop::Aborted)
}

/// A non-streamed abort with a status other than 400: tokenizer_manager.py raises
/// `HTTPException`, which http_server.py's handler (and serving_base.py on the OpenAI routes)
/// answers with an `ErrorResponse` whose type is the status's number.
fn aborted(why: Abort) -> Response {
    let status = StatusCode::from_u16(why.status()).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    openai_error(status, &why.status().to_string(), why.message())
}

/// Starts a streamed request; the receiver follows its progress.
async fn run_streamed(
    app: &Shared,
    p: &Prepared,
) -> Result<watch::Receiver<Progress>, ShuttingDown> {
    if app.cfg.instant || p.output_tokens == 0 {
        app.metrics.finished(p.prompt_tokens, p.output_tokens, true);
        let (_tx, rx) = watch::channel(Progress {
            generated: p.output_tokens,
            done: true,
            aborted: None,
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

/// An SSE body: `render(from, to, done)` chunks as tokens arrive, the first preceded by the
/// `head` chunks, then `data: [DONE]`; a request the scheduler aborts gets `abort(why)` alone
/// instead (serving_chat.py checks for the abort before it sends the role chunk). A stream
/// whose server goes away mid-way ends without `[DONE]`.
fn sse<R, A>(rx: watch::Receiver<Progress>, head: Vec<String>, render: R, abort: A) -> Response
where
    R: FnMut(u64, u64, bool) -> Vec<String> + Send + 'static,
    A: FnOnce(Abort) -> String + Send + 'static,
{
    let state = Some((rx, 0u64, render, head, Some(abort)));
    let chunks = futures::stream::unfold(state, |state| async move {
        let (mut rx, sent, mut render, mut head, mut abort) = state?;
        loop {
            let p = *rx.borrow_and_update();
            if let Some(why) = p.aborted {
                let out = vec![(abort.take()?)(why), "[DONE]".to_string()];
                return Some((out, None));
            }
            if p.generated > sent || p.done {
                let mut out = std::mem::take(&mut head);
                out.extend(render(sent, p.generated, p.done));
                if p.done {
                    out.push("[DONE]".to_string());
                    return Some((out, None));
                }
                return Some((out, Some((rx, p.generated, render, head, abort))));
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

/// A stream of one chunk then `[DONE]`: how SGLang reports a request refused after its 200
/// went out (an error event, or on `/generate` the scheduler's abort).
fn sse_once(chunk: Json) -> Response {
    let events = futures::stream::iter([
        Ok::<_, Infallible>(Event::default().data(chunk.to_string())),
        Ok(Event::default().data("[DONE]")),
    ]);
    Sse::new(events).into_response()
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
        Err(Rejection::Tokenizer(msg)) if req.stream => {
            return sse_once(json!({"error": {
                "message": msg, "type": "invalid_request_error", "code": 400, "retryable": false,
            }}));
        }
        // srt/managers/scheduler.py `set_finish_with_abort` (status 400) reaches a stream as a
        // normal chunk with the abort as its finish reason (tokenizer_manager.py
        // `_handle_abort_finish_reason`), then [DONE], in a 200. The abort replaces the input
        // with one token and the chunk counts one output token, as 0.5.23 answers (seen from
        // the real server).
        Err(Rejection::Scheduler(msg)) if req.stream => {
            return sse_once(json!({"text": "", "meta_info": {
                "id": rid,
                "finish_reason": {"type": "abort", "message": msg, "status_code": 400,
                                  "err_type": "BadRequestError"},
                "prompt_tokens": 1,
                "completion_tokens": 1,
                "cached_tokens": 0,
                "weight_version": "default",
                "total_retractions": 0,
                "e2e_latency": started.elapsed().as_secs_f64(),
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
    let abort_rid = rid.clone();
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
        let prompt_tokens = p.prompt_tokens;
        let render = move |from: u64, to: u64, done: bool| {
            text_so_far.push_str(&p.raw_text(from, to));
            vec![json!({"text": text_so_far, "meta_info": meta(&p, to, done, started)}).to_string()]
        };
        // scheduler.py `_abort_on_queued_limit` gives a finish reason without `err_type`.
        let abort = move |why: Abort| {
            json!({"text": "", "meta_info": {
                "id": abort_rid,
                "finish_reason": {"type": "abort", "status_code": why.status(),
                                  "message": why.message()},
                "prompt_tokens": prompt_tokens,
                "completion_tokens": 0,
                "cached_tokens": 0,
                "weight_version": "default",
                "total_retractions": 0,
                "e2e_latency": started.elapsed().as_secs_f64(),
            }})
            .to_string()
        };
        return sse(rx, Vec::new(), render, abort);
    }
    match run_once(&app, &p).await {
        Ok(completion) => json_response(
            StatusCode::OK,
            &json!({
                "text": p.raw_text(0, completion),
                "meta_info": meta(&p, completion, true, started),
            }),
        ),
        Err(Stop::ShuttingDown) => shutting_down_native(),
        Err(Stop::Aborted(why)) => aborted(why),
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

#[derive(Deserialize, Default, Clone, Copy)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
    /// Usage in every chunk (srt/entrypoints/openai/utils.py `should_include_usage`).
    #[serde(default)]
    continuous_usage_stats: bool,
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

    /// A streamed choice: `delta` (chat) or `text` (completions), and the finish reason when
    /// `done`.
    fn chunk_choice(self, p: &Prepared, body: Json, done: bool) -> Json {
        let (finish, matched) = if done {
            (json!(p.finish_reason()), p.matched_stop())
        } else {
            (Json::Null, Json::Null)
        };
        let mut choice = json!({
            "index": 0, "logprobs": null, "finish_reason": finish, "matched_stop": matched,
        });
        match self {
            OpenAi::Chat => choice["delta"] = body,
            OpenAi::Completion => choice["text"] = body,
        }
        choice
    }

    /// srt/entrypoints/openai/serving_chat.py: `content` is "" rather than null, and the thought
    /// is `reasoning_content` when the server parses reasoning.
    fn full_choice(self, p: &Prepared, tokens: u64, parse_reasoning: bool) -> Json {
        let mut choice = json!({
            "index": 0, "logprobs": null,
            "finish_reason": p.finish_reason(), "matched_stop": p.matched_stop(),
        });
        match self {
            OpenAi::Chat => {
                let (reasoning, content) = if parse_reasoning {
                    p.split_text(0, tokens)
                } else {
                    (None, Some(p.raw_text(0, tokens)))
                };
                choice["message"] = json!({
                    "role": "assistant", "content": content.unwrap_or_default(),
                    "reasoning_content": reasoning, "tool_calls": null,
                })
            }
            OpenAi::Completion => choice["text"] = json!(p.raw_text(0, tokens)),
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
    options: StreamOptions,
}

async fn openai_generate(app: Shared, req: OpenAiReq) -> Response {
    let (n, fail) = number_request(&app);
    let p = match prepare(&app, req.prompt_tokens, req.prompt_hash, req.max_new) {
        Ok(p) => p,
        // serving_chat.py / serving_completions.py: the scheduler's abort with a status becomes
        // `create_streaming_error_response(message, status.name, status.value)`.
        Err(Rejection::Scheduler(msg)) if req.stream => {
            return sse_once(json!({"error": {
                "object": "error", "message": msg, "type": "BAD_REQUEST",
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
        let StreamOptions {
            include_usage,
            continuous_usage_stats,
        } = req.options;
        let parse_reasoning = parses_reasoning(&app);
        let render = move |from: u64, to: u64, done: bool| {
            let mut out = Vec::new();
            // Every chunk with output carries the usage so far when asked (serving_chat.py
            // `_generate_stream_content`, serving_completions.py).
            let usage = || {
                if continuous_usage_stats {
                    p.usage(to)
                } else {
                    Json::Null
                }
            };
            match kind {
                // serving_completions.py: one chunk per output, the last with the finish reason.
                OpenAi::Completion => {
                    let text = json!(p.raw_text(from, to));
                    out.push(chunk(json!([kind.chunk_choice(&p, text, done)]), usage()));
                }
                // serving_chat.py: the thought and the answer in chunks of their own, empty
                // deltas skipped, then the finish reason in a chunk of its own.
                OpenAi::Chat => {
                    let (reasoning, content) = if parse_reasoning {
                        p.split_text(from, to)
                    } else {
                        (None, (to > from).then(|| p.raw_text(from, to)))
                    };
                    if let Some(r) = reasoning {
                        let delta = json!({"reasoning_content": r});
                        out.push(chunk(json!([kind.chunk_choice(&p, delta, false)]), usage()));
                    }
                    if let Some(c) = content {
                        let delta = json!({"content": c});
                        out.push(chunk(json!([kind.chunk_choice(&p, delta, false)]), usage()));
                    }
                    if done {
                        out.push(chunk(
                            json!([kind.chunk_choice(&p, json!({}), true)]),
                            Json::Null,
                        ));
                    }
                }
            }
            // The last usage leaves out the empty details on completions only (as 0.5.23
            // answers).
            if done && include_usage {
                let usage = match kind {
                    OpenAi::Chat => p.usage(to),
                    OpenAi::Completion => p.final_usage(to),
                };
                out.push(chunk(json!([]), usage));
            }
            out
        };
        // serving_chat.py / serving_completions.py: an abort with a status is
        // `create_streaming_error_response(message, status.name, status.value)`.
        let abort = |why: Abort| {
            let name = match why.status() {
                503 => "SERVICE_UNAVAILABLE",
                _ => "BAD_REQUEST",
            };
            json!({"error": {
                "object": "error", "message": why.message(), "type": name,
                "param": null, "code": why.status(),
            }})
            .to_string()
        };
        return sse(rx, head, render, abort);
    }
    match run_once(&app, &p).await {
        Ok(completion) => {
            let mut body = json!({
                "id": id,
                "object": kind.object(false),
                "created": created,
                "model": model,
                "choices": [kind.full_choice(&p, completion, parses_reasoning(&app))],
                "usage": p.usage(completion),
            });
            if let OpenAi::Chat = kind {
                body["metadata"] = json!({"weight_version": "default"});
            }
            json_response(StatusCode::OK, &body)
        }
        Err(Stop::ShuttingDown) => shutting_down_openai(),
        Err(Stop::Aborted(why)) => aborted(why),
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
        options: req.stream_options.unwrap_or_default(),
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
        options: req.stream_options.unwrap_or_default(),
    };
    openai_generate(app, req).await
}
