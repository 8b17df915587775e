//! The sim held to the real SGLang 0.5.23 server: the same requests go to both (completions,
//! chat and `/generate`, streamed and not, at the context limit, over it, with `max_tokens`
//! over it, with a bad parameter, without the API key; the health, `server_info`, `v1/models`
//! and metrics routes), and their status codes, JSON and SSE shapes, error texts and start-up
//! order must agree, except for the differences on purpose listed in [`ON_PURPOSE`]. Both run
//! with `--chunked-prefill-size 64 --schedule-conservativeness 0.5`: a long prompt must be
//! prefilled in the same chunks, and both must report the same new-token ratio.

mod common;

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::real::{CONTEXT, CPU_ARGS, RealSglang};
use serde_json::{Value, json};

const KEY: &str = "conformance-key";

/// Where the sim differs from 0.5.23 on purpose: (case, JSON path or `*` for the whole case,
/// why). A path is a shape path as [`shape`] writes it.
const ON_PURPOSE: &[(&str, &str, &str)] = &[
    (
        "server_info",
        ".sim",
        "the sim's own figures (its ideal throughput, its model), which the tests read",
    ),
    (
        "server_info",
        ".elastic_ep_join_mode",
        "the sim names a few server args after their flag, where ServerArgs keeps another \
         field; fleet reads none of them",
    ),
    ("server_info", ".elastic_ep_join_rank_offset", "as above"),
    ("server_info", ".fp4_gemm_backend", "as above"),
    ("server_info", ".fp8_gemm_backend", "as above"),
    ("server_info", ".monokernel_backend", "as above"),
];

/// A server under test and its start-up as a client saw it.
struct Server {
    name: &'static str,
    child: Child,
    log: std::path::PathBuf,
    /// What /health answered, in order, each change once: `refused`, `503`, `200`.
    startup: Vec<String>,
}

impl Drop for Server {
    fn drop(&mut self) {
        // SIGTERM (the launcher takes its scheduler and detokenizer down with it), then reap.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(30) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts `cmd` (its server on `port`) and watches /health until 200, recording each change.
fn start(name: &'static str, mut cmd: Command, port: u16, dir: &std::path::Path) -> Server {
    let log = dir.join(format!("{name}.log"));
    let f = std::fs::File::create(&log).unwrap();
    cmd.stdin(Stdio::null())
        .stdout(Stdio::from(f.try_clone().unwrap()))
        .stderr(Stdio::from(f));
    let child = cmd.spawn().unwrap();
    let mut server = Server {
        name,
        child,
        log,
        startup: vec![],
    };
    let client = client();
    let t = Instant::now();
    loop {
        let seen = match client.get(format!("http://127.0.0.1:{port}/health")) {
            Err(_) => "refused".to_string(),
            Ok((status, _, _)) => status.to_string(),
        };
        if server.startup.last() != Some(&seen) {
            server.startup.push(seen.clone());
        }
        if seen == "200" {
            return server;
        }
        if let Ok(Some(st)) = server.child.try_wait() {
            panic!(
                "{name} exited ({st}) before ready:\n{}",
                std::fs::read_to_string(&server.log).unwrap_or_default()
            );
        }
        assert!(
            t.elapsed() < Duration::from_secs(900),
            "{name} not ready after 15 min"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A minimal blocking HTTP/1.0 client (no keep-alive, no chunking): what both servers answer
/// is read exactly as sent, SSE frames included.
mod http {
    use std::io::{Read, Write};
    use std::time::Duration;

    pub struct Client;

    pub fn client() -> Client {
        Client
    }

    /// Status, content type and body.
    pub type Answer = (u16, String, String);

    impl Client {
        pub fn get(&self, url: String) -> std::io::Result<Answer> {
            self.send("GET", &url, None, None)
        }

        pub fn send(
            &self,
            method: &str,
            url: &str,
            body: Option<&str>,
            key: Option<&str>,
        ) -> std::io::Result<Answer> {
            let rest = url.strip_prefix("http://").expect("http URL");
            let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            let mut s = std::net::TcpStream::connect(host)?;
            s.set_read_timeout(Some(Duration::from_secs(120)))?;
            let mut req = format!("{method} {path} HTTP/1.0\r\nHost: {host}\r\n");
            if let Some(k) = key {
                req.push_str(&format!("Authorization: Bearer {k}\r\n"));
            }
            if let Some(b) = body {
                req.push_str(&format!(
                    "Content-Type: application/json\r\nContent-Length: {}\r\n",
                    b.len()
                ));
            }
            req.push_str("\r\n");
            req.push_str(body.unwrap_or(""));
            s.write_all(req.as_bytes())?;
            let mut raw = Vec::new();
            s.read_to_end(&mut raw)?;
            let text = String::from_utf8_lossy(&raw).into_owned();
            let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
            let status = head
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            let ctype = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-type")
                        .then(|| v.trim().to_string())
                })
                .unwrap_or_default();
            Ok((status, ctype, body.to_string()))
        }
    }
}

use http::{Answer, client};

/// The shape of a JSON value: one `path: type` line per leaf and container, array items
/// merged under `[]`. Null is its own type.
fn shape(v: &Value, path: &str, out: &mut BTreeSet<String>) {
    let kind = match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    out.insert(format!("{path}: {kind}"));
    match v {
        Value::Array(items) => items
            .iter()
            .for_each(|i| shape(i, &format!("{path}[]"), out)),
        Value::Object(m) => m
            .iter()
            .for_each(|(k, i)| shape(i, &format!("{path}.{k}"), out)),
        _ => {}
    }
}

/// Digits masked, so that texts that differ only in token counts compare equal.
fn masked(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if c.is_ascii_digit() {
            if !out.ends_with('#') {
                out.push('#');
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// What a case compares: the status, and per JSON document (the body, or each SSE frame) its
/// shape and its error text; SSE frames end with `[DONE]`.
#[derive(Debug)]
struct Seen {
    status: u16,
    stream: bool,
    frames: Vec<Value>,
    done: bool,
}

fn seen((status, ctype, body): Answer) -> Seen {
    let stream = ctype.starts_with("text/event-stream");
    if !stream {
        let v = serde_json::from_str(&body).unwrap_or(Value::String(body));
        return Seen {
            status,
            stream,
            frames: vec![v],
            done: false,
        };
    }
    let mut frames = vec![];
    let mut done = false;
    for event in body.split("\n\n").filter(|e| !e.trim().is_empty()) {
        let data = event
            .strip_prefix("data: ")
            .unwrap_or_else(|| panic!("an SSE frame that is not `data: `: {event:?}"));
        if data == "[DONE]" {
            done = true;
        } else {
            frames.push(serde_json::from_str(data).expect("a JSON frame"));
        }
    }
    Seen {
        status,
        stream,
        frames,
        done,
    }
}

fn error_text(v: &Value) -> Option<String> {
    v.pointer("/error/message")
        .or_else(|| v.get("message"))
        .or_else(|| v.get("error").filter(|e| e.is_string()))
        .or_else(|| v.pointer("/meta_info/finish_reason/message"))
        .and_then(Value::as_str)
        .map(masked)
}

/// Whether `path` (or a whole case, `*`) of `case` differs on purpose: a listed path covers
/// what lies under it.
fn on_purpose(case: &str, path: &str) -> bool {
    ON_PURPOSE.iter().any(|(c, p, _)| {
        *c == case
            && (*p == "*"
                || path == *p
                || path.starts_with(&format!("{p}."))
                || path.starts_with(&format!("{p}[")))
    })
}

/// Every difference between the two answers to one case, except those on purpose.
fn differences(case: &str, real: &Seen, sim: &Seen) -> Vec<String> {
    let mut diffs = vec![];
    if on_purpose(case, "*") {
        return diffs;
    }
    if real.status != sim.status {
        diffs.push(format!("status: real {} sim {}", real.status, sim.status));
    }
    if real.stream != sim.stream || real.done != sim.done {
        diffs.push(format!(
            "framing: real stream={} [DONE]={}, sim stream={} [DONE]={}",
            real.stream, real.done, sim.stream, sim.done
        ));
    }
    // The first and the last JSON documents carry what a client reads (the role or the first
    // token, the finish reason, the usage, the error); chunks in between repeat the first's shape.
    let ends = |s: &Seen| -> Vec<Value> {
        match s.frames.len() {
            0 => vec![],
            1 => vec![s.frames[0].clone()],
            n => vec![s.frames[0].clone(), s.frames[n - 1].clone()],
        }
    };
    let (r, s) = (ends(real), ends(sim));
    if r.len() != s.len() {
        diffs.push(format!(
            "JSON documents: real {} sim {}",
            real.frames.len(),
            sim.frames.len()
        ));
        return diffs;
    }
    for (i, (rv, sv)) in r.iter().zip(&s).enumerate() {
        let (mut rs, mut ss) = (BTreeSet::new(), BTreeSet::new());
        shape(rv, "", &mut rs);
        shape(sv, "", &mut ss);
        // The sim may leave out what the real server adds (fleet reads none of it); what the
        // sim sends must be there in the real server's answer, with the same type.
        let paths = |set: &BTreeSet<String>| -> BTreeSet<String> {
            set.iter()
                .filter_map(|l| l.split(": ").next())
                .map(str::to_string)
                .collect()
        };
        let real_paths = paths(&rs);
        for extra in ss.difference(&rs) {
            let (path, kind) = extra.split_once(": ").unwrap_or((extra, ""));
            // A value that is null on one side is unset there (it depends on the platform and
            // what the server resolved), not another shape.
            let null_either = kind == "null" || rs.contains(&format!("{path}: null"));
            if on_purpose(case, path) || (null_either && real_paths.contains(path)) {
                continue;
            }
            diffs.push(format!(
                "document {i}: the sim sends {extra}, the real server not"
            ));
        }
        if error_text(rv) != error_text(sv) && !on_purpose(case, "error") {
            diffs.push(format!(
                "document {i}: error text: real {:?} sim {:?}",
                error_text(rv),
                error_text(sv)
            ));
        }
    }
    diffs
}

/// `POST /generate` of `body` on `port`, with the key: the status and the body.
fn generate_on(port: u16, body: &Value) -> (u16, String) {
    let (status, _, text) = client()
        .send(
            "POST",
            &format!("http://127.0.0.1:{port}/generate"),
            Some(&body.to_string()),
            Some(KEY),
        )
        .unwrap();
    (status, text)
}

/// A text of exactly `tokens` prompt tokens on `port`, measured with the server's own
/// tokenizer: `word` repeated, its count solved from two probes (the count is linear in it).
fn prompt_of(port: u16, tokens: u64) -> String {
    // A 200 says the count in `meta_info.prompt_tokens`; a prompt past the input limit is
    // refused with a text that starts with it ("Input length (N tokens) ...").
    let count = |k: usize| -> u64 {
        let body =
            json!({"text": "word ".repeat(k).trim_end(), "sampling_params": {"max_new_tokens": 1}});
        let (status, text) = generate_on(port, &body);
        let v: Value = serde_json::from_str(&text).unwrap();
        if status == 200 {
            return v["meta_info"]["prompt_tokens"].as_u64().unwrap();
        }
        let message = v
            .pointer("/error/message")
            .and_then(Value::as_str)
            .unwrap_or("");
        let digits: String = message
            .chars()
            .skip_while(|c| !c.is_ascii_digit())
            .take_while(char::is_ascii_digit)
            .collect();
        digits
            .parse()
            .unwrap_or_else(|_| panic!("no token count in {status} {text}"))
    };
    let (a, b) = (count(10), count(20));
    let per = (b - a) as f64 / 10.0;
    let base = a as f64 - 10.0 * per;
    let mut k = ((tokens as f64 - base) / per).round().max(1.0) as usize;
    for _ in 0..20 {
        let n = count(k);
        if n == tokens {
            return "word ".repeat(k).trim_end().to_string();
        }
        k = if n < tokens { k + 1 } else { k - 1 };
    }
    panic!("no text of exactly {tokens} tokens on port {port}");
}

/// The `#new-token` of every `Prefill batch` line in a server's log so far.
fn prefill_tokens(log: &std::path::Path) -> Vec<u64> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("Prefill batch"))
        .filter_map(|l| {
            let rest = l.split("#new-token: ").nth(1)?;
            rest.split(',').next()?.trim().parse().ok()
        })
        .collect()
}

/// A `/generate` body asking for 8 tokens. The tiny model's weights are random, so it samples its
/// end-of-text token now and then; `ignore_eos` makes every answer end by length, as the sim's
/// always do, so the shapes compared never depend on the draw.
fn generate(text: &str, stream: bool) -> Value {
    json!({"text": text, "sampling_params": {"max_new_tokens": 8, "ignore_eos": true}, "stream": stream})
}

#[test]
fn the_sim_answers_as_the_real_server_does() {
    let real = RealSglang::find();
    let dir = tempfile::tempdir().unwrap();
    let calls = dir.path().join("sgl-calls");
    let common = |port: u16| -> Vec<String> {
        let mut a: Vec<String> = [
            "--port",
            &port.to_string(),
            "--host",
            "127.0.0.1",
            "--api-key",
            KEY,
            "--enable-metrics",
            "--context-length",
            &CONTEXT.to_string(),
            "--attention-backend",
            "torch_native",
            "--chunked-prefill-size",
            "64",
            "--schedule-conservativeness",
            "0.5",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        a.extend(CPU_ARGS.iter().map(|s| s.to_string()));
        a
    };

    let real_port = free_port();
    let mut cmd = Command::new(&real.python);
    cmd.args(["-m", "sglang.launch_server", "--model-path"])
        .arg(&real.model)
        .args(common(real_port))
        .envs(real.env(&calls));
    let real_server = start("real", cmd, real_port, dir.path());

    let sim_port = free_port();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sglang-sim"));
    cmd.arg("--model-path")
        .arg(&real.model)
        .args(common(sim_port))
        .args(["--sim-startup-secs", "1"])
        .arg("--sim-gpu-state-dir")
        .arg(dir.path().join("gpus"));
    let sim_server = start("sim", cmd, sim_port, dir.path());

    // Start-up order: refused while loading, 503 until the warm-up generation, then 200.
    for s in [&real_server, &sim_server] {
        let order: Vec<&str> = s.startup.iter().map(String::as_str).collect();
        assert!(
            order == ["refused", "503", "200"] || order == ["refused", "200"],
            "{}'s start-up as /health saw it: {order:?}",
            s.name
        );
        assert_eq!(
            order[0], "refused",
            "{}: the port opens only after the load",
            s.name
        );
    }

    let over = "word ".repeat(CONTEXT as usize + 100);
    let chat = |extra: Value| -> Value {
        let mut b = json!({"model": "tiny", "messages": [{"role": "user", "content": "say hello"}], "max_tokens": 8, "ignore_eos": true});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };
    let completion = |extra: Value| -> Value {
        let mut b =
            json!({"model": "tiny", "prompt": "say hello", "max_tokens": 8, "ignore_eos": true});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };
    let usage = json!({"stream": true, "stream_options": {"include_usage": true, "continuous_usage_stats": true}});

    // Each case: name, method, path, body (`None`: GET), whether the key goes with it, and a
    // body per server when it depends on the server's tokenizer.
    type Body = Box<dyn Fn(u16) -> Option<Value>>;
    let fixed = |v: Value| -> Body { Box::new(move |_| Some(v.clone())) };
    let get = || -> Body { Box::new(|_| None) };
    let cases: Vec<(&str, &str, Body, bool)> = vec![
        ("health", "/health", get(), false),
        ("health without key", "/health", get(), false),
        ("models", "/v1/models", get(), true),
        ("server_info", "/server_info", get(), true),
        (
            "generate",
            "/generate",
            fixed(generate("say hello", false)),
            true,
        ),
        (
            "generate stream",
            "/generate",
            fixed(generate("say hello", true)),
            true,
        ),
        (
            "completions",
            "/v1/completions",
            fixed(completion(json!({}))),
            true,
        ),
        (
            "completions stream",
            "/v1/completions",
            fixed(completion(usage.clone())),
            true,
        ),
        ("chat", "/v1/chat/completions", fixed(chat(json!({}))), true),
        (
            "chat stream",
            "/v1/chat/completions",
            fixed(chat(usage.clone())),
            true,
        ),
        (
            "generate over the context",
            "/generate",
            fixed(generate(&over, false)),
            true,
        ),
        (
            "generate stream over the context",
            "/generate",
            fixed(generate(&over, true)),
            true,
        ),
        (
            "chat over the context",
            "/v1/chat/completions",
            fixed(chat(
                json!({"messages": [{"role": "user", "content": over}]}),
            )),
            true,
        ),
        (
            "chat max_tokens over the context",
            "/v1/chat/completions",
            fixed(chat(json!({"max_tokens": CONTEXT + 100}))),
            true,
        ),
        (
            "completions max_tokens over the context",
            "/v1/completions",
            fixed(completion(json!({"max_tokens": CONTEXT + 100}))),
            true,
        ),
        (
            "generate at the scheduler's input limit",
            "/generate",
            Box::new(|port| Some(generate(&prompt_of(port, CONTEXT - 3), false))),
            true,
        ),
        (
            "generate stream at the scheduler's input limit",
            "/generate",
            Box::new(|port| Some(generate(&prompt_of(port, CONTEXT - 3), true))),
            true,
        ),
        (
            "chat with a bad parameter",
            "/v1/chat/completions",
            fixed(chat(json!({"temperature": -3}))),
            true,
        ),
        (
            "generate with a bad parameter",
            "/generate",
            fixed(json!({"text": "hi", "sampling_params": {"max_new_tokens": 8, "top_p": 0}})),
            true,
        ),
        (
            "completions with a bad parameter",
            "/v1/completions",
            fixed(completion(json!({"temperature": -3}))),
            true,
        ),
        (
            "chat without the key",
            "/v1/chat/completions",
            fixed(chat(json!({}))),
            false,
        ),
        (
            "generate without the key",
            "/generate",
            fixed(generate("hi", false)),
            false,
        ),
    ];

    let mut report = vec![];
    for (name, path, body, key) in &cases {
        let ask = |port: u16| -> Seen {
            let b = body(port).map(|b| b.to_string());
            let method = if b.is_some() { "POST" } else { "GET" };
            let key = key.then_some(KEY);
            seen(
                client()
                    .send(
                        method,
                        &format!("http://127.0.0.1:{port}{path}"),
                        b.as_deref(),
                        key,
                    )
                    .unwrap_or_else(|e| panic!("{name}: {e}")),
            )
        };
        let (r, s) = (ask(real_port), ask(sim_port));
        let diffs = differences(name, &r, &s);
        if !diffs.is_empty() {
            report.push(format!(
                "{name}:\n  - {}\n  real: {}\n  sim:  {}",
                diffs.join("\n  - "),
                r.frames.last().map(Value::to_string).unwrap_or_default(),
                s.frames.last().map(Value::to_string).unwrap_or_default()
            ));
        }
    }

    // /metrics: the series fleet reads exist on both.
    for series in [
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:gen_throughput",
        "sglang:token_usage",
        "sglang:prompt_tokens_total",
        "sglang:generation_tokens_total",
    ] {
        for (name, port) in [("real", real_port), ("sim", sim_port)] {
            let (status, _, text) = client()
                .get(format!("http://127.0.0.1:{port}/metrics"))
                .unwrap();
            assert_eq!(status, 200);
            if !text.lines().any(|l| l.starts_with(series)) {
                report.push(format!("metrics: {name} has no {series}"));
            }
        }
    }

    // A long prompt is prefilled in chunks of --chunked-prefill-size, one prefill batch each,
    // its first token after the last (schedule_policy.py `PrefillAdder`), and admission uses
    // the new-token ratio 0.7 × --schedule-conservativeness (new_token_ratio_tracker.py).
    // Distinct words, so that no earlier prompt's prefix is cached: the tiny model's tokenizer
    // takes about 7 tokens a word and the sim's (4 characters a token) about 2, so each server
    // gets the count that puts the prompt between 3 chunks and its 512-token context.
    let long = |words: usize| {
        let text: Vec<String> = (0..words).map(|i| format!("chunk{i}")).collect();
        json!({"text": text.join(" "), "sampling_params": {"max_new_tokens": 4, "ignore_eos": true}})
    };
    for s in [&real_server, &sim_server] {
        let (port, long) = if s.name == "real" {
            (real_port, long(40))
        } else {
            (sim_port, long(120))
        };
        let before = prefill_tokens(&s.log).len();
        let (status, text) = generate_on(port, &long);
        assert_eq!(status, 200, "{}: {text}", s.name);
        let meta = serde_json::from_str::<Value>(&text).unwrap()["meta_info"].clone();
        let new = meta["prompt_tokens"].as_u64().unwrap() - meta["cached_tokens"].as_u64().unwrap();
        assert!(new > 64 * 3, "{}: {meta}", s.name);
        let mut want = vec![64; (new / 64) as usize];
        if !new.is_multiple_of(64) {
            want.push(new % 64);
        }
        let t = Instant::now();
        let mut seen = prefill_tokens(&s.log).split_off(before);
        while seen.len() < want.len() && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(50));
            seen = prefill_tokens(&s.log).split_off(before);
        }
        if seen != want {
            report.push(format!(
                "chunked prefill: {} prefilled {new} new tokens as {seen:?}, not {want:?}",
                s.name
            ));
        }
        let (_, _, metrics) = client()
            .get(format!("http://127.0.0.1:{port}/metrics"))
            .unwrap();
        let ratio: Option<f64> = metrics
            .lines()
            .find(|l| l.starts_with("sglang:new_token_ratio{"))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok());
        if ratio.is_none_or(|r| (r - 0.35).abs() > 1e-9) {
            report.push(format!(
                "metrics: {}'s sglang:new_token_ratio is {ratio:?}, not 0.7 × 0.5",
                s.name
            ));
        }
    }

    assert_eq!(
        RealSglang::stub_calls(&calls),
        "",
        "no stand-in op is ever called"
    );
    assert!(
        report.is_empty(),
        "the sim differs from the real SGLang 0.5.23:\n{}",
        report.join("\n")
    );
}
