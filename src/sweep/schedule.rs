//! Which candidates start next, on which GPUs: a queue of the search's proposals in order and
//! the GPUs that are free. A candidate needs either exactly its assigned GPUs (parallel and
//! sequential modes) or any free group of its size on one host, the best the host's board
//! links (rounds). The `--dry-run` plan of rounds is the same
//! schedule played out as if every candidate of a round ended at once. Pure.

use std::collections::{BTreeMap, VecDeque};

use super::assign::{Need, Slot};
use crate::layout::{Board, groups};

/// The candidates (any handle `T`) still to start and the GPUs free to start them on.
#[derive(Debug, Clone)]
pub struct Pool<T> {
    queue: VecDeque<(T, Need)>,
    /// In the inventory's order, so that a freed GPU is taken lowest first.
    free: Vec<Slot>,
    order: Vec<Slot>,
    /// Each host's board, where it was read: groups are chosen by it.
    boards: BTreeMap<String, Board>,
}

impl<T> Pool<T> {
    /// `queue`: candidates with what each needs, in the order they run; `slots`: every GPU of
    /// the sweep, all free.
    pub fn new(queue: Vec<(T, Need)>, slots: Vec<Slot>) -> Pool<T> {
        Pool {
            queue: queue.into(),
            free: slots.clone(),
            order: slots,
            boards: BTreeMap::new(),
        }
    }

    /// Chooses groups by these hosts' boards.
    pub fn with_boards(mut self, boards: BTreeMap<String, Board>) -> Pool<T> {
        self.boards = boards;
        self
    }

    /// `n` free GPUs of the first host (in inventory order) that has them, its best group.
    fn group_of(&self, n: u32) -> Option<Vec<Slot>> {
        let mut hosts: Vec<&str> = Vec::new();
        for s in &self.free {
            if !hosts.contains(&s.host.as_str()) {
                hosts.push(&s.host);
            }
        }
        hosts.into_iter().find_map(|host| {
            let free: Vec<u32> = self
                .free
                .iter()
                .filter(|s| s.host == host)
                .map(|s| s.gpu)
                .collect();
            let group = groups::best_of(self.boards.get(host), &free, n as usize)?;
            Some(
                group
                    .gpus
                    .into_iter()
                    .map(|gpu| Slot {
                        host: host.to_string(),
                        gpu,
                    })
                    .collect(),
            )
        })
    }

    /// Queues more candidates behind those waiting.
    pub fn push(&mut self, more: impl IntoIterator<Item = (T, Need)>) {
        self.queue.extend(more);
    }

    /// The candidates that can start now, with their GPUs, taken from the queue in order: the
    /// queue is never overtaken, so a candidate waiting for its GPUs holds back the ones after
    /// it (sequential mode runs in order).
    pub fn next_batch(&mut self) -> Vec<(T, Vec<Slot>)> {
        let mut batch = Vec::new();
        while let Some((_, need)) = self.queue.front() {
            let slots = match need {
                Need::Gpus(gpus) if gpus.iter().all(|g| self.free.contains(g)) => gpus.clone(),
                Need::Any(n) => match self.group_of(*n) {
                    Some(slots) => slots,
                    None => break,
                },
                _ => break,
            };
            self.free.retain(|f| !slots.contains(f));
            let (c, _) = self.queue.pop_front().expect("the front exists");
            batch.push((c, slots));
        }
        batch
    }

    /// GPUs given back (their servers stopped).
    pub fn free(&mut self, slots: impl IntoIterator<Item = Slot>) {
        for s in slots {
            if !self.free.contains(&s) {
                self.free.push(s);
            }
        }
        let order = &self.order;
        self.free
            .sort_by_key(|s| order.iter().position(|o| o == s).unwrap_or(usize::MAX));
    }

    /// Candidates not started yet.
    pub fn waiting(&self) -> usize {
        self.queue.len()
    }

    /// The GPUs free now, in inventory order.
    pub fn free_slots(&self) -> &[Slot] {
        &self.free
    }
}

/// The rounds the candidates run in when every candidate of a round ends at the same time:
/// what `--dry-run` shows. With pruning, a later candidate takes the first GPU an earlier one
/// frees instead, and starts as soon as it is free.
pub fn rounds<T>(
    queue: Vec<(T, Need)>,
    slots: Vec<Slot>,
    boards: BTreeMap<String, Board>,
) -> Vec<Vec<(T, Vec<Slot>)>> {
    let mut pool = Pool::new(queue, slots).with_boards(boards);
    let mut out: Vec<Vec<(T, Vec<Slot>)>> = Vec::new();
    loop {
        let batch = pool.next_batch();
        if batch.is_empty() {
            return out;
        }
        pool.free(batch.iter().flat_map(|(_, s)| s.iter().cloned()));
        out.push(batch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slots(n: u32) -> Vec<Slot> {
        (0..n)
            .map(|gpu| Slot {
                host: "local".into(),
                gpu,
            })
            .collect()
    }

    fn gpus(batch: &[(usize, Vec<Slot>)]) -> Vec<(usize, Vec<u32>)> {
        batch
            .iter()
            .map(|(c, s)| (*c, s.iter().map(|s| s.gpu).collect()))
            .collect()
    }

    #[test]
    fn twelve_candidates_on_eight_gpus_run_in_two_rounds_one_gpu_each() {
        let queue = (0..12).map(|c| (c, Need::Any(1))).collect();
        let r = rounds(queue, slots(8), BTreeMap::new());
        assert_eq!(r.len(), 2);
        assert_eq!(
            gpus(&r[0]),
            (0..8).map(|c| (c, vec![c as u32])).collect::<Vec<_>>()
        );
        assert_eq!(
            gpus(&r[1]),
            vec![(8, vec![0]), (9, vec![1]), (10, vec![2]), (11, vec![3])]
        );
        let queue = (0..18).map(|c| (c, Need::Any(1))).collect();
        let sizes: Vec<usize> = rounds(queue, slots(8), BTreeMap::new())
            .iter()
            .map(Vec::len)
            .collect();
        assert_eq!(sizes, vec![8, 8, 2]);
    }

    #[test]
    fn a_freed_gpu_goes_to_the_next_candidate_at_once() {
        let mut pool = Pool::new(Vec::new(), slots(3));
        assert!(pool.next_batch().is_empty(), "nothing proposed yet");
        pool.push((0..5).map(|c| (c, Need::Any(1))));
        assert_eq!(pool.next_batch().len(), 3);
        assert!(pool.free_slots().is_empty());
        assert!(pool.next_batch().is_empty(), "nothing is free");
        // Candidate 1 (GPU 1) was pruned: candidate 3 takes its GPU while 0 and 2 go on.
        pool.free([slots(3)[1].clone()]);
        assert_eq!(gpus(&pool.next_batch()), vec![(3, vec![1])]);
        // The lowest free GPU goes first, whatever order they were freed in.
        pool.free([slots(3)[2].clone(), slots(3)[0].clone()]);
        let all = slots(3);
        assert_eq!(pool.free_slots(), [all[0].clone(), all[2].clone()]);
        assert_eq!(gpus(&pool.next_batch()), vec![(4, vec![0])]);
        assert_eq!(pool.waiting(), 0);
    }

    #[test]
    fn layouts_take_the_boards_best_free_groups_biggest_first() {
        let board = Board::parse(crate::layout::topology::tests::PCIE_UNORDERED).unwrap();
        let boards = BTreeMap::from([("local".to_string(), board)]);
        // TP8, TP4, TP2 and TP2 again, as the grid proposes them (biggest first).
        let queue = vec![
            (8, Need::Any(8)),
            (4, Need::Any(4)),
            (2, Need::Any(2)),
            (22, Need::Any(2)),
        ];
        let r = rounds(queue, slots(8), boards);
        let shown: Vec<Vec<(usize, Vec<u32>)>> = r.iter().map(|b| gpus(b)).collect();
        assert_eq!(
            shown,
            vec![
                vec![(8, (0..8).collect())],
                vec![(4, vec![0, 1, 2, 3]), (2, vec![4, 6]), (22, vec![5, 7])],
            ]
        );
    }

    #[test]
    fn exact_needs_wait_in_order() {
        let all = slots(4);
        // Sequential: each candidate needs every GPU.
        let queue = (0..3).map(|c| (c, Need::Gpus(all.clone()))).collect();
        let mut pool = Pool::new(queue, all.clone());
        assert_eq!(gpus(&pool.next_batch()), vec![(0, vec![0, 1, 2, 3])]);
        pool.free(all[..2].iter().cloned());
        assert!(
            pool.next_batch().is_empty(),
            "candidate 1 waits for all four"
        );
        pool.free(all[2..].iter().cloned());
        assert_eq!(pool.next_batch()[0].0, 1);
        // Parallel: disjoint GPUs, one batch.
        let queue = vec![
            (0, Need::Gpus(vec![all[0].clone(), all[2].clone()])),
            (1, Need::Gpus(vec![all[1].clone(), all[3].clone()])),
        ];
        assert_eq!(rounds(queue, all, BTreeMap::new()).len(), 1);
    }
}
