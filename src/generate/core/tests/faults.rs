//! Instances going out and coming back, pausing and the stall timeout, the wind-down after a
//! stop, the watchdog, and how a run ends.

use super::*;
use crate::remote::LinkLoss;

fn two() -> Harness {
    Harness::new(vec![server("a", 8), server("b", 8)])
}

fn failed_probe() -> ProbeResult {
    ProbeResult::Metrics(Err(refused()))
}

#[test]
fn a_refused_connection_takes_the_instance_out_and_moves_its_requests_without_spending_retries() {
    let mut h = two();
    let mut next = 0;
    h.fill(&mut next, 30);
    assert_eq!((h.out_on(0), h.out_on(1)), (10, 10));
    h.err(h.oldest_on(0), refused());
    assert_eq!(h.aborts, [0], "its other requests are dropped there");
    assert_eq!(h.out_on(0), 0);
    assert_eq!(
        h.events_matching(
            |e| matches!(e, Event::InstanceDown { name, .. } if *name == ServerId::named("a"))
        ),
        1
    );
    // The ten taken back wait for b's room, first in line: nothing is failed or retried later.
    assert!(h.failures.is_empty());
    let sends_before = h.sends.len();
    h.ok(h.oldest_on(1));
    assert_eq!(h.sends.len(), sends_before + 1);
    assert_eq!(h.sends.last().unwrap().1, 1);
}

#[test]
fn a_dropped_connection_sends_the_request_elsewhere_and_keeps_the_instance() {
    let mut h = two();
    h.lines(1, 2);
    let (id, first) = h.sends[0];
    h.err(id, reset());
    let (_, second) = *h.sends.last().unwrap();
    assert_eq!(h.sends.len(), 2, "at once, no backoff");
    assert_ne!(first, second);
    assert!(h.core.instances().iter().all(|i| i.unavailable.is_none()));
    assert!(h.aborts.is_empty());
    assert_eq!(
        h.events_matching(|e| matches!(e, Event::InstanceDown { .. })),
        0
    );
}

#[test]
fn answers_of_requests_taken_back_are_ignored_so_each_prompt_is_written_once() {
    let mut h = two();
    h.lines(1, 2);
    let (id, inst) = h.sends[0];
    h.on(Input::Probe {
        inst,
        result: failed_probe(),
    });
    h.probe(inst, failed_probe());
    h.probe(inst, failed_probe());
    assert!(h.aborts.contains(&inst));
    let (moved, _) = *h.sends.last().unwrap();
    assert_ne!(moved, id);
    // The old request's answer arrives anyway: it is not written.
    h.on(Input::Done {
        id,
        attempt: Attempt::Finished {
            completion: completion(5),
            latency: SEC,
        },
    });
    assert!(h.completions.is_empty());
    h.ok(moved);
    assert_eq!(h.completions.len(), 1);
}

#[test]
fn three_failed_probes_in_a_row_take_an_instance_out_and_a_success_resets_the_count() {
    let mut h = two();
    h.probe(0, failed_probe());
    h.probe(0, failed_probe());
    h.probe(0, Harness::metrics(1.0, 0.0, 10.0));
    h.probe(0, failed_probe());
    h.probe(0, failed_probe());
    assert_eq!(
        h.events_matching(|e| matches!(e, Event::InstanceDown { .. })),
        0
    );
    h.probe(0, failed_probe());
    let down: Vec<&Event> = h
        .events
        .iter()
        .filter(|e| matches!(e, Event::InstanceDown { .. }))
        .collect();
    assert_eq!(down.len(), 1);
    let Event::InstanceDown { reason, .. } = down[0] else {
        unreachable!()
    };
    assert!(
        reason
            .to_string()
            .starts_with("3 failed health checks; last:"),
        "{reason}"
    );
}

#[test]
fn without_metrics_liveness_comes_from_server_info_every_few_seconds() {
    let mut h = Harness::new(vec![server("a", 8)]);
    h.at(Time::ZERO);
    h.probe(
        0,
        ProbeResult::Metrics(Err(ClientError::Status {
            url: "u".into(),
            status: 404,
            body: "Not Found".into(),
        })),
    );
    for s in 1..=5 {
        h.at(s * SEC);
    }
    assert_eq!(
        h.probes,
        [(0, ProbeKind::Metrics), (0, ProbeKind::Alive)],
        "no more /metrics; /server_info at the liveness period"
    );
    h.probe(0, ProbeResult::Alive(Err(refused())));
    h.later(5 * SEC);
    assert_eq!(h.probes.last(), Some(&(0, ProbeKind::Alive)));
}

#[test]
fn an_instance_that_is_out_is_revived_with_its_new_cap_and_gets_work_again() {
    let mut h = two();
    h.err_on_connect(0);
    // The metrics probe that was out when it went down answers late: one probe at a time.
    h.later(SEC);
    assert!(!h.probes.contains(&(0, ProbeKind::Revive)));
    h.probe(0, failed_probe());
    h.later(SEC);
    assert!(h.probes.contains(&(0, ProbeKind::Revive)));
    h.probe(0, ProbeResult::Revive(Ok(info(16))));
    assert_eq!(
        h.events_matching(|e| matches!(
            e,
            Event::InstanceUp {
                server_cap: Some(16),
                ..
            }
        )),
        1
    );
    let mut next = 100;
    h.fill(&mut next, 200);
    assert_eq!(h.out_on(0), 18, "cap 16 + margin");
}

#[test]
fn a_server_that_did_not_answer_at_start_is_out_until_it_does() {
    let down = Server {
        info: Err(refused()),
        ..server("b", 8)
    };
    let mut h = Harness::new(vec![server("a", 8), down]);
    assert_eq!(
        h.core.instances()[1].unavailable.as_deref(),
        Some("u: cannot connect: Connection refused")
    );
    let mut next = 0;
    h.fill(&mut next, 100);
    assert_eq!((h.out_on(0), h.out_on(1)), (10, 0));
    assert!(h.probes.contains(&(1, ProbeKind::Revive)));
}

#[test]
fn with_nothing_healthy_the_run_pauses_and_resumes_by_itself() {
    let mut h = Harness::new(vec![server("a", 8)]);
    h.lines(1, 3);
    h.err(h.oldest(), refused());
    assert_eq!(h.events_matching(|e| matches!(e, Event::Paused { .. })), 1);
    assert!(!h.core.wants_input());
    assert!(h.out.is_empty(), "nothing to send to");
    h.later(SEC);
    h.probe(0, ProbeResult::Revive(Ok(info(8))));
    assert_eq!(h.events_matching(|e| matches!(e, Event::Resumed)), 1);
    assert_eq!(h.out.len(), 2, "both prompts went out again");
    assert!(h.failures.is_empty());
}

#[test]
fn the_stall_timeout_ends_a_pause_with_nothing_written_as_failed() {
    let mut c = cfg();
    c.stall_timeout = Duration::from_secs(30);
    let mut h = Harness::with(c, Baseline::default(), vec![server("a", 8)]);
    h.lines(1, 3);
    h.err(h.oldest(), refused());
    h.later(29 * SEC);
    assert!(h.end.is_none());
    h.later(SEC);
    assert_eq!(h.end, Some(End::Stalled));
    assert!(h.failures.is_empty());
    assert_eq!(
        End::Stalled.status(true),
        Status::Interrupted,
        "an outage is not the job's failure: --resume goes on"
    );
}

#[test]
fn cancel_stops_dispatching_and_waits_for_what_is_in_flight() {
    let mut h = Harness::new(vec![server("a", 8)]);
    let mut next = 0;
    h.fill(&mut next, 100);
    h.on(Input::Cancel);
    assert_eq!(
        h.events_matching(|e| matches!(e, Event::Stopping { in_flight: 10, .. })),
        1
    );
    assert!(!h.core.wants_input());
    let sends = h.sends.len();
    let ids: Vec<ReqId> = {
        let mut v: Vec<_> = h.out.keys().copied().collect();
        v.sort();
        v
    };
    for id in &ids[..9] {
        h.ok(*id);
    }
    assert_eq!(h.sends.len(), sends, "nothing new goes out");
    assert!(h.end.is_none(), "one still in flight");
    h.ok(ids[9]);
    assert_eq!(h.end, Some(End::Interrupted));
    assert_eq!(h.completions.len(), 10);
    assert_eq!(End::Interrupted.status(true), Status::Interrupted);
}

#[test]
fn the_grace_period_ends_the_wind_down_and_drops_what_is_left() {
    let mut h = Harness::new(vec![server("a", 8)]);
    h.lines(1, 4);
    h.on(Input::Cancel);
    h.ok(h.oldest());
    h.later(29 * SEC);
    assert!(h.end.is_none());
    h.later(SEC);
    assert_eq!(h.end, Some(End::Interrupted));
    assert_eq!(h.aborts, [0]);
    assert_eq!(h.completions.len(), 1, "the rest is sent again by --resume");
    assert!(h.failures.is_empty());
}

#[test]
fn a_second_cancel_ends_the_grace_at_once() {
    let mut h = Harness::new(vec![server("a", 8)]);
    h.lines(1, 3);
    h.on(Input::Cancel);
    h.later(SEC);
    assert!(h.end.is_none());
    h.on(Input::Cancel);
    assert_eq!(h.end, Some(End::Interrupted));
}

#[test]
fn failures_during_the_wind_down_are_not_retried_or_written() {
    let mut h = Harness::new(vec![server("a", 8)]);
    h.lines(1, 3);
    h.on(Input::Cancel);
    h.err(h.oldest(), status(503));
    h.err(h.oldest(), reset());
    assert!(h.failures.is_empty());
    assert_eq!(h.end, Some(End::Interrupted));
    assert_eq!(h.sends.len(), 2);
}

#[test]
fn every_line_answered_ends_the_run_done() {
    let mut h = Harness::new(vec![server("a", 8)]);
    h.lines(1, 4);
    h.on(Input::InputEnd);
    h.ok(h.oldest());
    h.err(h.oldest(), status(400));
    assert!(h.end.is_none());
    h.ok(h.oldest());
    assert_eq!(h.end, Some(End::Done));
    assert_eq!((h.completions.len(), h.failures.len()), (2, 1));
    assert_eq!(End::Done.status(true), Status::Done);
    assert_eq!(
        End::Done.status(false),
        Status::Failed,
        "shards left to upload"
    );
    assert_eq!(h.core.next_wake(), None);
    assert!(
        h.core.on(h.now, Input::Tick).is_empty(),
        "nothing after the end"
    );
}

#[test]
fn a_retry_waiting_for_its_backoff_keeps_the_run_open() {
    let mut h = Harness::new(vec![server("a", 8)]);
    h.lines(1, 2);
    h.on(Input::InputEnd);
    h.err(h.oldest(), status(503));
    assert!(h.end.is_none());
    h.until_sent();
    h.ok(h.oldest());
    assert_eq!(h.end, Some(End::Done));
}

/// A run at warm-up end whose servers run far below what the sweep measured.
fn slow_run(abort_below: Option<f64>) -> Harness {
    let mut c = cfg();
    c.warmup = 10 * SEC;
    c.abort_below = abort_below;
    c.expected = Some(Expected {
        output_tok_s_per_gpu: 1180.0,
        max_running_requests: 72,
        output_tokens: None,
    });
    let mut h = Harness::with(c, Baseline::default(), vec![server("a", 37)]);
    let mut next = 0;
    h.fill(&mut next, 1000);
    for s in 0..=14 {
        h.at(s * SEC);
        h.probe(0, Harness::metrics(37.0, 9.0, 107.0));
    }
    h
}

#[test]
fn the_watchdog_names_the_cause_once_after_the_warm_up() {
    let h = slow_run(None);
    let found: Vec<&Finding> = h
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Watchdog(f) => Some(f),
            _ => None,
        })
        .collect();
    assert_eq!(found.len(), 1, "one cause, announced once");
    assert!(
        matches!(found[0].cause, Cause::ServerCap { .. }),
        "{:?}",
        found[0]
    );
    assert!(found[0].fraction < 0.1);
    assert!(h.end.is_none(), "a warning, not a stop");
}

#[test]
fn nothing_is_judged_during_the_warm_up() {
    let mut c = cfg();
    c.warmup = 60 * SEC;
    c.expected = Some(Expected {
        output_tok_s_per_gpu: 1180.0,
        max_running_requests: 72,
        output_tokens: None,
    });
    let mut h = Harness::with(c, Baseline::default(), vec![server("a", 37)]);
    for s in 0..30 {
        h.at(s * SEC);
        h.probe(0, Harness::metrics(37.0, 9.0, 107.0));
    }
    assert_eq!(h.events_matching(|e| matches!(e, Event::Watchdog(_))), 0);
}

#[test]
fn a_job_with_every_prompt_sent_is_not_judged_as_its_batches_drain() {
    let mut c = cfg();
    c.warmup = 10 * SEC;
    c.expected = Some(Expected {
        output_tok_s_per_gpu: 1180.0,
        max_running_requests: 72,
        output_tokens: None,
    });
    let mut h = Harness::with(c, Baseline::default(), vec![server("a", 37)]);
    // The last 20 prompts, all out: the batch shrinks and the rate falls, as at any job's end.
    h.lines(0, 20);
    h.on(Input::InputEnd);
    for s in 0..=14 {
        h.at(s * SEC);
        h.probe(0, Harness::metrics(20.0, 0.0, 107.0));
    }
    assert_eq!(h.events_matching(|e| matches!(e, Event::Watchdog(_))), 0);
}

#[test]
fn abort_below_stops_the_run_with_the_finding_and_still_hears_ctrl_c() {
    let mut h = slow_run(Some(0.5));
    assert_eq!(
        h.events_matching(
            |e| matches!(e, Event::Stopping { reason, .. } if reason.to_string().contains("--abort-below"))
        ),
        1
    );
    assert!(h.end.is_none(), "requests in flight may finish");
    // Ctrl-C during that wind-down is heard: the grace ends at once.
    h.on(Input::Cancel);
    assert!(matches!(h.end, Some(End::BelowExpected(_))), "{:?}", h.end);
    assert_eq!(
        End::BelowExpected(slow_run(None).core_finding()).status(true),
        Status::Failed
    );
}

impl Harness {
    /// Takes instance `i` out by a refused connection.
    fn err_on_connect(&mut self, i: usize) {
        let mut next = 1000;
        self.fill(&mut next, 2000);
        self.err(self.oldest_on(i), refused());
    }

    /// The watchdog's finding, for an `End` to carry.
    fn core_finding(&self) -> Finding {
        self.events
            .iter()
            .find_map(|e| match e {
                Event::Watchdog(f) => Some(f.clone()),
                _ => None,
            })
            .expect("a finding")
    }
}

#[test]
fn a_retry_prefers_another_instance_but_takes_the_same_one_when_it_alone_has_room() {
    let mut h = two();
    let mut next = 0;
    h.fill(&mut next, 19);
    // a is full, b has one slot left: b's failed request goes to b again rather than wait.
    let id = h.oldest_on(1);
    h.err(id, reset());
    assert_eq!(h.sends.last().unwrap().1, 1);
    assert_eq!((h.out_on(0), h.out_on(1)), (10, 9));
}

#[test]
fn a_prompt_whose_connections_keep_dropping_is_eventually_retried_with_backoff() {
    let mut h = Harness::new(vec![server("a", 8)]);
    h.lines(1, 2);
    for _ in 0..jobs::MAX_REDISPATCHES {
        let sends = h.sends.len();
        h.err(h.oldest(), reset());
        assert_eq!(h.sends.len(), sends + 1, "moved at once, no retry spent");
    }
    h.err(h.oldest(), reset());
    assert!(
        h.out.is_empty(),
        "now it waits for a backoff like any retry"
    );
    h.until_sent();
    assert!(h.failures.is_empty());
}

#[test]
fn an_input_with_nothing_left_to_do_ends_at_once() {
    let mut h = Harness::new(vec![server("a", 8)]);
    h.on(Input::InputEnd);
    assert_eq!(h.end, Some(End::Done));
    let mut h = Harness::new(vec![server("a", 8)]);
    h.lines(1, 2);
    h.err(h.oldest(), refused());
    assert!(!h.core.wants_input(), "paused: no reading either");
}

#[test]
fn a_lost_host_hands_its_work_to_the_other_host_at_once() {
    let mut h = Harness::new(vec![
        on_host("pve1", 0, 8),
        on_host("pve1", 1, 8),
        on_host("pve2", 0, 8),
    ]);
    let mut next = 0;
    h.fill(&mut next, 25);
    assert_eq!((h.out_on(0), h.out_on(1), h.out_on(2)), (9, 8, 8));
    h.on(Input::HostLost {
        host: "pve1".into(),
        reason: HostLoss::Dropped(LinkLoss::Keepalive {
            interval: 15 * SEC,
            max: 3,
        }),
    });
    assert_eq!(h.aborts, [0, 1]);
    assert_eq!(
        h.events_matching(|e| matches!(e, Event::HostLost { .. })),
        1
    );
    assert_eq!(
        h.events_matching(|e| matches!(e, Event::InstanceDown { .. })),
        2
    );
    assert_eq!(h.events_matching(|e| matches!(e, Event::Paused { .. })), 0);
    // pve2:gpu0 had room for 2 more: those go at once; the rest wait for it, first in line.
    assert_eq!(h.out_on(2), 10);
    assert!(h.failures.is_empty() && h.retries.is_empty());
    h.on(Input::HostBack {
        host: "pve1".into(),
    });
    assert_eq!(
        h.events_matching(|e| matches!(e, Event::HostBack { .. })),
        1
    );
    let revives: Vec<_> = h
        .probes
        .iter()
        .filter(|(_, k)| *k == ProbeKind::Revive)
        .collect();
    assert_eq!(
        revives.len(),
        0,
        "their metrics probes from the start are still out"
    );
    h.probe(0, failed_probe());
    h.probe(1, failed_probe());
    h.on(Input::HostBack {
        host: "pve1".into(),
    });
    assert!(
        h.probes
            .ends_with(&[(0, ProbeKind::Revive), (1, ProbeKind::Revive)])
    );
    h.probe(0, ProbeResult::Revive(Ok(info(8))));
    assert!(h.out_on(0) > 0, "back to work");
}

#[test]
fn a_request_failing_on_a_failing_host_prefers_another_host() {
    let mut h = Harness::new(vec![
        on_host("pve1", 0, 8),
        on_host("pve1", 1, 8),
        on_host("pve2", 0, 8),
    ]);
    h.lines(1, 2);
    let (id, first) = h.sends[0];
    assert_eq!(first, 0);
    // pve1:gpu0 refused: it is out, and its host is failing; pve1:gpu1 has more room than
    // pve2:gpu0 would after one more, but the retry goes to the other host.
    h.err(id, refused());
    assert_eq!(h.sends.last().unwrap().1, 2);
}

#[test]
fn a_paused_job_says_so_in_progress_until_something_is_back() {
    let mut h = Harness::new(vec![on_host("pve1", 0, 8)]);
    h.lines(1, 2);
    h.on(Input::HostLost {
        host: "pve1".into(),
        reason: HostLoss::Dropped(LinkLoss::Broken {
            message: "connection reset".into(),
        }),
    });
    let paused: Vec<&Event> = h
        .events
        .iter()
        .filter(|e| matches!(e, Event::Paused { .. }))
        .collect();
    assert_eq!(paused.len(), 1);
    let Event::Paused {
        instance, reason, ..
    } = paused[0]
    else {
        unreachable!()
    };
    assert_eq!(
        format!("{instance}: {reason}"),
        "pve1:gpu0: host pve1 lost: connection reset"
    );
    assert_eq!(
        h.core.snapshot(h.now, Status::Running).status,
        Status::Paused
    );
    h.later(SEC);
    h.probe(0, failed_probe());
    h.later(SEC);
    h.probe(0, ProbeResult::Revive(Ok(info(8))));
    assert_eq!(
        h.core.snapshot(h.now, Status::Running).status,
        Status::Running
    );
    assert_eq!(h.out.len(), 1, "the prompt went out again");
}
