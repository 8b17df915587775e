//! The job of issue 26, shared by tests/generate_prefix.rs and benches/prefix.rs: 40 long
//! system prompts × N short questions, shuffled, on 8 `sglang-sim` servers whose radix caches
//! hold about 7 system prompts each, and the same job split by hand (server k gets system
//! prompts k, k + 8, ...).

#![allow(dead_code, reason = "the test and the bench each use a part")]

use serde_json::json;

pub const SYSTEMS: usize = 40;
pub const SERVERS: usize = 8;

/// ~1,000 sim tokens, different for each system prompt from its first block on.
pub fn system_prompt(s: usize) -> String {
    let mut out = format!("System prompt {s}. ");
    let mut x = (s as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    while out.len() < 4000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.push_str(["alpha ", "beta ", "gamma ", "delta ", "omega "][(x % 5) as usize]);
    }
    out
}

/// Prompt `i` of the job: system prompt `i % SYSTEMS`, question `i / SYSTEMS`.
pub fn line(i: usize) -> String {
    let s = i % SYSTEMS;
    json!({"id": format!("p{i}"), "prompt": format!("{}\nQuestion {}: why?", system_prompt(s), i / SYSTEMS)})
        .to_string()
}

/// The prompt ids in a shuffled order (a fixed permutation: the same every run).
pub fn shuffled(n: usize) -> Vec<usize> {
    let mut ids: Vec<usize> = (0..n).collect();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for i in (1..n).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ids.swap(i, (x % (i as u64 + 1)) as usize);
    }
    ids
}

/// The lines server `k` gets when the job is placed by hand, in the shuffled order.
pub fn hand_placed(order: &[usize], k: usize) -> Vec<String> {
    order
        .iter()
        .filter(|&&i| i % SYSTEMS % SERVERS == k)
        .map(|&i| line(i))
        .collect()
}

/// `sglang-sim` flags of a server that prefills at `per_token_ms` a token and holds about 7
/// system prompts in its radix cache (an 8,000-token KV pool); answers are ~4 tokens at 10 ms
/// a decode step.
pub fn sim_args(per_token_ms: &str) -> Vec<&str> {
    vec![
        "--sim-dense",
        "--max-total-tokens",
        "8000",
        "--sim-prefill-base-ms",
        "1",
        "--sim-prefill-per-token-ms",
        per_token_ms,
        "--sim-decode-base-ms",
        "10",
        "--sim-decode-per-req-ms",
        "0.01",
        "--sim-mean-output-tokens",
        "4",
    ]
}

/// The flags every run of the job shares, by hand or not.
pub const RUN_ARGS: [&str; 6] = ["--max-tokens", "4", "--concurrency", "16", "--warmup", "1h"];
