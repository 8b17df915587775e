//! Integration tests of the real `sglang-sim` binary on free loopback ports: command line,
//! readiness, signals, capacity by strategy, overflow errors and auth.

mod common;
mod sim_common;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sim_common::*;

#[test]
fn help_and_argparse_errors_follow_the_emulated_version() {
    let (code, help, _) = run(&["--help"], &[]);
    assert_eq!(code, 0);
    assert!(help.starts_with("usage: sglang.launch_server [-h] --model-path MODEL_PATH"));
    assert!(help.contains("sglang-sim emulating SGLang 0.5.23"));
    assert!(help.contains(
        "\n  --mamba-radix-cache-strategy {auto,no_buffer,extra_buffer,extra_buffer_lazy}\n"
    ));
    assert!(help.contains("\n  --sim-time-scale SIM_TIME_SCALE\n"));
    assert!(!help.contains("--mamba-scheduler-strategy"));

    let (_, help16, _) = run(&["--sim-version", "0.5.16", "--help"], &[]);
    assert!(help16.contains("sglang-sim emulating SGLang 0.5.16"));
    assert!(help16.contains("\n  --mamba-scheduler-strategy {auto,no_buffer,extra_buffer}\n"));
    assert!(help16.contains("\n  --cuda-graph-max-bs CUDA_GRAPH_MAX_BS\n"));

    let (code, _, err) = run(
        &[
            "--model-path",
            "/m",
            "--mamba-scheduler-strategy",
            "no_buffer",
        ],
        &[],
    );
    assert_eq!(code, 2);
    assert!(err.starts_with("usage: sglang.launch_server"));
    assert!(err.ends_with(
        "\nsglang.launch_server: error: unrecognized arguments: --mamba-scheduler-strategy no_buffer\n"
    ));

    let (code, _, err) = run(
        &[
            "--model-path",
            "/m",
            "--mamba-radix-cache-strategy",
            "bogus",
        ],
        &[],
    );
    assert_eq!(code, 2);
    assert!(err.ends_with(
        "sglang.launch_server: error: argument --mamba-radix-cache-strategy: invalid choice: \
         'bogus' (choose from 'auto', 'no_buffer', 'extra_buffer', 'extra_buffer_lazy')\n"
    ));

    // The version can come from the environment, as a profile's `env:` would set it.
    let (code, _, err) = run(
        &[
            "--model-path",
            "/m",
            "--mamba-radix-cache-strategy",
            "no_buffer",
        ],
        &[("SGLANG_SIM_VERSION", "0.5.10")],
    );
    assert_eq!(code, 2);
    assert!(err.contains("unrecognized arguments: --mamba-radix-cache-strategy no_buffer"));

    let (code, _, err) = run(&["--model-path", "/m", "--attention-backend"], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("error: argument --attention-backend: expected one argument"));

    let (code, _, err) = run(
        &["--model-path", "/m"],
        &[("SGLANG_SIM_TIME_SCALE", "fast")],
    );
    assert_eq!(code, 2);
    assert!(err.contains(
        "environment variable SGLANG_SIM_TIME_SCALE: invalid non-negative number: 'fast'"
    ));
}

/// srt/arg_groups/mamba_hook.py: 0.5.23 asserts overlap is off for an explicit no_buffer, after
/// argparse and before loading; 0.5.10 turned it off itself, with a warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_buffer_without_overlap_off_is_refused_at_start_from_0_5_15() {
    let t = Instant::now();
    let (code, _, err) = run(
        &[
            "--model-path",
            "/m",
            "--mamba-radix-cache-strategy",
            "no_buffer",
        ],
        &[],
    );
    assert_eq!(code, 1, "{err}");
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(
        err.starts_with("Traceback (most recent call last):"),
        "{err}"
    );
    assert!(err.contains("in validate_mamba_no_buffer"), "{err}");
    assert!(err.ends_with(
        "\nAssertionError: no_buffer do not support overlap schedule. Try to set disable_overlap_schedule=True.\n"
    ));
    let (code, _, err) = run(
        &[
            "--model-path",
            "/m",
            "--mamba-radix-cache-strategy",
            "no_buffer",
            "--disable-overlap-schedule",
            "--page-size",
            "16",
        ],
        &[],
    );
    assert_eq!(code, 1);
    assert!(
        err.ends_with("AssertionError: no_buffer only supports page_size=1.\n"),
        "{err}"
    );

    let mut old = Sim::spawn(
        &[
            "--sim-version",
            "0.5.10",
            "--mamba-scheduler-strategy",
            "no_buffer",
        ],
        &[],
    );
    old.wait_ready(Duration::from_secs(10)).await;
    assert!(
        old.log()
            .contains("Disabling overlap schedule since mamba no_buffer is not compatible"),
        "{}",
        old.log()
    );
    let info = old.get_json("/server_info").await;
    assert_eq!(info["disable_overlap_schedule"], true);
    assert_eq!(info["mamba_scheduler_strategy"], "no_buffer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_turns_200_after_the_load_and_sigterm_cleans_up() {
    let mut sim = Sim::spawn(
        &["--sim-startup-secs", "40", "--sim-time-scale", "50"],
        &[("CUDA_VISIBLE_DEVICES", "3,4")],
    );
    let seen = sim.wait_ready(Duration::from_secs(10)).await;
    // SGLang opens its port only after the load (connection refused), then answers 503 until
    // its warm-up generation is done (a window too short to catch every time).
    assert_eq!(
        seen.first(),
        Some(&None),
        "port closed while loading: {seen:?}"
    );
    assert!(
        seen.iter()
            .all(|h| matches!(h, None | Some(503) | Some(200))),
        "{seen:?}"
    );
    let log = sim.log();
    let ready_at = log
        .find("The server is fired up and ready to roll!")
        .unwrap();
    let cap_at = log.find("max_total_num_tokens=").unwrap();
    assert!(cap_at < ready_at);

    let files = sim.state_files();
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().unwrap().to_str().unwrap().to_string();
    assert_eq!(name, format!("gpu3-{}.json", sim.child.id()));
    let state: Value = serde_json::from_str(&std::fs::read_to_string(&files[0]).unwrap()).unwrap();
    let keys: Vec<&str> = state
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys.len(), 6);
    assert_eq!(state["gpu"], 3);
    assert_eq!(state["port"], sim.port);
    assert_eq!(state["memory_total_mib"], 97887);
    let used = state["memory_used_mib"].as_u64().unwrap();
    assert!(used > 80_000 && used < 97_887, "{used}");

    let t = Instant::now();
    sim.signal(libc::SIGTERM);
    let status = sim
        .wait_exit(Duration::from_secs(3))
        .await
        .expect("exits on SIGTERM");
    assert!(status.success(), "{status}");
    assert!(
        t.elapsed() < Duration::from_millis(1500),
        "{:?}",
        t.elapsed()
    );
    assert!(sim.state_files().is_empty());
    assert_eq!(sim.health().await, None, "port closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignored_sigterm_needs_sigkill_and_leaves_a_dead_pid_file() {
    let mut sim = Sim::spawn(&["--sim-ignore-sigterm"], &[]);
    sim.wait_ready(Duration::from_secs(10)).await;
    sim.signal(libc::SIGTERM);
    assert!(sim.wait_exit(Duration::from_millis(700)).await.is_none());
    assert_eq!(sim.health().await, Some(200));
    sim.signal(libc::SIGKILL);
    assert!(sim.wait_exit(Duration::from_secs(3)).await.is_some());
    assert_eq!(
        sim.state_files().len(),
        1,
        "SIGKILL leaves the file; readers check the pid"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_by_strategy_and_version() {
    let ts = "20";
    let cases: [(&[&str], u64, u64, &str); 6] = [
        (
            &[
                "--mamba-radix-cache-strategy",
                "no_buffer",
                "--disable-overlap-schedule",
            ],
            72,
            3,
            "no_buffer",
        ),
        (
            &["--mamba-radix-cache-strategy", "extra_buffer"],
            37,
            5,
            "extra_buffer",
        ),
        (
            &["--mamba-radix-cache-strategy", "extra_buffer_lazy"],
            46,
            4,
            "extra_buffer_lazy",
        ),
        (&[], 37, 5, "extra_buffer"),
        (
            &[
                "--sim-version",
                "0.5.10",
                "--mamba-scheduler-strategy",
                "auto",
            ],
            72,
            3,
            "no_buffer",
        ),
        (
            &[
                "--mamba-radix-cache-strategy",
                "no_buffer",
                "--disable-radix-cache",
                "--max-running-requests",
                "100",
            ],
            100,
            1,
            "no_buffer",
        ),
    ];
    let mut sims: Vec<Sim> = cases
        .iter()
        .map(|(args, ..)| {
            let mut a = vec!["--sim-time-scale", ts, "--context-length", "8192"];
            a.extend_from_slice(args);
            Sim::spawn(&a, &[])
        })
        .collect();
    for (sim, (args, cap, slots, strategy)) in sims.iter_mut().zip(cases.iter()) {
        sim.wait_ready(Duration::from_secs(10)).await;
        let info = sim.get_json("/server_info").await;
        assert_eq!(
            info["internal_states"][0]["effective_max_running_requests_per_dp"], *cap,
            "{args:?}"
        );
        assert_eq!(info["sim"]["slots_per_request"], *slots, "{args:?}");
        assert_eq!(info["sim"]["mamba_strategy"], *strategy);
        assert_eq!(
            sim.get_json("/get_server_info").await["version"],
            info["version"]
        );
        assert!(info["max_total_num_tokens"].as_u64().unwrap() > 100_000);
        let log = sim.log();
        let line = log
            .lines()
            .find(|l| l.contains("max_total_num_tokens="))
            .unwrap();
        assert!(line.contains(&format!(", max_running_requests={cap}, context_len=8192, ")));
        assert!(line.contains(", ideal_output_tok_s="));
        let models = sim.get_json("/v1/models").await;
        assert_eq!(models["data"][0]["max_model_len"], 8192);
        assert_eq!(models["data"][0]["id"], "/models/test");
    }
    let info = sims[0].get_json("/model_info").await;
    assert_eq!(info["model_path"], "/models/test");
    assert_eq!(info["is_generation"], true);
    assert_eq!(sims[0].get_json("/get_model_info").await, info);
    let (code, body) = sims[0].post("/flush_cache", json!({})).await;
    assert_eq!((code, body.lines().next()), (200, Some("Cache flushed.")));
    let r = sims[0].http.get(sims[0].url("/nope")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"detail": "Not Found"})
    );
    assert_eq!(sims[0].get_json("/server_info").await["version"], "0.5.23");
    assert_eq!(sims[4].get_json("/server_info").await["version"], "0.5.10");
    // The calibration story, in wall-clock terms at this time scale.
    let ideal = |v: &Value| v["sim"]["ideal_output_tok_s"].as_f64().unwrap() / 20.0;
    let nb = ideal(&sims[0].get_json("/server_info").await);
    let eb = ideal(&sims[1].get_json("/server_info").await);
    assert!((nb - 1180.0).abs() < 20.0, "no_buffer {nb}");
    assert!((eb - 107.0).abs() < 3.0, "extra_buffer {eb}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn context_overflow_errors_match_sglang() {
    let mut sim = Sim::spawn(
        &["--sim-time-scale", "1000", "--context-length", "1000"],
        &[],
    );
    sim.wait_ready(Duration::from_secs(10)).await;
    // 4400 characters are 1100 tokens; a chat adds 4 per message and 3 for the reply prefix.
    let long = "abcd".repeat(1100);
    let (code, body) = sim
        .post(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": long}], "max_tokens": 10}),
        )
        .await;
    assert_eq!(code, 400);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        v,
        json!({"object": "error", "type": "BadRequestError", "param": null, "code": 400,
               "message": "The input (1107 tokens) is longer than the model's context length (1000 tokens)."})
    );

    let (code, body) = sim
        .post(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "abcd".repeat(100)}], "max_tokens": 900}),
        )
        .await;
    assert_eq!(code, 400);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        v["message"],
        "Requested token count exceeds the model's maximum context length of 1000 tokens. You \
         requested a total of 1007 tokens: 107 tokens from the input messages and 900 tokens for \
         the completion. Please reduce the number of tokens in the input messages or the \
         completion to fit within the limit."
    );
    // fleet's retry: max_tokens = C - P - 1 fits.
    let (code, body) = sim
        .post(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "abcd".repeat(100)}], "max_tokens": 892}),
        )
        .await;
    assert_eq!(code, 200, "{body}");

    let (code, body) = sim
        .post(
            "/generate",
            json!({"text": long, "sampling_params": {"max_new_tokens": 8}}),
        )
        .await;
    assert_eq!(code, 400);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        json!({"error": {"message": "The input (1100 tokens) is longer than the model's context length (1000 tokens)."}})
    );
    // tokenizer_manager.py refuses prompt + max_new_tokens *over* the context, not at it.
    let (code, body) = sim
        .post(
            "/v1/completions",
            json!({"prompt": "abcd", "max_tokens": 999}),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = sim
        .post(
            "/v1/completions",
            json!({"prompt": "abcd", "max_tokens": 1000}),
        )
        .await;
    assert_eq!(code, 400);
    assert!(body.contains(
        "You requested a total of 1001 tokens: 1 tokens from the input messages and 1000 tokens"
    ));

    // Chat checks the output tokens asked for against the context before tokenizing, with
    // `max_completion_tokens` winning over `max_tokens` (serving_chat.py, protocol.py).
    let (code, body) = sim
        .post(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10,
                   "max_completion_tokens": 1001}),
        )
        .await;
    assert_eq!(code, 400);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["message"],
        "max_completion_tokens is too large: 1001.This model supports at most 1000 completion tokens."
    );

    // The scheduler's own limit, min(C - 1, KV - 1) - 5 = 994 here: a prompt of 994 tokens
    // passes the tokenizer's check but never runs.
    for (tokens, code_wanted) in [(993, 200), (994, 400), (999, 400)] {
        let (code, body) = sim
            .post(
                "/generate",
                json!({"text": "abcd".repeat(tokens), "sampling_params": {"max_new_tokens": 1}}),
            )
            .await;
        assert_eq!(code, code_wanted, "{tokens} tokens: {body}");
        if code == 400 {
            assert_eq!(
                serde_json::from_str::<Value>(&body).unwrap()["error"]["message"],
                format!(
                    "Input length ({tokens} tokens) exceeds the maximum allowed length (994 \
                     tokens). Use a shorter input or enable --allow-auto-truncate."
                )
            );
        }
    }
    // Streamed, the tokenizer's refusal is still a plain 400 on the OpenAI routes (serving_base
    // primes the first chunk); the scheduler's arrives as an error event.
    let (code, body) = sim
        .post(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "abcd".repeat(300)}],
                   "max_tokens": 900, "stream": true}),
        )
        .await;
    assert_eq!(code, 400, "{body}");
    let (code, body) = sim
        .post(
            "/v1/completions",
            json!({"prompt": "abcd".repeat(995), "max_tokens": 1, "stream": true}),
        )
        .await;
    assert_eq!(code, 200);
    assert!(
        body.contains("exceeds the maximum allowed length"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_auth_guards_everything_but_health_and_metrics() {
    let mut sim = Sim::spawn(&["--api-key", "s3cret", "--enable-metrics"], &[]);
    sim.wait_ready(Duration::from_secs(10)).await;
    let get = |path: &str, key: Option<&str>| {
        let mut r = sim.http.get(sim.url(path));
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        async move { r.send().await.unwrap() }
    };
    let r = get("/v1/models", None).await;
    assert_eq!(r.status(), 401);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"error": "Unauthorized"})
    );
    assert_eq!(get("/v1/models", Some("wrong")).await.status(), 401);
    assert_eq!(get("/v1/models", Some("s3cret")).await.status(), 200);
    assert_eq!(get("/server_info", None).await.status(), 401);
    assert_eq!(get("/health", None).await.status(), 200);
    assert_eq!(get("/metrics", None).await.status(), 200);
    let r = sim
        .http
        .post(sim.url("/generate"))
        .json(&json!({"text": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let info = get("/server_info", Some("s3cret"))
        .await
        .json::<Value>()
        .await
        .unwrap();
    // 0.5.23's /server_info returns the key in plain text (srt/utils/common.py
    // `build_server_info`): fleet, not the server, keeps it out of what it shows.
    assert_eq!(
        info["api_key"], "s3cret",
        "the key is echoed back, as SGLang does"
    );
}
