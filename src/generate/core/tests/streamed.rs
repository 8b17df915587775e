//! The core counting output tokens as they stream: the live rate before any request ends, the
//! answer adding only what had not streamed, and the requests in flight as censored lengths
//! in the ETA.

use super::*;

/// Every request out has streamed `per_request` tokens.
fn streamed(h: &mut Harness, per_request: u64) {
    let counts = h.out.keys().map(|id| (*id, per_request)).collect();
    h.on(Input::Streamed(counts));
}

#[test]
fn tokens_count_as_they_stream_before_any_request_ends() {
    let base = Baseline {
        total: 100,
        ..Baseline::default()
    };
    let mut h = Harness::with(cfg(), base, vec![server("a", 8)]);
    h.at(Time::ZERO);
    let mut next = 0;
    h.fill(&mut next, 100);
    let running = h.out.len() as u64;
    assert!(running >= 8, "{running}");
    // 20 tokens a second each, for 10 s, and nothing finished.
    for s in 1..=10u64 {
        h.now = SEC * s as u32;
        streamed(&mut h, 20 * s);
    }
    h.later(SEC);
    streamed(&mut h, 220);
    let p = h.progress.last().unwrap().clone();
    assert_eq!(p.completed, 0);
    let expected = (20 * running) as f64;
    assert!(
        (p.output_tok_s - expected).abs() / expected < 0.01,
        "{} against {expected}",
        p.output_tok_s
    );
    assert!((p.instances[0].output_tok_s - expected).abs() / expected < 0.01);
    // Nothing ended, so the length is at least 220 and at most max_tokens: the interval says so.
    let e = p.length_estimate.as_ref().unwrap();
    assert_eq!((e.finished, e.running), (0, running));
    assert!(e.low >= 200.0 && e.high >= 4000.0, "{e:?}");
    assert!(e.tail_unseen);
    let (low, eta, high) = (
        p.eta_low_hours.unwrap(),
        p.eta_hours.unwrap(),
        p.eta_high_hours.unwrap(),
    );
    assert!(low < eta && eta < high, "{low} {eta} {high}");
}

#[test]
fn an_answer_adds_only_what_had_not_streamed_yet() {
    let mut h = Harness::new(vec![server("a", 8)]);
    h.at(Time::ZERO);
    h.lines(0, 1);
    h.on(Input::InputEnd);
    let id = h.oldest();
    h.now = SEC;
    h.on(Input::Streamed(vec![(id, 90)]));
    h.now = 2 * SEC;
    h.answer(
        id,
        Attempt::Finished {
            completion: completion(100),
            latency: SEC,
        },
    );
    assert_eq!(h.end, Some(End::Done));
    let p = h.core.snapshot(h.now, Status::Done);
    assert_eq!(p.total_output_tokens, 100);
    // 100 tokens over the run's two seconds, counted once.
    assert_eq!(p.output_tok_s, 50.0);
    assert_eq!(p.expected_output_tokens, Some(100.0));
}
