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

#[derive(Deserialize)]
struct OpenAiUsage {
    prompt_tokens: u64,
    completion_tokens: u64,
    #[serde(default)]
    prompt_tokens_details: Option<PromptDetails>,
}

#[derive(Deserialize)]
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
