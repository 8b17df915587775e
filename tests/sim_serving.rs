//! Integration tests of the real `sglang-sim` binary serving: SSE framing and token
//! accounting, fault injection, instant mode, measured throughput against the reported ideal,
//! and stream intervals.

mod common;
mod sim_common;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sim_common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_framing_and_token_accounting() {
    let mut sim = Sim::spawn(&["--sim-time-scale", "500"], &[]);
    sim.wait_ready(Duration::from_secs(10)).await;
    let r = sim.http.get(sim.url("/metrics")).send().await.unwrap();
    assert_eq!(
        r.status(),
        404,
        "/metrics exists only with --enable-metrics"
    );

    let (code, body) = sim
        .post(
            "/v1/chat/completions",
            json!({"model": "m", "messages": [{"role": "user", "content": "tell me"}],
                   "max_tokens": 40, "stream": true, "stream_options": {"include_usage": true}}),
        )
        .await;
    assert_eq!(code, 200);
    let events = sse_events(&body);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk")
    );
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(chunks.last().unwrap()["choices"], json!([]));
    assert_eq!(usage["completion_tokens"], 40);
    assert_eq!(usage["prompt_tokens"], 2 + 4 + 3);
    assert_eq!(
        content.chars().count(),
        4 * 40 - 1,
        "40 tokens of 4 characters"
    );
    let finish = &chunks[chunks.len() - 2]["choices"][0];
    assert_eq!(finish["finish_reason"], "length");

    let (code, body) = sim
        .post(
            "/generate",
            json!({"text": "abc", "sampling_params": {"max_new_tokens": 30}, "stream": true}),
        )
        .await;
    assert_eq!(code, 200);
    let events = sse_events(&body);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let last: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(last["meta_info"]["completion_tokens"], 30);
    assert_eq!(
        last["meta_info"]["finish_reason"],
        json!({"type": "length", "length": 30})
    );
    // Native streaming carries the cumulative text, which the non-streamed answer matches.
    let (_, whole) = sim
        .post(
            "/generate",
            json!({"text": "abc", "sampling_params": {"max_new_tokens": 30}}),
        )
        .await;
    let whole: Value = serde_json::from_str(&whole).unwrap();
    assert_eq!(last["text"], whole["text"]);
    assert_eq!(whole["meta_info"]["prompt_tokens"], 1);

    let (code, body) = sim
        .post(
            "/v1/completions",
            json!({"prompt": "x", "max_tokens": 5, "stream": true}),
        )
        .await;
    assert_eq!(code, 200);
    let events = sse_events(&body);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let text: String = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter_map(|c| c["choices"][0]["text"].as_str().map(str::to_string))
        .collect();
    assert_eq!(text.split(' ').count(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_injection() {
    // Crash after 3 completed requests.
    let mut dies = Sim::spawn(&["--sim-time-scale", "1000", "--sim-die-after", "3"], &[]);
    dies.wait_ready(Duration::from_secs(10)).await;
    for _ in 0..3 {
        let (code, _) = dies
            .post(
                "/generate",
                json!({"text": "q", "sampling_params": {"max_new_tokens": 4}}),
            )
            .await;
        assert_eq!(code, 200);
    }
    let status = dies.wait_exit(Duration::from_secs(3)).await.expect("dies");
    assert!(!status.success());
    assert!(dies.log().contains("Scheduler hit an exception"));

    // Crash during the load: never healthy.
    let mut early = Sim::spawn(
        &[
            "--sim-die-after",
            "0",
            "--sim-startup-secs",
            "20",
            "--sim-time-scale",
            "40",
        ],
        &[],
    );
    let mut seen = Vec::new();
    let status = loop {
        if let Some(s) = early.child.try_wait().unwrap() {
            break s;
        }
        seen.push(early.health().await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(status.code(), Some(1));
    assert!(!seen.contains(&Some(200)));
    assert!(
        early
            .log()
            .contains("CUDA error: an illegal memory access was encountered")
    );
    assert!(early.state_files().is_empty());

    // Memory that cannot hold the weights; and too little left for CUDA graphs.
    for (fraction, message) in [
        (
            "0.5",
            "Not enough memory. Please try to increase --mem-fraction-static.",
        ),
        ("0.96", "CUDA out of memory."),
    ] {
        let mut oom = Sim::spawn(
            &[
                "--mem-fraction-static",
                fraction,
                "--sim-startup-secs",
                "10",
                "--sim-time-scale",
                "20",
            ],
            &[],
        );
        let mut seen = Vec::new();
        let status = loop {
            if let Some(s) = oom.child.try_wait().unwrap() {
                break s;
            }
            seen.push(oom.health().await);
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(status.code(), Some(1), "{fraction}");
        // The failure comes during the load, before SGLang opens its port.
        assert!(seen.iter().all(Option::is_none), "{seen:?}");
        assert!(oom.log().contains(message), "{}", oom.log());
    }

    // Fail rate: a seeded fraction of generation requests gets 500.
    let mut flaky = Sim::spawn(
        &["--sim-instant"],
        &[("SGLANG_SIM_FAIL_RATE", "0.5"), ("SGLANG_SIM_SEED", "7")],
    );
    flaky.wait_ready(Duration::from_secs(10)).await;
    let mut failed = 0;
    for i in 0..60 {
        let (code, body) = flaky
            .post(
                "/v1/completions",
                json!({"prompt": format!("p{i}"), "max_tokens": 3}),
            )
            .await;
        match code {
            200 => {}
            500 => {
                failed += 1;
                assert_eq!(
                    serde_json::from_str::<Value>(&body).unwrap()["type"],
                    "InternalServerError"
                );
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert!((15..=45).contains(&failed), "{failed} of 60 failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instant_mode_answers_at_once_with_consistent_bodies() {
    let mut sim = Sim::spawn(&["--sim-instant", "--enable-metrics"], &[]);
    sim.wait_ready(Duration::from_secs(10)).await;
    let t = Instant::now();
    let (code, body) = sim
        .post(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "go"}], "max_tokens": 4096}),
        )
        .await;
    assert!(t.elapsed() < Duration::from_millis(500));
    assert_eq!(code, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    let n = v["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((494..=1482).contains(&n), "{n}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let words = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .split(' ')
        .count() as u64;
    assert_eq!(words, n);
    let metrics = sim.metrics().await;
    // The warm-up generation (1 token) counts too, as in SGLang.
    assert!(
        metrics.contains(&format!(
            "sglang:generation_tokens_total{{engine_type=\"unified\",is_streaming=\"false\",model_name=\"/models/test\"}} {}.0",
            n + 1
        )),
        "{metrics}"
    );
}

/// A client holding the batch full measures output throughput within 5% of the ideal the sim
/// reports, at `--sim-time-scale 50`; meanwhile /metrics shows the full batch and the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn measured_throughput_matches_the_reported_ideal() {
    let mut sim = Sim::spawn(
        &[
            "--mamba-radix-cache-strategy",
            "no_buffer",
            "--disable-overlap-schedule",
            "--enable-metrics",
            "--sim-time-scale",
            "50",
            "--context-length",
            "8192",
        ],
        &[],
    );
    sim.wait_ready(Duration::from_secs(10)).await;
    let info = sim.get_json("/server_info").await;
    let ideal = info["sim"]["ideal_output_tok_s"].as_f64().unwrap();
    let cap = info["internal_states"][0]["effective_max_running_requests_per_dp"]
        .as_u64()
        .unwrap();
    assert_eq!(cap, 72);

    let warmup = Duration::from_secs(2);
    let window = Duration::from_secs(6);
    let start = Instant::now();
    let clients = (cap as usize) + 18;
    let mut tasks = Vec::new();
    for c in 0..clients {
        let http = sim.http.clone();
        let url = sim.url("/generate");
        tasks.push(tokio::spawn(async move {
            let mut done: Vec<(Duration, u64)> = Vec::new();
            let mut i = 0;
            while start.elapsed() < warmup + window {
                // About 96 prompt tokens, like the default workload behind the ideal.
                let text = format!("{c:04} {i:06} {}", "x".repeat(372));
                let r = http
                    .post(&url)
                    .json(&json!({"text": text, "sampling_params": {"max_new_tokens": 4096}}))
                    .send()
                    .await
                    .unwrap();
                let v: Value = r.json().await.unwrap();
                done.push((
                    start.elapsed(),
                    v["meta_info"]["completion_tokens"].as_u64().unwrap(),
                ));
                i += 1;
            }
            done
        }));
    }
    let labels = "{engine_type=\"unified\",model_name=\"/models/test\",moe_ep_rank=\"0\",\
                  pp_rank=\"0\",tp_rank=\"0\"}";
    // More clients than the cap: the batch fills, and the rest wait in the queue.
    let deadline = Instant::now() + warmup + Duration::from_secs(10);
    let metrics = loop {
        let m = sim.metrics().await;
        if m.contains(&format!("\nsglang:num_running_reqs{labels} 72.0\n")) {
            break m;
        }
        assert!(Instant::now() < deadline, "the batch never filled:\n{m}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let queued: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix(&format!("sglang:num_queue_reqs{labels} ")))
        .unwrap()
        .parse()
        .unwrap();
    assert!((1.0..=18.0).contains(&queued), "{metrics}");
    let mut tokens = 0u64;
    for t in tasks {
        for (at, n) in t.await.unwrap() {
            if at >= warmup && at < warmup + window {
                tokens += n;
            }
        }
    }
    let measured = tokens as f64 / window.as_secs_f64();
    let ratio = measured / ideal;
    eprintln!("measured {measured:.0} tok/s vs ideal {ideal:.0} ({ratio:.3})");
    assert!(
        (0.95..=1.05).contains(&ratio),
        "measured {measured:.0} tok/s vs ideal {ideal:.0} ({ratio:.3})"
    );
    assert!(
        sim.log()
            .contains("Decode batch, #running-req: 72, #token: ")
    );
}

/// With the state-copy cost set to zero and a cap both strategies reach, extra_buffer's overlap
/// makes it the faster one: the knobs let a sweep find either winner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extra_buffer_wins_when_the_cap_does_not_bind() {
    let env = [("SGLANG_SIM_EXTRA_BUFFER_COPY_MS", "0")];
    // Only no_buffer needs overlap off; extra_buffer's overlap is its advantage.
    let strategies: [&[&str]; 2] = [
        &["no_buffer", "--disable-overlap-schedule"],
        &["extra_buffer"],
    ];
    let mut sims: Vec<Sim> = strategies
        .iter()
        .map(|s| {
            let mut args = vec![
                "--max-running-requests",
                "32",
                "--mamba-radix-cache-strategy",
            ];
            args.extend_from_slice(s);
            Sim::spawn(&args, &env)
        })
        .collect();
    let mut ideal = Vec::new();
    for sim in sims.iter_mut() {
        sim.wait_ready(Duration::from_secs(10)).await;
        let info = sim.get_json("/server_info").await;
        assert_eq!(
            info["internal_states"][0]["effective_max_running_requests_per_dp"],
            32
        );
        assert_eq!(info["max_running_requests"], 32);
        ideal.push(info["sim"]["ideal_output_tok_s"].as_f64().unwrap());
    }
    assert!(ideal[1] > 1.1 * ideal[0], "{ideal:?}");
}

/// `--stream-interval N` (SGLang's option): the first token at once, then chunks of N tokens,
/// with every token still delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_interval_batches_tokens_per_chunk() {
    let mut sim = Sim::spawn(&["--sim-time-scale", "500", "--stream-interval", "10"], &[]);
    sim.wait_ready(Duration::from_secs(10)).await;
    let (code, body) = sim
        .post(
            "/v1/chat/completions",
            json!({"model": "m", "messages": [{"role": "user", "content": "tell me"}],
                   "max_tokens": 41, "stream": true}),
        )
        .await;
    assert_eq!(code, 200);
    let events = sse_events(&body);
    let pieces: Vec<usize> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(|s| s.split(' ').filter(|w| !w.is_empty()).count())
        })
        .filter(|n| *n > 0)
        .collect();
    // Every token arrives; when each is sent is the scheduler's decision, tested exactly on
    // its virtual clock (a_stream_hears_the_first_token_then_every_interval).
    assert_eq!(pieces.iter().sum::<usize>(), 41, "{pieces:?}");
    assert!(
        pieces.len() <= 6,
        "about one chunk per 10 tokens, not one per token: {pieces:?}"
    );
}
