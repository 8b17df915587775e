//! What `fleet sweep` measures with, through the real binary against `sglang-sim`: prompts
//! that do not repeat within a trial (SGLang's radix cache would serve a repeat's prefill for
//! free), the cached tokens each candidate got, and prompts too long for the context, which are
//! the dataset's problem, never a candidate's failure.

mod common;
mod sweep_common;

use serde_json::Value;
use sweep_common::{Fleet, SHORT_TRIALS, row, serial};

fn measured(r: &Value, label: &str) -> Value {
    let trial = &row(r, label)["trial"];
    assert_eq!(trial["outcome"]["state"], "ok", "{label}: {r:#}");
    trial.clone()
}

/// The issue as seen on the real server: with `--max-tokens 48` the prompts that did not fit
/// failed both candidates, and no candidate won.
#[test]
fn prompts_too_long_for_the_context_never_fail_a_candidate() {
    let _g = serial();
    let f = Fleet::new(2, &["mem_fraction_static: 0.85"], &[]);
    // The base profile's context is 8192 tokens; the sim counts 4 characters a token.
    let mut lines: Vec<String> = (0..40)
        .map(|i| {
            serde_json::json!({"id": i, "prompt": format!("question {i}: {}", "word ".repeat(30))})
                .to_string()
        })
        .collect();
    // Three prompts longer than the context: nothing fits them.
    for i in 0..3 {
        lines.push(
            serde_json::json!({"id": format!("long{i}"), "prompt": "x".repeat(4 * 9000)})
                .to_string(),
        );
    }
    // Two that fit only with fewer output tokens than --max-tokens: clamped, as generate does.
    for i in 0..2 {
        lines.push(
            serde_json::json!({"id": format!("near{i}"), "prompt": "y".repeat(4 * 8170)})
                .to_string(),
        );
    }
    std::fs::write(f.path().join("prompts.jsonl"), lines.join("\n") + "\n").unwrap();
    let (code, r, err) = f.sweep_json(&[
        "--strategies",
        "extra_buffer,no_buffer",
        "--prompts",
        "prompts.jsonl",
        "--max-tokens",
        "48",
        "--warmup",
        "1s",
        "--duration",
        "3s",
    ]);
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert_eq!(r["winner"], "no_buffer", "{r:#}");
    for label in ["no_buffer", "extra_buffer"] {
        let t = measured(&r, label);
        assert_eq!(t["outcome"]["errors"], 0, "{label}: {t:#}");
        assert!(
            t["outcome"]["output_tok_s"].as_f64().unwrap() > 0.0,
            "{t:#}"
        );
    }
    // The winner finished requests, the clamped ones among them.
    let nb = measured(&r, "no_buffer");
    assert!(nb["outcome"]["completed"].as_u64().unwrap() > 0, "{nb:#}");
    // Said once for the sweep, with the server's own reason.
    assert_eq!(r["unfit"]["prompts"], 3, "{r:#}");
    assert!(
        r["unfit"]["example"]
            .as_str()
            .unwrap()
            .contains("the context length is 8192"),
        "{r:#}"
    );
}

#[test]
fn a_trial_draws_new_prompts_and_reports_what_the_cache_served() {
    let _g = serial();
    let f = Fleet::new(2, &["mem_fraction_static: 0.85"], &[]);
    // Synthetic prompts: a new one for every request, so the cache serves none of them.
    let axes = [
        "--strategies",
        "no_buffer",
        "--set",
        "server.extra_args=[],[--disable-radix-cache]",
    ];
    let (code, r, err) = f.sweep_json(&[&axes[..], SHORT_TRIALS].concat());
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert!(r.get("repeated").is_none(), "{r:#}");
    for t in r["rows"].as_array().unwrap() {
        let cache = &t["trial"]["cache"];
        assert!(cache["prompt_tokens"].as_u64().unwrap() > 0, "{t:#}");
        assert_eq!(cache["cached_tokens"], 0, "{t:#}");
    }

    // A sample of 5 prompts cannot last a trial: the report says so, and the radix cache
    // serves the repeats' prefill to the candidate that has one.
    f.prompts(200);
    std::fs::remove_file(f.path().join("sweep.json")).unwrap();
    let (code, r, err) = f.sweep_json(&[
        "--strategies",
        "no_buffer",
        "--set",
        "server.extra_args=[],[--disable-radix-cache]",
        "--prompts",
        "prompts.jsonl",
        "--sample",
        "5",
        "--max-tokens",
        "24",
        "--warmup",
        "1s",
        "--duration",
        "2s",
    ]);
    assert_eq!(code, 0, "{err}\n{r:#}");
    assert_eq!(r["repeated"]["sample"], 5, "{r:#}");
    assert_eq!(r["repeated"]["usable"], 200, "{r:#}");
    assert!(r["repeated"]["drawn"].as_u64().unwrap() > 5, "{r:#}");
    let cached = |label: &str| {
        measured(&r, label)["cache"]["cached_tokens"]
            .as_u64()
            .unwrap()
    };
    let labels: Vec<String> = r["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["label"].as_str().unwrap().to_string())
        .collect();
    let (off, on): (Vec<&String>, Vec<&String>) = labels
        .iter()
        .partition(|l| l.contains("disable-radix-cache"));
    assert!(cached(on[0]) > 0, "{r:#}");
    assert_eq!(cached(off[0]), 0, "{r:#}");
}
