//! Parsing SGLang's Prometheus `/metrics` text into the few `sglang:` series fleet acts on.
//!
//! With priority scheduling (srt/observability/metrics_collector.py, 0.5.23) a scheduler gauge
//! is written once as the total under `priority=""` and again per priority, while the tokenizer
//! manager's counters carry each request's own priority and have no total: gauges are read from
//! the total, counters summed over every label set.

use serde::Serialize;

/// The `sglang:` gauges and counters fleet reads, summed over label sets (one per model name).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Metrics {
    pub num_running_reqs: Option<f64>,
    pub num_queue_reqs: Option<f64>,
    pub gen_throughput: Option<f64>,
    pub token_usage: Option<f64>,
    pub generation_tokens_total: Option<f64>,
    pub prompt_tokens_total: Option<f64>,
    /// Prompt tokens the radix cache served, over every `cache_source`.
    pub cached_tokens_total: Option<f64>,
}

/// Reads Prometheus exposition text; unknown series, comments and malformed lines are ignored
/// because a scrape must never fail on a metric fleet does not use.
pub fn parse(text: &str) -> Metrics {
    let mut m = Metrics::default();
    for line in text.lines() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix("sglang:") else {
            continue;
        };
        let name_end = rest
            .find(|c: char| c == '{' || c.is_whitespace())
            .unwrap_or(rest.len());
        let name = &rest[..name_end];
        let (slot, gauge) = match name {
            "num_running_reqs" => (&mut m.num_running_reqs, true),
            "num_queue_reqs" => (&mut m.num_queue_reqs, true),
            "gen_throughput" => (&mut m.gen_throughput, true),
            "token_usage" => (&mut m.token_usage, true),
            "generation_tokens_total" => (&mut m.generation_tokens_total, false),
            "prompt_tokens_total" => (&mut m.prompt_tokens_total, false),
            "cached_tokens_total" => (&mut m.cached_tokens_total, false),
            _ => continue,
        };
        let after = &rest[name_end..];
        // Label values may contain spaces, so the value starts after the closing brace.
        let value_part = match after.strip_prefix('{') {
            Some(labels) => match labels.rfind('}') {
                // A gauge's per-priority breakdown repeats its total.
                Some(end)
                    if gauge
                        && label(&labels[..end], "priority").is_some_and(|p| !p.is_empty()) =>
                {
                    continue;
                }
                Some(end) => &labels[end + 1..],
                None => continue,
            },
            None => after,
        };
        let Some(value) = value_part
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        else {
            continue;
        };
        *slot = Some(slot.unwrap_or(0.0) + value);
    }
    m
}

/// The value of label `key` in a Prometheus label set (`a="x",b="y\\"z"`), unescaped.
fn label(labels: &str, key: &str) -> Option<String> {
    let mut rest = labels;
    loop {
        rest = rest.trim_start_matches([',', ' ']);
        let (name, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next()? {
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (i, '"') => break i,
                (_, c) => value.push(c),
            }
        };
        if name.trim() == key {
            return Some(value);
        }
        rest = &after[end + 1..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_gauges_and_counters_summed_over_labels() {
        let text = "\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name=\"qwen 27b\"} 72.0
sglang:num_queue_reqs{model_name=\"qwen 27b\"} 3.0
sglang:gen_throughput{model_name=\"qwen 27b\"} 1180.5
sglang:token_usage{model_name=\"a\"} 0.25
sglang:generation_tokens_total{model_name=\"a\"} 1000
sglang:generation_tokens_total{model_name=\"b\"} 500 1712345678000
sglang:prompt_tokens_total 7033
sglang:time_to_first_token_seconds_bucket{le=\"0.1\"} 4
";
        let m = parse(text);
        assert_eq!(m.num_running_reqs, Some(72.0));
        assert_eq!(m.num_queue_reqs, Some(3.0));
        assert_eq!(m.gen_throughput, Some(1180.5));
        assert_eq!(m.token_usage, Some(0.25));
        assert_eq!(m.generation_tokens_total, Some(1500.0));
        assert_eq!(m.prompt_tokens_total, Some(7033.0));
    }

    #[test]
    fn gauges_read_the_priority_total_and_counters_sum_every_priority() {
        let text = "\
sglang:num_running_reqs{model_name=\"m\",priority=\"\",tp_rank=\"0\"} 72.0
sglang:num_running_reqs{model_name=\"m\",priority=\"0\",tp_rank=\"0\"} 40.0
sglang:num_running_reqs{model_name=\"m\",priority=\"1\",tp_rank=\"0\"} 32.0
sglang:token_usage{model_name=\"m\",priority=\"\",tp_rank=\"0\"} 0.61
sglang:generation_tokens_total{is_streaming=\"false\",model_name=\"m\"} 900
sglang:generation_tokens_total{is_streaming=\"true\",model_name=\"m\"} 100
sglang:prompt_tokens_total{engine_type=\"unified\",model_name=\"m\",priority=\"0\"} 300
sglang:prompt_tokens_total{engine_type=\"unified\",model_name=\"m\",priority=\"1\"} 200
sglang:prompt_tokens_total{engine_type=\"unified\",model_name=\"m\",priority=\"\"} 5
";
        let m = parse(text);
        assert_eq!(m.num_running_reqs, Some(72.0));
        assert_eq!(m.token_usage, Some(0.61));
        assert_eq!(m.generation_tokens_total, Some(1000.0));
        // The tokenizer's counters have no total series: each priority's requests are their own.
        assert_eq!(m.prompt_tokens_total, Some(505.0));
        assert_eq!(
            label(r#"a="x, y",b="q\"uote""#, "b").as_deref(),
            Some("q\"uote")
        );
        assert_eq!(label(r#"a="x""#, "b"), None);
    }

    #[test]
    fn missing_series_stay_none_and_garbage_is_ignored() {
        let m = parse("sglang:num_running_reqs{model_name=\"x\"} notanumber\nfoo 1\n");
        assert_eq!(m, Metrics::default());
    }
}
