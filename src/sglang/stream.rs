//! Streamed generation (server-sent events) for the sweep's trials: the bodies of
//! [`CompletionRequest::body`] sent with `stream: true`, reporting each chunk's cumulative
//! completion tokens as it arrives, so tokens and latencies fall into the window they came in.

use futures::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};

use super::client::{Api, ClientError, CompletionRequest, SglangClient, completion_error};
use super::overflow::parse_overflow;

/// How a streamed request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Streamed {
    pub completion_tokens: u64,
    pub finish_reason: Option<String>,
}

/// The streaming body: the non-streamed one plus `stream: true` (and usage in the last chunk of
/// the OpenAI APIs); `ignore_eos` makes the server generate exactly `max_tokens`.
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
            obj.insert("stream_options".into(), json!({"include_usage": true}));
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
    /// Cumulative completion tokens so far (exact on `/generate`; counted by chunks with text on
    /// the OpenAI APIs until the final usage).
    Progress {
        tokens: Option<u64>,
        text: bool,
        finish: Option<String>,
    },
    /// The final usage chunk of the OpenAI APIs.
    Usage(u64),
    Error(String),
    Done,
}

/// A stream chunk of any API, typed so that parsing skips what is not needed: `/generate`
/// repeats the whole text so far in every chunk, which must not be copied each time.
#[derive(Deserialize)]
struct Chunk {
    error: Option<Value>,
    object: Option<String>,
    message: Option<String>,
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
}

fn parse_event(api: Api, data: &str) -> Result<Event, String> {
    if data == "[DONE]" {
        return Ok(Event::Done);
    }
    let c: Chunk = serde_json::from_str(data).map_err(|e| format!("bad stream chunk: {e}"))?;
    if let Some(err) = c.error {
        let msg = err
            .get("message")
            .and_then(Value::as_str)
            .map_or_else(|| err.to_string(), str::to_string);
        return Ok(Event::Error(msg));
    }
    if c.object.as_deref() == Some("error") {
        return Ok(Event::Error(c.message.unwrap_or_else(|| "error".into())));
    }
    match api {
        Api::Generate => {
            let meta = c.meta_info;
            let finish = meta
                .as_ref()
                .and_then(|m| m.finish_reason.as_ref())
                .map(|f| match f {
                    Finish::Typed { kind } => kind.clone(),
                    Finish::Plain(s) => s.clone(),
                });
            Ok(Event::Progress {
                tokens: meta.and_then(|m| m.completion_tokens),
                text: true,
                finish,
            })
        }
        Api::Chat | Api::Completions => {
            if let Some(n) = c.usage.and_then(|u| u.completion_tokens) {
                return Ok(Event::Usage(n));
            }
            let choice = c.choices.and_then(|v| v.into_iter().next());
            let text = choice.as_ref().is_some_and(|ch| {
                ch.delta
                    .as_ref()
                    .and_then(|d| d.content.as_deref())
                    .or(ch.text.as_deref())
                    .is_some_and(|t| !t.is_empty())
            });
            Ok(Event::Progress {
                tokens: None,
                text,
                finish: choice.and_then(|ch| ch.finish_reason),
            })
        }
    }
}

/// Splits complete SSE events off the front of `buf`, returning their `data:` payloads.
fn drain_events(buf: &mut String) -> Vec<String> {
    let mut out = Vec::new();
    loop {
        let norm_end = buf.find("\n\n").map(|i| (i, 2));
        let crlf_end = buf.find("\r\n\r\n").map(|i| (i, 4));
        let Some((end, sep)) = [norm_end, crlf_end].into_iter().flatten().min() else {
            return out;
        };
        let event: String = buf.drain(..end + sep).collect();
        let data: Vec<&str> = event
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim)
            .collect();
        if !data.is_empty() {
            out.push(data.join("\n"));
        }
    }
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
        let (url, rb) = self.request(reqwest::Method::POST, req.api.path());
        let body = stream_body(req, ignore_eos).ok_or_else(|| ClientError::Decode {
            url: url.clone(),
            reason: format!("this prompt kind cannot be sent to {}", req.api.path()),
        })?;
        read_stream(url, rb.json(&body), req.api, on_tokens).await
    }
}

async fn read_stream(
    url: String,
    rb: reqwest::RequestBuilder,
    api: Api,
    mut on_tokens: impl FnMut(u64),
) -> Result<Streamed, ClientError> {
    let resp = rb
        .send()
        .await
        .map_err(|e| ClientError::from_reqwest(&url, e))?;
    let status = resp.status().as_u16();
    if status != 200 {
        let text = resp
            .text()
            .await
            .map_err(|e| ClientError::from_reqwest(&url, e))?;
        return Err(completion_error(url, status, &text));
    }
    let mut bytes = resp.bytes_stream();
    let mut buf = String::new();
    let mut pending: Vec<u8> = Vec::new();
    let mut tokens = 0u64;
    let mut finish = None;
    while let Some(chunk) = bytes.next().await {
        let chunk = chunk.map_err(|e| ClientError::from_reqwest(&url, e))?;
        pending.extend_from_slice(&chunk);
        // A chunk may end inside a multi-byte character: keep the incomplete tail for later.
        let valid = match std::str::from_utf8(&pending) {
            Ok(s) => s.len(),
            Err(e) => e.valid_up_to(),
        };
        buf.push_str(std::str::from_utf8(&pending[..valid]).expect("checked above"));
        pending.drain(..valid);
        for data in drain_events(&mut buf) {
            let event = parse_event(api, &data).map_err(|reason| ClientError::Decode {
                url: url.clone(),
                reason,
            })?;
            match event {
                Event::Done => {
                    return Ok(Streamed {
                        completion_tokens: tokens,
                        finish_reason: finish,
                    });
                }
                Event::Error(msg) => {
                    return Err(match parse_overflow(&msg) {
                        Some(overflow) => ClientError::ContextOverflow { url, overflow },
                        None => ClientError::Status {
                            url,
                            status,
                            body: msg,
                        },
                    });
                }
                Event::Usage(n) => {
                    if n > tokens {
                        tokens = n;
                        on_tokens(tokens);
                    }
                    tokens = n;
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
    }
    Err(ClientError::Decode {
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
        assert_eq!(c["max_tokens"], 64);
        assert!(c.get("ignore_eos").is_none());
    }

    #[test]
    fn events_are_split_and_read_per_api() {
        let mut buf = "data: {\"text\":\"a\",\"meta_info\":{\"completion_tokens\":3,\"finish_reason\":null}}\n\ndata: [DONE]\r\n\r\ndata: {\"par".to_string();
        let events = drain_events(&mut buf);
        assert_eq!(events.len(), 2);
        assert_eq!(buf, "data: {\"par");
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
        let err = r#"{"error":{"message":"boom"}}"#;
        assert_eq!(
            parse_event(Api::Generate, err).unwrap(),
            Event::Error("boom".into())
        );
        assert!(parse_event(Api::Generate, "{nope").is_err());
    }
}
