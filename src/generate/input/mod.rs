//! The prompt file: what a line is (plain, chat or OpenAI Batch API), what its id is, the
//! streaming byte reader ([`reader`]) and the pre-pass that checks ids and finds where the work
//! stands ([`scan`]).
//!
//! An id is a string or an integer, kept exactly as written (`1` and `"1"` are the same id: a
//! resumed job must not care how a generator quoted it). A line without one is named after its
//! content: `sha256:` and the first 16 hex digits of the SHA-256 of its bytes, with `#2`, `#3`,
//! … for later copies of the same line, so ids do not shift when other lines move.

mod reader;
mod scan;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::sglang::client::{Api, Prompt};

pub use reader::{FileFacts, HEAD_BYTES, Position, Reader};
pub use scan::{Known, RetryFailed, Scan, scan};

#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{}: duplicate id {id:?} on lines {first_line} and {line} (ids must be unique so that --resume can tell what is done)",
        path.display()
    )]
    Duplicate {
        path: PathBuf,
        id: String,
        first_line: u64,
        line: u64,
    },
    #[error(
        "{}: the file shrank while the job ran (it was read to byte {at}, it had {expected} bytes); \
         the lines after that were never attempted",
        path.display()
    )]
    Shrank {
        path: PathBuf,
        expected: u64,
        at: u64,
    },
}

/// Why an id field is not an id.
#[derive(Debug, Clone, thiserror::Error)]
pub enum IdError {
    #[error("{0}")]
    BadString(Arc<serde_json::Error>),
    #[error("an id must be a string or an integer, got {0}")]
    NotStringOrInteger(String),
}

/// Why a line cannot be a prompt: it is recorded as failed, with this as its error.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LineError {
    #[error("not valid UTF-8 (at byte {at} of the line)")]
    NotUtf8 { at: usize },
    #[error("a prompt line must be a JSON object")]
    NotAnObject,
    #[error("not a JSON object: {0}")]
    Json(Arc<serde_json::Error>),
    #[error(transparent)]
    Id(#[from] IdError),
    #[error("Batch API url {0:?} is not supported (use /v1/chat/completions or /v1/completions)")]
    BatchUrl(String),
    #[error("body.{field} must be a positive integer, got {got}")]
    MaxTokens { field: &'static str, got: Value },
    #[error("Batch API body has neither `messages` nor `prompt`")]
    EmptyBody,
    #[error("has both `prompt` and `messages`; keep one")]
    Both,
    #[error("missing `prompt` (or `messages`, or a Batch API `body`)")]
    Missing,
    #[error("`{field}` must be {want}, got {got}")]
    Kind {
        field: &'static str,
        want: &'static str,
        got: &'static str,
    },
    #[error("`{field}` is empty")]
    NoMessages { field: &'static str },
}

impl LineError {
    fn json(e: serde_json::Error) -> Self {
        LineError::Json(Arc::new(e))
    }
}

/// Lower-case hex of a digest.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A prompt's id: as given (string or integer), or named after the line's content.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Id {
    pub text: String,
    /// Written as a JSON number (digits exactly as given).
    pub numeric: bool,
}

impl Id {
    /// An id that is a number (tests, and the sweep's synthetic requests).
    pub fn line(number: u64) -> Self {
        Id {
            text: number.to_string(),
            numeric: true,
        }
    }

    /// The id of a line that names none: its content's hash, and which copy of that content.
    pub fn content(hash: u64, occurrence: u32) -> Self {
        let text = match occurrence {
            0 | 1 => format!("sha256:{hash:016x}"),
            n => format!("sha256:{hash:016x}#{n}"),
        };
        Id {
            text,
            numeric: false,
        }
    }

    /// The key that `--resume` and the duplicate check compare: 128 bits of two SipHashes, so
    /// 654,676 ids take ~16 bytes each and a false match is astronomically unlikely.
    pub fn key(&self) -> u128 {
        key_of(&self.text)
    }

    /// An id field as JSON has it: a string, or an integer kept digit for digit.
    pub fn from_json(raw: &RawValue) -> Result<Id, IdError> {
        let t = raw.get();
        if t.starts_with('"') {
            let text: String =
                serde_json::from_str(t).map_err(|e| IdError::BadString(Arc::new(e)))?;
            return Ok(Id {
                text,
                numeric: false,
            });
        }
        let digits = t.strip_prefix('-').unwrap_or(t);
        if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
            return Ok(Id {
                text: t.to_string(),
                numeric: true,
            });
        }
        Err(IdError::NotStringOrInteger(t.to_string()))
    }
}

pub fn key_of(text: &str) -> u128 {
    use std::hash::{DefaultHasher, Hasher};
    let mut a = DefaultHasher::new();
    a.write(text.as_bytes());
    let mut b = DefaultHasher::new();
    b.write_u8(0x5a);
    b.write(text.as_bytes());
    ((a.finish() as u128) << 64) | b.finish() as u128
}

/// The first 64 bits of a line's SHA-256: what names an id-less line and tells whether a
/// failed line was edited since.
pub fn content_hash(bytes: &[u8]) -> u64 {
    let digest = Sha256::digest(bytes);
    u64::from_be_bytes(digest[..8].try_into().expect("a SHA-256 is 32 bytes"))
}

impl Serialize for Id {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.numeric
            && let Ok(raw) = serde_json::from_str::<&RawValue>(&self.text)
        {
            return raw.serialize(s);
        }
        s.serialize_str(&self.text)
    }
}

/// Names id-less lines: occurrences are counted only for contents known to repeat, so memory
/// stays small however many lines lack an id.
#[derive(Debug, Clone, Default)]
pub struct Ids {
    /// Content hash → copies seen so far, for contents the pre-pass found more than once.
    repeats: HashMap<u64, u32>,
}

impl Ids {
    pub fn new(repeats: HashMap<u64, u32>) -> Self {
        Ids { repeats }
    }

    /// The id of a line whose content hashes to `hash` and that names `named`.
    pub fn assign(&mut self, hash: u64, named: Option<Id>) -> Id {
        if let Some(id) = named {
            return id;
        }
        let occurrence = match self.repeats.get_mut(&hash) {
            Some(n) => {
                *n += 1;
                *n
            }
            None => 1,
        };
        Id::content(hash, occurrence)
    }
}

/// A well-formed prompt line.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptLine {
    pub prompt: Prompt,
    /// Per-line `max_tokens` (Batch API `body.max_tokens`/`max_completion_tokens`).
    pub max_tokens: Option<u32>,
    /// The API a Batch API line names in its `url`.
    pub api: Option<Api>,
    /// The rest of a Batch API `body`, passed through.
    pub extra: Option<Map<String, Value>>,
}

/// One non-blank input line.
#[derive(Debug, Clone)]
pub struct Line {
    /// 1-based line number in the file.
    pub number: u64,
    pub id: Id,
    /// [`content_hash`] of the line's bytes: recorded with a failure, so `--retry-failed` can
    /// tell whether the line was edited since.
    pub hash: u64,
    /// The prompt, or why the line is malformed.
    pub parsed: Result<PromptLine, LineError>,
}

/// Only the id fields: the prompt text is skipped by serde without being buffered.
#[derive(Deserialize)]
struct IdFields<'a> {
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    #[serde(borrow)]
    custom_id: Option<&'a RawValue>,
    /// Skipped, not buffered: only whether it is there.
    body: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
struct RawLine {
    prompt: Option<Value>,
    messages: Option<Value>,
    url: Option<String>,
    body: Option<Map<String, Value>>,
}

/// What a line is before its id is settled: the id it names, or why it has none usable.
pub struct Named {
    /// The explicit id; `None` when the line names none (or cannot be read as JSON).
    pub id: Option<Id>,
    /// Why the line cannot be a prompt, when that is already clear (bytes, JSON shape, id type).
    pub problem: Option<LineError>,
    /// An OpenAI Batch API line: a `custom_id` and a `body`.
    pub batch: bool,
}

/// Reads a line's bytes as far as its id: UTF-8, a JSON object, and its `id`/`custom_id`.
pub fn name(bytes: &[u8]) -> Named {
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => {
            return Named {
                id: None,
                problem: Some(LineError::NotUtf8 {
                    at: e.valid_up_to() + 1,
                }),
                batch: false,
            };
        }
    };
    if !text.trim_start().starts_with('{') {
        return Named {
            id: None,
            problem: Some(LineError::NotAnObject),
            batch: false,
        };
    }
    match serde_json::from_str::<IdFields>(text) {
        Ok(f) => {
            let batch = f.custom_id.is_some() && f.body.is_some();
            match f.id.or(f.custom_id).map(Id::from_json).transpose() {
                Ok(id) => Named {
                    id,
                    problem: None,
                    batch,
                },
                Err(why) => Named {
                    id: None,
                    problem: Some(why.into()),
                    batch,
                },
            }
        }
        Err(e) => Named {
            id: None,
            problem: Some(LineError::json(e)),
            batch: false,
        },
    }
}

/// Parses a line whose id is settled; a line that is not usable is still returned with its id
/// so that it is recorded as failed exactly once.
pub fn parse_line(number: u64, bytes: &[u8], ids: &mut Ids) -> Line {
    let named = name(bytes);
    let hash = content_hash(bytes);
    let id = ids.assign(hash, named.id);
    let parsed = match named.problem {
        Some(problem) => Err(problem),
        None => {
            let text = std::str::from_utf8(bytes).expect("checked by name()");
            serde_json::from_str::<RawLine>(text)
                .map_err(LineError::json)
                .and_then(prompt_of)
        }
    };
    Line {
        number,
        id,
        hash,
        parsed,
    }
}

fn prompt_of(raw: RawLine) -> Result<PromptLine, LineError> {
    if let Some(mut body) = raw.body {
        let api = match raw.url.as_deref() {
            Some("/v1/chat/completions") => Some(Api::Chat),
            Some("/v1/completions") => Some(Api::Completions),
            None => None,
            Some(other) => return Err(LineError::BatchUrl(other.to_string())),
        };
        // Both fields leave the body, so the request carries one: SGLang's chat reads
        // `max_completion_tokens or max_tokens` (srt/entrypoints/openai/protocol.py), and a
        // stale second field would override `--max-tokens` and the overflow clamp.
        let completion = body.remove("max_completion_tokens");
        let plain = body.remove("max_tokens");
        let (field, value) = match (completion, plain) {
            (Some(v), _) if !v.is_null() && v != 0 => ("max_completion_tokens", Some(v)),
            (_, v) => ("max_tokens", v),
        };
        let max_tokens = match value {
            None | Some(Value::Null) => None,
            Some(v) => Some(
                v.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .filter(|n| *n > 0)
                    .ok_or(LineError::MaxTokens { field, got: v })?,
            ),
        };
        let prompt = if let Some(m) = body.remove("messages") {
            messages(m, "body.messages")?
        } else if let Some(p) = body.remove("prompt") {
            text(p, "body.prompt")?
        } else {
            return Err(LineError::EmptyBody);
        };
        body.remove("stream");
        return Ok(PromptLine {
            prompt,
            max_tokens,
            api,
            extra: Some(body),
        });
    }
    let prompt = match (raw.prompt, raw.messages) {
        (Some(p), None) => text(p, "prompt")?,
        (None, Some(m)) => messages(m, "messages")?,
        (Some(_), Some(_)) => return Err(LineError::Both),
        (None, None) => return Err(LineError::Missing),
    };
    Ok(PromptLine {
        prompt,
        max_tokens: None,
        api: None,
        extra: None,
    })
}

fn text(v: Value, field: &'static str) -> Result<Prompt, LineError> {
    match v {
        Value::String(s) => Ok(Prompt::Text(s)),
        other => Err(LineError::Kind {
            field,
            want: "a string",
            got: kind(&other),
        }),
    }
}

fn messages(v: Value, field: &'static str) -> Result<Prompt, LineError> {
    match &v {
        Value::Array(a) if !a.is_empty() => Ok(Prompt::Messages(v)),
        Value::Array(_) => Err(LineError::NoMessages { field }),
        other => Err(LineError::Kind {
            field,
            want: "an array of messages",
            got: kind(other),
        }),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests;
