//! The OpenAI routes (`/v1/chat/completions`, `/v1/completions`): their requests, their JSON
//! and SSE bodies as srt/entrypoints/openai/serving_chat.py and serving_completions.py write them.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use serde_json::{Map, Value as Json, json};

use crate::sim::app::{Shared, compact, json_response, openai_error};
use crate::sim::generate::{
    Prepared, Rejection, Sampling, ShuttingDown, Stop, aborted, number_request, parses_reasoning,
    prepare, request_id, run_once, run_streamed, sse, sse_once, unix_now,
};
use crate::sim::scheduler::Abort;
use crate::sim::text;

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

/// The sampling parameters of an OpenAI request under SGLang's names
/// (srt/entrypoints/openai/protocol.py `to_sampling_params`).
fn sampling(body: &Json, max_new: Option<u64>) -> Sampling {
    let mut params = Map::new();
    for (ours, theirs) in [
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("top_k", "top_k"),
        ("min_p", "min_p"),
        ("frequency_penalty", "frequency_penalty"),
        ("presence_penalty", "presence_penalty"),
        ("repetition_penalty", "repetition_penalty"),
        ("min_tokens", "min_new_tokens"),
    ] {
        if let Some(v) = body.get(ours) {
            params.insert(theirs.to_string(), v.clone());
        }
    }
    if let Some(m) = max_new {
        params.insert("max_new_tokens".into(), json!(m));
    }
    Sampling {
        params,
        openai: true,
    }
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
                    "reasoning_content": reasoning,
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
    /// The prompt's token ids, for the radix cache.
    token_ids: Vec<u64>,
    max_new: Option<u64>,
    sampling: Sampling,
    stream: bool,
    options: StreamOptions,
}

async fn openai_generate(app: Shared, req: OpenAiReq) -> Response {
    let (n, fail) = number_request(&app);
    let p = match prepare(
        &app,
        req.prompt_tokens,
        req.prompt_hash,
        &req.token_ids,
        req.max_new,
        &req.sampling,
    ) {
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
        // A chunk has `usage` only when it carries one (the role chunk and the finish-reason
        // chunk have none).
        let chunk = move |choices: Json, usage: Json| {
            let mut c = json!({
                "id": id, "object": kind.object(true), "created": created, "model": model,
                "choices": choices,
            });
            if !usage.is_null() {
                c["usage"] = usage;
            }
            compact(&c)
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

/// The body as JSON and as the route's request type, or why it is neither.
fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<(Json, T), serde_json::Error> {
    let raw: Json = serde_json::from_slice(body)?;
    let req = serde_json::from_value(raw.clone())?;
    Ok((raw, req))
}

pub async fn chat(State(app): State<Shared>, body: Bytes) -> Response {
    let (raw, req): (Json, ChatReq) = match parse(&body) {
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
    let token_ids = text::chat_token_ids(texts.iter().map(String::as_str));
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
        token_ids,
        max_new,
        sampling: sampling(&raw, max_new),
        stream: req.stream,
        options: req.stream_options.unwrap_or_default(),
    };
    openai_generate(app, req).await
}

pub async fn completions(State(app): State<Shared>, body: Bytes) -> Response {
    let (raw, req): (Json, CompletionReq) = match parse(&body) {
        Ok(r) => r,
        Err(e) => return bad_request(&format!("Invalid request: {e}")),
    };
    let mut token_ids = Vec::new();
    let (prompt_tokens, prompt_hash) = match &req.prompt {
        Json::String(t) => {
            text::token_ids(t, &mut token_ids);
            (text::count_tokens(t), text::hash(t.as_bytes()))
        }
        Json::Array(ids) if !ids.is_empty() && ids.iter().all(Json::is_u64) => {
            token_ids.extend(ids.iter().filter_map(Json::as_u64));
            (
                ids.len() as u64,
                text::hash(req.prompt.to_string().as_bytes()),
            )
        }
        _ => {
            return bad_request(
                "sglang-sim supports a single prompt (a string or a list of token ids) per request.",
            );
        }
    };
    let max_new = req.max_tokens.unwrap_or(COMPLETIONS_DEFAULT_MAX_TOKENS);
    let req = OpenAiReq {
        kind: OpenAi::Completion,
        model: req.model,
        prompt_tokens,
        prompt_hash,
        token_ids,
        max_new: Some(max_new),
        sampling: sampling(&raw, Some(max_new)),
        stream: req.stream,
        options: req.stream_options.unwrap_or_default(),
    };
    openai_generate(app, req).await
}

fn shutting_down_openai() -> Response {
    openai_error(
        StatusCode::SERVICE_UNAVAILABLE,
        "ServiceUnavailableError",
        "The server is shutting down.",
    )
}
