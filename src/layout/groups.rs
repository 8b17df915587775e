//! Which GPUs form each server's group: the partition of a host's selected GPUs whose slowest
//! in-group links are as fast as the board allows, on one NUMA node where that fits.

use super::topology::{Board, Link};

/// One server's GPUs, ascending (PCI bus order: what CUDA_VISIBLE_DEVICES lists).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Group {
    pub gpus: Vec<u32>,
    /// The slowest link between two of its GPUs; `None` for one GPU, or with no board read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slowest: Option<Link>,
}

impl Group {
    /// The GPU that names the server (its id and port): the group's first.
    pub fn lead(&self) -> u32 {
        self.gpus[0]
    }

    /// Whether it spans several GPUs (what records, tables and JSON then show).
    pub fn is_multi(&self) -> bool {
        self.gpus.len() > 1
    }

    /// The group, when it spans several GPUs; `None` for one GPU, whose id says it all.
    pub fn if_multi(&self) -> Option<Group> {
        self.is_multi().then(|| self.clone())
    }

    /// `0,2` as CUDA_VISIBLE_DEVICES wants it.
    pub fn visible_devices(&self) -> String {
        self.gpus
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `gpu0+2 (PIX)`, or `gpu5` alone: how tables and messages name the group.
    pub fn label(&self) -> String {
        let gpus = self
            .gpus
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join("+");
        match self.slowest {
            Some(link) => format!("gpu{gpus} ({link})"),
            None => format!("gpu{gpus}"),
        }
    }
}

/// Above this many candidate partitions, groups are built greedily instead (a 16-GPU host in
/// pairs has about 2 million; more GPUs than that per host is not a board fleet meets).
const EXHAUSTIVE_LIMIT: u64 = 3_000_000;

/// Splits `gpus` (a host's selection, `size` dividing its count) into groups of `size`.
/// With a board, the partition maximises the worst group first (its slowest link, then whether
/// it stays on one NUMA node), then the next worst, and so on; ties go to the first partition
/// in GPU order, so the choice is the same on every run. Without a board, groups are contiguous
/// in the selection's order.
pub fn choose(board: Option<&Board>, gpus: &[u32], size: usize) -> Vec<Group> {
    let mut sorted = gpus.to_vec();
    sorted.sort_unstable();
    let Some(board) = board.filter(|_| size > 1) else {
        return sorted
            .chunks(size)
            .map(|c| Group {
                gpus: c.to_vec(),
                slowest: None,
            })
            .collect();
    };
    let parts = if partitions(sorted.len(), size) <= EXHAUSTIVE_LIMIT {
        best_partition(board, &sorted, size)
    } else {
        greedy(board, &sorted, size)
    };
    parts
        .into_iter()
        .map(|gpus| Group {
            slowest: board.slowest(&gpus),
            gpus,
        })
        .collect()
}

/// The best group of `size` among a host's `free` GPUs: the best-linked by the board (the
/// first of equals in GPU order), or the lowest `size` without one; `None` when too few.
pub fn best_of(board: Option<&Board>, free: &[u32], size: usize) -> Option<Group> {
    let mut sorted = free.to_vec();
    sorted.sort_unstable();
    if sorted.len() < size || size == 0 {
        return None;
    }
    let gpus = match board.filter(|_| size > 1) {
        None => sorted[..size].to_vec(),
        Some(board) => {
            let mut best: Option<(Key, Vec<u32>)> = None;
            for group in combinations(&sorted, size) {
                let k = key(board, &group);
                if best.as_ref().is_none_or(|(b, _)| k > *b) {
                    best = Some((k, group));
                }
            }
            best?.1
        }
    };
    Some(Group {
        slowest: board.and_then(|b| b.slowest(&gpus)),
        gpus,
    })
}

/// How good one group is: its bottleneck link, then one NUMA node, then its links in all.
/// An unknown link (a GPU the board lacks) counts as the slowest.
type Key = (Link, bool, u64);

fn key(board: &Board, gpus: &[u32]) -> Key {
    let mut total = 0;
    for (i, a) in gpus.iter().enumerate() {
        for b in &gpus[i + 1..] {
            total += rank(board.link(*a, *b).unwrap_or(Link::Sys));
        }
    }
    (
        board.slowest(gpus).unwrap_or(Link::Sys),
        board.one_numa_node(gpus),
        total,
    )
}

fn rank(link: Link) -> u64 {
    match link {
        Link::Sys => 1,
        Link::Node => 2,
        Link::Phb => 3,
        Link::Pxb => 4,
        Link::Pix => 5,
        Link::Nv(n) => 6 + u64::from(n),
    }
}

/// A partition's score: its groups' keys, worst first (compared lexicographically).
fn score(board: &Board, groups: &[Vec<u32>]) -> Vec<Key> {
    let mut keys: Vec<Key> = groups.iter().map(|g| key(board, g)).collect();
    keys.sort();
    keys
}

/// Every partition in canonical order (each group opens with the lowest GPU left), keeping
/// the first of the best.
fn best_partition(board: &Board, gpus: &[u32], size: usize) -> Vec<Vec<u32>> {
    let mut best: Option<(Vec<Key>, Vec<Vec<u32>>)> = None;
    let mut current = Vec::new();
    search(board, gpus.to_vec(), size, &mut current, &mut best);
    best.map(|(_, p)| p).unwrap_or_default()
}

fn search(
    board: &Board,
    left: Vec<u32>,
    size: usize,
    current: &mut Vec<Vec<u32>>,
    best: &mut Option<(Vec<Key>, Vec<Vec<u32>>)>,
) {
    let Some((&first, rest)) = left.split_first() else {
        let s = score(board, current);
        if best.as_ref().is_none_or(|(b, _)| s > *b) {
            *best = Some((s, current.clone()));
        }
        return;
    };
    for others in combinations(rest, size - 1) {
        let mut group = vec![first];
        group.extend(&others);
        let remaining: Vec<u32> = rest
            .iter()
            .copied()
            .filter(|g| !others.contains(g))
            .collect();
        current.push(group);
        search(board, remaining, size, current, best);
        current.pop();
    }
}

/// The lowest GPU left takes the companions that make its group best, until none is left.
fn greedy(board: &Board, gpus: &[u32], size: usize) -> Vec<Vec<u32>> {
    let mut left = gpus.to_vec();
    let mut out = Vec::new();
    while let Some((&first, rest)) = left.split_first() {
        let mut best: Option<(Key, Vec<u32>)> = None;
        for others in combinations(rest, size - 1) {
            let mut group = vec![first];
            group.extend(&others);
            let k = key(board, &group);
            if best.as_ref().is_none_or(|(b, _)| k > *b) {
                best = Some((k, group));
            }
        }
        let group = best.map(|(_, g)| g).unwrap_or_default();
        left.retain(|g| !group.contains(g));
        out.push(group);
    }
    out
}

/// Every way to pick `k` of `items`, in lexicographic order.
fn combinations(items: &[u32], k: usize) -> Vec<Vec<u32>> {
    if k == 0 {
        return vec![Vec::new()];
    }
    let mut out = Vec::new();
    for (i, first) in items.iter().enumerate() {
        if items.len() - i < k {
            break;
        }
        for mut tail in combinations(&items[i + 1..], k - 1) {
            tail.insert(0, *first);
            out.push(tail);
        }
    }
    out
}

/// How many ways `n` GPUs split into groups of `k`: n! / (k!^(n/k) (n/k)!), saturating.
fn partitions(n: usize, k: usize) -> u64 {
    let mut count: u64 = 1;
    let mut left = n;
    while left > 0 {
        // The lowest GPU left picks its k-1 companions among the left-1 others.
        count = count.saturating_mul(binomial(left as u64 - 1, k as u64 - 1));
        left -= k;
    }
    count
}

fn binomial(n: u64, k: u64) -> u64 {
    (0..k).fold(1u64, |acc, i| acc.saturating_mul(n - i) / (i + 1))
}

#[cfg(test)]
mod tests {
    use super::super::topology::tests::{NVLINK_8, PCIE_UNORDERED};
    use super::*;

    fn gpus_of(groups: &[Group]) -> Vec<Vec<u32>> {
        groups.iter().map(|g| g.gpus.clone()).collect()
    }

    #[test]
    fn pairs_are_the_switch_pairs_and_fours_stay_on_a_socket() {
        let board = Board::parse(PCIE_UNORDERED).unwrap();
        let all: Vec<u32> = (0..8).collect();
        let tp2 = choose(Some(&board), &all, 2);
        assert_eq!(
            gpus_of(&tp2),
            vec![vec![0, 2], vec![1, 3], vec![4, 6], vec![5, 7]]
        );
        assert!(tp2.iter().all(|g| g.slowest == Some(Link::Pix)));
        assert_eq!(tp2[0].label(), "gpu0+2 (PIX)");
        assert_eq!(tp2[0].visible_devices(), "0,2");
        let tp4 = choose(Some(&board), &all, 4);
        assert_eq!(gpus_of(&tp4), vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
        assert!(tp4.iter().all(|g| g.slowest == Some(Link::Node)));
        let tp8 = choose(Some(&board), &all, 8);
        assert_eq!(tp8[0].slowest, Some(Link::Sys));
    }

    #[test]
    fn a_selection_that_splits_the_pairs_takes_the_best_of_what_is_left() {
        let board = Board::parse(PCIE_UNORDERED).unwrap();
        // 2 lost its partner 0; 1 and 3 still pair; 2 and 4 cross the sockets, 2 and 6 too:
        // the worst group is SYS whichever way, so the others are made as good as they can be.
        let groups = choose(Some(&board), &[1, 2, 3, 4, 6, 7], 2);
        assert_eq!(gpus_of(&groups), vec![vec![1, 3], vec![2, 7], vec![4, 6]]);
    }

    #[test]
    fn the_choice_is_stable_and_without_a_board_contiguous() {
        let board = Board::parse(NVLINK_8).unwrap();
        let all: Vec<u32> = (0..8).rev().collect();
        let first = choose(Some(&board), &all, 2);
        // Every pair is NV18: the tie goes to GPU order.
        assert_eq!(
            gpus_of(&first),
            vec![vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7]]
        );
        assert_eq!(choose(Some(&board), &all, 2), first);
        let none = choose(None, &[4, 5, 6, 7], 2);
        assert_eq!(gpus_of(&none), vec![vec![4, 5], vec![6, 7]]);
        assert!(none.iter().all(|g| g.slowest.is_none()));
        let single = choose(Some(&board), &[3, 1], 1);
        assert_eq!(gpus_of(&single), vec![vec![1], vec![3]]);
    }

    #[test]
    fn the_best_free_group_of_a_size() {
        let board = Board::parse(PCIE_UNORDERED).unwrap();
        let pair = best_of(Some(&board), &[1, 4, 5, 7], 2).unwrap();
        assert_eq!((pair.gpus, pair.slowest), (vec![5, 7], Some(Link::Pix)));
        let four = best_of(Some(&board), &[0, 1, 2, 3, 4, 5], 4).unwrap();
        assert_eq!(four.gpus, vec![0, 1, 2, 3]);
        assert_eq!(best_of(None, &[6, 3, 4], 2).unwrap().gpus, vec![3, 4]);
        assert_eq!(best_of(Some(&board), &[1], 2), None);
    }

    #[test]
    fn partition_counts() {
        assert_eq!(partitions(8, 2), 105);
        assert_eq!(partitions(8, 4), 35);
        assert_eq!(partitions(8, 8), 1);
        assert_eq!(partitions(16, 2), 2_027_025);
        assert!(partitions(32, 2) > EXHAUSTIVE_LIMIT);
        let board = Board::parse(PCIE_UNORDERED).unwrap();
        let greedy = greedy(&board, &(0..8).collect::<Vec<_>>(), 2);
        assert_eq!(greedy, vec![vec![0, 2], vec![1, 3], vec![4, 6], vec![5, 7]]);
    }
}
