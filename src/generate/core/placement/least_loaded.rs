//! The request at the head of one queue goes to the server with the most free share of its
//! limit: work goes where slots free up, so faster servers get more of it.

use std::collections::VecDeque;

use super::{Placement, Request, ServerState, Ticket};

/// One first-in first-out queue, and no regard for what a request holds.
#[derive(Debug, Default)]
pub struct LeastLoaded {
    /// Each ticket with the server its request avoids.
    queue: VecDeque<(Ticket, Option<usize>)>,
}

impl LeastLoaded {
    pub fn new() -> Self {
        Self::default()
    }
}

impl Placement for LeastLoaded {
    fn queue(&mut self, r: Request<'_>) {
        self.queue.push_back((r.ticket, r.avoid));
    }

    fn requeue(&mut self, r: Request<'_>) {
        self.queue.push_front((r.ticket, r.avoid));
    }

    fn next(&mut self, servers: &[ServerState]) -> Option<(Ticket, usize)> {
        let &(ticket, avoid) = self.queue.front()?;
        let server = pick(servers, avoid)?;
        self.queue.pop_front();
        Some((ticket, server))
    }

    fn wants_input(&self, servers: &[ServerState]) -> bool {
        self.queue.is_empty() && servers.iter().any(|s| s.free() > 0)
    }

    fn clear(&mut self) {
        self.queue.clear();
    }
}

/// The server with the most free share of its limit, preferring any other than `avoid` (the
/// one that last failed the request), and another host when that one's host is failing, while
/// one has room. Ties go to the first.
pub(super) fn pick(servers: &[ServerState], avoid: Option<usize>) -> Option<usize> {
    let avoid_host = avoid
        .map(|a| &servers[a])
        .filter(|a| a.host_failing)
        .and_then(|a| a.host);
    let mut best: Option<((bool, bool, f64), usize)> = None;
    for (i, s) in servers.iter().enumerate() {
        if s.free() == 0 {
            continue;
        }
        let rank = (
            avoid_host.is_none() || s.host != avoid_host,
            Some(i) != avoid,
            f64::from(s.free()) / f64::from(s.limit),
        );
        if best.as_ref().is_none_or(|(b, _)| rank > *b) {
            best = Some((rank, i));
        }
    }
    best.map(|(_, i)| i)
}
