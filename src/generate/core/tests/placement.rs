//! The core through the placement seam: it sends where the policy says, hands it every request
//! ready to go with what the request holds, and tells it what became of each.

use std::collections::VecDeque;
use std::sync::Mutex;

use super::*;
use crate::generate::core::placement::{
    Outcome, Placement, Request as Placed, ServerState, Ticket,
};

/// What the policy was told, in order.
#[derive(Debug, Default)]
struct Log {
    /// (ticket, id, prompt text, avoid, handed back to go first)
    handed: Vec<(u64, String, String, Option<usize>, bool)>,
    outcomes: Vec<String>,
}

/// Sends every request to the last server with room: a choice least-loaded never makes.
struct LastWithRoom {
    queue: VecDeque<Ticket>,
    log: Arc<Mutex<Log>>,
}

impl LastWithRoom {
    fn hand(&mut self, r: Placed<'_>, first: bool) {
        let text = match &r.req.prompt {
            Prompt::Text(t) => t.clone(),
            Prompt::Messages(m) => m.to_string(),
        };
        let entry = (r.ticket.0, r.id.text.clone(), text, r.avoid, first);
        self.log.lock().unwrap().handed.push(entry);
        if first {
            self.queue.push_front(r.ticket);
        } else {
            self.queue.push_back(r.ticket);
        }
    }
}

impl Placement for LastWithRoom {
    fn queue(&mut self, r: Placed<'_>) {
        self.hand(r, false);
    }
    fn requeue(&mut self, r: Placed<'_>) {
        self.hand(r, true);
    }
    fn next(&mut self, servers: &[ServerState]) -> Option<(Ticket, usize)> {
        let server = servers.iter().rposition(|s| s.free() > 0)?;
        Some((self.queue.pop_front()?, server))
    }
    fn wants_input(&self, servers: &[ServerState]) -> bool {
        self.queue.is_empty() && servers.iter().any(|s| s.free() > 0)
    }
    fn clear(&mut self) {
        self.queue.clear();
    }
    fn observe(&mut self, o: Outcome<'_>) {
        let said = match o {
            Outcome::Finished {
                ticket,
                server,
                completion,
            } => format!(
                "finished {} on {server}: {} tokens",
                ticket.0, completion.completion_tokens
            ),
            Outcome::Failed {
                ticket,
                server,
                error,
            } => format!("failed {} on {server}: {error}", ticket.0),
            Outcome::ServerOut(i) => format!("out {i}"),
            Outcome::ServerIn(i) => format!("in {i}"),
        };
        self.log.lock().unwrap().outcomes.push(said);
    }
}

fn placed_by_last_with_room(servers: Vec<Server>) -> (Harness, Arc<Mutex<Log>>) {
    let log = Arc::new(Mutex::new(Log::default()));
    let policy = LastWithRoom {
        queue: VecDeque::new(),
        log: log.clone(),
    };
    let core = Core::with_placement(cfg(), Baseline::default(), servers, Box::new(policy));
    let h = Harness {
        core,
        ..Harness::new(Vec::new())
    };
    (h, log)
}

#[test]
fn requests_go_where_the_policy_says_and_it_sees_each_request() {
    let (mut h, log) = placed_by_last_with_room(vec![server("a", 8), server("b", 8)]);
    let mut next = 0;
    h.fill(&mut next, 15);
    // b's limit is 10 (cap 8 + margin): the rest go to a.
    assert_eq!((h.out_on(0), h.out_on(1)), (5, 10));
    assert!(h.sends[..10].iter().all(|(_, i)| *i == 1));
    let log = log.lock().unwrap();
    assert_eq!(log.handed.len(), 15);
    assert_eq!(
        log.handed[3],
        (3, "p3".to_string(), "prompt 3".to_string(), None, false)
    );
}

#[test]
fn the_policy_hears_outcomes_and_gets_back_what_a_lost_server_held() {
    let (mut h, log) = placed_by_last_with_room(vec![server("a", 8), server("b", 8)]);
    h.lines(0, 3);
    let mut on_b: Vec<ReqId> = h.out.keys().copied().collect();
    on_b.sort();
    h.ok(on_b[0]);
    h.err(on_b[1], status(400));
    h.err(on_b[2], refused());
    // The refused connection took b out; its last request came back, to go first, avoiding b.
    assert_eq!(h.sends.last().unwrap().1, 0);
    h.later(SEC);
    h.probe(1, ProbeResult::Revive(Ok(info(8))));
    let log = log.lock().unwrap();
    assert_eq!(
        log.outcomes,
        [
            "finished 0 on 1: 100 tokens",
            "failed 1 on 1: u: HTTP 400: ",
            "failed 2 on 1: u: cannot connect: Connection refused",
            "out 1",
            "in 1",
        ]
    );
    assert_eq!(log.handed.len(), 4);
    let back = &log.handed[3];
    assert_eq!((back.0, back.3, back.4), (2, Some(1), true));
}

/// Answers `n` requests out with `prompt` tokens each, of them `cached` from the cache.
fn answer_cached(h: &mut Harness, n: usize, prompt: u64, cached: u64) {
    for _ in 0..n {
        let id = h.oldest();
        let completion = Completion {
            prompt_tokens: prompt,
            cached_tokens: Some(cached),
            ..completion(4)
        };
        h.answer(
            id,
            Attempt::Finished {
                completion,
                latency: SEC,
            },
        );
    }
}

#[test]
fn a_cache_that_serves_far_less_than_the_prefix_plan_expected_is_flagged_once_in_progress() {
    let mut h = Harness::new(vec![server("a", 8), server("b", 8)]);
    // 4 groups of a 1,000-token prefix: judged after 16,000 answered prompt tokens.
    h.core.expect_cache(CacheExpectation {
        cached_fraction: 0.9,
        prefix_tokens: 4_000,
    });
    let mut next = 0;
    h.fill(&mut next, 100);
    // Misses only, but too few tokens yet to tell from each group's first prefill.
    answer_cached(&mut h, 15, 1_000, 0);
    h.fill(&mut next, 100);
    h.later(10 * SEC);
    let flagged = |h: &Harness| h.events_matching(|e| matches!(e, Event::Watchdog(_)));
    assert_eq!(flagged(&h), 0);
    answer_cached(&mut h, 5, 1_000, 200);
    h.fill(&mut next, 100);
    h.later(10 * SEC);
    assert_eq!(flagged(&h), 1);
    let f = h
        .events
        .iter()
        .find_map(|e| match e {
            Event::Watchdog(f) => Some(f.clone()),
            _ => None,
        })
        .unwrap();
    assert!(
        matches!(&f.cause, Cause::LowCacheHits { observed, expected, .. }
            if (*observed - 0.05).abs() < 1e-9 && *expected == 0.9),
        "{f:?}"
    );
    let p = h.core.snapshot(h.now, Status::Running);
    assert!(
        p.warnings.iter().any(
            |w| w.starts_with("WATCHDOG: the servers' radix caches served 5% of prompt tokens")
        ),
        "{:?}",
        p.warnings
    );
    // Said once; and a warning, not a stop.
    h.later(10 * SEC);
    assert_eq!(flagged(&h), 1);
    assert!(h.end.is_none());
}

#[test]
fn a_cache_that_serves_what_the_plan_expected_is_quiet() {
    let mut h = Harness::new(vec![server("a", 8)]);
    h.core.expect_cache(CacheExpectation {
        cached_fraction: 0.9,
        prefix_tokens: 1_000,
    });
    let mut next = 0;
    h.fill(&mut next, 100);
    answer_cached(&mut h, 8, 1_000, 950);
    h.later(10 * SEC);
    assert_eq!(h.events_matching(|e| matches!(e, Event::Watchdog(_))), 0);
}
