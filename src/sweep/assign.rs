//! Which GPUs each candidate runs on: disjoint groups for a parallel sweep, like for like on
//! every host; any free GPU group of the candidate's size at a time when the candidates
//! outnumber the GPUs or their layouts differ (rounds); or every GPU for each candidate in
//! turn for a sequential one.

use serde::{Deserialize, Serialize};

/// A GPU slot: inventory host name and GPU index.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Slot {
    pub host: String,
    pub gpu: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Every candidate at once, each on its own GPUs.
    Parallel,
    /// More candidates than GPUs: one GPU each, a freed GPU going to the next candidate.
    Rounds,
    Sequential,
}

/// What a candidate needs to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Need {
    /// Exactly these GPUs.
    Gpus(Vec<Slot>),
    /// This many free GPUs of one host, whichever form its best-linked group first (one
    /// server of the candidate's layout).
    Any(u32),
}

impl Need {
    /// How many GPUs it takes.
    pub fn size(&self) -> usize {
        match self {
            Need::Gpus(g) => g.len(),
            Need::Any(n) => *n as usize,
        }
    }
}

/// Every GPU of the sweep, in inventory order, and what each candidate (in candidate order)
/// needs of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    pub mode: Mode,
    pub slots: Vec<Slot>,
    pub needs: Vec<Need>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssignError {
    #[error("the inventory has no GPUs to sweep on")]
    NoGpus,
}

/// Sequential when asked; else parallel when candidates of one GPU each (`sizes`: each
/// candidate's GPUs per server) fit the GPUs, rounds when not or when a server spans GPUs:
/// each candidate then runs one server on the best group free.
pub fn choose_mode(sizes: &[u32], total_gpus: usize, sequential: bool) -> Mode {
    if sequential {
        Mode::Sequential
    } else if sizes.len() > total_gpus || sizes.iter().any(|s| *s > 1) {
        Mode::Rounds
    } else {
        Mode::Parallel
    }
}

/// `hosts`: each host's GPUs in inventory order. Parallel mode deals every host's GPUs out to
/// the candidates in turn, so each host compares candidates on its own identical GPUs and
/// spare GPUs become replicas; the starting candidate rotates across hosts so that leftovers
/// spread evenly. Rounds give each candidate one GPU, the first one free; a candidate's
/// figures are then compared with those of candidates on the same host when pruning.
pub fn assign(
    hosts: &[(String, Vec<u32>)],
    sizes: &[u32],
    mode: Mode,
) -> Result<Assignment, AssignError> {
    let k = sizes.len();
    let all: Vec<Slot> = hosts
        .iter()
        .flat_map(|(h, gpus)| {
            gpus.iter().map(move |&gpu| Slot {
                host: h.clone(),
                gpu,
            })
        })
        .collect();
    if all.is_empty() {
        return Err(AssignError::NoGpus);
    }
    let needs = match mode {
        Mode::Sequential => vec![Need::Gpus(all.clone()); k],
        Mode::Rounds => sizes.iter().map(|s| Need::Any((*s).max(1))).collect(),
        Mode::Parallel => {
            let mut groups = vec![Vec::new(); k];
            for (next, slot) in all.iter().enumerate() {
                groups[next % k.max(1)].push(slot.clone());
            }
            groups.into_iter().map(Need::Gpus).collect()
        }
    };
    Ok(Assignment {
        mode,
        slots: all,
        needs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(name: &str, n: u32) -> (String, Vec<u32>) {
        (name.to_string(), (0..n).collect())
    }

    fn groups(a: &Assignment) -> Vec<Vec<Slot>> {
        a.needs
            .iter()
            .map(|n| match n {
                Need::Gpus(g) => g.clone(),
                Need::Any(_) => panic!("not an exact assignment"),
            })
            .collect()
    }

    #[test]
    fn two_candidates_on_eight_gpus_get_four_each_interleaved() {
        let a = assign(&[host("ct200", 8)], &[1; 2], Mode::Parallel).unwrap();
        let gpus: Vec<Vec<u32>> = groups(&a)
            .iter()
            .map(|g| g.iter().map(|s| s.gpu).collect())
            .collect();
        assert_eq!(gpus, vec![vec![0, 2, 4, 6], vec![1, 3, 5, 7]]);
    }

    #[test]
    fn leftovers_rotate_across_hosts_and_each_host_runs_every_candidate() {
        let a = assign(&[host("a", 4), host("b", 4)], &[1; 3], Mode::Parallel).unwrap();
        let sizes: Vec<usize> = groups(&a).iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![3, 3, 2]);
        for g in &groups(&a) {
            assert!(
                g.iter().any(|s| s.host == "a") && g.iter().any(|s| s.host == "b"),
                "{g:?}"
            );
        }
    }

    #[test]
    fn sequential_gives_every_candidate_every_gpu() {
        let a = assign(&[host("ct200", 8)], &[1; 3], Mode::Sequential).unwrap();
        assert!(groups(&a).iter().all(|g| g.len() == 8));
    }

    #[test]
    fn more_candidates_than_gpus_run_in_rounds_on_any_free_gpu() {
        assert_eq!(choose_mode(&[1; 3], 2, false), Mode::Rounds);
        assert_eq!(choose_mode(&[1; 2], 8, false), Mode::Parallel);
        assert_eq!(choose_mode(&[1; 8], 8, false), Mode::Parallel);
        assert_eq!(choose_mode(&[1; 2], 8, true), Mode::Sequential);
        let a = assign(&[host("ct200", 2)], &[1; 3], Mode::Rounds).unwrap();
        assert_eq!(a.needs, vec![Need::Any(1); 3]);
        assert_eq!(a.slots.len(), 2);
        assert_eq!(assign(&[], &[1; 3], Mode::Rounds), Err(AssignError::NoGpus));
    }

    #[test]
    fn layouts_of_several_gpus_run_in_rounds_one_server_of_their_size_each() {
        assert_eq!(choose_mode(&[1, 2, 4], 8, false), Mode::Rounds);
        let a = assign(&[host("ct200", 8)], &[1, 2, 4, 8], Mode::Rounds).unwrap();
        let sizes: Vec<usize> = a.needs.iter().map(Need::size).collect();
        assert_eq!(sizes, [1, 2, 4, 8]);
    }
}
