//! criterion benches of `fleet generate`'s per-request work: building a request body,
//! parsing a response, appending completions to the journal (batched fsync, in a temp dir)
//! and taking the progress snapshot written to progress.json. The inputs are shaped like the
//! seed's job: ~100-token prompts and ~1,000-token outputs.
//!
//!     cargo bench --bench hot_paths [-- --quick]

mod headline;

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use criterion::{BatchSize, Criterion, Throughput};
use fleet::generate::input::Id;
use fleet::generate::journal::{self, CompletionRecord, Entry, Journal, SyncPolicy, batch};
use fleet::generate::progress::{self, InstanceProgress, Progress, RateWindow, Status};
use fleet::server::ServerId;
use fleet::sglang::client::{Api, CompletionRequest, Prompt, parse_completion};
use serde_json::json;

/// Completions per journal batch measured as one iteration.
const JOURNAL_LINES: usize = 1_000;

fn prompt() -> String {
    "Summarise the following passage in plain words, keeping every number: ".to_string()
        + &"the quick brown fox jumps over the lazy dog; ".repeat(9)
}

/// About 1,000 tokens of model output, with the escapes JSON strings carry.
fn output() -> String {
    "Here is the \"summary\" of the passage:\n- a fox, quick and brown — jumps\t".repeat(60)
}

fn request(api: Api, prompt: Prompt) -> CompletionRequest {
    CompletionRequest {
        api,
        prompt,
        max_tokens: 4096,
        temperature: Some(0.7),
        top_p: Some(0.95),
        model: (api != Api::Generate).then(|| "qwen3.6-27b".to_string()),
        extra: None,
    }
}

/// The body as it goes on the wire (reqwest's `.json` serialises the same value).
fn wire(req: &CompletionRequest) -> Vec<u8> {
    serde_json::to_vec(&req.body().expect("prompt fits the api")).unwrap()
}

fn request_body(c: &mut Criterion) {
    let mut g = c.benchmark_group("request_body");
    let generate = request(Api::Generate, Prompt::Text(prompt()));
    g.bench_function("generate", |b| b.iter(|| wire(&generate)));
    let chat = request(
        Api::Chat,
        Prompt::Messages(json!([
            {"role": "system", "content": "You are a careful summariser."},
            {"role": "user", "content": prompt()},
        ])),
    );
    g.bench_function("chat", |b| b.iter(|| wire(&chat)));
    g.finish();
}

/// A chat response with ~1,000 tokens of output, as SGLang writes it.
fn chat_body() -> Vec<u8> {
    serde_json::to_vec(&json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1_764_000_000,
        "model": "qwen3.6-27b",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": output(),
            "reasoning_content": null, "tool_calls": null}, "logprobs": null,
            "finish_reason": "stop", "matched_stop": 151_645}],
        "usage": {"prompt_tokens": 96, "completion_tokens": 988, "total_tokens": 1084},
    }))
    .unwrap()
}

fn response_parsing(c: &mut Criterion) {
    let mut g = c.benchmark_group("parse_completion");
    let generate = serde_json::to_vec(&json!({
        "text": output(),
        "meta_info": {"id": "a1b2", "prompt_tokens": 96, "completion_tokens": 988,
            "cached_tokens": 0, "e2e_latency": 41.2,
            "finish_reason": {"type": "length", "length": 988}},
    }))
    .unwrap();
    g.throughput(Throughput::Bytes(generate.len() as u64));
    g.bench_function("generate", |b| {
        b.iter(|| parse_completion(Api::Generate, &generate).unwrap())
    });
    let chat = chat_body();
    g.throughput(Throughput::Bytes(chat.len() as u64));
    g.bench_function("chat", |b| {
        b.iter(|| parse_completion(Api::Chat, &chat).unwrap())
    });
    g.finish();
}

/// Encoding and appending `JOURNAL_LINES` completions with the default batched fsync, through
/// to the writer's final sync: what the journal costs per completion, disk included.
fn journal_append(c: &mut Criterion, rt: &tokio::runtime::Runtime) {
    let text = output();
    let ids: Vec<Id> = (0..JOURNAL_LINES as u64).map(Id::line).collect();
    let mut g = c.benchmark_group("journal");
    g.throughput(Throughput::Elements(JOURNAL_LINES as u64));
    let server = ServerId::gpu("ct200", 3);
    g.bench_function("append_1000_completions", |b| {
        b.to_async(rt).iter_batched(
            || tempfile::tempdir().unwrap(),
            |dir| async {
                let mut j = Journal::start(dir.path(), 0, SyncPolicy::default(), None).unwrap();
                for id in &ids {
                    j.append(Entry::Completion(journal::encode(&CompletionRecord {
                        id,
                        output: &text,
                        reasoning: None,
                        prompt_tokens: 96,
                        completion_tokens: 988,
                        finish_reason: Some("length"),
                        instance: &server,
                        latency_s: 41.207,
                    })))
                    .unwrap();
                }
                j.close().await.unwrap();
                dir
            },
            BatchSize::PerIteration,
        )
    });
    // The same through `--output-format openai-batch`: the chat body copied in whole.
    let body = chat_body();
    g.bench_function("append_1000_batch_lines", |b| {
        b.to_async(rt).iter_batched(
            || tempfile::tempdir().unwrap(),
            |dir| async {
                let mut j = Journal::start(dir.path(), 0, SyncPolicy::default(), None).unwrap();
                for id in &ids {
                    j.append(Entry::Completion(batch::encode_answer(&batch::Answer {
                        custom_id: id,
                        body: &body,
                        request_id: Some("chatcmpl-1"),
                        instance: &server,
                        latency_s: 41.207,
                        max_tokens: (4096, 4096),
                    })))
                    .unwrap();
                }
                j.close().await.unwrap();
                dir
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

/// A running job's snapshot on 8 instances: rates from the sliding windows, the ETA, and the
/// document, serialised and written atomically as the dispatcher does every 2 s.
fn progress_snapshot(c: &mut Criterion) {
    let t0 = Duration::ZERO;
    let window = |per_s: u64| {
        let mut w = RateWindow::new(Duration::from_secs(60));
        for s in 0..=90u64 {
            w.record(t0 + Duration::from_secs(s), s * per_s, s * per_s * 988);
        }
        w
    };
    let job = window(8);
    let instances: Vec<RateWindow> = (0..8).map(|_| window(1)).collect();
    let snapshot = || {
        let (rate, _) = job.rates();
        let completed = 412_345;
        Progress {
            total: 654_676,
            completed,
            failed: 12,
            waiting_retry: 0,
            warnings: vec![],
            rate_per_sec: progress::round(rate, 2),
            eta_hours: Some(progress::round(
                (654_676 - completed - 12) as f64 / rate / 3600.0,
                3,
            )),
            eta_low_hours: Some(1.9),
            eta_high_hours: Some(2.3),
            expected_output_tokens: Some(988.0),
            length_estimate: None,
            output_tok_s: 9_440.0,
            total_input_tokens: completed * 96,
            total_output_tokens: completed * 988,
            cached_tokens: completed * 60,
            avg_output_tokens: 988,
            elapsed_hours: progress::round(14.3, 4),
            s3_uploaded: 0,
            s3_bytes: 0,
            status: Status::Running,
            instances: instances
                .iter()
                .enumerate()
                .map(|(i, w)| {
                    let (rate, tok) = w.rates();
                    InstanceProgress {
                        name: ServerId::gpu("ct200", i as u32),
                        url: format!("http://127.0.0.1:{}", 30_000 + i),
                        healthy: true,
                        in_flight: 71,
                        concurrency: 72,
                        server_cap: Some(72),
                        completed: completed / 8,
                        rate_per_sec: progress::round(rate, 2),
                        output_tok_s: progress::round(tok, 1),
                        output_tokens: completed / 8 * 900,
                        server_tok_s: None,
                        running: Some(71.0),
                        queued: Some(0.0),
                        token_usage: Some(0.97),
                        cached_fraction: Some(0.62),
                    }
                })
                .collect(),
        }
    };
    let mut g = c.benchmark_group("progress");
    g.bench_function("snapshot_8_instances", |b| {
        b.iter(|| serde_json::to_vec_pretty(&snapshot()).unwrap())
    });
    let dir = tempfile::tempdir().unwrap();
    g.bench_function("snapshot_and_write_atomic", |b| {
        b.iter(|| progress::write_atomic(dir.path(), &snapshot()).unwrap())
    });
    g.finish();
}

/// Where criterion writes its results, by its own rule: `$CRITERION_HOME`, else the cargo
/// target directory's `criterion/`.
fn criterion_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return home.into();
    }
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
        .join("criterion")
}

fn human(ns: f64) -> String {
    match ns {
        ns if ns >= 1e6 => format!("{:.2} ms", ns / 1e6),
        ns if ns >= 1e3 => format!("{:.2} µs", ns / 1e3),
        ns => format!("{ns:.0} ns"),
    }
}

/// One BENCH line per bench that ran since `started` (a filter skips some), with criterion's
/// median read back from its `estimates.json`.
fn report_medians(started: SystemTime) {
    let benches = [
        (
            "request_body",
            "generate",
            "build + serialise a /generate request body",
            1,
        ),
        (
            "request_body",
            "chat",
            "build + serialise a chat request body",
            1,
        ),
        (
            "parse_completion",
            "generate",
            "parse a /generate response (~1,000-token output)",
            1,
        ),
        (
            "parse_completion",
            "chat",
            "parse a chat response (~1,000-token output)",
            1,
        ),
        (
            "journal",
            "append_1000_completions",
            "journal: encode + append one completion, batched fsync",
            JOURNAL_LINES,
        ),
        (
            "journal",
            "append_1000_batch_lines",
            "journal: encode + append one Batch API output line (chat body kept whole)",
            JOURNAL_LINES,
        ),
        (
            "progress",
            "snapshot_8_instances",
            "progress snapshot of 8 instances, serialised",
            1,
        ),
        (
            "progress",
            "snapshot_and_write_atomic",
            "progress snapshot written atomically to progress.json",
            1,
        ),
    ];
    let dir = criterion_dir();
    let how = if headline::quick() {
        "criterion --quick"
    } else {
        "criterion"
    };
    for (group, function, what, per) in benches {
        let path = dir.join(group).join(function).join("new/estimates.json");
        let fresh = std::fs::metadata(&path)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t >= started);
        if !fresh {
            continue;
        }
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (criterion's results)", path.display()));
        let estimates: serde_json::Value = serde_json::from_str(&text).unwrap();
        let ns = estimates["median"]["point_estimate"]
            .as_f64()
            .unwrap_or_else(|| panic!("{}: no median.point_estimate", path.display()));
        headline::line(
            &format!("hot.{group}.{function}"),
            &format!(
                "{}{} ({how} median)",
                human(ns / per as f64),
                if per > 1 { " per completion" } else { "" }
            ),
            what,
            None,
        );
    }
}

fn main() {
    let started = SystemTime::now();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    request_body(&mut c);
    response_parsing(&mut c);
    journal_append(&mut c, &rt);
    progress_snapshot(&mut c);
    c.final_summary();
    report_medians(started);
}
