//! Prefix placement: prompts that share a long prefix go to one server, so its radix cache
//! prefills the prefix once and serves it to the rest of the group.
//!
//! - Every group the input scan found ([`PrefixPlan`]) has a home server, the groups dealt out
//!   largest first to the server with the least work so far (prompt plus output tokens, the
//!   shared prefix once), so the homes are the same on every run over the same input. A group
//!   with more work than a server's share of the job starts on as many servers as it fills
//!   shares (rounded up), its prompts dealt out among them as they are read: alone on one home,
//!   such a group kept that server busy long after the others, which then moved small groups
//!   between them (a prefill each, and more prefixes than their caches held) until the input's
//!   end let them split the large one.
//! - A server's window is drawn from its own groups: the group it is on until that has nothing
//!   queued, then its next, so a group's requests go out together. The policy reads a few
//!   windows ahead ([`QUEUED_PER_SLOT`]) in any case, so that a server stays on one group a
//!   while.
//! - A server with none of its own work queued, once the input is all read (or the read-ahead
//!   is full), takes a whole group from a server with more left to do, never single requests
//!   that would bring a foreign prefix into its cache; and only a group that pays for the
//!   prefill of its prefix and ends the job sooner: at least a window of the thief's (up to
//!   [`MIN_STEAL`] requests), and the thief's work then still below the victim's. A group
//!   moved for a few last requests costs the thief a prefill that stalls its whole batch,
//!   which is how the job's tail grew longer than the work it moved.
//! - When no whole group qualifies (the victim is on its only group, or its groups are too
//!   large to move without leaving the thief behind), the thief splits one: it takes half the
//!   pair's difference of the group's queued and unread requests, at least a window, so one
//!   prefill buys a window or more. The group then has two homes, and its prompts still to come
//!   go to each in proportion to what each was left to read. A home slower than the rest (or a
//!   group that grew since the scan) saturated while the others idled.
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
/// Queued requests per slot that the policy reads ahead in any case: a few windows a server.
const QUEUED_PER_SLOT: usize = 4;
/// A stolen group's requests at least, or the thief's window when that is less.
const MIN_STEAL: u32 = 16;
/// Completions every server is taken to have before its own count, in the estimate of its
/// speed: a few windows, so that the first few answers do not decide it.
const RATE_PRIOR: u64 = 64;

#[derive(Debug)]
struct Group {
    home: usize,
    /// Planned work, for balancing.
    work: u64,
    /// Its prompts the plan counted that were not queued yet (until the input's end): of a
    /// split group, the share this part is to get of them.
    unread: u64,
    queue: VecDeque<(Ticket, Option<usize>)>,
    /// The group it was split off, or itself: the one the prefix's key names.
    root: usize,
    /// Of a root, the parts split off it, each on another server.
    parts: Vec<usize>,
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
    /// Prompts of each server's groups not read yet, as the plan counts them.
    own_unread: Vec<u64>,
    /// Planned work of each server's groups.
    assigned: Vec<u64>,
    /// Requests in no group.
    loose: VecDeque<(Ticket, Option<usize>)>,
    queued: usize,
    input_ended: bool,
    /// Groups moved to another server, by stealing or loss.
    moves: u64,
    /// Parts of groups split off to another server.
    splits: u64,
    blocks: Vec<u64>,
    order: Vec<usize>,
}

impl Prefix {
    /// Homes for the plan's groups over `servers` servers.
    pub fn new(plan: &PrefixPlan, servers: usize) -> Prefix {
        let servers = servers.max(1);
        let mut planned: Vec<(GroupKey, u64, u64)> = plan
            .groups
            .iter()
            .map(|(k, g)| (*k, g.work(), g.prompts))
            .collect();
        // Largest first, ties by key: the same input deals the same homes.
        planned.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.hash.cmp(&b.0.hash)));
        let mut p = Prefix {
            prefixes: plan.prefixes.clone(),
            groups: Vec::with_capacity(planned.len()),
            index: FxHashMap::default(),
            own: vec![Vec::new(); servers],
            active: vec![None; servers],
            own_queued: vec![0; servers],
            own_unread: vec![0; servers],
            assigned: vec![0; servers],
            loose: VecDeque::new(),
            queued: 0,
            input_ended: false,
            moves: 0,
            splits: 0,
            blocks: Vec::new(),
            order: Vec::new(),
        };
        // A server's share of the job's work: a group larger than that starts on as many
        // servers as it fills shares, its prompts dealt out among them as they are read.
        let total: u64 = planned.iter().map(|g| g.1).sum::<u64>() + plan.ungrouped.work();
        let share = total.div_ceil(servers as u64).max(1);
        for (key, work, prompts) in planned {
            let homes = work.div_ceil(share).clamp(1, servers as u64);
            // Part k of `homes`: the k-th slice of the work and of the prompts.
            let slice = |total: u64, k: u64| total * (k + 1) / homes - total * k / homes;
            let home = least(&p.assigned, |_| true).unwrap_or(0);
            let g = p.add_group(key, slice(work, 0), slice(prompts, 0), home);
            for k in 1..homes {
                let on: Vec<usize> = std::iter::once(g)
                    .chain(p.groups[g].parts.iter().copied())
                    .map(|x| p.groups[x].home)
                    .collect();
                let to = least(&p.assigned, |i| !on.contains(&i)).unwrap_or(0);
                p.add_part(g, to, slice(work, k), slice(prompts, k));
            }
        }
        p
    }

    /// Homes for the plan's groups over servers named `names`, dealt over the names in sorted
    /// order: the same input over the same servers, in whatever order they are given (a
    /// `--resume` with its `--url`s in another order), gives each group the same server.
    pub fn by_name(plan: &PrefixPlan, names: &[String]) -> Prefix {
        let mut order: Vec<usize> = (0..names.len()).collect();
        order.sort_by(|&a, &b| names[a].cmp(&names[b]));
        let mut p = Prefix::new(plan, names.len());
        if names.len() < 2 {
            return p;
        }
        // Slot k of the deal is server order[k].
        let mut own = vec![Vec::new(); names.len()];
        let mut assigned = vec![0; names.len()];
        let mut unread = vec![0; names.len()];
        for (slot, &server) in order.iter().enumerate() {
            own[server] = std::mem::take(&mut p.own[slot]);
            assigned[server] = p.assigned[slot];
            unread[server] = p.own_unread[slot];
        }
        for g in &mut p.groups {
            g.home = order[g.home];
        }
        (p.own, p.assigned, p.own_unread) = (own, assigned, unread);
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

    /// Parts of groups split off to another server so far.
    pub fn splits(&self) -> u64 {
        self.splits
    }

    fn add_group(&mut self, key: GroupKey, work: u64, prompts: u64, home: usize) -> usize {
        let g = self.groups.len();
        self.push_group(g, home, work, prompts);
        self.index.insert(key, g);
        g
    }

    /// A part of root group `g` on server `home`, with `work` and `prompts` of the plan's.
    fn add_part(&mut self, g: usize, home: usize, work: u64, prompts: u64) -> usize {
        let p = self.push_group(g, home, work, prompts);
        self.groups[g].parts.push(p);
        p
    }

    /// A new group of root `root` on server `home`, its work and prompts counted as that
    /// server's.
    fn push_group(&mut self, root: usize, home: usize, work: u64, prompts: u64) -> usize {
        let id = self.groups.len();
        let unread = if self.input_ended { 0 } else { prompts };
        self.groups.push(Group {
            home,
            work,
            unread,
            queue: VecDeque::new(),
            root,
            parts: Vec::new(),
        });
        self.own[home].push(id);
        self.assigned[home] += work;
        self.own_unread[home] += unread;
        id
    }

    /// The part of root group `g` a new prompt of it goes to: the one with the most of the
    /// group still to read, else the one whose server has the least queued.
    fn part_for(&self, g: usize) -> usize {
        let parts = &self.groups[g].parts;
        if parts.is_empty() {
            return g;
        }
        std::iter::once(g)
            .chain(parts.iter().copied())
            .min_by_key(|&p| {
                let part = &self.groups[p];
                (std::cmp::Reverse(part.unread), self.own_queued[part.home])
            })
            .unwrap_or(g)
    }

    /// Requests of group `g` still to go: queued, and not read yet.
    fn pending(&self, g: usize) -> u64 {
        self.groups[g].queue.len() as u64 + self.groups[g].unread
    }

    /// What server `s` has left to do, in requests: in flight, queued, and not read yet.
    fn left(&self, s: usize, servers: &[ServerState]) -> u64 {
        u64::from(servers[s].in_flight) + self.own_queued[s] as u64 + self.own_unread[s]
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
        Some(self.add_group(key, u64::from(r.req.max_tokens), 1, home))
    }

    fn push(&mut self, r: Request<'_>, front: bool) {
        let item = (r.ticket, r.avoid);
        self.queued += 1;
        let q = match self.group_of(&r) {
            Some(g) => {
                let g = self.part_for(g);
                let home = self.groups[g].home;
                self.own_queued[home] += 1;
                // A retry comes back too: the count is an estimate, exact from the input's end.
                if !front && self.groups[g].unread > 0 {
                    self.groups[g].unread -= 1;
                    self.own_unread[home] -= 1;
                }
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
        let unread = self.groups[g].unread;
        self.own_queued[from] -= n;
        self.own_queued[to] += n;
        self.own_unread[from] -= unread;
        self.own_unread[to] += unread;
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

    /// Server `s` takes the group, queued on another server and not the one it is on, whose
    /// move ends the pair's work soonest, when one ends it sooner at all: the thief's time
    /// after is below the victim's before, and the group fills at least a window of the thief.
    /// Else it splits one ([`Prefix::split_for`]).
    fn steal_for(&mut self, s: usize, servers: &[ServerState]) -> bool {
        let (mine, rs) = (self.left(s, servers) as f64, rate(&servers[s]));
        let at_least = u64::from(servers[s].limit.clamp(1, MIN_STEAL));
        let floor = at_least as f64;
        let mut best: Option<(f64, usize)> = None;
        for v in (0..self.own.len()).filter(|&v| v != s) {
            let (theirs, rv) = (self.left(v, servers) as f64, rate(&servers[v]));
            if theirs / rv <= (mine + floor) / rs {
                continue;
            }
            for &g in &self.own[v] {
                if self.active[v] == Some(g) || self.groups[g].queue.is_empty() {
                    continue;
                }
                let n = self.pending(g) as f64;
                if n < floor || (mine + n) / rs >= theirs / rv {
                    continue;
                }
                let after = ((mine + n) / rs).max((theirs - n) / rv);
                if best.is_none_or(|(b, _)| after < b) {
                    best = Some((after, g));
                }
            }
        }
        match best {
            Some((_, g)) => {
                self.move_group(g, s);
                true
            }
            None => self.split_for(s, at_least, servers),
        }
    }

    /// Server `s` takes part of a group queued on a server that would finish later, the group
    /// that server is on too: as much as ends the two at the same time, at least `at_least`,
    /// from the group that evens the pair best.
    fn split_for(&mut self, s: usize, at_least: u64, servers: &[ServerState]) -> bool {
        let (mine, rs) = (self.left(s, servers) as f64, rate(&servers[s]));
        let floor = at_least as f64;
        let mut best: Option<(f64, usize, u64)> = None;
        for v in (0..self.own.len()).filter(|&v| v != s) {
            let (theirs, rv) = (self.left(v, servers) as f64, rate(&servers[v]));
            // Both done together: (mine + k) / rs = (theirs - k) / rv.
            let even = (theirs * rs - mine * rv) / (rs + rv);
            if even < floor {
                continue;
            }
            for &g in &self.own[v] {
                if self.groups[g].queue.is_empty() {
                    continue;
                }
                let take = even.min(self.pending(g) as f64).floor();
                if take < floor {
                    continue;
                }
                let after = ((mine + take) / rs).max((theirs - take) / rv);
                if best.is_none_or(|(b, _, _)| after < b) {
                    best = Some((after, g, take as u64));
                }
            }
        }
        let Some((_, g, take)) = best else {
            return false;
        };
        self.split(g, s, take);
        true
    }

    /// Moves `take` of group `g`'s requests to a part of it on server `to`: queued ones from the
    /// back first (the front goes out next where it is), then its share of those unread.
    fn split(&mut self, g: usize, to: usize, take: u64) {
        let from = self.groups[g].home;
        let root = self.groups[g].root;
        let part = match self.groups[root]
            .parts
            .iter()
            .chain(std::iter::once(&root))
            .copied()
            .find(|&p| self.groups[p].home == to)
        {
            Some(p) => p,
            None => self.add_part(root, to, 0, 0),
        };
        let queued = (self.groups[g].queue.len() as u64).min(take);
        let unread = (take - queued).min(self.groups[g].unread);
        let keep = self.groups[g].queue.len() - queued as usize;
        let moved = self.groups[g].queue.split_off(keep);
        self.groups[part].queue.extend(moved);
        self.groups[g].unread -= unread;
        self.groups[part].unread += unread;
        let moved_n = queued + unread;
        let work = self.groups[g].work * moved_n / (self.pending(g) + moved_n).max(1);
        self.groups[g].work -= work;
        self.groups[part].work += work;
        let q = queued as usize;
        self.own_queued[from] -= q;
        self.own_queued[to] += q;
        self.own_unread[from] -= unread;
        self.own_unread[to] += unread;
        self.assigned[from] = self.assigned[from].saturating_sub(work);
        self.assigned[to] += work;
        self.splits += 1;
    }

    fn read_ahead(servers: &[ServerState]) -> usize {
        let slots: usize = servers.iter().map(|s| s.limit as usize).sum();
        (slots * READ_AHEAD_PER_SLOT).max(MIN_READ_AHEAD)
    }

    /// Queued requests below which the policy reads on, whether or not a server lacks work.
    fn min_read_ahead(servers: &[ServerState]) -> usize {
        servers.iter().map(|s| s.limit as usize).sum::<usize>() * QUEUED_PER_SLOT
    }
}

/// A server's speed, relative to the others': the requests it finished, plus [`RATE_PRIOR`]
/// so that servers are taken as equal until they have finished some.
fn rate(s: &ServerState) -> f64 {
    (s.completed + RATE_PRIOR) as f64
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
                if self.steal_for(s, servers)
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
        // Queues a few windows deep, so that a server stays on one group a while: with shallow
        // ones it went from group to group as each one's next prompt came, and a radix cache
        // that holds two prefixes lost them again and again.
        if self.queued < Self::min_read_ahead(servers) {
            return true;
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
        // The plan counted lines done before a resume too: what is queued now is all there is.
        for g in &mut self.groups {
            g.unread = 0;
        }
        self.own_unread.iter_mut().for_each(|n| *n = 0);
    }
}

#[cfg(test)]
#[path = "prefix_tests.rs"]
mod tests;
