//! `fleet generate` against real `sglang-sim` servers: a server dying mid-run, context-length
//! clamping with SGLang's own messages, and the watchdog catching the seed's low-cap strategy.

mod common;

use common::generate::*;
use serde_json::json;

#[test]
fn a_sim_dying_mid_run_loses_nothing_and_its_requests_are_re_dispatched() {
    let fast = [
        "--mamba-radix-cache-strategy",
        "no_buffer",
        "--disable-overlap-schedule",
        "--sim-time-scale",
        "500",
    ];
    let a = Sim::start(&fast);
    let mut b = Sim::start(&[&fast[..], &["--sim-die-after", "120"]].concat());
    let (_tmp, prompts, out) = prompts_and_out(600);
    let o = generate(&out, &prompts, &[&a.url, &b.url])
        .args(["--max-tokens", "32"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(b.exited(), "the sim was meant to die: {}", b.log());
    assert!(
        stderr.contains(&format!("127.0.0.1:{} taken out", b.port)),
        "{stderr}"
    );
    assert_exactly_once(&out, 600);
    assert!(failures(&out).is_empty());
    // How many b answered before it died is timing; that its requests were taken back and
    // written once is the core's decision, tested exactly in generate::core's unit tests.
    let lines = completions(&out);
    for l in &lines {
        let tokens = l["completion_tokens"].as_u64().unwrap();
        assert!((1..=32).contains(&tokens), "{l}");
        assert_eq!(
            l["output"].as_str().unwrap().split_whitespace().count() as u64,
            tokens,
            "{l}"
        );
    }
    let p = progress(&out);
    assert_eq!(
        (p["completed"].as_u64(), p["status"].as_str()),
        (Some(600), Some("done"))
    );
}

#[test]
fn overflow_is_clamped_to_the_context_and_a_prompt_that_cannot_fit_is_failed() {
    let sim = Sim::start(&["--context-length", "256", "--sim-time-scale", "500"]);
    let tmp = tempfile::tempdir().unwrap();
    let prompts = tmp.path().join("prompts.jsonl");
    // The sim counts ceil(chars / 4) tokens: 200-token and 300-token prompts.
    write_lines(
        &prompts,
        &[
            json!({"id": "fits", "prompt": "a short prompt"}).to_string(),
            json!({"id": "clamp", "prompt": "x".repeat(800)}).to_string(),
            json!({"id": "too-long", "prompt": "y".repeat(1200)}).to_string(),
        ],
    );
    let out = tmp.path().join("out");
    let o = generate(&out, &prompts, &[&sim.url])
        .args(["--max-tokens", "128"])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let lines = completions(&out);
    let clamp = lines
        .iter()
        .find(|l| l["id"] == "clamp")
        .expect("clamped prompt completed");
    assert_eq!(clamp["prompt_tokens"], 200);
    assert!(
        clamp["completion_tokens"].as_u64().unwrap() < 256 - 200,
        "{clamp}"
    );
    assert!(lines.iter().any(|l| l["id"] == "fits"));
    let failed = failures(&out);
    assert_eq!(failed.len(), 1);
    assert_eq!(
        (failed[0]["id"].as_str(), failed[0]["reason"].as_str()),
        (Some("too-long"), Some("prompt_too_long"))
    );
    assert_eq!(failed[0]["line"], 3);
}

#[test]
fn the_watchdog_flags_the_seeds_extra_buffer_run_against_the_profiles_sweep_numbers() {
    let scale = ["--sim-time-scale", "20"];
    // What a sweep would have recorded: no_buffer's throughput and cap on this (simulated) GPU.
    let (ideal, cap) = {
        let nb = Sim::start(
            &[
                &scale[..],
                &[
                    "--mamba-radix-cache-strategy",
                    "no_buffer",
                    "--disable-overlap-schedule",
                ],
            ]
            .concat(),
        );
        (nb.ideal_output_tok_s(), nb.cap())
    };
    let slow = Sim::start(
        &[
            &scale[..],
            &["--mamba-radix-cache-strategy", "extra_buffer"],
        ]
        .concat(),
    );
    assert!(
        slow.cap() < cap / 2 + 10,
        "extra_buffer allows fewer requests in flight"
    );
    let tmp = tempfile::tempdir().unwrap();
    let profile = tmp.path().join("measured.yaml");
    std::fs::write(
        &profile,
        format!(
            "model: /models/test\nlauncher: [sglang-sim]\n\
             expected: {{output_tok_s_per_gpu: {ideal}, max_running_requests: {cap}}}\n"
        ),
    )
    .unwrap();
    let prompts = tmp.path().join("prompts.jsonl");
    let long_prompt = "w".repeat(384);
    write_lines(
        &prompts,
        &(0..400)
            .map(|i| {
                json!({"id": format!("p{i}"), "prompt": format!("{i} {long_prompt}")}).to_string()
            })
            .collect::<Vec<_>>(),
    );
    let out = tmp.path().join("out");
    let o = generate(&out, &prompts, &[&slow.url])
        .arg("--profile")
        .arg(&profile)
        .args(["--warmup", "3s", "--abort-below", "0.5", "--grace", "1s"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("WATCHDOG"), "{stderr}");
    assert!(
        stderr.contains(&format!("pinned at the server cap of {}", slow.cap())),
        "{stderr}"
    );
    assert!(
        stderr.contains("fleet sweep --strategies extra_buffer,no_buffer"),
        "{stderr}"
    );
    assert!(stderr.contains("stopped by --abort-below"), "{stderr}");
    assert_eq!(progress(&out)["status"], "failed");
    // Whatever was written is valid, and nothing was written twice.
    let counts = id_counts(&out);
    assert!(counts.values().all(|c| *c == 1));
}
