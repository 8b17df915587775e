//! What every handler of the sim's HTTP API shares: the app state, and the JSON and
//! OpenAI-error response bodies.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, OnceLock};

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use serde_json::{Value as Json, json};
use tokio::sync::mpsc;

use crate::sim::config::Config;
use crate::sim::model::Plan;
use crate::sim::scheduler::{Job, Metrics};

/// What every handler shares.
pub struct App {
    pub cfg: Arc<Config>,
    /// The loaded model's plan; set once the load succeeds, before `ready`.
    pub plan: OnceLock<Arc<Plan>>,
    pub metrics: Arc<Metrics>,
    pub jobs: mpsc::Sender<Job>,
    /// Set once the warm-up generation has completed.
    pub ready: AtomicBool,
    /// Numbers generation requests, for ids and the fault-injection draw.
    pub requests: AtomicU64,
    pub started_unix: u64,
    pub radix: crate::sim::radix::RadixCache,
}

impl App {
    /// The plan; only routes behind the readiness gate call this, and the gate opens after the
    /// plan is set.
    pub fn plan(&self) -> &Plan {
        self.plan
            .get()
            .expect("the readiness gate admits requests only after the load")
    }
}

pub type Shared = Arc<App>;

/// `v` as compact JSON text: what `v.to_string()` gives, written straight into the string
/// rather than through `fmt` (a tenth of `--sim-instant`'s CPU per request went there).
pub fn compact(v: &Json) -> String {
    serde_json::to_string(v).expect("a JSON value always serializes")
}

pub fn json_response(status: StatusCode, body: &Json) -> Response {
    let mut r = Response::new(Body::from(compact(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// The body of an OpenAI-route error (`ErrorResponse` in SGLang's protocol).
pub fn openai_error(status: StatusCode, kind: &str, message: &str) -> Response {
    json_response(
        status,
        &json!({
            "object": "error",
            "message": message,
            "type": kind,
            "param": null,
            "code": status.as_u16(),
        }),
    )
}
