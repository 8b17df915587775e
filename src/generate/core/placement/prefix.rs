//! Prefix placement: prompts that share a long prefix go to one server, so its radix cache
//! prefills the prefix once and serves it to the rest of the group.
//!
//! - Every group the input scan found ([`PrefixPlan`]) has a home server, the groups dealt out
//!   largest first to the server with the least work so far (prompt plus output tokens, the
//!   shared prefix once), so the homes are the same on every run over the same input.
//! - A server's window is drawn from its own groups: the group it is on until that has nothing
//!   queued, then its next, so a group's requests go out together.
//! - A server with none of its own work queued, once the input is all read (or the read-ahead
//!   is full), takes a whole group from the server with the most queued, never single
//!   requests that would bring a foreign prefix into its cache.
//! - A server that is out loses its groups, each moved whole to the server with the least work.
//! - Prompts in no group go to the least-loaded server, as [`super::LeastLoaded`] would.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use super::least_loaded::pick;
use super::{Placement, Request, ServerState, Ticket};
use crate::generate::input::prefix::{GroupKey, PrefixPlan, Prefixes, block_hashes};

/// Queued requests per slot of in-flight room that the policy reads ahead, at least
/// [`MIN_READ_AHEAD`]: enough for every server to find its own work in a shuffled input.
const READ_AHEAD_PER_SLOT: usize = 16;
const MIN_READ_AHEAD: usize = 1024;

#[derive(Debug)]
struct Group {
    home: usize,
    /// Planned work, for balancing.
    work: u64,
    queue: VecDeque<(Ticket, Option<usize>)>,
}

#[derive(Debug)]
pub struct Prefix {
    prefixes: Prefixes,
    groups: Vec<Group>,
    index: FxHashMap<GroupKey, usize>,
    /// Each server's groups, in the order it takes them.
    own: Vec<Vec<usize>>,
    /// The group each server is on.
    active: Vec<Option<usize>>,
    /// Requests queued in each server's groups.
    own_queued: Vec<usize>,
    /// Planned work of each server's groups.
    assigned: Vec<u64>,
    /// Requests in no group.
    loose: VecDeque<(Ticket, Option<usize>)>,
    queued: usize,
    input_ended: bool,
    /// Groups moved to another server, by stealing or loss.
    moves: u64,
    blocks: Vec<u64>,
    order: Vec<usize>,
}

impl Prefix {
    /// Homes for the plan's groups over `servers` servers.
    pub fn new(plan: &PrefixPlan, servers: usize) -> Prefix {
        let servers = servers.max(1);
        let mut planned: Vec<(GroupKey, u64)> =
            plan.groups.iter().map(|(k, g)| (*k, g.work())).collect();
        // Largest first, ties by key: the same input deals the same homes.
        planned.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.hash.cmp(&b.0.hash)));
        let mut p = Prefix {
            prefixes: plan.prefixes.clone(),
            groups: Vec::with_capacity(planned.len()),
            index: FxHashMap::default(),
            own: vec![Vec::new(); servers],
            active: vec![None; servers],
            own_queued: vec![0; servers],
            assigned: vec![0; servers],
            loose: VecDeque::new(),
            queued: 0,
            input_ended: false,
            moves: 0,
            blocks: Vec::new(),
            order: Vec::new(),
        };
        for (key, work) in planned {
            let home = least(&p.assigned, |_| true).unwrap_or(0);
            p.add_group(key, work, home);
        }
        p
    }

    /// The home of each group, by its key (the tests', and the report's).
    pub fn homes(&self) -> impl Iterator<Item = (GroupKey, usize)> + '_ {
        self.index.iter().map(|(k, &g)| (*k, self.groups[g].home))
    }

    /// Groups moved whole to another server so far.
    pub fn moves(&self) -> u64 {
        self.moves
    }

    fn add_group(&mut self, key: GroupKey, work: u64, home: usize) -> usize {
        let g = self.groups.len();
        self.groups.push(Group {
            home,
            work,
            queue: VecDeque::new(),
        });
        self.index.insert(key, g);
        self.own[home].push(g);
        self.assigned[home] += work;
        g
    }

    /// The group of a request's prompt; a group the plan did not know (the input changed
    /// since) gets a home now.
    fn group_of(&mut self, r: &Request<'_>) -> Option<usize> {
        block_hashes(&r.req.prompt, &mut self.blocks);
        let key = self.prefixes.group_of(&self.blocks)?;
        if let Some(&g) = self.index.get(&key) {
            return Some(g);
        }
        let home = least(&self.assigned, |_| true).unwrap_or(0);
        Some(self.add_group(key, u64::from(r.req.max_tokens), home))
    }

    fn push(&mut self, r: Request<'_>, front: bool) {
        let item = (r.ticket, r.avoid);
        self.queued += 1;
        let q = match self.group_of(&r) {
            Some(g) => {
                self.own_queued[self.groups[g].home] += 1;
                &mut self.groups[g].queue
            }
            None => &mut self.loose,
        };
        if front {
            q.push_front(item);
        } else {
            q.push_back(item);
        }
    }

    /// The next request of server `s`'s own groups, its group now the one it is on.
    fn take_own(&mut self, s: usize) -> Option<(Ticket, Option<usize>)> {
        if self.own_queued[s] == 0 {
            return None;
        }
        let g = match self.active[s].filter(|&g| !self.groups[g].queue.is_empty()) {
            Some(g) => g,
            None => {
                let g = *self.own[s]
                    .iter()
                    .find(|&&g| !self.groups[g].queue.is_empty())?;
                self.active[s] = Some(g);
                g
            }
        };
        let item = self.groups[g].queue.pop_front()?;
        self.own_queued[s] -= 1;
        self.queued -= 1;
        Some(item)
    }

    /// Moves group `g` whole to server `to`.
    fn move_group(&mut self, g: usize, to: usize) {
        let from = self.groups[g].home;
        if from == to {
            return;
        }
        self.own[from].retain(|&x| x != g);
        if self.active[from] == Some(g) {
            self.active[from] = None;
        }
        let (n, work) = (self.groups[g].queue.len(), self.groups[g].work);
        self.own_queued[from] -= n;
        self.own_queued[to] += n;
        self.assigned[from] = self.assigned[from].saturating_sub(work);
        self.assigned[to] += work;
        self.own[to].push(g);
        self.groups[g].home = to;
        self.moves += 1;
    }

    /// Every group of a server that is out goes, whole, to the up server with the least work.
    fn rehome_from(&mut self, from: usize, servers: &[ServerState]) {
        let groups = self.own[from].clone();
        for g in groups {
            let Some(to) = least(&self.assigned, |i| i != from && servers[i].up) else {
                return;
            };
            self.move_group(g, to);
        }
    }

    /// Server `s` takes the largest group the busiest server has queued and is not on.
    fn steal_for(&mut self, s: usize) -> bool {
        let victim = (0..self.own.len()).filter(|&v| v != s).max_by_key(|&v| {
            let on = self.active[v].map_or(0, |g| self.groups[g].queue.len());
            self.own_queued[v] - on
        });
        let Some(v) = victim else { return false };
        let best = self.own[v]
            .iter()
            .copied()
            .filter(|&g| self.active[v] != Some(g) && !self.groups[g].queue.is_empty())
            .max_by_key(|&g| self.groups[g].queue.len());
        match best {
            Some(g) => {
                self.move_group(g, s);
                true
            }
            None => false,
        }
    }

    fn read_ahead(servers: &[ServerState]) -> usize {
        let slots: usize = servers.iter().map(|s| s.limit as usize).sum();
        (slots * READ_AHEAD_PER_SLOT).max(MIN_READ_AHEAD)
    }
}

/// The index with the least value among those `ok` allows; ties go to the first.
fn least(values: &[u64], ok: impl Fn(usize) -> bool) -> Option<usize> {
    (0..values.len())
        .filter(|&i| ok(i))
        .min_by_key(|&i| values[i])
}

impl Placement for Prefix {
    fn queue(&mut self, r: Request<'_>) {
        self.push(r, false);
    }

    fn requeue(&mut self, r: Request<'_>) {
        self.push(r, true);
    }

    fn next(&mut self, servers: &[ServerState]) -> Option<(Ticket, usize)> {
        if self.queued == 0 {
            return None;
        }
        for (i, s) in servers.iter().enumerate() {
            if !s.up && !self.own[i].is_empty() && servers.iter().any(|o| o.up) {
                self.rehome_from(i, servers);
            }
        }
        let mut order = std::mem::take(&mut self.order);
        order.clear();
        order.extend((0..servers.len()).filter(|&i| servers[i].free() > 0));
        order.sort_by(|&a, &b| {
            let share = |i: usize| f64::from(servers[i].free()) / f64::from(servers[i].limit);
            share(b).total_cmp(&share(a))
        });
        let mut found = None;
        for &s in &order {
            if let Some((t, avoid)) = self.take_own(s) {
                // A retry that failed here goes elsewhere while another server has room.
                let to = match avoid {
                    Some(a) if a == s => pick(servers, avoid).unwrap_or(s),
                    _ => s,
                };
                found = Some((t, to));
                break;
            }
        }
        if found.is_none()
            && let Some(&(t, avoid)) = self.loose.front()
            && let Some(to) = pick(servers, avoid)
        {
            self.loose.pop_front();
            self.queued -= 1;
            found = Some((t, to));
        }
        let may_steal = self.input_ended || self.queued >= Self::read_ahead(servers);
        if found.is_none() && may_steal {
            for &s in &order {
                if self.steal_for(s)
                    && let Some((t, _)) = self.take_own(s)
                {
                    found = Some((t, s));
                    break;
                }
            }
        }
        self.order = order;
        found
    }

    fn wants_input(&self, servers: &[ServerState]) -> bool {
        if self.queued >= Self::read_ahead(servers) {
            return false;
        }
        // A server wants input while its own queue cannot fill its room.
        self.loose.is_empty()
            && servers
                .iter()
                .enumerate()
                .any(|(i, s)| s.free() as usize > self.own_queued.get(i).copied().unwrap_or(0))
    }

    fn clear(&mut self) {
        for g in &mut self.groups {
            g.queue.clear();
        }
        self.loose.clear();
        self.own_queued.iter_mut().for_each(|n| *n = 0);
        self.queued = 0;
    }

    fn input_end(&mut self) {
        self.input_ended = true;
    }
}

#[cfg(test)]
#[path = "prefix_tests.rs"]
mod tests;
