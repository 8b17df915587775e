//! The few HTTP calls launching needs from a server: `/health` status, the capacity fields of
//! `/server_info`, and the load gauges of `/metrics`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// HTTP to one fleet's servers, carrying the API key when the profile has one.
#[derive(Debug, Clone)]
pub struct Probe {
    client: reqwest::Client,
    api_key: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("{url}: {source}")]
    Http { url: String, source: reqwest::Error },
    #[error("{url}: HTTP {status}")]
    Status { url: String, status: u16 },
}

/// Capacity a ready server reports in `/server_info`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ServerInfo {
    pub version: Option<String>,
    pub max_total_num_tokens: Option<u64>,
    /// `internal_states[0].effective_max_running_requests_per_dp`: the real cap.
    pub effective_max_running_requests: Option<u64>,
    pub context_length: Option<u64>,
}

/// Load gauges from `/metrics`, summed over label sets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Gauges {
    pub running: f64,
    pub queued: f64,
    pub gen_throughput: f64,
    pub token_usage: f64,
}

#[derive(Deserialize)]
struct RawServerInfo {
    version: Option<String>,
    max_total_num_tokens: Option<u64>,
    context_length: Option<u64>,
    #[serde(default)]
    internal_states: Vec<RawInternalState>,
}

#[derive(Deserialize)]
struct RawInternalState {
    effective_max_running_requests_per_dp: Option<u64>,
}

impl Probe {
    pub fn new(api_key: Option<String>) -> Probe {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .connect_timeout(Duration::from_secs(2))
            .build()
            .expect("a plain HTTP client always builds");
        Probe { client, api_key }
    }

    /// The same client with another key (a server started by another profile).
    pub fn with_key(&self, api_key: Option<String>) -> Probe {
        Probe {
            client: self.client.clone(),
            api_key,
        }
    }

    async fn get(&self, url: &str) -> Result<reqwest::Response, ProbeError> {
        let mut request = self.client.get(url);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        request.send().await.map_err(|source| ProbeError::Http {
            url: url.to_string(),
            source,
        })
    }

    /// `/health`'s status code: 503 while loading, 200 once ready.
    pub async fn health(&self, base: &str) -> Result<u16, ProbeError> {
        Ok(self.get(&format!("{base}/health")).await?.status().as_u16())
    }

    /// `/server_info`, or `/get_server_info` on older SGLang.
    pub async fn server_info(&self, base: &str) -> Result<ServerInfo, ProbeError> {
        let mut url = format!("{base}/server_info");
        let mut response = self.get(&url).await?;
        if response.status() == reqwest::StatusCode::NOT_FOUND {
            url = format!("{base}/get_server_info");
            response = self.get(&url).await?;
        }
        if !response.status().is_success() {
            return Err(ProbeError::Status {
                url,
                status: response.status().as_u16(),
            });
        }
        let raw: RawServerInfo = response
            .json()
            .await
            .map_err(|source| ProbeError::Http { url, source })?;
        Ok(ServerInfo {
            version: raw.version,
            max_total_num_tokens: raw.max_total_num_tokens,
            effective_max_running_requests: raw
                .internal_states
                .first()
                .and_then(|s| s.effective_max_running_requests_per_dp),
            context_length: raw.context_length,
        })
    }

    /// `/metrics` (present only with `--enable-metrics`).
    pub async fn metrics(&self, base: &str) -> Result<Gauges, ProbeError> {
        let url = format!("{base}/metrics");
        let response = self.get(&url).await?;
        if !response.status().is_success() {
            return Err(ProbeError::Status {
                url,
                status: response.status().as_u16(),
            });
        }
        let text = response
            .text()
            .await
            .map_err(|source| ProbeError::Http { url, source })?;
        Ok(parse_gauges(&text))
    }
}

/// Sums SGLang's load gauges over every label set of a Prometheus text exposition.
pub fn parse_gauges(text: &str) -> Gauges {
    let mut g = Gauges::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let name = series.split('{').next().unwrap_or(series).trim();
        match name {
            "sglang:num_running_reqs" => g.running += value,
            "sglang:num_queue_reqs" => g.queued += value,
            "sglang:gen_throughput" => g.gen_throughput += value,
            "sglang:token_usage" => g.token_usage += value,
            _ => {}
        }
    }
    g
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gauges_sum_over_labels_and_ignore_the_rest() {
        let text = "# HELP sglang:num_running_reqs The number of running requests.\n\
# TYPE sglang:num_running_reqs gauge\n\
sglang:num_running_reqs{model_name=\"qwen\",engine_type=\"unified\"} 70.0\n\
sglang:num_running_reqs{model_name=\"other\"} 2.0\n\
sglang:num_queue_reqs{model_name=\"qwen\"} 3.0\n\
sglang:gen_throughput{model_name=\"qwen\"} 1180.5\n\
sglang:token_usage{model_name=\"qwen\"} 0.42\n\
sglang:generation_tokens_total{model_name=\"qwen\"} 12345.0\n";
        assert_eq!(
            parse_gauges(text),
            Gauges {
                running: 72.0,
                queued: 3.0,
                gen_throughput: 1180.5,
                token_usage: 0.42
            }
        );
    }
}
