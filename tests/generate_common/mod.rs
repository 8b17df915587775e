//! Shared helpers for the `fleet generate` tests: a small SGLang stand-in served in-process,
//! prompt files, and readers that check every id is in the output exactly once. Tests reach it as
//! `common::generate`; benches/generate.rs includes this file by its path.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

/// How the stand-in behaves.
#[derive(Clone)]
pub struct StubSpec {
    pub cap: u64,
    pub context_len: u64,
    pub latency: Duration,
    /// Every n-th generation answers 503.
    pub fail_every: Option<u64>,
    /// Keep `seen` (off for benchmarks that send millions of requests).
    pub record: bool,
}

impl Default for StubSpec {
    fn default() -> Self {
        StubSpec {
            cap: 8,
            context_len: 8192,
            latency: Duration::from_millis(2),
            fail_every: None,
            record: true,
        }
    }
}

pub struct StubState {
    spec: StubSpec,
    in_flight: AtomicU64,
    pub requests: AtomicU64,
    /// (prompt tokens, max tokens) of every generation request, in arrival order.
    pub seen: std::sync::Mutex<Vec<(u64, u64)>>,
}

pub struct Stub {
    pub url: String,
    pub state: Arc<StubState>,
    alive: tokio::sync::watch::Sender<bool>,
}

/// `TOKENS=N rest` declares an N-token prompt; otherwise one token per word.
fn prompt_tokens(text: &str) -> u64 {
    text.strip_prefix("TOKENS=")
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| text.split_whitespace().count() as u64)
}

fn overflow(p: u64, m: u64, c: u64) -> Option<Response> {
    let msg = if p >= c {
        format!("The input ({p} tokens) is longer than the model's context length ({c} tokens).")
    } else if p + m > c {
        format!(
            "Requested token count exceeds the model's maximum context length of {c} tokens. You requested a total of {} tokens: {p} tokens from the input messages and {m} tokens for the completion. Please reduce the number of tokens in the input messages or the completion to fit within the limit.",
            p + m
        )
    } else {
        return None;
    };
    Some(
        (
            StatusCode::BAD_REQUEST,
            Json(json!({"object": "error", "message": msg, "code": 400})),
        )
            .into_response(),
    )
}

async fn admit(s: &StubState, p: u64, m: u64) -> Result<u64, Response> {
    let n = s.requests.fetch_add(1, Ordering::SeqCst) + 1;
    if s.spec.record {
        s.seen.lock().unwrap().push((p, m));
    }
    if let Some(r) = overflow(p, m, s.spec.context_len) {
        return Err(r);
    }
    if s.spec.fail_every.is_some_and(|k| n.is_multiple_of(k)) {
        return Err((StatusCode::SERVICE_UNAVAILABLE, "injected failure").into_response());
    }
    if !s.spec.latency.is_zero() {
        s.in_flight.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(s.spec.latency).await;
        s.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
    Ok(m.min(7))
}

/// A streamed answer as SGLang sends it: each chunk a `data:` event, then `[DONE]`.
fn sse(chunks: &[Value]) -> Response {
    let mut body = String::new();
    for c in chunks {
        body.push_str("data: ");
        body.push_str(&c.to_string());
        body.push_str("\n\n");
    }
    body.push_str("data: [DONE]\n\n");
    (
        [(axum::http::header::CONTENT_TYPE, "text/event-stream")],
        body,
    )
        .into_response()
}

fn streamed(body: &Value) -> bool {
    body["stream"] == json!(true)
}

async fn generate_route(State(s): State<Arc<StubState>>, Json(body): Json<Value>) -> Response {
    let text = body["text"].as_str().unwrap_or_default().to_string();
    let p = prompt_tokens(&text);
    let m = body["sampling_params"]["max_new_tokens"]
        .as_u64()
        .unwrap_or(128);
    match admit(&s, p, m).await {
        Ok(c) => {
            let answer = json!({"text": format!("echo:{text}"), "meta_info": {
                "prompt_tokens": p, "completion_tokens": c,
                "finish_reason": {"type": "length", "length": c}, "e2e_latency": 0.01}});
            // Streamed, the last chunk is the whole answer (srt/entrypoints/http_server.py).
            if streamed(&body) {
                sse(&[answer])
            } else {
                Json(answer).into_response()
            }
        }
        Err(r) => r,
    }
}

async fn chat(State(s): State<Arc<StubState>>, Json(body): Json<Value>) -> Response {
    let text = body["messages"][0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let p = prompt_tokens(&text);
    let m = body["max_tokens"].as_u64().unwrap_or(128);
    match admit(&s, p, m).await {
        Ok(c) if streamed(&body) => {
            let usage = json!({"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c});
            sse(&[
                json!({"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0,
                    "delta": {"role": "assistant", "content": format!("chat:{text}")},
                    "finish_reason": "stop"}], "usage": usage}),
                json!({"id": "x", "object": "chat.completion.chunk", "choices": [], "usage": usage}),
            ])
        }
        Ok(c) => Json(json!({"id": "x", "object": "chat.completion", "choices": [{"index": 0,
            "message": {"role": "assistant", "content": format!("chat:{text}")}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}}))
        .into_response(),
        Err(r) => r,
    }
}

async fn server_info(State(s): State<Arc<StubState>>) -> Response {
    Json(json!({"version": "stub", "max_total_num_tokens": 100000, "context_length": s.spec.context_len,
        "served_model_name": "stub-model", "max_running_requests": null,
        "internal_states": [{"effective_max_running_requests_per_dp": s.spec.cap}]}))
    .into_response()
}

async fn health() -> StatusCode {
    StatusCode::OK
}

async fn metrics(State(s): State<Arc<StubState>>) -> String {
    let f = s.in_flight.load(Ordering::SeqCst);
    let running = f.min(s.spec.cap);
    format!(
        "sglang:num_running_reqs{{model_name=\"stub\"}} {running}\nsglang:num_queue_reqs{{model_name=\"stub\"}} {}\n",
        f - running
    )
}

/// Starts a stand-in on 127.0.0.1 on its own runtime thread. It serves while the returned
/// handle lives, and can be stopped (its port then refuses connections) and started again.
pub fn start_stub(spec: StubSpec) -> Stub {
    let state = Arc::new(StubState {
        spec,
        in_flight: AtomicU64::new(0),
        requests: AtomicU64::new(0),
        seen: std::sync::Mutex::new(Vec::new()),
    });
    let app = Router::new()
        .route("/generate", post(generate_route))
        .route("/v1/chat/completions", post(chat))
        .route("/server_info", get(server_info))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .with_state(state.clone());
    let (alive_tx, mut alive) = tokio::sync::watch::channel(true);
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let mut addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
            loop {
                let socket = tokio::net::TcpSocket::new_v4().unwrap();
                socket.set_reuseaddr(true).unwrap();
                socket.bind(addr).unwrap();
                let listener = socket.listen(1024).unwrap();
                if addr.port() == 0 {
                    addr = listener.local_addr().unwrap();
                    addr_tx.send(addr).unwrap();
                }
                let mut stop = alive.clone();
                axum::serve(listener, app.clone())
                    .with_graceful_shutdown(async move {
                        let _ = stop.wait_for(|a| !*a).await;
                    })
                    .await
                    .unwrap();
                // A dropped handle (sender gone) ends the stand-in for good.
                if alive.has_changed().is_err() || alive.wait_for(|a| *a).await.is_err() {
                    return;
                }
            }
        });
    });
    let addr = addr_rx.recv().unwrap();
    Stub {
        url: format!("http://{addr}"),
        state,
        alive: alive_tx,
    }
}

impl Stub {
    /// Stops serving: the port refuses connections until [`Stub::start`].
    pub fn stop(&self) {
        self.alive.send(false).unwrap();
    }

    pub fn start(&self) {
        self.alive.send(true).unwrap();
    }

    /// Requests it has been sent since it was made, answered or not.
    pub fn requests(&self) -> u64 {
        self.state.requests.load(Ordering::SeqCst)
    }

    /// Waits until it has been sent `n` requests since it was made.
    pub fn wait_requests(&self, n: u64) {
        let t0 = std::time::Instant::now();
        while self.requests() < n {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "{} was sent {} requests, not {n}",
                self.url,
                self.requests()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Writes `n` prompts `{"id":"p{i}","prompt":...}`.
pub fn write_prompts(path: &Path, n: usize) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for i in 0..n {
        writeln!(
            f,
            "{}",
            json!({"id": format!("p{i}"), "prompt": format!("prompt number {i}")})
        )
        .unwrap();
    }
}

/// A temp dir holding `prompts.jsonl` with `n` prompts (see [`write_prompts`]), and the path of
/// an output dir in it: `(dir, prompts, out)`.
pub fn prompts_and_out(n: usize) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let prompts = dir.path().join("prompts.jsonl");
    write_prompts(&prompts, n);
    let out = dir.path().join("out");
    (dir, prompts, out)
}

pub fn write_lines(path: &Path, lines: &[String]) {
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

fn id_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The completion shards in `dir`, in order; none while it does not exist yet.
fn shards(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut shards: Vec<_> = entries
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("completions-")
        })
        .collect();
    shards.sort();
    shards
}

/// Every line of every completion shard, in shard order.
pub fn completions(dir: &Path) -> Vec<Value> {
    shards(dir).iter().flat_map(|p| read_jsonl(p)).collect()
}

/// Whole lines in the completion shards so far, while a job may still be writing them.
pub fn lines_written(dir: &Path) -> usize {
    shards(dir)
        .iter()
        .map(|p| std::fs::read(p).map_or(0, |b| b.iter().filter(|c| **c == b'\n').count()))
        .sum()
}

pub fn failures(dir: &Path) -> Vec<Value> {
    let p = dir.join("failed.jsonl");
    if p.exists() { read_jsonl(&p) } else { vec![] }
}

/// `retry.jsonl`: prompts the servers kept failing, which `--resume` sends again.
pub fn retries(dir: &Path) -> Vec<Value> {
    let p = dir.join("retry.jsonl");
    if p.exists() { read_jsonl(&p) } else { vec![] }
}

/// Parses a JSONL file, failing the test on any torn or invalid line.
pub fn read_jsonl(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(
        text.is_empty() || text.ends_with('\n'),
        "{} ends in a torn line",
        path.display()
    );
    text.lines()
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("{}:{}: {e}: {l}", path.display(), i + 1))
        })
        .collect()
}

/// How often each id occurs across the shards and failed.jsonl.
pub fn id_counts(dir: &Path) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for v in completions(dir).iter().chain(failures(dir).iter()) {
        *counts.entry(id_text(&v["id"])).or_insert(0) += 1;
    }
    counts
}

/// Asserts ids `p0..p{n}` each appear exactly once across output and failures.
pub fn assert_exactly_once(dir: &Path, n: usize) {
    let counts = id_counts(dir);
    let dups: Vec<_> = counts.iter().filter(|(_, c)| **c > 1).collect();
    assert!(
        dups.is_empty(),
        "ids written more than once: {:?}",
        &dups[..dups.len().min(10)]
    );
    let missing: Vec<_> = (0..n)
        .map(|i| format!("p{i}"))
        .filter(|id| !counts.contains_key(id))
        .collect();
    assert!(
        missing.is_empty(),
        "{} ids missing, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    assert_eq!(counts.len(), n);
}

/// Every progress.json the job writing to `out` shows while `child` runs (written atomically,
/// a few times a second at [`SEED_SPEED_SCALE`]), each at the job's own elapsed time in
/// real-speed seconds; returns once the child has exited, with how it did.
pub fn watch_progress(
    child: &mut std::process::Child,
    out: &Path,
    limit: Duration,
) -> (std::process::ExitStatus, Vec<(f64, Value)>) {
    let mut seen: Vec<(f64, Value)> = Vec::new();
    let start = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return (status, seen);
        }
        assert!(start.elapsed() < limit, "the job hangs");
        if let Ok(text) = std::fs::read_to_string(out.join("progress.json"))
            && let Ok(p) = serde_json::from_str::<Value>(&text)
        {
            let at = p["elapsed_hours"].as_f64().unwrap_or(0.0) * 3600.0 * SEED_SPEED_SCALE;
            if seen.last().is_none_or(|l| l.0 < at) {
                seen.push((at, p));
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn progress(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("progress.json")).unwrap()).unwrap()
}

pub fn fleet() -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_fleet"));
    c.env_remove("FLEET_CONFIG")
        .env_remove("FLEET_API_KEY")
        .env("NO_COLOR", "1");
    c
}

/// `fleet generate --prompts PROMPTS --out OUT` with a `--url` for each of `urls`.
pub fn generate(out: &Path, prompts: &Path, urls: &[&str]) -> std::process::Command {
    let mut c = fleet();
    c.arg("generate")
        .arg("--prompts")
        .arg(prompts)
        .arg("--out")
        .arg(out);
    for u in urls {
        c.arg("--url").arg(u);
    }
    c
}

/// A real `sglang-sim` process on a free loopback port, killed when dropped.
pub struct Sim {
    child: std::process::Child,
    pub port: u16,
    pub url: String,
    _dir: tempfile::TempDir,
}

fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((status, body))
}

/// How much faster than real time [`Sim::at_seed_speed`] runs; fleet's cadences are shortened
/// by as much (`FLEET_TIME_SCALE`), so that fleet sees the job as a user would at real speed.
pub const SEED_SPEED_SCALE: f64 = 20.0;

impl Sim {
    /// Starts `sglang-sim` with a short load and metrics on, plus `args`, and waits until ready.
    pub fn start(args: &[&str]) -> Sim {
        Sim::launch(None, None, args)
    }

    /// A sim at the seed's speed (no_buffer with overlap off: cap 72, about 1,180 output tok/s)
    /// whose output lengths follow `dist` (`--sim-output-dist`) drawn with `seed`, run
    /// [`SEED_SPEED_SCALE`] times faster than real time. It streams a chunk per 8 decode steps,
    /// as the demo does: one per token is 20 times as many chunks at 20x, on 2 cores.
    pub fn at_seed_speed(dist: &str, seed: u64) -> Sim {
        let (scale, seed) = (SEED_SPEED_SCALE.to_string(), seed.to_string());
        Sim::start(&[
            "--mamba-radix-cache-strategy",
            "no_buffer",
            "--disable-overlap-schedule",
            "--sim-time-scale",
            &scale,
            "--sim-output-dist",
            dist,
            "--sim-output-seed",
            &seed,
            "--stream-interval",
            "8",
        ])
    }

    /// The sim's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// [`Sim::start`] on GPU `gpu`, its memory recorded in `state_dir` where the fake
    /// `nvidia-smi` reads it.
    pub fn start_on_gpu(gpu: u32, state_dir: &Path, args: &[&str]) -> Sim {
        Sim::launch(Some(gpu), Some(state_dir), args)
    }

    fn launch(gpu: Option<u32>, state_dir: Option<&Path>, args: &[&str]) -> Sim {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = std::fs::File::create(dir.path().join("log")).unwrap();
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_sglang-sim"));
        cmd.args([
            "--model-path",
            "/models/test",
            "--port",
            &port.to_string(),
            "--enable-metrics",
        ])
        .args(["--sim-startup-secs", "0.2"])
        .arg("--sim-gpu-state-dir")
        .arg(state_dir.map_or_else(|| dir.path().join("gpus"), Path::to_path_buf))
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::from(log.try_clone().unwrap()))
        .stderr(std::process::Stdio::from(log));
        match gpu {
            Some(g) => cmd.env("CUDA_VISIBLE_DEVICES", g.to_string()),
            None => cmd.env_remove("CUDA_VISIBLE_DEVICES"),
        };
        let child = cmd.spawn().unwrap();
        let mut sim = Sim {
            child,
            port,
            url: format!("http://127.0.0.1:{port}"),
            _dir: dir,
        };
        let t0 = std::time::Instant::now();
        while http_get(port, "/health").map(|(s, _)| s) != Some(200) {
            if let Some(st) = sim.child.try_wait().unwrap() {
                panic!("sglang-sim exited ({st}) before ready: {}", sim.log());
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "sglang-sim not ready: {}",
                sim.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        sim
    }

    pub fn server_info(&self) -> Value {
        let (status, body) = http_get(self.port, "/server_info").expect("sim answers");
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    }

    /// The sim's own ideal output tok/s for its config (at its time scale).
    pub fn ideal_output_tok_s(&self) -> f64 {
        self.server_info()["sim"]["ideal_output_tok_s"]
            .as_f64()
            .expect("sim.ideal_output_tok_s")
    }

    pub fn cap(&self) -> u64 {
        self.server_info()["internal_states"][0]["effective_max_running_requests_per_dp"]
            .as_u64()
            .unwrap()
    }

    /// The sim's `sglang:generation_tokens_total`.
    pub fn generated_tokens(&self) -> f64 {
        let (_, body) = http_get(self.port, "/metrics").expect("sim answers /metrics");
        fleet::sglang::metrics::parse(&body)
            .generation_tokens_total
            .expect("generation_tokens_total")
    }

    /// Kills the process and waits for it.
    pub fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// The CPU time (user + system) the process has used so far, from `/proc/PID/stat`.
    pub fn cpu_secs(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))
            .expect("the sim's /proc/PID/stat");
        // The command name (field 2) may hold spaces; utime and stime are fields 14 and 15.
        let after_name = &stat[stat.rfind(')').expect("stat has a (comm)") + 2..];
        let fields: Vec<&str> = after_name.split(' ').collect();
        let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
        // SAFETY: sysconf reads a constant of the system.
        ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
    }

    /// Whether the process has exited.
    pub fn exited(&mut self) -> bool {
        self.child.try_wait().unwrap().is_some()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("log")).unwrap_or_default()
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
