//! Integration tests of the real `sglang-sim` binary on free loopback ports: command line,
//! readiness, capacity by strategy, overflow errors, auth, SSE framing, fault injection,
//! signals, metrics, and measured throughput against the reported ideal.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_sglang-sim");

struct Sim {
    child: Child,
    port: u16,
    _port: common::Ports,
    dir: tempfile::TempDir,
    http: reqwest::Client,
}

impl Sim {
    /// Starts the sim with a fast default load (0.2 s); `args` come last so they win.
    fn spawn(args: &[&str], env: &[(&str, &str)]) -> Sim {
        let dir = tempfile::tempdir().unwrap();
        let reserved = common::reserve_ports(1);
        let port = reserved.base;
        let log = std::fs::File::create(dir.path().join("log")).unwrap();
        let mut cmd = Command::new(BIN);
        cmd.args(["--model-path", "/models/test", "--port", &port.to_string()])
            .args(["--sim-startup-secs", "0.2"])
            .arg("--sim-gpu-state-dir")
            .arg(dir.path().join("gpus"))
            .args(args)
            .env_remove("CUDA_VISIBLE_DEVICES")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log));
        for (k, v) in env {
            cmd.env(k, v);
        }
        Sim {
            child: cmd.spawn().unwrap(),
            port,
            _port: reserved,
            dir,
            http: reqwest::Client::new(),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    fn state_files(&self) -> Vec<PathBuf> {
        match std::fs::read_dir(self.dir.path().join("gpus")) {
            Ok(rd) => rd
                .map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|x| x == "json"))
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    async fn health(&self) -> Option<u16> {
        self.http
            .get(self.url("/health"))
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .ok()
            .map(|r| r.status().as_u16())
    }

    /// Polls /health until 200; returns every status seen (None: no answer).
    async fn wait_ready(&mut self, limit: Duration) -> Vec<Option<u16>> {
        let start = Instant::now();
        let mut seen = Vec::new();
        loop {
            let h = self.health().await;
            if seen.last() != Some(&h) {
                seen.push(h);
            }
            if h == Some(200) {
                return seen;
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("sim exited ({status}) before ready:\n{}", self.log());
            }
            assert!(
                start.elapsed() < limit,
                "not ready after {limit:?}:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Some(s) = self.child.try_wait().unwrap() {
                return Some(s);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    fn signal(&self, sig: i32) {
        let pid = i32::try_from(self.child.id()).unwrap();
        // SAFETY: kill(2) on the child this test spawned and still owns.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
    }

    async fn get_json(&self, path: &str) -> Value {
        let r = self.http.get(self.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "GET {path}");
        r.json().await.unwrap()
    }

    async fn post(&self, path: &str, body: Value) -> (u16, String) {
        let r = self
            .http
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `data:` payloads of an SSE body, checking the framing of every event.
fn sse_events(body: &str) -> Vec<String> {
    assert!(
        body.ends_with("\n\n"),
        "SSE body must end with a blank line"
    );
    body.trim_end_matches("\n\n")
        .split("\n\n")
        .map(|e| {
            e.strip_prefix("data: ")
                .unwrap_or_else(|| panic!("event without data: prefix: {e:?}"))
                .to_string()
        })
        .collect()
}

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
    assert_ne!(info["api_key"], "s3cret", "the key is not echoed back");
}

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
    let metrics = sim
        .http
        .get(sim.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // The warm-up generation (1 token) counts too, as in SGLang.
    assert!(
        metrics.contains(&format!(
            "sglang:generation_tokens_total{{model_name=\"/models/test\"}} {}.0",
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
    tokio::time::sleep(warmup + Duration::from_secs(1)).await;
    let metrics = sim
        .http
        .get(sim.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let labels = "{engine_type=\"unified\",model_name=\"/models/test\",tp_rank=\"0\"}";
    assert!(
        metrics.contains(&format!("\nsglang:num_running_reqs{labels} 72.0\n")),
        "{metrics}"
    );
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
