//! `fleet sweep` against `sglang-sim` servers that abort requests inside their 200 streams, as
//! SGLang 0.5.23 does when its waiting queue is full: each abort is a failed request of its
//! class, never a completion, whether it came as a `/generate` chunk or an OpenAI error event.

mod common;
mod sweep_common;

use serde_json::Value;
use sweep_common::{Fleet, serial, short};

fn outcome(r: &Value) -> &Value {
    let rows = r["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{r:#}");
    &rows[0]["trial"]["outcome"]
}

#[test]
fn a_full_queue_s_aborts_fail_the_candidate_as_retryable_errors_not_completions() {
    let _g = serial();
    // At most one request waits, so most of the 1.25x cap the sweep keeps in flight is aborted.
    let f = Fleet::new(
        1,
        &[
            "mamba_strategy: no_buffer",
            "extra_args: [--max-queued-requests, \"1\"]",
        ],
        &[],
    );
    for endpoint in ["generate", "chat"] {
        let out = format!("sweep-{endpoint}.json");
        let (code, r, err) = f.sweep_json(&short(&[
            "--set",
            "env.SGLANG_SIM_NOTE=queue",
            "--endpoint",
            endpoint,
            "--out",
            &out,
        ]));
        assert_eq!(code, 1, "{endpoint}: the only candidate failed: {err}");
        let o = outcome(&r);
        assert_eq!(o["state"], "failed", "{endpoint}: {o:#}");
        let reason = o["reason"].as_str().unwrap();
        assert!(
            reason.contains(" retryable; ") && reason.contains("The request queue is full."),
            "{endpoint}: {reason}"
        );
        assert!(
            !reason.contains("prompt_too_long") && !reason.contains("rejected"),
            "{endpoint}: {reason}"
        );
        assert!(f.records().is_empty(), "{:?}", f.records());
    }
}
