//! Streamed generation (server-sent events) for the sweep's trials: the bodies of
//! [`CompletionRequest::body`] sent with `stream: true`, reporting each chunk's cumulative
//! completion tokens as it arrives, so tokens and latencies fall into the window they came in.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::{Value, json};

use super::client::{
    Api, BodyError, ClientError, Completion, CompletionRequest, SglangClient, completion_error,
};
use super::response::Assembler;

/// How a streamed request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Streamed {
    pub completion_tokens: u64,
    pub finish_reason: Option<String>,
}

/// The streaming body: the non-streamed one plus `stream: true`; on the OpenAI APIs usage on
/// every chunk (`continuous_usage_stats`, srt/entrypoints/openai/protocol.py `StreamOptions`)
/// and at the end, because SGLang merges several decode steps into one chunk and chat skips
/// empty deltas, so chunks are no token count. `ignore_eos` makes the server generate exactly
/// `max_tokens`.
pub fn stream_body(req: &CompletionRequest, ignore_eos: bool) -> Option<Value> {
    let mut body = req.body()?;
    let obj = body.as_object_mut()?;
    obj.insert("stream".into(), json!(true));
    match req.api {
        Api::Generate => {
            if ignore_eos && let Some(sp) = obj.get_mut("sampling_params") {
                sp["ignore_eos"] = json!(true);
            }
        }
        Api::Chat | Api::Completions => {
            obj.insert(
                "stream_options".into(),
                json!({"include_usage": true, "continuous_usage_stats": true}),
            );
            if ignore_eos {
                obj.insert("ignore_eos".into(), json!(true));
            }
        }
    }
    Some(body)
}

/// What one SSE `data:` payload says.
#[derive(Debug, Clone, PartialEq)]
enum Event {
    /// Cumulative completion tokens so far when the chunk says (`meta_info.completion_tokens`
    /// on `/generate`, `usage.completion_tokens` with continuous usage on the OpenAI APIs);
    /// otherwise whether it carried text, counted as one token.
    Progress {
        tokens: Option<u64>,
        text: bool,
        finish: Option<String>,
    },
    /// The final usage chunk of the OpenAI APIs.
    Usage(u64),
    /// The request failed inside a 200 stream: an error event, or a `/generate` chunk whose
    /// finish reason is an abort. `code` is the HTTP status it stands for (none for an abort
    /// someone asked for, which carries no status).
    Failed {
        code: Option<u16>,
        message: String,
    },
    Done,
}

/// A stream chunk of any API, typed so that parsing skips what is not needed: `/generate`
/// repeats the whole text so far in every chunk, which must not be copied each time.
#[derive(Deserialize)]
struct Chunk {
    error: Option<Value>,
    object: Option<String>,
    message: Option<String>,
    code: Option<Value>,
    meta_info: Option<Meta>,
    usage: Option<Usage>,
    choices: Option<Vec<Choice>>,
}

#[derive(Deserialize)]
struct Meta {
    completion_tokens: Option<u64>,
    finish_reason: Option<Finish>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Finish {
    Typed {
        #[serde(rename = "type")]
        kind: String,
        message: Option<String>,
        status_code: Option<Value>,
    },
    Plain(String),
}

#[derive(Deserialize)]
struct Usage {
    completion_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct Choice {
    delta: Option<Delta>,
    text: Option<String>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Delta {
    content: Option<String>,
    reasoning_content: Option<String>,
}

/// An HTTP status in a JSON field: a number, or digits in a string.
/// Only an error status counts: tokenizer_manager.py `_handle_abort_finish_reason` lets an abort
/// with any other code through as a normal end.
fn status_code(v: Option<&Value>) -> Option<u16> {
    let code = match v? {
        Value::Number(n) => n.as_u64().and_then(|n| u16::try_from(n).ok()),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }?;
    (400..600).contains(&code).then_some(code)
}

fn non_empty(s: Option<&str>) -> bool {
    s.is_some_and(|t| !t.is_empty())
}

fn parse_event(api: Api, data: &str) -> Result<Event, BodyError> {
    if data == "[DONE]" {
        return Ok(Event::Done);
    }
    let c: Chunk = serde_json::from_str(data).map_err(BodyError::Chunk)?;
    // srt/entrypoints/http_server.py (`/generate`: {"error": {"message", "code", ...}}) and
    // serving_base.py `create_streaming_error_response` (OpenAI: {"error": {"object": "error",
    // "message", "type": "BAD_REQUEST", "code": 400}}).
    if let Some(err) = c.error {
        let message = err
            .get("message")
            .and_then(Value::as_str)
            .map_or_else(|| err.to_string(), str::to_string);
        return Ok(Event::Failed {
            code: status_code(err.get("code")).or(Some(500)),
            message,
        });
    }
    if c.object.as_deref() == Some("error") {
        return Ok(Event::Failed {
            code: status_code(c.code.as_ref()).or(Some(500)),
            message: c.message.unwrap_or_else(|| "error".into()),
        });
    }
    match api {
        Api::Generate => {
            let meta = c.meta_info;
            let tokens = meta.as_ref().and_then(|m| m.completion_tokens);
            let finish = match meta.and_then(|m| m.finish_reason) {
                // srt/managers/tokenizer_manager.py `_handle_abort_finish_reason`: a streamed
                // request the scheduler aborts (input limit, retraction, full queue) gets a
                // normal chunk with this finish reason, then [DONE].
                Some(Finish::Typed {
                    kind,
                    message,
                    status_code: code,
                }) if kind == "abort" => {
                    return Ok(Event::Failed {
                        code: status_code(code.as_ref()),
                        message: message.unwrap_or_else(|| "Aborted".into()),
                    });
                }
                Some(Finish::Typed { kind, .. } | Finish::Plain(kind)) => Some(kind),
                None => None,
            };
            Ok(Event::Progress {
                tokens,
                text: true,
                finish,
            })
        }
        Api::Chat | Api::Completions => {
            let choice = c.choices.and_then(|v| v.into_iter().next());
            let usage = c.usage.and_then(|u| u.completion_tokens);
            let Some(choice) = choice else {
                return Ok(match usage {
                    Some(n) => Event::Usage(n),
                    None => Event::Progress {
                        tokens: None,
                        text: false,
                        finish: None,
                    },
                });
            };
            // serving_chat.py: an abort without a status (one someone asked for) ends as a
            // normal chunk.
            if choice.finish_reason.as_deref() == Some("abort") {
                return Ok(Event::Failed {
                    code: None,
                    message: "Aborted".into(),
                });
            }
            let text = match &choice.delta {
                Some(d) => {
                    non_empty(d.content.as_deref()) || non_empty(d.reasoning_content.as_deref())
                }
                None => non_empty(choice.text.as_deref()),
            };
            Ok(Event::Progress {
                tokens: usage,
                text,
                finish: choice.finish_reason,
            })
        }
    }
}

/// Where the first complete SSE event in `buf` ends: `(its end, where the next one starts)`,
/// the separator (a blank line, `\n\n` or `\r\n\r\n`) between them.
fn event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let mut from = 0;
    while let Some(p) = buf[from..].iter().position(|&b| b == b'\n') {
        let n = from + p;
        if buf.get(n + 1) == Some(&b'\n') {
            return Some((n, n + 2));
        }
        if n >= 1 && buf[n - 1] == b'\r' && buf.get(n + 1..n + 3) == Some(b"\r\n") {
            return Some((n - 1, n + 3));
        }
        from = n + 1;
    }
    None
}

/// An event's `data:` payload (its `data:` lines, trimmed, joined by newlines); `None` for an
/// event without data (a comment, a keep-alive).
fn event_data(event: &str) -> Option<Cow<'_, str>> {
    let mut data = event
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim);
    let first = data.next()?;
    let Some(second) = data.next() else {
        return Some(Cow::Borrowed(first));
    };
    let mut joined = format!("{first}\n{second}");
    for more in data {
        joined.push('\n');
        joined.push_str(more);
    }
    Some(Cow::Owned(joined))
}

/// Splits the complete SSE events off the front of `buf`, returning their `data:` payloads.
#[cfg(test)]
fn drain_events(buf: &mut Vec<u8>) -> Vec<String> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some((end, next)) = event_end(&buf[at..]) {
        let event = std::str::from_utf8(&buf[at..at + end]).unwrap();
        out.extend(event_data(event).map(Cow::into_owned));
        at += next;
    }
    buf.drain(..at);
    out
}

impl SglangClient {
    /// Sends `req` streamed and calls `on_tokens(cumulative completion tokens)` for every chunk
    /// that advances them, as it arrives. Fails like [`SglangClient::complete`] (status,
    /// context overflow), and when the stream reports an error or ends without `[DONE]`.
    pub async fn stream(
        &self,
        req: &CompletionRequest,
        ignore_eos: bool,
        on_tokens: impl FnMut(u64),
    ) -> Result<Streamed, ClientError> {
        let body = stream_body(req, ignore_eos).ok_or_else(|| self.unsendable(req))?;
        let path = req.api.path();
        self.timed(path, read_stream(self, &body, req.api, on_tokens, None))
            .await
    }

    /// Sends one generation request streamed, reporting its cumulative output tokens as they
    /// arrive, and answers with the completion the unstreamed request would have given
    /// (`incremental`: the server runs `--incremental-streaming-output`). The answer's body is
    /// not kept: output that needs the server's own bytes asks with [`Self::complete`].
    pub async fn complete_streaming(
        &self,
        req: &CompletionRequest,
        incremental: bool,
        on_tokens: impl FnMut(u64),
    ) -> Result<Completion, ClientError> {
        let body = stream_body(req, false).ok_or_else(|| self.unsendable(req))?;
        let mut assembler = Assembler::new(req.api, incremental);
        let path = req.api.path();
        let streamed = self
            .timed(
                path,
                read_stream(self, &body, req.api, on_tokens, Some(&mut assembler)),
            )
            .await?;
        assembler
            .finish(streamed.completion_tokens)
            .map_err(|e| ClientError::Decode {
                url: format!("{}{path}", self.endpoint().base_url),
                reason: e.to_string(),
            })
    }

    /// The error for a prompt kind the request's API cannot take.
    fn unsendable(&self, req: &CompletionRequest) -> ClientError {
        let path = req.api.path();
        ClientError::Decode {
            url: format!("{}{path}", self.endpoint().base_url),
            reason: format!("this prompt kind cannot be sent to {path}"),
        }
    }
}

/// A failure inside a 200 stream, classified by the code it carries exactly as the same code
/// in a status line would be: a 400 that names a limit is a context overflow, other 4xx are
/// rejections, 5xx may succeed later; an abort without a code is retryable.
fn stream_failure(url: String, code: Option<u16>, message: &str) -> ClientError {
    match code {
        Some(status) => completion_error(url, status, message),
        None => ClientError::Aborted {
            url,
            message: message.to_string(),
        },
    }
}

async fn read_stream(
    client: &SglangClient,
    body: &Value,
    api: Api,
    mut on_tokens: impl FnMut(u64),
    mut keep: Option<&mut Assembler>,
) -> Result<Streamed, ClientError> {
    let (url, mut answer) = client.post_json(api.path(), body).await?;
    let status = answer.status();
    if status != 200 {
        let text = answer.bytes(&url).await?;
        return Err(completion_error(
            url,
            status,
            &String::from_utf8_lossy(&text),
        ));
    }
    let decode = |e: BodyError| ClientError::Decode {
        url: url.clone(),
        reason: e.to_string(),
    };
    // What has arrived of the body and is not yet split into events.
    let mut buf: Vec<u8> = Vec::new();
    let mut tokens = 0u64;
    let mut finish = None;
    while answer.chunk(&mut buf, &url).await? {
        let mut at = 0;
        while let Some((end, next)) = event_end(&buf[at..]) {
            // An event is whole lines, so a multi-byte character is never split here.
            let event =
                std::str::from_utf8(&buf[at..at + end]).map_err(|e| ClientError::Decode {
                    url: url.clone(),
                    reason: format!("the stream is not UTF-8: {e}"),
                })?;
            at += next;
            let Some(data) = event_data(event) else {
                continue;
            };
            let event = parse_event(api, &data).map_err(decode)?;
            if let Some(a) = keep.as_deref_mut()
                && !matches!(event, Event::Done | Event::Failed { .. })
            {
                a.chunk(&data).map_err(decode)?;
            }
            match event {
                Event::Done => {
                    // Read to the body's end, so that the connection goes back to the pool
                    // instead of being dropped with its descriptor still held.
                    let mut rest = Vec::new();
                    while let Ok(true) = answer.chunk(&mut rest, &url).await {
                        rest.clear();
                    }
                    return Ok(Streamed {
                        completion_tokens: tokens,
                        finish_reason: finish,
                    });
                }
                Event::Failed { code, message } => {
                    return Err(stream_failure(url, code, &message));
                }
                Event::Usage(n) => {
                    if n > tokens {
                        tokens = n;
                        on_tokens(tokens);
                    }
                }
                Event::Progress {
                    tokens: t,
                    text,
                    finish: f,
                } => {
                    let next = t.unwrap_or(tokens + u64::from(text));
                    if next > tokens {
                        tokens = next;
                        on_tokens(tokens);
                    }
                    finish = f.or(finish);
                }
            }
        }
        buf.drain(..at);
    }
    // Cut off mid-answer: the server or the connection went away, an outage, not the prompt's
    // fault.
    Err(ClientError::Transport {
        url,
        reason: "the stream ended without [DONE] (the server went away?)".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sglang::client::Prompt;

    fn req(api: Api) -> CompletionRequest {
        CompletionRequest {
            api,
            prompt: Prompt::Text("hi".into()),
            max_tokens: 64,
            temperature: None,
            top_p: None,
            model: Some("m".into()),
            extra: None,
        }
    }

    #[test]
    fn bodies_ask_for_a_stream_and_keep_everything_else() {
        let g = stream_body(&req(Api::Generate), true).unwrap();
        assert_eq!(g["stream"], true);
        assert_eq!(g["sampling_params"]["max_new_tokens"], 64);
        assert_eq!(g["sampling_params"]["ignore_eos"], true);
        let c = stream_body(&req(Api::Chat), false).unwrap();
        assert_eq!(c["stream"], true);
        assert_eq!(c["stream_options"]["include_usage"], true);
        assert_eq!(c["stream_options"]["continuous_usage_stats"], true);
        assert_eq!(c["max_tokens"], 64);
        assert!(c.get("ignore_eos").is_none());
    }

    #[test]
    fn events_are_split_and_read_per_api() {
        let mut buf = b"data: {\"text\":\"a\",\"meta_info\":{\"completion_tokens\":3,\"finish_reason\":null}}\n\n: keep-alive\n\ndata: [DONE]\r\n\r\ndata: {\"par".to_vec();
        let events = drain_events(&mut buf);
        assert_eq!(events.len(), 2);
        assert_eq!(buf, b"data: {\"par");
        let mut two = b"data: a\r\ndata:b \r\n\r\ndata: c\r\n\n".to_vec();
        assert_eq!(drain_events(&mut two), ["a\nb", "c"]);
        assert!(two.is_empty());
        assert_eq!(
            parse_event(Api::Generate, &events[0]).unwrap(),
            Event::Progress {
                tokens: Some(3),
                text: true,
                finish: None
            }
        );
        assert_eq!(parse_event(Api::Generate, &events[1]).unwrap(), Event::Done);
        let fin = r#"{"text":"ab","meta_info":{"completion_tokens":9,"finish_reason":{"type":"length"}}}"#;
        assert!(matches!(
            parse_event(Api::Generate, fin).unwrap(),
            Event::Progress { finish: Some(f), .. } if f == "length"
        ));
        let delta = r#"{"choices":[{"delta":{"content":"x"},"finish_reason":null}],"usage":null}"#;
        assert!(matches!(
            parse_event(Api::Chat, delta).unwrap(),
            Event::Progress { text: true, .. }
        ));
        let usage = r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":40}}"#;
        assert_eq!(parse_event(Api::Chat, usage).unwrap(), Event::Usage(40));
        assert!(parse_event(Api::Generate, "{nope").is_err());
    }

    #[test]
    fn chunks_count_tokens_from_their_usage_and_thoughts_are_text() {
        // Three decode steps merged into one chunk, with continuous usage.
        let merged = r#"{"choices":[{"index":0,"delta":{"content":"a b c"},"finish_reason":null}],"usage":{"prompt_tokens":9,"completion_tokens":7,"total_tokens":16}}"#;
        assert_eq!(
            parse_event(Api::Chat, merged).unwrap(),
            Event::Progress {
                tokens: Some(7),
                text: true,
                finish: None
            }
        );
        let thought = r#"{"choices":[{"index":0,"delta":{"content":null,"reasoning_content":"hmm"},"finish_reason":null}],"usage":null}"#;
        assert!(matches!(
            parse_event(Api::Chat, thought).unwrap(),
            Event::Progress {
                tokens: None,
                text: true,
                ..
            }
        ));
        let text = r#"{"choices":[{"index":0,"text":"xy","finish_reason":null}],"usage":{"completion_tokens":2}}"#;
        assert!(matches!(
            parse_event(Api::Completions, text).unwrap(),
            Event::Progress {
                tokens: Some(2),
                ..
            }
        ));
    }

    #[test]
    fn aborts_and_error_events_carry_their_own_codes() {
        // tokenizer_manager.py: the scheduler's abort in a streamed /generate.
        let abort = r#"{"text":"","meta_info":{"id":"r","finish_reason":{"type":"abort","message":"Input length (507 tokens) exceeds the maximum allowed length (506 tokens). Use a shorter input or enable --allow-auto-truncate.","status_code":400,"err_type":null},"prompt_tokens":507,"completion_tokens":0}}"#;
        let Event::Failed { code, message } = parse_event(Api::Generate, abort).unwrap() else {
            panic!("an abort is a failure");
        };
        assert_eq!(code, Some(400));
        let e = stream_failure("u".into(), code, &message);
        assert!(
            matches!(&e, ClientError::ContextOverflow { overflow, .. }
                if overflow.remedy() == crate::sglang::overflow::Remedy::PromptTooLong),
            "{e}"
        );
        let full = r#"{"text":"","meta_info":{"finish_reason":{"type":"abort","message":"The request queue is full.","status_code":503},"completion_tokens":0}}"#;
        let Event::Failed { code, message } = parse_event(Api::Generate, full).unwrap() else {
            panic!("an abort is a failure");
        };
        let e = stream_failure("u".into(), code, &message);
        assert!(matches!(e, ClientError::Status { status: 503, .. }), "{e}");
        assert!(e.is_retryable());
        // serving_chat.py: the OpenAI routes send an error object with the status's name.
        let openai = r#"{"error":{"object":"error","message":"Input length (600 tokens) exceeds the maximum allowed length (506 tokens).","type":"BAD_REQUEST","param":null,"code":400}}"#;
        let Event::Failed { code, message } = parse_event(Api::Chat, openai).unwrap() else {
            panic!("an error event is a failure");
        };
        assert!(matches!(
            stream_failure("u".into(), code, &message),
            ClientError::ContextOverflow { .. }
        ));
        let bad = r#"{"error":{"object":"error","message":"temperature must be >= 0","type":"BAD_REQUEST","code":400}}"#;
        let Event::Failed { code, message } = parse_event(Api::Completions, bad).unwrap() else {
            panic!("an error event is a failure");
        };
        let e = stream_failure("u".into(), code, &message);
        assert!(matches!(e, ClientError::Status { status: 400, .. }), "{e}");
        assert!(!e.is_retryable());
        // An abort someone asked for carries no status; a code-less error event is the server's.
        let asked = r#"{"text":"ab","meta_info":{"finish_reason":{"type":"abort","message":"Abort by user"},"completion_tokens":2}}"#;
        assert_eq!(
            parse_event(Api::Generate, asked).unwrap(),
            Event::Failed {
                code: None,
                message: "Abort by user".into()
            }
        );
        assert!(stream_failure("u".into(), None, "x").is_retryable());
        assert_eq!(
            parse_event(Api::Generate, r#"{"error":{"message":"boom"}}"#).unwrap(),
            Event::Failed {
                code: Some(500),
                message: "boom".into()
            }
        );
    }
}
