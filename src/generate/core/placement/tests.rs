//! The least-loaded policy on fake servers: which server a request gets, in which order the
//! requests go, and when it wants more input.

use super::*;
use crate::sglang::client::{Api, Prompt};

fn up(in_flight: u32, limit: u32) -> ServerState {
    ServerState {
        up: true,
        in_flight,
        limit,
        host: None,
        host_failing: false,
        completed: 0,
    }
}

fn on_host(host: usize, failing: bool, s: ServerState) -> ServerState {
    ServerState {
        host: Some(host),
        host_failing: failing,
        ..s
    }
}

fn down(limit: u32) -> ServerState {
    ServerState {
        up: false,
        ..up(0, limit)
    }
}

/// Hands ticket `t` to `p` (through `requeue` when `front`), avoiding `avoid`.
fn hand(p: &mut LeastLoaded, t: u64, avoid: Option<usize>, front: bool) {
    let id = Id::line(t);
    let req = CompletionRequest {
        api: Api::Generate,
        prompt: Prompt::Text(format!("prompt {t}")),
        max_tokens: 16,
        temperature: None,
        top_p: None,
        model: None,
        extra: None,
    };
    let r = Request {
        ticket: Ticket(t),
        id: &id,
        line: t,
        req: &req,
        avoid,
    };
    if front {
        p.requeue(r);
    } else {
        p.queue(r);
    }
}

fn queued(tickets: &[u64]) -> LeastLoaded {
    let mut p = LeastLoaded::new();
    for t in tickets {
        hand(&mut p, *t, None, false);
    }
    p
}

/// Places until the policy stops, counting each placement on its server as the core does.
fn drain(p: &mut LeastLoaded, servers: &mut [ServerState]) -> Vec<(u64, usize)> {
    std::iter::from_fn(|| {
        let (t, i) = p.next(servers)?;
        servers[i].in_flight += 1;
        Some((t.0, i))
    })
    .collect()
}

#[test]
fn the_most_free_share_wins_not_the_most_free_slots() {
    let mut p = queued(&[0]);
    // 6 of 64 free is less room than 3 of 4.
    let servers = [up(58, 64), up(1, 4)];
    assert_eq!(p.next(&servers), Some((Ticket(0), 1)));
}

#[test]
fn a_tie_goes_to_the_first_server() {
    let mut p = queued(&[0, 1, 2]);
    let mut servers = [up(0, 2), up(0, 2)];
    assert_eq!(drain(&mut p, &mut servers), [(0, 0), (1, 1), (2, 0)]);
}

#[test]
fn requests_go_in_order_and_one_handed_back_goes_first() {
    let mut p = queued(&[0, 1]);
    hand(&mut p, 7, Some(1), true);
    let mut servers = [up(0, 8), up(0, 8)];
    let order: Vec<u64> = drain(&mut p, &mut servers)
        .iter()
        .map(|(t, _)| *t)
        .collect();
    assert_eq!(order, [7, 0, 1]);
}

#[test]
fn down_and_full_servers_get_nothing_and_the_head_of_the_queue_waits() {
    let mut p = queued(&[0, 1]);
    let mut servers = [down(8), up(4, 4), up(3, 4)];
    assert_eq!(drain(&mut p, &mut servers), [(0, 2)]);
    assert_eq!(p.next(&servers), None, "no room anywhere");
    servers[1].in_flight = 3;
    assert_eq!(p.next(&servers), Some((Ticket(1), 1)), "still queued");
}

#[test]
fn the_server_that_failed_a_request_gets_it_only_when_no_other_has_room() {
    let mut p = LeastLoaded::new();
    hand(&mut p, 0, Some(0), false);
    // Server 0 has far more room, but failed it.
    assert_eq!(p.next(&[up(0, 8), up(7, 8)]), Some((Ticket(0), 1)));
    hand(&mut p, 1, Some(0), false);
    assert_eq!(p.next(&[up(0, 8), up(8, 8)]), Some((Ticket(1), 0)));
}

#[test]
fn a_failing_host_is_avoided_as_a_whole_while_another_host_has_room() {
    // Servers 0 and 1 share host 0, which has a server out; server 2 is on host 1.
    let servers = [
        on_host(0, true, up(0, 8)),
        on_host(0, true, up(0, 8)),
        on_host(1, false, up(6, 8)),
    ];
    let mut p = LeastLoaded::new();
    hand(&mut p, 0, Some(0), false);
    assert_eq!(p.next(&servers), Some((Ticket(0), 2)));

    // A host that is not failing is not avoided: only the server itself is.
    let healthy = servers.map(|s| ServerState {
        host_failing: false,
        ..s
    });
    hand(&mut p, 1, Some(0), false);
    assert_eq!(p.next(&healthy), Some((Ticket(1), 1)));

    // Nowhere else with room: back on the failing host, on another server first.
    let mut full = servers;
    full[2].in_flight = 8;
    hand(&mut p, 2, Some(0), false);
    assert_eq!(p.next(&full), Some((Ticket(2), 1)));
}

#[test]
fn input_is_wanted_only_with_nothing_queued_and_room_somewhere() {
    let mut p = LeastLoaded::new();
    assert!(p.wants_input(&[up(8, 8), up(0, 8)]));
    assert!(!p.wants_input(&[up(8, 8), down(8)]), "no room");
    hand(&mut p, 0, None, false);
    assert!(!p.wants_input(&[up(0, 8)]), "one still waits");
    p.clear();
    assert!(p.wants_input(&[up(0, 8)]));
    assert_eq!(p.next(&[up(0, 8)]), None, "cleared");
}
