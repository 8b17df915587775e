//! Generation: a request prepared (SGLang's context-overflow checks, fault injection), run on
//! the scheduler, and answered as JSON or SSE; the native `/generate` route. The OpenAI routes
//! are in [`super::openai`], the sampling parameters' checks in [`super::sampling`].

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
use serde_json::{Map, Value as Json, json};
use tokio::sync::{oneshot, watch};

use crate::sim::app::{Shared, compact, json_response, openai_error};
use crate::sim::scheduler::{Abort, Job, Progress, Reply};
use crate::sim::{sampling, text};

/// A request ready to run: its lengths and how it will end.
pub(super) struct Prepared {
    prompt_tokens: u64,
    prompt_hash: u64,
    /// Served from the radix cache (src/sim/radix.rs).
    cached_tokens: u64,
    output_tokens: u64,
    /// `max_new_tokens`, or the room left in the context when the request set none.
    max_new_tokens: u64,
    /// Ends at EOS (`stop`) rather than at the max-tokens / context limit (`length`).
    stops: bool,
    /// Output tokens of the leading `<think>…</think>` block, both tags included; 0 when the
    /// model does not think (see [`thought_tokens`]).
    think: u64,
}

impl Prepared {
    pub(super) fn finish_reason(&self) -> &'static str {
        if self.stops { "stop" } else { "length" }
    }

    pub(super) fn matched_stop(&self) -> Json {
        if self.stops {
            json!(text::EOS_TOKEN_ID)
        } else {
            Json::Null
        }
    }

    /// srt/entrypoints/openai/usage_processor.py `calculate_token_usage` (a `UsageInfo` of
    /// protocol.py, dumped whole).
    pub(super) fn usage(&self, completion: u64) -> Json {
        let mut u = self.final_usage(completion);
        u["prompt_tokens_details"] = Json::Null;
        u["completion_tokens_details"] = Json::Null;
        u
    }

    /// Usage without the empty details.
    pub(super) fn final_usage(&self, completion: u64) -> Json {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + completion,
            "completion_tokens": completion,
            "reasoning_tokens": 0,
        })
    }

    /// The raw text of output tokens `from..to`, the thought's tags included.
    pub(super) fn raw_text(&self, from: u64, to: u64) -> String {
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
    pub(super) fn split_text(&self, from: u64, to: u64) -> (Option<String>, Option<String>) {
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
pub(super) fn parses_reasoning(app: &Shared) -> bool {
    app.cfg
        .server_args
        .get("reasoning_parser")
        .is_some_and(|v| !v.is_null())
}

/// A request's sampling parameters under SGLang's names, and whether they came through an
/// OpenAI route (whose models make floats of the float fields).
pub(super) struct Sampling {
    pub params: Map<String, Json>,
    pub openai: bool,
}

/// Why a request is answered 400 before it runs, and which part of SGLang says so.
pub(super) enum Rejection {
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
pub(super) fn prepare(
    app: &Shared,
    prompt_tokens: u64,
    prompt_hash: u64,
    token_ids: &[u64],
    max_new: Option<u64>,
    sampling: &Sampling,
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
    // The tokenizer manager verifies the sampling parameters after its length checks
    // (`_create_tokenized_object`), before the scheduler sees the request.
    sampling::verify(&sampling.params, sampling.openai).map_err(Rejection::Tokenizer)?;
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
    let natural = plan.params.natural_output_len(prompt_hash);
    let think = thought_tokens(app, natural);
    let natural = natural + think;
    let limit = max_new.unwrap_or(u64::MAX).min(ctx - prompt_tokens);
    let cached_tokens = app.radix.lookup(token_ids, plan.max_total_num_tokens);
    app.metrics
        .cached_tokens_total
        .fetch_add(cached_tokens, Ordering::Relaxed);
    Ok(Prepared {
        prompt_tokens,
        prompt_hash,
        cached_tokens,
        output_tokens: natural.min(limit),
        max_new_tokens: limit,
        stops: natural <= limit,
        think,
    })
}

/// Numbers the request and draws whether `--sim-fail-rate` fails it.
pub(super) fn number_request(app: &Shared) -> (u64, bool) {
    let n = app.requests.fetch_add(1, Ordering::Relaxed);
    let draw = text::mix(app.cfg.seed ^ text::mix(n.wrapping_add(1)));
    let fail = ((draw >> 11) as f64 / (1u64 << 53) as f64) < app.cfg.fail_rate;
    (n, fail)
}

pub(super) fn request_id(app: &Shared, n: u64) -> String {
    let a = text::mix(app.cfg.seed ^ n ^ 0x5151);
    let b = text::mix(a ^ app.started_unix);
    format!("{a:016x}{b:016x}")
}

pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The scheduler is gone: the server is shutting down (or crashing).
pub(super) struct ShuttingDown;

/// Why a non-streamed request did not complete.
pub(super) enum Stop {
    ShuttingDown,
    Aborted(Abort),
}

/// Runs a non-streamed request to completion; returns its completion tokens.
pub(super) async fn run_once(app: &Shared, p: &Prepared) -> Result<u64, Stop> {
    if app.cfg.instant || p.output_tokens == 0 {
        app.metrics
            .finished(p.prompt_tokens, p.output_tokens, false);
        return Ok(p.output_tokens);
    }
    let (tx, rx) = oneshot::channel();
    let job = Job {
        prompt_tokens: p.prompt_tokens,
        cached_tokens: p.cached_tokens,
        output_tokens: p.output_tokens,
        max_new_tokens: p.max_new_tokens,
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
pub(super) fn aborted(why: Abort) -> Response {
    let status = StatusCode::from_u16(why.status()).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    openai_error(status, &why.status().to_string(), why.message())
}

/// Starts a streamed request; the receiver follows its progress.
pub(super) async fn run_streamed(
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
        cached_tokens: p.cached_tokens,
        output_tokens: p.output_tokens,
        max_new_tokens: p.max_new_tokens,
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
pub(super) fn sse<R, A>(
    rx: watch::Receiver<Progress>,
    head: Vec<String>,
    render: R,
    abort: A,
) -> Response
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
pub(super) fn sse_once(chunk: Json) -> Response {
    let events = futures::stream::iter([
        Ok::<_, Infallible>(Event::default().data(chunk.to_string())),
        Ok(Event::default().data("[DONE]")),
    ]);
    Sse::new(events).into_response()
}

// ---------------------------------------------------------------- /generate

#[derive(Deserialize)]
struct GenerateReq {
    text: Option<Json>,
    input_ids: Option<Vec<u64>>,
    #[serde(default)]
    sampling_params: Option<Map<String, Json>>,
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
    let mut token_ids = Vec::new();
    let (prompt_tokens, prompt_hash) = match (&req.text, &req.input_ids) {
        (Some(Json::String(t)), _) => {
            text::token_ids(t, &mut token_ids);
            (text::count_tokens(t), text::hash(t.as_bytes()))
        }
        (None, Some(ids)) => {
            token_ids.clone_from(ids);
            (ids.len() as u64, text::hash(format!("{ids:?}").as_bytes()))
        }
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
    let params = req.sampling_params.clone().unwrap_or_default();
    let max_new = Some(
        params
            .get("max_new_tokens")
            .and_then(Json::as_u64)
            .unwrap_or(NATIVE_DEFAULT_MAX_NEW_TOKENS),
    );
    let sampling = Sampling {
        params,
        openai: false,
    };
    let (n, fail) = number_request(&app);
    let rid = req.rid.clone().unwrap_or_else(|| request_id(&app, n));
    // srt/entrypoints/http_server.py: a streamed /generate already answered 200 when the
    // tokenizer raises, so both kinds of rejection arrive as an error event there.
    let p = match prepare(
        &app,
        prompt_tokens,
        prompt_hash,
        &token_ids,
        max_new,
        &sampling,
    ) {
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
                "num_retractions": 0,
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
        let mut meta = json!({
            "id": rid,
            "finish_reason": finish,
            "prompt_tokens": p.prompt_tokens,
            "completion_tokens": completion,
            "cached_tokens": p.cached_tokens,
            "weight_version": "default",
            "num_retractions": 0,
        });
        // tokenizer_manager.py adds the latency once the request has finished.
        if done {
            meta["e2e_latency"] = json!(started.elapsed().as_secs_f64());
        }
        meta
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
            vec![compact(
                &json!({"text": text_so_far, "meta_info": meta(&p, to, done, started)}),
            )]
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
                "num_retractions": 0,
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
