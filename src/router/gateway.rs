//! The gateway's worker API, as `smg` 1.13.0 serves it: `GET /workers` lists them (with the
//! id each is removed by), `POST /workers {"url"}` queues an addition, `DELETE /workers/{id}`
//! queues a removal (the worker drains for 5 s, listed as `draining`, then goes).

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::RouterError;

/// One worker as `GET /workers` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GatewayWorker {
    /// What `DELETE /workers/{id}` takes (a UUID; the URL is refused).
    pub id: String,
    pub url: String,
    /// `pending` (being added), `ready`, `draining` (being removed).
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub is_healthy: bool,
    /// Requests in flight, as the gateway counts them.
    #[serde(default)]
    pub load: i64,
}

impl GatewayWorker {
    pub fn draining(&self) -> bool {
        self.status == "draining"
    }
}

#[derive(Deserialize)]
struct Listing {
    workers: Vec<GatewayWorker>,
}

/// A gateway reached at `base` (a forwarded local port), with the key it was started with.
#[derive(Debug, Clone)]
pub struct Gateway {
    http: reqwest::Client,
    base: String,
    api_key: Option<String>,
}

impl Gateway {
    pub fn new(http: reqwest::Client, base: String, api_key: Option<String>) -> Gateway {
        Gateway {
            http,
            base,
            api_key,
        }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    fn error(&self, message: impl std::fmt::Display) -> RouterError {
        RouterError::Http {
            url: self.base.clone(),
            message: message.to_string(),
        }
    }

    fn with_key(&self, r: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.api_key {
            Some(k) => r.bearer_auth(k),
            None => r,
        }
    }

    async fn send(&self, r: reqwest::RequestBuilder) -> Result<String, RouterError> {
        let resp = self.with_key(r).send().await.map_err(|e| self.error(e))?;
        let status = resp.status();
        let body = resp.text().await.map_err(|e| self.error(e))?;
        if status.is_success() {
            Ok(body)
        } else {
            Err(self.error(format!("{status}: {}", crate::remote::mask(body.trim()))))
        }
    }

    /// Every worker the gateway lists, draining ones included.
    pub async fn workers(&self) -> Result<Vec<GatewayWorker>, RouterError> {
        let body = self
            .send(self.http.get(format!("{}/workers", self.base)))
            .await?;
        serde_json::from_str::<Listing>(&body)
            .map(|l| l.workers)
            .map_err(|e| self.error(format!("unexpected /workers answer: {e}")))
    }

    /// Asks the gateway to add the server at `url`; the addition runs in its background.
    pub async fn add(&self, url: &str) -> Result<(), RouterError> {
        let mut body = json!({ "url": url });
        if let Some(k) = &self.api_key {
            body["api_key"] = json!(k);
        }
        let r = self.http.post(format!("{}/workers", self.base)).json(&body);
        match self.send(r).await {
            Ok(_) => Ok(()),
            // An addition already queued (a retry of ours, or the gateway's own) is what we want.
            Err(RouterError::Http { message, .. })
                if message.contains("WORKER_CREATE_IN_PROGRESS")
                    || message.contains("already exists") =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Asks the gateway to drain and remove worker `id`.
    pub async fn remove(&self, id: &str) -> Result<(), RouterError> {
        self.send(self.http.delete(format!("{}/workers/{id}", self.base)))
            .await
            .map(drop)
    }
}
