//! The prefix policy on fake servers: homes, windows drawn from a server's own groups, whole
//! groups stolen and moved off a lost server, and read-ahead.

use super::*;
use crate::generate::input::Id;
use crate::generate::input::prefix::{Learner, prompt_bytes};
use crate::sglang::client::{Api, CompletionRequest, Prompt};

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

/// Prompt `q` of system prompt `s`: 1,000 shared bytes, then the question.
fn text(s: usize, q: usize) -> String {
    format!("{} question {q}?", format!("system prompt {s} ").repeat(60))
}

fn req(t: &str) -> CompletionRequest {
    CompletionRequest {
        api: Api::Generate,
        prompt: Prompt::Text(t.to_string()),
        max_tokens: 16,
        temperature: None,
        top_p: None,
        model: None,
        extra: None,
    }
}

/// The plan of `systems` × `questions` prompts, plus `loose` that share nothing.
fn plan(systems: usize, questions: usize) -> PrefixPlan {
    let texts: Vec<String> = (0..systems)
        .flat_map(|s| (0..questions).map(move |q| text(s, q)))
        .collect();
    let mut blocks = Vec::new();
    let mut l = Learner::default();
    for t in &texts {
        block_hashes(&Prompt::Text(t.clone()), &mut blocks);
        l.prompt(&blocks);
    }
    let mut p = PrefixPlan {
        prefixes: l.finish(),
        ..PrefixPlan::default()
    };
    for t in &texts {
        let prompt = Prompt::Text(t.clone());
        block_hashes(&prompt, &mut blocks);
        p.prompt(&blocks, prompt_bytes(&prompt), 16);
    }
    p
}

/// The plan of system prompts `s` with `n` questions each.
fn plan_sized(groups: &[(usize, usize)]) -> PrefixPlan {
    let texts: Vec<String> = groups
        .iter()
        .flat_map(|&(s, n)| (0..n).map(move |q| text(s, q)))
        .collect();
    let mut blocks = Vec::new();
    let mut l = Learner::default();
    for t in &texts {
        block_hashes(&Prompt::Text(t.clone()), &mut blocks);
        l.prompt(&blocks);
    }
    let mut p = PrefixPlan {
        prefixes: l.finish(),
        ..PrefixPlan::default()
    };
    for t in &texts {
        let prompt = Prompt::Text(t.clone());
        block_hashes(&prompt, &mut blocks);
        p.prompt(&blocks, prompt_bytes(&prompt), 16);
    }
    p
}

/// Queues ticket `t` with prompt `text`.
fn hand(p: &mut Prefix, t: u64, text: &str, avoid: Option<usize>) {
    let id = Id::line(t);
    let req = req(text);
    p.queue(Request {
        ticket: Ticket(t),
        id: &id,
        line: t,
        req: &req,
        avoid,
    });
}

/// System prompt of each ticket, as queued by [`shuffled`].
fn system_of(t: u64, systems: usize) -> usize {
    t as usize % systems
}

/// Queues `systems` × `questions` prompts, interleaved (ticket t is of system t % systems).
fn shuffled(p: &mut Prefix, systems: usize, questions: usize) {
    for t in 0..(systems * questions) as u64 {
        let s = system_of(t, systems);
        hand(p, t, &text(s, t as usize / systems), None);
    }
}

/// Drains `p` over `servers`, finishing every request at once; returns each ticket's server.
fn drain(p: &mut Prefix, servers: &[ServerState]) -> Vec<(u64, usize)> {
    let mut out = Vec::new();
    while let Some((t, s)) = p.next(servers) {
        out.push((t.0, s));
    }
    out
}

#[test]
fn each_group_gets_one_home_and_homes_are_balanced_and_the_same_every_time() {
    let plan = plan(8, 10);
    assert_eq!(plan.groups.len(), 8);
    let p = Prefix::new(&plan, 4);
    let mut per = [0; 4];
    for (_, home) in p.homes() {
        per[home] += 1;
    }
    assert_eq!(per, [2, 2, 2, 2]);
    let mut a: Vec<_> = p.homes().collect();
    let mut b: Vec<_> = Prefix::new(&plan, 4).homes().collect();
    a.sort_by_key(|(k, _)| k.hash);
    b.sort_by_key(|(k, _)| k.hash);
    assert_eq!(a, b);
}

#[test]
fn the_same_servers_in_another_order_get_the_same_groups() {
    let plan = plan(8, 10);
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let a = Prefix::by_name(&plan, &names(&["a:1", "b:1", "c:1"]));
    let b = Prefix::by_name(&plan, &names(&["c:1", "a:1", "b:1"]));
    let named = |p: &Prefix, order: &[&str]| {
        let mut v: Vec<(u64, String)> = p
            .homes()
            .map(|(k, h)| (k.hash, order[h].to_string()))
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        named(&a, &["a:1", "b:1", "c:1"]),
        named(&b, &["c:1", "a:1", "b:1"])
    );
    // Each server's lists follow its groups.
    for (i, own) in b.own.iter().enumerate() {
        assert!(own.iter().all(|&g| b.groups[g].home == i));
    }
    let per: Vec<usize> = b.own.iter().map(Vec::len).collect();
    assert_eq!(per.iter().sum::<usize>(), 8);
    assert!(per.iter().all(|&n| n == 2 || n == 3), "{per:?}");
}

#[test]
fn a_servers_window_is_drawn_from_its_own_groups_one_group_at_a_time() {
    let plan = plan(4, 10);
    let mut p = Prefix::new(&plan, 2);
    shuffled(&mut p, 4, 10);
    let servers = [up(0, 100), up(0, 100)];
    let sent = drain(&mut p, &servers);
    assert_eq!(sent.len(), 40);
    let home = |t: u64| {
        let key = {
            let mut b = Vec::new();
            block_hashes(&Prompt::Text(text(system_of(t, 4), 0)), &mut b);
            plan.prefixes.group_of(&b).unwrap()
        };
        p.homes().find(|(k, _)| *k == key).unwrap().1
    };
    // Every request went home, and a server sent one group's requests together.
    for &(t, s) in &sent {
        assert_eq!(s, home(t), "ticket {t}");
    }
    for server in 0..2 {
        let systems: Vec<usize> = sent
            .iter()
            .filter(|(_, s)| *s == server)
            .map(|(t, _)| system_of(*t, 4))
            .collect();
        let changes = systems.windows(2).filter(|w| w[0] != w[1]).count();
        assert_eq!(changes, 1, "server {server} went {systems:?}");
    }
}

#[test]
fn an_idle_server_steals_a_whole_group_once_the_input_is_read() {
    let plan = plan(4, 20);
    let mut p = Prefix::new(&plan, 2);
    shuffled(&mut p, 4, 20);
    // Server 1 is busy; server 0 finishes its own and would take nothing while input may come.
    let own0 = p.own[0].len();
    let mut servers = [up(0, 1000), up(0, 0)];
    servers[1].limit = 1;
    servers[1].in_flight = 1;
    let first = drain(&mut p, &servers);
    assert_eq!(first.len(), own0 * 20);
    assert!(first.iter().all(|&(_, s)| s == 0));
    // Now server 1 is on one group; at the input's end server 0 takes its other, whole.
    servers[1].in_flight = 0;
    let (t, s) = p.next(&servers).unwrap();
    assert_eq!(s, 1);
    servers[1].in_flight = 1;
    p.input_end();
    let stolen = drain(&mut p, &servers);
    assert_eq!(stolen.len(), 20, "one whole group moved");
    let systems: Vec<usize> = stolen.iter().map(|(t, _)| system_of(*t, 4)).collect();
    assert!(systems.iter().all(|&x| x == systems[0]));
    assert_ne!(
        systems[0],
        system_of(t.0, 4),
        "never the group server 1 is on"
    );
    assert_eq!(p.moves(), 1);
}

#[test]
fn no_group_is_stolen_that_would_not_pay_for_its_prefill_or_would_end_the_job_later() {
    // Server 1 is full with two groups of 5 queued: too few for server 0's window of 16 (the
    // prefill of a foreign prefix would stall its batch for 5 requests).
    let plan = plan(4, 5);
    let mut p = Prefix::new(&plan, 2);
    shuffled(&mut p, 4, 5);
    p.input_end();
    let servers = [up(0, 16), up(1, 1)];
    let sent = drain(&mut p, &servers);
    assert_eq!(sent.len(), 10, "server 0's own only");
    assert!(sent.iter().all(|&(_, s)| s == 0));
    assert_eq!(p.moves(), 0);
    // A group large enough, but the thief already has more in flight than the victim left.
    let plan = plan_sized(&[(0, 40), (1, 40), (2, 20), (3, 20)]);
    let mut p = Prefix::new(&plan, 2);
    for s in 0..4 {
        for q in 0..[40, 40, 20, 20][s] {
            hand(&mut p, (s * 100 + q) as u64, &text(s, q), None);
        }
    }
    p.input_end();
    let home_of = |p: &Prefix, s: usize| {
        let mut b = Vec::new();
        block_hashes(&Prompt::Text(text(s, 0)), &mut b);
        let key = plan.prefixes.group_of(&b).unwrap();
        p.homes().find(|(k, _)| *k == key).unwrap().1
    };
    let thief = home_of(&p, 0);
    let victim = 1 - thief;
    // The victim is full with 1 in flight and its 60 queued; the thief has 50 in flight: a
    // group of the victim's would end the pair's work later (50 + 40 or 50 + 20 against 61).
    let mut servers = [up(0, 0), up(0, 0)];
    servers[thief] = up(50, 1000);
    servers[victim] = up(1, 1);
    let sent = drain(&mut p, &servers);
    assert_eq!(sent.len(), 60);
    assert!(sent.iter().all(|&(_, s)| s == thief));
    assert_eq!(p.moves(), 0);
    // Idle, the thief first takes the victim's group that evens the two best: the 40 (40
    // against 21 left, where the 20 leaves 41); then, the victim still at 21 (it never
    // finishes here), the 20.
    servers[thief].in_flight = 0;
    let stolen = drain(&mut p, &servers);
    assert_eq!(stolen.len(), 60);
    assert!(
        stolen[..40].iter().all(|&(t, _)| t / 100 == 1),
        "{stolen:?}"
    );
    assert_eq!(p.moves(), 2);
}

#[test]
fn a_lost_servers_groups_move_whole_to_the_others() {
    let plan = plan(6, 5);
    let mut p = Prefix::new(&plan, 3);
    shuffled(&mut p, 6, 5);
    let mut servers = [up(0, 100), up(0, 100), up(0, 100)];
    servers[2].up = false;
    let sent = drain(&mut p, &servers);
    assert_eq!(sent.len(), 30, "nothing lost");
    assert!(sent.iter().all(|&(_, s)| s != 2));
    // Each system prompt still went to one server only.
    for sys in 0..6 {
        let on: std::collections::HashSet<usize> = sent
            .iter()
            .filter(|(t, _)| system_of(*t, 6) == sys)
            .map(|&(_, s)| s)
            .collect();
        assert_eq!(on.len(), 1, "system {sys} on {on:?}");
    }
    assert_eq!(p.moves(), 2);
}

#[test]
fn it_reads_ahead_until_every_servers_own_queue_fills_its_room_or_the_bound() {
    let plan = plan(2, 2000);
    let mut p = Prefix::new(&plan, 2);
    let servers = [up(0, 4), up(0, 4)];
    assert!(p.wants_input(&servers));
    // Only system 0 (one server's) so far, past the few windows a slot it reads in any case
    // (32): the other server still wants its own.
    for t in 0..40 {
        hand(&mut p, t, &text(0, t as usize), None);
    }
    assert!(p.wants_input(&servers));
    // The other server's own queue fills its room of 4 only with its fourth.
    for t in 40..43 {
        hand(&mut p, t, &text(1, t as usize), None);
    }
    assert!(p.wants_input(&servers));
    hand(&mut p, 43, &text(1, 43), None);
    assert!(!p.wants_input(&servers));
    // A full read-ahead reads no more, whatever is missing.
    let mut q = Prefix::new(&plan, 2);
    for t in 0..MIN_READ_AHEAD as u64 {
        hand(&mut q, t, &text(0, t as usize), None);
    }
    assert!(!q.wants_input(&servers));
}

#[test]
fn prompts_in_no_group_go_to_the_least_loaded_and_a_retry_avoids_where_it_failed() {
    let plan = plan(2, 10);
    let mut p = Prefix::new(&plan, 2);
    hand(&mut p, 0, "a short prompt of its own", None);
    let servers = [up(3, 4), up(0, 4)];
    assert_eq!(p.next(&servers), Some((Ticket(0), 1)));
    let home = p.homes().next().unwrap().1;
    let key = p.homes().next().unwrap().0;
    let sys = (0..2)
        .find(|&s| {
            let mut b = Vec::new();
            block_hashes(&Prompt::Text(text(s, 0)), &mut b);
            plan.prefixes.group_of(&b) == Some(key)
        })
        .unwrap();
    hand(&mut p, 1, &text(sys, 1), Some(home));
    let servers = [up(0, 4), up(0, 4)];
    assert_eq!(p.next(&servers), Some((Ticket(1), 1 - home)));
}

/// The home of system prompt `s`'s group.
fn home_of(p: &Prefix, plan: &PrefixPlan, s: usize) -> usize {
    let mut b = Vec::new();
    block_hashes(&Prompt::Text(text(s, 0)), &mut b);
    let key = plan.prefixes.group_of(&b).unwrap();
    p.homes().find(|(k, _)| *k == key).unwrap().1
}

/// Queues `sizes[s]` questions of each system prompt `s`, ticket `s * 1000 + q`.
fn queue_sized(p: &mut Prefix, sizes: &[usize]) {
    for (s, &n) in sizes.iter().enumerate() {
        for q in 0..n {
            hand(p, (s * 1000 + q) as u64, &text(s, q), None);
        }
    }
}

#[test]
fn an_idle_server_splits_the_group_a_saturated_home_is_on_and_takes_what_evens_the_pair() {
    // One group larger than the plan said (the input grew after the scan): its home is on it,
    // and nothing else is whole to take. Before the split, the other server finished its own
    // and idled to the end.
    let plan = plan_sized(&[(0, 60), (1, 60)]);
    let mut p = Prefix::new(&plan, 2);
    queue_sized(&mut p, &[100, 20]);
    p.input_end();
    let (big, small) = (home_of(&p, &plan, 0), home_of(&p, &plan, 1));
    assert_ne!(big, small);
    let mut servers = [up(0, 16), up(0, 16)];
    servers[small] = up(16, 16);
    let (t, s) = p.next(&servers).unwrap();
    assert_eq!((t.0 / 1000, s), (0, big), "the home starts on its group");
    servers[big] = up(16, 16);
    servers[small] = up(0, 16);
    let own: Vec<_> = (0..20).map(|_| p.next(&servers).unwrap()).collect();
    assert!(own.iter().all(|&(t, s)| t.0 / 1000 == 1 && s == small));
    // Idle: 16 in flight and 99 queued there, none here: it takes 57, from the back of the
    // queue, and one prefill of the prefix buys all of them.
    let (t, s) = p.next(&servers).unwrap();
    assert_eq!((t.0, s), (43, small), "the back of the queue: {t:?}");
    assert_eq!((p.splits(), p.moves()), (1, 0));
    assert_eq!(p.own_queued[small], 56);
    assert_eq!(p.own_queued[big], 42);
    // The home goes on with the front of its queue.
    servers[big] = up(15, 16);
    servers[small] = up(16, 16);
    assert_eq!(p.next(&servers), Some((Ticket(1), big)));
}

#[test]
fn a_split_takes_from_the_server_that_would_finish_last_by_its_speed_so_far() {
    // Two homes with as much left, one of them twice as fast so far: the thief splits the
    // slow one's group, and takes what ends the two together.
    // (Planned as equal groups, each one home, as a group of more than a share is not.)
    let plan = plan_sized(&[(0, 40), (1, 40), (2, 40)]);
    let mut p = Prefix::new(&plan, 3);
    queue_sized(&mut p, &[60, 60, 16]);
    p.input_end();
    let homes: Vec<usize> = (0..3).map(|s| home_of(&p, &plan, s)).collect();
    let (fast, slow, thief) = (homes[0], homes[1], homes[2]);
    let mut servers = [up(16, 16), up(16, 16), up(16, 16)];
    for &h in &[fast, slow] {
        servers[h] = up(0, 16);
        assert_eq!(p.next(&servers).map(|(_, s)| s), Some(h));
        servers[h] = up(16, 16);
    }
    servers[fast].completed = 400;
    servers[slow].completed = 136;
    servers[thief] = up(0, 16);
    for _ in 0..16 {
        assert_eq!(p.next(&servers).map(|(_, s)| s), Some(thief));
    }
    let (t, s) = p.next(&servers).unwrap();
    assert_eq!(
        (t.0 / 1000, s),
        (homes.iter().position(|&h| h == slow).unwrap() as u64, thief)
    );
    // The slow one: 16 + 59 left at a rate of 200 (136 + the prior); the thief at 64 (the
    // prior), none left: 18 of them end the two together, 18 / 64 = (75 - 18) / 200 or near.
    assert_eq!(p.own_queued[thief] + 1, 18);
    assert_eq!((p.splits(), p.moves()), (1, 0));
}

/// The servers that hold a part of system prompt `s`'s group, and each part's planned prompts.
fn parts_of(p: &Prefix, plan: &PrefixPlan, s: usize) -> Vec<(usize, u64)> {
    let mut b = Vec::new();
    block_hashes(&Prompt::Text(text(s, 0)), &mut b);
    let g = p.index[&plan.prefixes.group_of(&b).unwrap()];
    std::iter::once(g)
        .chain(p.groups[g].parts.iter().copied())
        .map(|x| (p.groups[x].home, p.groups[x].unread))
        .collect()
}

#[test]
fn a_group_larger_than_a_servers_share_starts_on_as_many_servers_as_it_fills_shares() {
    // 4 servers, 400 prompts: a share is 100. The group of 250 is 2.5 shares: three homes from
    // the start, each a third of it; the others fit a server and keep one home.
    let plan = plan_sized(&[(0, 250), (1, 60), (2, 50), (3, 40)]);
    let p = Prefix::new(&plan, 4);
    let big = parts_of(&p, &plan, 0);
    assert_eq!(big.len(), 3, "{big:?}");
    let mut homes: Vec<usize> = big.iter().map(|&(h, _)| h).collect();
    homes.dedup();
    assert_eq!(homes.len(), 3, "three servers: {big:?}");
    assert_eq!(big.iter().map(|&(_, n)| n).sum::<u64>(), 250);
    assert!(big.iter().all(|&(_, n)| (83..=84).contains(&n)), "{big:?}");
    for s in 1..4 {
        assert_eq!(parts_of(&p, &plan, s).len(), 1, "system {s}");
    }
    // The small ones fill the server the big one left alone first, the others after.
    let free = (0..4).find(|h| !homes.contains(h)).unwrap();
    assert_eq!(home_of(&p, &plan, 1), free);
    assert_eq!(p.splits(), 0, "dealt, not split");
}

#[test]
fn a_large_groups_prompts_go_to_its_homes_as_they_are_read() {
    // 2 servers, 300 prompts: the group of 240 fills two shares, so it starts on both, and its
    // prompts go out on both while the small group's stay on its one home.
    let plan = plan_sized(&[(0, 240), (1, 60)]);
    let mut p = Prefix::new(&plan, 2);
    assert_eq!(parts_of(&p, &plan, 0).len(), 2);
    assert_eq!(parts_of(&p, &plan, 1).len(), 1);
    let small = home_of(&p, &plan, 1);
    // Interleaved as a shuffled input has them: ticket 1000 + q is the small group's.
    for q in 0..240 {
        hand(&mut p, q as u64, &text(0, q), None);
        if q % 4 == 0 {
            hand(&mut p, 1000 + q as u64 / 4, &text(1, q / 4), None);
        }
    }
    p.input_end();
    let sent = drain(&mut p, &[up(0, 1000), up(0, 1000)]);
    assert_eq!(sent.len(), 300);
    let on = |server: usize, small_group: bool| {
        sent.iter()
            .filter(|&&(t, s)| s == server && (t >= 1000) == small_group)
            .count()
    };
    assert_eq!((on(0, false), on(1, false)), (120, 120), "half of it each");
    assert_eq!(on(small, true), 60);
    assert_eq!(
        (p.splits(), p.moves()),
        (0, 0),
        "dealt so, not split or moved"
    );
}

#[test]
fn groups_within_a_servers_share_keep_one_home() {
    // 4 servers and 8 equal groups (half a share each), then 4 of a share each: one home each.
    let p = Prefix::new(&plan(8, 10), 4);
    assert_eq!(p.groups.len(), 8, "no parts");
    let plan = plan_sized(&[(0, 100), (1, 100), (2, 100), (3, 100)]);
    let p = Prefix::new(&plan, 4);
    assert_eq!(p.groups.len(), 4, "no parts");
    let mut homes: Vec<usize> = (0..4).map(|s| home_of(&p, &plan, s)).collect();
    homes.sort_unstable();
    assert_eq!(homes, [0, 1, 2, 3]);
}

#[test]
fn it_reads_a_few_windows_ahead_even_when_every_server_has_its_room_queued() {
    // Each server's own queue fills its room of 4 with 4 of its own, yet the policy reads on
    // to 4 windows a slot (32 queued over 2 servers of 4), so a server can stay on one group.
    let plan = plan(2, 2000);
    let mut p = Prefix::new(&plan, 2);
    let servers = [up(0, 4), up(0, 4)];
    for t in 0..8 {
        hand(&mut p, t, &text(t as usize % 2, t as usize), None);
    }
    assert!(p.wants_input(&servers));
    for t in 8..32 {
        hand(&mut p, t, &text(t as usize % 2, t as usize), None);
    }
    assert!(!p.wants_input(&servers));
}
