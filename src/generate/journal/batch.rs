//! The OpenAI Batch API's output line, as the Batch API and vLLM's `run-batch` write it: which
//! output format a job writes, and the completion and failure lines of the `openai-batch`
//! format, with the server's response body kept byte for byte.
//!
//! A line is `{"id":"batch_req_…","custom_id":…,"response":{"status_code":200,"request_id":…,
//! "body":…},"error":null,"fleet":{…}}`; a failure has `"response":null` and
//! `"error":{"code","message"}`. `fleet` is the one field fleet adds: the instance and latency,
//! what was clamped, and for a failure its input line and that line's hash (for
//! `--retry-failed`).

use serde::{Deserialize, Serialize, Serializer};
use serde_json::value::RawValue;

use super::FailureReason;
use crate::generate::input::Id;
use crate::server::ServerId;

/// What a job writes for each request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OutputFormat {
    /// fleet's own records: `{"id","output","prompt_tokens",…}`.
    #[default]
    Fleet,
    /// The OpenAI Batch API's output lines.
    OpenaiBatch,
}

impl OutputFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            OutputFormat::Fleet => "fleet",
            OutputFormat::OpenaiBatch => "openai-batch",
        }
    }
}

/// An `--output-format` fleet does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown output format `{0}` (use fleet or openai-batch)")]
pub struct UnknownFormat(pub String);

impl std::str::FromStr for OutputFormat {
    type Err = UnknownFormat;
    fn from_str(s: &str) -> Result<Self, UnknownFormat> {
        match s {
            "fleet" => Ok(OutputFormat::Fleet),
            "openai-batch" => Ok(OutputFormat::OpenaiBatch),
            other => Err(UnknownFormat(other.to_string())),
        }
    }
}

/// Every batch line starts with this, and its `custom_id` comes right after: recovery reads the
/// id without parsing the body.
pub(super) const LINE_PREFIX: &[u8] = br#"{"id":"batch_req_"#;

/// `batch_req_` and the 128-bit key of the custom id: the same request gets the same id in
/// every run, and two custom ids never share one.
struct ReqName(u128);

impl Serialize for ReqName {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&format_args!("batch_req_{:032x}", self.0))
    }
}

#[derive(Serialize)]
struct Line<'a> {
    id: ReqName,
    custom_id: &'a Id,
    response: Option<Response<'a>>,
    error: Option<LineError<'a>>,
    fleet: Fleet<'a>,
}

#[derive(Serialize)]
struct Response<'a> {
    status_code: u16,
    request_id: Option<&'a str>,
    body: &'a RawValue,
}

#[derive(Serialize)]
struct LineError<'a> {
    code: &'static str,
    message: &'a str,
}

/// The fields fleet adds, all under `fleet` so that nothing of the Batch API's shape changes.
#[derive(Serialize, Default)]
struct Fleet<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    instance: Option<&'a ServerId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    latency_s: Option<f64>,
    /// The line asked for more output tokens than fit beside its prompt: the answer is the
    /// clamped request's.
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens_clamped: Option<Clamped>,
    #[serde(skip_serializing_if = "Option::is_none")]
    line: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    line_hash: Option<String>,
}

#[derive(Serialize)]
struct Clamped {
    from: u32,
    to: u32,
}

/// A 200 answer, as a batch line.
pub struct Answer<'a> {
    pub custom_id: &'a Id,
    /// The server's response as it came (a chat or completions body).
    pub body: &'a [u8],
    pub request_id: Option<&'a str>,
    pub instance: &'a ServerId,
    pub latency_s: f64,
    /// `max_tokens` as the line asked, and as it was sent.
    pub max_tokens: (u32, u32),
}

/// The batch line of a 200 answer. The body is the server's bytes, with only whitespace
/// between tokens taken out (a pretty-printed body would break the JSON-lines file); a body that
/// is not JSON is written as `null` (the client has parsed it as a completion already, so that
/// is only an HTTP stand-in's answer).
pub fn encode_answer(a: &Answer<'_>) -> Vec<u8> {
    let compact = compact_json(a.body);
    let null = RawValue::NULL;
    let body: &RawValue = std::str::from_utf8(&compact)
        .ok()
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or(null);
    let (from, to) = a.max_tokens;
    super::encode(&Line {
        id: ReqName(a.custom_id.key()),
        custom_id: a.custom_id,
        response: Some(Response {
            status_code: 200,
            request_id: a.request_id,
            body,
        }),
        error: None,
        fleet: Fleet {
            instance: Some(a.instance),
            latency_s: Some(a.latency_s),
            max_tokens_clamped: (to < from).then_some(Clamped { from, to }),
            ..Fleet::default()
        },
    })
}

/// The batch line of a request that failed: `code` is fleet's failure class, `message` the
/// server's text where the server gave one. `line_hash` goes with failures for good only, so
/// `--retry-failed` can tell an edited line.
pub fn encode_failure(
    custom_id: &Id,
    line: u64,
    reason: FailureReason,
    message: &str,
    line_hash: Option<String>,
) -> Vec<u8> {
    super::encode(&Line {
        id: ReqName(custom_id.key()),
        custom_id,
        response: None,
        error: Some(LineError {
            code: reason.as_str(),
            message,
        }),
        fleet: Fleet {
            line: Some(line),
            line_hash,
            ..Fleet::default()
        },
    })
}

/// `json` without the whitespace between its tokens; strings are copied as they are.
fn compact_json(json: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    let json = json.trim_ascii();
    if !json.iter().any(|b| matches!(b, b'\n' | b'\r')) {
        return json.into();
    }
    let mut out = Vec::with_capacity(json.len());
    let (mut in_string, mut escaped) = (false, false);
    for &b in json {
        if in_string {
            out.push(b);
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
        } else if !b.is_ascii_whitespace() {
            in_string = b == b'"';
            out.push(b);
        }
    }
    out.into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn id(s: &str) -> Id {
        Id {
            text: s.into(),
            numeric: false,
        }
    }

    #[test]
    fn an_answer_keeps_the_body_whole_and_says_what_was_clamped() {
        let body = br#"{"id":"abc","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"a \"b\"\n c"},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5},"system_fingerprint":"fp"}"#;
        let line = encode_answer(&Answer {
            custom_id: &id("r-1"),
            body,
            request_id: Some("abc"),
            instance: &ServerId::named("a"),
            latency_s: 0.25,
            max_tokens: (4096, 55),
        });
        let text = std::str::from_utf8(&line).unwrap();
        assert!(text.ends_with("}\n") && !text[..text.len() - 1].contains('\n'));
        assert!(line.starts_with(LINE_PREFIX), "{text}");
        assert!(
            text.contains(std::str::from_utf8(body).unwrap()),
            "the body byte for byte: {text}"
        );
        let v: Value = serde_json::from_str(text).unwrap();
        assert_eq!(v["custom_id"], "r-1");
        assert_eq!(v["response"]["status_code"], 200);
        assert_eq!(v["response"]["request_id"], "abc");
        assert_eq!(v["error"], Value::Null);
        assert_eq!(
            v["fleet"],
            json!({"instance": "a", "latency_s": 0.25, "max_tokens_clamped": {"from": 4096, "to": 55}})
        );
        let id2 = encode_answer(&Answer {
            custom_id: &id("r-1"),
            body,
            request_id: None,
            instance: &ServerId::named("b"),
            latency_s: 1.0,
            max_tokens: (10, 10),
        });
        let v2: Value = serde_json::from_slice(&id2).unwrap();
        assert_eq!(v2["id"], v["id"], "the same request, the same id");
        assert!(v2["fleet"].get("max_tokens_clamped").is_none());
    }

    #[test]
    fn a_pretty_printed_body_becomes_one_line_with_its_strings_untouched() {
        let body = b"{\n  \"choices\": [ {\"text\": \"x  y\\n\\\"z \"} ],\r\n  \"n\": 1\n}\n";
        assert_eq!(
            &*compact_json(body),
            &b"{\"choices\":[{\"text\":\"x  y\\n\\\"z \"}],\"n\":1}"[..]
        );
        let line = encode_answer(&Answer {
            custom_id: &Id::line(7),
            body,
            request_id: None,
            instance: &ServerId::named("a"),
            latency_s: 0.0,
            max_tokens: (1, 1),
        });
        let v: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(v["custom_id"], 7);
        assert_eq!(v["response"]["body"]["choices"][0]["text"], "x  y\n\"z ");
    }

    #[test]
    fn a_failure_has_no_response_and_an_error_with_the_message() {
        let line = encode_failure(
            &id("long"),
            3,
            FailureReason::PromptTooLong,
            "The input (300 tokens) is longer than the model's context length (256 tokens).",
            Some("00000000000000ff".into()),
        );
        let v: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(v["response"], Value::Null);
        assert_eq!(v["error"]["code"], "prompt_too_long");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("300 tokens")
        );
        assert_eq!(
            v["fleet"],
            json!({"line": 3, "line_hash": "00000000000000ff"})
        );
    }
}
