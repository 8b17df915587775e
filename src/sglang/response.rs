//! What a 200 answer of SGLang's generation routes says: the text, the reasoning, the token
//! counts (cached ones too) and the finish reason, from /generate and the OpenAI routes.

use serde::Deserialize;

use super::client::{Api, Completion};

#[derive(Deserialize)]
struct GenerateResponse {
    text: String,
    meta_info: GenerateMeta,
}

#[derive(Deserialize)]
struct GenerateMeta {
    prompt_tokens: u64,
    completion_tokens: u64,
    #[serde(default)]
    cached_tokens: Option<u64>,
    finish_reason: Option<FinishReason>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum FinishReason {
    Typed {
        #[serde(rename = "type")]
        kind: String,
    },
    Plain(String),
}

#[derive(Deserialize)]
struct OpenAiResponse {
    #[serde(default)]
    id: Option<String>,
    choices: Vec<OpenAiChoice>,
    usage: OpenAiUsage,
}

#[derive(Deserialize)]
struct OpenAiChoice {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    message: Option<OpenAiMessage>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct OpenAiMessage {
    content: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
}

#[derive(Debug, Deserialize)]
struct OpenAiUsage {
    prompt_tokens: u64,
    completion_tokens: u64,
    #[serde(default)]
    prompt_tokens_details: Option<PromptDetails>,
}

#[derive(Debug, Deserialize)]
struct PromptDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

/// Why a 200 answer is not what was asked for.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    #[error("no choices in the response")]
    NoChoices,
    #[error("bad stream chunk: {0}")]
    Chunk(serde_json::Error),
}

/// Parses a 200 response body of `api`.
pub fn parse_completion(api: Api, body: &[u8]) -> Result<Completion, BodyError> {
    match api {
        Api::Generate => {
            let r: GenerateResponse = serde_json::from_slice(body)?;
            Ok(Completion {
                text: r.text,
                reasoning: None,
                prompt_tokens: r.meta_info.prompt_tokens,
                completion_tokens: r.meta_info.completion_tokens,
                cached_tokens: r.meta_info.cached_tokens,
                finish_reason: r.meta_info.finish_reason.map(|f| match f {
                    FinishReason::Typed { kind } => kind,
                    FinishReason::Plain(s) => s,
                }),
                body: None,
                response_id: None,
            })
        }
        Api::Chat | Api::Completions => {
            let r: OpenAiResponse = serde_json::from_slice(body)?;
            let choice = r.choices.into_iter().next().ok_or(BodyError::NoChoices)?;
            let (text, reasoning) = match (api, choice.message) {
                (Api::Chat, Some(m)) => (m.content, m.reasoning_content),
                (Api::Chat, None) => (None, None),
                _ => (choice.text, None),
            };
            Ok(Completion {
                text: text.unwrap_or_default(),
                reasoning: reasoning.filter(|r| !r.is_empty()),
                prompt_tokens: r.usage.prompt_tokens,
                completion_tokens: r.usage.completion_tokens,
                cached_tokens: r.usage.prompt_tokens_details.and_then(|d| d.cached_tokens),
                finish_reason: choice.finish_reason,
                body: None,
                response_id: r.id,
            })
        }
    }
}

/// Rebuilds the answer of a streamed request from its chunks, as the unstreamed answer would
/// have said it: on `/generate` the last chunk is that answer (srt/entrypoints/http_server.py
/// sends the same dict each time, its text cumulative unless the server runs
/// `--incremental-streaming-output`); on the OpenAI routes the deltas add up to the message and
/// the last usage chunk carries the counts.
#[derive(Debug)]
pub struct Assembler {
    api: Api,
    incremental: bool,
    last: String,
    text: String,
    reasoning: String,
    id: Option<String>,
    finish: Option<String>,
    usage: Option<OpenAiUsage>,
}

#[derive(Deserialize)]
struct TextOnly {
    #[serde(default)]
    text: String,
}

#[derive(Deserialize)]
struct OpenAiChunk {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    choices: Vec<ChunkChoice>,
    #[serde(default)]
    usage: Option<OpenAiUsage>,
}

#[derive(Deserialize)]
struct ChunkChoice {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    delta: Option<OpenAiMessage>,
    #[serde(default)]
    finish_reason: Option<String>,
}

impl Assembler {
    pub fn new(api: Api, incremental: bool) -> Assembler {
        Assembler {
            api,
            incremental,
            last: String::new(),
            text: String::new(),
            reasoning: String::new(),
            id: None,
            finish: None,
            usage: None,
        }
    }

    /// Takes one `data:` payload of a successful stream (not `[DONE]`).
    pub fn chunk(&mut self, data: &str) -> Result<(), BodyError> {
        match self.api {
            Api::Generate => {
                if self.incremental {
                    let t: TextOnly = serde_json::from_str(data).map_err(BodyError::Chunk)?;
                    self.text.push_str(&t.text);
                }
                self.last.clear();
                self.last.push_str(data);
            }
            Api::Chat | Api::Completions => {
                let c: OpenAiChunk = serde_json::from_str(data).map_err(BodyError::Chunk)?;
                self.id = c.id.or(self.id.take());
                if let Some(u) = c.usage {
                    self.usage = Some(u);
                }
                if let Some(choice) = c.choices.into_iter().next() {
                    if let Some(d) = choice.delta {
                        self.text.push_str(d.content.as_deref().unwrap_or_default());
                        self.reasoning
                            .push_str(d.reasoning_content.as_deref().unwrap_or_default());
                    }
                    self.text
                        .push_str(choice.text.as_deref().unwrap_or_default());
                    self.finish = choice.finish_reason.or(self.finish.take());
                }
            }
        }
        Ok(())
    }

    /// The answer, once the stream said `[DONE]`; `streamed` is the count the chunks gave.
    pub fn finish(self, streamed: u64) -> Result<Completion, BodyError> {
        match self.api {
            Api::Generate => {
                let mut c = parse_completion(Api::Generate, self.last.as_bytes())?;
                if self.incremental {
                    c.text = self.text;
                }
                Ok(c)
            }
            Api::Chat | Api::Completions => {
                let usage = self.usage;
                Ok(Completion {
                    text: self.text,
                    reasoning: Some(self.reasoning).filter(|r| !r.is_empty()),
                    prompt_tokens: usage.as_ref().map_or(0, |u| u.prompt_tokens),
                    completion_tokens: usage.as_ref().map_or(streamed, |u| u.completion_tokens),
                    cached_tokens: usage
                        .and_then(|u| u.prompt_tokens_details)
                        .and_then(|d| d.cached_tokens),
                    finish_reason: self.finish,
                    body: None,
                    response_id: self.id,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_streamed_generate_answer_is_its_last_chunk() {
        let mut a = Assembler::new(Api::Generate, false);
        a.chunk(r#"{"text":"a","meta_info":{"prompt_tokens":5,"completion_tokens":1,"finish_reason":null}}"#).unwrap();
        a.chunk(r#"{"text":"a b","meta_info":{"prompt_tokens":5,"completion_tokens":2,"cached_tokens":3,"finish_reason":{"type":"length","length":2}}}"#).unwrap();
        let c = a.finish(2).unwrap();
        assert_eq!(c.text, "a b");
        assert_eq!((c.prompt_tokens, c.completion_tokens), (5, 2));
        assert_eq!(c.cached_tokens, Some(3));
        assert_eq!(c.finish_reason.as_deref(), Some("length"));
        // --incremental-streaming-output: each chunk's text is new text only.
        let mut a = Assembler::new(Api::Generate, true);
        a.chunk(r#"{"text":"a","meta_info":{"prompt_tokens":5,"completion_tokens":1}}"#)
            .unwrap();
        a.chunk(r#"{"text":" b","meta_info":{"prompt_tokens":5,"completion_tokens":2,"finish_reason":{"type":"stop"}}}"#).unwrap();
        assert_eq!(a.finish(2).unwrap().text, "a b");
    }

    #[test]
    fn streamed_chat_deltas_add_up_to_the_message() {
        let mut a = Assembler::new(Api::Chat, false);
        for data in [
            r#"{"id":"c1","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}],"usage":{"prompt_tokens":4,"completion_tokens":0,"total_tokens":4}}"#,
            r#"{"id":"c1","choices":[{"index":0,"delta":{"reasoning_content":"hmm"},"finish_reason":null}]}"#,
            r#"{"id":"c1","choices":[{"index":0,"delta":{"content":"4"},"finish_reason":null}]}"#,
            r#"{"id":"c1","choices":[{"index":0,"delta":{"content":"2"},"finish_reason":"stop"}]}"#,
            r#"{"id":"c1","choices":[],"usage":{"prompt_tokens":4,"completion_tokens":3,"total_tokens":7,"prompt_tokens_details":{"cached_tokens":2}}}"#,
        ] {
            a.chunk(data).unwrap();
        }
        let c = a.finish(3).unwrap();
        assert_eq!(
            (c.text.as_str(), c.reasoning.as_deref()),
            ("42", Some("hmm"))
        );
        assert_eq!((c.prompt_tokens, c.completion_tokens), (4, 3));
        assert_eq!(c.cached_tokens, Some(2));
        assert_eq!(c.finish_reason.as_deref(), Some("stop"));
        assert_eq!(c.response_id.as_deref(), Some("c1"));
        let mut a = Assembler::new(Api::Completions, false);
        a.chunk(r#"{"id":"x","choices":[{"index":0,"text":"he","finish_reason":null}]}"#)
            .unwrap();
        a.chunk(r#"{"id":"x","choices":[{"index":0,"text":"y","finish_reason":"length"}]}"#)
            .unwrap();
        let c = a.finish(2).unwrap();
        assert_eq!((c.text.as_str(), c.completion_tokens), ("hey", 2));
    }
}
