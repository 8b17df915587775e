//! The real `sglang-sim` binary answering as SGLang 0.5.23 does where streams and responses
//! carry more than text: the scheduler's aborts inside a 200 stream (input limit, full queue),
//! per-chunk usage, a reasoning parser's split of the thought, and the labels of /metrics.

mod common;
mod sim_common;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sim_common::*;

fn chunks(body: &str) -> Vec<Value> {
    let events = sse_events(body);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{body}");
    events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap_or_else(|err| panic!("{err}: {e}")))
        .collect()
}

fn words(s: &str) -> u64 {
    s.split(' ').filter(|w| !w.is_empty()).count() as u64
}

/// The value of the first `/metrics` line that starts with `series`.
fn value(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_prompt_over_the_input_limit_is_a_200_that_ends_in_an_abort() {
    let mut sim = Sim::spawn(
        &["--sim-time-scale", "1000", "--context-length", "1000"],
        &[],
    );
    sim.wait_ready(Duration::from_secs(10)).await;
    // max_req_input_len = min(C − 1, KV − 1) − 5 = 994, and a prompt of 994 tokens is refused.
    let limit = "Input length (994 tokens) exceeds the maximum allowed length (994 tokens). \
                 Use a shorter input or enable --allow-auto-truncate.";
    let (code, body) = sim
        .post(
            "/generate",
            json!({"text": "abcd".repeat(994), "sampling_params": {"max_new_tokens": 1},
                   "stream": true}),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    let c = chunks(&body);
    assert_eq!(c.len(), 1, "{body}");
    assert_eq!(
        c[0]["meta_info"]["finish_reason"],
        json!({"type": "abort", "message": limit, "status_code": 400,
               "err_type": "BadRequestError"})
    );
    // What made a sweep count it as a one-token completion.
    assert_eq!(c[0]["meta_info"]["completion_tokens"], 1);
    // The longest prompt that runs is one token shorter.
    let (code, body) = sim
        .post(
            "/generate",
            json!({"text": "abcd".repeat(993), "sampling_params": {"max_new_tokens": 1},
                   "stream": true}),
        )
        .await;
    assert_eq!(code, 200);
    let c = chunks(&body);
    assert_eq!(
        c.last().unwrap()["meta_info"]["finish_reason"]["type"],
        "length"
    );
    // The OpenAI routes send an error object named after the status instead.
    let (code, body) = sim
        .post(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "abcd".repeat(990)}],
                   "max_tokens": 1, "stream": true}),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        chunks(&body),
        [
            json!({"error": {"object": "error", "type": "BAD_REQUEST", "param": null, "code": 400,
            "message": "Input length (997 tokens) exceeds the maximum allowed length (994 tokens). \
                        Use a shorter input or enable --allow-auto-truncate."}})
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_finds_the_queue_full_is_aborted_with_a_503() {
    let mut sim = Sim::spawn(
        &[
            "--sim-time-scale",
            "2",
            "--max-running-requests",
            "1",
            "--max-queued-requests",
            "1",
            "--enable-metrics",
        ],
        &[],
    );
    sim.wait_ready(Duration::from_secs(10)).await;
    // One long request runs and one waits. The second is sent only once the first runs: sent
    // together, both can reach the scheduler in one receive, and the second then finds the first
    // still queued and is the one refused (as 0.5.23's scheduler does it).
    let labels = "{engine_type=\"unified\",model_name=\"/models/test\",moe_ep_rank=\"0\",\
                  pp_rank=\"0\",tp_rank=\"0\"}";
    let mut busy = Vec::new();
    for (i, want) in [(0, (1.0, 0.0)), (1, (1.0, 1.0))] {
        let r = sim.http.post(sim.url("/generate")).json(
            &json!({"text": format!("long {i}"), "sampling_params": {"max_new_tokens": 4000}}),
        );
        busy.push(tokio::spawn(async move {
            r.send().await.map(|r| r.status().as_u16())
        }));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let m = sim.metrics().await;
            let running = value(&m, &format!("sglang:num_running_reqs{labels}"));
            let queued = value(&m, &format!("sglang:num_queue_reqs{labels}"));
            if (running, queued) == (Some(want.0), Some(want.1)) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "never {} running and {} queued:\n{m}",
                want.0,
                want.1
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let full = "The request queue is full.";
    let (code, body) = sim
        .post(
            "/generate",
            json!({"text": "late", "sampling_params": {"max_new_tokens": 4}, "stream": true}),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    let c = chunks(&body);
    assert_eq!(c.len(), 1, "{body}");
    assert_eq!(
        c[0]["meta_info"]["finish_reason"],
        json!({"type": "abort", "status_code": 503, "message": full})
    );
    let (code, body) = sim
        .post(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "late"}], "max_tokens": 4,
                   "stream": true}),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        chunks(&body),
        [
            json!({"error": {"object": "error", "message": full, "type": "SERVICE_UNAVAILABLE",
                          "param": null, "code": 503}})
        ],
        "no role chunk before the abort"
    );
    let (code, body) = sim
        .post(
            "/generate",
            json!({"text": "late", "sampling_params": {"max_new_tokens": 4}}),
        )
        .await;
    assert_eq!(code, 503);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        json!({"object": "error", "message": full, "type": "503", "param": null, "code": 503})
    );
    for t in busy {
        t.abort();
        let _ = t.await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_continuous_usage_every_chunk_says_how_many_tokens_so_far() {
    let mut sim = Sim::spawn(&["--sim-time-scale", "500", "--stream-interval", "10"], &[]);
    sim.wait_ready(Duration::from_secs(10)).await;
    let options = json!({"include_usage": true, "continuous_usage_stats": true});
    let (code, body) = sim
        .post(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "tell me"}], "max_tokens": 41,
                   "stream": true, "stream_options": options.clone()}),
        )
        .await;
    assert_eq!(code, 200);
    let c = chunks(&body);
    let mut so_far = 0;
    let mut merged = false;
    for chunk in &c {
        if let Some(text) = chunk["choices"][0]["delta"]["content"].as_str()
            && !text.is_empty()
        {
            so_far += words(text);
            merged |= words(text) > 1;
            assert_eq!(chunk["usage"]["completion_tokens"], so_far, "{chunk}");
        }
    }
    assert_eq!(so_far, 41);
    assert!(
        merged,
        "several tokens per chunk at --stream-interval 10: {body}"
    );
    assert_eq!(c.last().unwrap()["usage"]["completion_tokens"], 41);
    assert_eq!(c.last().unwrap()["choices"], json!([]));

    // Completions: the last text chunk carries the finish reason (serving_completions.py).
    let (_, body) = sim
        .post(
            "/v1/completions",
            json!({"prompt": "go", "max_tokens": 25, "stream": true, "stream_options": options}),
        )
        .await;
    let c = chunks(&body);
    let text = &c[c.len() - 2];
    assert_eq!(text["choices"][0]["finish_reason"], "length", "{body}");
    assert_eq!(text["usage"]["completion_tokens"], 25);
    assert!(
        c[..c.len() - 1]
            .iter()
            .all(|c| c["usage"]["completion_tokens"].is_u64()),
        "{body}"
    );
    // Without the option only the last chunk has usage.
    let (_, body) = sim
        .post(
            "/v1/completions",
            json!({"prompt": "go", "max_tokens": 25, "stream": true,
                   "stream_options": {"include_usage": true}}),
        )
        .await;
    let c = chunks(&body);
    assert!(c[..c.len() - 1].iter().all(|c| c["usage"].is_null()));
    assert_eq!(c.last().unwrap()["usage"]["completion_tokens"], 25);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reasoning_parser_moves_the_thought_out_of_the_answer() {
    let mut sim = Sim::spawn(
        &["--sim-time-scale", "1000", "--reasoning-parser", "qwen3"],
        &[],
    );
    sim.wait_ready(Duration::from_secs(10)).await;
    let ask = |max_tokens: u64, stream: bool| {
        json!({"messages": [{"role": "user", "content": "think first"}],
               "max_tokens": max_tokens, "stream": stream})
    };
    let (code, body) = sim.post("/v1/chat/completions", ask(4000, false)).await;
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let message = &v["choices"][0]["message"];
    let thought = message["reasoning_content"].as_str().unwrap();
    let answer = message["content"].as_str().unwrap();
    assert!(!thought.is_empty() && !answer.is_empty(), "{message}");
    assert!(
        !thought.contains("think>") && !answer.contains("think>"),
        "{message}"
    );
    // Every token counts, the two tags included.
    assert_eq!(
        v["usage"]["completion_tokens"],
        words(thought) + 2 + words(answer)
    );
    // Streamed: the thought and the answer arrive in deltas of their own.
    let (_, body) = sim.post("/v1/chat/completions", ask(4000, true)).await;
    let (mut t, mut a) = (String::new(), String::new());
    for c in chunks(&body) {
        let delta = &c["choices"][0]["delta"];
        t.push_str(delta["reasoning_content"].as_str().unwrap_or(""));
        a.push_str(delta["content"].as_str().unwrap_or(""));
    }
    assert_eq!((t.as_str(), a.as_str()), (thought, answer));
    // Cut off while thinking: no answer at all.
    let (_, body) = sim.post("/v1/chat/completions", ask(3, false)).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    let message = &v["choices"][0]["message"];
    assert_eq!(message["content"], "", "{message}");
    assert_eq!(words(message["reasoning_content"].as_str().unwrap()), 2);
    // /generate is not parsed: the raw text keeps its tags.
    let (_, body) = sim
        .post(
            "/generate",
            json!({"text": "think first", "sampling_params": {"max_new_tokens": 4000}}),
        )
        .await;
    let v: Value = serde_json::from_str(&body).unwrap();
    let text = v["text"].as_str().unwrap();
    assert!(
        text.starts_with("<think>") && text.contains(" </think> "),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_carry_0_5_23_s_labels_and_token_usage_has_two_decimals() {
    let mut sim = Sim::spawn(
        &[
            "--sim-time-scale",
            "1000",
            "--enable-metrics",
            "--enable-priority-scheduling",
        ],
        &[],
    );
    sim.wait_ready(Duration::from_secs(10)).await;
    let (code, _) = sim
        .post(
            "/generate",
            json!({"text": "a", "sampling_params": {"max_new_tokens": 5}, "stream": true}),
        )
        .await;
    assert_eq!(code, 200);
    let m = sim.metrics().await;
    let gauge = "{engine_type=\"unified\",model_name=\"/models/test\",moe_ep_rank=\"0\",\
                 pp_rank=\"0\",priority=\"\",tp_rank=\"0\"}";
    assert_eq!(
        value(&m, &format!("sglang:num_running_reqs{gauge}")),
        Some(0.0),
        "{m}"
    );
    let usage = value(&m, &format!("sglang:token_usage{gauge}")).unwrap();
    assert_eq!(usage, (usage * 100.0).round() / 100.0, "{m}");
    let counter = |streaming: bool| {
        format!(
            "sglang:generation_tokens_total{{engine_type=\"unified\",is_streaming=\"{streaming}\",\
             model_name=\"/models/test\",priority=\"\"}}"
        )
    };
    // The warm-up generation (one token) and the streamed request.
    assert_eq!(value(&m, &counter(false)), Some(1.0), "{m}");
    assert_eq!(value(&m, &counter(true)), Some(5.0), "{m}");
    let parsed = fleet::sglang::metrics::parse(&m);
    assert_eq!(parsed.generation_tokens_total, Some(6.0));
    assert_eq!(parsed.num_running_reqs, Some(0.0));
}
