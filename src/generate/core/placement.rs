//! Where each request goes: the seam between the core, which owns the jobs (their retries,
//! backoffs and clamps) and the servers' state, and a placement policy, which holds the queue of
//! requests ready to go and decides which of them goes to which server: [`LeastLoaded`], or
//! [`Prefix`], which keeps prompts that share a prefix on one server.

mod least_loaded;
mod prefix;
#[cfg(test)]
mod tests;

pub use least_loaded::LeastLoaded;
pub use prefix::Prefix;

use crate::generate::input::Id;
use crate::sglang::client::{ClientError, Completion, CompletionRequest};

/// A job as the core names it to the policy: one ticket for the job's whole life in the run,
/// through its retries, clamps and moves to other servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket(pub u64);

/// A request ready to go, as the policy sees it when the core hands it over.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub ticket: Ticket,
    pub id: &'a Id,
    /// Its 1-based line in the input; 0 for a request the caller made (the sweep's workload).
    pub line: u64,
    /// What is sent: the prompt (text, or chat messages) as the server gets it, its API and
    /// `max_tokens`.
    pub req: &'a CompletionRequest,
    /// The server that last failed it, or that went away under it: the next try goes
    /// elsewhere when some other server has room.
    pub avoid: Option<usize>,
}

/// A server as the policy sees it when asked: indexed as the core's servers are.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ServerState {
    /// In service; a server that is out is probed until it answers, and gets nothing.
    pub up: bool,
    pub in_flight: u32,
    /// Its in-flight limit now (the concurrency mode's, within the open-file budget).
    pub limit: u32,
    /// Its inventory host, numbered in the order the run's servers name them; `None` for a
    /// server given by URL.
    pub host: Option<usize>,
    /// Its host has a server out (a dropped connection, a dying box).
    pub host_failing: bool,
    /// Requests it has finished in this run.
    pub completed: u64,
}

impl ServerState {
    /// Requests it has room for now; 0 when it is out.
    pub fn free(&self) -> u32 {
        if self.up {
            self.limit.saturating_sub(self.in_flight)
        } else {
            0
        }
    }
}

/// What became of the placements so far, as the core tells the policy.
#[derive(Debug, Clone, Copy)]
pub enum Outcome<'a> {
    /// Answered whole and written.
    Finished {
        ticket: Ticket,
        server: usize,
        completion: &'a Completion,
    },
    /// Failed on `server`. What happens to it next is the core's: failed for good, written for
    /// `--resume`, or handed back with [`Placement::queue`] or [`Placement::requeue`].
    Failed {
        ticket: Ticket,
        server: usize,
        error: &'a ClientError,
    },
    /// Taken out of service. Its requests in flight come back through
    /// [`Placement::requeue`] right after, each with `avoid` naming it.
    ServerOut(usize),
    /// Back in service.
    ServerIn(usize),
}

/// Decides which request goes to which server. The core hands over every request that is ready
/// to go and asks, after every input it decides about, for requests to send until the policy
/// answers `None`. A policy holds tickets, never the jobs: what it returns must be a ticket it
/// was given and not yet returned.
pub trait Placement: Send {
    /// A request joins the queue: a new one (an input line, the caller's request), or a retry
    /// whose backoff is over.
    fn queue(&mut self, request: Request<'_>);

    /// A request comes back to go again at once, ahead of the queue: its `max_tokens` was
    /// clamped to fit, or its server went away under it. Requests taken back from one server
    /// together come oldest last.
    fn requeue(&mut self, request: Request<'_>);

    /// The next request to send and the server it goes to, one that is up with room; `None`
    /// when nothing should go now. Asked again after each answer, with that server's
    /// `in_flight` counting the request just placed.
    fn next(&mut self, servers: &[ServerState]) -> Option<(Ticket, usize)>;

    /// Whether the core should read the next input line now. Asked only while the input is
    /// open and the run is not stopping.
    fn wants_input(&self, servers: &[ServerState]) -> bool;

    /// The run is stopping: everything queued is dropped (a resume sends it).
    fn clear(&mut self);

    /// Every input line has been read: what is queued is all there is, besides retries.
    fn input_end(&mut self) {}

    /// What became of a placement, or of a server.
    fn observe(&mut self, _outcome: Outcome<'_>) {}
}
