//! The HTTP client for one SGLang server: health, server info, metrics and generation requests
//! on `/generate`, `/v1/chat/completions` and `/v1/completions`, with typed errors that say
//! whether a request may be retried and parse SGLang's context-overflow 400s.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde_json::{Map, Value, json};

use super::metrics::{self, Metrics};
use super::overflow::{Overflow, parse_overflow};
pub use super::response::{BodyError, parse_completion};
use super::wire::{Answer, Wire};
use crate::server::ServerId;

/// One server fleet can send requests to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Endpoint {
    /// The server behind it, as progress and output name it: `ct200:gpu5`, or the URL's
    /// `host:port`.
    #[serde(rename = "name")]
    pub id: ServerId,
    /// e.g. `http://127.0.0.1:30000` (no trailing path).
    pub base_url: String,
    /// Sent as `Authorization: Bearer ...` on every request.
    #[serde(skip)]
    pub api_key: Option<String>,
}

impl Endpoint {
    /// An endpoint named after its URL's authority (`host:port`).
    pub fn from_url(url: &str) -> Self {
        let base_url = url.trim_end_matches('/').to_string();
        let name = base_url.split("://").nth(1).unwrap_or(&base_url);
        Endpoint {
            id: ServerId::named(name),
            base_url,
            api_key: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot build the HTTP client: {0}")]
    Build(#[source] reqwest::Error),
    #[error("{url}: cannot connect: {reason}")]
    Connect { url: String, reason: String },
    #[error("{url}: timed out")]
    Timeout { url: String },
    #[error("{url}: connection failed: {reason}")]
    Transport { url: String, reason: String },
    #[error("{url}: HTTP {status}: {body}")]
    Status {
        url: String,
        status: u16,
        body: String,
    },
    #[error("{url}: does not fit: {overflow}")]
    ContextOverflow {
        url: String,
        overflow: Overflow,
        /// The server's own words (its 400's `message`).
        message: String,
    },
    #[error("{url}: unexpected response: {reason}")]
    Decode { url: String, reason: String },
    /// fleet itself ran out of file descriptors (EMFILE/ENFILE) opening the connection: no
    /// fault of the server, which must not be taken out for it.
    #[error("{url}: fleet has too many open files: {reason}")]
    OutOfFiles { url: String, reason: String },
    /// Ended as an abort with no status (SGLang's `/abort_request`, a session's clean-up): not
    /// the prompt's fault.
    #[error("{url}: the server aborted the request: {message}")]
    Aborted { url: String, message: String },
}

impl ClientError {
    /// Connect/reset errors, timeouts, 5xx and 429 may succeed elsewhere or later.
    pub fn is_retryable(&self) -> bool {
        match self {
            ClientError::Connect { .. }
            | ClientError::Timeout { .. }
            | ClientError::Transport { .. }
            | ClientError::OutOfFiles { .. }
            | ClientError::Aborted { .. } => true,
            ClientError::Status { status, .. } => *status >= 500 || *status == 429,
            ClientError::Build(_)
            | ClientError::ContextOverflow { .. }
            | ClientError::Decode { .. } => false,
        }
    }

    /// What the server said, for an answer that was not a 200: the `message` of its JSON error
    /// body, or the body itself. `None` when no server answered.
    pub fn server_message(&self) -> Option<String> {
        match self {
            ClientError::ContextOverflow { message, .. } => Some(message.clone()),
            ClientError::Status { body, .. } => Some(server_text(body)),
            _ => None,
        }
    }

    /// fleet's own open-file limit, not the server, failed the request.
    pub fn is_local(&self) -> bool {
        matches!(self, ClientError::OutOfFiles { .. })
    }

    /// The server could not be reached at all (as opposed to answering badly).
    pub fn is_unreachable(&self) -> bool {
        matches!(
            self,
            ClientError::Connect { .. } | ClientError::Transport { .. }
        )
    }

    pub(crate) fn from_reqwest(url: &str, e: reqwest::Error) -> Self {
        let url = url.to_string();
        if e.is_timeout() {
            return ClientError::Timeout { url };
        }
        // reqwest's own message repeats the URL; the innermost cause says what happened
        // ("Connection refused", "connection closed before message completed").
        let mut reason = e.to_string();
        let mut out_of_files = false;
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            reason = s.to_string();
            out_of_files |= s
                .downcast_ref::<std::io::Error>()
                .and_then(std::io::Error::raw_os_error)
                .is_some_and(|code| code == libc::EMFILE || code == libc::ENFILE);
            source = s.source();
        }
        if out_of_files {
            return ClientError::OutOfFiles { url, reason };
        }
        if e.is_connect() {
            ClientError::Connect { url, reason }
        } else {
            ClientError::Transport { url, reason }
        }
    }
}

/// Which SGLang generation API a request uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Api {
    /// Native `POST /generate` (`text` prompts only).
    Generate,
    /// OpenAI-compatible `POST /v1/chat/completions`.
    Chat,
    /// OpenAI-compatible `POST /v1/completions`.
    Completions,
}

impl Api {
    pub fn path(self) -> &'static str {
        match self {
            Api::Generate => "/generate",
            Api::Chat => "/v1/chat/completions",
            Api::Completions => "/v1/completions",
        }
    }
}

/// An `--endpoint` fleet does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown endpoint `{0}` (use generate, chat or completions)")]
pub struct UnknownApi(pub String);

impl std::str::FromStr for Api {
    type Err = UnknownApi;
    fn from_str(s: &str) -> Result<Self, UnknownApi> {
        match s {
            "generate" => Ok(Api::Generate),
            "chat" => Ok(Api::Chat),
            "completions" => Ok(Api::Completions),
            other => Err(UnknownApi(other.to_string())),
        }
    }
}

/// What is being completed.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    Text(String),
    /// An OpenAI `messages` array, passed through as given.
    Messages(Value),
}

/// One generation request, independent of the server it goes to.
#[derive(Debug, Clone, PartialEq)]
pub struct CompletionRequest {
    pub api: Api,
    pub prompt: Prompt,
    pub max_tokens: u32,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// `model` for the OpenAI APIs (SGLang serves one model, so any name it knows works).
    pub model: Option<String>,
    /// Other fields of an OpenAI Batch API `body`, passed through untouched.
    pub extra: Option<Map<String, Value>>,
}

impl CompletionRequest {
    /// The JSON body for [`Self::api`]; `None` when the prompt kind does not fit the API
    /// (`messages` cannot go to `/generate` or `/v1/completions`).
    pub fn body(&self) -> Option<Value> {
        match self.api {
            Api::Generate => {
                let Prompt::Text(text) = &self.prompt else {
                    return None;
                };
                let mut sp = Map::new();
                sp.insert("max_new_tokens".into(), json!(self.max_tokens));
                if let Some(t) = self.temperature {
                    sp.insert("temperature".into(), json!(t));
                }
                if let Some(p) = self.top_p {
                    sp.insert("top_p".into(), json!(p));
                }
                Some(json!({ "text": text, "sampling_params": sp }))
            }
            Api::Chat | Api::Completions => {
                let mut body = self.extra.clone().unwrap_or_default();
                match (&self.prompt, self.api) {
                    (Prompt::Messages(m), Api::Chat) => body.insert("messages".into(), m.clone()),
                    (Prompt::Text(t), Api::Chat) => {
                        body.insert("messages".into(), json!([{ "role": "user", "content": t }]))
                    }
                    (Prompt::Text(t), Api::Completions) => body.insert("prompt".into(), json!(t)),
                    _ => return None,
                };
                body.insert("max_tokens".into(), json!(self.max_tokens));
                if let Some(t) = self.temperature {
                    body.insert("temperature".into(), json!(t));
                }
                if let Some(p) = self.top_p {
                    body.insert("top_p".into(), json!(p));
                }
                if let Some(m) = &self.model {
                    body.entry("model").or_insert_with(|| json!(m));
                }
                body.insert("stream".into(), json!(false));
                Some(Value::Object(body))
            }
        }
    }
}

/// A finished generation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Completion {
    pub text: String,
    /// The thought of a reasoning model, which chat returns apart from the answer when the
    /// server runs a `--reasoning-parser` (`message.reasoning_content`,
    /// srt/entrypoints/openai/serving_chat.py); the answer may then be empty or null.
    pub reasoning: Option<String>,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub finish_reason: Option<String>,
    /// The response body as the server sent it, for output that keeps it whole (the Batch
    /// API's): shared with the HTTP buffer, not copied.
    #[serde(skip)]
    pub body: Option<bytes::Bytes>,
    /// The OpenAI body's `id`.
    #[serde(skip)]
    pub response_id: Option<String>,
    /// Prompt tokens the radix cache served: `meta_info.cached_tokens` on `/generate`,
    /// `usage.prompt_tokens_details.cached_tokens` on the OpenAI APIs (only with
    /// `--enable-cache-report`, srt/entrypoints/openai/usage_processor.py); `None` when unsaid.
    pub cached_tokens: Option<u64>,
}

/// What `/server_info` says about capacity.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerInfo {
    pub version: Option<String>,
    pub max_total_num_tokens: Option<u64>,
    /// The real request cap: `effective_max_running_requests_per_dp` summed over
    /// `internal_states`, which has one entry per DP rank (a server with `--dp-size 4` admits
    /// four times its per-rank cap).
    pub effective_max_running_requests: Option<u64>,
    /// The CLI value of `--max-running-requests` (often null).
    pub max_running_requests: Option<u64>,
    pub context_length: Option<u64>,
    pub served_model_name: Option<String>,
    pub model_path: Option<String>,
    /// The mamba strategy the server resolved (`auto` is never reported: 0.5.23 turns it into
    /// extra_buffer while overlap is on), from the server args it echoes.
    pub mamba_strategy: Option<String>,
    /// The whole document, for fields fleet does not type (e.g. the simulator's `sim` block).
    pub raw: Value,
}

impl ServerInfo {
    pub fn from_json(raw: Value) -> Self {
        let u = |v: Option<&Value>| v.and_then(Value::as_u64);
        let s = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
        let state0 = raw.get("internal_states").and_then(|v| v.get(0));
        ServerInfo {
            version: s(raw.get("version")),
            max_total_num_tokens: u(raw.get("max_total_num_tokens"))
                .or_else(|| u(state0.and_then(|st| st.get("max_total_num_tokens")))),
            effective_max_running_requests: dp_sum(&raw, "effective_max_running_requests_per_dp"),
            max_running_requests: u(raw.get("max_running_requests")),
            context_length: u(raw.get("context_length"))
                .or_else(|| u(state0.and_then(|st| st.get("context_len"))))
                .or_else(|| u(raw.get("context_len"))),
            served_model_name: s(raw.get("served_model_name")),
            model_path: s(raw.get("model_path")),
            // A dense model keeps the strategy's `auto` unresolved and says it uses no mamba
            // cache (0.5.23 `uses_mamba_radix_cache`): no strategy to show.
            mamba_strategy: if raw.get("uses_mamba_radix_cache") == Some(&Value::Bool(false)) {
                None
            } else {
                s(raw.get("mamba_radix_cache_strategy"))
                    .or_else(|| s(raw.get("mamba_scheduler_strategy")))
            },
            raw,
        }
    }
}

/// `key` summed over `internal_states` (one entry per DP rank); `None` when no rank says it.
fn dp_sum(raw: &Value, key: &str) -> Option<u64> {
    raw.get("internal_states")?
        .as_array()?
        .iter()
        .filter_map(|st| st.get(key).and_then(Value::as_u64))
        .reduce(|a, b| a + b)
}

/// What `/health` said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    Ready,
    /// Answered, but not ready yet (SGLang says 503 while loading).
    NotReady {
        status: u16,
    },
}

/// Timeouts for [`http_client`].
#[derive(Debug, Clone, Copy)]
pub struct HttpOptions {
    pub connect_timeout: Duration,
    /// Whole-request limit for generation; long completions take minutes.
    pub request_timeout: Duration,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(1800),
        }
    }
}

/// Idle connections are dropped before uvicorn's 5 s keep-alive closes them (srt/environ.py),
/// so a request is never sent on a connection the server is about to close.
pub(super) const POOL_IDLE: Duration = Duration::from_secs(4);

/// One pooled HTTP client to share across every server and task: hundreds of requests stay in
/// flight per server, so idle connections are kept rather than reopened.
pub fn http_client(opts: HttpOptions) -> Result<reqwest::Client, ClientError> {
    install_tls_provider();
    reqwest::Client::builder()
        .pool_max_idle_per_host(2048)
        .pool_idle_timeout(POOL_IDLE)
        .tcp_nodelay(true)
        .connect_timeout(opts.connect_timeout)
        .timeout(opts.request_timeout)
        // Servers speak plain HTTP. TLS is compiled in for `--upload`'s S3 client, and by
        // default it would load the system's CA roots here and fail on hosts that have none.
        .tls_certs_only([])
        .build()
        .map_err(ClientError::Build)
}

/// reqwest's rustls is built without a crypto provider (aws-lc would cost the first build a
/// long C compile), so ring is installed as the process default before any client is built.
/// Idempotent: a second install is refused by rustls and changes nothing.
pub fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The client for one server. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SglangClient {
    http: reqwest::Client,
    endpoint: Endpoint,
    /// fleet's own connections for generation requests ([`SglangClient::with_own_connections`]).
    wire: Option<Arc<Wire>>,
}

/// Probes (info, metrics) must answer fast even when generation is slow.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// SGLang's `/health` runs a 1-token generation and waits up to 20 s for the scheduler
/// (srt/entrypoints/http_server.py, HEALTH_CHECK_TIMEOUT): a shorter limit would call a busy but
/// healthy server dead.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(25);

impl SglangClient {
    pub fn new(http: reqwest::Client, endpoint: Endpoint) -> Self {
        SglangClient {
            http,
            endpoint,
            wire: None,
        }
    }

    /// Sends generation requests over fleet's own HTTP/1.1 connections (`sglang::wire`) with
    /// `opts`' timeouts, where the server is reached by plain HTTP without a proxy; elsewhere
    /// they stay on reqwest. For the hot path of a job: several times less CPU per request.
    pub fn with_own_connections(mut self, opts: HttpOptions) -> Self {
        self.wire = Wire::new(&self.endpoint, opts).map(Arc::new);
        self
    }

    /// Whether generation requests go over fleet's own connections.
    pub fn own_connections(&self) -> bool {
        self.wire.is_some()
    }

    /// POSTs a generation `body` to `path`: the URL (for errors) and the answer, its head read.
    pub(super) async fn post_json(
        &self,
        path: &str,
        body: &Value,
    ) -> Result<(String, Answer<'_>), ClientError> {
        let url = format!("{}{}", self.endpoint.base_url, path);
        if let Some(w) = &self.wire {
            let bytes = serde_json::to_vec(body).expect("a JSON value always serializes");
            return match w.post(path, &bytes).await {
                Ok(r) => Ok((url, Answer::Wire(r))),
                Err(e) => Err(e.into_client(&url)),
            };
        }
        let (_, rb) = self.request(reqwest::Method::POST, path);
        match rb.json(body).send().await {
            Ok(r) => Ok((url, Answer::Reqwest(r))),
            Err(e) => Err(ClientError::from_reqwest(&url, e)),
        }
    }

    /// Runs a generation request, `f`, within the request timeout: on the wire it is applied
    /// here, as reqwest's client applies it to its own requests (from connecting to the body's
    /// end).
    pub(super) async fn timed<T>(
        &self,
        path: &str,
        f: impl Future<Output = Result<T, ClientError>>,
    ) -> Result<T, ClientError> {
        match &self.wire {
            Some(w) => tokio::time::timeout(w.request_timeout(), f)
                .await
                .unwrap_or_else(|_| {
                    Err(ClientError::Timeout {
                        url: format!("{}{}", self.endpoint.base_url, path),
                    })
                }),
            None => f.await,
        }
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The URL and request for `path` on this server, with its API key: the one place both are
    /// built, for plain and streamed requests and probes alike.
    pub(super) fn request(
        &self,
        method: reqwest::Method,
        path: &str,
    ) -> (String, reqwest::RequestBuilder) {
        let url = format!("{}{}", self.endpoint.base_url, path);
        let mut rb = self.http.request(method, &url);
        if let Some(key) = &self.endpoint.api_key {
            rb = rb.bearer_auth(key);
        }
        (url, rb)
    }

    async fn get_text(&self, path: &str) -> Result<(u16, String), ClientError> {
        let (url, rb) = self.request(reqwest::Method::GET, path);
        let timeout = if path == "/health" {
            HEALTH_TIMEOUT
        } else {
            PROBE_TIMEOUT
        };
        let resp = rb
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| ClientError::from_reqwest(&url, e))?;
        let status = resp.status().as_u16();
        let body = resp
            .text()
            .await
            .map_err(|e| ClientError::from_reqwest(&url, e))?;
        Ok((status, body))
    }

    pub async fn health(&self) -> Result<Health, ClientError> {
        let (status, _) = self.get_text("/health").await?;
        Ok(if status == 200 {
            Health::Ready
        } else {
            Health::NotReady { status }
        })
    }

    /// `/server_info`, falling back to the older `/get_server_info`.
    pub async fn server_info(&self) -> Result<ServerInfo, ClientError> {
        let mut last = None;
        for path in ["/server_info", "/get_server_info"] {
            let (status, body) = self.get_text(path).await?;
            let url = format!("{}{}", self.endpoint.base_url, path);
            if status == 404 {
                last = Some(ClientError::Status {
                    url,
                    status,
                    body: snippet(&body),
                });
                continue;
            }
            if status != 200 {
                return Err(ClientError::Status {
                    url,
                    status,
                    body: snippet(&body),
                });
            }
            let raw: Value = serde_json::from_str(&body).map_err(|e| ClientError::Decode {
                url,
                reason: e.to_string(),
            })?;
            let mut info = ServerInfo::from_json(raw);
            // `context_length` there is only the CLI value; the effective one is in /v1/models.
            if let Some(effective) = self.max_model_len().await.ok().flatten() {
                info.context_length = Some(effective);
            }
            return Ok(info);
        }
        Err(last.expect("at least one path was tried"))
    }

    /// `max_model_len` of the first model in `/v1/models`: the context length in effect.
    pub async fn max_model_len(&self) -> Result<Option<u64>, ClientError> {
        let (status, body) = self.get_text("/v1/models").await?;
        let url = format!("{}/v1/models", self.endpoint.base_url);
        if status != 200 {
            return Err(ClientError::Status {
                url,
                status,
                body: snippet(&body),
            });
        }
        let v: Value = serde_json::from_str(&body).map_err(|e| ClientError::Decode {
            url,
            reason: e.to_string(),
        })?;
        Ok(v["data"][0]["max_model_len"].as_u64())
    }

    /// `/metrics` (present only with `--enable-metrics`; a 404 is an error).
    pub async fn metrics(&self) -> Result<Metrics, ClientError> {
        let (status, body) = self.get_text("/metrics").await?;
        if status != 200 {
            let url = format!("{}/metrics", self.endpoint.base_url);
            return Err(ClientError::Status {
                url,
                status,
                body: snippet(&body),
            });
        }
        Ok(metrics::parse(&body))
    }

    /// Sends one generation request and waits for the whole completion.
    pub async fn complete(&self, req: &CompletionRequest) -> Result<Completion, ClientError> {
        self.timed(req.api.path(), self.complete_untimed(req)).await
    }

    async fn complete_untimed(&self, req: &CompletionRequest) -> Result<Completion, ClientError> {
        let path = req.api.path();
        let body = req.body().ok_or_else(|| ClientError::Decode {
            url: format!("{}{}", self.endpoint.base_url, path),
            reason: format!("this prompt kind cannot be sent to {path}"),
        })?;
        let (url, answer) = self.post_json(path, &body).await?;
        let status = answer.status();
        let bytes = answer.bytes(&url).await?;
        if status != 200 {
            return Err(completion_error(
                url,
                status,
                &String::from_utf8_lossy(&bytes),
            ));
        }
        let mut completion =
            parse_completion(req.api, &bytes).map_err(|e| ClientError::Decode {
                url,
                reason: e.to_string(),
            })?;
        completion.body = Some(bytes);
        Ok(completion)
    }
}

/// The error for a completion request answered `status` (not 200) with `body`: SGLang's 400 for
/// a prompt over the context length is a [`ClientError::ContextOverflow`].
pub(crate) fn completion_error(url: String, status: u16, body: &str) -> ClientError {
    if status == 400
        && let Some(overflow) = parse_overflow(body)
    {
        return ClientError::ContextOverflow {
            url,
            overflow,
            message: server_text(body),
        };
    }
    ClientError::Status {
        url,
        status,
        body: snippet(body),
    }
}

/// The `message` of an error body as SGLang's and OpenAI's APIs write it (`{"message"}` or
/// `{"error":{"message"}}`, srt/entrypoints/openai/serving_base.py `create_error_response`),
/// else the body, trimmed.
fn server_text(body: &str) -> String {
    let v: Option<Value> = serde_json::from_str(body).ok();
    let message = v.as_ref().and_then(|v| {
        v.get("message")
            .or_else(|| v.get("error").and_then(|e| e.get("message")))
            .and_then(Value::as_str)
    });
    match message {
        Some(m) => m.to_string(),
        None => body.trim().to_string(),
    }
}

fn snippet(body: &str) -> String {
    const MAX: usize = 300;
    let body = body.trim();
    match body.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}…", &body[..i]),
        None => body.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_info_reads_the_effective_cap_not_the_cli_value() {
        let raw = json!({
            "version": "0.5.23", "max_total_num_tokens": 1_200_000, "max_running_requests": null,
            "context_length": 8192, "served_model_name": "qwen",
            "mamba_radix_cache_strategy": "extra_buffer",
            "internal_states": [{"effective_max_running_requests_per_dp": 72}]
        });
        let i = ServerInfo::from_json(raw);
        assert_eq!(i.effective_max_running_requests, Some(72));
        assert_eq!(i.max_running_requests, None);
        assert_eq!(i.max_total_num_tokens, Some(1_200_000));
        assert_eq!(i.context_length, Some(8192));
        assert_eq!(i.version.as_deref(), Some("0.5.23"));
        assert_eq!(i.served_model_name.as_deref(), Some("qwen"));
        assert_eq!(i.mamba_strategy.as_deref(), Some("extra_buffer"));
        let old = ServerInfo::from_json(json!({"mamba_scheduler_strategy": "no_buffer"}));
        assert_eq!(old.mamba_strategy.as_deref(), Some("no_buffer"));
        let dense = ServerInfo::from_json(
            json!({"mamba_radix_cache_strategy": "auto", "uses_mamba_radix_cache": false}),
        );
        assert_eq!(dense.mamba_strategy, None);
    }

    #[test]
    fn a_data_parallel_server_admits_the_sum_of_its_ranks_caps() {
        let dp4 = ServerInfo::from_json(json!({
            "tp_size": 2, "dp_size": 4,
            "internal_states": [
                {"effective_max_running_requests_per_dp": 64},
                {"effective_max_running_requests_per_dp": 64},
                {"effective_max_running_requests_per_dp": 64},
                {"effective_max_running_requests_per_dp": 60}
            ]
        }));
        assert_eq!(dp4.effective_max_running_requests, Some(252));
        let unsaid = ServerInfo::from_json(json!({"internal_states": [{}]}));
        assert_eq!(unsaid.effective_max_running_requests, None);
    }

    #[test]
    fn bodies_per_api() {
        let mut req = CompletionRequest {
            api: Api::Generate,
            prompt: Prompt::Text("hi".into()),
            max_tokens: 16,
            temperature: Some(0.5),
            top_p: None,
            model: Some("m".into()),
            extra: None,
        };
        assert_eq!(
            req.body().unwrap(),
            json!({"text": "hi", "sampling_params": {"max_new_tokens": 16, "temperature": 0.5}})
        );
        req.api = Api::Completions;
        assert_eq!(
            req.body().unwrap(),
            json!({"prompt": "hi", "max_tokens": 16, "temperature": 0.5, "model": "m", "stream": false})
        );
        req.api = Api::Chat;
        req.prompt = Prompt::Messages(json!([{"role": "user", "content": "x"}]));
        let mut extra = Map::new();
        extra.insert("model".into(), json!("batch-model"));
        extra.insert("seed".into(), json!(7));
        req.extra = Some(extra);
        let b = req.body().unwrap();
        assert_eq!(b["model"], "batch-model");
        assert_eq!(b["seed"], 7);
        assert_eq!(b["max_tokens"], 16);
        assert_eq!(b["messages"][0]["content"], "x");
        req.api = Api::Generate;
        assert_eq!(req.body(), None);
    }

    #[test]
    fn parses_responses() {
        let g = br#"{"text":"out","meta_info":{"prompt_tokens":5,"completion_tokens":3,"finish_reason":{"type":"length","length":3},"e2e_latency":0.1}}"#;
        let c = parse_completion(Api::Generate, g).unwrap();
        assert_eq!(
            (c.text.as_str(), c.prompt_tokens, c.completion_tokens),
            ("out", 5, 3)
        );
        assert_eq!(c.finish_reason.as_deref(), Some("length"));
        let chat = br#"{"choices":[{"index":0,"message":{"role":"assistant","content":"hey"},"finish_reason":"stop"}],"usage":{"prompt_tokens":2,"completion_tokens":1,"total_tokens":3}}"#;
        let c = parse_completion(Api::Chat, chat).unwrap();
        assert_eq!(
            (c.text.as_str(), c.finish_reason.as_deref()),
            ("hey", Some("stop"))
        );
        assert_eq!(c.reasoning, None);
        assert!(parse_completion(Api::Chat, b"{}").is_err());
    }

    #[test]
    fn a_thought_is_kept_apart_and_an_answer_may_be_null() {
        // serving_chat.py with --reasoning-parser qwen3: the thought moves to reasoning_content.
        let chat = br#"{"choices":[{"index":0,"message":{"role":"assistant","content":"42","reasoning_content":"six times seven","tool_calls":null},"finish_reason":"stop"}],"usage":{"prompt_tokens":2,"completion_tokens":9,"total_tokens":11}}"#;
        let c = parse_completion(Api::Chat, chat).unwrap();
        assert_eq!(
            (c.text.as_str(), c.reasoning.as_deref()),
            ("42", Some("six times seven"))
        );
        // Cut off while thinking: no answer at all.
        let cut = br#"{"choices":[{"index":0,"message":{"role":"assistant","content":null,"reasoning_content":"hmm"},"finish_reason":"length"}],"usage":{"prompt_tokens":2,"completion_tokens":5,"total_tokens":7}}"#;
        let c = parse_completion(Api::Chat, cut).unwrap();
        assert_eq!((c.text.as_str(), c.reasoning.as_deref()), ("", Some("hmm")));
        assert_eq!(c.completion_tokens, 5);
    }

    #[test]
    fn retryable_statuses() {
        let st = |status| ClientError::Status {
            url: "u".into(),
            status,
            body: String::new(),
        };
        assert!(st(503).is_retryable());
        assert!(st(429).is_retryable());
        assert!(!st(400).is_retryable());
        assert!(ClientError::Timeout { url: "u".into() }.is_retryable());
    }

    #[test]
    fn endpoint_name_from_url() {
        let e = Endpoint::from_url("http://127.0.0.1:30005/");
        assert_eq!(e.id, ServerId::named("127.0.0.1:30005"));
        assert_eq!(e.base_url, "http://127.0.0.1:30005");
    }
}
