use super::*;

fn limits(pool: u64, chunk: Option<u64>, conservativeness: f64) -> Limits {
    Limits {
        pool,
        cap: 1000,
        chunk,
        max_prefill: 16384,
        conservativeness,
    }
}

fn lengths(prompt: u64, output: u64, max_new: u64) -> Lengths {
    Lengths {
        prompt,
        cached: 0,
        output,
        max_new,
    }
}

/// Runs the batch until it is idle, as the scheduler loop does; returns every finished item
/// with the step it finished after, and the requests retracted on the way.
fn drain(batch: &mut Batch<u32>) -> (Vec<(u32, u64)>, u64) {
    let (mut done, mut retracted, mut step) = (Vec::new(), 0, 0);
    while let Some(s) = batch.next() {
        assert!(
            batch.kv_used() <= batch.limits.pool,
            "{} KV tokens held in a pool of {}",
            batch.kv_used(),
            batch.limits.pool
        );
        if let Step::Decode { retracted: r, .. } = s {
            retracted += r;
            batch.decoded();
        }
        step += 1;
        done.extend(batch.finished().into_iter().map(|(_, item)| (item, step)));
    }
    (done, retracted)
}

/// A prefill step of `tokens` new tokens, nothing cached: `ids` finish their prompts, `chunks`
/// more are cut.
fn chunk(tokens: u64, ids: Vec<u64>, chunks: u64) -> Step {
    Step::Prefill {
        ids,
        tokens,
        cached: 0,
        chunks,
    }
}

#[test]
fn a_prompt_longer_than_the_chunk_is_prefilled_over_several_steps_before_its_first_token() {
    let mut batch = Batch::new(limits(100_000, Some(128), 1.0));
    batch.push(lengths(300, 3, 3), 0);
    assert_eq!(batch.next(), Some(chunk(128, vec![], 1)));
    assert_eq!(
        (batch.running(), batch.queued(), batch.kv_used()),
        (0, 0, 128)
    );
    assert_eq!(batch.next(), Some(chunk(128, vec![], 1)));
    assert_eq!(batch.next(), Some(chunk(44, vec![0], 0)));
    assert_eq!(batch.get(0).map(|(_, generated)| generated), Some(1));
    assert_eq!(
        (batch.running(), batch.queued(), batch.kv_used()),
        (1, 0, 301)
    );
    // Without chunking the whole prompt is one prefill.
    let mut whole = Batch::new(limits(100_000, None, 1.0));
    whole.push(lengths(300, 3, 3), 0);
    assert_eq!(whole.next(), Some(chunk(300, vec![0], 0)));
}

#[test]
fn the_chunk_budget_is_shared_and_the_request_that_overflows_it_is_cut() {
    let mut batch = Batch::new(limits(100_000, Some(128), 1.0));
    for i in 0..3 {
        batch.push(lengths(100, 5, 5), i);
    }
    assert_eq!(batch.next(), Some(chunk(128, vec![0], 1)));
    // The cut request's last 72 tokens come first; the third is cut at the 56 left.
    assert_eq!(batch.next(), Some(chunk(128, vec![1], 1)));
    assert_eq!(batch.next(), Some(chunk(44, vec![2], 0)));
    let (done, _) = drain(&mut batch);
    assert_eq!(done.len(), 3);
}

#[test]
fn without_chunking_the_input_budget_stops_a_batch_but_never_its_first_request() {
    let mut batch = Batch::new(limits(100_000, None, 1.0));
    batch.push(lengths(20_000, 2, 2), 0);
    batch.push(lengths(10, 2, 2), 1);
    let Some(Step::Prefill { ids, tokens, .. }) = batch.next() else {
        panic!("a prefill first");
    };
    assert_eq!((ids, tokens), (vec![0], 20_000));
}

/// Admitted before the first decode step, then in the next prefill: each new request needs its
/// extend, its max_new_tokens and a page below what the running ones are expected to take.
fn admitted(conservativeness: f64) -> usize {
    let mut batch = Batch::new(limits(10_000, Some(8192), conservativeness));
    for i in 0..30 {
        batch.push(lengths(100, 1000, 1000), i);
    }
    while let Some(Step::Prefill { .. }) = batch.next() {}
    batch.running()
}

#[test]
fn a_lower_schedule_conservativeness_admits_more_requests_into_the_same_pool() {
    // 9 fit at once (9 × 1101 < 10,000). At a ratio of 1 the 9 running are expected to
    // take all of their 999 tokens to come, so no more fit; at 0.7 three more prefills admit
    // 2, then 1; at 0.21 nearly the whole queue fits.
    assert_eq!(admitted(1.0 / 0.7), 9);
    assert_eq!(admitted(1.0), 12);
    assert_eq!(admitted(0.3), 29);
}

#[test]
fn the_ratio_decays_over_600_decode_steps_and_resets_when_idle() {
    let mut batch = Batch::new(limits(1_000_000, None, 1.0));
    batch.push(lengths(10, 2000, 2000), 0);
    assert!(matches!(batch.next(), Some(Step::Prefill { .. })));
    for _ in 0..300 {
        assert!(matches!(batch.next(), Some(Step::Decode { .. })));
        batch.decoded();
    }
    let half = 0.7 - (0.7 - 0.7 * 0.14) / 2.0;
    assert!((batch.new_token_ratio() - half).abs() < 1e-9);
    for _ in 0..400 {
        batch.next();
        batch.decoded();
    }
    assert!((batch.new_token_ratio() - 0.7 * 0.14).abs() < 1e-9);
    batch.idle();
    assert_eq!(batch.new_token_ratio(), 0.7);
}

#[test]
fn a_full_pool_retracts_the_shortest_outputs_and_every_request_still_finishes_once() {
    // At conservativeness 0.1 admission expects 7% of each max_new_tokens, so the batch
    // outgrows the pool as it decodes.
    let mut batch = Batch::new(limits(6_000, None, 0.1));
    for i in 0..40 {
        batch.push(lengths(50, 400 + 10 * i as u64, 1000), i);
    }
    let (done, retracted) = drain(&mut batch);
    assert!(retracted > 0, "nothing was retracted");
    let mut items: Vec<u32> = done.iter().map(|(item, _)| *item).collect();
    items.sort_unstable();
    assert_eq!(items, (0..40).collect::<Vec<_>>());
    assert!(batch.is_idle());
    // Retraction raised the ratio to what the survivors had shown.
    assert!(batch.new_token_ratio() > 0.07);
}

#[test]
fn a_retracted_request_keeps_its_output_and_re_prefills_it() {
    let mut batch = Batch::new(limits(400, None, 0.01));
    batch.push(lengths(100, 150, 150), 0);
    batch.push(lengths(100, 150, 150), 1);
    let mut decoded = 0;
    let retracted = loop {
        match batch.next() {
            Some(Step::Prefill { .. }) => {}
            Some(Step::Decode { retracted: 0, .. }) => {
                batch.decoded();
                decoded += 1;
            }
            Some(Step::Decode { retracted, .. }) => break retracted,
            None => panic!("idle before the pool filled"),
        }
    };
    // Both hold 101 + 99 tokens after 99 steps: the 100th would need 402 of the 400.
    assert_eq!(
        (decoded, retracted, batch.running(), batch.queued()),
        (99, 1, 1, 1)
    );
    batch.decoded();
    let generated: Vec<u64> = batch.each_running().map(|(_, _, g)| g).collect();
    assert_eq!(generated, [101]);
    // The survivors' 100 tokens and 20 steps' worth each, over their 150 asked.
    assert!((batch.new_token_ratio() - 120.0 / 151.0).abs() < 1e-9);
    let (done, _) = drain(&mut batch);
    assert_eq!(done.len(), 2);
}

#[test]
fn a_client_that_went_away_is_dropped_from_the_queue_the_chunk_and_the_batch() {
    let mut batch = Batch::new(limits(100_000, Some(64), 1.0));
    batch.push(lengths(10, 50, 50), 1);
    batch.push(lengths(100, 50, 50), 2);
    batch.push(lengths(10, 50, 50), 3);
    batch.next();
    assert_eq!((batch.running(), batch.queued()), (1, 1));
    batch.drop_gone(|item| *item != 3);
    assert_eq!(
        (batch.running(), batch.queued(), batch.kv_used()),
        (0, 1, 0)
    );
    let (done, _) = drain(&mut batch);
    assert_eq!(done.iter().map(|(i, _)| *i).collect::<Vec<_>>(), [3]);
}
