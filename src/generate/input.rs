//! The prompt file: streaming JSONL reader, line parsing (plain, chat and OpenAI Batch API
//! lines), and the duplicate-id pre-pass that keeps only hashes of ids in memory.

use std::collections::HashSet;
use std::fs::File;
use std::hash::{DefaultHasher, Hasher};
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize, Serializer};
use serde_json::{Map, Value};

use crate::sglang::client::{Api, Prompt};

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
}

/// A prompt's id as given (string or number) or, when missing, its 1-based line number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Id {
    pub text: String,
    pub numeric: bool,
}

impl Id {
    pub fn line(number: u64) -> Self {
        Id {
            text: number.to_string(),
            numeric: true,
        }
    }

    /// The key that `--resume` and the duplicate check compare: 128 bits of two SipHashes, so
    /// 654,676 ids take ~16 bytes each and a false match is astronomically unlikely.
    pub fn key(&self) -> u128 {
        key_of(&self.text)
    }
}

pub fn key_of(text: &str) -> u128 {
    let mut a = DefaultHasher::new();
    a.write(text.as_bytes());
    let mut b = DefaultHasher::new();
    b.write_u8(0x5a);
    b.write(text.as_bytes());
    ((a.finish() as u128) << 64) | b.finish() as u128
}

impl Serialize for Id {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.text.parse::<u64>() {
            Ok(n) if self.numeric => s.serialize_u64(n),
            _ => s.serialize_str(&self.text),
        }
    }
}

/// An id field as found in JSON: a string or a number.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum RawId {
    Str(String),
    Num(serde_json::Number),
}

impl RawId {
    pub fn into_id(self) -> Id {
        match self {
            RawId::Str(text) => Id {
                text,
                numeric: false,
            },
            RawId::Num(n) => Id {
                text: n.to_string(),
                numeric: true,
            },
        }
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
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    /// 1-based line number in the file.
    pub number: u64,
    pub id: Id,
    /// The prompt, or why the line is malformed.
    pub parsed: Result<PromptLine, String>,
}

#[derive(Deserialize)]
struct RawLine {
    id: Option<RawId>,
    custom_id: Option<RawId>,
    prompt: Option<Value>,
    messages: Option<Value>,
    url: Option<String>,
    body: Option<Map<String, Value>>,
}

/// Parses one line; a line that is not usable is still returned with its id so that it is
/// recorded as failed exactly once.
pub fn parse_line(number: u64, text: &str) -> Line {
    let mut raw: RawLine = match serde_json::from_str(text) {
        Ok(r) => r,
        Err(e) => {
            return Line {
                number,
                id: Id::line(number),
                parsed: Err(format!("not a JSON object: {e}")),
            };
        }
    };
    let id = raw
        .id
        .take()
        .or(raw.custom_id.take())
        .map(RawId::into_id)
        .unwrap_or_else(|| Id::line(number));
    let parsed = prompt_of(raw);
    Line { number, id, parsed }
}

fn prompt_of(raw: RawLine) -> Result<PromptLine, String> {
    if let Some(mut body) = raw.body {
        let api = match raw.url.as_deref() {
            Some("/v1/chat/completions") => Some(Api::Chat),
            Some("/v1/completions") => Some(Api::Completions),
            None => None,
            Some(other) => {
                return Err(format!(
                    "Batch API url {other:?} is not supported (use /v1/chat/completions or /v1/completions)"
                ));
            }
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
                    .ok_or_else(|| format!("body.{field} must be a positive integer, got {v}"))?,
            ),
        };
        let prompt = if let Some(m) = body.remove("messages") {
            messages(m, "body.messages")?
        } else if let Some(p) = body.remove("prompt") {
            text(p, "body.prompt")?
        } else {
            return Err("Batch API body has neither `messages` nor `prompt`".into());
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
        (Some(_), Some(_)) => return Err("has both `prompt` and `messages`; keep one".into()),
        (None, None) => {
            return Err("missing `prompt` (or `messages`, or a Batch API `body`)".into());
        }
    };
    Ok(PromptLine {
        prompt,
        max_tokens: None,
        api: None,
        extra: None,
    })
}

fn text(v: Value, field: &str) -> Result<Prompt, String> {
    match v {
        Value::String(s) => Ok(Prompt::Text(s)),
        other => Err(format!("`{field}` must be a string, got {}", kind(&other))),
    }
}

fn messages(v: Value, field: &str) -> Result<Prompt, String> {
    match &v {
        Value::Array(a) if !a.is_empty() => Ok(Prompt::Messages(v)),
        Value::Array(_) => Err(format!("`{field}` is empty")),
        other => Err(format!(
            "`{field}` must be an array of messages, got {}",
            kind(other)
        )),
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

/// Streams the non-blank lines of the prompt file, at most `limit` of them.
pub struct Reader {
    path: PathBuf,
    inner: BufReader<File>,
    buf: String,
    pos: Position,
    limit: Option<u64>,
}

/// Where a [`Reader`] stands: a resumed run starts at its first pending line instead of
/// re-reading everything that is done.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Position {
    /// Byte offset of the next line.
    pub offset: u64,
    /// Lines read so far (the next line is `line + 1`).
    pub line: u64,
    /// Non-blank lines read so far (what `--limit` counts).
    pub yielded: u64,
}

impl Reader {
    pub fn open(path: &Path, limit: Option<u64>) -> Result<Self, InputError> {
        Self::open_at(path, limit, Position::default())
    }

    pub fn open_at(path: &Path, limit: Option<u64>, pos: Position) -> Result<Self, InputError> {
        let err = |source| InputError::Io {
            path: path.into(),
            source,
        };
        let mut file = File::open(path).map_err(err)?;
        file.seek(SeekFrom::Start(pos.offset)).map_err(err)?;
        Ok(Reader {
            path: path.into(),
            inner: BufReader::with_capacity(256 * 1024, file),
            buf: String::new(),
            pos,
            limit,
        })
    }

    pub fn position(&self) -> Position {
        self.pos
    }

    /// The next non-blank line's number and text (borrowed until the next call).
    pub fn next_raw(&mut self) -> Result<Option<(u64, &str)>, InputError> {
        if self.limit.is_some_and(|l| self.pos.yielded >= l) {
            return Ok(None);
        }
        loop {
            self.buf.clear();
            let n = self
                .inner
                .read_line(&mut self.buf)
                .map_err(|source| InputError::Io {
                    path: self.path.clone(),
                    source,
                })?;
            if n == 0 {
                return Ok(None);
            }
            self.pos.offset += n as u64;
            self.pos.line += 1;
            if !self.buf.trim().is_empty() {
                self.pos.yielded += 1;
                return Ok(Some((self.pos.line, self.buf.trim_end())));
            }
        }
    }

    pub fn next_line(&mut self) -> Result<Option<Line>, InputError> {
        Ok(self.next_raw()?.map(|(n, t)| parse_line(n, t)))
    }
}

/// Unknown fields (the prompt text) are skipped by serde without being buffered.
#[derive(Deserialize)]
struct IdOnly {
    id: Option<RawId>,
    custom_id: Option<RawId>,
}

fn id_of(number: u64, text: &str) -> Id {
    serde_json::from_str::<IdOnly>(text)
        .ok()
        .and_then(|r| r.id.or(r.custom_id))
        .map(RawId::into_id)
        .unwrap_or_else(|| Id::line(number))
}

/// What the pre-pass over the prompt file found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdScan {
    /// Prompt lines (non-blank, up to `--limit`).
    pub total: u64,
    /// Where the first line not in `done` starts; `None` when every line is done.
    pub first_pending: Option<Position>,
}

/// Reads every id once and fails on the first duplicate, keeping only 64-bit hashes in memory.
/// Hash collisions are confirmed by a second pass over just the colliding hashes, so two
/// distinct ids never report a false duplicate. Also finds where work not in `done` begins.
pub fn check_ids(
    path: &Path,
    limit: Option<u64>,
    done: &HashSet<u128>,
) -> Result<IdScan, InputError> {
    // The upper half of the 128-bit key is one SipHash of the id: the duplicate check reuses it.
    let hash64 = |key: u128| (key >> 64) as u64;
    let mut seen: HashSet<u64> = HashSet::new();
    let mut suspects: HashSet<u64> = HashSet::new();
    let mut reader = Reader::open(path, limit)?;
    let mut total = 0;
    let mut first_pending = None;
    loop {
        let before = reader.position();
        let Some((n, t)) = reader.next_raw()? else {
            break;
        };
        total += 1;
        let key = id_of(n, t).key();
        if first_pending.is_none() && !done.contains(&key) {
            first_pending = Some(before);
        }
        if !seen.insert(hash64(key)) {
            suspects.insert(hash64(key));
        }
    }
    drop(seen);
    let scan = IdScan {
        total,
        first_pending,
    };
    if suspects.is_empty() {
        return Ok(scan);
    }
    let mut first: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
    let mut reader = Reader::open(path, limit)?;
    while let Some((n, t)) = reader.next_raw()? {
        let id = id_of(n, t);
        if !suspects.contains(&hash64(id.key())) {
            continue;
        }
        if let Some(&first_line) = first.get(&id.text) {
            return Err(InputError::Duplicate {
                path: path.into(),
                id: id.text,
                first_line,
                line: n,
            });
        }
        first.insert(id.text, n);
    }
    Ok(scan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::io::Write;

    #[test]
    fn plain_chat_and_batch_lines() {
        let l = parse_line(1, r#"{"id":"a","prompt":"hi"}"#);
        assert_eq!(
            l.id,
            Id {
                text: "a".into(),
                numeric: false
            }
        );
        assert_eq!(l.parsed.unwrap().prompt, Prompt::Text("hi".into()));

        let l = parse_line(2, r#"{"id":7,"messages":[{"role":"user","content":"x"}]}"#);
        assert_eq!(
            l.id,
            Id {
                text: "7".into(),
                numeric: true
            }
        );
        assert!(matches!(l.parsed.unwrap().prompt, Prompt::Messages(_)));

        let l = parse_line(
            3,
            r#"{"custom_id":"req-1","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":100,"seed":1}}"#,
        );
        assert_eq!(l.id.text, "req-1");
        let p = l.parsed.unwrap();
        assert_eq!(p.max_tokens, Some(100));
        assert_eq!(p.api, Some(Api::Chat));
        let extra = p.extra.unwrap();
        assert_eq!(extra.get("model"), Some(&json!("m")));
        assert_eq!(extra.get("seed"), Some(&json!(1)));
        assert!(!extra.contains_key("messages"));
    }

    #[test]
    fn a_batch_body_with_both_token_fields_keeps_the_one_chat_reads() {
        let both = |body: &str| {
            let line = format!(r#"{{"custom_id":"b","url":"/v1/chat/completions","body":{body}}}"#);
            parse_line(1, &line).parsed
        };
        let p = both(r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":100,"max_completion_tokens":300}"#).unwrap();
        assert_eq!(p.max_tokens, Some(300));
        let extra = p.extra.unwrap();
        assert!(!extra.contains_key("max_tokens") && !extra.contains_key("max_completion_tokens"));
        let p = both(r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":100,"max_completion_tokens":null}"#).unwrap();
        assert_eq!(p.max_tokens, Some(100));
        assert_eq!(
            both(r#"{"messages":[{"role":"user","content":"x"}],"max_completion_tokens":-1}"#)
                .unwrap_err(),
            "body.max_completion_tokens must be a positive integer, got -1"
        );
    }

    #[test]
    fn missing_id_is_the_line_number_and_bad_lines_say_why() {
        let l = parse_line(12, r#"{"prompt":"hi"}"#);
        assert_eq!(l.id, Id::line(12));
        let l = parse_line(13, r#"{"id":"x","prompt":"unterminated"#);
        assert_eq!(l.id, Id::line(13));
        assert!(l.parsed.unwrap_err().contains("not a JSON object"));
        let l = parse_line(14, r#"{"id":"y","prompt":5}"#);
        assert_eq!(l.id.text, "y");
        assert_eq!(
            l.parsed.unwrap_err(),
            "`prompt` must be a string, got a number"
        );
        let l = parse_line(15, r#"{"id":"z"}"#);
        assert!(l.parsed.unwrap_err().contains("missing `prompt`"));
    }

    #[test]
    fn ids_serialize_as_given() {
        assert_eq!(serde_json::to_value(Id::line(3)).unwrap(), json!(3));
        assert_eq!(
            serde_json::to_value(Id {
                text: "3".into(),
                numeric: false
            })
            .unwrap(),
            json!("3")
        );
    }

    fn file(lines: &[&str]) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        for l in lines {
            writeln!(f, "{l}").unwrap();
        }
        f
    }

    #[test]
    fn duplicate_ids_are_found_with_both_lines() {
        let f = file(&[
            r#"{"id":"a","prompt":"1"}"#,
            "",
            r#"{"id":"b","prompt":"2"}"#,
            r#"{"id":"a","prompt":"3"}"#,
        ]);
        match check_ids(f.path(), None, &HashSet::new()) {
            Err(InputError::Duplicate {
                id,
                first_line,
                line,
                ..
            }) => {
                assert_eq!((id.as_str(), first_line, line), ("a", 1, 4));
            }
            other => panic!("expected a duplicate, got {other:?}"),
        }
        assert_eq!(
            check_ids(f.path(), Some(2), &HashSet::new()).unwrap().total,
            2
        );
    }

    #[test]
    fn the_scan_finds_where_pending_work_starts_and_the_reader_resumes_there() {
        let f = file(&[
            r#"{"id":"a","prompt":"1"}"#,
            "",
            r#"{"id":"b","prompt":"2"}"#,
            r#"{"id":"c","prompt":"3"}"#,
        ]);
        let done: HashSet<u128> = [key_of("a"), key_of("c")].into();
        let scan = check_ids(f.path(), Some(3), &done).unwrap();
        assert_eq!(scan.total, 3);
        let at = scan.first_pending.unwrap();
        assert_eq!((at.line, at.yielded), (1, 1));
        let mut r = Reader::open_at(f.path(), Some(3), at).unwrap();
        let l = r.next_line().unwrap().unwrap();
        assert_eq!((l.number, l.id.text.as_str()), (3, "b"));
        assert_eq!(r.next_line().unwrap().unwrap().id.text, "c");
        assert!(
            r.next_line().unwrap().is_none(),
            "the limit still counts from the top"
        );
        let all: HashSet<u128> = ["a", "b", "c"].map(key_of).into();
        assert_eq!(check_ids(f.path(), None, &all).unwrap().first_pending, None);
    }

    #[test]
    fn reader_skips_blank_lines_and_honours_limit() {
        let f = file(&[
            r#"{"prompt":"1"}"#,
            "   ",
            r#"{"prompt":"2"}"#,
            r#"{"prompt":"3"}"#,
        ]);
        let mut r = Reader::open(f.path(), Some(2)).unwrap();
        assert_eq!(r.next_line().unwrap().unwrap().number, 1);
        assert_eq!(r.next_line().unwrap().unwrap().number, 3);
        assert!(r.next_line().unwrap().is_none());
    }
}
