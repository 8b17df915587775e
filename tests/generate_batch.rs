//! `fleet generate` over an OpenAI Batch API file on a real `sglang-sim`: the output is the Batch
//! API's (`--output-format openai-batch`, the default for such a file), every 200 body is what
//! the official `openai` Python SDK reads as a `ChatCompletion` or `Completion`, a prompt too long
//! carries an `error`, and `--resume --retry-failed` replaces a failed line.

mod common;

use std::collections::HashMap;
use std::path::Path;

use common::generate::*;
use common::real::RealSglang;
use serde_json::{Value, json};

/// Every line of the shards and `failed.jsonl`, by `custom_id`; a custom id twice fails.
fn by_custom_id(out: &Path) -> HashMap<String, Value> {
    let mut seen = HashMap::new();
    for line in completions(out).into_iter().chain(failures(out)) {
        let id = line["custom_id"]
            .as_str()
            .unwrap_or_else(|| panic!("no custom_id: {line}"))
            .to_string();
        assert!(
            line["id"].as_str().unwrap().starts_with("batch_req_"),
            "{line}"
        );
        assert!(seen.insert(id, line.clone()).is_none(), "twice: {line}");
    }
    seen
}

/// Every 200 body in `out`'s shards, validated with the official `openai` SDK by its line's URL.
fn validate_with_the_sdk(out: &Path, urls: &HashMap<String, &str>) -> (u64, u64) {
    let bodies: Vec<(String, Value)> = completions(out)
        .into_iter()
        .map(|l| {
            let url = urls[l["custom_id"].as_str().unwrap()];
            (url.to_string(), l["response"]["body"].clone())
        })
        .collect();
    RealSglang::find().validate_openai_bodies(&bodies)
}

#[test]
fn a_batch_file_gets_the_batch_apis_output_that_the_openai_sdk_reads() {
    let sim = Sim::start(&["--context-length", "256", "--sim-time-scale", "500"]);
    let tmp = tempfile::tempdir().unwrap();
    let prompts = tmp.path().join("batch.jsonl");
    // The sim counts ⌈characters / 4⌉ tokens: "y" × 1200 is 300 tokens, over the 256 context.
    let line = |i: usize, text: &str, max_tokens: u64| {
        let id = format!("req-{i}");
        // The two at the end go to completions, whose prompt is counted without a template.
        if i.is_multiple_of(2) && i < 299 {
            json!({"custom_id": id, "method": "POST", "url": "/v1/chat/completions",
                   "body": {"model": "test", "max_tokens": max_tokens,
                            "messages": [{"role": "system", "content": "Be brief."},
                                         {"role": "user", "content": text}]}})
        } else {
            json!({"custom_id": id, "method": "POST", "url": "/v1/completions",
                   "body": {"model": "test", "max_tokens": max_tokens, "prompt": text}})
        }
    };
    let mut lines: Vec<Value> = (0..299)
        .map(|i| line(i, &format!("Question {i}: why is the sky blue?"), 8))
        .collect();
    // Asks for more than fits beside its 200-token prompt: fleet clamps, and says so.
    lines.push(line(299, &"x".repeat(800), 200));
    lines.push(line(300, &"y".repeat(1200), 8));
    let urls: HashMap<String, &str> = lines
        .iter()
        .map(|l| {
            let url = if l["url"] == "/v1/chat/completions" {
                "/v1/chat/completions"
            } else {
                "/v1/completions"
            };
            (l["custom_id"].as_str().unwrap().to_string(), url)
        })
        .collect();
    write_lines(
        &prompts,
        &lines.iter().map(Value::to_string).collect::<Vec<_>>(),
    );
    let out = tmp.path().join("out");
    let o = generate(&out, &prompts, &[&sim.url]).output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        o.status.code(),
        Some(1),
        "one prompt fails for good: {stderr}"
    );

    let all = by_custom_id(&out);
    assert_eq!(all.len(), 301, "every custom_id once");
    assert!(urls.keys().all(|id| all.contains_key(id)));
    let too_long = &all["req-300"];
    assert_eq!(too_long["response"], Value::Null, "{too_long}");
    assert_eq!(too_long["error"]["code"], "prompt_too_long", "{too_long}");
    assert_eq!(
        too_long["error"]["message"],
        "The input (300 tokens) is longer than the model's context length (256 tokens).",
        "the server's own words: {too_long}"
    );
    for (id, l) in &all {
        if id != "req-300" {
            assert_eq!(l["error"], Value::Null, "{l}");
            assert_eq!(l["response"]["status_code"], 200, "{l}");
            assert_eq!(
                l["response"]["request_id"], l["response"]["body"]["id"],
                "{l}"
            );
        }
    }
    // The body is SGLang's whole: fields fleet never reads are there.
    let chat = &all["req-0"]["response"]["body"];
    assert!(chat["choices"][0].get("matched_stop").is_some(), "{chat}");
    assert_eq!(chat["metadata"]["weight_version"], "default", "{chat}");
    let clamped = &all["req-299"];
    assert_eq!(
        clamped["fleet"]["max_tokens_clamped"],
        json!({"from": 200, "to": 55}),
        "C − P − 1 = 256 − 200 − 1: {clamped}"
    );
    assert_eq!(clamped["response"]["body"]["usage"]["prompt_tokens"], 200);
    assert!(all["req-1"]["fleet"].get("max_tokens_clamped").is_none());
    assert_eq!(validate_with_the_sdk(&out, &urls), (150, 150));
    let p = progress(&out);
    assert_eq!(
        (p["completed"].as_u64(), p["failed"].as_u64()),
        (Some(300), Some(1))
    );

    // `fleet report` counts the failure by its class, read from the batch line's error.code.
    let o = fleet()
        .arg("--json")
        .arg("report")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report = String::from_utf8_lossy(&o.stdout);
    assert!(report.contains("prompt_too_long"), "{report}");

    // A job is one format: resuming it as fleet's is refused, naming both.
    let o = generate(&out, &prompts, &[&sim.url])
        .args(["--resume", "--output-format", "fleet"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("holds a job that writes openai-batch"),
        "{stderr}"
    );

    // The too-long line, shortened: --retry-failed sends it again and its answer replaces the
    // failure; the rest is done already and is neither sent nor written again.
    lines[300] = line(300, "now short", 8);
    write_lines(
        &prompts,
        &lines.iter().map(Value::to_string).collect::<Vec<_>>(),
    );
    let o = generate(&out, &prompts, &[&sim.url])
        .args(["--resume", "--retry-failed"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let all = by_custom_id(&out);
    assert_eq!(all.len(), 301);
    assert!(failures(&out).is_empty());
    assert_eq!(all["req-300"]["response"]["status_code"], 200);
    let p = progress(&out);
    assert_eq!(
        (p["completed"].as_u64(), p["failed"].as_u64()),
        (Some(301), Some(0))
    );
    assert_eq!(validate_with_the_sdk(&out, &urls), (150, 151));
}
