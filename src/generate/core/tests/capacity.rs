//! What the servers really run, on fake time: a dense server's KV pool below its request cap,
//! the same stale `/metrics` reading read again and again, the open-file budget, fleet running
//! out of open files, a watchdog that says a thing once, and a short run's final rate.

use super::*;
use crate::generate::concurrency::FileBudget;
use crate::generate::watchdog::ClientBound;

/// SGLang 0.5.23 on a dense tiny Llama: the general cap of 4096 over a 16,384-token pool.
fn dense(name: &str) -> Server {
    Server {
        info: Ok(ServerInfo::from_json(json!({
            "version": "0.5.23", "max_total_num_tokens": 16384, "context_length": 2048,
            "served_model_name": "llama",
            "internal_states": [{"effective_max_running_requests_per_dp": 4096}],
        }))),
        ..server(name, 0)
    }
}

fn max_tokens(n: u32) -> CoreConfig {
    let mut c = cfg();
    c.max_tokens = n;
    c
}

fn out_of_files() -> ClientError {
    ClientError::OutOfFiles {
        url: "u".into(),
        reason: "Too many open files (os error 24)".into(),
    }
}

fn limit(h: &Harness, i: usize) -> u32 {
    h.core.instances()[i].concurrency
}

#[test]
fn a_dense_server_gets_what_its_pool_holds_not_its_cap() {
    let mut h = Harness::with(max_tokens(48), Baseline::default(), vec![dense("a")]);
    let mut next = 0;
    h.fill(&mut next, 10_000);
    // 16,384 / 48 = 341 requests, plus a margin of an eighth: not 4096.
    assert_eq!(h.out_on(0), 341 + 42);
    assert_eq!(limit(&h, 0), 383);
}

#[test]
fn the_first_answer_replaces_the_max_tokens_guess_before_any_tick() {
    // 16 output tokens alone guess that 1,024 fit; the prompts are 48 tokens long.
    let mut h = Harness::with(max_tokens(16), Baseline::default(), vec![dense("a")]);
    let mut next = 0;
    h.fill(&mut next, 10_000);
    assert_eq!(limit(&h, 0), 1024 + 128);
    let mut c = completion(16);
    c.prompt_tokens = 48;
    let id = h.oldest();
    h.answer(
        id,
        Attempt::Finished {
            completion: c,
            latency: SEC,
        },
    );
    // 16,384 / 64 = 256 run at once; auto keeps at most twice that and a margin, at once, so
    // a job that ends before the next metrics tick never reports the guess.
    assert_eq!(limit(&h, 0), 2 * 256 + 32);
}

#[test]
fn the_same_stale_reading_moves_the_limit_once() {
    // A 512-token worst case says 32 fit; the server idles at what fleet sends.
    let mut h = Harness::with(max_tokens(512), Baseline::default(), vec![dense("a")]);
    let mut next = 0;
    h.fill(&mut next, 10_000);
    assert_eq!(limit(&h, 0), 36);
    // The gauges refresh every 40 decode steps: the same numbers for 20 s of scrapes.
    for s in 1..=20 {
        h.at(s * SEC);
        h.probe(0, Harness::metrics(36.0, 0.0, 420.5));
        h.fill(&mut next, 10_000);
    }
    assert_eq!(limit(&h, 0), 45, "one reading, one step up");
    h.at(21 * SEC);
    h.probe(0, Harness::metrics(45.0, 0.0, 431.0));
    assert_eq!(limit(&h, 0), 56, "a new reading acts again");
}

#[test]
fn fleet_out_of_files_never_takes_a_server_out_nor_spends_a_retry() {
    let mut h = Harness::new(vec![server("a", 8)]);
    h.lines(0, 1);
    h.on(Input::InputEnd);
    for _ in 0..10 {
        h.err(h.oldest(), out_of_files());
        h.probe(0, ProbeResult::Metrics(Err(out_of_files())));
        h.until_sent();
    }
    h.ok(h.oldest());
    assert_eq!(h.end, Some(End::Done));
    assert_eq!(h.completions.len(), 1);
    assert!(h.failures.is_empty() && h.retries.is_empty());
    assert_eq!(
        h.events_matching(|e| matches!(e, Event::InstanceDown { .. } | Event::Paused { .. })),
        0
    );
    assert_eq!(
        h.events_matching(|e| matches!(e, Event::OutOfFiles { .. })),
        1,
        "said once"
    );
}

#[test]
fn the_file_budget_holds_auto_and_says_so_once() {
    let mut c = max_tokens(48);
    c.files = Some(FileBudget {
        open_files_limit: 256,
        max_in_flight: 100,
    });
    let mut h = Harness::with(c, Baseline::default(), vec![dense("a"), dense("b")]);
    let mut next = 0;
    h.fill(&mut next, 10_000);
    assert_eq!((h.out_on(0), h.out_on(1)), (50, 50));
    for s in 1..=5 {
        h.at(s * SEC);
        h.probe(0, Harness::metrics(50.0, 0.0, f64::from(s)));
        h.fill(&mut next, 10_000);
    }
    assert_eq!(h.out.len(), 100, "never past the budget");
    let said: Vec<&Event> = h
        .events
        .iter()
        .filter(|e| matches!(e, Event::FileBudget { .. }))
        .collect();
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(matches!(
        said[0],
        Event::FileBudget {
            max_in_flight: 100,
            wanted: 383,
            per_server: 50,
            ..
        }
    ));
}

/// 90 s of readings whose numbers move every second, after a 10 s warm-up.
fn low_running(mode: ConcurrencyMode) -> Harness {
    let mut c = cfg();
    c.warmup = 10 * SEC;
    c.concurrency = mode;
    let mut h = Harness::with(c, Baseline::default(), vec![server("a", 72)]);
    let mut next = 0;
    h.fill(&mut next, 100_000);
    for s in 0..=90u32 {
        h.at(s * SEC);
        let running = 16.0 + f64::from(s % 3);
        h.probe(0, Harness::metrics(running, 0.0, 200.0 + f64::from(s)));
    }
    h
}

#[test]
fn the_watchdog_says_its_warning_once_whatever_its_numbers() {
    let h = low_running(ConcurrencyMode::Fixed(16));
    let found: Vec<&Finding> = h
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Watchdog(f) => Some(f),
            _ => None,
        })
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(matches!(
        found[0].cause,
        Cause::ClientLimited {
            by: ClientBound::FixedConcurrency,
            ..
        }
    ));
    assert!(found[0].message().contains("use --concurrency auto"));
    assert_eq!(h.progress.last().unwrap().warnings.len(), 1);
}

#[test]
fn the_watchdog_never_advises_auto_to_a_run_that_uses_it() {
    let h = low_running(ConcurrencyMode::Auto);
    assert_eq!(h.events_matching(|e| matches!(e, Event::Watchdog(_))), 0);
}

#[test]
fn a_short_run_ends_with_its_real_rate() {
    let mut h = Harness::new(vec![server("a", 8)]);
    h.lines(0, 4);
    h.on(Input::InputEnd);
    h.now = 500 * MS;
    while !h.out.is_empty() {
        h.ok(h.oldest());
    }
    assert_eq!(h.end, Some(End::Done));
    let p = h.core.snapshot(h.now, Status::Done);
    assert_eq!(p.rate_per_sec, 8.0, "4 completions in 0.5 s");
    assert_eq!(p.instances[0].rate_per_sec, 8.0);
}
