//! The core writing the OpenAI Batch API's lines: the server's body whole with what was clamped,
//! a bare prompt sent to completions, failures with the server's own words, and retries.

use super::*;

fn batch_cfg() -> CoreConfig {
    let mut c = cfg();
    c.format = OutputFormat::OpenaiBatch;
    c
}

#[test]
fn an_answer_is_the_servers_body_whole_and_says_it_was_clamped() {
    let mut h = Harness::with(batch_cfg(), Baseline::default(), vec![server("a", 8)]);
    h.line(1, r#"{"custom_id": "b-1", "method": "POST", "url": "/v1/completions", "body": {"prompt": "hi", "max_tokens": 8000}}"#);
    h.line(2, r#"{"id": "plain", "prompt": "a bare prompt"}"#);
    let sent: Vec<Api> = h.out.values().map(|(_, r)| r.api).collect();
    assert_eq!(
        sent,
        [Api::Completions, Api::Completions],
        "an OpenAI body either way"
    );
    let first = h.oldest();
    h.err(
        first,
        overflow(Overflow::Total {
            prompt_tokens: 1000,
            context_len: 8192,
        }),
    );
    let body = br#"{"id":"cmpl-9","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"x","logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":1000,"completion_tokens":1,"total_tokens":1001},"system_fingerprint":"fp-1"}"#;
    let mut c = completion(1);
    c.body = Some(bytes::Bytes::from_static(body));
    c.response_id = Some("cmpl-9".into());
    // The clamped request went again: answer it.
    let again = *h
        .out
        .iter()
        .find(|(_, (_, r))| r.max_tokens == 7191)
        .expect("sent again, clamped")
        .0;
    h.answer(
        again,
        Attempt::Finished {
            completion: c,
            latency: SEC,
        },
    );
    let line = h
        .completions
        .iter()
        .find(|l| l["custom_id"] == "b-1")
        .expect("written");
    let want: Value = serde_json::from_slice(body).unwrap();
    assert_eq!(line["response"]["body"], want);
    assert_eq!(line["response"]["request_id"], "cmpl-9");
    assert_eq!(
        line["fleet"]["max_tokens_clamped"],
        json!({"from": 8000, "to": 7191})
    );
    assert_eq!(h.core.snapshot(h.now, Status::Running).completed, 1);
}

#[test]
fn failures_carry_fleets_class_and_the_servers_words() {
    let mut c = batch_cfg();
    c.max_retries = 0;
    let mut h = Harness::with(c, Baseline::default(), vec![server("a", 8)]);
    h.lines(1, 4);
    let mut ids: Vec<ReqId> = h.out.keys().copied().collect();
    ids.sort();
    h.err(
        ids[0],
        overflow(Overflow::InputLonger {
            prompt_tokens: 9000,
            context_len: 8192,
        }),
    );
    h.err(
        ids[1],
        ClientError::Status {
            url: "u".into(),
            status: 400,
            body: r#"{"object":"error","message":"bad logit_bias","type":"BadRequestError","param":null,"code":400}"#.into(),
        },
    );
    h.err(ids[2], status(503));
    let by_id = |lines: &[Value], id: &str| {
        lines
            .iter()
            .find(|l| l["custom_id"] == id)
            .unwrap_or_else(|| panic!("{id} in {lines:?}"))
            .clone()
    };
    let long = by_id(&h.failures, "p1");
    assert_eq!(long["response"], Value::Null);
    assert_eq!(long["error"]["code"], "prompt_too_long");
    let server = "the server: the prompt is 9000 tokens; the context length is 8192";
    assert_eq!(long["error"]["message"], server);
    assert_eq!(
        (
            long["fleet"]["line"].as_u64(),
            long["fleet"]["line_hash"].is_string()
        ),
        (Some(1), true)
    );
    let rejected = by_id(&h.failures, "p2");
    assert_eq!(
        (
            rejected["error"]["code"].as_str(),
            rejected["error"]["message"].as_str()
        ),
        (Some("rejected"), Some("bad logit_bias"))
    );
    let again = by_id(&h.retries, "p3");
    assert_eq!(again["error"]["code"], "retries_exhausted");
    assert!(
        again["fleet"].get("line_hash").is_none(),
        "sent again on --resume: {again}"
    );
}
