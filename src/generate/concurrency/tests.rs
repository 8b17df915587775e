//! The in-flight limit against the numbers real servers report.

use super::*;

fn cap(cap: u64) -> Capacity {
    Capacity {
        cap: Some(cap),
        kv_tokens: None,
    }
}

fn reading(running: f64, queued: f64, rate: f64) -> Gauges {
    Gauges {
        running,
        queued,
        gen_throughput: Some(rate),
        token_usage: None,
    }
}

/// SGLang 0.5.23 on a dense tiny Llama with a 16,384-token pool: cap 4096.
fn dense() -> Capacity {
    Capacity {
        cap: Some(4096),
        kv_tokens: Some(16_384),
    }
}

#[test]
fn starts_at_what_the_server_really_runs_plus_margin() {
    let auto = ConcurrencyMode::Auto;
    assert_eq!(Controller::new(auto, cap(72), 1.0, u32::MAX).limit(), 81);
    assert_eq!(Controller::new(auto, cap(8), 1.0, u32::MAX).limit(), 10);
    assert_eq!(
        Controller::new(auto, Capacity::default(), 1.0, u32::MAX).limit(),
        64
    );
    let fixed = ConcurrencyMode::Fixed(32);
    assert_eq!(Controller::new(fixed, cap(72), 1.0, u32::MAX).limit(), 32);
    // 48 prompt + 4 output tokens: the pool holds 315, not 4096.
    let c = Controller::new(auto, dense(), 52.0, u32::MAX);
    assert_eq!(c.fit(), Some(315));
    assert_eq!(c.limit(), 315 + 39);
}

#[test]
fn the_observed_request_size_replaces_the_max_tokens_estimate() {
    // max_tokens 512 says 32 fit; requests really hold 64 tokens, so 256 do.
    let mut c = Controller::new(ConcurrencyMode::Auto, dense(), 512.0, u32::MAX);
    assert_eq!(c.limit(), 36);
    c.set_tokens_per_request(64.0);
    assert_eq!(c.fit(), Some(256));
    assert_eq!(c.limit(), 288);
}

#[test]
fn steady_when_batch_full_and_queue_short() {
    let mut c = Controller::new(ConcurrencyMode::Auto, cap(72), 1.0, u32::MAX);
    c.observe(reading(72.0, 9.0, 1000.0), 81);
    assert_eq!(c.limit(), 81);
}

#[test]
fn grows_when_the_server_idles_and_shrinks_to_running_plus_margin_when_it_queues() {
    let mut c = Controller::new(ConcurrencyMode::Auto, cap(72), 1.0, u32::MAX);
    // Another client shares the server, or prompts are short: running below cap, no queue.
    assert!(c.observe(reading(60.0, 0.0, 900.0), 81));
    assert_eq!(c.limit(), 101);
    // A queue while the batch still grows is prefill catching up: no cut.
    c.observe(reading(66.0, 35.0, 950.0), 101);
    assert_eq!(c.limit(), 101);
    // A queue with the batch no longer growing: the server is full.
    c.observe(reading(66.0, 35.0, 960.0), 101);
    assert_eq!(c.limit(), 88);
    // Never above twice the fit plus margin, never below what runs plus margin.
    for i in 0..100 {
        c.observe(reading(0.0, 0.0, f64::from(i)), c.limit());
    }
    assert_eq!(c.limit(), 153);
    for i in 0..100 {
        c.observe(reading(40.0, 500.0, f64::from(i)), c.limit());
    }
    assert_eq!(c.limit(), 49);
}

#[test]
fn the_same_stale_reading_is_acted_on_once() {
    // A dense server whose pool holds ~300 while fleet's estimate said 32: the server idles
    // below its cap with an empty queue, but its gauges refresh only every 40 decode steps.
    let mut c = Controller::new(ConcurrencyMode::Auto, dense(), 512.0, u32::MAX);
    let stale = reading(36.0, 0.0, 420.5);
    assert!(c.observe(stale, 36));
    let after_one = c.limit();
    assert_eq!(after_one, 45);
    for _ in 0..20 {
        assert!(!c.observe(stale, after_one));
    }
    assert_eq!(
        c.limit(),
        after_one,
        "one reading read 20 times moved it once"
    );
    // The next refresh (same counts, another rate) is new.
    assert!(c.observe(reading(45.0, 0.0, 431.0), after_one));
    assert_eq!(c.limit(), 56);
    // A full queue read again and again cuts once.
    let mut c = Controller::new(ConcurrencyMode::Auto, cap(72), 1.0, u32::MAX);
    c.observe(reading(60.0, 30.0, 1.0), 81);
    let full = reading(60.0, 30.0, 2.0);
    c.observe(full, 81);
    assert_eq!(c.limit(), 71, "81 less half the excess queue (30 - 9)");
    for _ in 0..10 {
        assert!(!c.observe(full, 71));
    }
    assert_eq!(c.limit(), 71);
}

#[test]
fn a_pessimistic_start_catches_up_in_a_few_readings() {
    let mut c = Controller::new(ConcurrencyMode::Auto, dense(), 4096.0 + 48.0, u32::MAX);
    assert_eq!(c.limit(), 5);
    let mut readings = 0;
    while c.limit() < 300 {
        let l = c.limit();
        c.observe(reading(f64::from(l), 0.0, f64::from(readings)), l);
        readings += 1;
        assert!(
            readings < 30,
            "still {} after {readings} readings",
            c.limit()
        );
    }
}

#[test]
fn the_open_file_budget_bounds_every_mode() {
    let mut c = Controller::new(ConcurrencyMode::Auto, dense(), 52.0, 200);
    assert_eq!(c.limit(), 200);
    assert!(c.held_by_budget());
    assert_eq!(c.wanted(), 354);
    c.observe(reading(150.0, 0.0, 1.0), 200);
    assert_eq!(c.limit(), 200);
    let c = Controller::new(ConcurrencyMode::Fixed(400), dense(), 52.0, 200);
    assert_eq!(c.limit(), 200);
    assert!(c.held_by_budget());
    let c = Controller::new(ConcurrencyMode::Auto, cap(72), 1.0, 200);
    assert_eq!(c.limit(), 81);
    assert!(!c.held_by_budget());
}

#[test]
fn idle_client_slots_do_not_grow_the_limit() {
    let mut c = Controller::new(ConcurrencyMode::Auto, cap(72), 1.0, u32::MAX);
    c.observe(reading(10.0, 0.0, 5.0), 10);
    assert_eq!(c.limit(), 81);
}

#[test]
fn fixed_never_moves() {
    let mut c = Controller::new(ConcurrencyMode::Fixed(32), cap(72), 1.0, u32::MAX);
    assert!(!c.observe(reading(32.0, 0.0, 1.0), 32));
    assert_eq!(c.limit(), 32);
    assert!("0".parse::<ConcurrencyMode>().is_err());
    assert_eq!("auto".parse::<ConcurrencyMode>(), Ok(ConcurrencyMode::Auto));
}

#[test]
fn the_file_budget_leaves_room_for_the_job_files() {
    // `ulimit -n 1024` with 2 servers behind fleet's forwards: 2 descriptors a request.
    // 932 descriptors are left for sockets, and an eighth of them for connections churning.
    let b = FileBudget::new(1024, 20, 2, 2);
    assert_eq!(b.max_in_flight, (932 - 116) / 2);
    assert_eq!(b.per_server(2), 204);
    let direct = FileBudget::new(1024, 20, 2, 1);
    assert_eq!(direct.max_in_flight, 816);
    assert_eq!(FileBudget::new(64, 60, 2, 2).max_in_flight, 1);
}
